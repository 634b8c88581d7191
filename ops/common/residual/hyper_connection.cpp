// residual/hyper_connection (hc_pre, hc_post, hc_head), one implementation for every target. The projections
// of hc_pre and hc_head (and x . x) run on the linear dot kernel (ops/common/linear/dot_kernel.h: linear/linear's
// reduction order, fn as fp32 weights); the weighted sums of stream rows run on MixRows below, compiled once
// per CPU target (16 hidden elements at a time, the same fused multiply-adds per element on every target);
// the small per-token maths (sigmoid, softmax, Sinkhorn: O(n^2) per token) is scalar fp32. Tokens are
// independent: work splits by whole tokens, and at small T (decode) also by whole rows of fn.
#ifndef GENBRIDGE_OPS_COMMON_RESIDUAL_HYPER_CONNECTION_SHARED_
#define GENBRIDGE_OPS_COMMON_RESIDUAL_HYPER_CONNECTION_SHARED_
#include "genbridge/ops/residual/hyper_connection.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "ops/common/activation/swiglu.h"
#include "ops/common/linear/dot_kernel.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"
#endif  // GENBRIDGE_OPS_COMMON_RESIDUAL_HYPER_CONNECTION_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/residual/hyper_connection.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

// Outputs k0 .. k0 + G - 1 of one block of 16 h (x staged: stage[j * 16 + l]); G independent chains of fused
// multiply-adds, in registers.
template <int G, typename TO>
HWY_INLINE void MixGroup(const float* HWY_RESTRICT stage, int64_t n, const float* w, int64_t wj, int64_t wk, int64_t k0,
                         const V16* yv, const float* wy, int64_t wys, TO* out, int64_t ldo) {
  V16 acc[G];
  GB_UNROLL for (int k = 0; k < G; ++k) acc[k] = yv ? Mul16(Set16(wy[(k0 + k) * wys]), *yv) : Zero16();
  for (int64_t j = 0; j < n; ++j) {
    const V16 xv = Load16(stage + j * kLanes);
    GB_UNROLL for (int k = 0; k < G; ++k) acc[k] = Fma16(Set16(w[j * wj + (k0 + k) * wk]), xv, acc[k]);
  }
  GB_UNROLL for (int k = 0; k < G; ++k) Store16(out + (k0 + k) * ldo, acc[k]);
}

