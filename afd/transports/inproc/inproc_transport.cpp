#include "afd/transports/inproc/inproc_transport.h"

#include <fmt/format.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <vector>

#include "afd/wire.h"

namespace genbridge::afd {

namespace {

enum class ReqState : uint8_t { kFree, kPosted, kCopying, kDone, kError };

struct Request {
  ReqState state = ReqState::kFree;
  bool is_send = false;
  int peer = 0;  // destination (send) or wanted source (receive, may be kAnySource)
  Channel channel = Channel::kControl;
  int tag = 0;
  std::vector<ConstSegment> send_segments;
  std::vector<MutSegment> recv_segments;
  size_t bytes = 0;  // total bytes of the segments
  Completion completion;
  Status error;
};

struct AlignedDelete {
  void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(64)); }
};

class InprocTransport;

}  // namespace

// Shared state of one in-process job. Every field is guarded by `mu`.
class InprocWorld {
 public:
  InprocWorld(int size, int64_t join_timeout_ms)
      : size_(size),
        join_timeout_ms_(join_timeout_ms),
        endpoints_(size, nullptr),
        declared_roles_(size, kRoleUndeclared),
        joined_flags_(size, false),
        sends_(size * kNumChannels),
        recvs_(size * kNumChannels),
        names_(size) {
    for (int r = 0; r < size; ++r) names_[r] = fmt::format("world rank {}", r);
  }

  struct Pending {
    int rank;
    RequestId id;
  };

  std::mutex mu;
  const int size_;
  const int64_t join_timeout_ms_;
  std::vector<InprocTransport*> endpoints_;
  std::vector<int> declared_roles_;
  std::vector<bool> joined_flags_;
  int joined_ = 0;
  std::condition_variable join_cv_;
  // Unmatched sends queued at their destination, and posted receives, per (rank, channel), in order.
  std::vector<std::deque<Pending>> sends_;
  std::vector<std::deque<Pending>> recvs_;
  std::vector<std::string> names_;
  Status failure_;

  void fail_locked(int rank, const Status& why);
};

namespace {

class InprocTransport final : public Transport {
 public:
  InprocTransport(std::shared_ptr<InprocWorld> world, int rank, int declared_role)
      : world_(std::move(world)), rank_(rank), declared_role_(declared_role) {}
  ~InprocTransport() override { close().ignore(); }

  std::string_view name() const override { return "inproc"; }

  Status init() override {
    if (!world_) return unavailable("inproc transport: no world was given");
    if (rank_ < 0 || rank_ >= world_->size_) {
      return invalid_argument(
          fmt::format("inproc transport: world rank {} is outside the world of {} ranks", rank_, world_->size_));
    }
    std::unique_lock lock(world_->mu);
    if (world_->joined_flags_[rank_]) {
      return invalid_argument(fmt::format("inproc transport: world rank {} joined twice", rank_));
    }
    world_->joined_flags_[rank_] = true;
    world_->endpoints_[rank_] = this;
    world_->declared_roles_[rank_] = declared_role_;
    ++world_->joined_;
    world_->join_cv_.notify_all();
    const Deadline deadline = deadline_after_ms(world_->join_timeout_ms_);
    while (world_->joined_ < world_->size_) {
      if (!world_->failure_.ok()) return unavailable(world_->failure_.message());
      if (world_->join_cv_.wait_until(lock, deadline) == std::cv_status::timeout && world_->joined_ < world_->size_) {
        return deadline_exceeded(fmt::format("inproc transport: world rank {} waited {} ms for {} of {} ranks to join",
                                             rank_, world_->join_timeout_ms_, world_->size_ - world_->joined_,
                                             world_->size_));
      }
    }
    roles_ = world_->declared_roles_;
    initialized_ = true;
    return ok_status();
  }

