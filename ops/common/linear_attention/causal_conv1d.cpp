// linear_attention/causal_conv1d, one implementation for every target. Work items are (sequence, block of
// channels); each walks its sequence's tokens in blocks through a small fp32 window (the K - 1 inputs before
// the block, then the block's own), so a sequence's outputs and state depend only on its own inputs. The
// window kernel is compiled once per CPU target (Highway); every output element is the contract's sequence of
// fp32 operations on its own (16 channels side by side), so targets and thread counts give the same bits.
#ifndef GENBRIDGE_OPS_COMMON_LINEAR_ATTENTION_CAUSAL_CONV1D_SHARED_
#define GENBRIDGE_OPS_COMMON_LINEAR_ATTENTION_CAUSAL_CONV1D_SHARED_
#include "genbridge/ops/linear_attention/causal_conv1d.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "ops/common/linear_attention/seq_batch.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops::detail::conv1d {
constexpr int64_t kChannelBlock = 256;  // channels per work item
constexpr int64_t kTokenBlock = 32;     // tokens per window step
constexpr int64_t kMaxKernel = 8;
}  // namespace genbridge::ops::detail::conv1d
#endif  // GENBRIDGE_OPS_COMMON_LINEAR_ATTENTION_CAUSAL_CONV1D_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/linear_attention/causal_conv1d.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

// out[t][c] = silu(sum_j wt[j][c] * win[t + j][c]) for t < nb, c < cb (rows of cb floats): the running sum
// from +0 with j increasing, then a / (1 + expf(-a)).
void ConvSiluRows(const float* win, const float* wt, int64_t K, int64_t nb, int64_t cb, float* out) {
  for (int64_t t = 0; t < nb; ++t) {
    float* o = out + t * cb;
    int64_t c = 0;
    for (; c + kLanes <= cb; c += kLanes) {
      V16 acc = Zero16();
      for (int64_t j = 0; j < K; ++j) acc = acc + Load16(wt + j * cb + c) * Load16(win + (t + j) * cb + c);
      alignas(64) float e[kLanes];
      Store16(e, acc);
      for (int l = 0; l < kLanes; ++l) e[l] = std::exp(-e[l]);
      Store16(o + c, acc / (Set16(1.0f) + Load16(static_cast<const float*>(e))));
    }
    for (; c < cb; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j) acc = acc + wt[j * cb + c] * win[(t + j) * cb + c];
      o[c] = acc / (1.0f + std::exp(-acc));
    }
  }
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops {
namespace detail {
HWY_EXPORT(ConvSiluRows);
}  // namespace detail
namespace {

using detail::n;
using detail::s;
constexpr const char* kOp = "causal_conv1d";

Status validate(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                const TensorView& state_indices, const TensorView& query_start_loc, const TensorView& y) {
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "x", x));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "x", x, 2, "[T, C]"));
  GB_RETURN_IF_ERROR(detail::check_unit_last_stride(kOp, "x", x));
  const int64_t T = x.dim(0), C = x.dim(1);
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "weight", weight));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "weight", weight, 2, "[C, K]"));
  if (weight.dim(0) != C) {
    return invalid_argument(s(kOp) + ": weight has shape " + weight.shape_string() + " but must be [" + n(C) +
                            ", K] (x's channels C, kernel size K)");
  }
  const int64_t K = weight.dim(1);
  if (K < 2 || K > detail::conv1d::kMaxKernel) {
    return invalid_argument(s(kOp) + ": the kernel size K = weight.dim(1) is " + n(K) + " but must be in [2, " +
                            n(detail::conv1d::kMaxKernel) + "]");
  }
  GB_RETURN_IF_ERROR(detail::check_state(kOp, "conv_state", conv_state, {DType::kBF16, DType::kF32}, {-1, K - 1, C},
                                         "([num_slots, K - 1, C])"));
  GB_RETURN_IF_ERROR(detail::check_seq_batch(kOp, state_indices, query_start_loc, T, conv_state.dim(0)));
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "y", y));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "y", y, {T, C}, "(x's shape [T, C])"));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "y", y, "x", x));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "y", y, "weight", weight));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "y", y, "conv_state", conv_state));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "conv_state", conv_state, "x", x));
  return detail::check_no_overlap(kOp, "conv_state", conv_state, "weight", weight);
}

