#pragma once
// Accuracy of quantized weights against the bf16 engine, for tests and the accuracy benchmark:
// the bf16 runner decodes greedily from a prompt; the quantized runner is fed the same tokens (teacher
// forcing), so every step compares logits of the same context. Per step: relative L2 of the logits
// ||q - b|| / ||b|| and whether the greedy (argmax) tokens agree.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/device_operator.h"
#include "runtime/forward/deepseek_attention.h"
#include "runtime/forward/quant_weights.h"
#include "runtime/forward/runner.h"
#include "runtime/memory/kv_page_pool.h"

namespace genbridge::testing {

struct QuantAccuracy {
  std::string scheme;
  std::vector<double> rel_l2;  // per step (step 0 = the prompt's prefill)
  int64_t agree = 0;           // steps whose argmax tokens agree
  double quantize_seconds = 0;
  uint64_t quantized_bytes = 0, replaced_bytes = 0;
  int64_t steps() const { return static_cast<int64_t>(rel_l2.size()); }
  double agreement() const { return steps() ? static_cast<double>(agree) / static_cast<double>(steps()) : 0.0; }
  double quantile(double q) const {  // nearest rank
    std::vector<double> v = rel_l2;
    std::sort(v.begin(), v.end());
    if (v.empty()) return 0.0;
    const size_t i =
        std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - (q > 0 ? 1 : 0));
    return v[i];
  }
};

namespace quant_accuracy_detail {

inline int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Logits of every step: prefill of `prompt`, then `steps` decode steps fed `forced` (when non-empty) or the
// previous step's argmax. `tokens` receives the fed tokens.
inline Result<std::vector<std::vector<float>>> run(const model::Checkpoint& ckpt, const std::string& weight_quant,
                                                   const std::vector<int32_t>& prompt, int64_t steps,
                                                   const std::vector<int32_t>& forced, std::vector<int32_t>* tokens,
                                                   QuantAccuracy* acc,
                                                   const runtime::QuantizedLayers* roles = nullptr) {
  runtime::DeviceConfig dc;
  dc.weight_quant = weight_quant;
  GB_ASSIGN_OR_RETURN(runtime::DeviceOperator dev, runtime::DeviceOperator::create(dc));
  std::unique_ptr<model::QuantizedWeights> q;
  if (dev.weight_quant()) {
    model::QuantizeOptions options;
    options.mxfp4_repr = dev.mxfp4_weight_quant();
    GB_ASSIGN_OR_RETURN(
        q, model::QuantizedWeights::quantize(ckpt, *dev.weight_quant(),
                                             roles ? *roles : dev.contract().weight_quant.layers, options));
    if (acc) {
      acc->scheme = std::string(ops::weight_quant_scheme_name(dev.weight_quant()->scheme));
      acc->quantize_seconds = q->seconds();
      acc->quantized_bytes = q->quantized_bytes();
      acc->replaced_bytes = q->replaced_bf16_bytes();
    }
  }
  const model::ModelConfig& c = ckpt.config();
  const int64_t P = static_cast<int64_t>(prompt.size()), V = c.vocab_size;
  GB_ASSIGN_OR_RETURN(runtime::KvPagePool pool,
                      runtime::KvPagePool::create(dev.kv_page_geometry(model::kv_model_shape(c)), (P + steps) / 128 + 2,
                                                  /*num_state_slots=*/1));
  GB_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelRunner> runner, model::ModelRunner::create(ckpt, dev, pool, q.get()));
  model::ForwardBatch batch = runner->make_batch(P, 1);
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<std::vector<float>> out;
  const runtime::SeqId id = 1;
  GB_RETURN_IF_ERROR(pool.admit(id, P));
  std::vector<int32_t> in = prompt;
  const std::vector<runtime::SeqId> ids = {id};
  for (int64_t s = 0; s <= steps; ++s) {
    const std::vector<int32_t> q_lens = {static_cast<int32_t>(in.size())};
    GB_RETURN_IF_ERROR(runner->forward(batch, {in, ids, q_lens}, logits));
    out.push_back(logits);
    if (s == steps) break;
    const int32_t next = forced.empty() ? argmax(logits) : forced[static_cast<size_t>(s)];
    if (tokens) tokens->push_back(next);
    GB_RETURN_IF_ERROR(pool.append(id, 1));
    in = {next};
  }
  GB_RETURN_IF_ERROR(pool.release(id));
  return out;
}

}  // namespace quant_accuracy_detail

// `steps` greedy tokens of the bf16 engine after `prompt`, and the quantized engine (`weight_quant`) on
// the same tokens. `roles` (optional) replaces the contract's quantized roles (to split the error by role).
inline Result<QuantAccuracy> measure_quant_accuracy(const model::Checkpoint& ckpt, const std::string& weight_quant,
                                                    const std::vector<int32_t>& prompt, int64_t steps,
                                                    const runtime::QuantizedLayers* roles = nullptr) {
  QuantAccuracy acc;
  std::vector<int32_t> tokens;
  GB_ASSIGN_OR_RETURN(auto ref, quant_accuracy_detail::run(ckpt, "none", prompt, steps, {}, &tokens, nullptr));
  GB_ASSIGN_OR_RETURN(auto got,
                      quant_accuracy_detail::run(ckpt, weight_quant, prompt, steps, tokens, nullptr, &acc, roles));
  for (size_t s = 0; s < ref.size(); ++s) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref[s].size(); ++i) {
      const double d = static_cast<double>(got[s][i]) - ref[s][i];
      num += d * d;
      den += static_cast<double>(ref[s][i]) * ref[s][i];
    }
    acc.rel_l2.push_back(std::sqrt(num / den));
    if (quant_accuracy_detail::argmax(got[s]) == quant_accuracy_detail::argmax(ref[s])) ++acc.agree;
  }
  return acc;
}

}  // namespace genbridge::testing
