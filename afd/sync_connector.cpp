// The synchronous connector (upstream CAMP2p): data on one channel per stage, plus a small control
// channel that carries, once per step before the forward, every attention rank's per-stage token
// counts and a warm-up flag. The FFN side is driven by the control plane: recv_step, then for each
// MoE layer and stage one recv_attn_output that gathers that stage from every attention rank.

#include <fmt/format.h>

#include <cstring>

#include "afd/connector_base.h"

namespace genbridge::afd {

namespace {

class SyncConnector final : public ConnectorBase, public ControlPlane {
 public:
  using ConnectorBase::ConnectorBase;

  std::string_view name() const override { return "sync"; }
  ControlPlane* control_plane() override { return this; }

  // ---- control plane ----

  Status send_step(int64_t step, std::span<const int> stage_tokens, bool warmup) override {
    GB_RETURN_IF_ERROR(require_role(Role::kAttention, "send_step"));
    if (finished_) return invalid_argument("afd sync connector: send_step() after finish()");
    GB_RETURN_IF_ERROR(check_stage_tokens(cfg_, stage_tokens, "afd send_step"));
    if (announced_ && step <= step_) {
      return invalid_argument(
          fmt::format("afd send_step: step {} must be numbered above the previous step {}", step, step_));
    }
    GB_RETURN_IF_ERROR(require_step_complete("send_step"));
    GB_RETURN_IF_ERROR(send_control(wire::Kind::kStep, step, stage_tokens, warmup));
    announced_ = true;
    step_ = step;
    warmup_ = warmup;
    for (int s = 0; s < cfg_.num_stages; ++s) counts_[s] = stage_tokens[s];
    return ok_status();
  }