// Columns [c0, c0 + cb) of a 2-D view, as a view (no copy).
TensorView columns(const TensorView& t, int64_t c0, int64_t cb) {
  auto* base = static_cast<char*>(t.data()) + c0 * t.stride(1) * static_cast<int64_t>(dtype_size(t.dtype()));
  return TensorView::strided(base, t.dtype(), {t.dim(0), cb}, {t.stride(0), t.stride(1)});
}

}  // namespace

Status causal_conv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                     const TensorView& state_indices, const TensorView& query_start_loc, const TensorView& y) {
  GB_RETURN_IF_ERROR(validate(x, weight, conv_state, state_indices, query_start_loc, y));
  const int64_t C = x.dim(1), K = weight.dim(1), H = K - 1;
  const detail::SeqBatch batch = detail::read_seq_batch(state_indices, query_start_loc);
  const int64_t num_seqs = batch.num_seqs();
  if (num_seqs == 0 || C == 0) return ok_status();
  constexpr int64_t kCB = detail::conv1d::kChannelBlock, kTB = detail::conv1d::kTokenBlock;
  const int64_t blocks = (C + kCB - 1) / kCB;
  // [K][C]: the weight transposed, so that a tap's weights for 16 channels are one load.
  std::vector<float> wt(static_cast<size_t>(K * C)), wrow(static_cast<size_t>(K));
  for (int64_t c = 0; c < C; ++c) {
    detail::load_row_f32(weight, 1, c, K, wrow.data());
    for (int64_t j = 0; j < K; ++j) wt[j * C + c] = wrow[j];
  }
  const auto conv_rows = GB_DISPATCH(detail::ConvSiluRows);
  const int64_t slot_elems = H * C;
  genbridge::detail::parallel_for(num_seqs * blocks, kCB * 32, [&](int64_t i0, int64_t i1) {
    std::vector<float> win(static_cast<size_t>((H + kTB) * kCB)), out(static_cast<size_t>(kTB * kCB)),
        w(static_cast<size_t>(K * kCB));
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t sq = item / blocks, c0 = (item % blocks) * kCB, cb = std::min(kCB, C - c0);
      const int64_t q_len = batch.q_len(sq), row0 = batch.begin[sq];
      if (q_len == 0) continue;
      for (int64_t j = 0; j < K; ++j) std::memcpy(&w[j * cb], &wt[j * C + c0], static_cast<size_t>(cb) * sizeof(float));
      // The slot's history, as the K - 1 rows of a [K - 1, C] view.
      auto* slot_base = static_cast<char*>(conv_state.data()) +
                        batch.slot[sq] * slot_elems * static_cast<int64_t>(dtype_size(conv_state.dtype()));
      const TensorView hist = columns(TensorView(slot_base, conv_state.dtype(), {H, C}), c0, cb);
      for (int64_t r = 0; r < H; ++r) detail::load_row_f32(hist, 1, r, cb, &win[r * cb]);
      const TensorView xs = columns(x, c0, cb), ys = columns(y, c0, cb);
      for (int64_t t0 = 0; t0 < q_len; t0 += kTB) {
        const int64_t nb = std::min(kTB, q_len - t0);
        for (int64_t t = 0; t < nb; ++t) detail::load_row_f32(xs, 1, row0 + t0 + t, cb, &win[(H + t) * cb]);
        conv_rows(win.data(), w.data(), K, nb, cb, out.data());
        for (int64_t t = 0; t < nb; ++t) detail::store_row_f32(ys, 1, row0 + t0 + t, cb, &out[t * cb]);
        // The last K - 1 inputs seen become the window's history.
        std::memmove(win.data(), &win[nb * cb], static_cast<size_t>(H * cb) * sizeof(float));
      }
      for (int64_t r = 0; r < H; ++r) detail::store_row_f32(hist, 1, r, cb, &win[r * cb]);
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
#endif  // HWY_ONCE
