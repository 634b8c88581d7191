#include <gtest/gtest.h>

#include "genbridge/core/dtype.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value " + std::to_string(v) + " must be positive");
  return v;
}

Status use_parsed(int v, int& out) {
  GB_ASSIGN_OR_RETURN(out, parse_positive(v));
  return ok_status();
}

TEST(Status, codes_and_messages) {
  const Status s = invalid_argument("x has 3 elements");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.to_string(), "InvalidArgument: x has 3 elements");
  EXPECT_EQ(ok_status().to_string(), "OK");
  EXPECT_STREQ(status_code_name(StatusCode::kDeadlineExceeded), "DeadlineExceeded");
}

TEST(Result, value_and_error_propagate) {
  int out = 0;
  EXPECT_TRUE(use_parsed(5, out).ok());
  EXPECT_EQ(out, 5);
  const Status s = use_parsed(-1, out);
  EXPECT_EQ(s.message(), "value -1 must be positive");
}

TEST(Result, ok_status_without_value_becomes_internal) {
  Result<int> r{ok_status()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(DType, names_round_trip) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kFp8E4M3FN, DType::kE8M0}) {
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  }
  EXPECT_FALSE(dtype_from_name("float7").has_value());
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
}

TEST(TensorView, contiguous_strides_and_slices) {
  float buf[24];
  TensorView t(buf, DType::kF32, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.shape_string(), "[2, 3, 4]");
  const TensorView s = t.slice0(1, 2);
  EXPECT_EQ(s.data(), static_cast<void*>(buf + 12));
  EXPECT_EQ(s.dim(0), 1);
  const TensorView st = TensorView::strided(buf, DType::kF32, {2, 4}, {8, 1});
  EXPECT_FALSE(st.is_contiguous());
  EXPECT_EQ(t.reshaped({6, 4}).rank(), 2);
  EXPECT_EQ(t.reshaped({5, 4}).rank(), -1);
  EXPECT_EQ(t.device().kind, DeviceKind::kHost);
}

}  // namespace
}  // namespace genbridge
