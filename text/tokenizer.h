#pragma once
// A Hugging Face tokenizer.json tokenizer: byte-level BPE as Qwen2/Qwen3 and DeepSeek-V3 use it.
//
// encode(text) runs the same pipeline as Hugging Face's tokenizers library, and gives the same ids
// (tests/text/oracle checks this against that library on the real Qwen3 and DeepSeek-V3 files):
//   1. added tokens with normalized=false are cut out of the raw text (leftmost-longest; lstrip/rstrip
//      widen a match over neighbouring White_Space; single_word needs non-word characters around it);
//   2. each remaining piece is normalized, then added tokens with normalized=true are cut out of it;
//   3. the pre-tokenizer splits each remaining piece (Split with a regex or a literal, ByteLevel);
//   4. BPE merges each pre-token by rank.
// Supported constructs (anything else is a load error naming its JSON path, e.g.
// "$.pre_tokenizer.pretokenizers[1].type"):
//   normalizer:    null, NFC, NFD, NFKC, NFKD, Sequence of these
//   pre_tokenizer: null, Split (Regex or String pattern, every behavior, invert), ByteLevel, Sequence
//   model:         BPE (merges as "a b" strings or [a, b] pairs; unk_token, fuse_unk, ignore_merges)
//   decoder:       ByteLevel (alone or as the only member of a Sequence)
//   post_processor: null or ByteLevel (it only changes offsets); truncation and padding: null
//
// Input that is not valid UTF-8 is refused by default (InvalidArgument naming the byte and its offset);
// InvalidUtf8::kReplace instead replaces each maximal invalid subpart by U+FFFD first (what a WHATWG
// TextDecoder or Rust's from_utf8_lossy would give the reference tokenizer).
//
// A Tokenizer is immutable after loading and cheap to copy (shared state); encode and decode may run on
// any number of threads at once.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/status.h"

namespace genbridge::text {

// An entry of tokenizer.json's "added_tokens".
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;      // skipped by decode(skip_special_tokens = true)
  bool normalized = true;    // matched in the normalized text (else in the raw text)
  bool lstrip = false;       // a match also takes the White_Space before it
  bool rstrip = false;       // ... and after it
  bool single_word = false;  // matches only with no word character right before or after it
};

enum class InvalidUtf8 { kError, kReplace };

struct EncodeOptions {
  // false: added tokens in the text become their ids. true: special added tokens are not matched and go
  // through BPE as plain text (Hugging Face's split_special_tokens / encode_special_tokens).
  bool split_special_tokens = false;
  InvalidUtf8 invalid_utf8 = InvalidUtf8::kError;
};

class Tokenizer {
 public:
  // Loads `path`: a tokenizer.json file, or a directory that holds one.
  static Result<Tokenizer> load(const std::filesystem::path& path);
  // Parses tokenizer.json text; `source` names it in errors.
  static Result<Tokenizer> from_json_text(std::string_view json_text, std::string_view source = "tokenizer.json");

  // The ids of `text` (no BOS/EOS are added: chat templates write them as text).
  Result<std::vector<int32_t>> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // The text of `ids`: each token's bytes concatenated, invalid UTF-8 replaced by U+FFFD (per maximal
  // subpart). Ids that name no token are skipped, as Hugging Face does: a model's embedding table is often
  // larger than its tokenizer (Qwen3: 151,936 rows, 151,669 tokens).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The bytes token `id` stands for (what decode concatenates), or nullptr for an id that names no token.
  const std::string* token_bytes(int32_t id) const;
  // The token's string as tokenizer.json writes it (byte-level alphabet for BPE tokens), or nullptr.
  const std::string* id_to_token(int32_t id) const;
  // The id of a token string (added tokens first, then the BPE vocabulary).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;

  // One more than the largest id.
  int64_t vocab_size() const;
  const std::vector<AddedToken>& added_tokens() const;
  // One line for logs and benchmarks: "BPE, 151643 tokens + 26 added, 151387 merges, pre-tokenizer regex JIT".
  std::string describe() const;
  // Empties the per-word BPE cache (benchmarks measure cold and warm encodes).
  void clear_cache() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace genbridge::text
