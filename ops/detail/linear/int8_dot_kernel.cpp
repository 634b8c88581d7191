// int8 x int8 -> int32 dot kernel (contract: ops/detail/linear/int8_dot_kernel.h). Per K chunk of one
// int16 vector: both operands are sign-extended to int16, multiplied pairwise into int32 lanes and
// accumulated (ReorderWidenMulAccumulate); a tile of MR input rows x NR weight rows shares each widened
// weight vector. Integer arithmetic: the lane order does not matter for the result.
#include "ops/detail/linear/int8_dot_kernel.h"

#include <cstddef>
#include <cstdint>

#include "core/simd/dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/detail/linear/int8_dot_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace genbridge::ops::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <int MR, int NR>
HWY_NOINLINE void Int8Tile(const int8_t* HWY_RESTRICT a, int64_t lda, const int8_t* HWY_RESTRICT b, int64_t ldb,
                           int64_t K, int32_t* HWY_RESTRICT out, int64_t ldo) {
  const hn::ScalableTag<int16_t> d16;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  using V32 = hn::Vec<decltype(d32)>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d16));
  V32 acc0[MR][NR], acc1[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) acc0[r][c] = acc1[r][c] = hn::Zero(d32);
  }
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    hn::Vec<decltype(d16)> av[MR];
    for (int r = 0; r < MR; ++r) av[r] = hn::PromoteTo(d16, hn::LoadU(d8, a + r * lda + k));
    for (int c = 0; c < NR; ++c) {
      const auto bv = hn::PromoteTo(d16, hn::LoadU(d8, b + c * ldb + k));
      for (int r = 0; r < MR; ++r) acc0[r][c] = hn::ReorderWidenMulAccumulate(d32, av[r], bv, acc0[r][c], acc1[r][c]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) {
      int32_t s = hn::GetLane(hn::SumOfLanes(d32, hn::Add(acc0[r][c], acc1[r][c])));
      for (int64_t t = k; t < K; ++t) s += int32_t{a[r * lda + t]} * int32_t{b[c * ldb + t]};
      out[r * ldo + c] = s;
    }
  }
}

void Int8DotRows(const int8_t* a, int64_t lda, int64_t m, const int8_t* b, int64_t ldb, int64_t n, int64_t K,
                 int32_t* out, int64_t ldo) {
  constexpr int MR = 4, NR = 2;
  int64_t r = 0;
  for (; r + MR <= m; r += MR) {
    int64_t c = 0;
    for (; c + NR <= n; c += NR) Int8Tile<MR, NR>(a + r * lda, lda, b + c * ldb, ldb, K, out + r * ldo + c, ldo);
    for (; c < n; ++c) Int8Tile<MR, 1>(a + r * lda, lda, b + c * ldb, ldb, K, out + r * ldo + c, ldo);
  }
  for (; r < m; ++r) {
    int64_t c = 0;
    for (; c + NR <= n; c += NR) Int8Tile<1, NR>(a + r * lda, lda, b + c * ldb, ldb, K, out + r * ldo + c, ldo);
    for (; c < n; ++c) Int8Tile<1, 1>(a + r * lda, lda, b + c * ldb, ldb, K, out + r * ldo + c, ldo);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace genbridge::ops::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(Int8DotRows);

Int8DotRowsFn int8_dot_rows_fn() { return GB_DISPATCH(Int8DotRows); }

}  // namespace genbridge::ops::detail
#endif