  Status close() override {
    if (!world_ || closed_ || !initialized_) {
      closed_ = true;
      return ok_status();
    }
    std::unique_lock lock(world_->mu);
    closed_ = true;
    // Withdraw everything still queued; wait for copies that read or write our memory. (The one wait here
    // without a deadline, and in cancel(): it waits for a memcpy another thread of this process is doing
    // between two lock sections, never for a peer to act, so it is bounded by that copy.)
    for (int ch = 0; ch < kNumChannels; ++ch) {
      std::erase_if(world_->recvs_[rank_ * kNumChannels + ch],
                    [&](const InprocWorld::Pending& p) { return p.rank == rank_; });
    }
    for (auto& q : world_->sends_) {
      std::erase_if(q, [&](const InprocWorld::Pending& p) { return p.rank == rank_; });
    }
    cv_.wait(lock, [&] {
      for (const Request& r : requests_) {
        if (r.state == ReqState::kCopying) return false;
      }
      return true;
    });
    world_->endpoints_[rank_] = nullptr;
    buffers_.clear();
    return ok_status();
  }

  int world_rank() const override { return rank_; }
  int world_size() const override { return world_ ? world_->size_ : 0; }
  std::span<const int> declared_roles() const override { return roles_; }
  void set_rank_names(std::vector<std::string> names) override {
    std::lock_guard lock(world_->mu);
    if (static_cast<int>(names.size()) == world_->size_) world_->names_ = std::move(names);
  }

  Result<std::span<std::byte>> alloc_buffer(size_t bytes) override {
    const size_t n = std::max<size_t>(bytes, 64);
    std::unique_ptr<std::byte[], AlignedDelete> p(static_cast<std::byte*>(::operator new[](n, std::align_val_t(64))));
    std::span<std::byte> s(p.get(), bytes);
    buffers_.push_back(std::move(p));
    return s;
  }

  Result<RequestId> isend(int peer, Channel ch, int tag, std::span<const ConstSegment> segments) override {
    std::unique_lock lock(world_->mu);
    GB_RETURN_IF_ERROR(check_usable_locked("send"));
    if (peer < 0 || peer >= world_->size_) {
      return invalid_argument(
          fmt::format("inproc transport: send to world rank {} outside 0..{}", peer, world_->size_ - 1));
    }
    const RequestId id = new_request_locked(/*is_send=*/true, peer, ch, tag);
    Request& r = requests_[id];
    r.send_segments.assign(segments.begin(), segments.end());
    for (const ConstSegment& s : segments) r.bytes += s.bytes;
    // A receive posted by the destination for this (source, tag)?
    auto& q = world_->recvs_[peer * kNumChannels + static_cast<int>(ch)];
    for (auto it = q.begin(); it != q.end(); ++it) {
      InprocTransport* dst = world_->endpoints_[it->rank];
      Request& rr = dst->requests_[it->id];
      if ((rr.peer == kAnySource || rr.peer == rank_) && (rr.tag == kAnyTag || rr.tag == tag)) {
        const InprocWorld::Pending match = *it;
        q.erase(it);
        transfer(lock, this, id, dst, match.id);
        return id;
      }
    }
    world_->sends_[peer * kNumChannels + static_cast<int>(ch)].push_back({rank_, id});
    return id;
  }

  Result<RequestId> irecv(int peer, Channel ch, int tag, std::span<const MutSegment> segments) override {
    std::unique_lock lock(world_->mu);
    GB_RETURN_IF_ERROR(check_usable_locked("receive"));
    if (peer != kAnySource && (peer < 0 || peer >= world_->size_)) {
      return invalid_argument(
          fmt::format("inproc transport: receive from world rank {} outside 0..{}", peer, world_->size_ - 1));
    }
    const RequestId id = new_request_locked(/*is_send=*/false, peer, ch, tag);
    Request& r = requests_[id];
    r.recv_segments.assign(segments.begin(), segments.end());
    for (const MutSegment& s : segments) r.bytes += s.bytes;
    auto& q = world_->sends_[rank_ * kNumChannels + static_cast<int>(ch)];
    for (auto it = q.begin(); it != q.end(); ++it) {
      InprocTransport* src = world_->endpoints_[it->rank];
      const Request& sr = src->requests_[it->id];
      if ((peer == kAnySource || peer == it->rank) && (tag == kAnyTag || tag == sr.tag)) {
        const InprocWorld::Pending match = *it;
        q.erase(it);
        transfer(lock, src, match.id, this, id);
        return id;
      }
    }
    world_->recvs_[rank_ * kNumChannels + static_cast<int>(ch)].push_back({rank_, id});
    return id;
  }

