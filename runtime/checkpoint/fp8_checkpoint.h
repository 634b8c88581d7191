#pragma once
// Hugging Face FP8 block-scaled checkpoints: the format of the published Qwen3 / DeepSeek-V3
// FP8 checkpoints. config.json carries
//   "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e4m3", ...}
// and each quantized Linear weight W [N, K] is stored as F8_E4M3 codes plus "<name>_scale_inv" (F32 or BF16,
// [ceil(N / bn), ceil(K / bk)]), with W[n, k] = e4m3(code[n, k]) * scale_inv[n / bn, k / bk].
// genbridge reads such a checkpoint by dequantizing each FP8 weight at load into bf16 (one rounding:
// |error| <= 2^-9 |W| on top of the FP8 quantization already in the file); --weight-quant converts the FP8
// weights of its roles from the file's codes and scales directly, without that bf16 step
// (docs/quant_weights.md).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/formats.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::model {

struct Fp8BlockQuantConfig {
  int64_t block_n = 128;      // weight_block_size[0]: rows (output channels) per scale
  int64_t block_k = 128;      // weight_block_size[1]: columns (inputs) per scale
  bool ue8m0_scales = false;  // scale_fmt "ue8m0": every scale is a power of two (checked at load)
  // How the scale of "X.weight" is named and stored: Hugging Face's "X.weight_scale_inv" (F32 or BF16), or
  // DeepSeek-V4's own "X.scale" (F8_E8M0, read as 2^(byte - 127), or F32; docs/deepseek.md).
  bool deepseek_v4_scales = false;
};
// The scale tensor of FP8 weight `weight` under `config`'s naming: "X.weight_scale_inv" or "X.scale".
std::string fp8_scale_tensor_name(std::string_view weight, const Fp8BlockQuantConfig& config);
inline constexpr int64_t kMaxFp8BlockSize = 1 << 16;  // weight_block_size entries are in [1, kMaxFp8BlockSize]

// The whole quantization_config: the block format and the modules it says stay unquantized.
struct Fp8QuantizationConfig {
  Fp8BlockQuantConfig block;
  // modules_to_not_convert (Hugging Face) and ignored_layers (vLLM): "<module>.weight" must not be F8.
  std::vector<std::string> modules_not_converted;
};

// The quantization_config of a config.json text: nullopt when absent; InvalidArgument naming `source`, the
// key, its value and the rule for every key but these, as documented in docs/quant_weights.md:
// quant_method "fp8" (required); weight_block_size two integers in [1, kMaxFp8BlockSize] (required); fmt
// "e4m3"; activation_scheme "dynamic" (genbridge never reads a checkpoint's activation scales); scale_fmt
// "ue8m0"; modules_to_not_convert / ignored_layers lists of module names; dequantize a boolean. A key it
// does not know is refused too (naming the keys it reads): a claim genbridge cannot check is not ignored.
Result<std::optional<Fp8QuantizationConfig>> read_fp8_quantization_config(std::string_view json_text,
                                                                          std::string_view source);

// Checks the scale tensor `scale` of FP8 weight `q` ([N, K], named `name`): its dtype (config.deepseek_v4_scales:
// F8_E8M0 or F32, else F32 or BF16) and its shape [ceil(N / block_n), ceil(K / block_k)]. InvalidArgument naming
// `file`, the scale tensor, what it has and what it needs.
Status check_fp8_block_scale(const TensorView& q, const TensorView& scale, const Fp8BlockQuantConfig& config,
                             std::string_view file, std::string_view name);

// Dequantizes an FP8 weight into `out` (bf16, q's shape): out = bf16(fl32(e4m3(q) * scale_inv[block])).
// q: fp8 e4m3fn [N, K] contiguous; scale_inv: F32 or BF16 [ceil(N / bn), ceil(K / bk)] contiguous (Hugging
// Face's naming; DeepSeek-V4's exact form is deepseek_v4_quant.h's dequantize_v4_fp8).
// InvalidArgument naming `file`, `name` and the rule when the scale tensor's dtype or shape is inconsistent,
// or (config.ue8m0_scales) a scale is not a power of two.
Status dequantize_fp8_block(const TensorView& q, const TensorView& scale_inv, const Fp8BlockQuantConfig& config,
                            std::string_view file, std::string_view name, bf16_t* out);

// Rows [row_begin, row_end) of an FP8 weight decoded into fp32 `out` ([row_end - row_begin, K] row-major):
// out = fl32(e4m3(q) * scale_inv[block]) (one fp32 rounding of the exact product, no bf16 step). The source
// --weight-quant converts FP8 weights from (QuantizedWeights). Same checks and errors as dequantize_fp8_block;
// with config.deepseek_v4_scales the scale is DeepSeek-V4's F8_E8M0 or F32 "X.scale".
Status dequantize_fp8_rows_f32(const TensorView& q, const TensorView& scale_inv, const Fp8BlockQuantConfig& config,
                               std::string_view file, std::string_view name, int64_t row_begin, int64_t row_end,
                               float* out);

// Rewrites the single-file bf16 checkpoint in `dir` (model.safetensors + config.json) as an FP8 block-scaled
// one: the weights a published FP8 checkpoint stores as FP8 -- every attention projection (GQA q/k/v/o; MLA
// q_a/q_b or q, kv_a_proj_with_mqa, kv_b, o; the DSA indexer's wq_b and wk) and every MLP / expert / shared
// expert projection -- become F8_E4M3 + F32 "_scale_inv" with scale_inv = amax(block) / 448 (amax 0: 1) and
// codes rounded to nearest even; everything else (router, indexer weights_proj, embeddings, norms, LM head)
// stays as it is;
// config.json gets the quantization_config above. Blocking file I/O.
Status convert_checkpoint_to_fp8(const std::filesystem::path& dir, const Fp8BlockQuantConfig& config = {});

}  // namespace genbridge::model
