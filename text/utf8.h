#pragma once
// UTF-8 helpers shared by the tokenizer, the streaming detokenizer and the chat templates.
//
// Validation and replacement are written here rather than taken from utf8proc because the streaming
// detokenizer needs a three-way answer per position (complete, invalid, or an incomplete prefix that more
// bytes may complete) and the replacement must follow the "maximal subpart" practice (Unicode §3.9, the
// WHATWG decoder, Rust's String::from_utf8_lossy) so that streamed text equals the reference decode.
// Character properties (general category, normalization) come from utf8proc.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "genbridge/core/status.h"

namespace genbridge::text {

// What the bytes at one position hold.
struct Utf8Step {
  enum class Kind { kValid, kInvalid, kIncomplete };
  Kind kind;
  size_t length;        // kValid: the sequence's bytes; kInvalid: the maximal subpart to replace (>= 1);
                        // kIncomplete: the bytes present (a valid prefix running into the end of the input)
  char32_t code_point;  // kValid only
};
Utf8Step utf8_step(std::string_view s, size_t pos);

// OK, or InvalidArgument "<what>: input is not valid UTF-8: byte 0xff at byte offset 3 (...)".
Status validate_utf8(std::string_view s, std::string_view what);

// `s` with every invalid sequence (including a truncated one at the end) replaced by U+FFFD, one per
// maximal subpart.
std::string utf8_replace_invalid(std::string_view s);

// Appends the UTF-8 encoding of `cp` (a valid scalar value) to `out`.
void append_utf8(std::string& out, char32_t cp);

// Decodes the valid UTF-8 sequence at `pos` and advances `pos` past it (the input must be valid).
char32_t next_code_point(std::string_view s, size_t& pos);

// Unicode White_Space (the set Rust's and Oniguruma's \s match): Zs, Zl, Zp and U+0009..U+000D, U+0085.
bool is_white_space(char32_t cp);
// Rust regex's Unicode \w: letters, marks, decimal and letter numbers, connector punctuation, ZWNJ/ZWJ.
bool is_word_char(char32_t cp);

// Unicode normalization forms (utf8proc). The input must be valid UTF-8.
enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
Result<std::string> normalize_utf8(std::string_view s, NormalForm form);

}  // namespace genbridge::text
