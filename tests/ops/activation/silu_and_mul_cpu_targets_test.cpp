// activation/silu_and_mul gives the same bits on every CPU target this machine runs,
// on rows whose half width is not a multiple of 16 and with infinities and NaNs among the inputs, and
// the same bits as expert_ffn's scalar formula (ops/common/activation/swiglu.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "genbridge/ops/activation/silu_and_mul.h"
#include "ops/common/activation/swiglu.h"
#include "support/each_cpu_target.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

TEST(SiluAndMulCpuTargets, same_bits_on_every_target_and_as_the_scalar_formula) {
  for (int64_t d : {1, 15, 16, 37, 256}) {
    SCOPED_TRACE("d " + std::to_string(d));
    const int64_t rows = 3;
    OwnedTensor x(DType::kF32, {rows, 2 * d});
    fill_uniform(x.view(), 11 + d, -12.f, 12.f);
    float* xv = static_cast<float*>(x.data());
    const float specials[] = {std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(),
                              -100.f,
                              100.f,
                              0.f,
                              -0.f};
    for (size_t i = 0; i < std::size(specials) && i < static_cast<size_t>(2 * d * rows); ++i)
      xv[3 * i % (2 * d * rows)] = specials[i];
    std::vector<std::byte> first;
    for_each_cpu_target([&](const std::string& t) {
      OwnedTensor y(DType::kF32, {rows, d});
      ASSERT_TRUE(ops::silu_and_mul(x.view(), y.view()).ok());
      if (first.empty()) {
        first = y.bytes();
        const float* yv = static_cast<const float*>(y.data());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < d; ++i) {
            const float want = ops::detail::silu_mul(xv[r * 2 * d + i], xv[r * 2 * d + d + i]);
            const float got = yv[r * d + i];
            EXPECT_TRUE(std::memcmp(&want, &got, 4) == 0 || (std::isnan(want) && std::isnan(got)))
                << "row " << r << " i " << i << ": " << got << " vs " << want;
          }
        }
      } else {
        EXPECT_TRUE(y.bytes() == first) << t;
      }
    });
  }
}

}  // namespace
}  // namespace genbridge::testing
