#include "afd/connector_base.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "genbridge/core/formats.h"

namespace genbridge::afd {

// Defined by the connectors.
std::unique_ptr<Connector> make_sync_connector(const AfdConfig& cfg, std::unique_ptr<Transport> transport);
std::unique_ptr<Connector> make_async_connector(const AfdConfig& cfg, std::unique_ptr<Transport> transport);

// ---- contract types ----

TransferMeta TransferMeta::attention(int layer, int stage, int64_t step, int num_tokens) {
  TransferMeta m;
  m.layer = layer;
  m.stage = stage;
  m.step = step;
  m.num_seq_lens = 1;
  m.seq_lens[0] = num_tokens;
  return m;
}

int64_t TransferMeta::total_tokens() const {
  int64_t n = 0;
  for (int i = 0; i < num_seq_lens; ++i) n += seq_lens[i];
  return n;
}

Status validate_meta(const TransferMeta& m, Role side, const AfdConfig& cfg) {
  if (m.layer < 0 || m.layer >= cfg.num_layers) {
    return invalid_argument(fmt::format("afd transfer: layer {} is outside 0..{}", m.layer, cfg.num_layers - 1));
  }
  if (std::binary_search(cfg.dense_layers.begin(), cfg.dense_layers.end(), m.layer)) {
    return invalid_argument(fmt::format(
        "afd transfer: layer {} is listed in 'dense_layers'; dense layers stay on the attention side", m.layer));
  }
  if (m.stage < 0 || m.stage >= cfg.num_stages) {
    return invalid_argument(fmt::format("afd transfer: stage {} is outside 0..{} ('stages' is {})", m.stage,
                                        cfg.num_stages - 1, cfg.num_stages));
  }
  const int max_lens = side == Role::kAttention ? 1 : cfg.num_attention;
  if (m.num_seq_lens < 1 || m.num_seq_lens > max_lens) {
    return invalid_argument(fmt::format(
        "afd transfer: seq_lens has {} entries but must have {} on the {} side", m.num_seq_lens,
        side == Role::kAttention ? std::string("exactly 1") : fmt::format("1..{}", max_lens), role_name(side)));
  }
  for (int i = 0; i < m.num_seq_lens; ++i) {
    if (m.seq_lens[i] < 0 || m.seq_lens[i] > cfg.max_tokens_per_stage) {
      return invalid_argument(fmt::format("afd transfer: seq_lens[{}] is {} but must be in 0..{} "
                                          "('max_tokens_per_stage')",
                                          i, m.seq_lens[i], cfg.max_tokens_per_stage));
    }
  }
  if (m.step < 0) return invalid_argument(fmt::format("afd transfer: step {} is negative", m.step));
  return ok_status();
}

BackendState& BackendState::operator=(BackendState&& o) noexcept {
  if (this != &o) {
    if (owner_) owner_->release_state(slot_, generation_);
    owner_ = o.owner_;
    slot_ = o.slot_;
    generation_ = o.generation_;
    o.owner_ = nullptr;
  }
  return *this;
}

BackendState::~BackendState() {
  if (owner_) owner_->release_state(slot_, generation_);
}

Result<std::unique_ptr<Connector>> make_connector(const AfdConfig& cfg, std::unique_ptr<Transport> transport) {
  GB_RETURN_IF_ERROR(validate(cfg));
  if (!transport) return invalid_argument("afd: make_connector needs a transport");
  if (cfg.connector == ConnectorKind::kSync) return make_sync_connector(cfg, std::move(transport));
  return make_async_connector(cfg, std::move(transport));
}

// ---- ConnectorBase ----

ConnectorBase::ConnectorBase(const AfdConfig& cfg, std::unique_ptr<Transport> transport)
    : cfg_(cfg), transport_(std::move(transport)), k_(cfg.top_k), hidden_(cfg.hidden_size) {
  moe_layers_ = cfg_.moe_layers();
  moe_index_of_layer_.assign(cfg_.num_layers, -1);
  for (size_t i = 0; i < moe_layers_.size(); ++i) moe_index_of_layer_[moe_layers_[i]] = static_cast<int>(i);
}

ConnectorBase::~ConnectorBase() = default;

Status ConnectorBase::require_init(const char* call) const {
  if (!initialized_) return unavailable(fmt::format("afd {} connector: {}() before init()", name(), call));
  if (closed_) return unavailable(fmt::format("afd {} connector: {}() after close()", name(), call));
  return ok_status();
}

Status ConnectorBase::require_role(Role r, const char* call) const {
  GB_RETURN_IF_ERROR(require_init(call));
  if (role_ != r) {
    return invalid_argument(fmt::format("afd {} connector: {}() is a call of the {} side but {} is an {} rank", name(),
                                        call, role_name(r), topo_.rank_name(world_rank_), role_name(role_)));
  }
  return ok_status();
}

Status ConnectorBase::wait_error(const Status& s, std::string_view what, int peer_world, int layer, int stage,
                                 int64_t step, int64_t timeout_ms) const {
  const std::string me = topo_.rank_name(world_rank_);
  const std::string peer = peer_world >= 0 ? topo_.rank_name(peer_world) : std::string("any attention rank");
  const std::string where = layer >= 0 ? fmt::format(" of layer {}, stage {}, step {}", layer, stage, step)
                                       : fmt::format(" (step {})", step);
  // A `what` starting with "send:" is something this rank sent and the peer has not taken yet.
  const bool outgoing = what.starts_with("send:");
  const std::string waited = outgoing ? fmt::format("{} to take {}{}", peer, what.substr(5), where)
                                      : fmt::format("{}{} from {}", what, where, peer);
  if (s.code() == StatusCode::kDeadlineExceeded) {
    return deadline_exceeded(fmt::format("afd: {} timed out after {} ms waiting for {}", me, timeout_ms, waited));
  }
  if (s.code() == StatusCode::kUnavailable) {
    return unavailable(fmt::format("afd: {} stopped waiting for {}: {}", me, waited, s.message()));
  }
  return Status(s.code(), fmt::format("afd: {} waiting for {}: {}", me, waited, s.message()));
}

Status ConnectorBase::wait_all(std::span<RequestId> ids, Deadline deadline, std::string_view what,
                               std::span<const int> peers_world, int layer, int stage, int64_t step) {
  for (;;) {
    bool pending = false;
    for (RequestId id : ids) pending |= id != kNoRequest;
    if (!pending) return ok_status();
    Completion c;
    Result<int> r = transport_->wait_any(ids, deadline, &c);
    if (!r.ok()) {
      int peer = -1;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] != kNoRequest) {
          peer = peers_world[i];
          break;
        }
      }
      return wait_error(r.status(), what, peer, layer, stage, step, cfg_.timeout_ms);
    }
    ids[*r] = kNoRequest;
  }
}

