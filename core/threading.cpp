#include "genbridge/core/threading.h"

#include <atomic>
#include <cstdlib>
#include <thread>

namespace genbridge {
namespace {
int default_threads() {
  if (const char* env = std::getenv("GENBRIDGE_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}
std::atomic<int> g_threads{0};
}  // namespace

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n <= 0) {
    n = default_threads();
    g_threads.store(n, std::memory_order_relaxed);
  }
  return n;
}

void set_num_threads(int n) { g_threads.store(n > 0 ? n : default_threads(), std::memory_order_relaxed); }

}  // namespace genbridge
