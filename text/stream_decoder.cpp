#include "text/stream_decoder.h"

#include "text/utf8.h"

namespace genbridge::text {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  const std::string* bytes = tokenizer_.token_bytes(id);
  if (!bytes || (skip_special_ && tokenizer_.is_special(id))) return {};
  pending_ += *bytes;
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const Utf8Step st = utf8_step(pending_, pos);
    if (st.kind == Utf8Step::Kind::kIncomplete) break;  // a later token may complete it
    if (st.kind == Utf8Step::Kind::kValid) {
      out.append(pending_, pos, st.length);
    } else {
      out += "\xEF\xBF\xBD";
    }
    pos += st.length;
  }
  pending_.erase(0, pos);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8_replace_invalid(pending_);
  pending_.clear();
  return out;
}

}  // namespace genbridge::text
