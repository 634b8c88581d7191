#pragma once
// Independent float64 reference forward pass of DeepSeek-V4 (tests only): the oracle the engine's V4 forward is
// tested against. Written from the formulas (docs/deepseek.md names the pieces), naive and readable: every
// weight is read as its exact value, every intermediate is fp64, nothing is quantized. It shares no code with
// the engine, the kernels or the other references (its helpers are v4_ref_*). Each position costs its window
// (sliding_window tokens) plus its compressed entries; no prefix is recomputed.
//
// Residual streams (manifold-constrained hyper-connections): each token's embedding is copied into hc_mult
// streams X [n, H]. Each layer has two sites (attention, MoE), each with fn [(2 + n) n, n H], base, scale [3]:
// x = X flattened (stream-major), m = (fn . x) / sqrt(mean(x^2) + rms_norm_eps);
// pre_j = sigmoid(m_j s0 + base_j) + hc_eps; post_k = 2 sigmoid(m_{n+k} s1 + base_{n+k});
// comb[j][k] = softmax_k(m_{2n+jn+k} s2 + base_{2n+jn+k}) + hc_eps, divided by its column sums (+ hc_eps), then
// (hc_sinkhorn_iters - 1) times by row sums then column sums (+ hc_eps each). The block reads
// RMSNorm(sum_j pre_j X_j) (attn_norm / ffn_norm) and returns y; then X'_k = post_k y + sum_j comb[j][k] X_j
// (comb transposed: summed over its first index). Head: pre = sigmoid(m s + base) + hc_eps with hc_head_*,
// h = sum_j pre_j X_j, final RMSNorm, LM head.
//
// Attention (every layer), one shared K = V head of head_dim D: qr = RMSNorm_{q_norm}(wq_a x); q = wq_b qr per
// head, each head divided by its RMS (no weight, eps rms_norm_eps); kv = RMSNorm_{kv_norm}(wkv x). RoPE rotates
// the trailing qk_rope_head_dim dims in interleaved pairs (2i, 2i + 1) at the token's position: sliding-window
// layers (compress ratio 0) with rope_theta and no scaling; compressed layers with compress_rope_theta and,
// when rope_scaling is yarn, YaRN's inverse frequencies (correction range floor/ceil over
// original_max_position_embeddings, linear ramp) with attention factor 1: cos/sin are not scaled. Keys: the
// last sliding_window tokens (the query's included) plus the compressed entries the layer sees, in ONE
// softmax with scale D^-1/2 whose denominator also holds exp(attn_sink[h]); o_h = sum_j p_j kv_j, then the
// inverse RoPE (angle -t) at the query's position on o_h's rope dims. Grouped output: the heads split into
// o_groups consecutive groups, z_g = wo_a[rows g r .. (g + 1) r) . o_g (r = o_lora_rank), out = wo_b . [z_0..].
//
// Compressor (ratio m = compress_ratios[layer] > 0; overlap, and the indexer, iff m = 4): c = wkv x, s = wgate x
// over the normed attention input, width coff W (coff = 2 with overlap, else 1); window w holds tokens
// [m w, m w + m); ape [m, coff W] is added to s by slot. Without overlap: e_w[d] = sum_i softmax_i(s_i[d] +
// ape_i[d]) c_i[d]. With overlap, 2m slots per channel d < W: the previous window's tokens through channels
// [0, W) (none for w = 0), then this window's through [W, 2W). Then RMSNorm with the compressor's norm and the
// compressed RoPE at position m w. Query t sees entry w iff w < (t + 1) / m: the ratio-4 (CSA) layers attend to
// the indexer's choice of them, every other compressed layer (HCA: 128; other ratios are treated alike, as
// DeepSeek's code does) to all of them.
// Indexer (ratio-4 layers): its own overlapping compressor at W = index_head_dim gives keys K_w; queries
// qI = index_wq_b qr [index_n_heads, index_head_dim] with the compressed RoPE at t; score(t, w) =
// sum_h (index_weights_proj x)_h index_n_heads^-1/2 ReLU(qI_h . K_w) index_head_dim^-1/2 over the visible
// entries; the min(index_topk, visible) best are kept (ties to the lower entry).
//
// MoE on RMSNorm_{ffn_norm}(collapsed) (every layer): s = sqrt(softplus(router x)); layers < num_hash_layers
// take the experts tid2eid[token] (no bias), the others the top-k of s + e_score_correction_bias (ties to the
// lower id); weights = s_sel / (sum s_sel + 1e-20) when norm_topk_prob, else s_sel, times
// routed_scaling_factor. Experts and the shared expert (n_shared_experts > 0, ungated):
// down(silu(min(g, L)) * clamp(u, -L, L)) with L = swiglu_limit when > 0; out = sum routed + shared.
//
// Sources: Hugging Face's modeling_deepseek_v4.py and DeepSeek's own inference model.py agree on all of the
// above; where serving stacks differ, this follows those two: YaRN only on compressed layers (vLLM's rotary
// builder applies it everywhere); the shared expert clamped too. Differences that leave exact values alone or
// are choices of precision: DeepSeek's indexer Hadamard-rotates its queries and keys (orthogonal: the dot
// products are unchanged) and simulates FP8 / FP4 activations, which this reference does not; torch's softplus
// returns x above 20, this one is exact; Hugging Face renormalises the routing weights always and DeepSeek
// without the 1e-20, this one when norm_topk_prob (true in every official config); torch.topk's tie order is
// unspecified, this one breaks ties to the lower index.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numbers>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/config.h"
#include "support/tensor_util.h"

