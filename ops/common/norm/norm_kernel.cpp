#include "ops/common/norm/norm_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <type_traits>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "ops/common/tensor/rows.h"

#ifndef GENBRIDGE_NORM_KERNEL_ONCE_
#define GENBRIDGE_NORM_KERNEL_ONCE_
namespace genbridge::ops::detail {
namespace {

Status validate_impl(const NormCall& c) {
  const std::string op = c.op;
  GB_RETURN_IF_ERROR(check_float_input(c.op, "x", c.x));
  const int k = c.weight.rank();
  if (k < 1 || k > c.x.rank()) {
    return invalid_argument(op + ": " + c.weight_name + " has rank " + std::to_string(k) +
                            " but must have rank 1.." + std::to_string(c.x.rank()) + " (x's rank)");
  }
  GB_RETURN_IF_ERROR(check_host_data(c.op, c.weight_name, c.weight));
  if (c.weight.dtype() != c.x.dtype()) {
    return invalid_argument(op + ": " + c.weight_name + " has dtype " + std::string(dtype_name(c.weight.dtype())) +
                            " but must have x's dtype " + std::string(dtype_name(c.x.dtype())));
  }
  for (int i = 0; i < k; ++i) {
    if (c.weight.dim(i) != c.x.dim(c.x.rank() - k + i)) {
      std::string trailing = "[";
      for (int j = 0; j < k; ++j) trailing += (j ? ", " : "") + std::to_string(c.x.dim(c.x.rank() - k + j));
      return invalid_argument(op + ": " + c.weight_name + " has shape " + c.weight.shape_string() +
                              " but must match x's trailing shape " + trailing + "]");
    }
  }
  if (c.weight.numel() == 0) {
    return invalid_argument(op + ": " + c.weight_name +
                            " has 0 elements; the normalised dimensions must be non-empty");
  }
  if (!std::isfinite(c.eps) || c.eps < 0.f) {
    char eps_text[32];
    std::snprintf(eps_text, sizeof eps_text, "%g", static_cast<double>(c.eps));
    return invalid_argument(op + ": eps is " + eps_text + " but must be finite and >= 0");
  }
  if (c.residual) GB_RETURN_IF_ERROR(check_same_shape_dtype(c.op, "residual", *c.residual, "x", c.x));
  GB_RETURN_IF_ERROR(check_same_shape_dtype(c.op, "y", c.y, "x", c.x));
  if (c.residual_sum) GB_RETURN_IF_ERROR(check_same_shape_dtype(c.op, "residual_sum", *c.residual_sum, "x", c.x));
  if (c.rstd) {
    const TensorView& r = *c.rstd;
    if (r.dtype() != DType::kF32) {
      return invalid_argument(op + ": rstd has dtype " + std::string(dtype_name(r.dtype())) + " but must be fp32");
    }
    bool good = r.rank() == c.x.rank();
    std::string want = "[";
    for (int d = 0; d < c.x.rank(); ++d) {
      const int64_t n = d < c.x.rank() - k ? c.x.dim(d) : 1;
      want += (d ? ", " : "") + std::to_string(n);
      if (good && r.dim(d) != n) good = false;
    }
    want += "]";
    if (!good) {
      return invalid_argument(op + ": rstd has shape " + r.shape_string() + " but must be " + want +
                              " (x's leading shape with the normalised dimensions set to 1)");
    }
    GB_RETURN_IF_ERROR(check_host_data(c.op, "rstd", r));
  }
  return ok_status();
}

}  // namespace
}  // namespace genbridge::ops::detail
#endif  // GENBRIDGE_NORM_KERNEL_ONCE_

// ---- per CPU target: the row loops (every target gives the same bits: same lanes, same operation order) ----
#define HWY_TARGET_INCLUDE "ops/common/norm/norm_kernel.cpp"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

HWY_INLINE float RstdOf(float sumsq, int64_t cols, float eps) {
  return 1.0f / std::sqrt(sumsq / static_cast<float>(cols) + eps);
}

