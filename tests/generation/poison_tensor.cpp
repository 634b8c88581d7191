// poison_tensor DIR TENSOR INDEX VALUE: sets element INDEX of TENSOR in DIR/model.safetensors to VALUE
// ("inf", "-inf", "nan" or a number), for CLI tests of non-finite weights. Tests only.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/engine/poisoned_checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: poison_tensor DIR TENSOR INDEX VALUE\n");
    return 2;
  }
  const float value = std::strtof(argv[4], nullptr);  // accepts inf, -inf, nan
  const genbridge::Status st = genbridge::testing::poison_tensor(argv[1], argv[2], std::atoll(argv[3]), value);
  if (!st.ok()) {
    std::fprintf(stderr, "poison_tensor: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