// The mix of one token's stream rows, for k < nout and h < H:
//   out[k][h] = (y ? wy[k] * y[h] : +0), then for j < n in order: out[k][h] = fma(w[j][k], x[j][h], out[k][h])
// with x[j][h] = x[j * ldx + h], w[j][k] = w[j * wj + k * wk], wy[k] = wy[k * wys], out[k][h] = out[k * ldo + h].
// Per block of 16 h, every x[j] is read (staged in `stage`, n * 16 floats) before any output is written, so out
// may be x itself (hc_post in place).
template <typename TX, typename TY, typename TO>
void MixT(const TX* x, int64_t ldx, int64_t n, const float* w, int64_t wj, int64_t wk, int64_t nout, const TY* y,
          const float* wy, int64_t wys, int64_t H, TO* out, int64_t ldo, float* HWY_RESTRICT stage) {
  int64_t h = 0;
  if (n == 4 && (nout == 4 || nout == 1)) {
    // DeepSeek-V4's hc_mult: the four rows' block in registers (all read before any output is written).
    for (; h + kLanes <= H; h += kLanes) {
      V16 xv[4];
      GB_UNROLL for (int j = 0; j < 4; ++j) xv[j] = Load16(x + j * ldx + h);
      const V16 yv = y ? Load16(y + h) : Zero16();
      if (nout == 4) {
        V16 acc[4];
        GB_UNROLL for (int k = 0; k < 4; ++k) acc[k] = y ? Mul16(Set16(wy[k * wys]), yv) : Zero16();
        GB_UNROLL for (int j = 0; j < 4; ++j) GB_UNROLL for (int k = 0; k < 4; ++k) acc[k] =
            Fma16(Set16(w[j * wj + k * wk]), xv[j], acc[k]);
        GB_UNROLL for (int k = 0; k < 4; ++k) Store16(out + k * ldo + h, acc[k]);
      } else {
        V16 acc = y ? Mul16(Set16(wy[0]), yv) : Zero16();
        GB_UNROLL for (int j = 0; j < 4; ++j) acc = Fma16(Set16(w[j * wj]), xv[j], acc);
        Store16(out + h, acc);
      }
    }
  }
  for (; h + kLanes <= H; h += kLanes) {
    for (int64_t j = 0; j < n; ++j) Store16(stage + j * kLanes, Load16(x + j * ldx + h));
    const V16 yv = y ? Load16(y + h) : Zero16();
    const V16* yp = y ? &yv : nullptr;
    int64_t k0 = 0;
    for (; k0 + 4 <= nout; k0 += 4) MixGroup<4>(stage, n, w, wj, wk, k0, yp, wy, wys, out + h, ldo);
    for (; k0 < nout; ++k0) MixGroup<1>(stage, n, w, wj, wk, k0, yp, wy, wys, out + h, ldo);
  }
  for (; h < H; ++h) {  // the tail, one element at a time: the same operations
    for (int64_t j = 0; j < n; ++j) stage[j] = to_f32(x[j * ldx + h]);
    const float yh = y ? to_f32(y[h]) : 0.0f;
    for (int64_t k = 0; k < nout; ++k) {
      float acc = y ? wy[k * wys] * yh : 0.0f;
      for (int64_t j = 0; j < n; ++j) acc = std::fma(w[j * wj + k * wk], stage[j], acc);
      out[k * ldo + h] = from_f32<TO>(acc);
    }
  }
}

