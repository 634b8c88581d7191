#pragma once
// Internal: the conversions the ops' error messages are built with, as in
//   invalid_argument(s(op) + ": block_size is " + n(bs) + " but must be ...").

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace genbridge::ops::detail {

inline std::string s(std::string_view v) { return std::string(v); }
inline std::string n(int64_t v) { return std::to_string(v); }
// A float as printf's %g writes it ("0.5", "-1", "nan", "inf", "1e-20").
inline std::string f(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

}  // namespace genbridge::ops::detail