  Result<bool> test(RequestId id, Completion* c) override {
    std::unique_lock lock(world_->mu);
    GB_RETURN_IF_ERROR(check_id_locked(id));
    Request& r = requests_[id];
    if (r.state == ReqState::kDone || r.state == ReqState::kError) {
      Status s = finish_locked(id, c);
      if (!s.ok()) return s;
      return true;
    }
    return false;
  }

  Result<int> wait_any(std::span<const RequestId> ids, Deadline deadline, Completion* c) override {
    std::unique_lock lock(world_->mu);
    GB_RETURN_IF_ERROR(check_wait_any_ids(ids, "inproc transport", [&](RequestId id) { return check_id_locked(id); }));
    for (;;) {
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == kNoRequest) continue;
        const ReqState st = requests_[ids[i]].state;
        if (st == ReqState::kDone || st == ReqState::kError) {
          GB_RETURN_IF_ERROR(finish_locked(ids[i], c));
          return static_cast<int>(i);
        }
      }
      if (!world_->failure_.ok()) return unavailable(world_->failure_.message());
      if (closed_) return unavailable(fmt::format("{}: transport closed while waiting", world_->names_[rank_]));
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        // Re-check once: a completion may have raced the timeout.
        bool done = false;
        for (RequestId id : ids) {
          if (id != kNoRequest && (requests_[id].state == ReqState::kDone || requests_[id].state == ReqState::kError))
            done = true;
        }
        if (!done) return deadline_exceeded("deadline passed");
      }
    }
  }

  Status cancel(RequestId id) override {
    std::unique_lock lock(world_->mu);
    GB_RETURN_IF_ERROR(check_id_locked(id));
    Request& r = requests_[id];
    if (r.state != ReqState::kPosted) {
      if (r.state == ReqState::kCopying) cv_.wait(lock, [&] { return r.state != ReqState::kCopying; });
      Completion ignored;
      return finish_locked(id, &ignored);
    }
    auto& q = r.is_send ? world_->sends_[r.peer * kNumChannels + static_cast<int>(r.channel)]
                        : world_->recvs_[rank_ * kNumChannels + static_cast<int>(r.channel)];
    std::erase_if(q, [&](const InprocWorld::Pending& p) { return p.rank == rank_ && p.id == id; });
    release_locked(id);
    return ok_status();
  }

  void abort_job(const Status& why) override {
    std::lock_guard lock(world_->mu);
    world_->fail_locked(rank_, why);
  }

  std::condition_variable cv_;
  // Stable addresses: other ranks' threads reach these through the world (always under the world lock).
  std::deque<Request> requests_;

 private:
  Status check_usable_locked(const char* what) {
    if (!initialized_) return unavailable(fmt::format("inproc transport: {} before init()", what));
    if (closed_) return unavailable(fmt::format("{}: {} after close()", world_->names_[rank_], what));
    if (!world_->failure_.ok()) return unavailable(world_->failure_.message());
    return ok_status();
  }

  Status check_id_locked(RequestId id) {
    if (id < 0 || id >= static_cast<RequestId>(requests_.size()) || requests_[id].state == ReqState::kFree) {
      return internal_error(fmt::format("inproc transport: request id {} is not in flight", id));
    }
    return ok_status();
  }

  // A posted request with no segments yet (bytes 0).
  RequestId new_request_locked(bool is_send, int peer, Channel ch, int tag) {
    if (free_ids_.empty()) {
      requests_.emplace_back();
      free_ids_.push_back(static_cast<RequestId>(requests_.size() - 1));
    }
    const RequestId id = free_ids_.back();
    free_ids_.pop_back();
    Request& r = requests_[id];
    r.state = ReqState::kPosted;
    r.is_send = is_send;
    r.peer = peer;
    r.channel = ch;
    r.tag = tag;
    r.bytes = 0;
    r.completion = Completion{};
    r.error = Status();
    return id;
  }

  void release_locked(RequestId id) {
    requests_[id].state = ReqState::kFree;
    free_ids_.push_back(id);
  }

  Status finish_locked(RequestId id, Completion* c) {
    Request& r = requests_[id];
    Status s = r.state == ReqState::kError ? r.error : Status();
    if (c) *c = r.completion;
    release_locked(id);
    return s;
  }

  // Copies a matched send into a matched receive, outside the lock, then completes both.
  static void transfer(std::unique_lock<std::mutex>& lock, InprocTransport* src, RequestId sid, InprocTransport* dst,
                       RequestId rid) {
    Request& s = src->requests_[sid];
    Request& r = dst->requests_[rid];
    s.state = ReqState::kCopying;
    r.state = ReqState::kCopying;
    const bool fits = s.bytes <= r.bytes;
    lock.unlock();
    if (fits) {
      size_t ri = 0, roff = 0;
      for (const ConstSegment& seg : s.send_segments) {
        const std::byte* p = static_cast<const std::byte*>(seg.data);
        size_t left = seg.bytes;
        while (left > 0) {
          while (r.recv_segments[ri].bytes == roff) {
            ++ri;
            roff = 0;
          }
          const size_t n = std::min(left, r.recv_segments[ri].bytes - roff);
          std::memcpy(static_cast<std::byte*>(r.recv_segments[ri].data) + roff, p, n);
          p += n;
          left -= n;
          roff += n;
        }
      }
    }
    lock.lock();
    InprocWorld& w = *src->world_;
    const int64_t done = wire::now_ns();  // CLOCK_MONOTONIC, as the send times in the headers
    s.completion = Completion{done, dst->rank_, s.tag, s.bytes};
    s.state = ReqState::kDone;
    r.completion = Completion{done, src->rank_, s.tag, fits ? s.bytes : 0};
    if (fits) {
      r.state = ReqState::kDone;
    } else {
      r.state = ReqState::kError;
      r.error =
          internal_error(fmt::format("inproc transport: a message of {} bytes from {} does not fit the {}-byte "
                                     "receive of {}",
                                     s.bytes, w.names_[src->rank_], r.bytes, w.names_[dst->rank_]));
    }
    src->cv_.notify_all();
    if (dst != src) dst->cv_.notify_all();
  }

  friend class genbridge::afd::InprocWorld;
  std::shared_ptr<InprocWorld> world_;
  const int rank_;
  const int declared_role_;
  bool initialized_ = false;
  bool closed_ = false;
  std::vector<int> roles_;
  std::vector<RequestId> free_ids_;
  std::vector<std::unique_ptr<std::byte[], AlignedDelete>> buffers_;
};

}  // namespace

void InprocWorld::fail_locked(int rank, const Status& why) {
  if (failure_.ok()) {
    failure_ = unavailable(fmt::format(
        "{} failed: {}", rank >= 0 && rank < size_ ? names_[rank] : std::string("a rank"), why.to_string()));
  }
  for (InprocTransport* e : endpoints_) {
    if (e) e->cv_.notify_all();
  }
  join_cv_.notify_all();
}

std::shared_ptr<InprocWorld> make_inproc_world(int size, int64_t join_timeout_ms) {
  return std::make_shared<InprocWorld>(size, join_timeout_ms);
}

std::unique_ptr<Transport> make_inproc_transport(std::shared_ptr<InprocWorld> world, int world_rank,
                                                 int declared_role) {
  return std::make_unique<InprocTransport>(std::move(world), world_rank, declared_role);
}

void fail_rank(InprocWorld& world, int world_rank, const Status& why) {
  std::lock_guard lock(world.mu);
  world.fail_locked(world_rank, why);
}

Status world_failure(InprocWorld& world) {
  std::lock_guard lock(world.mu);
  return world.failure_;
}

}  // namespace genbridge::afd
