// Internal: what every ops kernel file's per-CPU-target section starts from (Highway and the 16-lane
// contract vectors of core/simd/vec16-inl.h), and the two lines that open and close that section:
//   GB_OPS_KERNELS_BEGIN();  // namespace genbridge::ops::detail::HWY_NAMESPACE, with `hn` (Highway's ops)
//                            // and the contract vectors (V16, Load16, ...) in scope
//   ...the kernels...
//   GB_OPS_KERNELS_END();
// Per-target "-inl.h": included after hwy/foreach_target.h.

#include <hwy/highway.h>

#include "core/simd/vec16-inl.h"

#ifndef GB_OPS_KERNELS_BEGIN
#define GB_OPS_KERNELS_BEGIN()                      \
  HWY_BEFORE_NAMESPACE();                           \
  namespace genbridge::ops::detail::HWY_NAMESPACE { \
  namespace hn = hwy::HWY_NAMESPACE;                \
  using namespace ::genbridge::simd::HWY_NAMESPACE; \
  static_assert(true)
#define GB_OPS_KERNELS_END() \
  }                          \
  HWY_AFTER_NAMESPACE()
#endif
