#include "afd/serve_relay.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <deque>

#include "afd/byte_codec.h"
#include "afd/wire.h"

namespace genbridge::afd {

namespace {

constexpr uint32_t kDownMagic = 0x4e574f44u;  // "DOWN"
constexpr uint32_t kUpMagic = 0x55504c52u;    // "RLPU"
// A message larger than this is refused as corrupt (a size prefix that does not come from this relay).
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 31;

void put_string(ByteWriter& w, const std::string& s) {
  w.put<uint64_t>(s.size());
  w.put_bytes(s.data(), s.size());
}
bool get_string(ByteReader& r, std::string* s) {
  uint64_t n = 0;
  if (!r.get(&n) || n > r.remaining()) return false;
  s->resize(n);
  return n == 0 || r.get_bytes(s->data(), n);
}

Status malformed(const char* kind, const char* what) {
  return internal_error(fmt::format("afd relay: a malformed {} message: {}", kind, what));
}

}  // namespace

std::string encode_relay_down(const RelayDown& d) {
  ByteWriter w;
  w.put(kDownMagic);
  w.put<uint8_t>(d.stopping ? 1 : 0);
  w.put<uint8_t>(d.others_busy ? 1 : 0);
  w.put<uint64_t>(d.submit.size());
  for (const engine::Request& r : d.submit) {
    w.put(r.id);
    w.put_vec(r.prompt);
    w.put<int32_t>(r.max_new_tokens);
    w.put_vec(r.stop_tokens);
    w.put(r.sampling.temperature);
    w.put<int32_t>(r.sampling.top_k);
    w.put(r.sampling.top_p);
    w.put(r.sampling.seed);
    w.put(r.sampling.min_p);
    w.put(r.sampling.presence_penalty);
    w.put(r.sampling.frequency_penalty);
    w.put(r.sampling.repetition_penalty);
    std::vector<int32_t> bias_ids;
    std::vector<float> biases;
    for (const auto& [id, bias] : r.sampling.logit_bias) {
      bias_ids.push_back(id);
      biases.push_back(bias);
    }
    w.put_vec(bias_ids);
    w.put_vec(biases);
    w.put_vec(r.sampling.allowed_token_ids);
    w.put<int32_t>(r.sampling.min_tokens);
    w.put<int32_t>(r.logprobs);
    w.put_vec(r.forced);
    w.put<int32_t>(r.priority);
  }
  w.put_vec(d.cancel);
  return w.take();
}

Result<RelayDown> decode_relay_down(std::string_view bytes) {
  ByteReader r(bytes);
  if (r.get<uint32_t>() != kDownMagic) return malformed("down", "it does not start with the down marker");
  RelayDown d;
  d.stopping = r.get<uint8_t>() != 0;
  d.others_busy = r.get<uint8_t>() != 0;
  const uint64_t n = r.get<uint64_t>();
  if (n > r.remaining()) return malformed("down", "more requests than bytes");
  d.submit.resize(n);
  for (engine::Request& q : d.submit) {
    q.id = r.get<int64_t>();
    r.get_vec(&q.prompt);
    q.max_new_tokens = r.get<int32_t>();
    r.get_vec(&q.stop_tokens);
    q.sampling.temperature = r.get<float>();
    q.sampling.top_k = r.get<int32_t>();
    q.sampling.top_p = r.get<float>();
    q.sampling.seed = r.get<uint64_t>();
    q.sampling.min_p = r.get<float>();
    q.sampling.presence_penalty = r.get<float>();
    q.sampling.frequency_penalty = r.get<float>();
    q.sampling.repetition_penalty = r.get<float>();
    std::vector<int32_t> bias_ids;
    std::vector<float> biases;
    r.get_vec(&bias_ids);
    r.get_vec(&biases);
    if (bias_ids.size() != biases.size()) return malformed("down", "logit_bias ids and values differ in count");
    for (size_t i = 0; i < bias_ids.size(); ++i) q.sampling.logit_bias.emplace_back(bias_ids[i], biases[i]);
    r.get_vec(&q.sampling.allowed_token_ids);
    q.sampling.min_tokens = r.get<int32_t>();
    q.logprobs = r.get<int32_t>();
    r.get_vec(&q.forced);
    q.priority = r.get<int32_t>();
  }
  r.get_vec(&d.cancel);
  if (!r.done()) return malformed("down", r.ok() ? "bytes left over" : "it ends early");
  return d;
}

std::string encode_relay_up(const RelayUp& u) {
  ByteWriter w;
  w.put(kUpMagic);
  w.put(u.running);
  w.put(u.kv_pages_used);
  w.put(u.counters.preemptions);
  w.put(u.counters.prefix_cache_queries);
  w.put(u.counters.prefix_cache_hits);
  w.put(u.counters.prefix_cache_evictions);
  w.put(u.counters.prefix_cache_pages);
  w.put<uint64_t>(u.tokens.size());
  for (const RelayToken& t : u.tokens) {
    w.put(t.id);
    w.put(t.token);
    w.put<uint8_t>(t.has_logprobs ? 1 : 0);
    if (t.has_logprobs) {
      w.put(t.logprobs.sampled);
      w.put_vec(t.logprobs.top);
    }
  }
  w.put<uint64_t>(u.finishes.size());
  for (const RelayFinish& f : u.finishes) {
    w.put(f.id);
    w.put<int32_t>(static_cast<int32_t>(f.reason));
    put_string(w, f.message);
  }
  return w.take();
}

Result<RelayUp> decode_relay_up(std::string_view bytes) {
  ByteReader r(bytes);
  if (r.get<uint32_t>() != kUpMagic) return malformed("up", "it does not start with the up marker");
  RelayUp u;
  u.running = r.get<int64_t>();
  u.kv_pages_used = r.get<int64_t>();
  u.counters.preemptions = r.get<int64_t>();
  u.counters.prefix_cache_queries = r.get<int64_t>();
  u.counters.prefix_cache_hits = r.get<int64_t>();
  u.counters.prefix_cache_evictions = r.get<int64_t>();
  u.counters.prefix_cache_pages = r.get<int64_t>();
  const uint64_t nt = r.get<uint64_t>();
  if (nt > r.remaining()) return malformed("up", "more tokens than bytes");
  u.tokens.resize(nt);
  for (RelayToken& t : u.tokens) {
    t.id = r.get<int64_t>();
    t.token = r.get<int32_t>();
    t.has_logprobs = r.get<uint8_t>() != 0;
    if (t.has_logprobs) {
      r.get(&t.logprobs.sampled);
      r.get_vec(&t.logprobs.top);
    }
  }
  const uint64_t nf = r.get<uint64_t>();
  if (nf > r.remaining()) return malformed("up", "more finished requests than bytes");
  u.finishes.resize(nf);
  for (RelayFinish& f : u.finishes) {
    f.id = r.get<int64_t>();
    const int32_t reason = r.get<int32_t>();
    if (reason < 0 || reason > static_cast<int32_t>(engine::FinishReason::kCancelled)) {
      return malformed("up", "a finish reason outside the engine's");
    }
    f.reason = static_cast<engine::FinishReason>(reason);
    if (!get_string(r, &f.message)) return malformed("up", "it ends early");
  }
  if (!r.done()) return malformed("up", r.ok() ? "bytes left over" : "it ends early");
  return u;
}

namespace {

// The memory of the relay's messages: registered with the transport (alloc_buffer), so it stays valid until
// the transport closes even when a send or receive is left posted by a failure; reused once done. Sizes
// are powers of two of at least 4 KiB, so a long run keeps a handful of buffers.
class Buffers {
 public:
  explicit Buffers(Transport& t) : t_(t) {}
  Result<std::span<std::byte>> get(size_t bytes) {
    const size_t n = std::bit_ceil(std::max<size_t>(bytes, 4096));
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->size() == n) {
        const std::span<std::byte> b = *it;
        free_.erase(it);
        return b;
      }
    }
    return t_.alloc_buffer(n);
  }
  void put(std::span<std::byte> b) { free_.push_back(b); }

