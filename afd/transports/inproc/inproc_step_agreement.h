#pragma once
// StepAgreement among the attention threads of one process (in-process jobs).

#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "afd/transports/step_agreement.h"

namespace genbridge::afd {

// Lockstep agreement among the attention threads of one process.
class InprocAgreementGroup {
 public:
  InprocAgreementGroup(int n, int64_t timeout_ms) : n_(n), timeout_ms_(timeout_ms) {}

  Result<bool> any_active(int rank, bool mine) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!abort_.ok()) return abort_;
    any_ = any_ || mine;
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      result_ = any_;
      any_ = false;
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return result_;
    }
    const bool done =
        cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms_), [&] { return generation_ != gen || !abort_.ok(); });
    if (!abort_.ok()) return abort_;
    if (!done) {
      return deadline_exceeded(
          fmt::format("afd: attention rank {} waited {} ms for the other attention ranks to agree "
                      "on the next step ({} of {} arrived)",
                      rank, timeout_ms_, arrived_, n_));
    }
    return result_;
  }

  void abort(const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_.ok()) abort_ = Status(why.code(), "afd: another attention rank failed: " + why.message());
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
  int64_t timeout_ms_;
  int arrived_ = 0;
  bool any_ = false, result_ = false;
  uint64_t generation_ = 0;
  Status abort_;
};

class InprocAgreement final : public StepAgreement {
 public:
  InprocAgreement(InprocAgreementGroup& g, int rank) : g_(g), rank_(rank) {}
  Result<bool> any_active(bool mine) override { return g_.any_active(rank_, mine); }

 private:
  InprocAgreementGroup& g_;
  int rank_;
};

}  // namespace genbridge::afd
