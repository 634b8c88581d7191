// Placeholder until the kernel lands (same commit series): the contract is in genbridge/ops/attention/sparse_mla_decode.h.
#include "genbridge/ops/attention/sparse_mla_decode.h"

namespace genbridge::ops {

Status sparse_mla_decode(const TensorView&, const TensorView&, const MlaKvCache&, const TensorView&, TopkIndexFormat, const TensorView&, const TensorView&, const TensorView&, float, const TensorView&) {
  return unimplemented("sparse_mla_decode: not implemented yet");
}

}  // namespace genbridge::ops