namespace genbridge::testing {

struct DeepseekV4Reference {
  int64_t num_tokens = 0, vocab_size = 0;
  std::vector<double> logits;  // [num_tokens, vocab_size]: the logits at every position
  std::span<const double> logits_at(int64_t pos) const {
    return {logits.data() + pos * vocab_size, static_cast<size_t>(vocab_size)};
  }
  // [layer][token]: the routed experts in selection order (hash layers: the tid2eid row), and the smallest gap
  // between a kept and a dropped expert's selection score (infinity for hash layers).
  std::vector<std::vector<std::vector<int64_t>>> experts;
  std::vector<std::vector<double>> expert_margin;
  // [layer][token], compressed-sparse (ratio 4) layers: the compressed entries the indexer kept, increasing, and
  // the gap between the last kept and first dropped score (infinity when all visible entries are kept); the
  // layer's vector is empty for the other layers. A gap of 0 is a tie; with few indexer heads, scores of
  // exactly 0 (every head's ReLU at 0) are common, and the lower entry wins.
  std::vector<std::vector<std::vector<int64_t>>> index_selected;
  std::vector<std::vector<double>> index_margin;
};

// Discrete choices to follow instead of the reference's own (an engine's recorded ones), so that an engine whose
// bf16 activations flip a near-tie is compared with the reference on the same experts and entries: [layer][token],
// an empty entry (or vector) keeps the reference's own choice. Experts in the engine's slot order.
struct DeepseekV4Choices {
  std::vector<std::vector<std::vector<int64_t>>> experts;
  std::vector<std::vector<std::vector<int64_t>>> index_selected;
};

[[noreturn]] inline void v4_ref_fail(const std::string& what) {
  throw std::invalid_argument("deepseek_v4_reference_forward: " + what);
}

// A weight's exact values as a dense row-major [rows, cols] fp64 matrix (a 1-D view is one row).
struct V4RefMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  const double* row(int64_t r) const { return v.data() + r * cols; }
  double at(int64_t r, int64_t c) const { return v[static_cast<size_t>(r * cols + c)]; }
};

inline V4RefMatrix v4_ref_matrix(const TensorView& w, const std::string& name) {
  const DType t = w.dtype();
  if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16 && t != DType::kF64) {
    v4_ref_fail(name + " has dtype " + std::string(dtype_name(t)) + ": the reference reads float tensors only");
  }
  if (w.rank() != 1 && w.rank() != 2) v4_ref_fail(name + " is " + w.shape_string() + ": expected 1-D or 2-D");
  V4RefMatrix m;
  m.rows = w.rank() == 2 ? w.dim(0) : 1;
  m.cols = w.dim(-1);
  m.v.resize(static_cast<size_t>(m.rows * m.cols));
  const int64_t rs = w.rank() == 2 ? w.stride(0) : 0, cs = w.stride(-1);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c)
      m.v[static_cast<size_t>(r * m.cols + c)] = element_as_double(w, r * rs + c * cs);
  }
  return m;
}

inline void v4_ref_expect_shape(const V4RefMatrix& m, int64_t rows, int64_t cols, const std::string& name) {
  if (m.rows != rows || m.cols != cols) {
    v4_ref_fail(name + " is [" + std::to_string(m.rows) + ", " + std::to_string(m.cols) + "], expected [" +
                std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
}

// A 1-D weight of n elements (a [1, n] or [n] view).
inline std::vector<double> v4_ref_vector(const TensorView& w, int64_t n, const std::string& name) {
  V4RefMatrix m = v4_ref_matrix(w, name);
  v4_ref_expect_shape(m, 1, n, name);
  return std::move(m.v);
}

// Four partial sums so the loop is not one long dependency chain (the order differs from a plain sum only by
// fp64 rounding).
inline double v4_ref_dot(const double* a, const double* b, int64_t n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// y[0, n) += a x[0, n).
inline void v4_ref_axpy(double a, const double* x, double* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    y[i] += a * x[i];
    y[i + 1] += a * x[i + 1];
    y[i + 2] += a * x[i + 2];
    y[i + 3] += a * x[i + 3];
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

// y = W[rows first, first + count) . x.
inline std::vector<double> v4_ref_linear_rows(const V4RefMatrix& w, int64_t first, int64_t count,
                                              std::span<const double> x) {
  if (static_cast<int64_t>(x.size()) != w.cols) {
    v4_ref_fail("a [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "] weight applied to " +
                std::to_string(x.size()) + " inputs");
  }
  std::vector<double> y(static_cast<size_t>(count));
  for (int64_t o = 0; o < count; ++o) y[o] = v4_ref_dot(w.row(first + o), x.data(), w.cols);
  return y;
}

inline std::vector<double> v4_ref_linear(const V4RefMatrix& w, std::span<const double> x) {
  return v4_ref_linear_rows(w, 0, w.rows, x);
}

// x / sqrt(mean(x^2) + eps) * w; no weight when w is empty.
inline std::vector<double> v4_ref_rms_norm(std::span<const double> x, std::span<const double> w, double eps) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * (w.empty() ? 1.0 : w[i]);
  return y;
}

inline double v4_ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double v4_ref_silu(double x) { return x / (1.0 + std::exp(-x)); }
// log(1 + e^x) without overflow.
inline double v4_ref_softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))); }