// Sum of squares of an fp32 buffer (the any-stride path): two chains over 32 values, then one more 16.
HWY_INLINE float SumSquares(const float* v, int64_t n) {
  V16 a0 = Zero16(), a1 = Zero16();
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const V16 p = Load16(v + i), q = Load16(v + i + kLanes);
    a0 = a0 + p * p;
    a1 = a1 + q * q;
  }
  if (i + kLanes <= n) {
    const V16 p = Load16(v + i);
    a0 = a0 + p * p;
    i += kLanes;
  }
  float s = ReduceAdd16(a0 + a1);
  for (; i < n; ++i) s += v[i] * v[i];
  return s;
}

// Sum of squares of a contiguous row of T, widened in registers: four chains over 64 values (hiding the
// add latency), then 16 at a time into the first, combined in a fixed order.
template <typename T>
HWY_INLINE float SumSquaresRow(const T* v, int64_t n) {
  V16 a0 = Zero16(), a1 = Zero16(), a2 = Zero16(), a3 = Zero16();
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    const V16 p0 = Load16(v + i), p1 = Load16(v + i + kLanes);
    const V16 p2 = Load16(v + i + 2 * kLanes), p3 = Load16(v + i + 3 * kLanes);
    a0 = a0 + p0 * p0;
    a1 = a1 + p1 * p1;
    a2 = a2 + p2 * p2;
    a3 = a3 + p3 * p3;
  }
  for (; i + kLanes <= n; i += kLanes) {
    const V16 p = Load16(v + i);
    a0 = a0 + p * p;
  }
  float s = ReduceAdd16((a0 + a1) + (a2 + a3));
  for (; i < n; ++i) s += to_f32(v[i]) * to_f32(v[i]);
  return s;
}

// ---- non-temporal row stores (outputs larger than the caches) ----
// Whether Stream16 can store T: each hardware part of a V16 fills at least 16 bytes (Highway rounds a partial
// vector's non-temporal store up to 16 bytes) and the target converts T in registers.
template <typename T>
inline constexpr bool kCanStream =
    kPart * static_cast<int>(sizeof(T)) >= 16 && (!std::is_same_v<T, fp16_t> || kNativeF16Demote);
// Bytes one part of a V16 of T fills: the alignment Stream16 needs.
template <typename T>
inline constexpr size_t kPartBytes = static_cast<size_t>(kPart) * sizeof(T);

// Store16's conversions and bits, written with non-temporal stores (y aligned to kPartBytes<T>): the lines go
// to memory without being read first, and do not evict the caches.
HWY_INLINE void Stream16(float* y, V16 v) {
  GB_UNROLL for (int i = 0; i < kParts; ++i) hn::Stream(v.p[i], DF(), y + i * kPart);
}
HWY_INLINE void Stream16(bf16_t* y, V16 v) {
  const hn::Rebind<uint16_t, DI> d16;
  auto* py = reinterpret_cast<uint16_t*>(y);
  GB_UNROLL for (int i = 0; i < kParts; ++i) hn::Stream(Bf16BitsPart(v.p[i]), d16, py + i * kPart);
}
HWY_INLINE void Stream16(fp16_t* y, V16 v) {
  if constexpr (kNativeF16Demote) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    auto* py = reinterpret_cast<hwy::float16_t*>(y);
    GB_UNROLL for (int i = 0; i < kParts; ++i) hn::Stream(hn::DemoteTo(dh, v.p[i]), dh, py + i * kPart);
  } else {
    Store16(y, v);
  }
}

