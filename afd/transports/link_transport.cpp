#include "afd/transports/link_transport.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "afd/wire.h"

namespace genbridge::afd {

int64_t LinkModel::wire_ns(size_t bytes) const {
  if (bandwidth_mbps <= 0) return 0;
  // bytes x 8 bits / (mbps x 1e6 bits/s), in ns: bytes x 8000 / mbps (rounded up: a message takes time).
  const unsigned __int128 bits_x1000 = static_cast<unsigned __int128>(bytes) * 8000u;
  const auto mbps = static_cast<unsigned __int128>(bandwidth_mbps);
  const unsigned __int128 ns = (bits_x1000 + mbps - 1) / mbps;
  return ns > static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max() / 4)
             ? std::numeric_limits<int64_t>::max() / 4
             : static_cast<int64_t>(ns);
}

LinkModel link_model_of(const AfdConfig& cfg) {
  return LinkModel{.latency_us = cfg.link_latency_us, .bandwidth_mbps = cfg.link_bandwidth_mbps};
}

namespace {

// Marks a data-channel message of a rank that runs the link model ("GBLINK01" read as little-endian bytes).
constexpr uint64_t kLinkMagic = 0x31304b4e494c4247ull;

struct Header {
  int64_t arrival_ns = 0;  // CLOCK_MONOTONIC (wire::now_ns) when the message has crossed the link
  uint64_t magic = 0;
};
static_assert(sizeof(Header) == kLinkHeaderBytes);

bool delayed(Channel ch) { return ch != Channel::kControl; }

class LinkTransport final : public Transport {
 public:
  LinkTransport(std::unique_ptr<Transport> inner, LinkModel link) : inner_(std::move(inner)), link_(link) {}
  ~LinkTransport() override { inner_->close().ignore(); }

