#include "tools/serve_afd.h"

namespace genbridge::tools {
namespace {

afd::WorkWait to_afd(serve::WorkWait w) {
  switch (w) {
    case serve::WorkWait::kMine:
      return afd::WorkWait::kMine;
    case serve::WorkWait::kOther:
      return afd::WorkWait::kOther;
    default:
      return afd::WorkWait::kTimeout;
  }
}

}  // namespace

afd::AttentionServeFn service_worker_fn(serve::GenerationService& service) {
  return [&service](int a, engine::Engine& eng, runtime::KvPagePool& pool, afd::AttentionIdle& idle) -> Status {
    Status s = service.run_worker(a, eng, pool, [&idle](bool want_stop, const serve::WorkerWaitFn& wait) {
      return idle.idle(want_stop,
                       [&wait](std::chrono::milliseconds t, bool others) { return to_afd(wait(t, others)); });
    });
    if (!s.ok()) service.wait_streams_released(serve::Clock::now() + std::chrono::seconds(5));
    return s;
  };
}

}  // namespace genbridge::tools