 private:
  Transport& t_;
  std::vector<std::span<std::byte>> free_;
};

// One posted message: its size in the buffer's first 8 bytes, its bytes after them.
struct Outbound {
  int peer = 0;
  std::span<std::byte> buffer;
  RequestId ids[2] = {kNoRequest, kNoRequest};
  bool awaited = true;  // flush() waits for it
  bool done() const { return ids[0] == kNoRequest && ids[1] == kNoRequest; }
};

// The two ends of a relay's links: posting and completing sends, receiving messages from one peer.
class RelayBase {
 public:
  RelayBase(Transport& t, RelayOptions o) : t_(t), o_(std::move(o)), buffers_(t) {}

 protected:
  std::string name(int a) const { return o_.rank_names[o_.attention_world[a]]; }
  std::string me() const { return name(o_.attention_rank); }

  Status post(int a, int tag, const std::string& bytes, bool awaited = true) {
    GB_RETURN_IF_ERROR(reap());
    Outbound o{.peer = a, .awaited = awaited};
    GB_ASSIGN_OR_RETURN(o.buffer, buffers_.get(sizeof(uint64_t) + bytes.size()));
    const uint64_t n = bytes.size();
    std::memcpy(o.buffer.data(), &n, sizeof(n));
    std::memcpy(o.buffer.data() + sizeof(n), bytes.data(), bytes.size());
    const ConstSegment size{o.buffer.data(), sizeof(n)}, data{o.buffer.data() + sizeof(n), bytes.size()};
    GB_ASSIGN_OR_RETURN(o.ids[0], t_.isend(o_.attention_world[a], Channel::kControl, tag, {&size, 1}));
    GB_ASSIGN_OR_RETURN(o.ids[1], t_.isend(o_.attention_world[a], Channel::kControl, tag, {&data, 1}));
    outbound_.push_back(o);
    return ok_status();
  }