// The inverse frequencies of the rope dims (qk_rope_head_dim / 2 of them): sliding-window layers use rope_theta
// unscaled; compressed layers compress_rope_theta with YaRN when rope_scaling is yarn (attention factor 1).
inline std::vector<double> v4_ref_inv_freq(const model::ModelConfig& c, bool compressed_layer) {
  const model::DeepseekV4Config& v = c.dsv4;
  const double dim = static_cast<double>(v.qk_rope_head_dim);
  const double base = compressed_layer ? v.compress_rope_theta : c.rope_theta;
  const int64_t half = v.qk_rope_head_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) f[i] = std::pow(base, -2.0 * static_cast<double>(i) / dim);
  if (!compressed_layer || !v.yarn) return f;
  const model::YarnRopeScaling& y = v.rope_scaling;
  const double original = static_cast<double>(y.original_max_position_embeddings);
  // The dim index at which a frequency turns num_rotations times over the original context.
  auto correction_dim = [&](double num_rotations) {
    return dim * std::log(original / (num_rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(y.beta_slow)), dim - 1.0);
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    // ramp 0: extrapolated (kept), ramp 1: interpolated (divided by the factor).
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    f[i] = f[i] * (1.0 - ramp) + f[i] / y.factor * ramp;
  }
  return f;
}

// Rotates the trailing 2 * freqs.size() dims of x in interleaved pairs (2i, 2i + 1) by the angle pos * freq
// (inverse: -pos * freq).
inline void v4_ref_rope(std::span<double> x, const std::vector<double>& freqs, int64_t pos, bool inverse = false) {
  const size_t start = x.size() - 2 * freqs.size();
  for (size_t i = 0; i < freqs.size(); ++i) {
    const double a = (inverse ? -1.0 : 1.0) * static_cast<double>(pos) * freqs[i];
    const double c = std::cos(a), s = std::sin(a);
    double& re = x[start + 2 * i];
    double& im = x[start + 2 * i + 1];
    const double r0 = re, i0 = im;
    re = r0 * c - i0 * s;
    im = r0 * s + i0 * c;
  }
}

// One hyper-connection site's weights.
struct V4RefHcSite {
  V4RefMatrix fn;  // [(2 + n) n, n H]
  std::vector<double> base, scale;
};

inline V4RefHcSite v4_ref_hc_site(const model::HyperConnectionWeights& w, int64_t n, int64_t hidden,
                                  const std::string& name) {
  V4RefHcSite s{v4_ref_matrix(w.fn, name + ".fn"), v4_ref_vector(w.base, (2 + n) * n, name + ".base"),
                v4_ref_vector(w.scale, 3, name + ".scale")};
  v4_ref_expect_shape(s.fn, (2 + n) * n, n * hidden, name + ".fn");
  return s;
}

// A site's mixing weights for one token: pre [n], post [n], comb [n * n] (comb[j * n + k]: stream j into k).
struct V4RefHcMix {
  std::vector<double> pre, post, comb;
};

inline V4RefHcMix v4_ref_hc_mix(const V4RefHcSite& s, std::span<const double> x, int64_t n, double norm_eps,
                                double hc_eps, int64_t sinkhorn_iters) {
  const std::vector<double> unit = v4_ref_rms_norm(x, {}, norm_eps);
  const std::vector<double> m = v4_ref_linear(s.fn, unit);
  V4RefHcMix h;
  h.pre.resize(static_cast<size_t>(n));
  h.post.resize(static_cast<size_t>(n));
  h.comb.resize(static_cast<size_t>(n * n));
  for (int64_t j = 0; j < n; ++j) {
    h.pre[j] = v4_ref_sigmoid(m[j] * s.scale[0] + s.base[j]) + hc_eps;
    h.post[j] = 2.0 * v4_ref_sigmoid(m[n + j] * s.scale[1] + s.base[n + j]);
  }
  std::vector<double>& cb = h.comb;
  for (int64_t j = 0; j < n; ++j) {  // softmax along each row
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t k = 0; k < n; ++k) {
      cb[j * n + k] = m[2 * n + j * n + k] * s.scale[2] + s.base[2 * n + j * n + k];
      mx = std::max(mx, cb[j * n + k]);
    }
    double sum = 0.0;
    for (int64_t k = 0; k < n; ++k) sum += (cb[j * n + k] = std::exp(cb[j * n + k] - mx));
    for (int64_t k = 0; k < n; ++k) cb[j * n + k] = cb[j * n + k] / sum + hc_eps;
  }
  auto normalize_columns = [&] {
    for (int64_t k = 0; k < n; ++k) {
      double sum = 0.0;
      for (int64_t j = 0; j < n; ++j) sum += cb[j * n + k];
      for (int64_t j = 0; j < n; ++j) cb[j * n + k] /= sum + hc_eps;
    }
  };
  auto normalize_rows = [&] {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t k = 0; k < n; ++k) sum += cb[j * n + k];
      for (int64_t k = 0; k < n; ++k) cb[j * n + k] /= sum + hc_eps;
    }
  };
  normalize_columns();
  for (int64_t it = 1; it < sinkhorn_iters; ++it) {
    normalize_rows();
    normalize_columns();
  }
  return h;
}