// MixT for the dtypes of x, y and out (fp32 or bf16; y may be null), contiguous along h.
void MixRows(DType xt, const void* x, int64_t ldx, int64_t n, const float* w, int64_t wj, int64_t wk, int64_t nout,
             DType yt, const void* y, const float* wy, int64_t wys, int64_t H, DType ot, void* out, int64_t ldo,
             float* stage) {
  with_float_dtype(xt, [&](auto xz) {
    with_float_dtype(yt, [&](auto yz) {
      with_float_dtype(ot, [&](auto oz) {
        using TX = decltype(xz);
        using TY = decltype(yz);
        using TO = decltype(oz);
        if constexpr (std::is_same_v<TX, fp16_t> || std::is_same_v<TY, fp16_t> || std::is_same_v<TO, fp16_t>) {
          GB_CHECK(false, "MixRows: fp32 or bf16 only (validated by the entries)");
        } else {
          MixT<TX, TY, TO>(static_cast<const TX*>(x), ldx, n, w, wj, wk, nout, static_cast<const TY*>(y), wy, wys, H,
                           static_cast<TO*>(out), ldo, stage);
        }
      });
    });
  });
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops {
namespace detail {

HWY_EXPORT(MixRows);

using MixRowsFn = void (*)(DType xt, const void* x, int64_t ldx, int64_t n, const float* w, int64_t wj, int64_t wk,
                           int64_t nout, DType yt, const void* y, const float* wy, int64_t wys, int64_t H, DType ot,
                           void* out, int64_t ldo, float* stage);
// MixRows of the CPU target in use (dispatched once per op call).
static MixRowsFn mix_rows_fn() { return GB_DISPATCH(MixRows); }

}  // namespace detail
namespace {

using detail::f;
using detail::MixRowsFn;
using detail::n;
using detail::s;

std::string shape_of_text(const TensorView& t) { return detail::shape_text(detail::shape_of(t)); }

// streams [T, n, H] (bf16 or fp32) with n >= 1, and H >= 1 when `need_hidden`.
Status check_streams(const char* op, const TensorView& streams, bool need_hidden) {
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(op, "streams", streams));
  GB_RETURN_IF_ERROR(detail::check_rank(op, "streams", streams, 3, "([T, n, H])"));
  if (streams.dim(1) < 1 || (need_hidden && streams.dim(2) < 1)) {
    return invalid_argument(s(op) + ": streams has shape " + shape_of_text(streams) + " but must have n >= 1" +
                            (need_hidden ? " streams and H >= 1 hidden elements" : " streams"));
  }
  return ok_status();
}

Status check_eps(const char* op, const char* name, float v) {
  if (std::isfinite(v) && v >= 0.0f) return ok_status();
  return invalid_argument(s(op) + ": " + name + " is " + f(v) + " but must be finite and >= 0");
}

// The site's parameters: fn [rows, n H] fp32 with contiguous rows, base [rows] and scale [scales] fp32, eps.
Status check_site(const char* op, const TensorView& streams, const TensorView& fn, const TensorView& base,
                  const TensorView& scale, const HyperConnectionParams& p, int64_t rows, int64_t scales,
                  const char* rows_text, const char* scale_text) {
  const int64_t K = streams.dim(1) * streams.dim(2);
  GB_RETURN_IF_ERROR(detail::check_dtype(op, "fn", fn, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_rank(op, "fn", fn, 2, (std::string("([") + rows_text + ", n H])").c_str()));
  GB_RETURN_IF_ERROR(
      detail::check_shape(op, "fn", fn, {rows, K}, std::string("([") + rows_text + ", n H] with n, H from streams)"));
  GB_RETURN_IF_ERROR(detail::check_unit_last_stride(op, "fn", fn));
  GB_RETURN_IF_ERROR(detail::check_dtype(op, "base", base, DType::kF32));
  GB_RETURN_IF_ERROR(
      detail::check_shape(op, "base", base, {rows}, std::string("([") + rows_text + "] with n from streams)"));
  GB_RETURN_IF_ERROR(detail::check_dtype(op, "scale", scale, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_shape(op, "scale", scale, {scales}, scale_text));
  GB_RETURN_IF_ERROR(check_eps(op, "params.norm_eps", p.norm_eps));
  return check_eps(op, "params.hc_eps", p.hc_eps);
}

// The collapsed output [T, H] (bf16 or fp32).
Status check_collapsed(const char* op, const TensorView& streams, const TensorView& collapsed) {
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(op, "collapsed", collapsed));
  return detail::check_shape(op, "collapsed", collapsed, {streams.dim(0), streams.dim(2)}, "([T, H] from streams)");
}

// Each output against each input and the outputs against each other.
Status check_disjoint(const char* op, std::initializer_list<std::pair<const char*, const TensorView*>> outs,
                      std::initializer_list<std::pair<const char*, const TensorView*>> ins) {
  for (auto o = outs.begin(); o != outs.end(); ++o) {
    for (const auto& i : ins)
      GB_RETURN_IF_ERROR(detail::check_no_overlap(op, o->first, *o->second, i.first, *i.second));
    for (auto o2 = outs.begin(); o2 != o; ++o2) {
      GB_RETURN_IF_ERROR(detail::check_no_overlap(op, o->first, *o->second, o2->first, *o2->second));
    }
  }
  return ok_status();
}

// The fp32 rows of tokens [t0, t0 + m) (n H values each, stream-major): in place when the streams are fp32 and
// each token's [n, H] is contiguous, else widened into buf ([m, n H]). Sets lda.
const float* token_rows(const TensorView& streams, int64_t t0, int64_t m, float* buf, int64_t& lda) {
  const int64_t K = streams.dim(1) * streams.dim(2);
  if (streams.dtype() == DType::kF32 && detail::trailing_contiguous(streams, 2)) {
    lda = streams.stride(0);
    return streams.data_as<const float>() + t0 * lda;
  }
  for (int64_t r = 0; r < m; ++r) detail::load_row_f32(streams, 2, t0 + r, K, buf + r * K);
  lda = K;
  return buf;
}

// Tokens per dot-kernel call. fn has few rows ((2 + n) n = 24) and long ones (n H = 16384 at DeepSeek-V4-Flash's
// shape): the GEMV path on 4 rows streams fn once per 4 tokens and is the fastest per token (measured, AVX-512
// and AVX2: 16.5 us per token against 19 at 7 or 8 rows and 35-60 on the GEMM path from 16 rows, whose packed
// fn panel of n H rows does not stay in L2).
constexpr int64_t kTokensPerDot = 4;

// For every token t: d = fn[0, N) . x and ss = x . x on the dot kernel (x = streams[t] flattened), then
// finish(t, x, d, ss) on the thread that owns the token. Blocks of kTokensPerDot tokens are the work items
// (x widened once, finished in the same item) when there are enough to keep every thread busy; otherwise
// (decode) the rows of fn are split over the threads too, and every token is finished in a second pass (x
// read again). Both compute the same operations per value.
template <typename Finish>
void project_tokens(const TensorView& streams, const TensorView& fn, int64_t N, Finish&& finish) {
  const int64_t T = streams.dim(0), K = streams.dim(1) * streams.dim(2);
  const detail::DotRowsFn dot = detail::dot_rows_fn(DType::kF32);
  const float* w = fn.data_as<const float>();
  const int64_t ldw = fn.stride(0);
  const int64_t row_blocks = (T + kTokensPerDot - 1) / kTokensPerDot;
  const int64_t chunks = std::clamp<int64_t>(num_threads() / row_blocks, 1, N), nc = (N + chunks - 1) / chunks;
  auto widen = [&](int64_t m) {
    return static_cast<float*>(detail::thread_scratch<0>(static_cast<size_t>(m * K) * sizeof(float)));
  };
  if (chunks == 1) {
    detail::parallel_items(row_blocks, T * N * K, [&](int64_t item) {
      const int64_t t0 = item * kTokensPerDot, m = std::min(kTokensPerDot, T - t0);
      int64_t lda = 0;
      const float* a = token_rows(streams, t0, m, widen(m), lda);
      float d[kTokensPerDot * 64];  // N <= 64 here; larger N take the scratch buffer below
      float* dp =
          N <= 64 ? d : static_cast<float*>(detail::thread_scratch<1>(static_cast<size_t>(m * N) * sizeof(float)));
      float ss[kTokensPerDot];
      dot(a, lda, m, w, ldw, N, K, dp, N);
      for (int64_t r = 0; r < m; ++r) dot(a + r * lda, lda, 1, a + r * lda, lda, 1, K, ss + r, 1);
      for (int64_t r = 0; r < m; ++r) finish(t0 + r, a + r * lda, dp + r * N, ss[r]);
    });
    return;
  }
  std::vector<float> d(static_cast<size_t>(T * N)), ss(static_cast<size_t>(T));
  detail::parallel_items(row_blocks * chunks, T * N * K, [&](int64_t item) {
    const int64_t t0 = item / chunks * kTokensPerDot, m = std::min(kTokensPerDot, T - t0);
    const int64_t c0 = item % chunks * nc, cols = std::min(nc, N - c0);
    int64_t lda = 0;
    const float* a = token_rows(streams, t0, m, widen(m), lda);
    if (cols > 0) dot(a, lda, m, w + c0 * ldw, ldw, cols, K, d.data() + t0 * N + c0, N);
    if (c0 == 0) {
      for (int64_t r = 0; r < m; ++r) dot(a + r * lda, lda, 1, a + r * lda, lda, 1, K, ss.data() + t0 + r, 1);
    }
  });
  genbridge::detail::parallel_for(T, 4 * K, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t lda = 0;
      const float* a = token_rows(streams, t, 1, widen(1), lda);
      finish(t, a, d.data() + t * N, ss[t]);
    }
  });
}

// r = 1 / sqrt(ss / (n H) + norm_eps).
inline float rms_scale(float ss, int64_t K, float norm_eps) {
  return 1.0f / std::sqrt(ss / static_cast<float>(K) + norm_eps);
}

// Byte address of element offset `off` of t.
void* element_at(const TensorView& t, int64_t off) {
  return static_cast<char*>(t.data()) + off * static_cast<int64_t>(dtype_size(t.dtype()));
}

// collapsed[t] = sum_j pre[j] * x[j] (x: the token's fp32 rows, contiguous), rounded once to collapsed's dtype.
void store_collapsed(MixRowsFn mix, const float* x, int64_t n, int64_t H, const float* pre, const TensorView& collapsed,
                     int64_t t) {
  const bool direct = collapsed.stride(1) == 1;
  float* stage =
      static_cast<float*>(detail::thread_scratch<2>(static_cast<size_t>(n * 16 + (direct ? 0 : H)) * sizeof(float)));
  if (direct) {
    mix(DType::kF32, x, H, n, pre, 1, 0, 1, DType::kF32, nullptr, nullptr, 0, H, collapsed.dtype(),
        element_at(collapsed, t * collapsed.stride(0)), 0, stage);
    return;
  }
  float* row = stage + n * 16;
  mix(DType::kF32, x, H, n, pre, 1, 0, 1, DType::kF32, nullptr, nullptr, 0, H, DType::kF32, row, 0, stage);
  detail::store_row_f32(collapsed, 1, t, H, row);
}

// c [n, n] /= its column sums + eps (sums in index order).
void normalize_columns(float* c, int64_t n, float eps) {
  for (int64_t k = 0; k < n; ++k) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) sum += c[j * n + k];
    const float d = sum + eps;
    for (int64_t j = 0; j < n; ++j) c[j * n + k] = c[j * n + k] / d;
  }
}