  // Completes the sends that are done (does not block) and reuses their memory.
  Status reap() {
    Completion c;
    for (Outbound& o : outbound_) {
      for (RequestId& id : o.ids) {
        if (id == kNoRequest) continue;
        GB_ASSIGN_OR_RETURN(const bool done, t_.test(id, &c));
        if (done) id = kNoRequest;
      }
    }
    while (!outbound_.empty() && outbound_.front().done()) {
      buffers_.put(outbound_.front().buffer);
      outbound_.pop_front();
    }
    return ok_status();
  }

  Status flush_sends() {
    const Deadline deadline = deadline_after_ms(o_.timeout_ms);
    Completion c;
    for (Outbound& o : outbound_) {
      for (RequestId& id : o.ids) {
        if (id == kNoRequest || !o.awaited) continue;
        Result<int> r = t_.wait_any({&id, 1}, deadline, &c);
        if (!r.ok()) {
          return Status(r.status().code(),
                        fmt::format("afd relay: {} waited {} ms for {} to take its last messages: {}", me(),
                                    o_.timeout_ms, name(o.peer), r.status().message()));
        }
        id = kNoRequest;
      }
    }
    return reap();
  }

  // The messages of attention rank `a`: a posted receive of the next size, then of the bytes.
  struct Inbound {
    int a = 0;
    std::span<std::byte> size;  // 8 registered bytes
    RequestId id = kNoRequest;
  };

  Status post_size(Inbound& in, int tag) {
    const MutSegment seg{in.size.data(), sizeof(uint64_t)};
    GB_ASSIGN_OR_RETURN(in.id, t_.irecv(o_.attention_world[in.a], Channel::kControl, tag, {&seg, 1}));
    return ok_status();
  }

