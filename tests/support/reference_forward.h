#pragma once
// Independent float64 reference forward pass of the Qwen3-MoE family (tests only). Naive and readable on
// purpose: every weight is read as its exact value (BF16/F16/F32 -> double), every intermediate is fp64,
// nothing is fused or reordered for speed. It shares no code with the engine or the kernels; it only reads
// ModelConfig and the weight views of a Checkpoint (either precision).
//
// Per layer: input norm -> q/k/v projections -> per-head q_norm/k_norm -> NeoX RoPE at positions 0..n-1 ->
// causal GQA softmax attention (scale 1/sqrt(head_dim)) -> o_proj -> residual add -> post-attention norm ->
// MoE (router softmax over all experts, top-k with ties to the lower expert id, renormalised when
// norm_topk_prob, SwiGLU experts, weighted sum, plus sigmoid-gated shared expert) or the dense SwiGLU MLP ->
// residual add. Then the final norm and the LM head. Norms are RMSNorm, or Gemma's (1 + w) for every norm
// when the config says so.
//
// Qwen3.5-MoE (Hugging Face's qwen3_5_moe, written from its formulas): a linear-attention layer replaces
// attention by the Gated DeltaNet, run as the naive per-token recurrence: in_proj_qkv -> causal depthwise
// conv1d (kernel K, zero history) + SiLU -> q, k L2-normalised (eps 1e-6 inside the square root), q scaled by
// 1/sqrt(dk); beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias); per value head (key head h / (nv/nk)):
// S <- exp(g) S, delta = beta (v - S^T k), S <- S + k delta^T, o = S^T q; then RMSNorm(o) * w * silu(z) per
// head and out_proj. A full-attention layer's q_proj gives [q | gate] per head; RoPE rotates the first
// rotary_dim dims; the attention output is multiplied by sigmoid(gate) before o_proj.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/config.h"
#include "support/tensor_util.h"

namespace genbridge::testing {

// Exact value of w[r, c] of a 2-D view, or w[c] of a 1-D view (r = 0).
inline double ref_weight(const TensorView& w, int64_t r, int64_t c) {
  const int64_t off = w.rank() == 1 ? c * w.stride(0) : r * w.stride(0) + c * w.stride(1);
  return element_as_double(w, off);
}

// y[o] = sum_i W[o, i] * x[i] for W of shape [out, in].
inline std::vector<double> ref_linear(const TensorView& w, const std::vector<double>& x) {
  if (w.rank() != 2 || w.dim(1) != static_cast<int64_t>(x.size())) {
    throw std::invalid_argument("ref_linear: weight " + w.shape_string() + " does not take " +
                                std::to_string(x.size()) + " inputs");
  }
  std::vector<double> y(static_cast<size_t>(w.dim(0)), 0.0);
  for (int64_t o = 0; o < w.dim(0); ++o) {
    double s = 0.0;
    for (int64_t i = 0; i < w.dim(1); ++i) s += ref_weight(w, o, i) * x[i];
    y[o] = s;
  }
  return y;
}

// RMSNorm of x[0..n) with weight w (1-D view of n): x / sqrt(mean(x^2) + eps) * w, or * (1 + w) for gemma.
inline std::vector<double> ref_norm(std::span<const double> x, const TensorView& w, double eps, model::NormType type) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double g = ref_weight(w, 0, static_cast<int64_t>(i));
    y[i] = x[i] * rstd * (type == model::NormType::kGemma ? 1.0 + g : g);
  }
  return y;
}

// NeoX-style RoPE in place on one head: pairs (i, i + d/2) rotate by pos * theta^(-2i/d).
inline void ref_rope_neox(std::span<double> head, int64_t pos, double theta) {
  const int64_t half = static_cast<int64_t>(head.size()) / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head.size()));
    const double angle = static_cast<double>(pos) * inv_freq;
    const double c = std::cos(angle), s = std::sin(angle);
    const double x1 = head[i], x2 = head[i + half];
    head[i] = x1 * c - x2 * s;
    head[i + half] = x2 * c + x1 * s;
  }
}

