#pragma once
// Test helper: whether the executable runs with AddressSanitizer's runtime. Test code is compiled without
// the sanitizers in every build (tests/CMakeLists.txt), so it cannot ask the preprocessor; the sanitizer
// build links the runtime, which defines __asan_init.

extern "C" void __asan_init() __attribute__((weak));

namespace genbridge::testing {

inline bool address_sanitizer_linked() { return &__asan_init != nullptr; }

}  // namespace genbridge::testing
