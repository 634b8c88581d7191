#include "runtime/engine/token_constraint.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace genbridge::engine {

void apply_token_mask(std::span<const float> logits, std::span<const uint32_t> allowed, std::span<float> out) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  for (size_t w = 0; w < allowed.size(); ++w) {
    const size_t base = w * 32, end = std::min(n, base + 32);
    const uint32_t bits = allowed[w];
    if (bits == 0xFFFFFFFFu) {  // most words of a broad mask (a string's characters): a copy
      std::memcpy(out.data() + base, logits.data() + base, (end - base) * sizeof(float));
    } else if (bits == 0) {
      std::fill(out.begin() + static_cast<std::ptrdiff_t>(base), out.begin() + static_cast<std::ptrdiff_t>(end), kMasked);
    } else {
      for (size_t i = base; i < end; ++i) out[i] = (bits >> (i - base)) & 1u ? logits[i] : kMasked;
    }
  }
}

bool any_allowed_drawable(std::span<const float> logits, std::span<const uint32_t> allowed) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  for (size_t w = 0; w < allowed.size(); ++w) {
    for (uint32_t bits = allowed[w]; bits != 0; bits &= bits - 1) {
      const size_t i = w * 32 + static_cast<size_t>(std::countr_zero(bits));
      if (i < n && logits[i] != kMasked) return true;
    }
  }
  return false;
}

}  // namespace genbridge::engine
