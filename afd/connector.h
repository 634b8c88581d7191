#pragma once
// The AFD connector contract (docs/design.md#afd-contract): how attention ranks hand each MoE layer's hidden states to
// the FFN ranks that own the selected experts, and get the expert outputs back.
//
// Per MoE layer and stage (micro-batch), an attention rank with n tokens calls
//   send_attn_output(hidden bf16 [n, H], meta, routing)   -> dispatch: each token goes only to the FFN
//                                                             ranks owning one of its top-k experts
//   recv_ffn_output(out bf16 [n, k, H], stage)            -> combine input: out[t, j] is the output of
//                                                             expert topk_ids[t, j] for token t
// and the engine then applies its weighted combine in fixed slot order, so AFD and a monolithic run give
// the same bits. An FFN rank receives work (hidden, routing, and the (token, slot) rows it owns), runs
// its experts into the work item's `out` rows and hands the item's move-only state back with
// send_ffn_output().
//
// Two connectors implement the contract (make_connector):
//  * sync: a control plane (control_plane() != nullptr) carries, once per step before the forward, the
//    per-stage token counts of every attention rank and a warm-up flag; the FFN loop is
//    recv_step -> for each MoE layer, for each stage: recv_attn_output(stage), compute, send_ffn_output.
//    Attention ranks step in lockstep.
//  * async: no control plane (control_plane() == nullptr); every message carries layer, stage, source
//    rank, token count and routing; the FFN loop is recv_work_item -> compute that item's layer -> send.
//    Attention ranks may step independently (async_dp).
// Runtimes branch on control_plane() == nullptr, never on the connector's type.
//
// Idle ranks still send well-formed messages: a stage with 0 tokens (or 0 tokens for one FFN rank)
// travels as an empty message. Every wait has a deadline (AfdConfig::timeout_ms); a timeout or a failed
// peer is an error naming the waiting rank, the peer, layer, stage and step.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "afd/config.h"
#include "afd/metrics.h"
#include "afd/topology.h"
#include "afd/transport.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::afd {

// What one transfer is. Invariants (validate_meta): `layer` is a MoE layer of the config; 0 <= stage < S;
// seq_lens is non-empty with one entry on the attention side and, on the FFN side, one per attention
// peer in peer order (sync) or one for the sending rank (async); every entry is in
// [0, max_tokens_per_stage]. Entries may be 0 (docs/design.md#afd-contract): an idle rank's
// stage and the tokens one FFN rank gets from a peer whose tokens all chose other FFN ranks are empty,
// and both still travel as well-formed messages. `step` numbers decode steps per attention rank; it is
// carried for checking and for error messages.
struct TransferMeta {
  int layer = 0;
  int stage = 0;
  int64_t step = 0;
  int num_seq_lens = 0;
  std::array<int32_t, kMaxAttentionRanks> seq_lens{};
  bool warmup = false;  // the step is warm-up (not measured); travels in the transfer's header

  // Attention-side metadata: one entry, the tokens of this stage.
  static TransferMeta attention(int layer, int stage, int64_t step, int num_tokens);
  std::span<const int32_t> lens() const { return {seq_lens.data(), static_cast<size_t>(num_seq_lens)}; }
  int64_t total_tokens() const;
};

// Checks the invariants above for `side`.
Status validate_meta(const TransferMeta& meta, Role side, const AfdConfig& cfg);

// Router output of one stage: topk_ids i32 [n, k] (expert ids in [0, E)), topk_weights f32 [n, k]. Any
// strides. Copied by send_attn_output.
struct Routing {
  TensorView topk_ids;
  TensorView topk_weights;
};

class ConnectorBase;

// Move-only token of one received FFN work item, handed back to send_ffn_output(). It keeps the item's
// receive buffer and output rows reserved; it must not outlive its connector. Destroying it without
// sending frees the buffers, but the attention ranks then wait for that result until their deadline.
class BackendState {
 public:
  BackendState() = default;
  BackendState(BackendState&& o) noexcept { *this = std::move(o); }
  BackendState& operator=(BackendState&& o) noexcept;
  BackendState(const BackendState&) = delete;
  BackendState& operator=(const BackendState&) = delete;
  ~BackendState();
  bool valid() const { return owner_ != nullptr; }

