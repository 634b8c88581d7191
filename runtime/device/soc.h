#pragma once
// SoC identification for the DeviceOperator's start-up check (docs/design.md#targets-and-soc-selectors): the selector
// table (generated from cmake/GenbridgeSoc.cmake's), the runtime SoC codes, and a pure parser for `npu-smi info` text.
// Only runtime/device/ may name a generation.

#include <optional>
#include <string>
#include <string_view>

#include "genbridge/core/status.h"

namespace genbridge::runtime {

// Hardware generations with a provider tree (the kernel library's build targets).
enum class Generation { kAscend910, kAscend950 };

// Provider-target name: "Ascend910", "Ascend950".
std::string_view generation_name(Generation g);
// Product family: "A2/A3", "A5".
std::string_view generation_family(Generation g);
// The generation whose provider target is `target` (e.g. genbridge::ops::build_target()).
Result<Generation> generation_from_target(std::string_view target);

struct SocInfo {
  Generation generation = Generation::kAscend910;
  std::string soc;  // concrete SoC, e.g. "Ascend910B1", "Ascend910_9382", "Ascend950PR_9599"
  int code = 0;     // runtime SoC code (220-225 910B, 250-255 910_93, 260 950); 0 if the SoC has none listed
};

// The SoC selectors accepted, as listed in error messages (GENBRIDGE_ACCEPTED_SOC_SELECTORS of the build).
std::string_view accepted_soc_selectors();
// Normalises a selector ("910B", "Ascend910B3", "910C", "Ascend910_9392", "950", "Ascend950DT_9591", ...)
// to its generation and concrete SoC. InvalidArgument listing the accepted selectors otherwise.
Result<SocInfo> normalize_soc_selector(std::string_view selector);
// The SoC of a runtime SoC code (220..225, 250..255, 260). InvalidArgument for any other code.
Result<SocInfo> soc_from_code(int code);

// Parses the text `npu-smi info` prints and returns the SoC of its devices. Accepts the chip name as
// npu-smi prints it in the device table or key/value views ("910B3", "Ascend 910B3", "Ascend910_9382",
// "Ascend950PR_9599", ...) or a numeric "SoC Version: 223" line. Pure: no I/O. InvalidArgument when no
// known SoC appears or the devices belong to different generations.
Result<SocInfo> parse_npu_smi(std::string_view text);

// Path of an executable file `name` in the colon-separated directory list `path_env`; empty if none.
std::string find_on_path(std::string_view name, std::string_view path_env);

// Runs `npu-smi info` when npu-smi is on `path_env` and returns its output; std::nullopt when it is not
// on the path. Unavailable when it is there but fails. Blocks until the command exits.
Result<std::optional<std::string>> read_npu_smi(std::string_view path_env);

}  // namespace genbridge::runtime