Status ConnectorBase::send_small(int peer_world, Channel ch, int tag, std::span<std::byte> buf, RequestId* id) {
  const ConstSegment seg{buf.data(), buf.size()};
  GB_ASSIGN_OR_RETURN(*id, transport_->isend(peer_world, ch, tag, std::span<const ConstSegment>(&seg, 1)));
  return ok_status();
}

Status ConnectorBase::init() {
  if (initialized_) return ok_status();
  GB_RETURN_IF_ERROR(validate(cfg_));
  GB_RETURN_IF_ERROR(transport_->init());
  world_rank_ = transport_->world_rank();
  // Settings first (they decide everything else): rank 0 compares, then tells every rank the verdict.
  // The topology is not known yet, so this uses world ranks only.
  topo_ = Topology{};
  {
    const std::string mine = canonical_settings(cfg_);
    GB_ASSIGN_OR_RETURN(std::vector<std::string> all, gather(mine));
    std::string verdict;
    if (world_rank_ == 0) {
      for (size_t r = 1; r < all.size() && verdict.empty(); ++r) {
        std::string va, vb;
        const std::string key = first_differing_key(mine, all[r], &va, &vb);
        if (!key.empty()) {
          verdict = fmt::format(
              "afd config mismatch: '{}' is {} on world rank 0 but {} on world rank {}; every rank of the job must be "
              "started with the same AFD settings",
              key, va, vb, r);
        }
      }
    }
    // Scatter the verdict from rank 0 (size, then text).
    const Deadline deadline = deadline_after_ms(cfg_.timeout_ms);
    if (world_rank_ == 0) {
      const int n = transport_->world_size();
      std::vector<RequestId> ids;
      int64_t size = static_cast<int64_t>(verdict.size());
      for (int r = 1; r < n; ++r) {
        const ConstSegment s{&size, sizeof(size)};
        GB_ASSIGN_OR_RETURN(RequestId id, transport_->isend(r, Channel::kControl, wire::kTagScatterSize, {&s, 1}));
        ids.push_back(id);
        if (size > 0) {
          const ConstSegment d{verdict.data(), verdict.size()};
          GB_ASSIGN_OR_RETURN(RequestId id2, transport_->isend(r, Channel::kControl, wire::kTagScatterData, {&d, 1}));
          ids.push_back(id2);
        }
      }
      Completion c;
      for (RequestId& id : ids) {
        GB_ASSIGN_OR_RETURN(int idx, transport_->wait_any({&id, 1}, deadline, &c));
        (void)idx;
      }
    } else {
      int64_t size = 0;
      const MutSegment s{&size, sizeof(size)};
      GB_ASSIGN_OR_RETURN(RequestId id, transport_->irecv(0, Channel::kControl, wire::kTagScatterSize, {&s, 1}));
      Completion c;
      Result<int> r = transport_->wait_any({&id, 1}, deadline, &c);
      if (!r.ok()) {
        return Status(r.status().code(), fmt::format("afd: world rank {} waiting for the settings check of world rank 0 "
                                                     "during init: {}",
                                                     world_rank_, r.status().message()));
      }
      if (size > 0) {
        verdict.resize(static_cast<size_t>(size));
        const MutSegment d{verdict.data(), verdict.size()};
        GB_ASSIGN_OR_RETURN(RequestId id2, transport_->irecv(0, Channel::kControl, wire::kTagScatterData, {&d, 1}));
        GB_ASSIGN_OR_RETURN(int idx, transport_->wait_any({&id2, 1}, deadline, &c));
        (void)idx;
      }
    }
    if (!verdict.empty()) return invalid_argument(verdict);
  }
  GB_ASSIGN_OR_RETURN(topo_, make_topology(cfg_, transport_->declared_roles()));
  transport_->set_rank_names(topo_.rank_names());
  role_ = topo_.roles[world_rank_];
  rank_ = topo_.role_rank[world_rank_];
  const int A = cfg_.num_attention, F = cfg_.num_ffn, S = cfg_.num_stages;
  const int64_t max_tokens = cfg_.max_tokens_per_stage;

  if (role_ == Role::kAttention) {
    fifos_.assign(S, StageFifo{});
    for (StageFifo& fifo : fifos_) {
      for (Dispatch& d : fifo.entries) {
        d.meta_buf.resize(F);
        d.hdr_buf.resize(F);
        d.send_ids.assign(2 * F, kNoRequest);
        d.recv_ids.assign(2 * F, kNoRequest);
        for (int f = 0; f < F; ++f) {
          GB_ASSIGN_OR_RETURN(d.meta_buf[f], transport_->alloc_buffer(wire::work_meta_bytes(max_tokens, k_)));
          GB_ASSIGN_OR_RETURN(d.hdr_buf[f], transport_->alloc_buffer(wire::kHeaderBytes));
        }
        d.result_send_ns.assign(F, 0);
        d.result_done_ns.assign(F, 0);
        d.layout.tokens.reserve(max_tokens * F);
        d.layout.rows_token.reserve(max_tokens * k_);
        d.layout.rows_slot.reserve(max_tokens * k_);
      }
    }
    for (int f = 0; f < F; ++f) {
      ffn_world_pairs_.push_back(topo_.ffn_world[f]);
      ffn_world_pairs_.push_back(topo_.ffn_world[f]);
    }
    send_segs_.reserve(1 + max_tokens);
    recv_segs_.reserve(1 + max_tokens * k_);
    GB_RETURN_IF_ERROR(init_attention());
  } else {
    slots_.resize(static_cast<size_t>(A) * S);
    for (int a = 0; a < A; ++a) {
      for (int s = 0; s < S; ++s) {
        RecvSlot& slot = slots_[slot_index(a, s)];
        slot.peer = a;
        slot.stage = s;
        GB_ASSIGN_OR_RETURN(slot.meta, transport_->alloc_buffer(wire::work_meta_bytes(max_tokens, k_)));
        GB_ASSIGN_OR_RETURN(slot.rows, transport_->alloc_buffer(wire::rows_bytes(max_tokens, hidden_)));
      }
    }
    GB_RETURN_IF_ERROR(init_ffn());
    for (size_t i = 0; i < slots_.size(); ++i) GB_RETURN_IF_ERROR(post_slot(static_cast<int>(i)));
  }
  wait_ids_.reserve(2 * (static_cast<size_t>(A) * S + F));
  wait_slots_.reserve(static_cast<size_t>(A) * S);
  wait_peers_.reserve(2 * (static_cast<size_t>(A) * S + F));
  initialized_ = true;
  return ok_status();
}

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

