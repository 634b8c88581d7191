#include "ops/common/kv_cache/mla_kv_write.h"

#include <string>
#include <vector>

#include "core/simd/dispatch.h"
#include "genbridge/core/formats.h"
#include "genbridge/ops/kv_cache/int8_kv_write.h"
#include "ops/common/kv_cache/mla_layout.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"

#ifndef GENBRIDGE_MLA_KV_WRITE_ONCE_
#define GENBRIDGE_MLA_KV_WRITE_ONCE_
namespace genbridge::ops::detail::mla_write {

// A [num_tokens, width] float input (width may be 0 only for `rope`).
inline Status check_rows(const char* op, const char* name, const TensorView& t, int64_t num_tokens, int64_t width,
                         const char* width_name) {
  GB_RETURN_IF_ERROR(check_float_input(op, name, t));
  if (t.rank() != 2 || (num_tokens >= 0 && t.dim(0) != num_tokens) || t.dim(1) != width) {
    return invalid_argument(s(op) + ": " + name + " has shape " + t.shape_string() + " but must be [num_tokens" +
                            (num_tokens >= 0 ? " = " + std::to_string(num_tokens) : s("")) + ", " + width_name +
                            " = " + std::to_string(width) + "]");
  }
  return ok_status();
}

}  // namespace genbridge::ops::detail::mla_write
#endif  // GENBRIDGE_MLA_KV_WRITE_ONCE_

#define HWY_TARGET_INCLUDE "ops/common/kv_cache/mla_kv_write.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "core/simd/formats8-inl.h"
#include "ops/common/quant/absmax-inl.h"
#include "ops/common/tensor/kernels-inl.h"
#include "ops/common/tensor/rows-inl.h"

GB_OPS_KERNELS_BEGIN();

// Row `t` of a rank-2 float tensor as fp32.
HWY_INLINE void LoadTokenRow(const TensorView& x, int64_t t, int64_t n, float* out) {
  if (n == 0) return;
  if (x.stride(1) == 1 || n == 1) {
    const auto* p = static_cast<const uint8_t*>(x.data()) + t * x.stride(0) * static_cast<int64_t>(dtype_size(x.dtype()));
    LoadRowF32Contiguous(x.dtype(), p, n, out);
  } else {
    load_row_f32(x, 1, t, n, out);
  }
}

// int8 codes of x / scale (clamped RNE) with scale = fp16(max(amax, tiny) / 127); returns the stored scale.
HWY_INLINE fp16_t EncodeInt8Row(const float* x, int64_t n, int8_t* out) {
  const float amax = AbsMaxSkippingNaN(x, n);
  const fp16_t stored = float_to_fp16((amax > kInt8KvScaleTinyAmax ? amax : kInt8KvScaleTinyAmax) / 127.0f);
  const V16 vs = Set16(fp16_to_float(stored));
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) StoreBytes16(out + i, EncodeInt8_16(Load16(x + i) / vs));
  if (i < n) StoreBytesTail16(out + i, EncodeInt8_16(LoadTail16(x + i, n - i) / vs), n - i);
  return stored;
}

void WriteMlaRows(const MlaKvWriteCall& c, const TokenCacheGeometry& g) {
  const int64_t L = g.width, R = g.rope_dim, num_tokens = c.latent.dim(0);
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(L + R)) buf.resize(static_cast<size_t>(L + R));
  float* x = buf.data();
  float* r = x + L;
  auto* base = static_cast<uint8_t*>(c.cache.kv_cache.data());
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_of(c.slot_mapping, t, g.block_size);
    LoadTokenRow(c.latent, t, L, x);
    LoadTokenRow(c.rope, t, R, r);
    uint8_t* row = base + slot * g.row_bytes;
    switch (c.format) {
      case MlaKvFormat::kBf16:
        ConvertRow(x, reinterpret_cast<bf16_t*>(row), L);
        ConvertRow(r, reinterpret_cast<bf16_t*>(row) + L, R);
        break;
      case MlaKvFormat::kInt8Fp16ScaleSplitRope:
        c.cache.scale_cache.data_as<fp16_t>()[slot] = EncodeInt8Row(x, L, reinterpret_cast<int8_t*>(row));
        ConvertRow(r, c.cache.rope_cache.data_as<bf16_t>() + slot * R, R);
        break;
      case MlaKvFormat::kFp8TileScalePacked:
      case MlaKvFormat::kMxfp8RopeFirstPacked: c.encode_row(x, L, r, R, row); break;
    }
  }
}