// sum_j pre_j X_j over the streams X [n, H] (flattened).
inline std::vector<double> v4_ref_hc_collapse(std::span<const double> pre, std::span<const double> x, int64_t hidden) {
  std::vector<double> y(static_cast<size_t>(hidden), 0.0);
  for (size_t j = 0; j < pre.size(); ++j) {
    for (int64_t i = 0; i < hidden; ++i) y[i] += pre[j] * x[j * hidden + i];
  }
  return y;
}

// X'_k = post_k y + sum_j comb[j][k] X_j, in place on the streams X [n, H] (flattened).
inline void v4_ref_hc_expand(const V4RefHcMix& h, std::span<const double> y, std::span<double> x) {
  const int64_t n = static_cast<int64_t>(h.post.size()), hidden = static_cast<int64_t>(y.size());
  const std::vector<double> old(x.begin(), x.end());
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t i = 0; i < hidden; ++i) {
      double v = h.post[k] * y[i];
      for (int64_t j = 0; j < n; ++j) v += h.comb[j * n + k] * old[j * hidden + i];
      x[k * hidden + i] = v;
    }
  }
}

// One head's attention over K = V rows: p_j = exp(scale q.kv_j) / (sum_i exp(scale q.kv_i) + exp(sink));
// returns sum_j p_j kv_j (the sink takes probability mass and contributes no value).
inline std::vector<double> v4_ref_sink_attention(std::span<const double> q, std::span<const double* const> kv,
                                                 double scale, double sink) {
  const int64_t d = static_cast<int64_t>(q.size());
  std::vector<double> logit(kv.size());
  double mx = sink;
  for (size_t j = 0; j < kv.size(); ++j) mx = std::max(mx, logit[j] = scale * v4_ref_dot(q.data(), kv[j], d));
  double denom = std::exp(sink - mx);
  for (double& v : logit) denom += (v = std::exp(v - mx));
  std::vector<double> o(static_cast<size_t>(d), 0.0);
  for (size_t j = 0; j < kv.size(); ++j) v4_ref_axpy(logit[j] / denom, kv[j], o.data(), d);
  return o;
}

// A compressor: windows of `ratio` tokens pooled into one entry of `width` dims.
struct V4RefCompressor {
  int64_t ratio = 0, width = 0;
  bool overlap = false;
  V4RefMatrix wkv, wgate, ape;  // [coff W, hidden] twice, [ratio, coff W]
  std::vector<double> norm;     // [W]
};

inline V4RefCompressor v4_ref_compressor(const model::V4CompressorWeights& w, int64_t ratio, int64_t width,
                                         int64_t hidden, const std::string& name) {
  V4RefCompressor cmp;
  cmp.ratio = ratio;
  cmp.width = width;
  cmp.overlap = ratio == 4;
  const int64_t coff = cmp.overlap ? 2 : 1;
  cmp.wkv = v4_ref_matrix(w.wkv, name + ".wkv");
  cmp.wgate = v4_ref_matrix(w.wgate, name + ".wgate");
  cmp.ape = v4_ref_matrix(w.ape, name + ".ape");
  cmp.norm = v4_ref_vector(w.norm, width, name + ".norm");
  v4_ref_expect_shape(cmp.wkv, coff * width, hidden, name + ".wkv");
  v4_ref_expect_shape(cmp.wgate, coff * width, hidden, name + ".wgate");
  v4_ref_expect_shape(cmp.ape, ratio, coff * width, name + ".ape");
  return cmp;
}

// Window w's entry before the norm, from every token's kv = wkv x and score = wgate x (coff W each): per
// channel, the softmax over the window's slots of score + ape weighs the slots' kv.
inline std::vector<double> v4_ref_pool_window(const V4RefCompressor& cmp, const std::vector<std::vector<double>>& kv,
                                              const std::vector<std::vector<double>>& score, int64_t w) {
  const int64_t m = cmp.ratio, W = cmp.width;
  std::vector<double> entry(static_cast<size_t>(W));
  std::vector<double> logit, value;
  for (int64_t d = 0; d < W; ++d) {
    logit.clear();
    value.clear();
    if (cmp.overlap && w > 0) {  // the previous window's tokens through the first W channels
      for (int64_t i = 0; i < m; ++i) {
        const int64_t t = m * (w - 1) + i;
        logit.push_back(score[t][d] + cmp.ape.at(i, d));
        value.push_back(kv[t][d]);
      }
    }
    const int64_t off = cmp.overlap ? W : 0;  // this window's tokens through the last W channels
    for (int64_t i = 0; i < m; ++i) {
      const int64_t t = m * w + i;
      logit.push_back(score[t][off + d] + cmp.ape.at(i, off + d));
      value.push_back(kv[t][off + d]);
    }
    const double mx = *std::max_element(logit.begin(), logit.end());
    double sum = 0.0, acc = 0.0;
    for (size_t j = 0; j < logit.size(); ++j) {
      const double e = std::exp(logit[j] - mx);
      sum += e;
      acc += e * value[j];
    }
    entry[d] = acc / sum;
  }
  return entry;
}

