// Test tool: writes the synthetic `tiny` checkpoint (seed 1) to DIR and sets one weight to a non-finite
// bf16 value in place: lm_head.weight[60000] = +Inf (bits 0x7f80). For the CLI checks of --check-weights.
// usage: write_nonfinite_checkpoint DIR
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "runtime/checkpoint/safetensors.h"
#include "tools/make_model/synthetic.h"

int main(int argc, char** argv) {
  using namespace genbridge;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  if (const Status st = model::write_synthetic_checkpoint("tiny", 1, dir); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  const std::filesystem::path file = dir / "model.safetensors";
  uint64_t offset = 0;
  {
    Result<model::SafetensorsFile> f = model::SafetensorsFile::open(file);
    const model::SafetensorsTensor* t = f.ok() ? f->find("lm_head.weight") : nullptr;
    if (!t || t->dtype != "BF16" || t->nbytes < 60001 * 2) {
      std::fprintf(stderr, "unexpected checkpoint layout\n");
      return 1;
    }
    offset = t->offset + 60000 * 2;
  }
  const unsigned char inf[2] = {0x80, 0x7f};  // little-endian 0x7f80
  const int fd = ::open(file.c_str(), O_WRONLY);
  if (fd < 0 || ::pwrite(fd, inf, 2, static_cast<off_t>(offset)) != 2 || ::close(fd) != 0) {
    std::perror("write");
    return 1;
  }
  return 0;
}
