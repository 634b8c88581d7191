// GENBRIDGE_NUM_THREADS: a valid value sets the default thread count; anything else is an error naming the
// variable (num_threads_from_env, which the CLI refuses on) and is ignored by the kernels.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "genbridge/core/threading.h"

namespace genbridge {
namespace {

class NumThreadsEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("GENBRIDGE_NUM_THREADS")) saved_ = v, had_ = true;
  }
  void TearDown() override {
    if (had_) {
      ::setenv("GENBRIDGE_NUM_THREADS", saved_.c_str(), 1);
    } else {
      ::unsetenv("GENBRIDGE_NUM_THREADS");
    }
    set_num_threads(0);
  }
  std::string saved_;
  bool had_ = false;
};

TEST_F(NumThreadsEnv, unset_or_empty_means_not_set) {
  ::unsetenv("GENBRIDGE_NUM_THREADS");
  EXPECT_EQ(num_threads_from_env().value(), 0);
  ::setenv("GENBRIDGE_NUM_THREADS", "", 1);
  EXPECT_EQ(num_threads_from_env().value(), 0);
}

TEST_F(NumThreadsEnv, valid_values_set_the_default) {
  for (const char* v : {"1", "3", "255"}) {
    ::setenv("GENBRIDGE_NUM_THREADS", v, 1);
    EXPECT_EQ(num_threads_from_env().value(), std::atoi(v)) << v;
    set_num_threads(0);  // back to the default, read from the environment
    EXPECT_EQ(num_threads(), std::atoi(v)) << v;
  }
}

TEST_F(NumThreadsEnv, invalid_values_are_errors_naming_the_variable) {
  // Before: atoi() read "abc" and "-3" as "not set" and "4x" as 4, silently.
  for (const char* v : {"abc", "-3", "0", "256", "4x", " 4", "+4", "99999999999"}) {
    ::setenv("GENBRIDGE_NUM_THREADS", v, 1);
    const auto r = num_threads_from_env();
    ASSERT_FALSE(r.ok()) << v;
    EXPECT_EQ(r.status().message(), std::string("GENBRIDGE_NUM_THREADS=") + v +
                                        ": expected an integer in [1, 255] (unset it to use every core)");
    // Kernels cannot fail on it: they use the hardware count.
    set_num_threads(0);
    const unsigned hw = std::thread::hardware_concurrency();
    EXPECT_EQ(num_threads(), hw > 0 ? std::min<int>(static_cast<int>(hw), kMaxNumThreads) : 1) << v;
  }
}

TEST_F(NumThreadsEnv, explicit_counts_are_clamped_to_the_pool_limit) {
  set_num_threads(100000);
  EXPECT_EQ(num_threads(), kMaxNumThreads);
}

}  // namespace
}  // namespace genbridge
