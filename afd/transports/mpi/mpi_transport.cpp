// Open MPI transport (C API). One duplicated communicator per channel; non-blocking isend/irecv;
// multi-segment messages use an hindexed datatype over absolute addresses, so nothing is packed by us;
// waits poll MPI_Test with a deadline and yield the core when the wait is long (ranks may be
// oversubscribed). Compiled only when CMake found MPI (GENBRIDGE_HAVE_MPI).

#include <fmt/format.h>
#include <mpi.h>
#include <sched.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "afd/transport.h"
#include "afd/wire.h"

namespace genbridge::afd {

namespace {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

// Tag of the join handshake on MPI_COMM_WORLD (before the channel communicators exist).
constexpr int kJoinTag = 0x4a4e;

// Bounds a blocking MPI call that has no deadline of its own (MPI_Init, MPI_Finalize wait for every rank):
// when the call has not returned by the deadline, prints `message` and ends this process with exit status
// 1, and mpirun then ends the job. The watchdog thread makes no MPI call.
class Watchdog {
 public:
  Watchdog(int64_t timeout_ms, std::string message)
      : thread_([this, timeout_ms, message = std::move(message)] {
          std::unique_lock lock(mu_);
          if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return done_; })) {
            std::fprintf(stderr, "genbridge afd: %s\n", message.c_str());
            std::fflush(stderr);
            std::_Exit(1);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

// Environment variables set by mpirun/mpiexec launchers (Open MPI, PMIx, Hydra/PMI).
bool started_by_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(const MpiOptions& o) : options_(o) {}
  ~MpiTransport() override { close().ignore(); }

  std::string_view name() const override { return "mpi"; }

  Status init() override {
    if (initialized_) return ok_status();
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      if (!started_by_launcher()) {
        return unavailable(
            "mpi transport: this process was not started by mpirun (none of OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK "
            "is set); launch the job with e.g. `mpirun -np A genbridge afd-worker --role attention : -np F genbridge "
            "afd-worker --role ffn`, or use the inproc transport");
      }
      int provided = 0;
      // MPI_Init waits for every rank of the job to start it, without a deadline.
      const Watchdog watchdog(
          options_.init_timeout_ms,
          fmt::format("mpi transport: world rank {} waited {} ms in MPI_Init for the other ranks of the job to start "
                      "MPI (a rank that never does was not started, crashed or is stopped); ending the job",
                      launcher_world_rank(), options_.init_timeout_ms));
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      if (rc != MPI_SUCCESS) return unavailable("mpi transport: MPI_Init_thread failed: " + mpi_error_string(rc));
      owns_mpi_ = true;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return unavailable("mpi transport: MPI was already finalized in this process");
    mpi_up_ = true;  // from here on abort_job() can end the whole job
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    names_.resize(size_);
    for (int r = 0; r < size_; ++r) names_[r] = fmt::format("world rank {}", r);
    // The collectives of init are non-blocking and polled against a deadline: ranks arrive far apart (each
    // loads its weights first), and one that never arrives (stopped, stuck) must end the job, not hang it.
    const Deadline deadline = deadline_after_ms(options_.init_timeout_ms);
    GB_RETURN_IF_ERROR(join(deadline));
    for (int c = 0; c < kNumChannels; ++c) {
      MPI_Request req = MPI_REQUEST_NULL;
      const int rc = MPI_Comm_idup(MPI_COMM_WORLD, &comms_[c], &req);
      if (rc != MPI_SUCCESS) return unavailable("mpi transport: MPI_Comm_idup failed: " + mpi_error_string(rc));
      GB_RETURN_IF_ERROR(poll_collective(&req, deadline, options_.init_timeout_ms, "join the job"));
      MPI_Comm_set_errhandler(comms_[c], MPI_ERRORS_RETURN);
    }
    roles_.assign(size_, kRoleUndeclared);
    int mine = options_.declared_role;
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = MPI_Iallgather(&mine, 1, MPI_INT, roles_.data(), 1, MPI_INT, comms_[0], &req);
    if (rc != MPI_SUCCESS) return unavailable("mpi transport: exchanging roles failed: " + mpi_error_string(rc));
    GB_RETURN_IF_ERROR(poll_collective(&req, deadline, options_.init_timeout_ms, "exchange their roles"));
    initialized_ = true;
    return ok_status();
  }

  Status close() override {
    if (!initialized_ || closed_) return ok_status();
    closed_ = true;
    // MPI_Finalize waits for every rank without a deadline: meet in a barrier that has one first, so that a
    // rank that never gets here (stopped, stuck) ends the job instead of hanging it.
    if (owns_mpi_) {
      MPI_Request req = MPI_REQUEST_NULL;
      int rc = MPI_Ibarrier(comms_[0], &req);
      if (rc != MPI_SUCCESS) return internal_error("mpi transport: MPI_Ibarrier failed: " + mpi_error_string(rc));
      GB_RETURN_IF_ERROR(poll_collective(&req, deadline_after_ms(options_.close_timeout_ms), options_.close_timeout_ms,
                                         "close the job"));
    }
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] != MPI_REQUEST_NULL) {
        if (is_recv_[i]) {
          MPI_Cancel(&requests_[i]);
          MPI_Wait(&requests_[i], MPI_STATUS_IGNORE);
        } else {
          MPI_Request_free(&requests_[i]);
        }
      }
    }
    for (void* p : buffers_) MPI_Free_mem(p);
    buffers_.clear();
    for (MPI_Comm& c : comms_) {
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    }
    if (owns_mpi_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) {
        const Watchdog watchdog(options_.close_timeout_ms,
                                fmt::format("mpi transport: world rank {} waited {} ms in MPI_Finalize for the other "
                                            "ranks; ending the job",
                                            rank_, options_.close_timeout_ms));
        MPI_Finalize();
      }
    }
    return ok_status();
  }

  int world_rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::span<const int> declared_roles() const override { return roles_; }
  void set_rank_names(std::vector<std::string> names) override {
    if (static_cast<int>(names.size()) == size_) names_ = std::move(names);
  }

  Result<std::span<std::byte>> alloc_buffer(size_t bytes) override {
    if (!initialized_) return unavailable("mpi transport: alloc_buffer before init()");
    void* p = nullptr;
    const int rc = MPI_Alloc_mem(static_cast<MPI_Aint>(std::max<size_t>(bytes, 64) + 64), MPI_INFO_NULL, &p);
    if (rc != MPI_SUCCESS || p == nullptr) {
      return resource_exhausted(fmt::format("mpi transport: MPI_Alloc_mem of {} bytes failed", bytes));
    }
    buffers_.push_back(p);
    // 64-byte alignment for vectorised compute on the buffer.
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63};
    return std::span<std::byte>(reinterpret_cast<std::byte*>(a), bytes);
  }

  Result<RequestId> isend(int peer, Channel ch, int tag, std::span<const ConstSegment> segments) override {
    GB_RETURN_IF_ERROR(check_usable("send"));
    const RequestId id = new_request(false);
    GB_ASSIGN_OR_RETURN(const int rc, post(segments, [&](auto* buf, int count, MPI_Datatype t) {
                          return MPI_Isend(buf, count, t, peer, tag, comm(ch), &requests_[id]);
                        }));
    if (rc != MPI_SUCCESS) {
      release(id);
      return internal_error(
          fmt::format("mpi transport: MPI_Isend to {} failed: {}", names_[peer], mpi_error_string(rc)));
    }
    return id;
  }

  Result<RequestId> irecv(int peer, Channel ch, int tag, std::span<const MutSegment> segments) override {
    GB_RETURN_IF_ERROR(check_usable("receive"));
    const RequestId id = new_request(true);
    const int src = peer == kAnySource ? MPI_ANY_SOURCE : peer;
    const int mtag = tag == kAnyTag ? MPI_ANY_TAG : tag;
    GB_ASSIGN_OR_RETURN(const int rc, post(segments, [&](auto* buf, int count, MPI_Datatype t) {
                          return MPI_Irecv(buf, count, t, src, mtag, comm(ch), &requests_[id]);
                        }));
    if (rc != MPI_SUCCESS) {
      release(id);
      return internal_error(fmt::format("mpi transport: MPI_Irecv failed: {}", mpi_error_string(rc)));
    }
    return id;
  }

  Result<bool> test(RequestId id, Completion* c) override {
    GB_RETURN_IF_ERROR(check_id(id));
    int flag = 0;
    MPI_Status st;
    const int rc = MPI_Test(&requests_[id], &flag, &st);
    if (rc != MPI_SUCCESS) {
      const char* what = is_recv_[id] ? "receive" : "send";
      release(id);
      return internal_error(
          fmt::format("mpi transport: a {} on {} failed: {}", what, names_[rank_], mpi_error_string(rc)));
    }
    if (!flag) return false;
    fill(id, st, c);
    release(id);
    return true;
  }

  Result<int> wait_any(std::span<const RequestId> ids, Deadline deadline, Completion* c) override {
    GB_RETURN_IF_ERROR(check_wait_any_ids(ids, "mpi transport", [&](RequestId id) { return check_id(id); }));
    // One MPI_Testany per poll (one progress call for all of them). Spin briefly for latency, then yield
    // the core on every poll (ranks may share cores).
    poll_.clear();
    poll_index_.clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == kNoRequest) continue;
      poll_.push_back(requests_[ids[i]]);
      poll_index_.push_back(static_cast<int>(i));
    }
    for (int64_t polls = 0;; ++polls) {
      int index = MPI_UNDEFINED, flag = 0;
      MPI_Status st;
      const int rc = MPI_Testany(static_cast<int>(poll_.size()), poll_.data(), &index, &flag, &st);
      if (rc != MPI_SUCCESS) {
        // Find which one failed by testing them one at a time (rare path).
        for (size_t i = 0; i < ids.size(); ++i) {
          if (ids[i] != kNoRequest) GB_RETURN_IF_ERROR(test(ids[i], c).status());
        }
        return internal_error("mpi transport: MPI_Testany failed: " + mpi_error_string(rc));
      }
      if (flag && index != MPI_UNDEFINED) {
        const int i = poll_index_[index];
        requests_[ids[i]] = MPI_REQUEST_NULL;
        fill(ids[i], st, c);
        release(ids[i]);
        return i;
      }
      if ((polls & 63) == 63 && Clock::now() >= deadline) {
        // Keep MPI's view of the requests (Testany may have completed none, but stays consistent).
        for (size_t k = 0; k < poll_.size(); ++k) requests_[ids[poll_index_[k]]] = poll_[k];
        return deadline_exceeded("deadline passed");
      }
      if (polls > 2000) sched_yield();
    }
  }

  Status cancel(RequestId id) override {
    GB_RETURN_IF_ERROR(check_id(id));
    MPI_Cancel(&requests_[id]);
    MPI_Wait(&requests_[id], MPI_STATUS_IGNORE);
    release(id);
    return ok_status();
  }

  void abort_job(const Status& why) override {
    if (!mpi_up_) return;  // MPI never started: nothing to abort, the caller returns the error
    std::fprintf(stderr, "genbridge afd: %s ends the job: %s\n", names_[rank_].c_str(), why.to_string().c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

 private:
  MPI_Comm comm(Channel ch) const { return comms_[static_cast<int>(ch)]; }

  // The join handshake on MPI_COMM_WORLD: world rank 0 hears from every rank, then lets them go. Unlike a
  // collective, it tells rank 0 which rank did not arrive. The other ranks wait twice as long, so that rank 0
  // (when it is there) is the one that reports the missing rank.
  Status join(Deadline deadline) {
    int32_t token = 1;
    if (rank_ == 0) {
      std::vector<int32_t> in(size_);
      std::vector<MPI_Request> reqs(size_, MPI_REQUEST_NULL);
      for (int r = 1; r < size_; ++r) MPI_Irecv(&in[r], 1, MPI_INT32_T, r, kJoinTag, MPI_COMM_WORLD, &reqs[r]);
      for (int64_t polls = 0;; ++polls) {
        int done = 0;
        MPI_Testall(size_, reqs.data(), &done, MPI_STATUSES_IGNORE);
        if (done) break;
        if ((polls & 63) == 63 && Clock::now() >= deadline) {
          std::string missing;
          for (int r = 1; r < size_; ++r) {
            int flag = 0;
            if (reqs[r] != MPI_REQUEST_NULL) MPI_Test(&reqs[r], &flag, MPI_STATUS_IGNORE);
            if (reqs[r] != MPI_REQUEST_NULL && !flag)
              missing += fmt::format("{}world rank {}", missing.empty() ? "" : ", ", r);
          }
          return deadline_exceeded(fmt::format(
              "mpi transport: world rank 0 timed out after {} ms waiting for {} to join the job (not started, "
              "crashed or stopped)",
              options_.init_timeout_ms, missing));
        }
        if (polls > 2000) sched_yield();
      }
      for (int r = 1; r < size_; ++r) MPI_Isend(&token, 1, MPI_INT32_T, r, kJoinTag, MPI_COMM_WORLD, &reqs[r]);
      return poll_all(reqs, deadline, "confirm to the other ranks that every rank joined the job");
    }
    int32_t go = 0;
    std::vector<MPI_Request> reqs(2, MPI_REQUEST_NULL);
    MPI_Irecv(&go, 1, MPI_INT32_T, 0, kJoinTag, MPI_COMM_WORLD, &reqs[0]);
    MPI_Isend(&token, 1, MPI_INT32_T, 0, kJoinTag, MPI_COMM_WORLD, &reqs[1]);
    return poll_all(reqs, deadline + (deadline - Clock::now()),
                    "hear from world rank 0 that every rank joined the job");
  }

  Status poll_all(std::vector<MPI_Request>& reqs, Deadline deadline, const char* what) {
    const auto start = Clock::now();
    for (int64_t polls = 0;; ++polls) {
      int done = 0;
      MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
      if (done) return ok_status();
      if ((polls & 63) == 63 && Clock::now() >= deadline) {
        return deadline_exceeded(
            fmt::format("mpi transport: world rank {} timed out after {} ms waiting to {}", rank_,
                        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count(), what));
      }
      if (polls > 2000) sched_yield();
    }
  }

  // Polls a non-blocking collective until it completes or `deadline` passes (then it stays pending; the
  // caller ends the job). `what` completes "waited N ms for the other ranks to ...".
  Status poll_collective(MPI_Request* req, Deadline deadline, int64_t timeout_ms, const char* what) {
    for (int64_t polls = 0;; ++polls) {
      int done = 0;
      const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        return unavailable(fmt::format("mpi transport: world rank {} failed waiting for the other ranks to {}: {}",
                                       rank_, what, mpi_error_string(rc)));
      }
      if (done) return ok_status();
      if ((polls & 63) == 63 && Clock::now() >= deadline) {
        return deadline_exceeded(fmt::format(
            "mpi transport: world rank {} timed out after {} ms waiting for the other {} ranks to {} (a rank that "
            "never arrives was not started, crashed or is stopped)",
            rank_, timeout_ms, size_ - 1, what));
      }
      if (polls > 2000) sched_yield();
    }
  }

  Status check_usable(const char* what) const {
    if (!initialized_) return unavailable(fmt::format("mpi transport: {} before init()", what));
    if (closed_) return unavailable(fmt::format("mpi transport: {} after close()", what));
    return ok_status();
  }

  Status check_id(RequestId id) const {
    if (id < 0 || id >= static_cast<RequestId>(requests_.size()) || !in_use_[id]) {
      return internal_error(fmt::format("mpi transport: request id {} is not in flight", id));
    }
    return ok_status();
  }

  // Posts one nonblocking send or receive of `segments`: one byte buffer for 0 or 1 segment, a datatype
  // over the segments' absolute addresses otherwise. `op(buf, count, type)` makes the MPI call and
  // returns its code.
  template <typename Segment, typename Op>
  Result<int> post(std::span<const Segment> segments, Op&& op) {
    if (segments.size() <= 1) {
      return op(segments.empty() ? nullptr : segments[0].data,
                segments.empty() ? 0 : static_cast<int>(segments[0].bytes), MPI_BYTE);
    }
    MPI_Datatype t;
    GB_RETURN_IF_ERROR(make_type(
        segments.size(), [&](size_t i) { return std::pair<const void*, size_t>(segments[i].data, segments[i].bytes); },
        &t));
    const int rc = op(MPI_BOTTOM, 1, t);
    MPI_Type_free(&t);
    return rc;
  }

  template <typename SegAt>
  Status make_type(size_t n, SegAt seg_at, MPI_Datatype* t) {
    lens_.resize(n);
    disps_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const auto [p, bytes] = seg_at(i);
      if (bytes > static_cast<size_t>(INT32_MAX)) return invalid_argument("mpi transport: segment larger than 2 GiB");
      lens_[i] = static_cast<int>(bytes);
      MPI_Get_address(p, &disps_[i]);
    }
    int rc = MPI_Type_create_hindexed(static_cast<int>(n), lens_.data(), disps_.data(), MPI_BYTE, t);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(t);
    if (rc != MPI_SUCCESS) return internal_error("mpi transport: building a datatype failed: " + mpi_error_string(rc));
    return ok_status();
  }

  RequestId new_request(bool is_recv) {
    if (free_ids_.empty()) {
      requests_.push_back(MPI_REQUEST_NULL);
      is_recv_.push_back(false);
      in_use_.push_back(false);
      free_ids_.push_back(static_cast<RequestId>(requests_.size() - 1));
    }
    const RequestId id = free_ids_.back();
    free_ids_.pop_back();
    is_recv_[id] = is_recv;
    in_use_[id] = true;
    return id;
  }

  void release(RequestId id) {
    requests_[id] = MPI_REQUEST_NULL;
    in_use_[id] = false;
    free_ids_.push_back(id);
  }

  void fill(RequestId id, const MPI_Status& st, Completion* c) const {
    if (!c) return;
    c->done_ns = wire::now_ns();  // CLOCK_MONOTONIC, as the send times in the headers
    if (is_recv_[id]) {
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      c->source = st.MPI_SOURCE;
      c->tag = st.MPI_TAG;
      c->bytes = static_cast<size_t>(count);
    } else {
      c->source = -1;
      c->tag = -1;
      c->bytes = 0;
    }
  }

  MpiOptions options_;
  bool initialized_ = false;
  bool closed_ = false;
  bool owns_mpi_ = false;
  bool mpi_up_ = false;
  int rank_ = 0;
  int size_ = 0;
  MPI_Comm comms_[kNumChannels] = {MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL};
  std::vector<int> roles_;
  std::vector<std::string> names_;
  std::vector<void*> buffers_;
  std::vector<MPI_Request> requests_;
  std::vector<bool> is_recv_;
  std::vector<bool> in_use_;
  std::vector<RequestId> free_ids_;
  std::vector<MPI_Request> poll_;
  std::vector<int> poll_index_;
  std::vector<int> lens_;
  std::vector<MPI_Aint> disps_;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const MpiOptions& options) {
  return std::make_unique<MpiTransport>(options);
}

bool mpi_transport_built() { return true; }

}  // namespace genbridge::afd