void WriteIndexerRows(const IndexerKeyWriteCall& c, const TokenCacheGeometry& g) {
  const int64_t D = g.width, num_tokens = c.key.dim(0);
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(D)) buf.resize(static_cast<size_t>(D));
  float* x = buf.data();
  auto* base = static_cast<uint8_t*>(c.cache.key_cache.data());
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_of(c.slot_mapping, t, g.block_size);
    LoadTokenRow(c.key, t, D, x);
    uint8_t* row = base + slot * g.row_bytes;
    switch (c.format) {
      case IndexerKeyFormat::kBf16: ConvertRow(x, reinterpret_cast<bf16_t*>(row), D); break;
      case IndexerKeyFormat::kFp8HadamardPackedScale: c.encode_row(x, D, nullptr, 0, row); break;
    }
  }
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(WriteMlaRows);
HWY_EXPORT(WriteIndexerRows);

using mla_write::check_rows;

Status run_mla_kv_write(const MlaKvWriteCall& c) {
  if (c.cache.format != c.format) {
    return invalid_argument(s(c.op) + ": the cache is " + s(mla_kv_format_name(c.cache.format)) + " but " + c.op +
                            " writes " + s(mla_kv_format_name(c.format)));
  }
  GB_ASSIGN_OR_RETURN(const TokenCacheGeometry g, check_mla_cache(c.op, c.cache));
  GB_RETURN_IF_ERROR(check_rows(c.op, "latent", c.latent, -1, g.width, "kv_lora_rank"));
  GB_RETURN_IF_ERROR(check_rows(c.op, "rope", c.rope, c.latent.dim(0), g.rope_dim, "rope_dim"));
  const int64_t num_tokens = c.latent.dim(0);
  GB_RETURN_IF_ERROR(check_slot_mapping(c.op, c.slot_mapping, c.slots ? &*c.slots : nullptr, num_tokens, g.num_blocks,
                                        g.block_size));
  if ((c.format == MlaKvFormat::kFp8TileScalePacked || c.format == MlaKvFormat::kMxfp8RopeFirstPacked) &&
      c.encode_row == nullptr) {
    return internal_error(s(c.op) + ": the provider supplied no row encoder for " + s(mla_kv_format_name(c.format)));
  }
  if (num_tokens == 0) return ok_status();
  GB_DISPATCH(WriteMlaRows)(c, g);
  return ok_status();
}

Status run_indexer_key_write(const IndexerKeyWriteCall& c) {
  if (c.cache.format != c.format) {
    return invalid_argument(s(c.op) + ": the cache is " + s(indexer_key_format_name(c.cache.format)) + " but " + c.op +
                            " writes " + s(indexer_key_format_name(c.format)));
  }
  GB_ASSIGN_OR_RETURN(const TokenCacheGeometry g, check_indexer_cache(c.op, c.cache));
  GB_RETURN_IF_ERROR(check_rows(c.op, "key", c.key, -1, g.width, "index_head_dim"));
  const int64_t num_tokens = c.key.dim(0);
  GB_RETURN_IF_ERROR(check_slot_mapping(c.op, c.slot_mapping, c.slots ? &*c.slots : nullptr, num_tokens, g.num_blocks,
                                        g.block_size));
  if (c.format == IndexerKeyFormat::kFp8HadamardPackedScale && c.encode_row == nullptr) {
    return internal_error(s(c.op) + ": the provider supplied no row encoder for " + s(indexer_key_format_name(c.format)));
  }
  if (num_tokens == 0) return ok_status();
  GB_DISPATCH(WriteIndexerRows)(c, g);
  return ok_status();
}

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
