#pragma once
// Transport: tagged point-to-point messages between the ranks of one AFD job, modelled on MPI's
// non-blocking calls (and NCCL's net plugin: register buffers once, post isend/irecv, poll with a
// deadline). Connectors are written against this interface only; the in-process transport (threads)
// and the Open MPI transport (processes) implement it. Plain C++: no MPI types appear here.
//
// Semantics (the same on every transport):
//  * Messages on one (channel, source, tag) are received in the order they were sent.
//  * A send may complete only once the receiver matched it; the sender must keep the memory of its
//    segments valid and unmodified until the send completes.
//  * A receive completes with at most the sum of its segments' bytes; a longer message is an error.
//  * Every wait has a deadline. A failed rank, abort_job() or close() ends every wait of the job with
//    Unavailable instead of letting it hang.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "afd/config.h"
#include "afd/progress_clock.h"
#include "genbridge/core/status.h"

namespace genbridge::afd {

// Deadlines run on the progress clock (afd/progress_clock.h): a pause of this whole process (SIGSTOP) is not
// waiting time, so it never makes a peer look dead.
using Clock = ProgressClock;
using Deadline = Clock::time_point;
// Every wait of an AFD job has a finite deadline: there is no "wait forever" (a stopped or stuck peer must
// end the job, not hang it). A non-positive `ms` is a deadline that has already passed.
inline Deadline deadline_after_ms(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms > 0 ? ms : 0); }

enum class Role : int8_t { kAttention = 0, kFfn = 1 };
inline std::string_view role_name(Role r) { return r == Role::kAttention ? "attention" : "ffn"; }

// Independent matching spaces (MPI: one duplicated communicator each).
enum class Channel : uint8_t {
  kControl = 0,   // control plane, settings exchange, metric gathering
  kDispatch = 1,  // attention -> FFN hidden states and routing (one tag per stage)
  kCombine = 2,   // FFN -> attention expert outputs (one tag per stage)
};
inline constexpr int kNumChannels = 3;

inline constexpr int kAnySource = -1;
inline constexpr int kAnyTag = -1;
// Declared role of a rank that was started without one (roles then follow rank order).
inline constexpr int kRoleUndeclared = -1;

struct ConstSegment {
  const void* data;
  size_t bytes;
};
struct MutSegment {
  void* data;
  size_t bytes;
};

// Identifies a posted send or receive until it completes (then the id may be reused).
using RequestId = int32_t;
inline constexpr RequestId kNoRequest = -1;

// wait_any's argument check, shared by the transports: `check(id)` for every entry other than kNoRequest,
// and InvalidArgument "<who>: wait_any on no request" when every entry is kNoRequest.
template <class CheckId>
Status check_wait_any_ids(std::span<const RequestId> ids, std::string_view who, CheckId&& check) {
  bool any = false;
  for (RequestId id : ids) {
    if (id == kNoRequest) continue;
    GB_RETURN_IF_ERROR(check(id));
    any = true;
  }
  if (!any) return invalid_argument(std::string(who) + ": wait_any on no request");
  return ok_status();
}

struct Completion {
  int64_t done_ns = 0;  // CLOCK_MONOTONIC (not the deadline clock) when the transport saw the operation complete
  int source = -1;      // world rank of the sender (receives)
  int tag = -1;         // tag of the message (receives)
  size_t bytes = 0;     // bytes received (receives) or sent (sends)
};

class Transport {
 public:
  virtual ~Transport() = default;

  // "inproc" or "mpi".
  virtual std::string_view name() const = 0;
  // Collective: joins the job. Returns Unavailable naming what is missing (no MPI in this build, not
  // started by mpirun, ...). Construction touches nothing; init() is the first call that does.
  virtual Status init() = 0;
  // Ends this rank's participation: cancels posted receives, unblocks its waiters. Idempotent.
  virtual Status close() = 0;

  // Valid after init().
  virtual int world_rank() const = 0;
  virtual int world_size() const = 0;
  // Role each world rank was started with (0 attention, 1 FFN, kRoleUndeclared), indexed by world rank.
  virtual std::span<const int> declared_roles() const = 0;
  // Human-readable names of the ranks, used in error messages ("ffn rank 1 (world rank 3)").
  virtual void set_rank_names(std::vector<std::string> names) = 0;

  // Memory registered once for repeated transfers; owned by the transport, freed by close().
  // 64-byte aligned. Not for use on the hot path.
  virtual Result<std::span<std::byte>> alloc_buffer(size_t bytes) = 0;

  // Posts a send of the concatenated segments to `peer`. Never blocks. Does not copy: the segments must
  // stay valid until the send completes.
  virtual Result<RequestId> isend(int peer, Channel ch, int tag, std::span<const ConstSegment> segments) = 0;
  // Posts a receive into the concatenated segments. `peer` may be kAnySource, `tag` kAnyTag. Never blocks.
  virtual Result<RequestId> irecv(int peer, Channel ch, int tag, std::span<const MutSegment> segments) = 0;
  // Polls one request: true once complete (the id is then released and `c` filled), false otherwise.
  virtual Result<bool> test(RequestId id, Completion* c) = 0;
  // Blocks until one of `ids` completes (entries equal to kNoRequest are skipped) and returns its index;
  // that id is released. DeadlineExceeded at `deadline` (message: the bare wait; callers add context);
  // Unavailable when a rank failed, the job aborted or the transport was closed.
  virtual Result<int> wait_any(std::span<const RequestId> ids, Deadline deadline, Completion* c) = 0;
  // Cancels a posted receive that has not been matched (used when tearing down).
  virtual Status cancel(RequestId id) = 0;

  // Ends the whole job because this rank cannot go on: every rank's waits end with an error naming this
  // rank and `why`. MPI: prints `why` and calls MPI_Abort (does not return). In-process: returns.
  virtual void abort_job(const Status& why) = 0;
};

// Options for the MPI transport.
struct MpiOptions {
  // Role this process was started with (`--role attention|ffn` in an MPMD launch), or kRoleUndeclared
  // to take roles from rank order (world ranks 0..A-1 attention, A..A+F-1 FFN).
  int declared_role = kRoleUndeclared;
  // Deadline of init()'s collectives (the ranks may arrive far apart: each loads its weights first).
  int64_t init_timeout_ms = 300000;
  // Deadline of close()'s barrier before MPI_Finalize (ranks may finish their work far apart).
  int64_t close_timeout_ms = 600000;
};

// The Open MPI transport. Available in every build; init() fails with Unavailable in a build without
// MPI or in a process not started by mpirun. Creating it touches no MPI state.
std::unique_ptr<Transport> make_mpi_transport(const MpiOptions& options);
// True when this build contains the MPI transport.
bool mpi_transport_built();

// This process's world rank as its launcher (mpirun) named it in the environment before MPI_Init
// (OMPI_COMM_WORLD_RANK, PMIX_RANK or PMI_RANK, the first set), or -1 when no launcher started it. The one
// reader of that environment: before the transport's init() nothing else knows this process's rank.
int launcher_world_rank();
// Whether this process of an mpirun job will be an FFN rank, known before MPI_Init: its `declared_role`
// when given, else rank order (world ranks from num_attention on are FFN ranks).
bool launcher_says_ffn(int declared_role, int num_attention);

}  // namespace genbridge::afd
