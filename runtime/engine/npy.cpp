#include "runtime/engine/npy.h"

#include <cstdio>
#include <memory>

#include <fmt/format.h>

namespace genbridge::engine {

Status write_npy_f32(const std::string& path, std::span<const float> data, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0 || static_cast<int64_t>(data.size()) != rows * cols) {
    return invalid_argument(fmt::format("write_npy_f32: {} values do not form shape ({}, {})", data.size(), rows, cols));
  }
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  // Magic (6) + version (2) + length (2) + header + '\n' must be a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return unavailable(fmt::format("write_npy_f32: cannot open '{}' for writing", path));
  const unsigned char preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                      static_cast<unsigned char>(header.size() & 0xff),
                                      static_cast<unsigned char>(header.size() >> 8)};
  bool ok = std::fwrite(preamble, 1, sizeof preamble, f.get()) == sizeof preamble &&
            std::fwrite(header.data(), 1, header.size(), f.get()) == header.size() &&
            std::fwrite(data.data(), sizeof(float), data.size(), f.get()) == data.size();
  ok = (std::fclose(f.release()) == 0) && ok;
  if (!ok) return unavailable(fmt::format("write_npy_f32: writing '{}' failed (disk full or I/O error)", path));
  return ok_status();
}

}  // namespace genbridge::engine