// The entries of every complete window of the tokens' (normed attention) inputs x: pooled, RMSNorm'd with the
// compressor's norm, then RoPE'd at the window's first position.
inline std::vector<std::vector<double>> v4_ref_compress(const V4RefCompressor& cmp,
                                                        const std::vector<std::vector<double>>& x,
                                                        const std::vector<double>& freqs, double eps) {
  const int64_t windows = static_cast<int64_t>(x.size()) / cmp.ratio;
  std::vector<std::vector<double>> kv(static_cast<size_t>(windows * cmp.ratio)), score(kv.size());
  for (size_t t = 0; t < kv.size(); ++t) {
    kv[t] = v4_ref_linear(cmp.wkv, x[t]);
    score[t] = v4_ref_linear(cmp.wgate, x[t]);
  }
  std::vector<std::vector<double>> entries(static_cast<size_t>(windows));
  for (int64_t w = 0; w < windows; ++w) {
    entries[w] = v4_ref_rms_norm(v4_ref_pool_window(cmp, kv, score, w), cmp.norm, eps);
    v4_ref_rope(entries[w], freqs, cmp.ratio * w);
  }
  return entries;
}

// Indices of v sorted best first, ties to the lower index.
inline std::vector<int64_t> v4_ref_ranked(std::span<const double> v) {
  std::vector<int64_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
  return idx;
}

struct V4RefMlp {
  V4RefMatrix gate, up, down;
};

inline V4RefMlp v4_ref_mlp(const model::MlpWeights& w, int64_t hidden, int64_t width, const std::string& name) {
  V4RefMlp e{v4_ref_matrix(w.gate_proj, name + ".w1"), v4_ref_matrix(w.up_proj, name + ".w3"),
             v4_ref_matrix(w.down_proj, name + ".w2")};
  v4_ref_expect_shape(e.gate, width, hidden, name + ".w1");
  v4_ref_expect_shape(e.up, width, hidden, name + ".w3");
  v4_ref_expect_shape(e.down, hidden, width, name + ".w2");
  return e;
}

// down(silu(min(g, L)) * clamp(u, -L, L)); no clamp when L <= 0.
inline std::vector<double> v4_ref_swiglu(const V4RefMlp& e, std::span<const double> x, double limit) {
  std::vector<double> g = v4_ref_linear(e.gate, x);
  const std::vector<double> u = v4_ref_linear(e.up, x);
  for (size_t i = 0; i < g.size(); ++i) {
    const double gi = limit > 0 ? std::min(g[i], limit) : g[i];
    const double ui = limit > 0 ? std::clamp(u[i], -limit, limit) : u[i];
    g[i] = v4_ref_silu(gi) * ui;
  }
  return v4_ref_linear(e.down, g);
}

// One layer's weights as exact fp64 values (the routed experts converted when first used).
struct V4RefLayer {
  int64_t ratio = 0;  // compress ratio: 0 sliding window only, 4 with overlap and the indexer
  std::vector<double> attn_norm, ffn_norm, q_norm, kv_norm, sink;
  V4RefMatrix wq_a, wq_b, wkv, wo_a, wo_b;
  V4RefCompressor compressor, index_compressor;
  V4RefMatrix index_wq_b, index_weights_proj;
  V4RefHcSite hc_attn, hc_ffn;
  V4RefMatrix router;
  std::vector<double> bias;  // top-k layers
  bool hash = false;
  std::vector<std::unique_ptr<V4RefMlp>> experts;
  bool has_shared = false;
  V4RefMlp shared;
};

