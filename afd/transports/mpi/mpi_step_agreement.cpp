// StepAgreement over MPI: the attention ranks of a lockstep (sync connector) job agree before every step
// whether any of them still has work, with a logical-or all-reduce on a communicator of the attention
// ranks only (MPI_Comm_create_group: only the group's members call it, so FFN ranks are not involved).
// The all-reduce is non-blocking and polled against the deadline, so a dead or stuck peer ends the wait
// with an error instead of a hang. Compiled only when CMake found MPI (GENBRIDGE_HAVE_MPI).

#include <fmt/format.h>
#include <mpi.h>
#include <sched.h>

#include <chrono>

#include "afd/transport.h"
#include "afd/transports/step_agreement.h"

namespace genbridge::afd {

namespace {

// Tag of MPI_Comm_create_group (any value; it only separates concurrent creations).
constexpr int kCreateGroupTag = 0x6166;

class MpiStepAgreement final : public StepAgreement {
 public:
  MpiStepAgreement(MPI_Comm comm, int rank, int size, int64_t timeout_ms)
      : comm_(comm), rank_(rank), size_(size), timeout_ms_(timeout_ms) {}
  ~MpiStepAgreement() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  Result<bool> any_active(bool mine) override {
    int in = mine ? 1 : 0, out = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_LOR, comm_, &req);
    if (rc != MPI_SUCCESS) {
      return internal_error(fmt::format("afd: attention rank {}: MPI_Iallreduce of the step agreement failed", rank_));
    }
    const Deadline deadline = deadline_after_ms(timeout_ms_);
    for (int64_t polls = 0;; ++polls) {
      int done = 0;
      rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        return internal_error(fmt::format("afd: attention rank {}: the step agreement failed", rank_));
      }
      if (done) break;
      if ((polls & 63) == 63 && Clock::now() >= deadline) {
        // The pending collective cannot be cancelled; the caller ends the job (MPI_Abort).
        return deadline_exceeded(fmt::format(
            "afd: attention rank {} waited {} ms for the other {} attention rank(s) to agree on the next step {}", rank_,
            timeout_ms_, size_ - 1, step_ + 1));
      }
      if (polls > 2000) sched_yield();
    }
    ++step_;
    return out != 0;
  }

 private:
  MPI_Comm comm_;
  int rank_, size_;
  int64_t timeout_ms_;
  int64_t step_ = 0;
};

}  // namespace

Result<std::unique_ptr<StepAgreement>> make_mpi_step_agreement(std::span<const int> attention_world_ranks,
                                                               int attention_rank, int64_t timeout_ms) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return unavailable("afd: the MPI step agreement needs an initialised MPI transport");
  MPI_Group world = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int rc = MPI_Group_incl(world, static_cast<int>(attention_world_ranks.size()), attention_world_ranks.data(), &group);
  MPI_Group_free(&world);
  if (rc != MPI_SUCCESS) return internal_error("afd: MPI_Group_incl of the attention ranks failed");
  MPI_Comm comm = MPI_COMM_NULL;
  rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, kCreateGroupTag, &comm);
  MPI_Group_free(&group);
  if (rc != MPI_SUCCESS || comm == MPI_COMM_NULL) {
    return internal_error(
        fmt::format("afd: attention rank {}: MPI_Comm_create_group of the attention ranks failed", attention_rank));
  }
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::unique_ptr<StepAgreement>(std::make_unique<MpiStepAgreement>(
      comm, attention_rank, static_cast<int>(attention_world_ranks.size()), timeout_ms));
}

}  // namespace genbridge::afd
