#include "runtime/engine/metrics.h"

#include <gtest/gtest.h>

namespace genbridge::engine {
namespace {

TEST(Metrics, nearest_rank_percentiles) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(percentile(v, 50), 50);
  EXPECT_EQ(percentile(v, 99), 99);
  EXPECT_EQ(percentile(v, 100), 100);
  EXPECT_EQ(percentile(v, 0), 1);
  EXPECT_EQ(percentile({}, 50), 0);
  EXPECT_EQ(percentile({7.0}, 99), 7.0);
  EXPECT_DOUBLE_EQ(mean({1, 2, 3, 4}), 2.5);
}

}  // namespace
}  // namespace genbridge::engine
