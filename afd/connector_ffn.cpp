// The FFN side of ConnectorBase: receive slots (one per attention rank and stage), checking received work,
// building work items from groups of slots, and sending expert outputs back (send_ffn_output).

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "afd/connector_base.h"
#include "genbridge/core/formats.h"

namespace genbridge::afd {

Status ConnectorBase::post_slot(int i) {
  RecvSlot& slot = slots_[i];
  if (slot.closed) return ok_status();
  const int src = topo_.attention_world[slot.peer];
  // Posted in this order, the two receives match the transfer's two messages in order.
  const MutSegment meta{slot.meta.data(), slot.meta.size()};
  GB_ASSIGN_OR_RETURN(slot.meta_id, transport_->irecv(src, Channel::kDispatch, slot.stage, {&meta, 1}));
  const MutSegment rows{slot.rows.data(), slot.rows.size()};
  GB_ASSIGN_OR_RETURN(slot.rows_id, transport_->irecv(src, Channel::kDispatch, slot.stage, {&rows, 1}));
  slot.pending = 2;
  return ok_status();
}

void ConnectorBase::collect_slot_ids(std::span<const int> slot_indices) {
  wait_ids_.clear();
  wait_slots_.clear();
  for (int i : slot_indices) {
    wait_ids_.push_back(slots_[i].meta_id);
    wait_ids_.push_back(slots_[i].rows_id);
    wait_slots_.push_back(i);
  }
}

void ConnectorBase::complete_slot_request(int index, const Completion& c) {
  RecvSlot& slot = slots_[wait_slots_[index / 2]];
  heard_from(slot.peer);
  if (index % 2 == 0) {
    slot.meta_id = kNoRequest;
    slot.meta_done = c;
  } else {
    slot.rows_id = kNoRequest;
    slot.rows_done = c;
  }
  --slot.pending;
  wait_ids_[index] = kNoRequest;
}

Result<const wire::Header*> ConnectorBase::check_work(const RecvSlot& slot, int64_t expect_step) {
  const wire::Header* h = slot.header();
  const size_t got = slot.meta_done.bytes;
  const std::string from = topo_.rank_name(topo_.attention_world[slot.peer]);
  if (got < wire::kHeaderBytes || h->magic != wire::kMagic || h->version != wire::kVersion) {
    return internal_error(fmt::format("afd: {} received a malformed message of {} bytes from {} on stage {}",
                                      topo_.rank_name(world_rank_), got, from, slot.stage));
  }
  if (h->kind != wire::Kind::kWork || h->stage != slot.stage || h->source != slot.peer || h->top_k != k_ ||
      h->hidden != hidden_ || h->num_tokens < 0 || h->num_tokens > cfg_.max_tokens_per_stage ||
      got != wire::work_meta_bytes(h->num_tokens, k_) ||
      slot.rows_done.bytes != wire::dispatch_rows_bytes(h->num_tokens, row_bytes_) ||
      (expect_step >= 0 && h->step != expect_step)) {
    return internal_error(fmt::format(
        "afd: {} expected a work transfer for stage {}{} from {} but got a {} message of {} + {} bytes (layer {}, "
        "stage "
        "{}, step {}, {} tokens, source {})",
        topo_.rank_name(world_rank_), slot.stage, expect_step >= 0 ? fmt::format(", step {}", expect_step) : "", from,
        wire::kind_name(h->kind), got, slot.rows_done.bytes, h->layer, h->stage, h->step, h->num_tokens, h->source));
  }
  if (h->layer < 0 || h->layer >= cfg_.num_layers || moe_index_of_layer_[h->layer] < 0) {
    return internal_error(fmt::format("afd: {} received work for layer {} from {}, which is not a MoE layer",
                                      topo_.rank_name(world_rank_), h->layer, from));
  }
  if (metrics_) {
    // A warm-up step's transfers are not measured; the header says which step this is (the recording state
    // may still be the previous work item's).
    metrics_->set_recording((h->flags & wire::kFlagWarmup) == 0);
    const int64_t done = std::max(slot.meta_done.done_ns, slot.rows_done.done_ns);
    metrics_->record_transfer(Direction::kAttnToFfn, h->layer, h->stage, done - h->send_ns,
                              static_cast<int64_t>(got + slot.rows_done.bytes));
    metrics_->span(SpanKind::kTransfer, h->send_ns, done, h->layer, h->stage, h->step,
                   topo_.attention_world[slot.peer]);
  }
  return h;
}

Status ConnectorBase::wait_group_sends(Group& g, int layer, int stage, int64_t step) {
  wait_peers_.clear();
  for (int s : g.slots) {
    wait_peers_.push_back(topo_.attention_world[slots_[s].peer]);
    wait_peers_.push_back(topo_.attention_world[slots_[s].peer]);
  }
  return wait_all(g.send_ids, deadline_after_ms(cfg_.timeout_ms), "send:the previous expert outputs", wait_peers_,
                  layer, stage, step);
}

Result<FfnWorkItem> ConnectorBase::make_item(int gi) {
  Group& g = groups_[gi];
  const int nslots = static_cast<int>(g.slots.size());
  FfnWorkItem item;
  const wire::Header* first = slots_[g.slots[0]].header();
  item.meta.layer = first->layer;
  item.meta.stage = first->stage;
  item.meta.step = first->step;
  item.meta.num_seq_lens = nslots;
  int64_t total = 0;
  int nonempty = 0, last_nonempty = 0;
  for (int i = 0; i < nslots; ++i) {
    const wire::Header* h = slots_[g.slots[i]].header();
    if (h->layer != first->layer) {
      return internal_error(fmt::format(
          "afd: {} received layer {} from {} but layer {} from {} for the same stage {} of step {}",
          topo_.rank_name(world_rank_), first->layer, topo_.rank_name(topo_.attention_world[slots_[g.slots[0]].peer]),
          h->layer, topo_.rank_name(topo_.attention_world[slots_[g.slots[i]].peer]), first->stage, first->step));
    }
    item.meta.seq_lens[i] = h->num_tokens;
    total += h->num_tokens;
    if (h->num_tokens > 0) {
      ++nonempty;
      last_nonempty = i;
    }
  }
  const int64_t H = hidden_;
  g.row_token.clear();
  g.row_slot.clear();
  g.seg_rows.assign(nslots, 0);
  auto slot_ids = [&](int i) {
    return reinterpret_cast<const int32_t*>(slots_[g.slots[i]].meta.data() + wire::kHeaderBytes);
  };
  int64_t base = 0;
  for (int i = 0; i < nslots; ++i) {
    const int m = item.meta.seq_lens[i];
    const size_t before = g.row_token.size();
    GB_RETURN_IF_ERROR(append_owned_rows(slot_ids(i), m, k_, topo_, rank_, item.meta.layer, static_cast<int>(base),
                                         &g.row_token, &g.row_slot));
    g.seg_rows[i] = static_cast<int32_t>(g.row_token.size() - before);
    base += m;
  }
  if (nonempty <= 1) {
    // One segment holds every token: compute straight from the receive buffer.
    const int i = nonempty == 1 ? last_nonempty : 0;
    const RecvSlot& slot = slots_[g.slots[i]];
    const int m = item.meta.seq_lens[i];
    int32_t* ids = reinterpret_cast<int32_t*>(slot.meta.data() + wire::kHeaderBytes);
    item.topk_ids = TensorView(ids, DType::kI32, {total, k_});
    item.topk_weights = TensorView(ids + static_cast<size_t>(m) * k_, DType::kF32, {total, k_});
    item.hidden = TensorView(slot.rows.data(), row_dtype_, {total, row_elems_});
    // Every other segment is empty, so this segment's tokens (and the rows' token indices) start at 0.
  } else {
    g.pack_hidden.resize(static_cast<size_t>(total * row_bytes_));
    g.pack_ids.resize(static_cast<size_t>(total * k_));
    g.pack_weights.resize(static_cast<size_t>(total * k_));
    int64_t off = 0;
    for (int i = 0; i < nslots; ++i) {
      const int m = item.meta.seq_lens[i];
      if (m == 0) continue;
      const std::byte* meta = slots_[g.slots[i]].meta.data();
      std::memcpy(g.pack_ids.data() + off * k_, meta + wire::kHeaderBytes, static_cast<size_t>(m) * k_ * 4);
      std::memcpy(g.pack_weights.data() + off * k_, meta + wire::kHeaderBytes + static_cast<size_t>(m) * k_ * 4,
                  static_cast<size_t>(m) * k_ * 4);
      std::memcpy(g.pack_hidden.data() + off * row_bytes_, slots_[g.slots[i]].rows.data(),
                  static_cast<size_t>(m * row_bytes_));
      off += m;
    }
    item.topk_ids = TensorView(g.pack_ids.data(), DType::kI32, {total, k_});
    item.topk_weights = TensorView(g.pack_weights.data(), DType::kF32, {total, k_});
    item.hidden = TensorView(g.pack_hidden.data(), row_dtype_, {total, row_elems_});
  }
  const int64_t rows = static_cast<int64_t>(g.row_token.size());
  if (rows > g.rows_capacity) {
    return internal_error(fmt::format("afd: {} got {} expert-output rows but registered {}",
                                      topo_.rank_name(world_rank_), rows, g.rows_capacity));
  }
  std::tie(item.expert_begin, item.expert_end) = topo_.held_range(item.meta.layer, rank_);
  item.row_token = g.row_token;
  item.row_slot = g.row_slot;
  item.out = TensorView(g.out_buf.data(), DType::kBF16, {rows, H});
  item.source = nslots == 1 ? slots_[g.slots[0]].peer : -1;
  item.warmup = (first->flags & wire::kFlagWarmup) != 0;
  item.meta.warmup = item.warmup;
  g.held = true;
  g.meta = item.meta;
  item.state = BackendState(this, gi, g.generation);
  return item;
}

void ConnectorBase::release_state(int gi, uint64_t generation) {
  if (gi < 0 || gi >= static_cast<int>(groups_.size())) return;
  Group& g = groups_[gi];
  if (!g.held || g.generation != generation) return;
  g.held = false;
  ++g.generation;
  if (closed_) return;
  for (int s : g.slots) post_slot(s).ignore();
}

Status ConnectorBase::send_ffn_output(TensorView out, BackendState&& state) {
  GB_RETURN_IF_ERROR(require_role(Role::kFfn, "send_ffn_output"));
  if (state.owner_ != this || state.slot_ < 0 || state.slot_ >= static_cast<int>(groups_.size()) ||
      !groups_[state.slot_].held || groups_[state.slot_].generation != state.generation_) {
    return invalid_argument(
        "afd send_ffn_output: the state was not handed out by this connector's last receive of that work, or was "
        "already given back");
  }
  const int gi = state.slot_;
  Group& g = groups_[gi];
  const int64_t rows = static_cast<int64_t>(g.row_token.size());
  const int64_t H = hidden_;
  if (out.dtype() != DType::kBF16 || out.rank() != 2 || out.dim(0) != rows || out.dim(1) != H ||
      (rows > 0 && H > 1 && out.stride(1) != 1)) {
    return invalid_argument(
        fmt::format("afd send_ffn_output: out must be bf16 [{}, {}] (one row per owned (token, slot)), got {} {} "
                    "(layer {}, stage {})",
                    rows, H, dtype_name(out.dtype()), out.shape_string(), g.meta.layer, g.meta.stage));
  }
  std::byte* ob = g.out_buf.data();
  if (rows > 0 && out.data() != ob) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(ob + r * H * 2, static_cast<const std::byte*>(out.data()) + r * out.stride(0) * 2,
                  static_cast<size_t>(H * 2));
    }
  }
  const int64_t send_ns = now_ns();
  int64_t r0 = 0;
  for (size_t i = 0; i < g.slots.size(); ++i) {
    const RecvSlot& slot = slots_[g.slots[i]];
    const int nrows = g.seg_rows[i];
    wire::Header h{};
    h.magic = wire::kMagic;
    h.version = wire::kVersion;
    h.kind = wire::Kind::kResult;
    h.layer = g.meta.layer;
    h.stage = g.meta.stage;
    h.source = rank_;
    h.step = g.meta.step;
    h.num_rows = nrows;
    h.top_k = k_;
    h.hidden = hidden_;
    h.send_ns = send_ns;
    std::memcpy(g.hdr_buf[i].data(), &h, sizeof(h));
    const int dst = topo_.attention_world[slot.peer];
    const ConstSegment hdr{g.hdr_buf[i].data(), wire::kHeaderBytes};
    GB_ASSIGN_OR_RETURN(g.send_ids[2 * i], transport_->isend(dst, Channel::kCombine, g.meta.stage, {&hdr, 1}));
    const ConstSegment rows{ob + r0 * H * 2, static_cast<size_t>(nrows * H * 2)};
    GB_ASSIGN_OR_RETURN(g.send_ids[2 * i + 1],
                        transport_->isend(dst, Channel::kCombine, g.meta.stage,
                                          std::span<const ConstSegment>(&rows, nrows > 0 ? 1 : 0)));
    r0 += nrows;
  }
  for (int s : g.slots) heard_from(slots_[s].peer);  // each peer now owes its next transfer
  g.held = false;
  ++g.generation;
  state.owner_ = nullptr;
  for (int s : g.slots) GB_RETURN_IF_ERROR(post_slot(s));
  return ok_status();
}

