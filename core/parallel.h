#pragma once
// Internal: row-parallel loops for host kernels. Work is split into contiguous chunks of whole items,
// so per-item results never depend on the thread count.

#include <algorithm>
#include <cstdint>

#include "genbridge/core/threading.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace genbridge::detail {

// Calls fn(begin, end) over [0, n) in chunks. Uses at most num_threads() threads, and only when
// n * cost_per_item exceeds ~min_work so that small calls stay on the caller's thread.
template <typename Fn>
void parallel_for(int64_t n, int64_t cost_per_item, Fn&& fn, int64_t min_work = 1 << 16) {
  if (n <= 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), n));
  if (threads <= 1 || n * cost_per_item < min_work) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
#ifdef _OPENMP
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
#else
    const int t = 0, nt = 1;
#endif
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t b = std::min<int64_t>(n, t * chunk);
    const int64_t e = std::min<int64_t>(n, b + chunk);
    if (b < e) fn(b, e);
  }
}

}  // namespace genbridge::detail
