#include "support/bench_util.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/parallel.h"

namespace genbridge::bench {

double copy_gbps(size_t bytes_moved) {
  static std::mutex mu;
  static std::map<size_t, double> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(bytes_moved); it != cache.end()) return it->second;
  const size_t n = std::max<size_t>(64, bytes_moved / 2);
  std::vector<char> src(n, 1), dst(n, 0);
  const int64_t chunk = 4096;
  const int64_t chunks = static_cast<int64_t>((n + chunk - 1) / chunk);
  auto copy = [&] {
    genbridge::detail::parallel_for(chunks, chunk, [&](int64_t b, int64_t e) {
      const size_t lo = static_cast<size_t>(b * chunk), hi = std::min(n, static_cast<size_t>(e * chunk));
      std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
    });
  };
  copy();
  double best = 1e30;
  const int reps = static_cast<int>(std::clamp<size_t>((size_t{1} << 30) / n, 5, 2000));
  for (int r = 0; r < 7; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) copy();
    benchmark::DoNotOptimize(dst.data());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  const double gbps = static_cast<double>(2 * n) / best / 1e9;
  cache[bytes_moved] = gbps;
  return gbps;
}

}  // namespace genbridge::bench