  Result<StepControl> recv_step() override {
    GB_RETURN_IF_ERROR(require_role(Role::kFfn, "recv_step"));
    if (stopped_) return invalid_argument("afd sync connector: recv_step() after every attention rank finished");
    const int A = cfg_.num_attention, S = cfg_.num_stages;
    if (step_active_) {
      for (int s = 0; s < S; ++s) {
        if (next_layer_[s] != static_cast<int>(moe_layers_.size())) {
          return invalid_argument(
              fmt::format("afd recv_step: step {} is not finished: stage {} has received {} of {} MoE layers",
                          control_.step, s, next_layer_[s], moe_layers_.size()));
        }
      }
    }
    // Attention ranks step back to back. The first announcement of the first step is due within
    // init_timeout_ms (the attention ranks may still be building their engines), of a later step within
    // 2 x timeout_ms (before announcing, the attention ranks agree among themselves, a wait of at most
    // timeout_ms whose timeout names the rank that did not answer: that error should come first); the rest
    // of a step's announcements within timeout_ms of the first.
    int64_t timeout = seen_step_ ? 2 * cfg_.timeout_ms : cfg_.init_timeout_ms;
    Deadline deadline = deadline_after_ms(timeout);
    for (int got = 0; got < A; ++got) {
      Completion c;
      Result<int> r = transport_->wait_any(ctrl_recv_ids_, deadline, &c);
      if (!r.ok()) {
        std::vector<bool> missing(A);
        for (int a = 0; a < A; ++a) missing[a] = ctrl_recv_ids_[a] != kNoRequest;
        return wait_error(r.status(),
                          seen_step_ ? "the next step's control message" : "the first step's control message",
                          attention_names(missing), -1, 0, seen_step_ ? control_.step + 1 : 0, timeout);
      }
      ctrl_recv_ids_[*r] = kNoRequest;
      ctrl_bytes_[*r] = c.bytes;
      heard_from(*r);
      if (got == 0) {
        timeout = cfg_.timeout_ms;
        deadline = deadline_after_ms(timeout);
      }
    }
    seen_step_ = true;
    StepControl ctl;
    ctl.num_attention = A;
    ctl.num_stages = S;
    for (int a = 0; a < A; ++a) {
      wire::Header h;
      std::memcpy(&h, ctrl_recv_buf_[a].data(), sizeof(h));
      const size_t want =
          h.kind == wire::Kind::kStep ? wire::kHeaderBytes + 4 * static_cast<size_t>(S) : wire::kHeaderBytes;
      if (h.magic != wire::kMagic || (h.kind != wire::Kind::kStep && h.kind != wire::Kind::kStop) || h.source != a ||
          ctrl_bytes_[a] != want || (h.kind == wire::Kind::kStep && h.num_tokens != S)) {
        return internal_error(fmt::format("afd: {} received a malformed control message ({} bytes, kind {}) from {}",
                                          topo_.rank_name(world_rank_), ctrl_bytes_[a], wire::kind_name(h.kind),
                                          topo_.rank_name(topo_.attention_world[a])));
      }
      const bool stop = h.kind == wire::Kind::kStop;
      const bool warm = (h.flags & wire::kFlagWarmup) != 0;
      if (a == 0) {
        ctl.stop = stop;
        ctl.step = h.step;
        ctl.warmup = warm;
      } else if (stop != ctl.stop || (!stop && (h.step != ctl.step || warm != ctl.warmup))) {
        auto describe = [](bool st, int64_t step, bool w) {
          return st ? std::string("finished") : fmt::format("announced step {}{}", step, w ? " (warm-up)" : "");
        };
        return invalid_argument(fmt::format(
            "afd: {} {} while {} {}; the sync connector runs every attention rank in lockstep (use the async connector "
            "with async_dp for independent steps)",
            topo_.rank_name(topo_.attention_world[0]), describe(ctl.stop, ctl.step, ctl.warmup),
            topo_.rank_name(topo_.attention_world[a]), describe(stop, h.step, warm)));
      }
      if (!stop) {
        const int32_t* counts = reinterpret_cast<const int32_t*>(ctrl_recv_buf_[a].data() + wire::kHeaderBytes);
        for (int s = 0; s < S; ++s) ctl.tokens[a * S + s] = counts[s];
      }
    }
    if (ctl.stop) {
      stopped_ = true;
      step_active_ = false;
      return ctl;
    }
    if (step_active_ && ctl.step <= control_.step) {
      return internal_error(
          fmt::format("afd: {} received step {} after step {}", topo_.rank_name(world_rank_), ctl.step, control_.step));
    }
    control_ = ctl;
    step_active_ = true;
    for (int s = 0; s < S; ++s) next_layer_[s] = 0;
    for (int a = 0; a < A; ++a) GB_RETURN_IF_ERROR(post_ctrl(a));
    return ctl;
  }

  // ---- attention side ----

  Status finish() override {
    GB_RETURN_IF_ERROR(require_role(Role::kAttention, "finish"));
    if (finished_) return ok_status();
    GB_RETURN_IF_ERROR(require_step_complete("finish"));
    GB_RETURN_IF_ERROR(send_control(wire::Kind::kStop, step_, {}, false));
    finished_ = true;
    return ok_status();
  }

  // ---- FFN side ----

