#pragma once
// A per-request constraint on the tokens a request may generate (structured outputs, forced tool calls:
// docs/serving.md, "Tool calls and structured outputs"). Before each draw the engine asks the request's
// constraint which tokens are allowed, samples among those only, and tells the constraint the token drawn.
// The engine does not know what the constraint is (a grammar, a list of choices): this is its whole interface.

#include <cstdint>
#include <span>

#include "genbridge/core/status.h"

namespace genbridge::engine {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Fills `allowed` ((vocab + 31) / 32 words; bit i % 32 of word i / 32 stands for token i) with the tokens that
  // may come next when `remaining` >= 1 tokens may still be generated, this one included. Returns how many are
  // allowed: 0 ends the request as stopped (the output is complete and nothing may follow). Called on the
  // engine's thread, once per token of the request.
  virtual Result<int64_t> allowed_tokens(std::span<uint32_t> allowed, int64_t remaining) = 0;
  // The token drawn (one that the last allowed_tokens() allowed). An error ends the request.
  virtual Status accept(int32_t token) = 0;
};

// `out` = `logits` with every token not in `allowed` set to -inf, the sampler's masked token (never drawn;
// logits processing masks the same way, so a token masked by either stays masked). `out` and `logits` have the
// vocabulary's length; `allowed` (vocab + 31) / 32 words. Allocation-free.
void apply_token_mask(std::span<const float> logits, std::span<const uint32_t> allowed, std::span<float> out);

// Whether some token in `allowed` has a logit above -inf in `logits` (the logits processing may have masked
// every one of them). Reads the allowed tokens' logits only.
bool any_allowed_drawable(std::span<const float> logits, std::span<const uint32_t> allowed);

}  // namespace genbridge::engine
