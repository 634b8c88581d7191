#pragma once
// Independent float64 reference forward pass of the DeepSeek-V3 / V3.2 family (tests only): the oracle for
// the engine's MLA / DSA path. Naive on purpose: MLA in the non-absorbed form (per-head keys and values
// decompressed from the latent with kv_b_proj), the full lightning indexer with its top-k, every weight
// read as its exact value, every intermediate fp64. It shares no code with the engine or the kernels.
//
// Per layer: RMSNorm -> queries (q_a_proj -> q_a_layernorm -> q_b_proj, or q_proj) split per head into
// [nope | rope] -> kv_a_proj_with_mqa = [latent | shared rope key] -> kv_a_layernorm on the latent ->
// kv_b_proj to per-head [k_nope | v] -> RoPE (YaRN inverse frequencies) on q's and k's rope parts in the
// interleaved complex-pair form, pairs (2i, 2i+1) -> causal softmax attention with scale
// qk_head_dim^-1/2 * mscale(factor, mscale_all_dim)^2, over the index_topk positions the indexer selected
// (V3.2) or all -> o_proj -> residual. Indexer (V3.2): q = wq_b(q latent) [index_n_heads, index_head_dim],
// k = LayerNorm(wk x; k_norm weight and bias, eps 1e-6); RoPE on the first qk_rope_head_dim dims of each,
// non-interleaved, pairs (i, i + rope/2); w = weights_proj x * index_n_heads^-1/2 * index_head_dim^-1/2;
// score(t, s) = sum_h w_h ReLU(q_h . k_s) for s <= t; the min(index_topk, t + 1) best, ties to the lower
// position. MLP: dense SwiGLU (layers < first_k_dense_replace or off moe_layer_freq) or DeepSeek MoE: sigmoid
// scores, + e_score_correction_bias for selection, group score = sum of the group's two best, topk_group
// groups, top-k experts of those (ties to lower ids), weights = scores (renormalised when norm_topk_prob)
// * routed_scaling_factor, plus the ungated shared experts. Then the final RMSNorm and the LM head.

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <span>
#include <stdexcept>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/config.h"
#include "support/reference_forward.h"