  Result<FfnWorkItem> recv_attn_output(int stage) override {
    GB_RETURN_IF_ERROR(require_role(Role::kFfn, "recv_attn_output"));
    const int A = cfg_.num_attention;
    if (stage < 0 || stage >= cfg_.num_stages) {
      return invalid_argument(
          fmt::format("afd recv_attn_output: stage {} is outside 0..{}", stage, cfg_.num_stages - 1));
    }
    if (!step_active_) {
      return invalid_argument("afd recv_attn_output: no step is active; call control_plane()->recv_step() first");
    }
    if (next_layer_[stage] >= static_cast<int>(moe_layers_.size())) {
      return invalid_argument(
          fmt::format("afd recv_attn_output: stage {} already received all {} MoE layers of step {}", stage,
                      moe_layers_.size(), control_.step));
    }
    const int layer = moe_layers_[next_layer_[stage]];
    Group& g = groups_[stage];
    if (g.held) {
      return invalid_argument(fmt::format(
          "afd recv_attn_output: the previous work item of stage {} was not handed back with send_ffn_output()",
          stage));
    }
    GB_RETURN_IF_ERROR(wait_group_sends(g, layer, stage, control_.step));
    collect_slot_ids(g.slots);
    const Deadline deadline = deadline_after_ms(cfg_.timeout_ms);
    for (int pending = 2 * A; pending > 0; --pending) {
      Completion c;
      Result<int> r = transport_->wait_any(wait_ids_, deadline, &c);
      if (!r.ok()) {
        std::vector<bool> missing(A);
        for (int a = 0; a < A; ++a) missing[a] = slots_[slot_index(a, stage)].pending > 0;
        return wait_error(r.status(), "the hidden states", attention_names(missing), layer, stage, control_.step,
                          cfg_.timeout_ms);
      }
      complete_slot_request(*r, c);
      const int a = *r / 2;
      RecvSlot& slot = slots_[slot_index(a, stage)];
      if (slot.pending > 0) continue;
      GB_ASSIGN_OR_RETURN(const wire::Header* h, check_work(slot, control_.step));
      if (h->layer != layer) {
        return internal_error(fmt::format("afd: {} expected layer {} of stage {}, step {} from {} but got layer {}",
                                          topo_.rank_name(world_rank_), layer, stage, control_.step,
                                          topo_.rank_name(topo_.attention_world[a]), h->layer));
      }
      if (h->num_tokens > control_.stage_tokens(a, stage)) {
        return internal_error(
            fmt::format("afd: {} got {} tokens for stage {} of layer {} from {}, which announced {} for that stage",
                        topo_.rank_name(world_rank_), h->num_tokens, stage, layer,
                        topo_.rank_name(topo_.attention_world[a]), control_.stage_tokens(a, stage)));
      }
    }
    GB_ASSIGN_OR_RETURN(FfnWorkItem item, make_item(stage));
    item.warmup = control_.warmup;
    ++next_layer_[stage];
    return item;
  }

  Result<std::optional<FfnWorkItem>> recv_work_item() override {
    return unimplemented(
        "afd sync connector: recv_work_item() belongs to the async connector; the sync FFN loop is "
        "control_plane()->recv_step(), then recv_attn_output(stage) for each MoE layer and stage");
  }

 protected:
  Status check_dispatch(const TransferMeta& meta) override {
    if (!announced_ || meta.step != step_) {
      return invalid_argument(fmt::format(
          "afd send_attn_output: step {} was not announced; the sync connector needs control_plane()->send_step({}, "
          "...) before the step's first transfer{}",
          meta.step, meta.step, announced_ ? fmt::format(" (the last announced step is {})", step_) : ""));
    }
    if (meta.seq_lens[0] != counts_[meta.stage]) {
      return invalid_argument(
          fmt::format("afd send_attn_output: stage {} of step {} has {} tokens but send_step announced {}", meta.stage,
                      meta.step, meta.seq_lens[0], counts_[meta.stage]));
    }
    return ok_status();
  }

  Status init_attention() override {
    const int F = cfg_.num_ffn;
    ctrl_send_buf_.resize(F);
    ctrl_send_ids_.assign(F, kNoRequest);
    for (int f = 0; f < F; ++f) {
      GB_ASSIGN_OR_RETURN(ctrl_send_buf_[f], transport_->alloc_buffer(wire::kHeaderBytes + 4 * kMaxStages));
    }
    return ok_status();
  }

  Status init_ffn() override {
    const int A = cfg_.num_attention, S = cfg_.num_stages;
    for (int s = 0; s < S; ++s) {
      std::vector<int> slots;
      for (int a = 0; a < A; ++a) slots.push_back(slot_index(a, s));
      GB_RETURN_IF_ERROR(add_group(std::move(slots)));
    }
    ctrl_recv_buf_.resize(A);
    ctrl_recv_ids_.assign(A, kNoRequest);
    ctrl_bytes_.assign(A, 0);
    for (int a = 0; a < A; ++a) {
      GB_ASSIGN_OR_RETURN(ctrl_recv_buf_[a], transport_->alloc_buffer(wire::kHeaderBytes + 4 * kMaxStages));
      GB_RETURN_IF_ERROR(post_ctrl(a));
    }
    return ok_status();
  }

