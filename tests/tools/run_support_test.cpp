// The run path's pool sizing: refused from arithmetic, before anything is allocated (before: a budget of
// 100000000 MiB took 12 s to fail, one of 8796093022208 MiB reported a negative budget), and the
// automatic size covers the busiest attention rank's requests (request r goes to rank r % A).
#include "tools/run_support.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace genbridge::tools {
namespace {

int64_t phys_mib() { return static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE) >> 20; }

// 2 layers x 2 kv heads x (K + V) x 256 bytes = 2048 bytes per token, 256 KiB per page of 128 tokens.
runtime::KvPageGeometry small_pages() {
  return {.num_layers = 2, .num_kv_heads = 2, .page_size = 128, .row_bytes = 256};
}

// The pages of each pool as the run path sizes them: the flag read by kv_pool_options, the pool sized by
// engine::plan_kv_pool.
Result<int64_t> kv_pool_pages(const RunOptions& o, const runtime::KvPageGeometry& g,
                              const std::vector<engine::Request>& reqs, int num_pools, int pools_in_process) {
  GB_ASSIGN_OR_RETURN(const engine::KvPoolPlan plan,
                      engine::plan_kv_pool(kv_pool_options(o, num_pools, pools_in_process), g, reqs));
  return plan.pages;
}

std::vector<engine::Request> requests(std::vector<int> prompt_lens, int max_new) {
  std::vector<engine::Request> r;
  for (int n : prompt_lens)
    r.push_back({.prompt = std::vector<int32_t>(static_cast<size_t>(n), 1), .max_new_tokens = max_new});
  return r;
}

TEST(KvPoolPages, budget_in_pages) {
  RunOptions o;
  o.kv_memory_mb = 3;  // 3 MiB / 256 KiB = 12 pages
  EXPECT_EQ(kv_pool_pages(o, small_pages(), requests({10}, 2), 1, 1).value(), 12);
}

TEST(KvPoolPages, automatic_size_is_the_busiest_ranks_requests) {
  RunOptions o;
  // One new token: a request holds its prompt's tokens. 129 tokens: 2 pages; 10: 1; 257: 3; 10: 1; 10: 1.
  const auto reqs = requests({129, 10, 257, 10, 10}, 1);
  EXPECT_EQ(kv_pool_pages(o, small_pages(), reqs, 1, 1).value(), 2 + 1 + 3 + 1 + 1);
  // Two ranks: rank 0 gets requests 0, 2, 4 (2 + 3 + 1 pages), rank 1 gets 1, 3 (1 + 1).
  EXPECT_EQ(kv_pool_pages(o, small_pages(), reqs, 2, 2).value(), 6);
  // Three ranks: 0 and 3 (3 pages), 1 and 4 (2), 2 (3).
  EXPECT_EQ(kv_pool_pages(o, small_pages(), reqs, 3, 3).value(), 3);
}

TEST(KvPoolPages, a_budget_without_a_page_is_refused) {
  RunOptions o;
  o.kv_memory_mb = 1;
  // 8 layers x 8 heads x 2 x 1024 bytes = 128 KiB per token, 16 MiB per page.
  const runtime::KvPageGeometry big{.num_layers = 8, .num_kv_heads = 8, .page_size = 128, .row_bytes = 1024};
  EXPECT_EQ(kv_pool_pages(o, big, requests({1}, 1), 1, 1).status().message(),
            "--kv-memory-mb 1: holds no KV page of this model (16777216 bytes: 128 tokens x 131072 bytes per token); "
            "give at least 16");
}

TEST(KvPoolPages, more_than_physical_memory_is_refused_before_allocating) {
  const int64_t phys = phys_mib();
  ASSERT_GT(phys, 4);
  RunOptions o;
  // One pool fits, but `run --afd 3A1F` holds three of them in this process.
  o.kv_memory_mb = phys / 2;
  ASSERT_TRUE(kv_pool_pages(o, small_pages(), requests({1}, 1), 3, 1).ok());
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = kv_pool_pages(o, small_pages(), requests({1}, 1), 3, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
  const int64_t pages = (o.kv_memory_mb << 20) / (256 << 10);
  EXPECT_EQ(r.status().message(),
            "--kv-memory-mb " + std::to_string(o.kv_memory_mb) +
                " for each of the 3 attention ranks in this process: " + std::to_string(pages * 3 / 4) +
                " MiB in all, more than this machine's physical memory (" + std::to_string(phys) + " MiB)");
  // The automatic size: 4 requests of 2^20 new tokens at 128 KiB per token = 512 GiB, or more than memory.
  o.kv_memory_mb = 0;
  const runtime::KvPageGeometry big{.num_layers = 8, .num_kv_heads = 8, .page_size = 128, .row_bytes = 1024};
  const auto a = kv_pool_pages(o, big, requests({1, 1, 1, 1}, 1 << 20), 1, 1);
  if (phys < (int64_t{512} << 10)) {
    EXPECT_EQ(a.status().message(),
              "--kv-memory-mb 0 (room for every request at once): 524288 MiB of KV cache, more than this machine's "
              "physical memory (" +
                  std::to_string(phys) + " MiB); give a budget in MiB (requests then wait for pages)");
  }
}

}  // namespace
}  // namespace genbridge::tools
