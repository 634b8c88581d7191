// The asynchronous connector (upstream CAMAsync): no control plane. Every message says which layer,
// stage, step and attention rank it belongs to and carries its routing, so the FFN side is driven by
// its receive loop: recv_work_item -> compute that item's layer -> send_ffn_output. Attention ranks
// may step independently (async data parallelism).

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "afd/connector_base.h"

namespace genbridge::afd {

namespace {

class AsyncConnector final : public ConnectorBase {
 public:
  using ConnectorBase::ConnectorBase;

  std::string_view name() const override { return "async"; }
  ControlPlane* control_plane() override { return nullptr; }

  Status finish() override {
    GB_RETURN_IF_ERROR(require_role(Role::kAttention, "finish"));
    if (finished_) return ok_status();
    for (int s = 0; s < cfg_.num_stages; ++s) {
      const StageFifo& fifo = fifos_[s];
      if (fifo.count != 0 || fifo.next_layer_index != 0) {
        return invalid_argument(fmt::format(
            "afd finish: stage {} is in the middle of step {} ({} outstanding transfers, next MoE layer {})", s,
            fifo.step, fifo.count, moe_layers_[fifo.next_layer_index]));
      }
    }
    for (int f = 0; f < cfg_.num_ffn; ++f) {
      wire::Header h{};
      h.magic = wire::kMagic;
      h.version = wire::kVersion;
      h.kind = wire::Kind::kDone;
      h.source = rank_;
      h.top_k = k_;
      h.hidden = hidden_;
      h.send_ns = now_ns();
      std::memcpy(done_buf_[f].data(), &h, sizeof(h));
      // Stage 0's channel: it is ordered after this rank's last transfer of stage 0, and every other
      // stage's last result was received before finish() could be called.
      GB_RETURN_IF_ERROR(send_small(topo_.ffn_world[f], Channel::kDispatch, 0, done_buf_[f], &done_ids_[f]));
    }
    finished_ = true;
    return ok_status();
  }

  Result<FfnWorkItem> recv_attn_output(int) override {
    return unimplemented(
        "afd async connector: recv_attn_output(stage) belongs to the sync connector; the async FFN loop is "
        "recv_work_item(), which returns each transfer with its own layer, stage and source rank");
  }

  Result<std::optional<FfnWorkItem>> recv_work_item() override {
    GB_RETURN_IF_ERROR(require_role(Role::kFfn, "recv_work_item"));
    const int A = cfg_.num_attention;
    const int num_moe = static_cast<int>(moe_layers_.size());
    std::vector<int>& all = all_slots_;
    for (;;) {
      if (peers_done_ == A) return std::optional<FfnWorkItem>();
      collect_slot_ids(all);
      bool any = false;
      for (RequestId id : wait_ids_) any |= id != kNoRequest;
      if (!any) {
        return invalid_argument(
            "afd recv_work_item: every receive slot is held by a work item that was not handed back with "
            "send_ffn_output()");
      }
      for (;;) {
        // Every attention rank that has not finished owes its next transfer by its own deadline (see
        // peer_deadline): the wait ends at the earliest one, so a stopped rank is caught even while the
        // others keep this rank busy.
        int late = -1;
        for (int a = 0; a < A; ++a) {
          if (!peer_finished_[a] && (late < 0 || peer_deadline(a) < peer_deadline(late))) late = a;
        }
        Completion c;
        Result<int> r = transport_->wait_any(wait_ids_, peer_deadline(late), &c);
        if (!r.ok()) return late_peer_error(r.status(), late);
        complete_slot_request(*r, c);
        const int i = wait_slots_[*r / 2];
        RecvSlot& slot = slots_[i];
        const wire::Header* h = slot.header();
        if (*r % 2 == 0 && c.bytes == wire::kHeaderBytes && h->magic == wire::kMagic && h->kind == wire::Kind::kDone) {
          GB_RETURN_IF_ERROR(peer_done(slot.peer));
          break;  // re-collect: the peer's slots are closed
        }
        if (slot.pending > 0) continue;
        GB_ASSIGN_OR_RETURN(h, check_work(slot, -1));
        // Layers of a stage come in MoE order within a step; a new step starts at the first MoE layer.
        const int idx = moe_index_of_layer_[h->layer];
        const bool mid_step = last_index_[i] >= 0 && last_index_[i] < num_moe - 1;
        const int want = mid_step ? last_index_[i] + 1 : 0;
        if (idx != want || (mid_step ? h->step != last_step_[i] : (last_index_[i] >= 0 && h->step <= last_step_[i]))) {
          return internal_error(fmt::format(
              "afd: {} expected {} of stage {} from {} but got layer {} of step {}", topo_.rank_name(world_rank_),
              mid_step ? fmt::format("layer {} of step {}", moe_layers_[want], last_step_[i])
                       : fmt::format("layer {} of a step after {}", moe_layers_[0], last_step_[i]),
              slot.stage, topo_.rank_name(topo_.attention_world[slot.peer]), h->layer, h->step));
        }
        last_index_[i] = idx;
        last_step_[i] = h->step;
        GB_RETURN_IF_ERROR(wait_group_sends(groups_[i], h->layer, h->stage, h->step));
        GB_ASSIGN_OR_RETURN(FfnWorkItem item, make_item(i));
        return std::optional<FfnWorkItem>(std::move(item));
      }
    }
  }

