#pragma once
// Internal: the normalized Walsh-Hadamard rotation of the fp8 indexer keys (kv_cache/kv_format.h,
// IndexerKeyFormat::kFp8HadamardPackedScale), shared by the key writer and the indexer's query rotation.

#include <cstdint>

namespace genbridge::ops::detail {

// x <- fwht(x) * fp32(1 / sqrt(n)) in fp32: the butterfly (a, b) -> (a + b, a - b) over strides 1, 2, 4,
// ..., n / 2, then one multiply per element. n must be a power of two. Plain scalar fp32 (the same bits on
// every CPU target: no fused operations).
void hadamard_rotate(float* x, int64_t n);

}  // namespace genbridge::ops::detail