// Causal GQA attention over n positions. q: [n, heads, d], k and v: [n, kv_heads, d] (row-major, RoPE
// applied); query head h reads kv head h / (heads / kv_heads). Returns [n, heads, d].
inline std::vector<double> ref_attention(const std::vector<double>& q, const std::vector<double>& k,
                                         const std::vector<double>& v, int64_t n, int64_t heads, int64_t kv_heads,
                                         int64_t d) {
  std::vector<double> out(static_cast<size_t>(n * heads * d), 0.0);
  const int64_t group = heads / kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / group;
      const double* qi = &q[(i * heads + h) * d];
      double mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        const double* kj = &k[(j * kv_heads + g) * d];
        double s = 0.0;
        for (int64_t c = 0; c < d; ++c) s += qi[c] * kj[c];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
      double* o = &out[(i * heads + h) * d];
      for (int64_t j = 0; j <= i; ++j) {
        const double* vj = &v[(j * kv_heads + g) * d];
        for (int64_t c = 0; c < d; ++c) o[c] += p[j] / sum * vj[c];
      }
    }
  }
  return out;
}

inline double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }
inline double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// SwiGLU: down(silu(gate x) * up x).
inline std::vector<double> ref_mlp(const model::MlpWeights& m, const std::vector<double>& x) {
  std::vector<double> g = ref_linear(m.gate_proj, x);
  const std::vector<double> u = ref_linear(m.up_proj, x);
  for (size_t i = 0; i < g.size(); ++i) g[i] = ref_silu(g[i]) * u[i];
  return ref_linear(m.down_proj, g);
}

// One token's routing decision.
struct RefRouting {
  std::vector<double> probs;    // softmax over all experts
  std::vector<int64_t> ids;     // top-k by probability, ties to the lower expert id
  std::vector<double> weights;  // probs[ids], divided by their sum when norm_topk_prob
};

inline RefRouting ref_route(const std::vector<double>& logits, int64_t k, bool norm_topk_prob) {
  RefRouting r;
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (double l : logits) sum += std::exp(l - mx);
  for (double l : logits) r.probs.push_back(std::exp(l - mx) / sum);
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return r.probs[a] > r.probs[b]; });
  r.ids.assign(order.begin(), order.begin() + k);
  double topk_sum = 0.0;
  for (int64_t e : r.ids) topk_sum += r.probs[e];
  for (int64_t e : r.ids) r.weights.push_back(norm_topk_prob ? r.probs[e] / topk_sum : r.probs[e]);
  return r;
}

// The MoE block for one token; `routing` receives the decision. `follow` (optional, non-empty): take these
// experts instead of the top-k (an engine's recorded choice), weighted by their probabilities as the top-k are.
inline std::vector<double> ref_moe(const model::ModelConfig& c, const model::MoeWeights& m,
                                   const std::vector<double>& x, RefRouting* routing,
                                   const std::vector<int64_t>* follow = nullptr) {
  *routing = ref_route(ref_linear(m.router, x), c.num_experts_per_tok, c.norm_topk_prob);
  if (follow && !follow->empty()) {
    routing->ids = *follow;
    routing->weights.clear();
    double sum = 0.0;
    for (int64_t e : routing->ids) sum += routing->probs[static_cast<size_t>(e)];
    for (int64_t e : routing->ids) {
      routing->weights.push_back(c.norm_topk_prob ? routing->probs[static_cast<size_t>(e)] / sum
                                                  : routing->probs[static_cast<size_t>(e)]);
    }
  }
  std::vector<double> out(x.size(), 0.0);
  for (size_t j = 0; j < routing->ids.size(); ++j) {
    const std::vector<double> y = ref_mlp(m.experts[static_cast<size_t>(routing->ids[j])], x);
    for (size_t i = 0; i < out.size(); ++i) out[i] += routing->weights[j] * y[i];
  }
  if (c.has_shared_expert()) {
    const double gate = ref_sigmoid(ref_linear(m.shared_expert_gate, x)[0]);
    const std::vector<double> y = ref_mlp(m.shared_expert, x);
    for (size_t i = 0; i < out.size(); ++i) out[i] += gate * y[i];
  }
  return out;
}

