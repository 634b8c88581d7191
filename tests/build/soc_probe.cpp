// For build.soc.runtime_agrees_with_cmake: prints what the runtime's SoC selector parser makes of each
// line of stdin (one selector per line, the empty line included), one output line each.
#include <cstdio>
#include <iostream>
#include <string>

#include "runtime/device/soc.h"

int main() {
  std::string selector;
  while (std::getline(std::cin, selector)) {
    const auto s = genbridge::runtime::normalize_soc_selector(selector);
    if (s.ok()) {
      const std::string_view target = genbridge::runtime::generation_name(s->generation);
      std::printf("'%s': target=%.*s soc=%s\n", selector.c_str(), static_cast<int>(target.size()), target.data(),
                  s->soc.c_str());
    } else {
      std::printf("'%s': error: %s\n", selector.c_str(), s.status().message().c_str());
    }
  }
  return 0;
}
