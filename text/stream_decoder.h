#pragma once
// Streaming detokenization: one StreamDecoder per request turns generated token ids, one at a time, into
// text that never ends inside a UTF-8 sequence. A token can end in the middle of a character (byte-level
// BPE splits a CJK character or an emoji over several tokens); those bytes are held back until the next
// token completes them. The concatenation of everything push() and finish() return equals
// Tokenizer::decode of the same ids, U+FFFD replacements included.

#include <cstdint>
#include <memory>
#include <string>

#include "text/tokenizer.h"

namespace genbridge::text {

class StreamDecoder {
 public:
  // Keeps the tokenizer's shared state alive; one decoder serves one sequence on one thread at a time.
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  // The text that `id` completes: complete characters only (possibly empty). Unknown ids add nothing.
  std::string push(int32_t id);
  // The rest at the end of the sequence: held bytes that no later token can complete become U+FFFD.
  std::string finish();
  // Bytes held back for a character not yet complete.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace genbridge::text