  // The size of `in`'s next message arrived (its receive completed): receives the bytes, due within
  // timeout_ms, into *bytes and posts the next size's receive.
  Status receive_bytes(Inbound& in, int tag, std::string* bytes) {
    in.id = kNoRequest;
    uint64_t n = 0;
    std::memcpy(&n, in.size.data(), sizeof(n));
    if (n > kMaxMessageBytes) {
      return internal_error(
          fmt::format("afd relay: {} received a message of {} bytes from {}, more than the {} a "
                      "relay message may have",
                      me(), n, name(in.a), kMaxMessageBytes));
    }
    GB_ASSIGN_OR_RETURN(std::span<std::byte> buf, buffers_.get(n));
    const MutSegment seg{buf.data(), n};
    GB_ASSIGN_OR_RETURN(RequestId id, t_.irecv(o_.attention_world[in.a], Channel::kControl, tag, {&seg, 1}));
    Completion c;
    Result<int> r = t_.wait_any({&id, 1}, deadline_after_ms(o_.timeout_ms), &c);
    if (!r.ok()) {
      t_.cancel(id).ignore();
      const std::string why = r.status().code() == StatusCode::kDeadlineExceeded
                                  ? fmt::format("timed out after {} ms", o_.timeout_ms)
                                  : fmt::format("stopped ({})", r.status().message());
      return Status(r.status().code(), fmt::format("afd relay: {} {} waiting for the {} bytes of a message from {}",
                                                   me(), why, n, name(in.a)));
    }
    bytes->assign(reinterpret_cast<const char*>(buf.data()), c.bytes);
    buffers_.put(buf);
    if (c.bytes != n) {
      return internal_error(
          fmt::format("afd relay: {} received {} bytes of a {}-byte message from {}", me(), c.bytes, n, name(in.a)));
    }
    return post_size(in, tag);
  }

  Result<Inbound> make_inbound(int a, int tag) {
    Inbound in{.a = a};
    GB_ASSIGN_OR_RETURN(in.size, t_.alloc_buffer(sizeof(uint64_t)));
    GB_RETURN_IF_ERROR(post_size(in, tag));
    return in;
  }

  Transport& t_;
  const RelayOptions o_;
  Buffers buffers_;
  std::deque<Outbound> outbound_;
};

class Hub final : public RelayHub, RelayBase {
 public:
  Hub(Transport& t, RelayOptions o) : RelayBase(t, std::move(o)) {}

  Status init() {
    const int A = num_attention();
    heard_ns_.assign(static_cast<size_t>(A), 0);
    open_.assign(static_cast<size_t>(A), 0);
    stop_sent_.assign(static_cast<size_t>(A), false);
    ready_.assign(static_cast<size_t>(A), false);
    for (int a = 1; a < A; ++a) {
      GB_ASSIGN_OR_RETURN(Inbound in, make_inbound(a, wire::kTagRelayUp));
      in_.push_back(in);
    }
    return ok_status();
  }

  int num_attention() const override { return static_cast<int>(o_.attention_world.size()); }

  Status wait_ready() override {
    const Deadline deadline = deadline_after_ms(o_.init_timeout_ms);
    for (;;) {
      std::vector<RequestId> ids;
      for (const Inbound& in : in_) ids.push_back(ready_[in.a] ? kNoRequest : in.id);
      if (std::all_of(ids.begin(), ids.end(), [](RequestId id) { return id == kNoRequest; })) return ok_status();
      Completion c;
      Result<int> r = t_.wait_any(ids, deadline, &c);
      if (!r.ok()) {
        std::string missing;
        for (const Inbound& in : in_) {
          if (!ready_[in.a]) missing += (missing.empty() ? "" : ", ") + name(in.a);
        }
        if (r.status().code() == StatusCode::kDeadlineExceeded) {
          return deadline_exceeded(fmt::format("afd relay: {} timed out after {} ms waiting for {} to start serving",
                                               me(), o_.init_timeout_ms, missing));
        }
        return Status(r.status().code(), fmt::format("afd relay: {} stopped waiting for {} to start serving: {}", me(),
                                                     missing, r.status().message()));
      }
      Inbound& in = in_[static_cast<size_t>(*r)];
      std::string bytes;
      GB_RETURN_IF_ERROR(receive_bytes(in, wire::kTagRelayUp, &bytes));
      GB_ASSIGN_OR_RETURN(RelayUp up, decode_relay_up(bytes));
      if (up.has_events()) {
        return internal_error(
            fmt::format("afd relay: {}'s first message carries tokens before any request", name(in.a)));
      }
      ready_[in.a] = true;
      heard_ns_[in.a] = progress_now_ns();
    }
  }

