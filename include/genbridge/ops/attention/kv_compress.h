#pragma once
// Stable operator attention/kv_compress: DeepSeek-V4's compressor. Pools each complete window of `ratio`
// tokens into one entry by a per-channel softmax over the window's slots of the gate (plus a learned
// position bias) weighting the projected values; with overlap (the ratio-4 layers and the indexer) each
// entry also pools the previous window's tokens through the first half of the channels. The caller
// normalizes and rotates the entries (norm/rms_norm, attention/rope).

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// kv, gate: [rows, coff * D] fp32/fp16/bf16, any strides, coff = 2 with overlap, else 1; the tokens of
// consecutive complete windows from a window boundary, rows = (num_windows + (overlap ? 1 : 0)) * ratio:
// with overlap the first `ratio` rows are the window before the first output's (ignored, and may hold
// anything, when has_previous is false: the first output is the sequence's window 0).
// ape: fp32 [ratio, coff * D], contiguous (the position bias by slot in the window). ratio >= 1.
// out: [num_windows, D] fp32 or bf16. For output window k, channel d (fp32 throughout):
//   without overlap: slot i in [0, ratio) of window k: z_i = gate[k ratio + i][d] + ape[i][d],
//     v_i = kv[k ratio + i][d];
//   with overlap, b = (k + 1) ratio: slots i in [0, ratio) (skipped when k = 0 and !has_previous):
//     z_i = gate[b - ratio + i][d] + ape[i][d], v_i = kv[b - ratio + i][d]; then slots ratio + i:
//     z = gate[b + i][D + d] + ape[i][D + d], v = kv[b + i][D + d];
//   out[k][d] = sum_i exp(z_i - max z) v_i / sum_i exp(z_i - max z), slots in that order (fused
//   multiply-adds, exp of the attention kernels).
// Validates everything before writing; bit-identical across runs, thread counts and CPU targets; a window's
// result depends only on its own rows; does not retain views.
Status kv_compress(const TensorView& kv, const TensorView& gate, const TensorView& ape, int64_t ratio, bool overlap,
                   bool has_previous, const TensorView& out);

}  // namespace genbridge::ops
