#include "ops/common/kv_cache/kv_write.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "genbridge/core/formats.h"
#include "genbridge/ops/kv_cache/int8_kv_write.h"
#include "ops/common/kv_cache/kv_layout.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"

#ifndef GENBRIDGE_KV_WRITE_ONCE_
#define GENBRIDGE_KV_WRITE_ONCE_
namespace genbridge::ops::detail {
namespace {

Status check_slots(const KvWriteCall& c, const KvGeometry& g, int64_t num_tokens) {
  const TensorView& sm = c.slot_mapping;
  const std::string n = std::to_string(num_tokens);
  const char* want = c.slots == SlotMapping::kFlat               ? "[num_tokens] (flat slots)"
                     : c.slots == SlotMapping::kBlockOffsetPairs ? "[num_tokens, 2] ([block, offset] pairs)"
                                                                 : "[num_tokens] (flat slots) or [num_tokens, 2] ([block, offset] pairs)";
  if (sm.dtype() != DType::kI32) {
    return invalid_argument(s(c.op) + ": slot_mapping has dtype " + s(dtype_name(sm.dtype())) + " but must be int32");
  }
  const bool flat_ok = c.slots != SlotMapping::kBlockOffsetPairs && sm.rank() == 1 && sm.dim(0) == num_tokens;
  const bool pairs_ok = c.slots != SlotMapping::kFlat && sm.rank() == 2 && sm.dim(0) == num_tokens && sm.dim(1) == 2;
  if (!flat_ok && !pairs_ok) {
    return invalid_argument(s(c.op) + ": slot_mapping has shape " + sm.shape_string() + " but must be " + want +
                            " with num_tokens = " + n);
  }
  GB_RETURN_IF_ERROR(check_host_data(c.op, "slot_mapping", sm));
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (flat_ok) {
      const int64_t slot = at_i32(sm, t);
      if (slot < 0 || slot >= g.num_slots()) {
        return invalid_argument(s(c.op) + ": slot_mapping[" + std::to_string(t) + "] = " + std::to_string(slot) +
                                " is outside the cache's " + std::to_string(g.num_slots()) +
                                " slots (num_blocks * block_size)");
      }
    } else {
      const int64_t b = at_i32(sm, t, 0), o = at_i32(sm, t, 1);
      if (b < 0 || b >= g.num_blocks || o < 0 || o >= g.block_size) {
        return invalid_argument(s(c.op) + ": slot_mapping[" + std::to_string(t) + "] = [" + std::to_string(b) + ", " +
                                std::to_string(o) + "] is outside the cache: block must be in [0, " +
                                std::to_string(g.num_blocks) + ") and offset in [0, " + std::to_string(g.block_size) +
                                ")");
      }
    }
  }
  return ok_status();
}

}  // namespace
}  // namespace genbridge::ops::detail
#endif  // GENBRIDGE_KV_WRITE_ONCE_

// ---- per CPU target: the rows of a range of kv heads (every target gives the same bits) ----
#define HWY_TARGET_INCLUDE "ops/common/kv_cache/kv_write.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "core/simd/formats8-inl.h"
#include "ops/common/quant/absmax-inl.h"
#include "ops/common/tensor/kernels-inl.h"
#include "ops/common/tensor/rows-inl.h"

GB_OPS_KERNELS_BEGIN();

// Writes one fp32 row into row `r` of `cache` (and its scale) in the cache's representation.
HWY_INLINE void StoreRow(const KvWriteCall& c, const float* x, int64_t d, const TensorView& cache,
                         const TensorView& scales, int64_t r, int64_t row_bytes) {
  uint8_t* row = static_cast<uint8_t*>(cache.data()) + r * row_bytes;
  switch (c.cache.format) {
    case KvCacheFormat::kBf16: ConvertRow(x, reinterpret_cast<bf16_t*>(row), d); return;
    case KvCacheFormat::kInt8Fp16Scale: {
      const float amax = AbsMaxSkippingNaN(x, d);
      const fp16_t stored = float_to_fp16((amax > kInt8KvScaleTinyAmax ? amax : kInt8KvScaleTinyAmax) / 127.0f);
      const float scale = fp16_to_float(stored);
      int8_t* out = reinterpret_cast<int8_t*>(row);
      const V16 vs = Set16(scale);
      int64_t i = 0;
      for (; i + kLanes <= d; i += kLanes) StoreBytes16(out + i, EncodeInt8_16(Load16(x + i) / vs));
      if (i < d) StoreBytesTail16(out + i, EncodeInt8_16(LoadTail16(x + i, d - i) / vs), d - i);
      scales.data_as<fp16_t>()[r] = stored;
      return;
    }
    case KvCacheFormat::kFp8Fp32PackedScale: c.encode_row(x, d, row); return;
  }
}