  Status close_hook(Deadline deadline) override {
    Status s;
    if (role_ == Role::kAttention) {
      s = wait_all(ctrl_send_ids_, deadline, "send:the control message", topo_.ffn_world, -1, 0, step_);
    }
    for (RequestId& id : ctrl_recv_ids_) {
      if (id != kNoRequest) transport_->cancel(id).ignore();
      id = kNoRequest;
    }
    return s;
  }

 private:
  Status post_ctrl(int a) {
    const MutSegment seg{ctrl_recv_buf_[a].data(), ctrl_recv_buf_[a].size()};
    GB_ASSIGN_OR_RETURN(ctrl_recv_ids_[a], transport_->irecv(topo_.attention_world[a], Channel::kControl,
                                                             wire::kTagStep, std::span<const MutSegment>(&seg, 1)));
    return ok_status();
  }

  // Attention: every stage has sent and received every MoE layer of the announced step.
  Status require_step_complete(const char* call) const {
    if (!announced_) return ok_status();
    for (int s = 0; s < cfg_.num_stages; ++s) {
      const StageFifo& fifo = fifos_[s];
      if (fifo.count != 0 || fifo.next_layer_index != 0 || fifo.step != step_) {
        return invalid_argument(fmt::format(
            "afd {}: step {} is not finished: stage {} has {} outstanding transfers and {} MoE layers sent", call,
            step_, s, fifo.count,
            fifo.step == step_
                ? (fifo.next_layer_index == 0 ? static_cast<int>(moe_layers_.size()) : fifo.next_layer_index)
                : 0));
      }
    }
    return ok_status();
  }

  Status send_control(wire::Kind kind, int64_t step, std::span<const int> counts, bool warmup) {
    GB_RETURN_IF_ERROR(wait_all(ctrl_send_ids_, deadline_after_ms(cfg_.timeout_ms), "send:the previous control message",
                                topo_.ffn_world, -1, 0, step));
    for (int f = 0; f < cfg_.num_ffn; ++f) {
      std::byte* b = ctrl_send_buf_[f].data();
      wire::Header h{};
      h.magic = wire::kMagic;
      h.version = wire::kVersion;
      h.kind = kind;
      h.flags = warmup ? wire::kFlagWarmup : 0;
      h.source = rank_;
      h.step = step;
      h.num_tokens = static_cast<int32_t>(counts.size());
      h.send_ns = now_ns();
      std::memcpy(b, &h, sizeof(h));
      for (size_t s = 0; s < counts.size(); ++s) {
        const int32_t v = counts[s];
        std::memcpy(b + wire::kHeaderBytes + 4 * s, &v, 4);
      }
      GB_RETURN_IF_ERROR(send_small(topo_.ffn_world[f], Channel::kControl, wire::kTagStep,
                                    ctrl_send_buf_[f].first(wire::kHeaderBytes + 4 * counts.size()),
                                    &ctrl_send_ids_[f]));
    }
    return ok_status();
  }

  // Attention side.
  bool announced_ = false;
  int64_t step_ = 0;
  bool warmup_ = false;
  std::array<int, kMaxStages> counts_{};
  std::vector<std::span<std::byte>> ctrl_send_buf_;
  std::vector<RequestId> ctrl_send_ids_;
  // FFN side.
  std::vector<std::span<std::byte>> ctrl_recv_buf_;
  std::vector<RequestId> ctrl_recv_ids_;
  std::vector<size_t> ctrl_bytes_;
  StepControl control_;
  bool step_active_ = false;
  bool seen_step_ = false;  // a control message arrived before (the attention ranks are stepping)
  bool stopped_ = false;
  std::array<int, kMaxStages> next_layer_{};
};

}  // namespace

std::unique_ptr<Connector> make_sync_connector(const AfdConfig& cfg, std::unique_ptr<Transport> transport) {
  return std::make_unique<SyncConnector>(cfg, std::move(transport));
}

}  // namespace genbridge::afd
