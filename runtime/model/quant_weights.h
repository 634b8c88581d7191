#pragma once
// QuantizedWeights: a bf16 checkpoint's weights quantized at load into the representation the
// DeviceOperator put in force (--weight-quant; issue 13), for the roles its contract quantizes (attention
// projections, routed experts, shared experts and dense MLPs; router and LM head stay bf16). Owns the
// quantized bytes; the ModelRunner and ExpertBank read them through ops::QuantWeight views.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "genbridge/core/status.h"
#include "genbridge/ops/linear/quant_linear.h"
#include "genbridge/ops/moe/quant_expert_ffn.h"
#include "runtime/device/device_operator.h"
#include "runtime/model/checkpoint.h"

namespace genbridge::model {

// Told after each weight matrix is quantized: matrices done and in all.
using QuantizeProgressFn = std::function<void(int64_t done, int64_t total)>;

struct QuantizeOptions {
  bool attention = true;  // quantize attention projections (when the contract's layers say so)
  bool experts = true;    // quantize routed experts (when the contract's layers say so)
  const QuantizeProgressFn* progress = nullptr;
};

class QuantizedWeights {
 public:
  struct Layer {
    bool attention = false;  // q, k, v, o below are set
    ops::QuantWeight q_proj, k_proj, v_proj, o_proj;
    std::vector<ops::QuantExpertWeights> experts;  // empty: bf16 experts (or a dense layer)
    bool shared = false;                           // shared expert quantized
    ops::QuantExpertWeights shared_expert;
    bool dense = false;  // dense MLP quantized
    ops::QuantExpertWeights dense_mlp;
  };

  // Quantizes `checkpoint`'s bf16 weights into `repr` for the roles `layers` names (and `options` keeps).
  // Uses the kernel threads; the result does not depend on their number. Unimplemented when the build's
  // generation cannot run repr (quant_linear's message).
  static Result<std::unique_ptr<QuantizedWeights>> quantize(const Checkpoint& checkpoint,
                                                            const runtime::WeightQuantRepresentation& repr,
                                                            const runtime::QuantizedLayers& layers,
                                                            const QuantizeOptions& options = {});

  const runtime::WeightQuantRepresentation& representation() const { return *repr_; }
  const Layer& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // Bytes of the quantized weights (data + scales), and of the bf16 weights they replace.
  uint64_t quantized_bytes() const { return quantized_bytes_; }
  uint64_t replaced_bf16_bytes() const { return replaced_bytes_; }
  int64_t num_matrices() const { return matrices_; }
  double seconds() const { return seconds_; }

 private:
  QuantizedWeights() = default;
  Result<ops::QuantWeight> quantize_one(const TensorView& w);
  const runtime::WeightQuantRepresentation* repr_ = nullptr;
  std::vector<Layer> layers_;
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
  uint64_t quantized_bytes_ = 0, replaced_bytes_ = 0;
  int64_t matrices_ = 0;
  double seconds_ = 0;
};

}  // namespace genbridge::model