inline V4RefLayer v4_ref_layer(const model::ModelConfig& c, const model::LayerWeights& lw, int64_t l) {
  const model::DeepseekV4Config& v = c.dsv4;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, D = c.head_dim, n = v.hc_mult;
  const std::string p = "layers." + std::to_string(l) + ".";
  const model::V4AttentionWeights& a = lw.v4;
  V4RefLayer L;
  L.ratio = v.compress_ratio(l);
  if (L.ratio < 0 || L.ratio == 1) v4_ref_fail(p + "compress ratio " + std::to_string(L.ratio) + ": must be 0 or > 1");
  L.attn_norm = v4_ref_vector(lw.input_layernorm, H, p + "attn_norm");
  L.ffn_norm = v4_ref_vector(lw.post_attention_layernorm, H, p + "ffn_norm");
  L.wq_a = v4_ref_matrix(a.wq_a, p + "attn.wq_a");
  v4_ref_expect_shape(L.wq_a, v.q_lora_rank, H, p + "attn.wq_a");
  L.q_norm = v4_ref_vector(a.q_norm, v.q_lora_rank, p + "attn.q_norm");
  L.wq_b = v4_ref_matrix(a.wq_b, p + "attn.wq_b");
  v4_ref_expect_shape(L.wq_b, nh * D, v.q_lora_rank, p + "attn.wq_b");
  L.wkv = v4_ref_matrix(a.wkv, p + "attn.wkv");
  v4_ref_expect_shape(L.wkv, D, H, p + "attn.wkv");
  L.kv_norm = v4_ref_vector(a.kv_norm, D, p + "attn.kv_norm");
  if (v.o_groups <= 0 || nh % v.o_groups != 0) {
    v4_ref_fail("o_groups " + std::to_string(v.o_groups) + " does not divide " + std::to_string(nh) + " heads");
  }
  L.wo_a = v4_ref_matrix(a.wo_a, p + "attn.wo_a");
  v4_ref_expect_shape(L.wo_a, v.o_groups * v.o_lora_rank, nh * D / v.o_groups, p + "attn.wo_a");
  L.wo_b = v4_ref_matrix(a.wo_b, p + "attn.wo_b");
  v4_ref_expect_shape(L.wo_b, H, v.o_groups * v.o_lora_rank, p + "attn.wo_b");
  L.sink = v4_ref_vector(a.attn_sink, nh, p + "attn.attn_sink");
  if (L.ratio > 0) L.compressor = v4_ref_compressor(a.compressor, L.ratio, D, H, p + "attn.compressor");
  if (L.ratio == 4) {
    if (v.index_topk < 1 || v.index_head_dim < v.qk_rope_head_dim || v.index_n_heads < 1) {
      v4_ref_fail(p + "indexer: index_topk " + std::to_string(v.index_topk) + ", index_n_heads " +
                  std::to_string(v.index_n_heads) + " and index_head_dim " + std::to_string(v.index_head_dim) +
                  " must be positive, the head at least qk_rope_head_dim wide");
    }
    L.index_compressor = v4_ref_compressor(a.index_compressor, 4, v.index_head_dim, H, p + "attn.indexer.compressor");
    L.index_wq_b = v4_ref_matrix(a.index_wq_b, p + "attn.indexer.wq_b");
    v4_ref_expect_shape(L.index_wq_b, v.index_n_heads * v.index_head_dim, v.q_lora_rank, p + "attn.indexer.wq_b");
    L.index_weights_proj = v4_ref_matrix(a.index_weights_proj, p + "attn.indexer.weights_proj");
    v4_ref_expect_shape(L.index_weights_proj, v.index_n_heads, H, p + "attn.indexer.weights_proj");
  }
  L.hc_attn = v4_ref_hc_site(lw.hc_attn, n, H, p + "hc_attn");
  L.hc_ffn = v4_ref_hc_site(lw.hc_ffn, n, H, p + "hc_ffn");
  L.router = v4_ref_matrix(lw.moe.router, p + "ffn.gate.weight");
  v4_ref_expect_shape(L.router, c.num_experts, H, p + "ffn.gate.weight");
  L.hash = l < v.num_hash_layers;
  if (!L.hash) L.bias = v4_ref_vector(lw.moe.e_score_correction_bias, c.num_experts, p + "ffn.gate.bias");
  if (static_cast<int64_t>(lw.moe.experts.size()) != c.num_experts) {
    v4_ref_fail(p + "ffn.experts has " + std::to_string(lw.moe.experts.size()) + " experts, expected " +
                std::to_string(c.num_experts));
  }
  L.experts.resize(static_cast<size_t>(c.num_experts));
  L.has_shared = v.n_shared_experts > 0;
  if (L.has_shared) {
    L.shared =
        v4_ref_mlp(lw.moe.shared_expert, H, v.n_shared_experts * c.moe_intermediate_size, p + "ffn.shared_experts");
  }
  return L;
}

// tid2eid[token] (I64 or I32).
inline std::vector<int64_t> v4_ref_hash_experts(const TensorView& t, int32_t token, int64_t k, int64_t experts,
                                                const std::string& name) {
  if (t.rank() != 2 || t.dim(1) != k || token >= t.dim(0)) {
    v4_ref_fail(name + " is " + t.shape_string() + ": expected [vocab, " + std::to_string(k) + "]");
  }
  std::vector<int64_t> ids(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    const int64_t off = token * t.stride(0) + j * t.stride(1);
    if (t.dtype() == DType::kI64) {
      ids[j] = t.data_as<const int64_t>()[off];
    } else if (t.dtype() == DType::kI32) {
      ids[j] = t.data_as<const int32_t>()[off];
    } else {
      v4_ref_fail(name + " has dtype " + std::string(dtype_name(t.dtype())) + ": expected i64 or i32");
    }
    if (ids[j] < 0 || ids[j] >= experts) {
      v4_ref_fail(name + "[" + std::to_string(token) + "] names expert " + std::to_string(ids[j]) + " of " +
                  std::to_string(experts));
    }
  }
  return ids;
}

