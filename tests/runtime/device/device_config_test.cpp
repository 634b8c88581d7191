// DeviceConfig::from_flags: the one place GENBRIDGE_SOC is read. --soc wins; otherwise the variable;
// unset or empty means no SoC configured.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "runtime/device/device_operator.h"

namespace genbridge::runtime {
namespace {

class SocEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("GENBRIDGE_SOC")) saved_ = v, had_ = true;
  }
  void TearDown() override {
    if (had_) {
      ::setenv("GENBRIDGE_SOC", saved_.c_str(), 1);
    } else {
      ::unsetenv("GENBRIDGE_SOC");
    }
  }
  std::string saved_;
  bool had_ = false;
};

TEST_F(SocEnv, flag_then_environment_then_none) {
  ::unsetenv("GENBRIDGE_SOC");
  EXPECT_EQ(DeviceConfig::from_flags("").soc, "");
  EXPECT_EQ(DeviceConfig::from_flags("910B").soc, "910B");
  ::setenv("GENBRIDGE_SOC", "", 1);
  EXPECT_EQ(DeviceConfig::from_flags("").soc, "");
  ::setenv("GENBRIDGE_SOC", "Ascend950PR_9599", 1);
  EXPECT_EQ(DeviceConfig::from_flags("").soc, "Ascend950PR_9599");
  EXPECT_EQ(DeviceConfig::from_flags("910C").soc, "910C");
  const DeviceConfig c = DeviceConfig::from_flags("", "quantized");
  EXPECT_EQ(c.kv_cache_dtype, "quantized");
  EXPECT_FALSE(c.path_env.has_value());
}

}  // namespace
}  // namespace genbridge::runtime
