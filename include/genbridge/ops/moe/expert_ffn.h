#pragma once
// Stable operator moe/expert_ffn: SwiGLU experts applied to the tokens routed to them (grouped: the
// layout of tokens per expert is computed first, then only the experts the batch routes to run).

#include <cstdint>
#include <limits>
#include <memory>
#include <span>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/linear/packed_weights.h"

namespace genbridge::ops {

// One expert's SwiGLU weights in Hugging Face layout: w_gate and w_up [I, H], w_down [H, I]. Views only
// (e.g. into memory-mapped checkpoint tensors); rows contiguous (unit stride along the last dimension),
// any row stride.
struct PackedExpertWeights;
struct ExpertWeights {
  TensorView w_gate;
  TensorView w_up;
  TensorView w_down;
  // Optional: the same bf16 weights packed (pack_expert_weights; not owned, must outlive the call). The op then
  // reads the packed copy only (same bits); the views still give the shapes and are checked against it.
  const PackedExpertWeights* packed = nullptr;
};

// An expert's three matrices in the dot kernel's packed layout (ops/linear/packed_weights.h).
struct PackedExpertWeights {
  PackedWeights gate, up, down;
  std::shared_ptr<void> own;  // their storage, when pack_expert_weights allocated it
};
// Bytes pack_expert_weights needs for e's three matrices (a multiple of 64).
size_t packed_expert_bytes(const ExpertWeights& e);
// Packs e's bf16 weights (e.packed is ignored) into dst (packed_expert_bytes(e) bytes, 64-byte aligned, kept
// alive by the caller), or into storage of its own when dst is null. Errors: weights not bf16, not rank 2,
// non-unit last stride.
Result<PackedExpertWeights> pack_expert_weights(const ExpertWeights& e, void* dst = nullptr);

// No SwiGLU clamp (the default of swiglu_limit below).
inline constexpr float kNoSwigluLimit = std::numeric_limits<float>::infinity();

// For every slot (t, j) whose expert e = topk_ids[t, j] lies in [expert_begin, expert_end):
//   out[t, j, :] = (silu(min(g, L)) * clamp(u, -L, L)) . w_down_e^T, g = x[t] . w_gate_e^T, u = x[t] . w_up_e^T,
// where each product is linear/linear's fp32 reduction, the activation is silu_and_mul's fp32 formula
// (the [I] intermediate stays fp32), and the result is rounded once (RNE) to out's dtype. Slots whose id
// lies outside the range (another rank's experts, or a negative "no expert" id) are not written.
// x: [T, H] fp32/bf16/fp16, any strides; topk_ids: [T, k] int32, any strides; experts[e - expert_begin]
// holds expert e (exactly expert_end - expert_begin entries; all with the same I, H and dtype: bf16 fast
// path, fp16 or fp32); out: [T, k, H] fp32/bf16/fp16, any strides, not overlapping any input.
// L = swiglu_limit (> 0; +inf, the default, clamps nothing and gives the unclamped bits: DeepSeek-V4's
// swiglu_limit clamps the gate from above and the up projection on both sides, in fp32, before the
// activation). Batch-invariant: each slot's bits depend only on x[t] and its expert's weights, not on the
// other tokens, the expert range split, nor the thread count. Allocates a fp32 workspace of (routed slots)
// x I floats. Blocks until done; does not retain any view.
Status expert_ffn(const TensorView& x, const TensorView& topk_ids, std::span<const ExpertWeights> experts,
                  int64_t expert_begin, int64_t expert_end, const TensorView& out, float swiglu_limit = kNoSwigluLimit);

// The same with stacked weights: w_gate and w_up [E_w, I, H], w_down [E_w, H, I] (rows contiguous, any
// other strides). Either E_w == expert_end - expert_begin (slice e - expert_begin holds expert e: an FFN
// rank's own experts) or E_w >= expert_end (slice e holds expert e: all experts). A dense or shared MLP
// is E_w = 1, topk_ids all 0, range [0, 1).
Status expert_ffn(const TensorView& x, const TensorView& topk_ids, const TensorView& w_gate, const TensorView& w_up,
                  const TensorView& w_down, int64_t expert_begin, int64_t expert_end, const TensorView& out,
                  float swiglu_limit = kNoSwigluLimit);

}  // namespace genbridge::ops
