#pragma once
// DeepSeek-V3 RoPE: YaRN's inverse frequencies and attention-scale correction as DeepSeek configures them
// (rope_scaling.type = yarn), the MLA softmax scale, and the two rotation forms the model uses.

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/checkpoint/config.h"

namespace genbridge::model {

// YaRN's attention scale factor: 0.1 * mscale * ln(factor) + 1 for factor > 1, else 1.
double yarn_get_mscale(double factor, double mscale);

// The qk_rope_head_dim / 2 inverse frequencies of the model's RoPE. Without YaRN: theta^(-2i/d). With
// YaRN (HF's DeepseekV3YarnRotaryEmbedding): for d = qk_rope_head_dim, the correction range
//   low = max(floor(cd(beta_fast)), 0), high = min(ceil(cd(beta_slow)), d - 1),
//   cd(r) = d * ln(original_max_position_embeddings / (2 pi r)) / (2 ln theta)
// and ramp(i) = clamp((i - low) / (high - low), 0, 1) (high += 0.001 when equal), inv_freq[i] =
// theta^(-2i/d) * (1 - ramp(i)) + theta^(-2i/d) / factor * ramp(i): high-frequency pairs keep their
// frequency, low-frequency ones are interpolated by `factor`.
std::vector<double> deepseek_rope_inv_freq(const ModelConfig& c);
// The same rule for rope dimension `dim`, base `theta` and, when `yarn` is not null, its YaRN scaling.
std::vector<double> rope_inv_freq(int64_t dim, double theta, const YarnRopeScaling* yarn);

// MLA's softmax scale: (qk_nope_head_dim + qk_rope_head_dim)^-1/2, times yarn_get_mscale(factor,
// mscale_all_dim)^2 under YaRN when mscale_all_dim is non-zero (HF's rule).
double mla_softmax_scale(const ModelConfig& c);

// The indexer's per-head weight scale: index_n_heads^-1/2 * index_head_dim^-1/2.
double indexer_weight_scale(const ModelConfig& c);

// cos / sin tables for positions [0, num_positions): [num_positions, qk_rope_head_dim / 2] fp32 each,
// angle = position * inv_freq[i] evaluated in fp64 then rounded.
struct RopeTables {
  int64_t half = 0;
  std::vector<float> cos, sin;
};
RopeTables make_rope_tables(const ModelConfig& c, int64_t num_positions);

// In-place rotations of one head's rope part x[0, 2 * half) at table row `pos`, in fp32:
// interleaved (MLA): pairs (2i, 2i + 1); non-interleaved (indexer): pairs (i, i + half).
void rope_interleaved(const RopeTables& t, int64_t pos, std::span<float> x);
void rope_half_split(const RopeTables& t, int64_t pos, std::span<float> x);

}  // namespace genbridge::model