 private:
  friend class ConnectorBase;
  BackendState(ConnectorBase* owner, int slot, uint64_t generation)
      : owner_(owner), slot_(slot), generation_(generation) {}
  ConnectorBase* owner_ = nullptr;
  int slot_ = -1;
  uint64_t generation_ = 0;
};

// One unit of FFN work: the tokens one stage of one MoE layer sent to this FFN rank. All views point into
// connector-owned buffers and stay valid until `state` is handed back.
struct FfnWorkItem {
  TransferMeta meta;    // layer, stage, step, tokens per segment
  bool warmup = false;  // sync: the step was announced as warm-up
  int source = -1;      // async: attention rank that sent the item; sync: -1 (segments = ranks 0..A-1)
  // bf16 [M, H], M = meta.total_tokens(); segments in meta.seq_lens order. With a quantized dispatch
  // (AfdConfig::dispatch_row_bytes > 0): the rows of codes and scales, uint8 [M, dispatch_row_bytes].
  TensorView hidden;
  TensorView topk_ids;      // i32 [M, k]; -1 in the slots another FFN rank computes
  TensorView topk_weights;  // f32 [M, k]
  int expert_begin = 0;     // a range holding every expert this FFN rank holds in the layer (its own and copies)
  int expert_end = 0;
  std::span<const int32_t> row_token;  // [R]: token (row of hidden) of each output row
  std::span<const int32_t> row_slot;   // [R]: top-k slot of each output row (its expert is topk_ids[token, slot])
  TensorView out;                      // bf16 [R, H]: write expert outputs here (row r = row_token[r], row_slot[r])
  BackendState state;
};

// Per-step control message of the sync connector.
struct StepControl {
  int64_t step = 0;
  bool warmup = false;
  bool stop = false;  // every attention rank called finish(); no more steps
  int num_attention = 0;
  int num_stages = 0;
  std::array<int32_t, kMaxAttentionRanks * kMaxStages> tokens{};  // [a * num_stages + s]
  int stage_tokens(int attention_rank, int stage) const { return tokens[attention_rank * num_stages + stage]; }
};

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  // Attention: announces this rank's per-stage token counts (size S) and the warm-up flag of `step` to
  // every FFN rank, once per step before its first send_attn_output. Does not block (the previous
  // announcement must have been received, which waits at most the deadline).
  virtual Status send_step(int64_t step, std::span<const int> stage_tokens, bool warmup) = 0;
  // FFN: blocks until every attention rank has announced its next step (or finished; then `stop`). The
  // first step is due within init_timeout_ms, a later one within 2 x timeout_ms (attention ranks step back
  // to back until they finish, agreeing among themselves first), the rest of a step's announcements within
  // timeout_ms of the first; a timeout names the attention rank(s) whose announcement is missing.
  virtual Result<StepControl> recv_step() = 0;
};

// One setting that every rank of a job must agree on, as the user gave it: `name` is the flag as typed
// ("--max-new-tokens") or a derived item ("number of requests"), `value` its printable value or a digest.
struct FingerprintItem {
  std::string name;
  std::string value;
};

// 16 hex digits (FNV-1a, 64 bit) of `bytes`: a printable digest for fingerprint values (prompts, ...).
std::string fingerprint_digest(std::string_view bytes);

class Connector {
 public:
  virtual ~Connector() = default;

  // Collective over all ranks: initialises the transport, builds the topology, checks that every rank has
  // the same settings (the error names the first key that differs and the two ranks), then that every
  // rank has the same `fingerprint` (the error names the first item that differs, both values and both
  // ranks; an item only one rank has differs too), registers buffers. Every rank returns the same error.
  // Bounded by init_timeout_ms. Returns Unavailable naming what is missing when the transport is not usable.
  virtual Status init(std::span<const FingerprintItem> fingerprint) = 0;
  Status init() { return init({}); }
  // Waits (bounded) for this rank's own sends to finish, then releases the transport; unblocks waiters.
  virtual Status close() = 0;

