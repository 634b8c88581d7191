#pragma once
// Stable operator moe/quant_expert_ffn: moe/expert_ffn with quantized expert weights, each
// projection a linear/quant_linear in the weights' scheme.

#include <cstdint>
#include <span>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/linear/quant_linear.h"
#include "genbridge/ops/moe/expert_ffn.h"

namespace genbridge::ops {

// One expert's SwiGLU weights, quantized (Hugging Face layout): w_gate and w_up [I, H], w_down [H, I].
struct QuantExpertWeights {
  QuantWeight w_gate;
  QuantWeight w_up;
  QuantWeight w_down;
};

// For every slot (t, j) whose expert e = topk_ids[t, j] lies in [expert_begin, expert_end):
//   g = quant_linear(x[t], w_gate_e), u = quant_linear(x[t], w_up_e)   (fp32 [I])
//   a = silu_and_mul's fp32 formula of (min(g, L), clamp(u, -L, L))      (fp32 [I]; L = swiglu_limit,
//                                                                          expert_ffn's clamp)
//   out[t, j, :] = quant_linear(a, w_down_e) rounded once (RNE) to out's dtype,
// each quant_linear as its contract says for the weights' scheme (W8A8 quantizes x[t] and a per token).
// Slots whose id lies outside the range are not written. x: [T, H] fp32/bf16/fp16, any strides; topk_ids:
// [T, k] int32; experts[e - expert_begin] holds expert e (exactly expert_end - expert_begin entries, one
// scheme, the same I and H); out: [T, k, H] fp32/bf16/fp16, any strides, not overlapping any input.
// Batch-invariant: each slot's bits depend only on x[t] and its expert's weights (not on the other tokens,
// the expert range split, the thread count or the CPU target). Unimplemented (quant_linear's message)
// for a scheme the build's generation cannot run. Blocks until done; does not retain any view.
Status quant_expert_ffn(const TensorView& x, const TensorView& topk_ids, std::span<const QuantExpertWeights> experts,
                        int64_t expert_begin, int64_t expert_end, const TensorView& out,
                        float swiglu_limit = kNoSwigluLimit);

// quant_expert_ffn with W8A8 experts on activations already quantized the way W8A8 quantizes them: qx int8
// [T, H] and sx fp32 [T] are quant/dynamic_quant_per_token (default eps) of some x, and every slot gets the bits
// quant_expert_ffn(x, ...) gives it (the gate and up projections take the codes as they are; the down
// projection's input is quantized as there). qx, sx: any strides; out must not overlap them. InvalidArgument
// when the experts are not W8A8; otherwise the arguments, rules and guarantees of quant_expert_ffn.
Status quant_expert_ffn_prequantized(const TensorView& qx, const TensorView& sx, const TensorView& topk_ids,
                                     std::span<const QuantExpertWeights> experts, int64_t expert_begin,
                                     int64_t expert_end, const TensorView& out, float swiglu_limit = kNoSwigluLimit);

}  // namespace genbridge::ops
