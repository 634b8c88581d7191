#pragma once
// Internal: the int8 x int8 -> int32 dot kernel behind linear/quant_linear's W8A8 scheme
// (ops/detail/linear/int8_dot_kernel.cpp, compiled once per CPU target and dispatched at run time).
// Integer sums are exact, so every target and every tiling gives the same bits (K <= kW8A8MaxK).

#include <cstdint>

namespace genbridge::ops::detail {

// out[r * ldo + c] = sum_k a[r * lda + k] * b[c * ldb + k] (int32, exact) for r < m, c < n.
using Int8DotRowsFn = void (*)(const int8_t* a, int64_t lda, int64_t m, const int8_t* b, int64_t ldb, int64_t n,
                               int64_t K, int32_t* out, int64_t ldo);

// The kernel for the CPU target in use (GENBRIDGE_CPU_TARGET applied first). Call once per op call.
Int8DotRowsFn int8_dot_rows_fn();

}  // namespace genbridge::ops::detail
