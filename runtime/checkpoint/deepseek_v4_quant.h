#pragma once
// DeepSeek-V4's quantized checkpoint form, as DeepSeek ships it (docs/deepseek.md, "DeepSeek-V4 checkpoints"):
// config.json's quantization_config (quant_method "fp8", fmt "e4m3", scale_fmt "ue8m0", weight_block_size
// [128, 128]) makes the attention's and the shared experts' linears F8_E4M3 with one power-of-two scale per
// 128 x 128 block in "X.scale" (F8_E8M0, or F32 in the expert_dtype "fp8" files); expert_dtype "fp4" makes the
// routed experts MXFP4: "X.weight" I8 [N, K / 2] holding two e2m1 codes per byte (the low nibble is the even
// element), "X.scale" F8_E8M0 [N, K / 32]. genbridge binds each such weight as its bf16 dequantization, which is
// exact: e4m3 and e2m1 values times a power of two are bf16 values unless the product leaves bf16's range,
// and such a product is refused, never rounded.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "genbridge/core/formats.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "runtime/checkpoint/config.h"
#include "runtime/checkpoint/fp8_checkpoint.h"

namespace genbridge::model {

// What a DeepSeek-V4 weight is in the quantized form, by its name (layers.L.* or mtp.M.*), following
// DeepSeek's reference model: the linears built without an explicit dtype are FP8, those built bf16 (the
// compressors, the indexer's weights_proj) and every non-linear tensor are not.
enum class V4WeightRole : uint8_t {
  kPlain,         // BF16 in both forms: embeddings, head, norms, router, compressors, indexer weights_proj, ...
  kFp8Linear,     // attn.{wq_a, wq_b, wkv, wo_a, wo_b}.weight, attn.indexer.wq_b.weight, ffn.shared_experts.w{1,2,3}
  kRoutedExpert,  // ffn.experts.E.w{1,2,3}.weight: MXFP4 (expert_dtype "fp4") or FP8 blocks ("fp8")
};
V4WeightRole deepseek_v4_weight_role(std::string_view name);

// One E8M0 scale per this many elements along K of an MXFP4 weight.
inline constexpr int64_t kMxfp4BlockK = 32;

// Dequantizes an FP8 block weight into `out` (bf16, codes' shape), exactly: out[n, k] = e4m3(codes[n, k]) *
// 2^e, 2^e the scale of its (n / block_n, k / block_k) block. codes: fp8 e4m3fn [N, K]; scale: E8M0 (2^(byte -
// 127): the byte is reinterpreted, so byte 0 is 2^-127) or F32 (a normal power of two) [ceil(N / block_n),
// ceil(K / block_k)]; all contiguous. InvalidArgument naming `file`, the tensor (`name` or its ".scale"), the
// element and the rule for a scale of another dtype or shape, the E8M0 NaN byte 0xFF, an F32 scale that is not
// a power of two, an e4m3 NaN code, and a product bf16 cannot hold exactly (beyond its range or below its
// smallest subnormal, 2^-133); `out` is then partly written. Uses the kernel threads; the result and the element
// an error names do not depend on their number.
Status dequantize_v4_fp8(const TensorView& codes, const TensorView& scale, const Fp8BlockQuantConfig& config,
                         std::string_view file, std::string_view name, bf16_t* out);

// Dequantizes an MXFP4 weight into `out` (bf16 [N, K]), exactly: out[n, k] = e2m1(nibble) * 2^(byte - 127) with
// the nibble the low half of codes[n, k / 2] for even k and the high half for odd k, and the byte
// scale[n, k / 32]. codes: [N, K / 2] one-byte elements (I8, U8 or fp4_e2m1x2); scale: E8M0 [N, K / 32].
// InvalidArgument, as dequantize_v4_fp8, for a scale of another dtype or shape, K not a multiple of 32, the
// NaN byte and a product beyond bf16's range (e2m1 * 2^e never underflows bf16). Uses the kernel threads.
Status dequantize_v4_mxfp4(const TensorView& codes, const TensorView& scale, std::string_view file,
                           std::string_view name, bf16_t* out);

// Rewrites the single-file bf16 DeepSeek-V4 checkpoint in `dir` (model.safetensors + config.json) in DeepSeek's
// FP8 + MXFP4 form: every kFp8Linear weight (MTP layers' included) becomes F8_E4M3 with 128 x 128 blocks, each
// block's scale the smallest power of two 2^e with amax <= 448 * 2^e (F8_E8M0); every routed expert becomes
// MXFP4, each 32 elements along K scaled by the smallest 2^e with amax <= 6 * 2^e (DeepSeek's rule, not OCP MX's
// floor(log2 amax) - 2, which saturates the block's largest values); an all-zero block gets scale 1, exponents are
// clamped to E8M0's [-127, 127], codes are rounded to nearest even and saturated. config.json gets the
// quantization_config above and expert_dtype "fp4". Every dimension along K of a routed expert must be a multiple
// of 32. `experts` kFp8 writes the routed experts as FP8 blocks instead (expert_dtype "fp8", as
// DeepSeek-V4-Flash-Base ships them, there with F32 scales). Blocking file I/O.
Status convert_checkpoint_to_deepseek_v4_fp8(const std::filesystem::path& dir,
                                             V4ExpertDtype experts = V4ExpertDtype::kFp4);

}  // namespace genbridge::model
