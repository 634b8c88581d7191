// The kernel thread pool: every item runs exactly once, whatever the thread count, and concurrent
// callers (e.g. the ranks of an in-process AFD job) each get their whole loop done.
#include "core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace genbridge {
namespace {

TEST(ParallelFor, every_item_exactly_once_for_any_thread_count) {
  for (int threads : {1, 2, 3, 7}) {
    set_num_threads(threads);
    for (int64_t n : {1, 2, 5, 64, 1000, 100003}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      detail::parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n << " i " << i;
    }
  }
  set_num_threads(0);
}

TEST(ParallelForDynamic, every_item_exactly_once) {
  for (int threads : {1, 2, 5}) {
    set_num_threads(threads);
    for (int64_t n : {1, 3, 100, 5000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      detail::parallel_for_dynamic(n, [&](int64_t i) { hits[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n;
    }
  }
  set_num_threads(0);
}

TEST(ParallelFor, small_loops_stay_on_the_caller) {
  set_num_threads(4);
  const auto me = std::this_thread::get_id();
  detail::parallel_for(10, 1, [&](int64_t, int64_t) { EXPECT_EQ(std::this_thread::get_id(), me); });
  set_num_threads(0);
}

TEST(ParallelFor, concurrent_callers_all_complete) {
  set_num_threads(3);
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep) {
        std::atomic<int64_t> sum{0};
        detail::parallel_for(1000, 1 << 10, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
        EXPECT_EQ(sum.load(), 1000);
        total.fetch_add(sum.load());
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 200 * 1000);
  set_num_threads(0);
}

}  // namespace
}  // namespace genbridge