// Contiguous fast path for one element type: two passes over the (cache-resident) row. The second pass
// prefetches the next row's inputs, so their memory reads overlap this row's arithmetic (without it a
// row's reads from memory and its arithmetic ran one after the other: half the copy bandwidth on rows
// beyond the caches).
// With `stream`, rows whose y is aligned for it are written with non-temporal stores (Stream16).
template <typename T>
void NormRowsContiguousT(const NormCall& c, int k, int64_t cols, const float* w, int64_t r0, int64_t r1,
                         bool stream) {
  bool streamed = false;
  const T* const x0 = c.x.data_as<const T>();
  const T* const res0 = c.residual ? c.residual->data_as<const T>() : nullptr;
  for (int64_t r = r0; r < r1; ++r) {
    const T* src = x0 + row_offset(c.x, k, r);
    // The next row's x (and residual); this row again when there is none (already cached: harmless).
    const bool more = r + 1 < r1;
    const T* pf_x = more ? x0 + row_offset(c.x, k, r + 1) : src;
    const T* pf_res = pf_x;
    if (c.residual) {
      // residual_sum = round(x + residual); the rounded sum is what gets normalised.
      const T* rr = res0 + row_offset(*c.residual, k, r);
      pf_res = more ? res0 + row_offset(*c.residual, k, r + 1) : rr;
      T* sr = c.residual_sum->data_as<T>() + row_offset(*c.residual_sum, k, r);
      int64_t i = 0;
      for (; i + kLanes <= cols; i += kLanes) Store16(sr + i, Load16(src + i) + Load16(rr + i));
      for (; i < cols; ++i) sr[i] = from_f32<T>(to_f32(src[i]) + to_f32(rr[i]));
      src = sr;
    }
    const float rs = RstdOf(SumSquaresRow(src, cols), cols, c.eps);
    if (c.rstd) c.rstd->data_as<float>()[row_offset(*c.rstd, k, r)] = rs;
    T* yr = c.y.data_as<T>() + row_offset(c.y, k, r);
    const V16 vrs = Set16(rs);
    int64_t i = 0;
    if constexpr (kCanStream<T>) {
      const auto mis = reinterpret_cast<uintptr_t>(yr) % kPartBytes<T>;
      if (stream && mis % sizeof(T) == 0) {
        // Elements up to the first aligned one on the scalar path (each element's arithmetic is on its own,
        // so the bits do not depend on which path computes it), then whole V16s streamed.
        const int64_t head =
            std::min<int64_t>(cols, static_cast<int64_t>((kPartBytes<T> - mis) % kPartBytes<T> / sizeof(T)));
        for (; i < head; ++i) yr[i] = from_f32<T>((to_f32(src[i]) * rs) * w[i]);
        streamed = true;
        for (; i + kLanes <= cols; i += kLanes) {
          __builtin_prefetch(pf_x + i);
          __builtin_prefetch(pf_res + i);
          Stream16(yr + i, (Load16(src + i) * vrs) * Load16(w + i));
        }
      }
    }
    for (; i + kLanes <= cols; i += kLanes) {
      __builtin_prefetch(pf_x + i);
      __builtin_prefetch(pf_res + i);
      Store16(yr + i, (Load16(src + i) * vrs) * Load16(w + i));
    }
    for (; i < cols; ++i) yr[i] = from_f32<T>((to_f32(src[i]) * rs) * w[i]);
  }
  if (streamed) hwy::FlushStream();  // order the non-temporal stores before the caller's join
}

void NormRowsContiguous(const NormCall& c, int k, int64_t cols, const float* w, int64_t r0, int64_t r1,
                        bool stream) {
  switch (c.x.dtype()) {
    case DType::kF32: NormRowsContiguousT<float>(c, k, cols, w, r0, r1, stream); return;
    case DType::kF16: NormRowsContiguousT<fp16_t>(c, k, cols, w, r0, r1, stream); return;
    default: NormRowsContiguousT<bf16_t>(c, k, cols, w, r0, r1, stream); return;
  }
}

