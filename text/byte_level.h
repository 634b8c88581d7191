#pragma once
// The byte-level alphabet of GPT-2-style BPE (Hugging Face's ByteLevel pre-tokenizer and decoder): each of
// the 256 byte values stands for one printable code point, so that any byte string is a string of
// "characters" BPE can merge. Printable Latin-1 bytes map to themselves; the other 68 bytes map, in byte
// order, to U+0100, U+0101, ... (space 0x20 -> U+0120 'Ġ', newline 0x0A -> U+010A 'Ċ').

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace genbridge::text {

// The code point standing for byte `b`.
char32_t byte_to_code_point(uint8_t b);
// The byte a code point stands for, or nullopt for a code point outside the alphabet.
std::optional<uint8_t> code_point_to_byte(char32_t cp);

// Maps every byte of `bytes` to its code point, as UTF-8.
std::string bytes_to_byte_level(std::string_view bytes);
// The inverse for one token: the bytes its characters stand for, or nullopt when a character is outside the
// alphabet (the ByteLevel decoder then keeps the token's own UTF-8 bytes).
std::optional<std::string> byte_level_to_bytes(std::string_view token);

}  // namespace genbridge::text