// Qwen3.5's Gated DeltaNet mixer over one sequence's residual stream `h` [n][hidden] (input norm included),
// added into it (see the file comment): the naive per-token recurrence from a zero state.
inline void ref_gated_deltanet(const model::ModelConfig& c, const model::LayerWeights& lw,
                               std::vector<std::vector<double>>& h) {
  const model::Qwen35Config& q = c.qwen35;
  const model::LinearAttentionWeights& g = lw.gdn;
  const int64_t n = static_cast<int64_t>(h.size()), C = q.conv_dim(), Kd = q.key_dim(), nk = q.linear_num_key_heads,
                nv = q.linear_num_value_heads, dk = q.linear_key_head_dim, dv = q.linear_value_head_dim,
                K = q.linear_conv_kernel_dim, group = nv / nk;
  std::vector<std::vector<double>> mixed, z, a, b;
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<double> x = ref_norm(h[t], lw.input_layernorm, c.rms_norm_eps, c.norm_type);
    mixed.push_back(ref_linear(g.in_proj_qkv, x));
    z.push_back(ref_linear(g.in_proj_z, x));
    a.push_back(ref_linear(g.in_proj_a, x));
    b.push_back(ref_linear(g.in_proj_b, x));
  }
  std::vector<double> S(static_cast<size_t>(nv * dk * dv), 0.0);  // S[h][i][j]
  const auto l2 = [](std::span<double> v, double scale) {
    double ss = 0;
    for (double e : v) ss += e * e;
    const double inv = scale / std::sqrt(ss + 1e-6);
    for (double& e : v) e *= inv;
  };
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> x(static_cast<size_t>(C));
    for (int64_t ch = 0; ch < C; ++ch) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t src = t - (K - 1) + j;
        if (src >= 0) acc += ref_weight(g.conv1d, ch, j) * mixed[src][ch];
      }
      x[ch] = ref_silu(acc);
    }
    std::vector<double> o(static_cast<size_t>(nv * dv));
    for (int64_t hv = 0; hv < nv; ++hv) {
      const int64_t hk = hv / group;
      std::vector<double> qv(x.begin() + hk * dk, x.begin() + (hk + 1) * dk);
      std::vector<double> kv(x.begin() + Kd + hk * dk, x.begin() + Kd + (hk + 1) * dk);
      const double* vv = &x[2 * Kd + hv * dv];
      l2(qv, 1.0 / std::sqrt(static_cast<double>(dk)));
      l2(kv, 1.0);
      const double beta = ref_sigmoid(b[t][hv]);
      const double sp_in = a[t][hv] + ref_weight(g.dt_bias, 0, hv);
      const double gt = -std::exp(ref_weight(g.A_log, 0, hv)) * std::log1p(std::exp(sp_in));
      double* Sh = &S[hv * dk * dv];
      const double decay = std::exp(gt);
      for (int64_t i = 0; i < dk * dv; ++i) Sh[i] *= decay;
      for (int64_t jv = 0; jv < dv; ++jv) {
        double u = 0;
        for (int64_t i = 0; i < dk; ++i) u += Sh[i * dv + jv] * kv[i];
        const double delta = beta * (vv[jv] - u);
        for (int64_t i = 0; i < dk; ++i) Sh[i * dv + jv] += kv[i] * delta;
      }
      double ss = 0;
      for (int64_t jv = 0; jv < dv; ++jv) {
        double acc = 0;
        for (int64_t i = 0; i < dk; ++i) acc += Sh[i * dv + jv] * qv[i];
        o[hv * dv + jv] = acc;
        ss += acc * acc;
      }
      const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(dv) + c.rms_norm_eps);
      for (int64_t jv = 0; jv < dv; ++jv) {
        o[hv * dv + jv] *= rstd * ref_weight(g.norm, 0, jv) * ref_silu(z[t][hv * dv + jv]);
      }
    }
    const std::vector<double> out = ref_linear(g.out_proj, o);
    for (size_t i = 0; i < out.size(); ++i) h[t][i] += out[i];
  }
}