 protected:
  Status check_dispatch(const TransferMeta&) override { return ok_status(); }

  Status init_attention() override {
    done_buf_.resize(cfg_.num_ffn);
    done_ids_.assign(cfg_.num_ffn, kNoRequest);
    for (auto& b : done_buf_) {
      GB_ASSIGN_OR_RETURN(b, transport_->alloc_buffer(wire::kHeaderBytes));
    }
    return ok_status();
  }

  Status init_ffn() override {
    // One group per (attention rank, stage): items are computed as they come.
    for (size_t i = 0; i < slots_.size(); ++i) GB_RETURN_IF_ERROR(add_group({static_cast<int>(i)}));
    last_index_.assign(slots_.size(), -1);
    for (size_t i = 0; i < slots_.size(); ++i) all_slots_.push_back(static_cast<int>(i));
    last_step_.assign(slots_.size(), -1);
    peer_finished_.assign(cfg_.num_attention, false);
    return ok_status();
  }

  Status close_hook(Deadline deadline) override {
    if (role_ != Role::kAttention) return ok_status();
    return wait_all(done_ids_, deadline, "send:the done message", topo_.ffn_world, -1, 0, 0);
  }

 private:
  // The error of a wait that ended at attention rank a's deadline (or failed): names a and what it owed.
  Status late_peer_error(const Status& s, int a) const {
    const int num_moe = static_cast<int>(moe_layers_.size());
    const int64_t timeout = peer_timeout_ms(a);
    // Mid-step on some stage: its next MoE layer there is due.
    for (int st = 0; st < cfg_.num_stages; ++st) {
      const int i = slot_index(a, st);
      if (last_index_[i] >= 0 && last_index_[i] < num_moe - 1) {
        return wait_error(s, "the hidden states", topo_.attention_world[a], moe_layers_[last_index_[i] + 1], st,
                          last_step_[i], timeout);
      }
    }
    int64_t last = -1;
    for (int st = 0; st < cfg_.num_stages; ++st) last = std::max(last, last_step_[slot_index(a, st)]);
    if (!peer_started(a)) return wait_error(s, "the first step", topo_.attention_world[a], -1, 0, 0, timeout);
    return wait_error(s, "the next step", topo_.attention_world[a], -1, 0, last + 1, timeout);
  }

  Status peer_done(int a) {
    const int num_moe = static_cast<int>(moe_layers_.size());
    for (int s = 0; s < cfg_.num_stages; ++s) {
      const int i = slot_index(a, s);
      if (last_index_[i] >= 0 && last_index_[i] < num_moe - 1) {
        return internal_error(fmt::format("afd: {} finished while layer {} of stage {}, step {} was still due",
                                          topo_.rank_name(topo_.attention_world[a]), moe_layers_[last_index_[i] + 1], s,
                                          last_step_[i]));
      }
      RecvSlot& slot = slots_[i];
      for (RequestId* id : {&slot.meta_id, &slot.rows_id}) {
        if (*id != kNoRequest) GB_RETURN_IF_ERROR(transport_->cancel(*id));
        *id = kNoRequest;
      }
      slot.pending = 0;
      slot.closed = true;
    }
    peer_finished_[a] = true;
    ++peers_done_;
    return ok_status();
  }

  std::vector<std::span<std::byte>> done_buf_;
  std::vector<RequestId> done_ids_;
  std::vector<int> last_index_;     // per slot: index in moe_layers_ of the last received layer, -1 before any
  std::vector<int64_t> last_step_;  // per slot
  int peers_done_ = 0;
  std::vector<bool> peer_finished_;  // per attention rank: its done message arrived
  std::vector<int> all_slots_;
};

}  // namespace

std::unique_ptr<Connector> make_async_connector(const AfdConfig& cfg, std::unique_ptr<Transport> transport) {
  return std::make_unique<AsyncConnector>(cfg, std::move(transport));
}

}  // namespace genbridge::afd
