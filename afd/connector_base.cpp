// ConnectorBase, the part both sides share: the contract types, init (settings check, topology, registered
// buffers), gather, close and the wording of wait errors. The attention side is in connector_attention.cpp,
// the FFN side in connector_ffn.cpp.

#include "afd/connector_base.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "afd/transports/link_transport.h"
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
      return invalid_argument(
          fmt::format("afd transfer: seq_lens[{}] is {} but must be in 0..{} "
                      "('max_tokens_per_stage')",
                      i, m.seq_lens[i], cfg.max_tokens_per_stage));
    }
  }
  if (m.step < 0) return invalid_argument(fmt::format("afd transfer: step {} is negative", m.step));
  return ok_status();
}

std::string fingerprint_digest(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
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

// The only way to a connector: every ConnectorBase holds a valid config.
Result<std::unique_ptr<Connector>> make_connector(const ValidAfdConfig& cfg, std::unique_ptr<Transport> transport) {
  if (!transport) return invalid_argument("afd: make_connector needs a transport");
  // The link model sits between the connector and whichever transport it was given.
  if (const LinkModel link = link_model_of(cfg); link.enabled())
    transport = make_link_transport(std::move(transport), link);
  if (cfg->connector == ConnectorKind::kSync) return make_sync_connector(cfg, std::move(transport));
  return make_async_connector(cfg, std::move(transport));
}

Result<std::unique_ptr<Connector>> make_connector(const AfdConfig& cfg, std::unique_ptr<Transport> transport) {
  GB_ASSIGN_OR_RETURN(const ValidAfdConfig valid, ValidAfdConfig::create(cfg));
  return make_connector(valid, std::move(transport));
}

// ---- ConnectorBase ----

ConnectorBase::ConnectorBase(const AfdConfig& cfg, std::unique_ptr<Transport> transport)
    : cfg_(cfg),
      transport_(std::move(transport)),
      k_(cfg.top_k),
      hidden_(cfg.hidden_size),
      row_dtype_(cfg.dispatch_row_bytes > 0 ? DType::kU8 : DType::kBF16),
      row_elems_(cfg.dispatch_row_bytes > 0 ? cfg.dispatch_row_bytes : cfg.hidden_size),
      row_bytes_(cfg.dispatch_bytes_per_token()) {
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
  return wait_error(s, what, peer_world >= 0 ? topo_.rank_name(peer_world) : std::string("any attention rank"), layer,
                    stage, step, timeout_ms);
}

std::string ConnectorBase::attention_names(const std::vector<bool>& missing) const {
  std::string out;
  for (size_t a = 0; a < missing.size(); ++a) {
    if (missing[a]) out += (out.empty() ? "" : ", ") + topo_.rank_name(topo_.attention_world[a]);
  }
  return out;
}

void ConnectorBase::heard_from(int a) {
  peer_heard_[a] = Clock::now();
  peer_started_[a] = true;
}

int64_t ConnectorBase::peer_timeout_ms(int a) const {
  return peer_started_[a] ? cfg_.timeout_ms : cfg_.init_timeout_ms;
}

Deadline ConnectorBase::peer_deadline(int a) const {
  return peer_heard_[a] + std::chrono::milliseconds(peer_timeout_ms(a));
}

Status ConnectorBase::wait_error(const Status& s, std::string_view what, const std::string& peer, int layer, int stage,
                                 int64_t step, int64_t timeout_ms) const {
  const std::string me = topo_.rank_name(world_rank_);
  const std::string where =
      layer >= 0 ? fmt::format(" of layer {}, stage {}, step {}", layer, stage, step) : fmt::format(" (step {})", step);
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

Status ConnectorBase::check_at_root(const std::string& mine,
                                    const std::function<std::string(const std::vector<std::string>&)>& compare,
                                    const char* what) {
  GB_ASSIGN_OR_RETURN(std::vector<std::string> all, gather(mine, cfg_.init_timeout_ms));
  std::string verdict = world_rank_ == 0 ? compare(all) : std::string();
  // Scatter the verdict from rank 0 (size, then text).
  const Deadline deadline = deadline_after_ms(cfg_.init_timeout_ms);
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
      return Status(r.status().code(),
                    fmt::format("afd: world rank {} waiting for the {} of world rank 0 during init: {}", world_rank_,
                                what, r.status().message()));
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
  return ok_status();
}

namespace {

// Length-prefixed name/value pairs.
std::string serialize_fingerprint(std::span<const FingerprintItem> items) {
  std::string out;
  auto put = [&](const std::string& v) {
    const uint64_t n = v.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof(n));
    out += v;
  };
  for (const FingerprintItem& i : items) {
    put(i.name);
    put(i.value);
  }
  return out;
}

std::vector<FingerprintItem> parse_fingerprint(std::string_view in) {
  std::vector<FingerprintItem> out;
  auto get = [&](std::string* v) {
    uint64_t n = 0;
    if (in.size() < sizeof(n)) return false;
    std::memcpy(&n, in.data(), sizeof(n));
    in.remove_prefix(sizeof(n));
    if (in.size() < n) return false;
    v->assign(in.substr(0, n));
    in.remove_prefix(n);
    return true;
  };
  FingerprintItem i;
  while (get(&i.name) && get(&i.value)) out.push_back(i);
  return out;
}

const std::string* find_item(const std::vector<FingerprintItem>& items, const std::string& name) {
  for (const FingerprintItem& i : items) {
    if (i.name == name) return &i.value;
  }
  return nullptr;
}

}  // namespace

Status ConnectorBase::init(std::span<const FingerprintItem> fingerprint) {
  if (initialized_) return ok_status();
  GB_RETURN_IF_ERROR(transport_->init());
  world_rank_ = transport_->world_rank();
  // Settings first (they decide everything else): rank 0 compares, then tells every rank the verdict.
  // The topology is not known yet, so this uses world ranks only.
  topo_ = Topology{};
  const std::string settings = canonical_settings(cfg_);
  GB_RETURN_IF_ERROR(check_at_root(
      settings,
      [&](const std::vector<std::string>& all) -> std::string {
        for (size_t r = 1; r < all.size(); ++r) {
          std::string va, vb;
          const std::string key = first_differing_key(settings, all[r], &va, &vb);
          if (!key.empty()) {
            return fmt::format(
                "afd config mismatch: '{}' is {} on world rank 0 but {} on world rank {}; every rank of the job "
                "must be started with the same AFD settings",
                key, va, vb, r);
          }
        }
        return std::string();
      },
      "settings check"));
  GB_ASSIGN_OR_RETURN(topo_, make_topology(cfg_, transport_->declared_roles()));
  transport_->set_rank_names(topo_.rank_names());
  // Then everything else that must agree (what the job was started with: model, requests, flags), in the
  // order given: the first item that differs is named, with both values and both ranks.
  GB_RETURN_IF_ERROR(check_at_root(
      serialize_fingerprint(fingerprint),
      [&](const std::vector<std::string>& all) -> std::string {
        const std::vector<FingerprintItem> root = parse_fingerprint(all[0]);
        for (size_t r = 1; r < all.size(); ++r) {
          const std::vector<FingerprintItem> other = parse_fingerprint(all[r]);
          auto verdict = [&](const std::string& name, const std::string* a, const std::string* b) {
            return fmt::format(
                "afd: the ranks of the job were started with different settings: {} is {} on {} but {} on {}; every "
                "rank of the job must be started with the same model, requests and flags",
                name, a ? *a : "(not given)", topo_.rank_name(0), b ? *b : "(not given)",
                topo_.rank_name(static_cast<int>(r)));
          };
          for (const FingerprintItem& i : root) {
            const std::string* v = find_item(other, i.name);
            if (!v || *v != i.value) return verdict(i.name, &i.value, v);
          }
          for (const FingerprintItem& i : other) {
            if (!find_item(root, i.name)) return verdict(i.name, nullptr, &i.value);
          }
        }
        return std::string();
      },
      "fingerprint check"));
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
        GB_ASSIGN_OR_RETURN(slot.rows, transport_->alloc_buffer(wire::dispatch_rows_bytes(max_tokens, row_bytes_)));
      }
    }
    peer_heard_.assign(A, Clock::now());
    peer_started_.assign(A, false);
    GB_RETURN_IF_ERROR(init_ffn());
    for (size_t i = 0; i < slots_.size(); ++i) GB_RETURN_IF_ERROR(post_slot(static_cast<int>(i)));
  }
  wait_ids_.reserve(2 * (static_cast<size_t>(A) * S + F));
  wait_slots_.reserve(static_cast<size_t>(A) * S);
  wait_peers_.reserve(2 * (static_cast<size_t>(A) * S + F));
  initialized_ = true;
  return ok_status();
}

// ---- both ----

Result<std::vector<std::string>> ConnectorBase::gather(std::string_view blob, int64_t timeout_ms) {
  if (closed_) return unavailable(fmt::format("afd {} connector: gather() after close()", name()));
  const Deadline deadline = deadline_after_ms(timeout_ms);
  const int n = transport_->world_size();
  const int me = transport_->world_rank();
  std::vector<std::string> all;
  auto name = [&](int w) { return topo_.roles.empty() ? fmt::format("world rank {}", w) : topo_.rank_name(w); };
  auto fail = [&](const Status& s, int peer) {
    if (s.code() == StatusCode::kDeadlineExceeded) {
      return deadline_exceeded(fmt::format("afd: {} timed out after {} ms in a gather at world rank 0, waiting for {}",
                                           name(me), timeout_ms, name(peer)));
    }
    return Status(s.code(),
                  fmt::format("afd: {} gathering at world rank 0 (peer {}): {}", name(me), name(peer), s.message()));
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
