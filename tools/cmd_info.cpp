// genbridge info: what this build was made for.
#include <fmt/format.h>

#include "genbridge/core/cpu_target.h"
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
  if (auto env = cpu_target_from_env(); !env.ok()) {
    fmt::print(stderr, "genbridge info: {}\n", env.status().message());
    return kExitUsage;
  }
  fmt::print("provider target: {}\nSoC: {}\n{}\n{}\n{}\n{}\nmanifest:\n{}", ops::build_target(), ops::build_soc(),
             dev->log_line(), dev->mla_contract_line(), dev->sharedkv_contract_line(), cpu_target_line(),
             ops::build_manifest());
  return kExitOk;
}

}  // namespace genbridge::tools