// c [n, n] /= its row sums + eps (sums in index order).
void normalize_rows(float* c, int64_t n, float eps) {
  for (int64_t j = 0; j < n; ++j) {
    float sum = 0.0f;
    for (int64_t k = 0; k < n; ++k) sum += c[j * n + k];
    const float d = sum + eps;
    for (int64_t k = 0; k < n; ++k) c[j * n + k] = c[j * n + k] / d;
  }
}

}  // namespace

Status hc_pre(const TensorView& streams, const TensorView& fn, const TensorView& base, const TensorView& scale,
              const HyperConnectionParams& params, const TensorView& collapsed, const TensorView& post,
              const TensorView& comb) {
  constexpr const char* kOp = "hc_pre";
  GB_RETURN_IF_ERROR(check_streams(kOp, streams, true));
  const int64_t T = streams.dim(0), nn = streams.dim(1), H = streams.dim(2), N = (2 + nn) * nn;
  GB_RETURN_IF_ERROR(check_site(kOp, streams, fn, base, scale, params, N, 3, "(2 + n) n", "([3]: pre, post, comb)"));
  if (params.sinkhorn_iters < 1) {
    return invalid_argument(s(kOp) + ": params.sinkhorn_iters is " + n(params.sinkhorn_iters) + " but must be >= 1");
  }
  GB_RETURN_IF_ERROR(check_collapsed(kOp, streams, collapsed));
  GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "post", post, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "post", post, {T, nn}, "([T, n] from streams)"));
  GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "comb", comb, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "comb", comb, {T, nn, nn}, "([T, n, n] from streams)"));
  GB_RETURN_IF_ERROR(check_disjoint(kOp, {{"collapsed", &collapsed}, {"post", &post}, {"comb", &comb}},
                                    {{"streams", &streams}, {"fn", &fn}, {"base", &base}, {"scale", &scale}}));
  if (T == 0) return ok_status();
  std::vector<float> b(static_cast<size_t>(N)), sc(3);
  detail::load_row_f32(base, 1, 0, N, b.data());
  detail::load_row_f32(scale, 1, 0, 3, sc.data());
  const MixRowsFn mix = detail::mix_rows_fn();
  const float eps = params.hc_eps;
  project_tokens(streams, fn, N, [&](int64_t t, const float* x, const float* d, float ss) {
    const float r = rms_scale(ss, nn * H, params.norm_eps);
    // m, pre and c of the token (O(n^2) floats).
    float* m = static_cast<float*>(detail::thread_scratch<3>(static_cast<size_t>(N + nn) * sizeof(float)));
    float* pre = m + N;
    for (int64_t i = 0; i < N; ++i) m[i] = r * d[i];
    float* po = post.data_as<float>() + t * post.stride(0);
    for (int64_t j = 0; j < nn; ++j) {
      pre[j] = detail::sigmoid(m[j] * sc[0] + b[j]) + eps;
      po[j * post.stride(1)] = 2.0f * detail::sigmoid(m[nn + j] * sc[1] + b[nn + j]);
    }
    float* c = m + 2 * nn;  // the logits' slots, overwritten row by row with the softmax
    for (int64_t j = 0; j < nn; ++j) {
      float* row = c + j * nn;
      for (int64_t k = 0; k < nn; ++k) row[k] = row[k] * sc[2] + b[2 * nn + j * nn + k];
      float mx = row[0];
      for (int64_t k = 1; k < nn; ++k) mx = row[k] > mx ? row[k] : mx;
      float sum = 0.0f;
      for (int64_t k = 0; k < nn; ++k) {
        row[k] = std::exp(row[k] - mx);
        sum += row[k];
      }
      for (int64_t k = 0; k < nn; ++k) row[k] = row[k] / sum + eps;
    }
    normalize_columns(c, nn, eps);
    for (int64_t it = 1; it < params.sinkhorn_iters; ++it) {
      normalize_rows(c, nn, eps);
      normalize_columns(c, nn, eps);
    }
    float* co = comb.data_as<float>() + t * comb.stride(0);
    for (int64_t j = 0; j < nn; ++j)
      for (int64_t k = 0; k < nn; ++k) co[j * comb.stride(1) + k * comb.stride(2)] = c[j * nn + k];
    store_collapsed(mix, x, nn, H, pre, collapsed, t);
  });
  return ok_status();
}