// Logits of every position of one sequence (positions 0..n-1).
inline DeepseekV4Reference deepseek_v4_reference_forward(const model::ModelConfig& c, const model::ModelWeights& w,
                                                         std::span<const int32_t> tokens,
                                                         const DeepseekV4Choices* follow = nullptr) {
  // follow's choice of (layer, token) when it has one, else null.
  const auto followed = [&](const std::vector<std::vector<std::vector<int64_t>>>* v, int64_t l,
                            int64_t t) -> const std::vector<int64_t>* {
    if (!follow || !v || l >= static_cast<int64_t>(v->size()) || t >= static_cast<int64_t>((*v)[l].size()) ||
        (*v)[l][t].empty()) {
      return nullptr;
    }
    return &(*v)[l][t];
  };
  using std::vector;
  const model::DeepseekV4Config& v = c.dsv4;
  const int64_t n = static_cast<int64_t>(tokens.size()), H = c.hidden_size, nh = c.num_attention_heads;
  const int64_t D = c.head_dim, S = v.hc_mult, L = c.num_hidden_layers, V = c.vocab_size;
  const int64_t k = c.num_experts_per_tok, E = c.num_experts;
  const double eps = c.rms_norm_eps, scale = 1.0 / std::sqrt(static_cast<double>(D));
  if (S < 1) v4_ref_fail("hc_mult " + std::to_string(S) + ": must be at least 1");
  if (static_cast<int64_t>(v.compress_ratios.size()) < L) v4_ref_fail("compress_ratios shorter than the layers");
  if (v.sliding_window < 1) v4_ref_fail("sliding_window " + std::to_string(v.sliding_window) + ": must be positive");
  if (k < 1 || k > E) v4_ref_fail("num_experts_per_tok " + std::to_string(k) + " of " + std::to_string(E) + " experts");
  if (v.qk_rope_head_dim % 2 != 0 || v.qk_rope_head_dim > D || static_cast<int64_t>(w.layers.size()) != L) {
    v4_ref_fail("qk_rope_head_dim or the layer count does not fit the weights");
  }
  const vector<double> main_freqs = v4_ref_inv_freq(c, false), compress_freqs = v4_ref_inv_freq(c, true);

  DeepseekV4Reference out;
  out.num_tokens = n;
  out.vocab_size = V;
  out.experts.assign(L, {});
  out.expert_margin.assign(L, {});
  out.index_selected.assign(L, {});
  out.index_margin.assign(L, {});

  // The residual streams of every token: X[t] = [S, H] flattened.
  const V4RefMatrix embed = v4_ref_matrix(w.embed_tokens, "embed");
  v4_ref_expect_shape(embed, V, H, "embed");
  vector<vector<double>> X(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= V)
      v4_ref_fail("token id " + std::to_string(tokens[t]) + " outside the vocabulary");
    for (int64_t j = 0; j < S; ++j) X[t].insert(X[t].end(), embed.row(tokens[t]), embed.row(tokens[t]) + H);
  }

  for (int64_t l = 0; l < L; ++l) {
    V4RefLayer ly = v4_ref_layer(c, w.layers[static_cast<size_t>(l)], l);
    const bool compressed = ly.ratio > 0, sparse = ly.ratio == 4;
    const vector<double>& freqs = compressed ? compress_freqs : main_freqs;

    // --- attention site: the streams collapse into each token's normed attention input.
    vector<V4RefHcMix> mix(static_cast<size_t>(n));
    vector<vector<double>> x(static_cast<size_t>(n)), kv(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      mix[t] = v4_ref_hc_mix(ly.hc_attn, X[t], S, eps, v.hc_eps, v.hc_sinkhorn_iters);
      x[t] = v4_ref_rms_norm(v4_ref_hc_collapse(mix[t].pre, X[t], H), ly.attn_norm, eps);
      kv[t] = v4_ref_rms_norm(v4_ref_linear(ly.wkv, x[t]), ly.kv_norm, eps);
      v4_ref_rope(kv[t], freqs, t);
    }
    const vector<vector<double>> entries =
        compressed ? v4_ref_compress(ly.compressor, x, compress_freqs, eps) : vector<vector<double>>{};
    const vector<vector<double>> index_keys =
        sparse ? v4_ref_compress(ly.index_compressor, x, compress_freqs, eps) : vector<vector<double>>{};

    for (int64_t t = 0; t < n; ++t) {
      const vector<double> qr = v4_ref_rms_norm(v4_ref_linear(ly.wq_a, x[t]), ly.q_norm, eps);
      const int64_t visible = compressed ? (t + 1) / ly.ratio : 0;
      // The compressed entries this query attends to.
      vector<int64_t> chosen(static_cast<size_t>(visible));
      std::iota(chosen.begin(), chosen.end(), 0);
      if (sparse) {
        const int64_t ih = v.index_n_heads, id = v.index_head_dim;
        vector<double> qi = v4_ref_linear(ly.index_wq_b, qr);
        for (int64_t h = 0; h < ih; ++h) v4_ref_rope(std::span(qi).subspan(h * id, id), compress_freqs, t);
        const vector<double> hw = v4_ref_linear(ly.index_weights_proj, x[t]);
        const double head_scale = 1.0 / std::sqrt(static_cast<double>(ih)),
                     dot_scale = 1.0 / std::sqrt(static_cast<double>(id));
        vector<double> score(static_cast<size_t>(visible), 0.0);
        for (int64_t e = 0; e < visible; ++e) {
          for (int64_t h = 0; h < ih; ++h) {
            const double dot = v4_ref_dot(qi.data() + h * id, index_keys[e].data(), id);
            score[e] += hw[h] * head_scale * std::max(dot, 0.0) * dot_scale;
          }
        }
        const vector<int64_t> order = v4_ref_ranked(score);
        const int64_t keep = std::min(v.index_topk, visible);
        chosen.assign(order.begin(), order.begin() + keep);
        std::sort(chosen.begin(), chosen.end());
        if (const vector<int64_t>* f = followed(follow ? &follow->index_selected : nullptr, l, t)) {
          for (int64_t e : *f) {
            if (e < 0 || e >= visible) v4_ref_fail("a followed indexer entry " + std::to_string(e) + " is not visible");
          }
          chosen = *f;
        }
        out.index_margin[l].push_back(keep < visible ? score[order[keep - 1]] - score[order[keep]]
                                                     : std::numeric_limits<double>::infinity());
        out.index_selected[l].push_back(chosen);
      }
      vector<const double*> keys;
      for (int64_t s = std::max<int64_t>(0, t - v.sliding_window + 1); s <= t; ++s) keys.push_back(kv[s].data());
      for (int64_t e : chosen) keys.push_back(entries[e].data());

      vector<double> o(static_cast<size_t>(nh * D));
      for (int64_t h = 0; h < nh; ++h) {
        vector<double> q = v4_ref_linear_rows(ly.wq_b, h * D, D, qr);
        q = v4_ref_rms_norm(q, {}, eps);
        v4_ref_rope(q, freqs, t);
        vector<double> oh = v4_ref_sink_attention(q, keys, scale, ly.sink[h]);
        v4_ref_rope(oh, freqs, t, /*inverse=*/true);
        std::copy(oh.begin(), oh.end(), o.begin() + h * D);
      }
      // Grouped output projection.
      const int64_t G = v.o_groups, r = v.o_lora_rank, gw = nh * D / G;
      vector<double> z;
      for (int64_t g = 0; g < G; ++g) {
        const vector<double> zg = v4_ref_linear_rows(ly.wo_a, g * r, r, std::span(o).subspan(g * gw, gw));
        z.insert(z.end(), zg.begin(), zg.end());
      }
      v4_ref_hc_expand(mix[t], v4_ref_linear(ly.wo_b, z), X[t]);
    }

    // --- MoE site.
    for (int64_t t = 0; t < n; ++t) {
      const V4RefHcMix m = v4_ref_hc_mix(ly.hc_ffn, X[t], S, eps, v.hc_eps, v.hc_sinkhorn_iters);
      const vector<double> xf = v4_ref_rms_norm(v4_ref_hc_collapse(m.pre, X[t], H), ly.ffn_norm, eps);
      const vector<double> logits = v4_ref_linear(ly.router, xf);
      vector<double> s(static_cast<size_t>(E)), sel(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        s[e] = std::sqrt(v4_ref_softplus(logits[e]));
        sel[e] = ly.hash ? s[e] : s[e] + ly.bias[e];
      }
      vector<int64_t> ids;
      double margin = std::numeric_limits<double>::infinity();
      if (ly.hash) {
        ids = v4_ref_hash_experts(w.layers[static_cast<size_t>(l)].tid2eid, tokens[t], k, E,
                                  "layers." + std::to_string(l) + ".ffn.gate.tid2eid");
      } else {
        const vector<int64_t> order = v4_ref_ranked(sel);
        ids.assign(order.begin(), order.begin() + k);
        if (k < E) margin = sel[order[k - 1]] - sel[order[k]];
        if (const vector<int64_t>* f = followed(follow ? &follow->experts : nullptr, l, t)) {
          if (static_cast<int64_t>(f->size()) != k)
            v4_ref_fail("a followed expert list is not num_experts_per_tok long");
          ids = *f;
        }
      }
      double sum = 0.0;
      for (int64_t e : ids) sum += s[e];
      vector<double> y(static_cast<size_t>(H), 0.0);
      for (int64_t e : ids) {
        const double weight = (c.norm_topk_prob ? s[e] / (sum + 1e-20) : s[e]) * v.routed_scaling_factor;
        std::unique_ptr<V4RefMlp>& ex = ly.experts[e];
        if (!ex) {
          ex = std::make_unique<V4RefMlp>(
              v4_ref_mlp(w.layers[static_cast<size_t>(l)].moe.experts[e], H, c.moe_intermediate_size,
                         "layers." + std::to_string(l) + ".ffn.experts." + std::to_string(e)));
        }
        const vector<double> ye = v4_ref_swiglu(*ex, xf, v.swiglu_limit);
        for (int64_t i = 0; i < H; ++i) y[i] += weight * ye[i];
      }
      if (ly.has_shared) {
        const vector<double> ys = v4_ref_swiglu(ly.shared, xf, v.swiglu_limit);
        for (int64_t i = 0; i < H; ++i) y[i] += ys[i];
      }
      v4_ref_hc_expand(m, y, X[t]);
      out.experts[l].push_back(ids);
      out.expert_margin[l].push_back(margin);
    }
  }

  // Head: collapse the streams, final norm, LM head.
  const V4RefMatrix head_fn = v4_ref_matrix(w.hc_head.fn, "hc_head_fn");
  v4_ref_expect_shape(head_fn, S, S * H, "hc_head_fn");
  const vector<double> head_base = v4_ref_vector(w.hc_head.base, S, "hc_head_base");
  const vector<double> head_scale = v4_ref_vector(w.hc_head.scale, 1, "hc_head_scale");
  const vector<double> final_norm = v4_ref_vector(w.final_norm, H, "norm");
  const V4RefMatrix head = v4_ref_matrix(w.lm_head, "head");
  v4_ref_expect_shape(head, V, H, "head");
  out.logits.reserve(static_cast<size_t>(n * V));
  for (int64_t t = 0; t < n; ++t) {
    const vector<double> m = v4_ref_linear(head_fn, v4_ref_rms_norm(X[t], {}, eps));
    vector<double> pre(static_cast<size_t>(S));
    for (int64_t j = 0; j < S; ++j) pre[j] = v4_ref_sigmoid(m[j] * head_scale[0] + head_base[j]) + v.hc_eps;
    const vector<double> h = v4_ref_rms_norm(v4_ref_hc_collapse(pre, X[t], H), final_norm, eps);
    const vector<double> y = v4_ref_linear(head, h);
    out.logits.insert(out.logits.end(), y.begin(), y.end());
  }
  return out;
}

}  // namespace genbridge::testing
