#include "runtime/engine/token_constraint.h"

#include <algorithm>
#include <limits>

namespace genbridge::engine {

void apply_token_mask(std::span<const float> logits, std::span<const uint32_t> allowed, std::span<float> out) {
  constexpr float kMasked = std::numeric_limits<float>::lowest();
  const size_t n = logits.size();
  for (size_t w = 0; w < allowed.size(); ++w) {
    const size_t base = w * 32, end = std::min(n, base + 32);
    const uint32_t bits = allowed[w];
    if (bits == 0xFFFFFFFFu) {
      for (size_t i = base; i < end; ++i) out[i] = logits[i];
    } else if (bits == 0) {
      for (size_t i = base; i < end; ++i) out[i] = kMasked;
    } else {
      for (size_t i = base; i < end; ++i) out[i] = (bits >> (i - base)) & 1 ? logits[i] : kMasked;
    }
  }
}

}  // namespace genbridge::engine