Status hc_head(const TensorView& streams, const TensorView& fn, const TensorView& base, const TensorView& scale,
               const HyperConnectionParams& params, const TensorView& collapsed) {
  constexpr const char* kOp = "hc_head";
  GB_RETURN_IF_ERROR(check_streams(kOp, streams, true));
  const int64_t T = streams.dim(0), nn = streams.dim(1), H = streams.dim(2);
  GB_RETURN_IF_ERROR(check_site(kOp, streams, fn, base, scale, params, nn, 1, "n", "([1])"));
  GB_RETURN_IF_ERROR(check_collapsed(kOp, streams, collapsed));
  GB_RETURN_IF_ERROR(check_disjoint(kOp, {{"collapsed", &collapsed}},
                                    {{"streams", &streams}, {"fn", &fn}, {"base", &base}, {"scale", &scale}}));
  if (T == 0) return ok_status();
  std::vector<float> b(static_cast<size_t>(nn));
  float sc = 0.0f;
  detail::load_row_f32(base, 1, 0, nn, b.data());
  detail::load_row_f32(scale, 1, 0, 1, &sc);
  const MixRowsFn mix = detail::mix_rows_fn();
  project_tokens(streams, fn, nn, [&](int64_t t, const float* x, const float* d, float ss) {
    const float r = rms_scale(ss, nn * H, params.norm_eps);
    float* pre = static_cast<float*>(detail::thread_scratch<3>(static_cast<size_t>(nn) * sizeof(float)));
    for (int64_t j = 0; j < nn; ++j) pre[j] = detail::sigmoid(r * d[j] * sc + b[j]) + params.hc_eps;
    store_collapsed(mix, x, nn, H, pre, collapsed, t);
  });
  return ok_status();
}

