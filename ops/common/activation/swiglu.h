#pragma once
// Internal: the scalar activation formulas shared by activation/silu_and_mul, moe/expert_ffn and
// moe/moe_combine (and the sigmoid and softplus of the gating, routing and hyper-connection ops). One
// definition, so the dense composition linear + silu_and_mul + linear and expert_ffn give the same bits.

#include <cmath>

namespace genbridge::ops::detail {

// silu(g) * u in fp32: (g / (1 + exp(-g))) * u, each step rounded once.
inline float silu_mul(float g, float u) { return (g / (1.0f + std::exp(-g))) * u; }

// DeepSeek-V4's clamped SwiGLU (the swiglu_limit of moe/expert_ffn and moe/quant_expert_ffn): silu_mul of
// min(g, limit) and clamp(u, -limit, limit), in fp32. Comparisons only, so limit = +inf leaves every value
// (NaN and infinities included) as it is and gives silu_mul's bits; a NaN stays NaN, as in torch's clamp.
inline float clamped_silu_mul(float g, float u, float limit) {
  const float gc = limit < g ? limit : g;
  const float uc = u < -limit ? -limit : (limit < u ? limit : u);
  return silu_mul(gc, uc);
}

// 1 / (1 + exp(-v)) in fp32.
inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// softplus in fp32 with torch's threshold: v itself above 20, else log1p(exp(v)).
inline float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

}  // namespace genbridge::ops::detail
