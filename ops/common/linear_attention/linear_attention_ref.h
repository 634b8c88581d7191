#pragma once
// fp64 oracles for the Gated DeltaNet operators (linear_attention/causal_conv1d, gdn_gating,
// gated_delta_rule, norm/gated_rms_norm, activation/sigmoid_mul; tests, benchmarks and whole-model fp64
// references only). Each follows its contract's per-token definition in fp64, one sequence (or one batch of
// rows) at a time, on dense row-major vectors; states are passed in and updated in place. They share no code
// with the kernels.

#include <cstdint>
#include <vector>

namespace genbridge::ref {

// One sequence's causal depthwise conv + silu. x: [q_len][C]; weight: [C][K]; conv_state: [K - 1][C], the
// inputs before x (oldest first), replaced by the last K - 1 inputs of history ++ x; y: [q_len][C].
void causal_conv1d(const std::vector<double>& x, int64_t q_len, int64_t C, const std::vector<double>& weight,
                   int64_t K, std::vector<double>& conv_state, std::vector<double>& y);

// g = -exp(A_log) * softplus(a + dt_bias) (softplus(v) = v above 20), beta = sigmoid(b). a, b, g, beta:
// [T][nv]; A_log, dt_bias: [nv].
void gdn_gating(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& A_log,
                const std::vector<double>& dt_bias, int64_t T, int64_t nv, std::vector<double>& g,
                std::vector<double>& beta);

// One sequence's gated delta rule, token by token. q, k: [q_len][nk][dk]; v: [q_len][nv][dv]; g, beta:
// [q_len][nv]; state: [nv][dk][dv] (S[i][c] at i * dv + c), updated in place; out: [q_len][nv][dv].
// k and q are l2-normalised (eps 1e-6 under the root), q then scaled; value head h reads key head h / (nv / nk).
void gated_delta_rule(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                      const std::vector<double>& g, const std::vector<double>& beta, int64_t q_len, int64_t nk,
                      int64_t nv, int64_t dk, int64_t dv, double scale, std::vector<double>& state,
                      std::vector<double>& out);

// y = w * x / sqrt(mean(x^2) + eps) * silu(z) per row of D. x, z, y: [rows][D]; w: [D].
void gated_rms_norm(const std::vector<double>& x, const std::vector<double>& z, const std::vector<double>& w,
                    int64_t rows, int64_t D, double eps, std::vector<double>& y);

// y = x * sigmoid(gate) elementwise.
void sigmoid_mul(const std::vector<double>& x, const std::vector<double>& gate, std::vector<double>& y);

}  // namespace genbridge::ref
