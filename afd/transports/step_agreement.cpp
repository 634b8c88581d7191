#include "afd/transports/step_agreement.h"

#include <fmt/format.h>

#include <cstring>

#include "afd/wire.h"

namespace genbridge::afd {

namespace {

constexpr int kMaxAgreements = 8;

class TransportStepAgreement final : public StepAgreement {
 public:
  TransportStepAgreement(Transport& t, StepAgreementOptions o) : t_(t), o_(std::move(o)) {}

  Status init() {
    const int A = static_cast<int>(o_.attention_world.size());
    GB_ASSIGN_OR_RETURN(flags_, t_.alloc_buffer(sizeof(int32_t) * static_cast<size_t>(A)));
    GB_ASSIGN_OR_RETURN(answer_, t_.alloc_buffer(sizeof(int32_t) * static_cast<size_t>(A)));
    ids_.assign(static_cast<size_t>(2 * A), kNoRequest);
    return ok_status();
  }

  Result<bool> any_active(bool mine) override {
    ++round_;
    const int A = static_cast<int>(o_.attention_world.size());
    if (A == 1) return mine;
    const int up = wire::kTagStepAgreement + 2 * o_.id, down = up + 1;
    const Deadline deadline = deadline_after_ms(o_.timeout_ms);
    auto* flags = reinterpret_cast<int32_t*>(flags_.data());
    auto* answer = reinterpret_cast<int32_t*>(answer_.data());
    std::fill(ids_.begin(), ids_.end(), kNoRequest);
    if (o_.attention_rank == 0) {
      flags[0] = mine ? 1 : 0;
      for (int a = 1; a < A; ++a) {
        const MutSegment seg{&flags[a], sizeof(int32_t)};
        GB_ASSIGN_OR_RETURN(ids_[a], t_.irecv(o_.attention_world[a], Channel::kControl, up, {&seg, 1}));
      }
      GB_RETURN_IF_ERROR(wait(deadline, [&](int i) { return i < A ? i : -1; }));
      int32_t any = 0;
      for (int a = 0; a < A; ++a) any |= flags[a];
      answer[0] = any;
      for (int a = 1; a < A; ++a) {
        const ConstSegment seg{&answer[0], sizeof(int32_t)};
        GB_ASSIGN_OR_RETURN(ids_[A + a], t_.isend(o_.attention_world[a], Channel::kControl, down, {&seg, 1}));
      }
      GB_RETURN_IF_ERROR(wait(deadline, [&](int i) { return i >= A ? i - A : -1; }));
      return any != 0;
    }
    // The answer's receive is posted before this rank's flag goes out, so the coordinator's reply never waits.
    const int coordinator = o_.attention_world[0];
    const MutSegment rseg{&answer[0], sizeof(int32_t)};
    GB_ASSIGN_OR_RETURN(ids_[0], t_.irecv(coordinator, Channel::kControl, down, {&rseg, 1}));
    flags[0] = mine ? 1 : 0;
    const ConstSegment sseg{&flags[0], sizeof(int32_t)};
    GB_ASSIGN_OR_RETURN(ids_[1], t_.isend(coordinator, Channel::kControl, up, {&sseg, 1}));
    GB_RETURN_IF_ERROR(wait(deadline, [](int) { return 0; }));
    return answer[0] != 0;
  }

 private:
  // Waits until every posted request completed; `attention_rank_of(i)` names the peer of ids_[i].
  template <typename PeerOf>
  Status wait(Deadline deadline, PeerOf attention_rank_of) {
    for (;;) {
      bool pending = false;
      for (RequestId id : ids_) pending |= id != kNoRequest;
      if (!pending) return ok_status();
      Completion c;
      Result<int> r = t_.wait_any(ids_, deadline, &c);
      if (r.ok()) {
        ids_[*r] = kNoRequest;
        continue;
      }
      std::vector<bool> named(o_.attention_world.size(), false);
      std::string missing;
      for (size_t i = 0; i < ids_.size(); ++i) {
        const int a = ids_[i] == kNoRequest ? -1 : attention_rank_of(static_cast<int>(i));
        if (a < 0 || named[a]) continue;
        named[a] = true;
        missing += (missing.empty() ? "" : ", ") + o_.rank_names[o_.attention_world[a]];
      }
      const std::string me = o_.rank_names[o_.attention_world[o_.attention_rank]];
      const std::string waited =
          o_.attention_rank == 0
              ? fmt::format("{} to {} (round {})", missing, o_.purpose, round_)
              : fmt::format("the answer of {}, which collects the attention ranks' agreement to {} (round {})", missing,
                            o_.purpose, round_);
      if (r.status().code() == StatusCode::kDeadlineExceeded) {
        return deadline_exceeded(
            fmt::format("afd: {} timed out after {} ms waiting for {}", me, o_.timeout_ms, waited));
      }
      return Status(r.status().code(),
                    fmt::format("afd: {} stopped waiting for {}: {}", me, waited, r.status().message()));
    }
  }

  Transport& t_;
  StepAgreementOptions o_;
  std::span<std::byte> flags_, answer_;  // registered with the transport: they outlive a failed wait
  std::vector<RequestId> ids_;
  int64_t round_ = 0;
};

}  // namespace

Result<std::unique_ptr<StepAgreement>> make_step_agreement(Transport& transport, StepAgreementOptions o) {
  const int A = static_cast<int>(o.attention_world.size());
  if (A < 1 || o.attention_rank < 0 || o.attention_rank >= A) {
    return invalid_argument(
        fmt::format("afd step agreement: attention rank {} of {} attention ranks", o.attention_rank, A));
  }
  if (o.id < 0 || o.id >= kMaxAgreements) {
    return invalid_argument(fmt::format("afd step agreement: id {} is outside 0..{}", o.id, kMaxAgreements - 1));
  }
  if (o.timeout_ms < 1) {
    return invalid_argument(
        fmt::format("afd step agreement: timeout {} ms must be >= 1 (every wait has a deadline)", o.timeout_ms));
  }
  for (int w : o.attention_world) {
    if (w < 0 || w >= static_cast<int>(o.rank_names.size())) {
      return invalid_argument(fmt::format("afd step agreement: world rank {} has no name", w));
    }
  }
  auto agreement = std::make_unique<TransportStepAgreement>(transport, std::move(o));
  GB_RETURN_IF_ERROR(agreement->init());
  return std::unique_ptr<StepAgreement>(std::move(agreement));
}

}  // namespace genbridge::afd
