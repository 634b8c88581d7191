#pragma once
// Internal: what the sync and async connectors share. The attention side (dispatch with a per-stage
// FIFO, result receive straight into the caller's [n, k, H] buffer), the FFN side's receive slots and
// output groups, send_ffn_output, init (settings check, topology, registered buffers), gather, close,
// and the wording of wait errors. Subclasses add the FFN receive loop and the control plane. Definitions:
// connector_base.cpp (both sides), connector_attention.cpp, connector_ffn.cpp.

#include <array>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "afd/connector.h"
#include "afd/wire.h"

namespace genbridge::afd {

class ConnectorBase : public Connector {
 public:
  ConnectorBase(const AfdConfig& cfg, std::unique_ptr<Transport> transport);
  ~ConnectorBase() override;

  using Connector::init;
  Status init(std::span<const FingerprintItem> fingerprint) override;
  Status close() override;
  const AfdConfig& config() const override { return cfg_; }
  const Topology& topology() const override { return topo_; }
  Role role() const override { return role_; }
  int rank() const override { return rank_; }
  int world_rank() const override { return world_rank_; }

  Status send_attn_output(TensorView hidden, const TransferMeta& meta, const Routing& routing) override;
  Result<TransferMeta> recv_ffn_output(TensorView out, int stage) override;
  Status send_ffn_output(TensorView out, BackendState&& state) override;
  Result<std::vector<std::string>> gather(std::string_view blob, int64_t timeout_ms) override;
  Transport& transport() override { return *transport_; }
  void set_metrics(Metrics* m) override { metrics_ = m; }
  void abort_job(const Status& why) override;

  // BackendState's destructor: frees a group without sending.
  void release_state(int group, uint64_t generation);

 protected:
  static constexpr int kFifoDepth = 2;

  // ---- hooks ----
  // Attention side: checks a dispatch against the connector's own rules (sync: the announced step).
  virtual Status check_dispatch(const TransferMeta& meta) = 0;
  // FFN side: called after init() allocated the slots, before the first receive is posted.
  virtual Status init_ffn() { return ok_status(); }
  virtual Status init_attention() { return ok_status(); }
  // close(): waits for the subclass's own sends and withdraws its receives.
  virtual Status close_hook(Deadline deadline) {
    (void)deadline;
    return ok_status();
  }

  // ---- attention side ----
  struct Dispatch {
    TransferMeta meta;
    int num_tokens = 0;
    DispatchLayout layout;
    std::vector<std::span<std::byte>> meta_buf;  // [F] header + routing (registered)
    std::vector<std::span<std::byte>> hdr_buf;   // [F] result headers (registered)
    std::vector<RequestId> send_ids;             // [2F]: header message, rows message per FFN rank
    std::vector<RequestId> recv_ids;             // [2F]: likewise for the results
    std::vector<int64_t> result_send_ns;         // [F]
    std::vector<int64_t> result_done_ns;         // [F]
    int64_t send_ns = 0;
  };
  struct StageFifo {
    std::array<Dispatch, kFifoDepth> entries;
    int head = 0;
    int count = 0;
    int next_layer_index = 0;  // index into moe_layers_ of the next dispatch of this stage
    int64_t step = -1;         // step of the last dispatch
  };

  // ---- FFN side ----
  // One receive slot per (attention rank, stage): registered buffers for a work transfer's two
  // messages, with both receives posted except while its item is held.
  struct RecvSlot {
    int peer = 0;  // attention rank
    int stage = 0;
    std::span<std::byte> meta;  // header + routing, capacity max_tokens
    std::span<std::byte> rows;  // dispatched rows (row_bytes_ each), capacity max_tokens
    RequestId meta_id = kNoRequest;
    RequestId rows_id = kNoRequest;
    int pending = 0;      // receives posted and not yet complete
    bool closed = false;  // the peer finished; nothing is posted
    Completion meta_done;
    Completion rows_done;
    const wire::Header* header() const { return reinterpret_cast<const wire::Header*>(meta.data()); }
  };
  // A group of slots computed together (sync: all attention ranks of one stage; async: one slot), with
  // its output buffer and the result sends still in flight from it.
  struct Group {
    std::vector<int> slots;        // slot indices, in attention-rank order
    std::span<std::byte> out_buf;  // bf16 [rows_capacity, H] (registered)
    int64_t rows_capacity = 0;
    std::vector<std::span<std::byte>> hdr_buf;  // per slot: result header (registered)
    std::vector<RequestId> send_ids;            // per slot: header message, rows message
    std::vector<int32_t> row_token, row_slot;
    std::vector<int32_t> seg_rows;  // per slot: rows of that segment
    // Packed inputs when the group has several non-empty segments (sync, A > 1).
    std::vector<std::byte> pack_hidden;
    std::vector<int32_t> pack_ids;
    std::vector<float> pack_weights;
    bool held = false;
    uint64_t generation = 1;
    TransferMeta meta;
    int source = -1;
  };