Status hc_post(const TensorView& y, const TensorView& post, const TensorView& comb, const TensorView& streams,
               const TensorView& out) {
  constexpr const char* kOp = "hc_post";
  GB_RETURN_IF_ERROR(check_streams(kOp, streams, false));
  const int64_t T = streams.dim(0), nn = streams.dim(1), H = streams.dim(2);
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "y", y));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "y", y, {T, H}, "([T, H] from streams)"));
  GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "post", post, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "post", post, {T, nn}, "([T, n] from streams)"));
  GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "comb", comb, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "comb", comb, {T, nn, nn}, "([T, n, n] from streams)"));
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "out", out));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "out", out, {T, nn, H}, "(streams' shape [T, n, H])"));
  bool in_place = out.data() == streams.data() && out.dtype() == streams.dtype();
  for (int d = 0; d < 3 && in_place; ++d) in_place = out.stride(d) == streams.stride(d);
  if (!in_place) GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "out", out, "streams", streams));
  GB_RETURN_IF_ERROR(check_disjoint(kOp, {{"out", &out}}, {{"y", &y}, {"post", &post}, {"comb", &comb}}));
  if (T == 0 || H == 0) return ok_status();
  const MixRowsFn mix = detail::mix_rows_fn();
  // Rows contiguous along H are read and written where they are (in place too: the kernel reads every input
  // row of a block of H before it writes that block's outputs); other layouts go through fp32 copies (in place
  // with such a layout, all of a token's rows are copied before any output is written).
  const bool direct_streams = streams.stride(2) == 1, direct_y = y.stride(1) == 1, direct_out = out.stride(2) == 1;
  genbridge::detail::parallel_for(T, nn * H * (nn + 3), [&](int64_t t0, int64_t t1) {
    std::vector<float> xs(direct_streams ? 0 : static_cast<size_t>(nn * H)), ys(direct_y ? 0 : static_cast<size_t>(H)),
        os(direct_out ? 0 : static_cast<size_t>(nn * H)), stage_buf(static_cast<size_t>(nn * 16 + 16));
    // 64-byte aligned: a staged block is stored and reloaded at once (no store split across cache lines).
    float* stage = stage_buf.data() + (16 - reinterpret_cast<uintptr_t>(stage_buf.data()) / 4 % 16) % 16;
    for (int64_t t = t0; t < t1; ++t) {
      const void* x = xs.data();
      DType xt = DType::kF32;
      int64_t ldx = H;
      if (direct_streams) {
        x = element_at(streams, t * streams.stride(0));
        xt = streams.dtype();
        ldx = streams.stride(1);
      } else {
        detail::load_row_f32(streams, 2, t, nn * H, xs.data());
      }
      const void* yr = ys.data();
      DType yt = DType::kF32;
      if (direct_y) {
        yr = element_at(y, t * y.stride(0));
        yt = y.dtype();
      } else {
        detail::load_row_f32(y, 1, t, H, ys.data());
      }
      const float* po = post.data_as<const float>() + t * post.stride(0);
      const float* co = comb.data_as<const float>() + t * comb.stride(0);
      if (direct_out) {
        mix(xt, x, ldx, nn, co, comb.stride(1), comb.stride(2), nn, yt, yr, po, post.stride(1), H, out.dtype(),
            element_at(out, t * out.stride(0)), out.stride(1), stage);
      } else {
        mix(xt, x, ldx, nn, co, comb.stride(1), comb.stride(2), nn, yt, yr, po, post.stride(1), H, DType::kF32,
            os.data(), H, stage);
        for (int64_t k = 0; k < nn; ++k) detail::store_row_f32(out, 1, t * nn + k, H, os.data() + k * H);
      }
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
#endif  // HWY_ONCE
