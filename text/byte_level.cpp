#include "text/byte_level.h"

#include "text/utf8.h"

namespace genbridge::text {
namespace {

struct Tables {
  std::array<char32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  Tables() {
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(to_utf8[b], to_cp[b]);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_code_point(uint8_t b) { return tables().to_cp[b]; }

std::optional<uint8_t> code_point_to_byte(char32_t cp) {
  // Printable bytes map to themselves; the rest were numbered from U+0100 in byte order.
  if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) {
    return static_cast<uint8_t>(cp);
  }
  if (cp >= 0x100 && cp < 0x100 + 68) {
    static const auto inverse = [] {
      std::array<uint8_t, 68> inv{};
      for (int b = 0; b < 256; ++b) {
        const char32_t c = tables().to_cp[b];
        if (c >= 0x100) inv[c - 0x100] = static_cast<uint8_t>(b);
      }
      return inv;
    }();
    return inverse[cp - 0x100];
  }
  return std::nullopt;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  const Tables& t = tables();
  for (char c : bytes) out += t.to_utf8[static_cast<uint8_t>(c)];
  return out;
}

std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (size_t pos = 0; pos < token.size();) {
    const Utf8Step st = utf8_step(token, pos);
    if (st.kind != Utf8Step::Kind::kValid) return std::nullopt;
    const auto b = code_point_to_byte(st.code_point);
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    pos += st.length;
  }
  return out;
}

}  // namespace genbridge::text