  virtual std::string_view name() const = 0;  // "sync" or "async"
  virtual const AfdConfig& config() const = 0;
  // Valid after init().
  virtual const Topology& topology() const = 0;
  virtual Role role() const = 0;
  virtual int rank() const = 0;  // index within the role
  virtual int world_rank() const = 0;
  // The control plane, or nullptr when the connector has none (async). Owned by the connector.
  virtual ControlPlane* control_plane() = 0;

  // ---- attention side ----
  // Dispatches one stage: hidden bf16 [n, H] (unit stride along H; any row stride), n = meta.seq_lens[0]; with a
  // quantized dispatch (AfdConfig::dispatch_row_bytes > 0) its rows of codes and scales, uint8 [n, dispatch_row_bytes].
  // Does not block. Copies the routing; reads `hidden` in place, so `hidden` must stay unmodified until
  // recv_ffn_output() of this stage returns. At most 2 transfers per stage may be outstanding (FIFO).
  virtual Status send_attn_output(TensorView hidden, const TransferMeta& meta, const Routing& routing) = 0;
  // Blocks until every FFN rank's outputs of this stage's oldest outstanding transfer arrived (or the
  // deadline passed: timeout_ms, twice that with a control plane and several attention ranks, as an FFN
  // rank may then itself be waiting for another attention rank) and writes them into out bf16 [n, k, H] (unit stride
  // along H): out[t, j] = output of expert topk_ids[t, j] for token t. Returns the transfer's metadata.
  virtual Result<TransferMeta> recv_ffn_output(TensorView out, int stage) = 0;
  // Tells the FFN ranks this rank sends nothing more (sync: via the control plane; async: a done message).
  virtual Status finish() = 0;

  // ---- FFN side ----
  // Sync only: blocks until every attention rank's transfer of `stage` of the next MoE layer of the
  // current step arrived (deadline), and returns them as one item (segments in attention-rank order).
  virtual Result<FfnWorkItem> recv_attn_output(int stage) = 0;
  // Async only: blocks until any attention rank's next transfer arrives; nullopt once every attention
  // rank finished. Every attention rank that has not finished owes its next transfer within timeout_ms of
  // the last exchange with it (init_timeout_ms before its first): the wait ends at the earliest such
  // deadline with an error naming that rank and what it owes.
  virtual Result<std::optional<FfnWorkItem>> recv_work_item() = 0;
  // Sends the item's expert outputs (out bf16 [R, H]; the item's own `out` is sent without a copy, any
  // other view is copied first) to the attention rank(s) it came from. Does not block.
  virtual Status send_ffn_output(TensorView out, BackendState&& state) = 0;

  // ---- both ----
  // Collective: every rank passes a blob; world rank 0 gets all of them (indexed by world rank), the
  // others an empty vector. Each rank waits at most `timeout_ms` (the caller picks: timeout_ms when every
  // rank is due at once, idle_timeout_ms when ranks may arrive far apart). For metrics, traces and
  // results, not for the hot path.
  virtual Result<std::vector<std::string>> gather(std::string_view blob, int64_t timeout_ms) = 0;
  // The transport under the connector, for collectives outside the data path (StepAgreement). Valid
  // after init(); owned by the connector.
  virtual Transport& transport() = 0;
  // Transfers are recorded into `metrics` (may be nullptr; not owned; must outlive the connector's use).
  virtual void set_metrics(Metrics* metrics) = 0;
  // Ends the whole job because this rank failed (see Transport::abort_job).
  virtual void abort_job(const Status& why) = 0;
};

// Creates the connector named by cfg.connector over `transport`; touches no transport (init() does).
Result<std::unique_ptr<Connector>> make_connector(const ValidAfdConfig& cfg, std::unique_ptr<Transport> transport);
// As above for a config not validated yet: validate()'s error, or the connector.
Result<std::unique_ptr<Connector>> make_connector(const AfdConfig& cfg, std::unique_ptr<Transport> transport);

}  // namespace genbridge::afd
