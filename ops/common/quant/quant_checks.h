#pragma once
// Internal: argument checks shared by the quant kernels (ops/common/quant/ and the generation-private MX
// kernels under ops/target_providers/<Target>/quant/). Each returns InvalidArgument naming the op,
// the value and the rule. Own namespace: ops/common/tensor/tensor_checks.h has functions of the same names
// with other messages.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops::detail::quant_checks {

std::string dims_string(const std::vector<int64_t>& d);
// x.shape[:-drop] + tail
std::vector<int64_t> leading_plus(const TensorView& x, int drop, std::initializer_list<int64_t> tail);
Status check_shape(const char* op, const char* name, const TensorView& t, const std::vector<int64_t>& want,
                   const std::string& rule);
Status check_dtype(const char* op, const char* name, const TensorView& t, DType want, const char* why = nullptr);
Status check_rank_at_least_1(const char* op, const char* name, const TensorView& t);

}  // namespace genbridge::ops::detail::quant_checks