  std::string_view name() const override { return inner_->name(); }
  Status init() override {
    GB_RETURN_IF_ERROR(inner_->init());
    std::lock_guard lock(mu_);
    link_free_ns_.assign(static_cast<size_t>(inner_->world_size()), 0);
    return ok_status();
  }
  Status close() override { return inner_->close(); }
  int world_rank() const override { return inner_->world_rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::span<const int> declared_roles() const override { return inner_->declared_roles(); }
  void set_rank_names(std::vector<std::string> names) override { inner_->set_rank_names(std::move(names)); }
  Result<std::span<std::byte>> alloc_buffer(size_t bytes) override { return inner_->alloc_buffer(bytes); }

  Result<RequestId> isend(int peer, Channel ch, int tag, std::span<const ConstSegment> segments) override {
    std::lock_guard lock(mu_);
    // Outside the links (the control plane, or a peer the inner transport will refuse; before init() there
    // are no links yet): as it is.
    if (!delayed(ch) || peer < 0 || peer >= static_cast<int>(link_free_ns_.size())) {
      return post_locked(Entry{}, [&](Entry&) { return inner_->isend(peer, ch, tag, segments); });
    }
    size_t bytes = kLinkHeaderBytes;
    for (const ConstSegment& s : segments) bytes += s.bytes;
    const int64_t depart = std::max(wire::now_ns(), link_free_ns_[peer]) + link_.wire_ns(bytes);
    link_free_ns_[peer] = depart;
    Entry e{.header = {.arrival_ns = depart + link_.latency_us * 1000, .magic = kLinkMagic}, .with_header = true};
    return post_locked(e, [&](Entry& posted) {
      send_segments_.assign(1, ConstSegment{&posted.header, sizeof(Header)});
      send_segments_.insert(send_segments_.end(), segments.begin(), segments.end());
      return inner_->isend(peer, ch, tag, send_segments_);
    });
  }

  Result<RequestId> irecv(int peer, Channel ch, int tag, std::span<const MutSegment> segments) override {
    std::lock_guard lock(mu_);
    if (!delayed(ch)) return post_locked(Entry{}, [&](Entry&) { return inner_->irecv(peer, ch, tag, segments); });
    return post_locked(Entry{.with_header = true, .is_recv = true}, [&](Entry& posted) {
      recv_segments_.assign(1, MutSegment{&posted.header, sizeof(Header)});
      recv_segments_.insert(recv_segments_.end(), segments.begin(), segments.end());
      return inner_->irecv(peer, ch, tag, recv_segments_);
    });
  }

  Result<bool> test(RequestId id, Completion* c) override {
    std::unique_lock lock(mu_);
    GB_ASSIGN_OR_RETURN(Entry * e, find_locked(id));
    if (!e->landed) {
      RequestId inner_id = e->inner;
      lock.unlock();
      Completion ic;
      GB_ASSIGN_OR_RETURN(const bool done, inner_->test(inner_id, &ic));
      if (!done) return false;
      lock.lock();
      GB_ASSIGN_OR_RETURN(e, find_locked(id));
      GB_RETURN_IF_ERROR(land_locked(e, ic));
    }
    if (e->arrival_ns > wire::now_ns()) return false;
    finish_locked(id, c);
    return true;
  }

  Result<int> wait_any(std::span<const RequestId> ids, Deadline deadline, Completion* c) override {
    std::unique_lock lock(mu_);
    GB_RETURN_IF_ERROR(
        check_wait_any_ids(ids, "link transport", [&](RequestId id) { return find_locked(id).status(); }));
    std::vector<RequestId> inner_ids(ids.size(), kNoRequest);
    for (;;) {
      // A message that has crossed the link: the earliest arrival first.
      const int64_t now = wire::now_ns();
      int best = -1;
      int64_t next_arrival = std::numeric_limits<int64_t>::max();
      bool any_inner = false;
      for (size_t i = 0; i < ids.size(); ++i) {
        inner_ids[i] = kNoRequest;
        if (ids[i] == kNoRequest) continue;
        const Entry& e = entries_.at(ids[i]);
        if (!e.landed) {
          inner_ids[i] = e.inner;
          any_inner = true;
        } else if (e.arrival_ns <= now) {
          if (best < 0 || e.arrival_ns < entries_.at(ids[best]).arrival_ns) best = static_cast<int>(i);
        } else {
          next_arrival = std::min(next_arrival, e.arrival_ns);
        }
      }
      if (best >= 0) {
        finish_locked(ids[best], c);
        return best;
      }
      lock.unlock();
      // Wait for the inner transport, or at most until the next held-back message arrives.
      Deadline until = deadline;
      if (next_arrival != std::numeric_limits<int64_t>::max()) {
        until = std::min(deadline, Clock::now() + std::chrono::nanoseconds(next_arrival - now));
      }
      if (!any_inner) {
        if (Clock::now() >= deadline) return deadline_exceeded("deadline passed");
        std::this_thread::sleep_for(until - Clock::now());
        lock.lock();
        continue;
      }
      Completion ic;
      Result<int> r = inner_->wait_any(inner_ids, until, &ic);
      if (!r.ok()) {
        if (r.status().code() == StatusCode::kDeadlineExceeded && until < deadline) {
          lock.lock();
          continue;  // a held-back message is due
        }
        return r.status();
      }
      lock.lock();
      GB_ASSIGN_OR_RETURN(Entry * e, find_locked(ids[*r]));
      GB_RETURN_IF_ERROR(land_locked(e, ic));
    }
  }

  Status cancel(RequestId id) override {
    std::unique_lock lock(mu_);
    GB_ASSIGN_OR_RETURN(Entry * e, find_locked(id));
    const bool landed = e->landed;
    const RequestId inner_id = e->inner;
    entries_.erase(id);
    if (landed) return ok_status();
    lock.unlock();
    return inner_->cancel(inner_id);
  }

  void abort_job(const Status& why) override { inner_->abort_job(why); }

 private:
  struct Entry {
    Header header;  // in the map's node: stays put while the inner request is in flight
    bool with_header = false;
    bool is_recv = false;
    RequestId inner = kNoRequest;
    bool landed = false;  // the inner request completed; a receive waits for arrival_ns
    int64_t arrival_ns = 0;
    Completion completion;
  };

  // Adds `e` under a new id, then `post(entry)` posts the inner request (its header, if any, is the entry's,
  // whose address the map keeps); when that fails the entry goes again.
  template <class Post>
  Result<RequestId> post_locked(Entry e, Post&& post) {
    // Ids are the decorator's own (an inner id is released as soon as the inner request completes, while
    // the decorator may still hold the message back). Skip ids still in use after a wrap-around.
    do {
      next_id_ = next_id_ == std::numeric_limits<RequestId>::max() ? 0 : next_id_ + 1;
    } while (entries_.count(next_id_) > 0);
    const RequestId id = next_id_;
    Entry& entry = entries_.emplace(id, e).first->second;
    Result<RequestId> inner = post(entry);
    if (!inner.ok()) {
      entries_.erase(id);
      return inner.status();
    }
    entry.inner = *inner;
    return id;
  }

  Result<Entry*> find_locked(RequestId id) {
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      return internal_error(fmt::format("link transport: request id {} is not in flight", id));
    }
    return &it->second;
  }

  // The inner request completed with `ic`.
  Status land_locked(Entry* e, const Completion& ic) {
    e->landed = true;
    e->completion = ic;
    e->arrival_ns = 0;
    if (!e->with_header) return ok_status();
    if (e->is_recv) {
      if (ic.bytes < kLinkHeaderBytes || e->header.magic != kLinkMagic) {
        return invalid_argument(fmt::format(
            "link transport: a message from world rank {} came without the link model's header; every rank of the "
            "job must run the same link settings (link_latency_us, link_bandwidth_mbps)",
            ic.source));
      }
      e->arrival_ns = e->header.arrival_ns;
      e->completion.done_ns = std::max(ic.done_ns, e->arrival_ns);
    }
    e->completion.bytes = ic.bytes - std::min(ic.bytes, kLinkHeaderBytes);
    return ok_status();
  }

  void finish_locked(RequestId id, Completion* c) {
    auto it = entries_.find(id);
    if (c) *c = it->second.completion;
    entries_.erase(it);
  }

  std::unique_ptr<Transport> inner_;
  const LinkModel link_;
  std::mutex mu_;
  std::unordered_map<RequestId, Entry> entries_;
  RequestId next_id_ = 0;
  std::vector<int64_t> link_free_ns_;  // per peer: when this rank's link to it is free again
  std::vector<ConstSegment> send_segments_;
  std::vector<MutSegment> recv_segments_;
};

}  // namespace

std::unique_ptr<Transport> make_link_transport(std::unique_ptr<Transport> inner, LinkModel link) {
  return std::make_unique<LinkTransport>(std::move(inner), link);
}

}  // namespace genbridge::afd
