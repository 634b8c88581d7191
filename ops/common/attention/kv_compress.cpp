// attention/kv_compress (kv_compress.h), compiled once per CPU target with Highway: each output channel is
// one lane, so every target computes the same IEEE operations per element.
#ifndef GENBRIDGE_OPS_ATTENTION_KV_COMPRESS_SHARED_
#define GENBRIDGE_OPS_ATTENTION_KV_COMPRESS_SHARED_

#include "genbridge/ops/attention/kv_compress.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "genbridge/core/threading.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"

namespace genbridge::ops::detail::kv_compress {

struct Call {
  const TensorView* kv;
  const TensorView* gate;
  const float* ape;
  int64_t ratio, D, unused;
  bool overlap, has_previous;
  const TensorView* out;
};

}  // namespace genbridge::ops::detail::kv_compress
#endif  // GENBRIDGE_OPS_ATTENTION_KV_COMPRESS_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/attention/kv_compress.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/attention/vec_math-inl.h"
#include "ops/common/tensor/kernels-inl.h"
#include "ops/common/tensor/rows-inl.h"

GB_OPS_KERNELS_BEGIN();
namespace {
using kv_compress::Call;

// One slot: its kv and gate rows' first element (of the slot's half) and its ape row.
template <typename T>
struct Slot {
  const T* kv;
  const T* gate;
  const float* ape;
};

template <typename T>
HWY_INLINE V16 LoadN(const T* p, int64_t n) {
  return n >= kLanes ? Load16(p) : LoadTail16(p, n);
}

// Output window k over contiguous rows of T (channels in blocks of 16 lanes: per lane the max of the
// slots' scores, then the exp-weighted sum in slot order).
template <typename T>
void CompressWindowT(const Call& c, int64_t k, Slot<T>* slots) {
  const int64_t m = c.ratio, D = c.D;
  const auto* kv = static_cast<const T*>(c.kv->data());
  const auto* gate = static_cast<const T*>(c.gate->data());
  const int64_t rs = c.kv->stride(0), gs = c.gate->stride(0), width = (c.overlap ? 2 : 1) * D;
  int64_t n = 0;
  auto add = [&](int64_t row, int64_t c0, const float* ape_row) {
    slots[n++] = {kv + row * rs + c0, gate + row * gs + c0, ape_row};
  };
  if (!c.overlap) {
    for (int64_t i = 0; i < m; ++i) add(k * m + i, 0, c.ape + i * width);
  } else {
    const int64_t b = (k + 1) * m;
    if (k > 0 || c.has_previous) {
      for (int64_t i = 0; i < m; ++i) add(b - m + i, 0, c.ape + i * width);
    }
    for (int64_t i = 0; i < m; ++i) add(b + i, D, c.ape + i * width + D);
  }
  alignas(64) float res[kLanes];
  for (int64_t d = 0; d < D; d += kLanes) {
    const int64_t w = std::min<int64_t>(kLanes, D - d);
    V16 mx = LoadN(slots[0].gate + d, w) + LoadN(slots[0].ape + d, w);
    for (int64_t j = 1; j < n; ++j) mx = MaxGt16(mx, LoadN(slots[j].gate + d, w) + LoadN(slots[j].ape + d, w));
    V16 sum = Set16(0.f), acc = Set16(0.f);
    for (int64_t j = 0; j < n; ++j) {
      const V16 p = ExpNonpositive16(LoadN(slots[j].gate + d, w) + LoadN(slots[j].ape + d, w) - mx);
      sum = sum + p;
      acc = Fma16(p, LoadN(slots[j].kv + d, w), acc);
    }
    Store16(res, acc / sum);
    if (c.out->dtype() == DType::kF32 && c.out->stride(1) == 1) {
      std::memcpy(c.out->data_as<float>() + k * c.out->stride(0) + d, res, static_cast<size_t>(w) * sizeof(float));
    } else {
      for (int64_t i = 0; i < w; ++i) {
        if (c.out->dtype() == DType::kF32) {
          c.out->data_as<float>()[k * c.out->stride(0) + (d + i) * c.out->stride(1)] = res[i];
        } else {
          c.out->data_as<bf16_t>()[k * c.out->stride(0) + (d + i) * c.out->stride(1)] = float_to_bf16(res[i]);
        }
      }
    }
  }
}

// Output window k. kv and gate are contiguous along channels (the entry point copies strided inputs).
void CompressWindow(const Call& c, int64_t k, void* slots) {
  switch (c.kv->dtype()) {
    case DType::kBF16: CompressWindowT<bf16_t>(c, k, static_cast<Slot<bf16_t>*>(slots)); return;
    case DType::kF16: CompressWindowT<fp16_t>(c, k, static_cast<Slot<fp16_t>*>(slots)); return;
    default: CompressWindowT<float>(c, k, static_cast<Slot<float>*>(slots)); return;
  }
}

}  // namespace
GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops {
namespace detail {
HWY_EXPORT(CompressWindow);

Status run_kv_compress(const TensorView& kv, const TensorView& gate, const TensorView& ape, int64_t ratio, bool overlap,
                       bool has_previous, const TensorView& out) {
  const char* op = "kv_compress";
  if (ratio < 1) return invalid_argument(s(op) + ": ratio is " + n(ratio) + " but must be >= 1");
  GB_RETURN_IF_ERROR(check_float_input(op, "kv", kv));
  GB_RETURN_IF_ERROR(check_same_shape_dtype(op, "gate", gate, "kv", kv));
  const int64_t coff = overlap ? 2 : 1;
  if (kv.rank() != 2 || kv.dim(1) < coff || kv.dim(1) % coff != 0) {
    return invalid_argument(s(op) + ": kv has shape " + kv.shape_string() + " but must be [rows, " +
                            (overlap ? "2 * D" : "D") + "] with D >= 1");
  }
  const int64_t D = kv.dim(1) / coff, rows = kv.dim(0);
  const int64_t lead = overlap ? ratio : 0;
  if (rows < lead || rows % ratio != 0) {
    return invalid_argument(s(op) + ": kv has " + n(rows) + " rows but must hold whole windows of " + n(ratio) +
                            " tokens" + (overlap ? ", the first one the previous window's" : ""));
  }
  const int64_t windows = (rows - lead) / ratio;
  if (ape.dtype() != DType::kF32 || ape.rank() != 2 || ape.dim(0) != ratio || ape.dim(1) != coff * D ||
      !ape.is_contiguous()) {
    return invalid_argument(s(op) + ": ape has dtype " + s(dtype_name(ape.dtype())) + " and shape " +
                            ape.shape_string() + " but must be contiguous fp32 [" + n(ratio) + ", " + n(coff * D) + "]");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "ape", ape));
  if (out.dtype() != DType::kF32 && out.dtype() != DType::kBF16) {
    return invalid_argument(s(op) + ": out has dtype " + s(dtype_name(out.dtype())) + " but must be fp32 or bf16");
  }
  if (out.rank() != 2 || out.dim(0) != windows || out.dim(1) != D) {
    return invalid_argument(s(op) + ": out has shape " + out.shape_string() + " but must be [" + n(windows) + ", " +
                            n(D) + "] (complete windows, D)");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "out", out));
  if (windows == 0) return ok_status();
  // Rows with strided channels are copied to contiguous fp32 first (the same values: the same bits).
  std::vector<float> kv_copy, gate_copy;
  TensorView kv_in = kv, gate_in = gate;
  if (kv.stride(1) != 1 || gate.stride(1) != 1 || kv.dtype() != gate.dtype()) {
    kv_copy.resize(static_cast<size_t>(rows * coff * D));
    gate_copy.resize(kv_copy.size());
    for (int64_t r = 0; r < rows; ++r) {
      load_row_f32(kv, 1, r, coff * D, kv_copy.data() + r * coff * D);
      load_row_f32(gate, 1, r, coff * D, gate_copy.data() + r * coff * D);
    }
    kv_in = TensorView(kv_copy.data(), DType::kF32, {rows, coff * D});
    gate_in = TensorView(gate_copy.data(), DType::kF32, {rows, coff * D});
  }
  const kv_compress::Call call{&kv_in, &gate_in, ape.data_as<const float>(), ratio, D, 0, overlap, has_previous, &out};
  const size_t slot_bytes = static_cast<size_t>(2 * ratio) * 3 * sizeof(void*);
  auto scratch = [&]() -> void* {
    thread_local std::vector<std::byte> buf;
    if (buf.size() < slot_bytes) buf.resize(slot_bytes);
    return buf.data();
  };
  const auto fn = GB_DISPATCH(CompressWindow);
  if (windows * ratio * D < (int64_t{1} << 16) || num_threads() <= 1) {
    void* buf = scratch();
    for (int64_t k = 0; k < windows; ++k) fn(call, k, buf);
    return ok_status();
  }
  genbridge::detail::parallel_for_dynamic(windows, [&](int64_t k) { fn(call, k, scratch()); });
  return ok_status();
}

}  // namespace detail

Status kv_compress(const TensorView& kv, const TensorView& gate, const TensorView& ape, int64_t ratio, bool overlap,
                   bool has_previous, const TensorView& out) {
  return detail::run_kv_compress(kv, gate, ape, ratio, overlap, has_previous, out);
}

}  // namespace genbridge::ops
#endif  // HWY_ONCE