// Any-stride path: same arithmetic, element access through offsets.
void NormRowsStrided(const NormCall& c, int k, int64_t cols, const float* w, int64_t r0, int64_t r1, float* buf,
                     float* tmp) {
  for (int64_t r = r0; r < r1; ++r) {
    load_row_f32(c.x, k, r, cols, buf);
    if (c.residual) {
      load_row_f32(*c.residual, k, r, cols, tmp);
      for (int64_t i = 0; i < cols; ++i) buf[i] = round_to_dtype(buf[i] + tmp[i], c.x.dtype());
      store_row_f32(*c.residual_sum, k, r, cols, buf);
    }
    const float rs = RstdOf(SumSquares(buf, cols), cols, c.eps);
    if (c.rstd) c.rstd->data_as<float>()[row_offset(*c.rstd, k, r)] = rs;
    const V16 vrs = Set16(rs);
    int64_t i = 0;
    for (; i + kLanes <= cols; i += kLanes) Store16(tmp + i, (Load16(buf + i) * vrs) * Load16(w + i));
    for (; i < cols; ++i) tmp[i] = (buf[i] * rs) * w[i];
    store_row_f32(c.y, k, r, cols, tmp);
  }
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(NormRowsContiguous);
HWY_EXPORT(NormRowsStrided);

namespace {
// Size in bytes of the highest-level data or unified cache of CPU 0 (/sys/devices/system/cpu; sysconf's
// figure is wrong on some virtual machines), 0 when the system does not say.
size_t last_level_cache_bytes() {
  size_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    int level = 0;
    std::string type, size;
    if (!(level_file >> level) || !(type_file >> type) || !(size_file >> size)) continue;
    if (type == "Instruction" || level < best_level || size.empty()) continue;
    size_t n = 0;
    size_t at = 0;
    while (at < size.size() && size[at] >= '0' && size[at] <= '9') n = n * 10 + static_cast<size_t>(size[at++] - '0');
    if (at < size.size()) n <<= size[at] == 'K' ? 10 : size[at] == 'M' ? 20 : size[at] == 'G' ? 30 : 0;
    best_level = level;
    best = n;
  }
  return best;
}

// Half the last-level cache (16 MiB where the system does not say).
size_t stream_threshold_bytes() {
  static const size_t bytes = [] {
    const size_t llc = last_level_cache_bytes();
    return llc > 0 ? llc / 2 : size_t{16} << 20;
  }();
  return bytes;
}
}  // namespace

Status validate_norm(const NormCall& c) { return validate_impl(c); }

Status run_norm(const NormCall& c) {
  GB_RETURN_IF_ERROR(validate_impl(c));
  const int k = c.weight.rank();
  const int64_t cols = c.weight.numel();
  const int64_t rows = c.x.numel() / cols;
  if (rows == 0) return ok_status();

  // The effective weight in fp32, in a per-thread buffer that grows once (decode calls are small and
  // frequent; a fresh zero-filled vector per call showed up in profiles).
  thread_local std::vector<float> w_buffer;
  if (w_buffer.size() < static_cast<size_t>(cols)) w_buffer.resize(static_cast<size_t>(cols));
  float* const w = w_buffer.data();  // workers use this thread's buffer through the pointer
  load_row_f32(c.weight, k, 0, cols, w);
  if (c.form == WeightForm::kOnePlusInFp32) {
    for (int64_t i = 0; i < cols; ++i) w[i] = 1.0f + w[i];
  }

  bool contiguous = trailing_contiguous(c.x, k) && trailing_contiguous(c.y, k);
  if (c.residual) contiguous = contiguous && trailing_contiguous(*c.residual, k) && trailing_contiguous(*c.residual_sum, k);

  // An output larger than half the last-level cache cannot stay cached for its reader: it is written with
  // non-temporal stores (no read of each line before its write), as a large memcpy does.
  const bool stream = static_cast<size_t>(c.y.numel()) * dtype_size(c.y.dtype()) >= stream_threshold_bytes();

  // The CPU target is chosen once per call; every worker runs that target's loops.
  auto* contiguous_rows = &GB_DISPATCH(NormRowsContiguous);
  auto* strided_rows = &GB_DISPATCH(NormRowsStrided);
  genbridge::detail::parallel_for(rows, cols, [&](int64_t r0, int64_t r1) {
    if (contiguous) {
      contiguous_rows(c, k, cols, w, r0, r1, stream);
    } else {
      std::vector<float> buf(static_cast<size_t>(cols)), tmp(static_cast<size_t>(cols));
      strided_rows(c, k, cols, w, r0, r1, buf.data(), tmp.data());
    }
  });
  return ok_status();
}

TensorView offset_weight_rounded(const TensorView& w, std::vector<uint32_t>& storage) {
  const int64_t n = w.numel();
  storage.assign(static_cast<size_t>((n * static_cast<int64_t>(dtype_size(w.dtype())) + 3) / 4), 0u);
  std::vector<float> v(static_cast<size_t>(n));
  load_row_f32(w, w.rank(), 0, n, v.data());
  for (float& x : v) x = 1.0f + x;
  TensorView out(storage.data(), w.dtype(), w.shape(), w.rank(), w.device());
  store_row_f32(out, out.rank(), 0, n, v.data());
  return out;
}

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