struct ReferenceForward {
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  std::vector<double> logits;  // [num_tokens, vocab_size]
  // Per layer; empty for dense layers. topk_ids / topk_weights: [num_tokens, k]; router_probs: [num_tokens, E].
  std::vector<std::vector<int64_t>> topk_ids;
  std::vector<std::vector<double>> topk_weights;
  std::vector<std::vector<double>> router_probs;
  // Per layer, [num_tokens]: router logit gap between the k-th and (k+1)-th expert, log(p_k / p_k+1)
  // (infinity when k == num_experts). An implementation whose router logits differ from these by more than
  // the gap may legitimately pick another expert: compare routing only where the margin exceeds the error.
  std::vector<std::vector<double>> topk_margin;
  // RMS of the residual stream after each layer: [layer][position].
  std::vector<std::vector<double>> residual_rms;

  double logit(int64_t pos, int64_t token) const { return logits[static_cast<size_t>(pos * vocab_size + token)]; }
  std::span<const double> logits_at(int64_t pos) const {
    return {logits.data() + pos * vocab_size, static_cast<size_t>(vocab_size)};
  }
};

// Logits of every position of one sequence (positions 0..n-1). Throws std::invalid_argument on a token id
// outside [0, vocab_size) (a test-side error). `follow_experts` (optional, [layer][token], an entry empty to keep
// the reference's own): route each MoE layer's token to these experts instead (an engine's recorded choices, so
// that a near-tie its bf16 activations flipped is not mistaken for a kernel error).
inline ReferenceForward reference_forward(const model::ModelConfig& c, const model::ModelWeights& w,
                                          std::span<const int32_t> tokens,
                                          const std::vector<std::vector<std::vector<int64_t>>>* follow_experts = nullptr) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hs = c.hidden_size, d = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  ReferenceForward r;
  r.num_tokens = n;
  r.vocab_size = c.vocab_size;
  r.topk_ids.resize(static_cast<size_t>(c.num_hidden_layers));
  r.topk_weights.resize(static_cast<size_t>(c.num_hidden_layers));
  r.router_probs.resize(static_cast<size_t>(c.num_hidden_layers));
  r.topk_margin.resize(static_cast<size_t>(c.num_hidden_layers));
  r.residual_rms.resize(static_cast<size_t>(c.num_hidden_layers));

  // Residual stream: [n][hidden].
  std::vector<std::vector<double>> h(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(hs)));
  for (int64_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size) {
      throw std::invalid_argument("reference_forward: token id " + std::to_string(tokens[t]) + " outside [0, " +
                                  std::to_string(c.vocab_size) + ")");
    }
    for (int64_t i = 0; i < hs; ++i) h[t][i] = ref_weight(w.embed_tokens, tokens[t], i);
  }

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const model::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    if (lw.linear) {
      ref_gated_deltanet(c, lw, h);
    } else {
      // Attention (Qwen3.5: [q | gate] per head, partial rotary, gated output).
      const bool gated = c.is_qwen35();
      const int64_t qh = gated ? 2 * d : d, rot = c.rotary_dim();
      std::vector<double> q(static_cast<size_t>(n * nh * d)), k(static_cast<size_t>(n * nkv * d)),
          v(static_cast<size_t>(n * nkv * d)), gate(static_cast<size_t>(n * nh * d), 0.0);
      for (int64_t t = 0; t < n; ++t) {
        const std::vector<double> x = ref_norm(h[t], lw.input_layernorm, c.rms_norm_eps, c.norm_type);
        const std::vector<double> qt = ref_linear(lw.attn.q_proj, x);
        const std::vector<double> kt = ref_linear(lw.attn.k_proj, x);
        const std::vector<double> vt = ref_linear(lw.attn.v_proj, x);
        for (int64_t hh = 0; hh < nh; ++hh) {
          std::vector<double> head =
              ref_norm(std::span(qt).subspan(hh * qh, d), lw.attn.q_norm, c.rms_norm_eps, c.norm_type);
          ref_rope_neox(std::span(head).first(rot), t, c.rope_theta);
          std::copy(head.begin(), head.end(), q.begin() + (t * nh + hh) * d);
          if (gated) std::copy(qt.begin() + hh * qh + d, qt.begin() + hh * qh + 2 * d, gate.begin() + (t * nh + hh) * d);
        }
        for (int64_t g = 0; g < nkv; ++g) {
          std::vector<double> head =
              ref_norm(std::span(kt).subspan(g * d, d), lw.attn.k_norm, c.rms_norm_eps, c.norm_type);
          ref_rope_neox(std::span(head).first(rot), t, c.rope_theta);
          std::copy(head.begin(), head.end(), k.begin() + (t * nkv + g) * d);
          std::copy(vt.begin() + g * d, vt.begin() + (g + 1) * d, v.begin() + (t * nkv + g) * d);
        }
      }
      std::vector<double> attn = ref_attention(q, k, v, n, nh, nkv, d);
      if (gated) {
        for (size_t i = 0; i < attn.size(); ++i) attn[i] *= ref_sigmoid(gate[i]);
      }
      for (int64_t t = 0; t < n; ++t) {
        const std::vector<double> o = ref_linear(
            lw.attn.o_proj, std::vector<double>(attn.begin() + t * nh * d, attn.begin() + (t + 1) * nh * d));
        for (int64_t i = 0; i < hs; ++i) h[t][i] += o[i];
      }
    }
    // MLP.
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<double> x = ref_norm(h[t], lw.post_attention_layernorm, c.rms_norm_eps, c.norm_type);
      std::vector<double> y;
      if (lw.is_moe) {
        RefRouting routing;
        const std::vector<int64_t>* follow = nullptr;
        if (follow_experts && l < static_cast<int64_t>(follow_experts->size()) &&
            t < static_cast<int64_t>((*follow_experts)[l].size())) {
          follow = &(*follow_experts)[l][t];
        }
        y = ref_moe(c, lw.moe, x, &routing, follow);
        auto& ids = r.topk_ids[static_cast<size_t>(l)];
        auto& wts = r.topk_weights[static_cast<size_t>(l)];
        auto& probs = r.router_probs[static_cast<size_t>(l)];
        ids.insert(ids.end(), routing.ids.begin(), routing.ids.end());
        wts.insert(wts.end(), routing.weights.begin(), routing.weights.end());
        probs.insert(probs.end(), routing.probs.begin(), routing.probs.end());
        std::vector<double> sorted = routing.probs;
        std::sort(sorted.begin(), sorted.end(), std::greater<>());
        const size_t k = static_cast<size_t>(c.num_experts_per_tok);
        r.topk_margin[static_cast<size_t>(l)].push_back(k < sorted.size() ? std::log(sorted[k - 1] / sorted[k])
                                                                          : INFINITY);
      } else {
        y = ref_mlp(lw.dense, x);
      }
      double ss = 0.0;
      for (int64_t i = 0; i < hs; ++i) {
        h[t][i] += y[i];
        ss += h[t][i] * h[t][i];
      }
      r.residual_rms[static_cast<size_t>(l)].push_back(std::sqrt(ss / static_cast<double>(hs)));
    }
  }

  r.logits.reserve(static_cast<size_t>(n * c.vocab_size));
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<double> x = ref_norm(h[t], w.final_norm, c.rms_norm_eps, c.norm_type);
    const std::vector<double> y = ref_linear(w.lm_head, x);
    r.logits.insert(r.logits.end(), y.begin(), y.end());
  }
  return r;
}

}  // namespace genbridge::testing
