// Open MPI transport (C API). One duplicated communicator per channel; non-blocking isend/irecv;
// multi-segment messages use an hindexed datatype over absolute addresses, so nothing is packed by us;
// waits poll MPI_Test with a deadline and yield the core when the wait is long (ranks may be
// oversubscribed). Compiled only when CMake found MPI (GENBRIDGE_HAVE_MPI).

#include <fmt/format.h>
#include <mpi.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "afd/transport.h"

namespace genbridge::afd {

namespace {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

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
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      if (rc != MPI_SUCCESS) return unavailable("mpi transport: MPI_Init_thread failed: " + mpi_error_string(rc));
      owns_mpi_ = true;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return unavailable("mpi transport: MPI was already finalized in this process");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    for (int c = 0; c < kNumChannels; ++c) {
      const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comms_[c]);
      if (rc != MPI_SUCCESS) return unavailable("mpi transport: MPI_Comm_dup failed: " + mpi_error_string(rc));
      MPI_Comm_set_errhandler(comms_[c], MPI_ERRORS_RETURN);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    roles_.assign(size_, kRoleUndeclared);
    int mine = options_.declared_role;
    const int rc = MPI_Allgather(&mine, 1, MPI_INT, roles_.data(), 1, MPI_INT, comms_[0]);
    if (rc != MPI_SUCCESS) return unavailable("mpi transport: exchanging roles failed: " + mpi_error_string(rc));
    names_.resize(size_);
    for (int r = 0; r < size_; ++r) names_[r] = fmt::format("world rank {}", r);
    initialized_ = true;
    return ok_status();
  }

  Status close() override {
    if (!initialized_ || closed_) return ok_status();
    closed_ = true;
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
      if (!finalized) MPI_Finalize();
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
    int rc;
    if (segments.size() <= 1) {
      rc = MPI_Isend(segments.empty() ? nullptr : segments[0].data,
                     segments.empty() ? 0 : static_cast<int>(segments[0].bytes), MPI_BYTE, peer, tag, comm(ch),
                     &requests_[id]);
    } else {
      MPI_Datatype t;
      GB_RETURN_IF_ERROR(make_type(segments.size(), [&](size_t i) { return std::pair(segments[i].data, segments[i].bytes); }, &t));
      rc = MPI_Isend(MPI_BOTTOM, 1, t, peer, tag, comm(ch), &requests_[id]);
      MPI_Type_free(&t);
    }
    if (rc != MPI_SUCCESS) {
      release(id);
      return internal_error(fmt::format("mpi transport: MPI_Isend to {} failed: {}", names_[peer], mpi_error_string(rc)));
    }
    return id;
  }

  Result<RequestId> irecv(int peer, Channel ch, int tag, std::span<const MutSegment> segments) override {
    GB_RETURN_IF_ERROR(check_usable("receive"));
    const RequestId id = new_request(true);
    const int src = peer == kAnySource ? MPI_ANY_SOURCE : peer;
    const int mtag = tag == kAnyTag ? MPI_ANY_TAG : tag;
    int rc;
    if (segments.size() <= 1) {
      rc = MPI_Irecv(segments.empty() ? nullptr : segments[0].data,
                     segments.empty() ? 0 : static_cast<int>(segments[0].bytes), MPI_BYTE, src, mtag, comm(ch),
                     &requests_[id]);
    } else {
      MPI_Datatype t;
      GB_RETURN_IF_ERROR(make_type(segments.size(), [&](size_t i) { return std::pair<const void*, size_t>(segments[i].data, segments[i].bytes); }, &t));
      rc = MPI_Irecv(MPI_BOTTOM, 1, t, src, mtag, comm(ch), &requests_[id]);
      MPI_Type_free(&t);
    }
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
    bool any = false;
    for (RequestId id : ids) {
      if (id == kNoRequest) continue;
      GB_RETURN_IF_ERROR(check_id(id));
      any = true;
    }
    if (!any) return invalid_argument("mpi transport: wait_any on no request");
    // Spin briefly for latency, then yield the core on every poll (ranks may share cores).
    for (int64_t polls = 0;; ++polls) {
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == kNoRequest) continue;
        GB_ASSIGN_OR_RETURN(const bool done, test(ids[i], c));
        if (done) return static_cast<int>(i);
      }
      if ((polls & 63) == 63 && Clock::now() >= deadline) return deadline_exceeded("deadline passed");
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
    if (!initialized_) return;  // MPI never started: nothing to abort, the caller returns the error
    std::fprintf(stderr, "genbridge afd: %s ends the job: %s\n", names_[rank_].c_str(), why.to_string().c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

 private:
  MPI_Comm comm(Channel ch) const { return comms_[static_cast<int>(ch)]; }

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
    c->done_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
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
  std::vector<int> lens_;
  std::vector<MPI_Aint> disps_;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const MpiOptions& options) {
  return std::make_unique<MpiTransport>(options);
}

bool mpi_transport_built() { return true; }

}  // namespace genbridge::afd
