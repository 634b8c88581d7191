#include "tools/serve_afd.h"

namespace genbridge::tools {

afd::AttentionServeFn service_worker_fn(serve::GenerationService& service) {
  return [&service](int a, engine::Engine& eng, runtime::KvPagePool& pool, afd::AttentionIdle& idle) -> Status {
    Status s = service.run_worker(
        a, eng, pool, [&idle](bool want_stop, const serve::WorkerWaitFn& wait) { return idle.idle(want_stop, wait); });
    if (!s.ok()) service.wait_streams_released(serve::Clock::now() + std::chrono::seconds(5));
    return s;
  };
}

}  // namespace genbridge::tools
