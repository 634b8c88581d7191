#pragma once
// A tokenizer for synthetic checkpoints (make-model), so that they run text in and text out: a small
// byte-level BPE in Qwen3's format (NFC, Qwen's pre-tokenizer regex, ByteLevel) trained at write time on
// a built-in English paragraph, with a ChatML chat template. Its ids fit the model's vocabulary:
//   [0, 256)                      the 256 byte tokens, in byte order
//   [256, 256 + merges)           one token per learned merge, in rank order
//   [.., vocab_size - 5)          decode-only filler: words and word pairs of the paragraph (never produced
//                                 by encode, so a random model's output still reads as words)
//   vocab_size - 5 .. - 1         <|endoftext|> <|im_start|> <|im_end|> (special), <think> </think>
// The same vocab_size always gives byte-identical files.

#include <cstdint>
#include <filesystem>

#include "genbridge/core/status.h"

namespace genbridge::text {

// The smallest vocabulary the layout above fits: 256 byte tokens + 5 added tokens.
inline constexpr int64_t kMinSyntheticVocab = 261;

// Writes tokenizer.json and tokenizer_config.json into `dir` (created if needed; each file through a
// temporary name and a rename). InvalidArgument when vocab_size < kMinSyntheticVocab or > 2^31 - 1.
Status write_synthetic_tokenizer(const std::filesystem::path& dir, int64_t vocab_size);

}  // namespace genbridge::text