  Status send(int a, const RelayDown& down) override {
    if (a < 1 || a >= num_attention()) {
      return invalid_argument(
          fmt::format("afd relay: send to attention rank {} outside 1..{}", a, num_attention() - 1));
    }
    // A rank given a request owes its next message from now on (it may have been quiet for long).
    if (!down.submit.empty() && open_[a] == 0) heard_ns_[a] = progress_now_ns();
    open_[a] += static_cast<int64_t>(down.submit.size());
    // What follows the stop flag (cancels of requests the rank may have finished meanwhile) is not waited
    // for: a rank that was told to stop ends once it holds nothing, without reading on; the transport
    // withdraws what it never took when it closes.
    const bool awaited = !stop_sent_[a];
    stop_sent_[a] = stop_sent_[a] || down.stopping;
    return post(a, wire::kTagRelayDown, encode_relay_down(down), awaited);
  }

  Status poll(const std::function<void(int a, RelayUp&& up)>& on_up) override {
    GB_RETURN_IF_ERROR(reap());
    Completion c;
    for (Inbound& in : in_) {
      for (;;) {
        GB_ASSIGN_OR_RETURN(const bool arrived, t_.test(in.id, &c));
        if (!arrived) break;
        std::string bytes;
        GB_RETURN_IF_ERROR(receive_bytes(in, wire::kTagRelayUp, &bytes));
        GB_ASSIGN_OR_RETURN(RelayUp up, decode_relay_up(bytes));
        heard_ns_[in.a] = progress_now_ns();
        open_[in.a] -= static_cast<int64_t>(up.finishes.size());
        on_up(in.a, std::move(up));
      }
      const int64_t silent_ms = (progress_now_ns() - heard_ns_[in.a]) / 1'000'000;
      if (open_[in.a] > 0 && silent_ms > 2 * o_.timeout_ms) {
        return deadline_exceeded(
            fmt::format("afd relay: {} timed out after {} ms waiting for {}, which holds {} request(s), to report its "
                        "next step",
                        me(), 2 * o_.timeout_ms, name(in.a), open_[in.a]));
      }
    }
    return ok_status();
  }

  Status flush() override { return flush_sends(); }

 private:
  static int64_t progress_now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  }
  std::vector<Inbound> in_;        // attention ranks 1..A-1
  std::vector<int64_t> heard_ns_;  // by attention rank: the progress clock when its last message arrived
  std::vector<int64_t> open_;      // by attention rank: requests sent to it and not reported finished
  std::vector<bool> stop_sent_;    // by attention rank: the stop flag was sent to it
  std::vector<bool> ready_;
};

class Link final : public RelayLink, RelayBase {
 public:
  Link(Transport& t, RelayOptions o) : RelayBase(t, std::move(o)) {}

  Status init() {
    GB_ASSIGN_OR_RETURN(in_, make_inbound(0, wire::kTagRelayDown));
    return ok_status();
  }

  Status send(const RelayUp& up) override { return post(0, wire::kTagRelayUp, encode_relay_up(up)); }

  Status take(RelayDown* down) override {
    GB_RETURN_IF_ERROR(receive_ready());
    down->submit.insert(down->submit.end(), std::make_move_iterator(pending_.submit.begin()),
                        std::make_move_iterator(pending_.submit.end()));
    down->cancel.insert(down->cancel.end(), pending_.cancel.begin(), pending_.cancel.end());
    down->stopping = pending_.stopping;
    down->others_busy = pending_.others_busy;
    pending_.submit.clear();
    pending_.cancel.clear();
    mine_ = false;
    return ok_status();
  }

