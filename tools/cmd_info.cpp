// genbridge info: what this build was made for.
#include <fmt/format.h>

#include <cstdlib>

#include "genbridge/build_info.h"
#include "runtime/device/device_operator.h"
#include "tools/commands.h"

namespace genbridge::tools {

int info(const std::string& soc) {
  fmt::print("provider target: {}\nSoC: {}\n", ops::build_target(), ops::build_soc());
  const char* env = std::getenv("GENBRIDGE_SOC");
  auto dev = runtime::DeviceOperator::create({.soc = !soc.empty() ? soc : (env ? env : "")});
  if (!dev.ok()) {
    fmt::print(stderr, "genbridge info: {}\n", dev.status().to_string());
    return 1;
  }
  fmt::print("{}\nmanifest:\n{}", dev->log_line(), ops::build_manifest());
  return 0;
}

}  // namespace genbridge::tools
