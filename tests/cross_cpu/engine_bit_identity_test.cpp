// The engine's greedy generation on the tiny synthetic models is bit-identical (tokens and every recorded
// logit) under every CPU target this machine can run, and prints its digest for the cross-machine
// comparison (see cases.h).
#include <gtest/gtest.h>

#include "cross_cpu/cases.h"
#include "runtime/engine/engine_harness.h"

namespace genbridge::cross_cpu {
namespace {

using namespace genbridge::engine::harness;

// Two requests decoded together (prompts of 7 and 19 tokens, 5 new tokens each), in the build's default
// KV representation.
void engine_case(const std::string& preset) {
  const int64_t vocab = checkpoint(preset).config().vocab_size;
  check_case("engine." + preset, [&] {
    std::vector<engine::Request> reqs = {request_of(0, 7, 5, vocab), request_of(1, 19, 5, vocab)};
    const auto res = run_engine({.preset = preset}, reqs);
    CaseResult r;
    for (const auto& one : res) {
      r.outputs.push_back(output_of(DType::kI32, one.tokens.data(), one.tokens.size() * sizeof(int32_t)));
      r.outputs.push_back(output_of(DType::kF32, one.logits.data(), one.logits.size() * sizeof(float)));
    }
    return r;
  });
}

TEST(CrossCpu, engine_tiny) { engine_case("tiny"); }
TEST(CrossCpu, engine_tiny_gemma) { engine_case("tiny-gemma"); }

}  // namespace
}  // namespace genbridge::cross_cpu
