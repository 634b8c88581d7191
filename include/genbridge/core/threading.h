#pragma once
// Worker threads of the host kernels, and the row-parallel loops they (and the runtime's load-time
// conversions) run on. Results never depend on the thread count where an op's contract says so: work is
// split into contiguous chunks of whole items, never inside a reduction.
//
// A small persistent pool runs the chunks (workers spin briefly, then sleep on a futex, so idle or
// oversubscribed processes do not burn cores). One loop runs on the pool at a time; a loop started while
// the pool is busy (e.g. from another thread of an in-process AFD job) runs on its caller's thread.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "genbridge/core/status.h"

namespace genbridge {

// Most threads one parallel loop uses (the pool's limit); larger requests are clamped to it.
inline constexpr int kMaxNumThreads = 255;
// The environment variable that sets the default thread count.
inline constexpr std::string_view kNumThreadsEnv = "GENBRIDGE_NUM_THREADS";

// Number of threads kernels may use (1..kMaxNumThreads). Defaults to GENBRIDGE_NUM_THREADS when it is
// valid (see num_threads_from_env), else the hardware count.
int num_threads();
// Sets the thread count for subsequent kernel calls; n <= 0 restores the default.
void set_num_threads(int n);
// The count GENBRIDGE_NUM_THREADS asks for: 0 when it is unset or empty; InvalidArgument naming the
// variable and its value when it is not a base-10 integer in [1, kMaxNumThreads]. Reads the environment.
Result<int> num_threads_from_env();

namespace detail {
using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end);
// Runs fn(ctx, b, e) over `parts` contiguous chunks of [0, n) on the pool (the caller runs chunk 0) and
// blocks until all are done. Returns false, having run nothing, when the pool is busy. Does not retain ctx.
bool pool_try_run(int parts, int64_t n, ChunkFn fn, void* ctx);
}  // namespace detail

// Calls fn(begin, end) over [0, n) (item counts) in contiguous chunks and blocks until all are done. Uses
// at most num_threads() threads, and only when n * cost_per_item exceeds min_work so that small calls stay
// on the caller's thread.
template <typename Fn>
void parallel_for(int64_t n, int64_t cost_per_item, Fn&& fn, int64_t min_work = 1 << 16) {
  if (n <= 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), n));
  if (threads > 1 && n * cost_per_item >= min_work) {
    auto thunk = [](void* ctx, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<Fn>*>(ctx))(b, e); };
    if (detail::pool_try_run(threads, n, thunk, &fn)) return;
  }
  fn(int64_t{0}, n);
}

// Calls fn(i) for every i in [0, n), handing items out one at a time to up to num_threads() threads
// (for items of uneven cost, e.g. sorted longest first), and blocks until all are done. Each item runs
// exactly once.
template <typename Fn>
void parallel_for_dynamic(int64_t n, Fn&& fn) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  auto drain = [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n; i = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(i);
    }
  };
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), n));
  if (threads > 1) {
    auto thunk = [](void* ctx, int64_t b, int64_t e) { (*static_cast<decltype(drain)*>(ctx))(b, e); };
    if (detail::pool_try_run(threads, threads, thunk, &drain)) return;
  }
  drain(0, 1);
}

}  // namespace genbridge
