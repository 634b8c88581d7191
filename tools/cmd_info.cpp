// genbridge info: what this build was made for.
#include <fmt/format.h>

#include "genbridge/build_info.h"
#include "runtime/device/device_operator.h"
#include "tools/commands.h"

namespace genbridge::tools {

int info(const std::string& soc) {
  // Validate first: nothing of the report is printed for a SoC this build does not run on.
  auto dev = runtime::DeviceOperator::create(runtime::DeviceConfig::from_flags(soc));
  if (!dev.ok()) {
    fmt::print(stderr, "genbridge info: {}\n", dev.status().to_string());
    return kExitFailed;
  }
  fmt::print("provider target: {}\nSoC: {}\n{}\nmanifest:\n{}", ops::build_target(), ops::build_soc(), dev->log_line(),
             ops::build_manifest());
  return kExitOk;
}

}  // namespace genbridge::tools