// ---- attention side ----

Status ConnectorBase::send_attn_output(TensorView hidden, const TransferMeta& meta, const Routing& routing) {
  GB_RETURN_IF_ERROR(require_role(Role::kAttention, "send_attn_output"));
  if (finished_) return invalid_argument(fmt::format("afd {} connector: send_attn_output() after finish()", name()));
  GB_RETURN_IF_ERROR(validate_meta(meta, Role::kAttention, cfg_));
  const int n = meta.seq_lens[0];
  const int stage = meta.stage;
  if (hidden.dtype() != DType::kBF16 || hidden.rank() != 2 || hidden.dim(0) != n || hidden.dim(1) != hidden_ ||
      (n > 0 && hidden_ > 1 && hidden.stride(1) != 1)) {
    return invalid_argument(fmt::format(
        "afd send_attn_output: hidden must be bf16 [{}, {}] with unit stride along hidden, got {} {} (layer {}, stage {})",
        n, hidden_, dtype_name(hidden.dtype()), hidden.shape_string(), meta.layer, stage));
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
    return invalid_argument(fmt::format(
        "afd send_attn_output: stage {} already has {} outstanding transfers (layers {} and {}); call "
        "recv_ffn_output({}) first",
        stage, kFifoDepth, fifo.entries[fifo.head].meta.layer, fifo.entries[(fifo.head + 1) % kFifoDepth].meta.layer,
        stage));
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
  GB_RETURN_IF_ERROR(compute_dispatch_layout(ids, topo_, &d.layout));
  d.meta = meta;
  d.num_tokens = n;
  d.send_ns = now_ns();
  const size_t row_bytes = static_cast<size_t>(hidden_) * 2;
  const int64_t hs0 = hidden.stride(0);
  const std::byte* hbase = static_cast<const std::byte*>(hidden.data());
  for (int f = 0; f < cfg_.num_ffn; ++f) {
    const int m = d.layout.num_tokens_to(f);
    const int32_t* toks = d.layout.tokens.data() + d.layout.token_offsets[f];
    std::byte* mb = d.meta_buf[f].data();
    wire::Header h{};
    h.magic = wire::kMagic;
    h.version = wire::kVersion;
    h.kind = wire::Kind::kWork;
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
    const int32_t* ib = ids.data_as<const int32_t>();
    const float* wb = w.data_as<const float>();
    for (int i = 0; i < m; ++i) {
      const int t = toks[i];
      for (int j = 0; j < k_; ++j) {
        out_ids[i * k_ + j] = ib[t * ids.stride(0) + j * ids.stride(1)];
        out_w[i * k_ + j] = wb[t * w.stride(0) + j * w.stride(1)];
      }
    }
    const ConstSegment meta_seg{mb, wire::work_meta_bytes(m, k_)};
    GB_ASSIGN_OR_RETURN(d.send_ids[2 * f],
                        transport_->isend(topo_.ffn_world[f], Channel::kDispatch, stage, {&meta_seg, 1}));
    // The rows, read in place: one segment per run of consecutive rows (one for the whole stage when
    // every token goes to this FFN rank and the rows are contiguous).
    send_segs_.clear();
    for (int i = 0; i < m; ++i) {
      const std::byte* row = hbase + static_cast<size_t>(toks[i]) * hs0 * 2;
      if (!send_segs_.empty() && static_cast<const std::byte*>(send_segs_.back().data) + send_segs_.back().bytes == row) {
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
  if (out.dtype() != DType::kBF16 || out.rank() != 3 || out.dim(0) != n || out.dim(1) != k_ ||
      out.dim(2) != hidden_ || (n > 0 && hidden_ > 1 && out.stride(2) != 1)) {
    return invalid_argument(fmt::format(
        "afd recv_ffn_output: out must be bf16 [{}, {}, {}] with unit stride along hidden, got {} {} (layer {}, stage {})",
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
      std::byte* row = obase + (static_cast<size_t>(d.layout.rows_token[r]) * os0 +
                                static_cast<size_t>(d.layout.rows_slot[r]) * os1) * 2;
      if (!recv_segs_.empty() && static_cast<std::byte*>(recv_segs_.back().data) + recv_segs_.back().bytes == row) {
        recv_segs_.back().bytes += row_bytes;
      } else {
        recv_segs_.push_back({row, row_bytes});
      }
    }
    GB_ASSIGN_OR_RETURN(d.recv_ids[2 * f + 1],
                        transport_->irecv(topo_.ffn_world[f], Channel::kCombine, stage, recv_segs_));
  }
  const Deadline deadline = deadline_after_ms(cfg_.timeout_ms);
  Status failure;
  for (int remaining = 2 * F; remaining > 0 && failure.ok(); --remaining) {
    Completion c;
    Result<int> r = transport_->wait_any(d.recv_ids, deadline, &c);
    if (!r.ok()) {
      int peer = 0;
      while (peer < 2 * F && d.recv_ids[peer] == kNoRequest) ++peer;
      failure = wait_error(r.status(), "the expert outputs", topo_.ffn_world[std::min(peer / 2, F - 1)], d.meta.layer,
                           stage, d.meta.step, cfg_.timeout_ms);
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
        failure = internal_error(fmt::format("afd: {} expected {} bytes of expert outputs of layer {}, stage {}, step "
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
      const int64_t bytes = static_cast<int64_t>(wire::kHeaderBytes + wire::rows_bytes(d.layout.num_rows_from(f), hidden_));
      metrics_->record_transfer(Direction::kFfnToAttn, d.meta.layer, stage, d.result_done_ns[f] - d.result_send_ns[f],
                                bytes);
      metrics_->span(SpanKind::kTransfer, d.result_send_ns[f], d.result_done_ns[f], d.meta.layer, stage, d.meta.step,
                     topo_.ffn_world[f]);
    }
  }
  // The hidden rows were read in place: their sends must be done before the caller may reuse them.
  GB_RETURN_IF_ERROR(wait_all(d.send_ids, deadline, "send:the hidden states", ffn_world_pairs_, d.meta.layer, stage,
                              d.meta.step));
  const TransferMeta meta = d.meta;
  fifo.head = (fifo.head + 1) % kFifoDepth;
  --fifo.count;
  return meta;
}

// ---- FFN side ----

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
      got != wire::work_meta_bytes(h->num_tokens, k_) || slot.rows_done.bytes != wire::rows_bytes(h->num_tokens, hidden_) ||
      (expect_step >= 0 && h->step != expect_step)) {
    return internal_error(fmt::format(
        "afd: {} expected a work transfer for stage {}{} from {} but got a {} message of {} + {} bytes (layer {}, stage "
        "{}, step {}, {} tokens, source {})",
        topo_.rank_name(world_rank_), slot.stage, expect_step >= 0 ? fmt::format(", step {}", expect_step) : "", from,
        wire::kind_name(h->kind), got, slot.rows_done.bytes, h->layer, h->stage, h->step, h->num_tokens, h->source));
  }
  if (h->layer < 0 || h->layer >= cfg_.num_layers || moe_index_of_layer_[h->layer] < 0) {
    return internal_error(fmt::format("afd: {} received work for layer {} from {}, which is not a MoE layer",
                                      topo_.rank_name(world_rank_), h->layer, from));
  }
  if (metrics_) {
    const int64_t done = std::max(slot.meta_done.done_ns, slot.rows_done.done_ns);
    metrics_->record_transfer(Direction::kAttnToFfn, h->layer, h->stage, done - h->send_ns,
                              static_cast<int64_t>(got + slot.rows_done.bytes));
    metrics_->span(SpanKind::kTransfer, h->send_ns, done, h->layer, h->stage, h->step, topo_.attention_world[slot.peer]);
  }
  return h;
}

Status ConnectorBase::wait_group_sends(Group& g, int layer, int stage, int64_t step) {
  wait_peers_.clear();
  for (int s : g.slots) {
    wait_peers_.push_back(topo_.attention_world[slots_[s].peer]);
    wait_peers_.push_back(topo_.attention_world[slots_[s].peer]);
  }
  return wait_all(g.send_ids, deadline_after_ms(cfg_.timeout_ms), "send:the previous expert outputs",
                  wait_peers_, layer, stage, step);
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
    append_owned_rows(slot_ids(i), m, k_, topo_, rank_, static_cast<int>(base), &g.row_token, &g.row_slot);
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
    item.hidden = TensorView(slot.rows.data(), DType::kBF16, {total, H});
    // Every other segment is empty, so this segment's tokens (and the rows' token indices) start at 0.
  } else {
    g.pack_hidden.resize(static_cast<size_t>(total * H * 2));
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
      std::memcpy(g.pack_hidden.data() + off * H * 2, slots_[g.slots[i]].rows.data(), static_cast<size_t>(m * H * 2));
      off += m;
    }
    item.topk_ids = TensorView(g.pack_ids.data(), DType::kI32, {total, k_});
    item.topk_weights = TensorView(g.pack_weights.data(), DType::kF32, {total, k_});
    item.hidden = TensorView(g.pack_hidden.data(), DType::kBF16, {total, H});
  }
  const int64_t rows = static_cast<int64_t>(g.row_token.size());
  if (rows > g.rows_capacity) {
    return internal_error(fmt::format("afd: {} got {} expert-output rows but registered {}", topo_.rank_name(world_rank_),
                                      rows, g.rows_capacity));
  }
  item.expert_begin = topo_.expert_begin(rank_);
  item.expert_end = topo_.expert_end(rank_);
  item.row_token = g.row_token;
  item.row_slot = g.row_slot;
  item.out = TensorView(g.out_buf.data(), DType::kBF16, {rows, H});
  item.source = nslots == 1 ? slots_[g.slots[0]].peer : -1;
  item.warmup = (first->flags & wire::kFlagWarmup) != 0;
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
    return invalid_argument(fmt::format(
        "afd send_ffn_output: out must be bf16 [{}, {}] (one row per owned (token, slot)), got {} {} (layer {}, stage {})",
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
    GB_ASSIGN_OR_RETURN(g.send_ids[2 * i + 1], transport_->isend(dst, Channel::kCombine, g.meta.stage,
                                                                 std::span<const ConstSegment>(&rows, nrows > 0 ? 1 : 0)));
    r0 += nrows;
  }
  g.held = false;
  ++g.generation;
  state.owner_ = nullptr;
  for (int s : g.slots) GB_RETURN_IF_ERROR(post_slot(s));
  return ok_status();
}

// ---- both ----

Result<std::vector<std::string>> ConnectorBase::gather(std::string_view blob) {
  if (closed_) return unavailable(fmt::format("afd {} connector: gather() after close()", name()));
  const Deadline deadline = deadline_after_ms(cfg_.timeout_ms);
  const int n = transport_->world_size();
  const int me = transport_->world_rank();
  std::vector<std::string> all;
  auto fail = [&](const Status& s, int peer) {
    return Status(s.code(), fmt::format("afd: world rank {} gathering at world rank 0 (peer world rank {}): {}", me,
                                        peer, s.message()));
  };
  if (me == 0) {
    all.resize(n);
    all[0] = std::string(blob);
    for (int r = 1; r < n; ++r) {
      int64_t size = 0;
      const MutSegment s{&size, sizeof(size)};
      GB_ASSIGN_OR_RETURN(RequestId id, transport_->irecv(r, Channel::kControl, wire::kTagGatherSize, {&s, 1}));
      Completion c;
      Result<int> w = transport_->wait_any({&id, 1}, deadline, &c);
      if (!w.ok()) return fail(w.status(), r);
      all[r].resize(static_cast<size_t>(size));
      if (size > 0) {
        const MutSegment d{all[r].data(), all[r].size()};
        GB_ASSIGN_OR_RETURN(RequestId id2, transport_->irecv(r, Channel::kControl, wire::kTagGatherData, {&d, 1}));
        Result<int> w2 = transport_->wait_any({&id2, 1}, deadline, &c);
        if (!w2.ok()) return fail(w2.status(), r);
      }
    }
  } else {
    int64_t size = static_cast<int64_t>(blob.size());
    const ConstSegment s{&size, sizeof(size)};
    RequestId ids[2] = {kNoRequest, kNoRequest};
    GB_ASSIGN_OR_RETURN(ids[0], transport_->isend(0, Channel::kControl, wire::kTagGatherSize, {&s, 1}));
    if (size > 0) {
      const ConstSegment d{blob.data(), blob.size()};
      GB_ASSIGN_OR_RETURN(ids[1], transport_->isend(0, Channel::kControl, wire::kTagGatherData, {&d, 1}));
    }
    for (RequestId& id : ids) {
      if (id == kNoRequest) continue;
      Completion c;
      Result<int> w = transport_->wait_any({&id, 1}, deadline, &c);
      if (!w.ok()) return fail(w.status(), 0);
    }
  }
  return all;
}

void ConnectorBase::abort_job(const Status& why) { transport_->abort_job(why); }

Status ConnectorBase::close() {
  if (closed_ || !initialized_) {
    closed_ = true;
    return transport_ ? transport_->close() : ok_status();
  }
  Status first;
  const Deadline deadline = deadline_after_ms(cfg_.timeout_ms);
  // Own sends first: their memory must outlive them.
  if (role_ == Role::kAttention) {
    for (StageFifo& fifo : fifos_) {
      for (Dispatch& d : fifo.entries) {
        Status s = wait_all(d.send_ids, deadline, "send:the hidden states", ffn_world_pairs_, d.meta.layer,
                            d.meta.stage, d.meta.step);
        if (first.ok()) first = s;
        for (RequestId& id : d.recv_ids) {
          if (id != kNoRequest) transport_->cancel(id).ignore();
          id = kNoRequest;
        }
      }
    }
  } else {
    for (Group& g : groups_) {
      Status s = wait_group_sends(g, g.meta.layer, g.meta.stage, g.meta.step);
      if (first.ok()) first = s;
    }
    for (RecvSlot& slot : slots_) {
      for (RequestId* id : {&slot.meta_id, &slot.rows_id}) {
        if (*id != kNoRequest) transport_->cancel(*id).ignore();
        *id = kNoRequest;
      }
    }
  }
  Status hook = close_hook(deadline);
  if (first.ok()) first = hook;
  closed_ = true;
  Status t = transport_->close();
  return first.ok() ? t : first;
}

}  // namespace genbridge::afd

namespace genbridge::afd {

Status ConnectorBase::add_group(std::vector<int> slots) {
  Group g;
  g.slots = std::move(slots);
  const int64_t per_token = std::min(k_, topo_.experts_per_ffn);
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
    g.pack_hidden.reserve(static_cast<size_t>(tokens * hidden_ * 2));
    g.pack_ids.reserve(static_cast<size_t>(tokens * k_));
    g.pack_weights.reserve(static_cast<size_t>(tokens * k_));
  }
  groups_.push_back(std::move(g));
  return ok_status();
}

}  // namespace genbridge::afd