namespace genbridge::testing {

// DeepSeek's YaRN (its reference inference code's formulation): the rope dims' inverse frequencies.
inline std::vector<double> ds_ref_inv_freq(const model::ModelConfig& c) {
  const double dim = static_cast<double>(c.deepseek.qk_rope_head_dim), base = c.rope_theta;
  const int64_t half = c.deepseek.qk_rope_head_dim / 2;
  std::vector<double> freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) freqs[i] = 1.0 / std::pow(base, (2.0 * static_cast<double>(i)) / dim);
  if (!c.deepseek.yarn) return freqs;
  const model::YarnRopeScaling& y = c.deepseek.rope_scaling;
  const double seq = static_cast<double>(y.original_max_position_embeddings);
  auto find_correction_dim = [&](double num_rotations) {
    return dim * std::log(seq / (num_rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
  };
  double low = std::floor(find_correction_dim(y.beta_fast));
  double high = std::ceil(find_correction_dim(y.beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    double linear = (static_cast<double>(i) - low) / (high - low);
    linear = std::min(1.0, std::max(0.0, linear));
    const double smooth = 1.0 - linear;
    freqs[i] = freqs[i] / y.factor * (1.0 - smooth) + freqs[i] * smooth;
  }
  return freqs;
}

inline double ds_ref_softmax_scale(const model::ModelConfig& c) {
  double scale = std::pow(static_cast<double>(c.deepseek.qk_head_dim()), -0.5);
  const model::YarnRopeScaling& y = c.deepseek.rope_scaling;
  if (c.deepseek.yarn && y.mscale_all_dim != 0.0 && y.factor > 1.0) {
    const double m = 0.1 * y.mscale_all_dim * std::log(y.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

// RoPE on x[0, 2 * freqs.size()) at position pos: interleaved pairs (2i, 2i+1) or split pairs (i, i+half).
inline void ds_ref_rope(std::span<double> x, const std::vector<double>& freqs, int64_t pos, bool interleaved) {
  const size_t half = freqs.size();
  for (size_t i = 0; i < half; ++i) {
    const double a = static_cast<double>(pos) * freqs[i];
    const size_t i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    const double re = x[i0], im = x[i1];
    x[i0] = re * std::cos(a) - im * std::sin(a);
    x[i1] = re * std::sin(a) + im * std::cos(a);
  }
}

inline std::vector<double> ds_ref_layer_norm(const std::vector<double>& x, const TensorView& w, const TensorView& b,
                                             double eps) {
  const double n = static_cast<double>(x.size());
  double mean = 0.0;
  for (double v : x) mean += v;
  mean /= n;
  double var = 0.0;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= n;
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    y[i] = (x[i] - mean) / std::sqrt(var + eps) * ref_weight(w, 0, static_cast<int64_t>(i)) +
           ref_weight(b, 0, static_cast<int64_t>(i));
  }
  return y;
}

// Indices of v sorted best first, ties to the lower index.
inline std::vector<int64_t> ds_ref_ranked(const std::vector<double>& v, std::vector<int64_t> idx) {
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
  return idx;
}

struct DeepseekReference {
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  std::vector<double> logits;  // [num_tokens, vocab_size]
  // Per layer ([layer][token * k + j]); empty for dense layers. topk_margin[layer][token]: the smallest gap
  // between a kept and a dropped candidate (groups or experts) in selection scores.
  std::vector<std::vector<int64_t>> topk_ids;
  std::vector<std::vector<double>> topk_weights;
  std::vector<std::vector<double>> topk_margin;
  // V3.2, per layer and token: the selected positions in increasing order, and the indexer score gap between
  // the last kept and the first dropped position (infinity when every position is kept).
  std::vector<std::vector<std::vector<int64_t>>> index_selected;
  std::vector<std::vector<double>> index_margin;
  std::vector<std::vector<double>> index_score_scale;  // [layer][token]: the largest |score| of the token
  std::vector<std::vector<double>> residual_rms;       // [layer][token]

  double logit(int64_t pos, int64_t token) const { return logits[static_cast<size_t>(pos * vocab_size + token)]; }
  std::span<const double> logits_at(int64_t pos) const {
    return {logits.data() + pos * vocab_size, static_cast<size_t>(vocab_size)};
  }
};

// Logits of every position of one sequence. `index_topk_override` > 0 replaces index_topk (e.g. huge: dense).
inline DeepseekReference deepseek_reference_forward(const model::ModelConfig& c, const model::ModelWeights& w,
                                                    std::span<const int32_t> tokens, int64_t index_topk_override = 0) {
  using std::vector;
  const model::DeepseekConfig& d = c.deepseek;
  const int64_t n = static_cast<int64_t>(tokens.size()), hs = c.hidden_size, nh = c.num_attention_heads;
  const int64_t nope = d.qk_nope_head_dim, rope = d.qk_rope_head_dim, qk = nope + rope, vd = d.v_head_dim;
  const int64_t r = d.kv_lora_rank, L = c.num_hidden_layers;
  const model::NormType rms = model::NormType::kRms;
  const double eps = c.rms_norm_eps, scale = ds_ref_softmax_scale(c);
  const vector<double> freqs = ds_ref_inv_freq(c);
  const int64_t index_topk = index_topk_override > 0 ? index_topk_override : d.index_topk;
  DeepseekReference out;
  out.num_tokens = n;
  out.vocab_size = c.vocab_size;
  out.topk_ids.resize(L);
  out.topk_weights.resize(L);
  out.topk_margin.resize(L);
  out.index_selected.resize(L);
  out.index_margin.resize(L);
  out.index_score_scale.resize(L);
  out.residual_rms.resize(L);

  vector<vector<double>> h(static_cast<size_t>(n), vector<double>(static_cast<size_t>(hs)));
  for (int64_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size) {
      throw std::invalid_argument("deepseek_reference_forward: token id " + std::to_string(tokens[t]) +
                                  " outside the vocabulary");
    }
    for (int64_t i = 0; i < hs; ++i) h[t][i] = ref_weight(w.embed_tokens, tokens[t], i);
  }
  for (int64_t l = 0; l < L; ++l) {
    const model::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    const model::MlaWeights& a = lw.mla;
    // Per token: Q [nh][qk], K [nh][qk], V [nh][vd]; indexer q [ih][id], k [id], weights [ih].
    vector<vector<vector<double>>> Q(n), K(n), V(n), IQ(n);
    vector<vector<double>> IK(n), IW(n);
    for (int64_t t = 0; t < n; ++t) {
      const vector<double> x = ref_norm(h[t], lw.input_layernorm, eps, rms);
      vector<double> q, qr;
      if (d.q_lora_rank > 0) {
        qr = ref_norm(ref_linear(a.q_a_proj, x), a.q_a_layernorm, eps, rms);
        q = ref_linear(a.q_b_proj, qr);
      } else {
        q = ref_linear(a.q_proj, x);
      }
      const vector<double> kv = ref_linear(a.kv_a_proj_with_mqa, x);
      const vector<double> latent = ref_norm(std::span(kv).first(r), a.kv_a_layernorm, eps, rms);
      vector<double> k_pe(kv.begin() + r, kv.end());
      ds_ref_rope(k_pe, freqs, t, /*interleaved=*/true);
      const vector<double> kvb = ref_linear(a.kv_b_proj, latent);
      for (int64_t hh = 0; hh < nh; ++hh) {
        vector<double> qh(q.begin() + hh * qk, q.begin() + (hh + 1) * qk);
        ds_ref_rope(std::span(qh).subspan(nope), freqs, t, true);
        Q[t].push_back(qh);
        vector<double> kh(kvb.begin() + hh * (nope + vd), kvb.begin() + hh * (nope + vd) + nope);
        kh.insert(kh.end(), k_pe.begin(), k_pe.end());
        K[t].push_back(kh);
        V[t].emplace_back(kvb.begin() + hh * (nope + vd) + nope, kvb.begin() + (hh + 1) * (nope + vd));
      }
      if (c.has_indexer()) {
        const int64_t ih = d.index_n_heads, id = d.index_head_dim;
        const vector<double> iq = ref_linear(lw.indexer.wq_b, qr);
        for (int64_t hh = 0; hh < ih; ++hh) {
          vector<double> qh(iq.begin() + hh * id, iq.begin() + (hh + 1) * id);
          ds_ref_rope(std::span(qh).first(rope), freqs, t, /*interleaved=*/false);
          IQ[t].push_back(qh);
        }
        IK[t] = ds_ref_layer_norm(ref_linear(lw.indexer.wk, x), lw.indexer.k_norm, lw.indexer.k_norm_bias, 1e-6);
        ds_ref_rope(std::span(IK[t]).first(rope), freqs, t, false);
        IW[t] = ref_linear(lw.indexer.weights_proj, x);
        for (double& v : IW[t]) v *= std::pow(static_cast<double>(ih), -0.5) * std::pow(static_cast<double>(id), -0.5);
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      // The positions this token attends to.
      vector<int64_t> allowed(static_cast<size_t>(t + 1));
      std::iota(allowed.begin(), allowed.end(), 0);
      if (c.has_indexer()) {
        vector<double> score(static_cast<size_t>(t + 1), 0.0);
        for (int64_t s = 0; s <= t; ++s) {
          for (size_t hh = 0; hh < IQ[t].size(); ++hh) {
            double dot = 0.0;
            for (size_t i = 0; i < IK[s].size(); ++i) dot += IQ[t][hh][i] * IK[s][i];
            score[s] += IW[t][hh] * std::max(dot, 0.0);
          }
        }
        const vector<int64_t> order = ds_ref_ranked(score, allowed);
        const int64_t keep = std::min<int64_t>(index_topk, t + 1);
        allowed.assign(order.begin(), order.begin() + keep);
        std::sort(allowed.begin(), allowed.end());
        out.index_selected[l].push_back(allowed);
        out.index_margin[l].push_back(keep < t + 1 ? score[order[keep - 1]] - score[order[keep]] : INFINITY);
        double scale_t = 0.0;
        for (double v : score) scale_t = std::max(scale_t, std::abs(v));
        out.index_score_scale[l].push_back(scale_t);
      }
      vector<double> o(static_cast<size_t>(nh * vd), 0.0);
      for (int64_t hh = 0; hh < nh; ++hh) {
        vector<double> p;
        double mx = -INFINITY;
        for (int64_t s : allowed) {
          double dot = 0.0;
          for (int64_t i = 0; i < qk; ++i) dot += Q[t][hh][i] * K[s][hh][i];
          p.push_back(dot * scale);
          mx = std::max(mx, p.back());
        }
        double sum = 0.0;
        for (double& v : p) sum += (v = std::exp(v - mx));
        for (size_t j = 0; j < allowed.size(); ++j) {
          for (int64_t i = 0; i < vd; ++i) o[hh * vd + i] += p[j] / sum * V[allowed[j]][hh][i];
        }
      }
      const vector<double> y = ref_linear(a.o_proj, o);
      for (int64_t i = 0; i < hs; ++i) h[t][i] += y[i];
    }
    for (int64_t t = 0; t < n; ++t) {
      const vector<double> x = ref_norm(h[t], lw.post_attention_layernorm, eps, rms);
      vector<double> y(static_cast<size_t>(hs), 0.0);
      if (!lw.is_moe) {
        y = ref_mlp(lw.dense, x);
      } else {
        const int64_t E = c.num_experts, G = d.n_group, gs = E / G, k = c.num_experts_per_tok;
        const vector<double> logits = ref_linear(lw.moe.router, x);
        vector<double> s(E), sel(E);
        for (int64_t e = 0; e < E; ++e) {
          s[e] = ref_sigmoid(logits[e]);
          sel[e] = s[e] + ref_weight(lw.moe.e_score_correction_bias, 0, e);
        }
        vector<double> gscore(G);
        for (int64_t g = 0; g < G; ++g) {
          vector<int64_t> members(gs);
          std::iota(members.begin(), members.end(), g * gs);
          const vector<int64_t> o = ds_ref_ranked(sel, members);
          gscore[g] = gs == 1 ? sel[o[0]] : sel[o[0]] + sel[o[1]];
        }
        vector<int64_t> groups(G);
        std::iota(groups.begin(), groups.end(), 0);
        groups = ds_ref_ranked(gscore, groups);
        double margin = INFINITY;
        if (d.topk_group < G) margin = gscore[groups[d.topk_group - 1]] - gscore[groups[d.topk_group]];
        vector<int64_t> cand;
        for (int64_t i = 0; i < d.topk_group; ++i) {
          for (int64_t e = groups[i] * gs; e < (groups[i] + 1) * gs; ++e) cand.push_back(e);
        }
        std::sort(cand.begin(), cand.end());
        const vector<int64_t> order = ds_ref_ranked(sel, cand);
        if (k < static_cast<int64_t>(order.size())) margin = std::min(margin, sel[order[k - 1]] - sel[order[k]]);
        double sum = 0.0;
        for (int64_t j = 0; j < k; ++j) sum += s[order[j]];
        for (int64_t j = 0; j < k; ++j) {
          const int64_t e = order[j];
          const double wj = (c.norm_topk_prob ? s[e] / (sum + 1e-20) : s[e]) * d.routed_scaling_factor;
          const vector<double> ye = ref_mlp(lw.moe.experts[static_cast<size_t>(e)], x);
          for (int64_t i = 0; i < hs; ++i) y[i] += wj * ye[i];
          out.topk_ids[l].push_back(e);
          out.topk_weights[l].push_back(wj);
        }
        out.topk_margin[l].push_back(margin);
        if (d.n_shared_experts > 0) {
          const vector<double> ys = ref_mlp(lw.moe.shared_expert, x);
          for (int64_t i = 0; i < hs; ++i) y[i] += ys[i];
        }
      }
      double ss = 0.0;
      for (int64_t i = 0; i < hs; ++i) {
        h[t][i] += y[i];
        ss += h[t][i] * h[t][i];
      }
      out.residual_rms[l].push_back(std::sqrt(ss / static_cast<double>(hs)));
    }
  }
  out.logits.reserve(static_cast<size_t>(n * c.vocab_size));
  for (int64_t t = 0; t < n; ++t) {
    const vector<double> x = ref_norm(h[t], w.final_norm, eps, rms);
    const vector<double> y = ref_linear(w.lm_head, x);
    out.logits.insert(out.logits.end(), y.begin(), y.end());
  }
  return out;
}

}  // namespace genbridge::testing
