#pragma once
// Internal: how a kernel is dispatched to the CPU target (include/genbridge/core/cpu_target.h). A kernel
// source compiles its body once per Highway target (hwy/foreach_target.h) and exports a table with
// HWY_EXPORT; its entry point calls GB_DISPATCH(name)(args...) once per op call (never per element),
// which first applies GENBRIDGE_CPU_TARGET (once per process) and then picks the chosen target's copy.
// Does not include hwy/highway.h: a kernel source includes it after hwy/foreach_target.h, as Highway requires.

namespace genbridge::simd {

// Applies GENBRIDGE_CPU_TARGET the first time it is called; cheap afterwards (one atomic load).
void ensure_cpu_target();

}  // namespace genbridge::simd

#define GB_DISPATCH(fn) (::genbridge::simd::ensure_cpu_target(), HWY_DYNAMIC_DISPATCH(fn))
