#pragma once
// fp64 oracles for the MLA / DSA operators (attention/mla_decode, sparse_mla_decode, lightning_indexer,
// the MLA and indexer KV writers, norm/layer_norm). Tests and benchmarks only; they follow the contracts'
// definitions in fp64 and share no code with the kernels.

#include <cstdint>
#include <vector>

namespace genbridge::ref {

// The fp8 MLA latent row of x (kv_lora_rank a multiple of 128): per tile of 128 the fp32 scale and the
// dequantized values, as fp8_kv_row does for a whole row.
void fp8_mla_latent_row(const std::vector<double>& x, std::vector<double>& scales, std::vector<double>& dequantized);

// The MXFP8 latent of one row (MlaKvFormat::kMxfp8RopeFirstPacked; x.size() a multiple of 64): per group
// of 64 the E8M0 byte (2^(byte - 127) the smallest power of two >= fp32(max(amax, 1e-4) / 448), byte <= 254)
// and the dequantized values code * 2^(byte - 127), the code e4m3fn round-to-nearest-even, saturated.
void mxfp8_mla_latent_row(const std::vector<double>& x, std::vector<int>& scale_bytes,
                          std::vector<double>& dequantized);

// Attention over one shared key = value head with an optional sink. q [heads][D] of one query, rows [n][D]
// in list order; s_j = scale * q_h . row_j; out [heads][D] = sum_j exp(s_j) row_j / (sum_j exp(s_j) +
// exp(sinks[h])) (no sink term when `sinks` is empty). An empty list gives zeros.
void sharedkv_attention(const std::vector<double>& q, int64_t heads, int64_t D, const std::vector<double>& rows,
                        int64_t n, double scale, const std::vector<double>& sinks, std::vector<double>& out);

// attention/kv_compress in fp64: kv, gate [rows][coff D] row-major (coff = 2 with overlap), ape
// [ratio][coff D]; returns the [windows][D] softmax-gated pools of the contract's slots.
std::vector<double> kv_compress(const std::vector<double>& kv, const std::vector<double>& gate,
                                const std::vector<double>& ape, int64_t ratio, int64_t D, bool overlap,
                                bool has_previous);

// The normalized Walsh-Hadamard transform H x / sqrt(n) in fp64 (n a power of two).
std::vector<double> hadamard(const std::vector<double>& x);

// Absorbed MLA over an explicit list of cached rows. q_latent [heads][L], q_rope [heads][R] of one query;
// latent [n][L], rope [n][R] the rows in list order. out [heads][L] = softmax(scale * (q_l.l + q_r.r)) . latent.
// An empty list gives zeros.
void mla_attention(const std::vector<double>& q_latent, const std::vector<double>& q_rope, int64_t heads, int64_t L,
                   int64_t R, const std::vector<double>& latent, const std::vector<double>& rope, int64_t n,
                   double scale, std::vector<double>& out);

// Lightning-indexer scores of one query over keys [n][D]: sum_h w[h] * ReLU(q[h] . k_s).
std::vector<double> indexer_scores(const std::vector<double>& q, const std::vector<double>& w, int64_t heads,
                                   int64_t D, const std::vector<double>& keys, int64_t n);
// The k best positions of `scores` (higher first, ties to the lower position), in increasing order.
std::vector<int64_t> topk_positions(const std::vector<double>& scores, int64_t k);

// LayerNorm of one row: (x - mean) / sqrt(var + eps) * gamma + beta (biased variance).
std::vector<double> layer_norm(const std::vector<double>& x, const std::vector<double>& gamma,
                               const std::vector<double>& beta, double eps);

}  // namespace genbridge::ref
