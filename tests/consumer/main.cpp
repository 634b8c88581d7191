// Asks the installed library what it was built for and runs one stable operator.
#include <cstdio>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/ops/norm/rms_norm.h"

int main() {
  std::printf("target=%.*s soc=%.*s\n", static_cast<int>(genbridge::ops::build_target().size()),
              genbridge::ops::build_target().data(), static_cast<int>(genbridge::ops::build_soc().size()),
              genbridge::ops::build_soc().data());
  std::vector<float> x{3.f, 4.f}, g{1.f, 1.f}, y(2), rstd(1);
  const genbridge::Status st = genbridge::ops::rms_norm(
      genbridge::TensorView(x.data(), genbridge::DType::kF32, {1, 2}),
      genbridge::TensorView(g.data(), genbridge::DType::kF32, {2}), 0.f,
      genbridge::TensorView(y.data(), genbridge::DType::kF32, {1, 2}),
      genbridge::TensorView(rstd.data(), genbridge::DType::kF32, {1, 1}));
  if (!st.ok()) {
    std::printf("error: %s\n", st.to_string().c_str());
    return 1;
  }
  // rms of (3, 4) is sqrt(12.5).
  const bool ok = y[0] > 0.8485f && y[0] < 0.8486f && y[1] > 1.1313f && y[1] < 1.1314f;
  std::printf("%s\n", ok ? "norm ok" : "norm wrong");
  return ok ? 0 : 1;
}