// One row of `t` (rank 3, row = token * heads + head) as fp32.
HWY_INLINE void LoadRow(const TensorView& t, int64_t src_row, int64_t d, float* x) {
  if (t.stride(2) == 1 || d <= 1) {
    const int64_t off = row_offset(t, 1, src_row) * static_cast<int64_t>(dtype_size(t.dtype()));
    LoadRowF32Contiguous(t.dtype(), static_cast<const uint8_t*>(t.data()) + off, d, x);
  } else {
    load_row_f32(t, 1, src_row, d, x);
  }
}

void WriteHeads(const KvWriteCall& c, const KvGeometry& g, int64_t h0, int64_t h1) {
  const bool flat = c.slot_mapping.rank() == 1;
  const int64_t d = g.head_dim, num_tokens = c.key.dim(0);
  thread_local std::vector<float> x;  // grows once per thread; steady-state writes do not allocate
  if (x.size() < static_cast<size_t>(d)) x.resize(static_cast<size_t>(d));
  for (int64_t h = h0; h < h1; ++h) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      int64_t block, offset;
      if (flat) {
        const int64_t slot = at_i32(c.slot_mapping, t);
        block = slot / g.block_size;
        offset = slot % g.block_size;
      } else {
        block = at_i32(c.slot_mapping, t, 0);
        offset = at_i32(c.slot_mapping, t, 1);
      }
      const int64_t r = g.row(block, h, offset);
      const int64_t src_row = t * g.num_kv_heads + h;
      LoadRow(c.key, src_row, d, x.data());
      StoreRow(c, x.data(), d, c.cache.key_cache, c.cache.key_scale_cache, r, g.row_bytes);
      LoadRow(c.value, src_row, d, x.data());
      StoreRow(c, x.data(), d, c.cache.value_cache, c.cache.value_scale_cache, r, g.row_bytes);
    }
  }
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(WriteHeads);

Status run_kv_write(const KvWriteCall& c) {
  GB_RETURN_IF_ERROR(check_float_input(c.op, "key", c.key));
  if (c.key.rank() != 3) {
    return invalid_argument(s(c.op) + ": key has shape " + c.key.shape_string() +
                            " but must have rank 3 [num_tokens, num_kv_heads, head_dim]");
  }
  GB_RETURN_IF_ERROR(check_same_shape_dtype(c.op, "value", c.value, "key", c.key));
  GB_ASSIGN_OR_RETURN(const KvGeometry g, check_kv_cache(c.op, c.cache));
  if (c.key.dim(1) != g.num_kv_heads || c.key.dim(2) != g.head_dim) {
    return invalid_argument(s(c.op) + ": key has shape " + c.key.shape_string() + " but the cache holds " +
                            std::to_string(g.num_kv_heads) + " kv heads of head_dim " + std::to_string(g.head_dim));
  }
  const int64_t num_tokens = c.key.dim(0);
  GB_RETURN_IF_ERROR(check_slots(c, g, num_tokens));
  if (c.cache.format == KvCacheFormat::kFp8Fp32PackedScale && c.encode_row == nullptr) {
    return internal_error(s(c.op) + ": the cache is " + s(kv_cache_format_name(c.cache.format)) +
                          " but the provider supplied no row encoder for it");
  }
  if (num_tokens == 0) return ok_status();

  auto* write_heads = &GB_DISPATCH(WriteHeads);  // the CPU target is chosen once per call
  ::genbridge::detail::parallel_for(g.num_kv_heads, num_tokens * g.head_dim * 8,
                                    [&](int64_t h0, int64_t h1) { write_heads(c, g, h0, h1); });
  return ok_status();
}

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
