// Internal kernel checks behind linear/quant_linear's W8A8 scheme: every path of the dispatched int8 dot
// kernel (batch-1..4 tiles with the weight sums in the same pass, the column-blocked tiles above 4 rows,
// the 64-row blocks, weight-row and K tails, row strides wider than K) gives, on every CPU target and with
// the avx512 VNNI path on and off, exactly the int32 sums of a naive scalar loop.
#include "ops/common/linear/int8_dot_kernel.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "genbridge/core/cpu_target.h"
#include "support/each_cpu_target.h"

namespace genbridge::testing {
namespace {

using ops::detail::int8_dot_rows_fn;
using ops::detail::int8_vnni_in_use;
using ops::detail::set_int8_vnni_allowed;

// The oracle: one int64 multiply-add at a time (no lanes, no tiles), checked to fit int32.
std::vector<int32_t> naive(const std::vector<int8_t>& a, int64_t lda, int64_t m, const std::vector<int8_t>& b,
                           int64_t ldb, int64_t n, int64_t K) {
  std::vector<int32_t> out(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      int64_t s = 0;
      for (int64_t k = 0; k < K; ++k) s += int64_t{a[r * lda + k]} * int64_t{b[c * ldb + k]};
      EXPECT_EQ(s, static_cast<int32_t>(s));
      out[r * n + c] = static_cast<int32_t>(s);
    }
  }
  return out;
}

// Runs the kernel under every CPU target (avx512 with and without VNNI) and compares with the oracle.
void check_everywhere(const std::vector<int8_t>& a, int64_t lda, int64_t m, const std::vector<int8_t>& b, int64_t ldb,
                      int64_t n, int64_t K, const std::string& what) {
  const std::vector<int32_t> want = naive(a, lda, m, b, ldb, n, K);
  for_each_cpu_target([&](const std::string& t) {
    for (bool vnni : {true, false}) {
      if (!vnni && t != "avx512") continue;
      set_int8_vnni_allowed(vnni);
      SCOPED_TRACE(what + (t == "avx512" ? (vnni ? " (vnni allowed)" : " (vnni off)") : ""));
      // Output rows wider than n, pre-filled: the kernel writes exactly its [m, n] block.
      const int64_t ldo = n + 3;
      std::vector<int32_t> out(static_cast<size_t>(m * ldo), -7);
      int8_dot_rows_fn()(a.data(), lda, m, b.data(), ldb, n, K, out.data(), ldo);
      int bad = 0;
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < ldo; ++c) {
          const int32_t got = out[r * ldo + c], exp = c < n ? want[r * n + c] : -7;
          if (got != exp && bad++ < 5) ADD_FAILURE() << "row " << r << " col " << c << ": " << got << " vs " << exp;
        }
      }
    }
    set_int8_vnni_allowed(true);
  });
}

std::vector<int8_t> random_int8(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(-128, 127);
  std::vector<int8_t> v(count);
  for (auto& x : v) x = static_cast<int8_t>(dist(rng));
  return v;
}

TEST(Int8DotKernel, every_path_and_tail_is_bit_exact_on_every_cpu_target) {
  // M: batch-1..4 tiles (in-pass sums), 5 and 17 (blocked tiles with 4/2/1-row remainders), 64 (one full
  // row block), 67 (a second block of 3). N: tile remainders of 4 and 2 weight rows, and 259 > one
  // column block at small K. K: below, at and around the 16/32/64-byte vectors.
  struct Case {
    int64_t m, n, K;
  };
  const Case cases[] = {{1, 1, 1},    {1, 7, 63},    {1, 259, 100}, {1, 37, 4096 + 17}, {2, 6, 65},
                        {3, 13, 129}, {4, 9, 31},    {5, 11, 200},  {17, 35, 96},       {17, 6, 1000},
                        {64, 21, 77}, {67, 259, 33}, {3, 4, 0}};
  for (const Case& cs : cases) {
    const std::string what = "M=" + std::to_string(cs.m) + " N=" + std::to_string(cs.n) + " K=" + std::to_string(cs.K);
    // Row strides wider than K (a view of a wider matrix).
    const int64_t lda = cs.K + 5, ldb = cs.K + 3;
    const std::vector<int8_t> a = random_int8(static_cast<size_t>(cs.m * lda), cs.m * 131 + cs.K);
    const std::vector<int8_t> b = random_int8(static_cast<size_t>(cs.n * ldb), cs.n * 7 + cs.K);
    check_everywhere(a, lda, cs.m, b, ldb, cs.n, cs.K, what);
  }
}

TEST(Int8DotKernel, extreme_values_near_the_int32_limit_are_exact) {
  // +-127 everywhere over a long K: the true sums reach 1.13e9, and the VNNI path's biased sum
  // (a + 128) * w passes 2^31 and wraps before the weight-sum correction brings it back.
  const int64_t K = 70001, n = 5;
  for (int64_t m : {1, 6}) {
    std::vector<int8_t> a(static_cast<size_t>(m * K)), b(static_cast<size_t>(n * K));
    for (int64_t i = 0; i < m * K; ++i) a[i] = static_cast<int8_t>(i % (K + 1) == 0 ? -127 : 127);
    for (int64_t c = 0; c < n; ++c) {
      for (int64_t k = 0; k < K; ++k) b[c * K + k] = static_cast<int8_t>(c % 2 == 0 ? 127 : (k % 3 == 0 ? 127 : -127));
    }
    check_everywhere(a, K, m, b, K, n, K, "extremes M=" + std::to_string(m));
  }
}

TEST(Int8DotKernel, vnni_path_runs_exactly_on_avx512_cpus_with_vnni) {
  for_each_cpu_target([&](const std::string& t) {
#if defined(__x86_64__)
    const bool cpu_vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#else
    const bool cpu_vnni = false;
#endif
    EXPECT_EQ(int8_vnni_in_use(), (t == "avx512" || t == "avx512_bf16") && cpu_vnni);
    set_int8_vnni_allowed(false);
    EXPECT_FALSE(int8_vnni_in_use());
    set_int8_vnni_allowed(true);
  });
}

}  // namespace
}  // namespace genbridge::testing
