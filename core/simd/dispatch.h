#pragma once
// Internal: how a kernel is dispatched to the CPU target (include/genbridge/core/cpu_target.h). A kernel
// source compiles its body once per Highway target (hwy/foreach_target.h) and exports a table with
// HWY_EXPORT; its entry point calls GB_DISPATCH(name)(args...) once per op call (never per element),
// which first applies GENBRIDGE_CPU_TARGET (once per process) and then picks the chosen target's copy.
// Does not include hwy/highway.h: a kernel source includes it after hwy/foreach_target.h, as Highway requires.

#include <cstdint>

namespace genbridge::simd {

// Applies GENBRIDGE_CPU_TARGET the first time it is called; cheap afterwards (one atomic load).
void ensure_cpu_target();

// Whether the kernels may use the CPU's bf16 dot-product instruction (AVX512_BF16) on top of the avx512 target: the
// CPU has it and the chosen target is "avx512_bf16" (the best one where present). One atomic load; call
// ensure_cpu_target (GB_DISPATCH does) first.
bool bf16_dot_enabled();

// 16 independent chains of `iters` bf16 dot instructions each (vdpbf16ps, 64 flops), in registers; returns a value
// that depends on every chain. The probe behind cpu_bf16_dot_rate and the roofs benchmark's bf16-dot roof. Only
// where the CPU has the instruction (cpu_bf16_dot_rate() > 0).
float bf16_dot_chains(int64_t iters, float seed);
inline constexpr double kBf16DotChainsFlopsPerIter = 16.0 * 64;  // one instruction per chain per iteration

}  // namespace genbridge::simd

#define GB_DISPATCH(fn) (::genbridge::simd::ensure_cpu_target(), HWY_DYNAMIC_DISPATCH(fn))
