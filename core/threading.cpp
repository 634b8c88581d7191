#include "genbridge/core/threading.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define GB_CPU_RELAX() _mm_pause()
#else
#define GB_CPU_RELAX() ((void)0)
#endif

namespace genbridge {
namespace {

// An invalid GENBRIDGE_NUM_THREADS is ignored here (kernels cannot fail on it); the CLI refuses it first.
int default_threads() {
  if (auto env = num_threads_from_env(); env.ok() && *env > 0) return *env;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(std::min<unsigned>(hw, kMaxNumThreads)) : 1;
}
std::atomic<int> g_threads{0};

// Spin iterations before a waiting thread sleeps (a few tens of microseconds).
constexpr int kSpin = 4000;

class Pool {
 public:
  static Pool& instance() {
    static Pool* p = new Pool();  // never destroyed: workers may outlive static destruction order
    return *p;
  }

  bool try_run(int parts, int64_t n, detail::ChunkFn fn, void* ctx) {
    parts = std::min(parts, 255);
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    ensure_workers(parts - 1);
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    parts_ = parts;
    remaining_.store(parts, std::memory_order_relaxed);
    const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;
    // Publishes the loop: parameters above happen-before any successful claim of one of its parts.
    claim_.store((gen << 32) | (static_cast<uint64_t>(parts) << 24), std::memory_order_release);
    generation_.store(gen, std::memory_order_release);
    generation_.notify_all();
    run_parts();  // the caller works too, so progress never depends on a sleeping worker
    for (int spin = 0;; ++spin) {
      const int left = remaining_.load(std::memory_order_acquire);
      if (left == 0) break;
      if (spin < kSpin) {
        GB_CPU_RELAX();
      } else {
        remaining_.wait(left, std::memory_order_acquire);
      }
    }
    return true;
  }

 private:
  // Claims and runs parts of the current loop until none are left. claim_ packs (generation, parts, next
  // part) so a claim succeeds only while its loop is unfinished; a successful claim therefore sees that
  // loop's parameters, which cannot change until every part (this one included) is done.
  void run_parts() {
    uint64_t c = claim_.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t parts = (c >> 24) & 0xff, next = c & 0xffffff;
      if (next >= parts) return;
      if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      const int64_t part = static_cast<int64_t>(next);
      const int64_t chunk = (n_ + parts_ - 1) / parts_;
      const int64_t b = std::min<int64_t>(n_, part * chunk), e = std::min<int64_t>(n_, b + chunk);
      if (b < e) fn_(ctx_, b, e);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_one();
      c = claim_.load(std::memory_order_acquire);
    }
  }

  void ensure_workers(int count) {
    while (static_cast<int>(workers_.size()) < count) {
      workers_.emplace_back([this] { worker(); });
      workers_.back().detach();
    }
  }

  void worker() {
    uint64_t seen = generation_.load(std::memory_order_acquire);
    for (;;) {
      for (int spin = 0;; ++spin) {
        const uint64_t g = generation_.load(std::memory_order_acquire);
        if (g != seen) {
          seen = g;
          break;
        }
        if (spin < kSpin) {
          GB_CPU_RELAX();
        } else {
          generation_.wait(g, std::memory_order_acquire);
        }
      }
      run_parts();
    }
  }

  std::mutex run_mu_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  std::atomic<uint64_t> claim_{0};  // (generation << 32) | (parts << 24) | next part
  detail::ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 0;
};

}  // namespace

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n <= 0) {
    n = default_threads();
    g_threads.store(n, std::memory_order_relaxed);
  }
  return n;
}

void set_num_threads(int n) {
  g_threads.store(n > 0 ? std::min(n, kMaxNumThreads) : default_threads(), std::memory_order_relaxed);
}

Result<int> num_threads_from_env() {
  const char* env = std::getenv(kNumThreadsEnv.data());
  if (env == nullptr || *env == '\0') return 0;
  const std::string_view text(env);
  int n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 1 || n > kMaxNumThreads) {
    return invalid_argument(std::string(kNumThreadsEnv) + "=" + std::string(text) + ": expected an integer in [1, " +
                            std::to_string(kMaxNumThreads) + "] (unset it to use every core)");
  }
  return n;
}

namespace detail {
bool pool_try_run(int parts, int64_t n, ChunkFn fn, void* ctx) { return Pool::instance().try_run(parts, n, fn, ctx); }
}  // namespace detail

}  // namespace genbridge