  Result<WorkWait> wait(std::chrono::milliseconds timeout, bool others) override {
    const Deadline deadline = Clock::now() + timeout;
    for (;;) {
      GB_RETURN_IF_ERROR(receive_ready());
      if (mine_) return WorkWait::kMine;
      if (others && pending_.others_busy) return WorkWait::kOther;
      Completion c;
      Result<int> r = t_.wait_any({&in_.id, 1}, deadline, &c);
      if (!r.ok()) {
        if (r.status().code() == StatusCode::kDeadlineExceeded) return WorkWait::kTimeout;
        return Status(r.status().code(), fmt::format("afd relay: {} stopped waiting for requests from {}: {}", me(),
                                                     name(0), r.status().message()));
      }
      GB_RETURN_IF_ERROR(arrived());
    }
  }

  Status flush() override { return flush_sends(); }

 private:
  // Takes every message that has arrived into pending_ (does not block).
  Status receive_ready() {
    GB_RETURN_IF_ERROR(reap());
    Completion c;
    for (;;) {
      GB_ASSIGN_OR_RETURN(const bool done, t_.test(in_.id, &c));
      if (!done) return ok_status();
      GB_RETURN_IF_ERROR(arrived());
    }
  }
  // The size receive completed: the message's bytes into pending_.
  Status arrived() {
    std::string bytes;
    GB_RETURN_IF_ERROR(receive_bytes(in_, wire::kTagRelayDown, &bytes));
    GB_ASSIGN_OR_RETURN(RelayDown d, decode_relay_down(bytes));
    mine_ = mine_ || !d.submit.empty() || !d.cancel.empty() || (d.stopping && !pending_.stopping);
    for (engine::Request& r : d.submit) pending_.submit.push_back(std::move(r));
    pending_.cancel.insert(pending_.cancel.end(), d.cancel.begin(), d.cancel.end());
    pending_.stopping = pending_.stopping || d.stopping;
    pending_.others_busy = d.others_busy;
    return ok_status();
  }

  Inbound in_;
  RelayDown pending_;  // arrived, not taken yet; the flags are the latest message's
  bool mine_ = false;  // pending_ holds requests, cancels or a new stopping flag
};

Status check_options(const RelayOptions& o, bool hub) {
  const int A = static_cast<int>(o.attention_world.size());
  if (A < 2 || o.attention_rank < 0 || o.attention_rank >= A || (o.attention_rank == 0) != hub) {
    return invalid_argument(fmt::format("afd relay: attention rank {} of {} attention ranks cannot be the relay's {}",
                                        o.attention_rank, A, hub ? "hub (attention rank 0)" : "link (rank 1 or more)"));
  }
  if (o.timeout_ms < 1 || o.init_timeout_ms < 1) {
    return invalid_argument(fmt::format("afd relay: timeouts {} ms and {} ms must be >= 1 (every wait has a deadline)",
                                        o.timeout_ms, o.init_timeout_ms));
  }
  for (int w : o.attention_world) {
    if (w < 0 || w >= static_cast<int>(o.rank_names.size())) {
      return invalid_argument(fmt::format("afd relay: world rank {} has no name", w));
    }
  }
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<RelayHub>> make_relay_hub(Transport& transport, RelayOptions options) {
  GB_RETURN_IF_ERROR(check_options(options, true));
  auto hub = std::make_unique<Hub>(transport, std::move(options));
  GB_RETURN_IF_ERROR(hub->init());
  return std::unique_ptr<RelayHub>(std::move(hub));
}

Result<std::unique_ptr<RelayLink>> make_relay_link(Transport& transport, RelayOptions options) {
  GB_RETURN_IF_ERROR(check_options(options, false));
  auto link = std::make_unique<Link>(transport, std::move(options));
  GB_RETURN_IF_ERROR(link->init());
  return std::unique_ptr<RelayLink>(std::move(link));
}

}  // namespace genbridge::afd