Status ConnectorBase::add_group(std::vector<int> slots) {
  Group g;
  g.slots = std::move(slots);
  const int64_t per_token = std::min(k_, cfg_.max_experts_per_ffn());
  const int64_t tokens = static_cast<int64_t>(g.slots.size()) * cfg_.max_tokens_per_stage;
  g.rows_capacity = tokens * per_token;
  GB_ASSIGN_OR_RETURN(g.out_buf, transport_->alloc_buffer(static_cast<size_t>(g.rows_capacity * hidden_ * 2)));
  for (size_t i = 0; i < g.slots.size(); ++i) {
    GB_ASSIGN_OR_RETURN(std::span<std::byte> h, transport_->alloc_buffer(wire::kHeaderBytes));
    g.hdr_buf.push_back(h);
  }
  g.send_ids.assign(2 * g.slots.size(), kNoRequest);
  g.row_token.reserve(static_cast<size_t>(g.rows_capacity));
  g.row_slot.reserve(static_cast<size_t>(g.rows_capacity));
  g.seg_rows.reserve(g.slots.size());
  if (g.slots.size() > 1) {
    g.pack_hidden.reserve(static_cast<size_t>(tokens * row_bytes_));
    g.pack_ids.reserve(static_cast<size_t>(tokens * k_));
    g.pack_weights.reserve(static_cast<size_t>(tokens * k_));
  }
  groups_.push_back(std::move(g));
  return ok_status();
}

}  // namespace genbridge::afd
