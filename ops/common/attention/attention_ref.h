#pragma once
// fp64 oracles for the attention/* and kv_cache/* operators (tests and benchmarks only). They follow
// the contracts' definitions with exact or fp64 arithmetic and share no code with the kernels.

#include <cstdint>
#include <vector>

namespace genbridge::ref {

// Rounds v to the nearest value with `mantissa_bits` fraction bits and minimum normal exponent
// `min_exponent` (subnormals below it), ties to even. No overflow handling.
double round_to_minifloat(double v, int mantissa_bits, int min_exponent);

// The int8 KV row of x: the stored fp16 scale and each element's dequantized value code * scale.
void int8_kv_row(const std::vector<double>& x, double& scale, std::vector<double>& dequantized);
// The fp8 e4m3fn KV row of x: the stored fp32 scale and each element's dequantized value code * scale.
void fp8_kv_row(const std::vector<double>& x, double& scale, std::vector<double>& dequantized);

// NeoX rotary embedding of x [num_tokens][num_heads][head_dim] in place, with the contract's fp32
// inverse frequencies and fp32 angles, then fp64 cos, sin and rotation.
void rope(const std::vector<int64_t>& positions, int64_t num_heads, int64_t head_dim, double theta,
          std::vector<double>& x);

// Causal attention of one sequence. q: [q_len][num_heads][head_dim]; k, v: [ctx][num_kv_heads][head_dim].
// Query i sits at position ctx - q_len + i and sees keys 0..that position. out: [q_len][num_heads][head_dim].
void attention(const std::vector<double>& q, int64_t q_len, int64_t num_heads, const std::vector<double>& k,
               const std::vector<double>& v, int64_t ctx, int64_t num_kv_heads, int64_t head_dim, double scale,
               std::vector<double>& out);

}  // namespace genbridge::ref
