#pragma once
// Internal: the two conversions the ops' error messages are built with, as in
//   invalid_argument(s(op) + ": block_size is " + n(bs) + " but must be ...").

#include <cstdint>
#include <string>
#include <string_view>

namespace genbridge::ops::detail {

inline std::string s(std::string_view v) { return std::string(v); }
inline std::string n(int64_t v) { return std::to_string(v); }

}  // namespace genbridge::ops::detail
