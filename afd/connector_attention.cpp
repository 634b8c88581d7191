// The attention side of ConnectorBase: dispatch (send_attn_output, with a per-stage FIFO of outstanding
// transfers) and combine input (recv_ffn_output, received straight into the caller's [n, k, H] buffer).

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "afd/connector_base.h"
#include "genbridge/core/formats.h"

namespace genbridge::afd {

Status ConnectorBase::send_attn_output(TensorView hidden, const TransferMeta& meta, const Routing& routing) {
  GB_RETURN_IF_ERROR(require_role(Role::kAttention, "send_attn_output"));
  if (finished_) return invalid_argument(fmt::format("afd {} connector: send_attn_output() after finish()", name()));
  GB_RETURN_IF_ERROR(validate_meta(meta, Role::kAttention, cfg_));
  const int n = meta.seq_lens[0];
  const int stage = meta.stage;
  if (hidden.dtype() != row_dtype_ || hidden.rank() != 2 || hidden.dim(0) != n || hidden.dim(1) != row_elems_ ||
      (n > 0 && row_elems_ > 1 && hidden.stride(1) != 1)) {
    return invalid_argument(fmt::format(
        "afd send_attn_output: hidden must be {} [{}, {}] with unit stride along {}, got {} {} (layer {}, stage {})",
        dtype_name(row_dtype_), n, row_elems_,
        row_dtype_ == DType::kBF16 ? "hidden" : "the row (a quantized dispatch's codes and scales)",
        dtype_name(hidden.dtype()), hidden.shape_string(), meta.layer, stage));
  }
  const TensorView& ids = routing.topk_ids;
  const TensorView& w = routing.topk_weights;
  if (ids.dtype() != DType::kI32 || ids.rank() != 2 || ids.dim(0) != n || ids.dim(1) != k_) {
    return invalid_argument(fmt::format("afd send_attn_output: topk_ids must be i32 [{}, {}], got {} {}", n, k_,
                                        dtype_name(ids.dtype()), ids.shape_string()));
  }
  if (w.dtype() != DType::kF32 || w.rank() != 2 || w.dim(0) != n || w.dim(1) != k_) {
    return invalid_argument(fmt::format("afd send_attn_output: topk_weights must be f32 [{}, {}], got {} {}", n, k_,
                                        dtype_name(w.dtype()), w.shape_string()));
  }
  StageFifo& fifo = fifos_[stage];
  if (fifo.count == kFifoDepth) {
    return invalid_argument(
        fmt::format("afd send_attn_output: stage {} already has {} outstanding transfers (layers {} and {}); call "
                    "recv_ffn_output({}) first",
                    stage, kFifoDepth, fifo.entries[fifo.head].meta.layer,
                    fifo.entries[(fifo.head + 1) % kFifoDepth].meta.layer, stage));
  }
  const int expect_layer = moe_layers_[fifo.next_layer_index];
  if (meta.layer != expect_layer) {
    return invalid_argument(fmt::format(
        "afd send_attn_output: stage {} expects MoE layer {} next (each step sends the MoE layers in order) but got "
        "layer {}",
        stage, expect_layer, meta.layer));
  }
  if (fifo.next_layer_index == 0 ? meta.step <= fifo.step : meta.step != fifo.step) {
    return invalid_argument(fmt::format(
        "afd send_attn_output: step {} for layer {} of stage {}, but {}", meta.step, meta.layer, stage,
        fifo.next_layer_index == 0 ? fmt::format("a new step must be numbered above the previous step {}", fifo.step)
                                   : fmt::format("the stage is in the middle of step {}", fifo.step)));
  }
  GB_RETURN_IF_ERROR(check_dispatch(meta));

  Dispatch& d = fifo.entries[(fifo.head + fifo.count) % kFifoDepth];
  GB_RETURN_IF_ERROR(compute_dispatch_layout(
      ids, topo_, meta.layer, &d.layout,
      (meta.step * cfg_.num_stages + stage) * cfg_.num_attention + rank_));
  d.meta = meta;
  d.num_tokens = n;
  d.send_ns = now_ns();
  const size_t row_bytes = static_cast<size_t>(row_bytes_);
  const size_t row_stride_bytes = static_cast<size_t>(hidden.stride(0)) * dtype_size(row_dtype_);
  const std::byte* hbase = static_cast<const std::byte*>(hidden.data());
  for (int f = 0; f < cfg_.num_ffn; ++f) {
    const int m = d.layout.num_tokens_to(f);
    const int32_t* toks = d.layout.tokens.data() + d.layout.token_offsets[f];
    std::byte* mb = d.meta_buf[f].data();
    wire::Header h{};
    h.magic = wire::kMagic;
    h.version = wire::kVersion;
    h.kind = wire::Kind::kWork;
    h.flags = meta.warmup ? wire::kFlagWarmup : 0;
    h.layer = meta.layer;
    h.stage = stage;
    h.source = rank_;
    h.step = meta.step;
    h.num_tokens = m;
    h.top_k = k_;
    h.hidden = hidden_;
    h.send_ns = d.send_ns;
    std::memcpy(mb, &h, sizeof(h));
    int32_t* out_ids = reinterpret_cast<int32_t*>(mb + wire::kHeaderBytes);
    float* out_w = reinterpret_cast<float*>(out_ids + static_cast<size_t>(m) * k_);
    const float* wb = w.data_as<const float>();
    for (int i = 0; i < m; ++i) {
      const int t = toks[i];
      write_sent_ids(ids, d.layout, t, f, out_ids + static_cast<size_t>(i) * k_);
      for (int j = 0; j < k_; ++j) out_w[i * k_ + j] = wb[t * w.stride(0) + j * w.stride(1)];
    }
    const ConstSegment meta_seg{mb, wire::work_meta_bytes(m, k_)};
    GB_ASSIGN_OR_RETURN(d.send_ids[2 * f],
                        transport_->isend(topo_.ffn_world[f], Channel::kDispatch, stage, {&meta_seg, 1}));
    // The rows, read in place: one segment per run of consecutive rows (one for the whole stage when
    // every token goes to this FFN rank and the rows are contiguous).
    send_segs_.clear();
    for (int i = 0; i < m; ++i) {
      const std::byte* row = hbase + static_cast<size_t>(toks[i]) * row_stride_bytes;
      if (!send_segs_.empty() &&
          static_cast<const std::byte*>(send_segs_.back().data) + send_segs_.back().bytes == row) {
        send_segs_.back().bytes += row_bytes;
      } else {
        send_segs_.push_back({row, row_bytes});
      }
    }
    GB_ASSIGN_OR_RETURN(d.send_ids[2 * f + 1],
                        transport_->isend(topo_.ffn_world[f], Channel::kDispatch, stage, send_segs_));
  }
  ++fifo.count;
  fifo.next_layer_index = (fifo.next_layer_index + 1) % static_cast<int>(moe_layers_.size());
  fifo.step = meta.step;
  return ok_status();
}

Result<TransferMeta> ConnectorBase::recv_ffn_output(TensorView out, int stage) {
  GB_RETURN_IF_ERROR(require_role(Role::kAttention, "recv_ffn_output"));
  if (stage < 0 || stage >= cfg_.num_stages) {
    return invalid_argument(fmt::format("afd recv_ffn_output: stage {} is outside 0..{}", stage, cfg_.num_stages - 1));
  }
  StageFifo& fifo = fifos_[stage];
  if (fifo.count == 0) {
    return invalid_argument(fmt::format("afd recv_ffn_output: stage {} has no outstanding transfer", stage));
  }
  Dispatch& d = fifo.entries[fifo.head];
  const int n = d.num_tokens;
  if (out.dtype() != DType::kBF16 || out.rank() != 3 || out.dim(0) != n || out.dim(1) != k_ || out.dim(2) != hidden_ ||
      (n > 0 && hidden_ > 1 && out.stride(2) != 1)) {
    return invalid_argument(
        fmt::format("afd recv_ffn_output: out must be bf16 [{}, {}, {}] with unit stride along hidden, got {} {} "
                    "(layer {}, stage {})",
                    n, k_, hidden_, dtype_name(out.dtype()), out.shape_string(), d.meta.layer, stage));
  }
  const size_t row_bytes = static_cast<size_t>(hidden_) * 2;
  std::byte* obase = static_cast<std::byte*>(out.data());
  const int64_t os0 = out.stride(0), os1 = out.stride(1);
  const int F = cfg_.num_ffn;
  for (int f = 0; f < F; ++f) {
    const MutSegment hdr{d.hdr_buf[f].data(), wire::kHeaderBytes};
    GB_ASSIGN_OR_RETURN(d.recv_ids[2 * f], transport_->irecv(topo_.ffn_world[f], Channel::kCombine, stage, {&hdr, 1}));
    // Rows land straight in out[t, j]; runs of adjacent rows form one segment.
    recv_segs_.clear();
    for (int r = d.layout.row_offsets[f]; r < d.layout.row_offsets[f + 1]; ++r) {
      std::byte* row =
          obase +
          (static_cast<size_t>(d.layout.rows_token[r]) * os0 + static_cast<size_t>(d.layout.rows_slot[r]) * os1) * 2;
      if (!recv_segs_.empty() && static_cast<std::byte*>(recv_segs_.back().data) + recv_segs_.back().bytes == row) {
        recv_segs_.back().bytes += row_bytes;
      } else {
        recv_segs_.push_back({row, row_bytes});
      }
    }
    GB_ASSIGN_OR_RETURN(d.recv_ids[2 * f + 1],
                        transport_->irecv(topo_.ffn_world[f], Channel::kCombine, stage, recv_segs_));
  }
  // With a control plane and several attention ranks, an FFN rank computes a stage only once every
  // attention rank sent it, so it may itself be waiting (timeout_ms) for a late attention rank: wait twice
  // as long, so that the error names the rank that is really late rather than the FFN rank waiting for it.
  const int64_t timeout_ms =
      control_plane() != nullptr && cfg_.num_attention > 1 ? 2 * cfg_.timeout_ms : cfg_.timeout_ms;
  const Deadline deadline = deadline_after_ms(timeout_ms);
  Status failure;
  for (int remaining = 2 * F; remaining > 0 && failure.ok(); --remaining) {
    Completion c;
    Result<int> r = transport_->wait_any(d.recv_ids, deadline, &c);
    if (!r.ok()) {
      int peer = 0;
      while (peer < 2 * F && d.recv_ids[peer] == kNoRequest) ++peer;
      failure = wait_error(r.status(), "the expert outputs", topo_.ffn_world[std::min(peer / 2, F - 1)], d.meta.layer,
                           stage, d.meta.step, timeout_ms);
      break;
    }
    d.recv_ids[*r] = kNoRequest;
    const int f = *r / 2;
    const int rows = d.layout.num_rows_from(f);
    if (*r % 2 == 0) {
      wire::Header h;
      std::memcpy(&h, d.hdr_buf[f].data(), sizeof(h));
      if (c.bytes != wire::kHeaderBytes || h.magic != wire::kMagic || h.kind != wire::Kind::kResult ||
          h.layer != d.meta.layer || h.stage != stage || h.step != d.meta.step || h.source != f || h.num_rows != rows) {
        failure = internal_error(fmt::format(
            "afd: {} expected the expert outputs of layer {}, stage {}, step {} ({} rows) from {} but got a {} "
            "message of {} bytes for layer {}, stage {}, step {} with {} rows from ffn rank {}",
            topo_.rank_name(world_rank_), d.meta.layer, stage, d.meta.step, rows, topo_.rank_name(topo_.ffn_world[f]),
            wire::kind_name(h.kind), c.bytes, h.layer, h.stage, h.step, h.num_rows, h.source));
        break;
      }
      d.result_send_ns[f] = h.send_ns;
    } else {
      if (c.bytes != wire::rows_bytes(rows, hidden_)) {
        failure =
            internal_error(fmt::format("afd: {} expected {} bytes of expert outputs of layer {}, stage {}, step "
                                       "{} from {} but got {}",
                                       topo_.rank_name(world_rank_), wire::rows_bytes(rows, hidden_), d.meta.layer,
                                       stage, d.meta.step, topo_.rank_name(topo_.ffn_world[f]), c.bytes));
        break;
      }
      d.result_done_ns[f] = c.done_ns;
    }
  }
  if (!failure.ok()) {
    // Withdraw the receives still posted into the caller's buffer before reporting.
    for (RequestId& id : d.recv_ids) {
      if (id != kNoRequest) transport_->cancel(id).ignore();
      id = kNoRequest;
    }
    return failure;
  }
  if (metrics_) {
    for (int f = 0; f < F; ++f) {
      const int64_t bytes =
          static_cast<int64_t>(wire::kHeaderBytes + wire::rows_bytes(d.layout.num_rows_from(f), hidden_));
      metrics_->record_transfer(Direction::kFfnToAttn, d.meta.layer, stage, d.result_done_ns[f] - d.result_send_ns[f],
                                bytes);
      metrics_->span(SpanKind::kTransfer, d.result_send_ns[f], d.result_done_ns[f], d.meta.layer, stage, d.meta.step,
                     topo_.ffn_world[f]);
    }
  }
  // The hidden rows were read in place: their sends must be done before the caller may reuse them.
  GB_RETURN_IF_ERROR(
      wait_all(d.send_ids, deadline, "send:the hidden states", ffn_world_pairs_, d.meta.layer, stage, d.meta.step));
  const TransferMeta meta = d.meta;
  fifo.head = (fifo.head + 1) % kFifoDepth;
  --fifo.count;
  return meta;
}

}  // namespace genbridge::afd