  int slot_index(int peer, int stage) const { return peer * cfg_.num_stages + stage; }
  Status post_slot(int slot);
  // Records the completion of wait_ids_[index] (two ids per slot, in slot order: meta, rows).
  void complete_slot_request(int index, const Completion& c);
  // Fills wait_ids_ with the slots' posted receives (two per slot, kNoRequest elsewhere).
  void collect_slot_ids(std::span<const int> slot_indices);
  // Waits (bounded) until the group's previous result sends completed.
  Status wait_group_sends(Group& g, int layer, int stage, int64_t step);
  // Parses and checks a received work message in `slot`.
  Result<const wire::Header*> check_work(const RecvSlot& slot, int64_t expect_step);
  // Builds the work item of group `g` from its completed slots (views, rows, packing).
  Result<FfnWorkItem> make_item(int group_index);
  // Waits for sends with a deadline; `what` and the context name the wait in the error.
  Status wait_all(std::span<RequestId> ids, Deadline deadline, std::string_view what, std::span<const int> peers_world,
                  int layer, int stage, int64_t step);
  // Status of a failed wait in words: waiting rank, peer, layer, stage, step.
  Status wait_error(const Status& s, std::string_view what, int peer_world, int layer, int stage, int64_t step,
                    int64_t timeout_ms) const;
  // Same, with the peer(s) already in words ("attention rank 1 (world rank 1)").
  Status wait_error(const Status& s, std::string_view what, const std::string& peers, int layer, int stage,
                    int64_t step, int64_t timeout_ms) const;
  // "a (world rank x), b (world rank y)" for the attention ranks a with missing[a].
  std::string attention_names(const std::vector<bool>& missing) const;

  // ---- FFN side: liveness of the attention ranks ----
  // An attention rank that has started (sent anything) and not finished owes this FFN rank its next
  // message within timeout_ms of the last exchange with it (attention ranks step back to back); before
  // its first message, within init_timeout_ms of init (it may still be building its engine).
  void heard_from(int attention_rank);
  Deadline peer_deadline(int attention_rank) const;
  int64_t peer_timeout_ms(int attention_rank) const;
  bool peer_started(int attention_rank) const { return peer_started_[attention_rank]; }
  Status require_role(Role r, const char* call) const;
  // Init: every rank passes `mine`; world rank 0 runs `compare` over all of them (indexed by world rank)
  // and every rank returns InvalidArgument with its non-empty verdict. `what` names the check in errors.
  Status check_at_root(const std::string& mine,
                       const std::function<std::string(const std::vector<std::string>&)>& compare, const char* what);
  Status require_init(const char* call) const;
  Status send_small(int peer_world, Channel ch, int tag, std::span<std::byte> buf, RequestId* id);
  // Creates a group over `slots` with output rows for every token of every slot.
  Status add_group(std::vector<int> slots);

  AfdConfig cfg_;
  std::unique_ptr<Transport> transport_;
  Topology topo_;
  Role role_ = Role::kAttention;
  int rank_ = 0;
  int world_rank_ = 0;
  bool initialized_ = false;
  bool closed_ = false;
  bool finished_ = false;
  std::vector<int> ffn_world_pairs_;  // world rank of FFN rank i / 2 (matches Dispatch's id pairs)
  std::vector<int> moe_layers_;
  std::vector<int> moe_index_of_layer_;  // layer -> index in moe_layers_, or -1
  Metrics* metrics_ = nullptr;
  int k_ = 0;
  int hidden_ = 0;
  // A dispatched token's row: bf16 [hidden_] (row_dtype_ bf16, row_elems_ = hidden_), or a quantized dispatch's
  // uint8 [dispatch_row_bytes] (row_dtype_ uint8); row_bytes_ either way.
  DType row_dtype_ = DType::kBF16;
  int64_t row_elems_ = 0;
  int64_t row_bytes_ = 0;

  std::vector<StageFifo> fifos_;  // attention, per stage
  std::vector<ConstSegment> send_segs_;
  std::vector<MutSegment> recv_segs_;
  std::vector<RequestId> wait_ids_;
  std::vector<int> wait_slots_;  // slot of each pair of wait_ids_
  std::vector<int> wait_peers_;

  std::vector<RecvSlot> slots_;                // FFN
  std::vector<Group> groups_;                  // FFN
  std::vector<Clock::time_point> peer_heard_;  // FFN, per attention rank: last message from it or result sent to it
  std::vector<bool> peer_started_;             // FFN, per attention rank
};

}  // namespace genbridge::afd
