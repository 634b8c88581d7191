#pragma once
// What this build of the kernel library was built for. Providers are chosen at build time; these
// calls let a program (or the DeviceOperator) check that choice at start-up.

#include <string_view>

namespace genbridge::ops {

// Provider target of this build, e.g. the name of the hardware generation's provider tree.
std::string_view build_target();
// Concrete SoC the build was configured for.
std::string_view build_soc();
// JSON manifest: every stable module and whether its implementation came from common or the target tree.
std::string_view build_manifest();

}  // namespace genbridge::ops
