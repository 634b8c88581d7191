#include "text/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <variant>

#include "text/bpe.h"
#include "text/byte_level.h"
#include "text/json_text.h"
#include "text/regex.h"
#include "text/utf8.h"

namespace genbridge::text {

using json = nlohmann::json;

namespace {

// The regex of GPT-2's ByteLevel pre-tokenizer (use_regex = true).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::optional<Regex> regex;  // absent: `literal` is the pattern
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};
struct ByteLevelStep {
  bool add_prefix_space = false;
  std::optional<Regex> gpt2;  // present when use_regex
};
using PreTokenizerStep = std::variant<SplitStep, ByteLevelStep>;

// Byte trie over added-token contents for leftmost-longest matching.
class AddedTrie {
 public:
  void add(std::string_view content, int32_t token_index) {
    int32_t node = 0;
    for (char c : content) {
      const auto b = static_cast<uint8_t>(c);
      int32_t child = find_child(node, b);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(b, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    if (nodes_[node].token < 0) nodes_[node].token = token_index;
  }
  bool empty() const { return nodes_.size() == 1; }
  // The longest token starting at `pos`: (token index, length), or token index -1.
  std::pair<int32_t, size_t> longest_at(std::string_view s, size_t pos) const {
    int32_t node = 0, best = -1;
    size_t best_len = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      node = find_child(node, static_cast<uint8_t>(s[i]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) best = nodes_[node].token, best_len = i + 1 - pos;
    }
    return {best, best_len};
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int32_t token = -1;
  };
  int32_t find_child(int32_t node, uint8_t b) const {
    for (const auto& [byte, child] : nodes_[node].children) {
      if (byte == b) return child;
    }
    return -1;
  }
  std::vector<Node> nodes_ = std::vector<Node>(1);
};

// A piece of the input on its way through the pipeline: text, or an added token already found.
struct Piece {
  std::string text;
  int32_t added = -1;  // index into Impl::added
};

std::string quoted(const json& j) {
  std::string s = j.dump(-1, ' ', true, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 60) + "..." : s;
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::vector<NormalForm> normalizers;
  std::vector<PreTokenizerStep> steps;
  std::unique_ptr<BpeModel> bpe;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;  // content -> index into `added`
  AddedTrie raw_trie, normalized_trie;
  std::vector<std::string> id_token;  // by id; empty with has_token false for holes
  std::vector<std::string> id_bytes;
  std::vector<uint8_t> has_token, special;
  bool regex_jit = true;
  int num_regexes = 0;

  Status load(const json& root);
  Status load_normalizer(const json& j, const std::string& path);
  Status load_pre_tokenizer(const json& j, const std::string& path);
  Status load_decoder(const json& j, const std::string& path);
  Status load_post_processor(const json& j, const std::string& path);
  Status load_model(const json& j, const std::string& path);
  // A "Sequence" step: every element of j[key] loaded in order by `load` at path.key[i].
  Status load_sequence(const json& j, const std::string& path, const char* key,
                       Status (Impl::*load)(const json&, const std::string&));

  Status err(const std::string& path, const std::string& what) const {
    return invalid_argument(source + ": " + path + " " + what);
  }
  Result<bool> get_bool(const json& obj, const std::string& path, const char* key, bool def) const {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return def;
    if (!it->is_boolean()) return err(path + "." + key, "must be true or false, not " + quoted(*it));
    return it->get<bool>();
  }
  Result<std::string> get_type(const json& j, const std::string& path) const {
    if (!j.is_object()) return err(path, "must be an object, not " + quoted(j));
    const auto it = j.find("type");
    if (it == j.end() || !it->is_string()) return err(path + ".type", "is missing (an object needs a string 'type')");
    return it->get<std::string>();
  }

  void split_added(std::vector<Piece>& pieces, const AddedTrie& trie, bool split_special) const;
  Status pre_tokenize_and_merge(size_t step, std::string_view s, std::vector<int32_t>& out) const;
};

Status Tokenizer::Impl::load(const json& root) {
  if (!root.is_object()) return err("$", "must be a JSON object");
  for (const char* key : {"truncation", "padding"}) {
    if (const auto it = root.find(key); it != root.end() && !it->is_null()) {
      return err(std::string("$.") + key, "is not supported (must be null): " + quoted(*it));
    }
  }
  const auto model = root.find("model");
  if (model == root.end()) return err("$.model", "is missing");
  GB_RETURN_IF_ERROR(load_model(*model, "$.model"));
  if (const auto it = root.find("normalizer"); it != root.end())
    GB_RETURN_IF_ERROR(load_normalizer(*it, "$.normalizer"));
  if (const auto it = root.find("pre_tokenizer"); it != root.end()) {
    GB_RETURN_IF_ERROR(load_pre_tokenizer(*it, "$.pre_tokenizer"));
  }
  if (const auto it = root.find("post_processor"); it != root.end()) {
    GB_RETURN_IF_ERROR(load_post_processor(*it, "$.post_processor"));
  }
  const auto decoder = root.find("decoder");
  if (decoder == root.end() || decoder->is_null()) {
    return err("$.decoder", "is missing: a ByteLevel decoder is required");
  }
  GB_RETURN_IF_ERROR(load_decoder(*decoder, "$.decoder"));

  // Added tokens. Their ids are assigned as Hugging Face assigns them when it loads the file: a content
  // already in the BPE vocabulary keeps that id; any other takes the next id after the vocabulary (or after
  // the largest added id, once that is past the vocabulary). For consistent files (all real ones) this is
  // the "id" the file gives; where a file disagrees, the reference library's numbering wins.
  if (const auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) return err("$.added_tokens", "must be an array");
    const int64_t model_size = static_cast<int64_t>(bpe->vocab().size());
    int64_t max_added = -1;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& a = (*it)[i];
      const std::string path = "$.added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object()) return err(path, "must be an object");
      const auto id = a.find("id");
      const auto content = a.find("content");
      if (id == a.end() || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() > INT32_MAX) {
        return err(path + ".id", "must be an integer in [0, 2^31)");
      }
      if (content == a.end() || !content->is_string() || content->get<std::string>().empty()) {
        return err(path + ".content", "must be a non-empty string");
      }
      AddedToken t;
      t.content = content->get<std::string>();
      GB_RETURN_IF_ERROR(validate_utf8(t.content, source + ": " + path + ".content"));
      GB_ASSIGN_OR_RETURN(t.special, get_bool(a, path, "special", false));
      GB_ASSIGN_OR_RETURN(t.normalized, get_bool(a, path, "normalized", !t.special));
      GB_ASSIGN_OR_RETURN(t.lstrip, get_bool(a, path, "lstrip", false));
      GB_ASSIGN_OR_RETURN(t.rstrip, get_bool(a, path, "rstrip", false));
      GB_ASSIGN_OR_RETURN(t.single_word, get_bool(a, path, "single_word", false));
      if (added_by_content.count(t.content)) return err(path + ".content", "repeats '" + t.content + "'");
      if (const auto in_vocab = bpe->token_to_id(t.content)) {
        t.id = *in_vocab;
      } else {
        const int64_t next = max_added >= model_size || model_size == 0 ? max_added + 1 : model_size;
        if (next > INT32_MAX) return err(path, "needs an id past 2^31 - 1");
        t.id = static_cast<int32_t>(next);
      }
      max_added = std::max<int64_t>(max_added, t.id);
      added_by_content.emplace(t.content, static_cast<int32_t>(added.size()));
      added.push_back(std::move(t));
    }
  }
  // Hugging Face matches special tokens first, then the others, each in file order; with leftmost-longest
  // matching the order only decides between identical contents, which are refused above.
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    if (!t.normalized) {
      raw_trie.add(t.content, static_cast<int32_t>(i));
      continue;
    }
    std::string pattern = t.content;
    for (NormalForm f : normalizers) {
      GB_ASSIGN_OR_RETURN(pattern, normalize_utf8(pattern, f));
    }
    normalized_trie.add(pattern, static_cast<int32_t>(i));
  }

  // Id tables.
  int64_t size = 0;
  for (const auto& [tok, id] : bpe->vocab()) size = std::max<int64_t>(size, int64_t{id} + 1);
  for (const AddedToken& t : added) size = std::max<int64_t>(size, int64_t{t.id} + 1);
  id_token.assign(size, {});
  id_bytes.assign(size, {});
  has_token.assign(size, 0);
  special.assign(size, 0);
  const auto set = [&](int32_t id, const std::string& tok) {
    id_token[id] = tok;
    // The ByteLevel decoder: a token whose characters are all in the byte alphabet stands for those
    // bytes; any other token (e.g. DeepSeek's "<｜User｜>") for its own UTF-8.
    const auto bytes = byte_level_to_bytes(tok);
    id_bytes[id] = bytes ? *bytes : tok;
    has_token[id] = 1;
  };
  for (const auto& [tok, id] : bpe->vocab()) set(id, tok);
  for (const AddedToken& t : added) {
    set(t.id, t.content);
    special[t.id] = t.special;
  }
  return ok_status();
}

Status Tokenizer::Impl::load_sequence(const json& j, const std::string& path, const char* key,
                                      Status (Impl::*load)(const json&, const std::string&)) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return err(path + "." + key, "must be an array");
  for (size_t i = 0; i < it->size(); ++i) {
    GB_RETURN_IF_ERROR((this->*load)((*it)[i], path + "." + key + "[" + std::to_string(i) + "]"));
  }
  return ok_status();
}

Status Tokenizer::Impl::load_normalizer(const json& j, const std::string& path) {
  if (j.is_null()) return ok_status();
  GB_ASSIGN_OR_RETURN(std::string type, get_type(j, path));
  if (type == "Sequence") {
    return load_sequence(j, path, "normalizers", &Impl::load_normalizer);
  }
  static const std::pair<const char*, NormalForm> kForms[] = {
      {"NFC", NormalForm::kNFC}, {"NFD", NormalForm::kNFD}, {"NFKC", NormalForm::kNFKC}, {"NFKD", NormalForm::kNFKD}};
  for (const auto& [name, form] : kForms) {
    if (type == name) {
      normalizers.push_back(form);
      return ok_status();
    }
  }
  return err(path + ".type",
             "'" + type + "' is not a supported normalizer (supported: NFC, NFD, NFKC, NFKD, Sequence)");
}

Status Tokenizer::Impl::load_pre_tokenizer(const json& j, const std::string& path) {
  if (j.is_null()) return ok_status();
  GB_ASSIGN_OR_RETURN(std::string type, get_type(j, path));
  if (type == "Sequence") {
    return load_sequence(j, path, "pretokenizers", &Impl::load_pre_tokenizer);
  }
  if (type == "ByteLevel") {
    ByteLevelStep s;
    GB_ASSIGN_OR_RETURN(s.add_prefix_space, get_bool(j, path, "add_prefix_space", true));
    GB_ASSIGN_OR_RETURN(bool use_regex, get_bool(j, path, "use_regex", true));
    if (use_regex) {
      GB_ASSIGN_OR_RETURN(s.gpt2, Regex::compile(kGpt2Pattern, source + ": " + path + " (GPT-2 regex)"));
      regex_jit = regex_jit && s.gpt2->jit();
      ++num_regexes;
    }
    steps.emplace_back(std::move(s));
    return ok_status();
  }
  if (type == "Split") {
    SplitStep s;
    const auto pat = j.find("pattern");
    if (pat == j.end() || !pat->is_object() || pat->size() != 1) {
      return err(path + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
    }
    if (const auto r = pat->find("Regex"); r != pat->end() && r->is_string()) {
      GB_ASSIGN_OR_RETURN(s.regex, Regex::compile(r->get<std::string>(), source + ": " + path + ".pattern.Regex"));
      regex_jit = regex_jit && s.regex->jit();
      ++num_regexes;
    } else if (const auto l = pat->find("String"); l != pat->end() && l->is_string()) {
      s.literal = l->get<std::string>();
      if (s.literal.empty()) return err(path + ".pattern.String", "must not be empty");
    } else {
      return err(path + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}, not " + quoted(*pat));
    }
    const auto beh = j.find("behavior");
    if (beh == j.end() || !beh->is_string()) return err(path + ".behavior", "is missing");
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    bool found = false;
    for (const auto& [name, b] : kBehaviors) {
      if (*beh == name) s.behavior = b, found = true;
    }
    if (!found) return err(path + ".behavior", "'" + beh->get<std::string>() + "' is not a Split behavior");
    GB_ASSIGN_OR_RETURN(s.invert, get_bool(j, path, "invert", false));
    steps.emplace_back(std::move(s));
    return ok_status();
  }
  return err(path + ".type", "'" + type + "' is not a supported pre-tokenizer (supported: Split, ByteLevel, Sequence)");
}

Status Tokenizer::Impl::load_decoder(const json& j, const std::string& path) {
  GB_ASSIGN_OR_RETURN(std::string type, get_type(j, path));
  if (type == "ByteLevel") return ok_status();  // its options change offsets only
  if (type == "Sequence") {
    const auto it = j.find("decoders");
    if (it == j.end() || !it->is_array() || it->size() != 1) {
      return err(path + ".decoders", "must hold exactly one decoder (ByteLevel)");
    }
    return load_decoder((*it)[0], path + ".decoders[0]");
  }
  return err(path + ".type", "'" + type + "' is not a supported decoder (supported: ByteLevel)");
}

Status Tokenizer::Impl::load_post_processor(const json& j, const std::string& path) {
  if (j.is_null()) return ok_status();
  GB_ASSIGN_OR_RETURN(std::string type, get_type(j, path));
  if (type == "ByteLevel") return ok_status();
  if (type == "Sequence") {
    return load_sequence(j, path, "processors", &Impl::load_post_processor);
  }
  return err(path + ".type", "'" + type + "' is not a supported post-processor (supported: ByteLevel, Sequence)");
}

Status Tokenizer::Impl::load_model(const json& j, const std::string& path) {
  GB_ASSIGN_OR_RETURN(std::string type, get_type(j, path));
  if (type != "BPE") return err(path + ".type", "'" + type + "' is not a supported model (supported: BPE)");
  if (const auto it = j.find("dropout"); it != j.end() && !it->is_null() && !(it->is_number() && *it == 0)) {
    return err(path + ".dropout", "is not supported (must be null): " + quoted(*it));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const auto it = j.find(key);
        it != j.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
      return err(path + "." + key, "is not supported (must be null or \"\"): " + quoted(*it));
    }
  }
  GB_ASSIGN_OR_RETURN(bool byte_fallback, get_bool(j, path, "byte_fallback", false));
  if (byte_fallback) return err(path + ".byte_fallback", "is not supported (must be false)");
  BpeModel::Options opt;
  GB_ASSIGN_OR_RETURN(opt.fuse_unk, get_bool(j, path, "fuse_unk", false));
  GB_ASSIGN_OR_RETURN(opt.ignore_merges, get_bool(j, path, "ignore_merges", false));
  if (const auto it = j.find("unk_token"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return err(path + ".unk_token", "must be a string or null");
    opt.unk_token = it->get<std::string>();
  }
  const auto vocab_it = j.find("vocab");
  if (vocab_it == j.end() || !vocab_it->is_object()) return err(path + ".vocab", "must be an object {token: id}");
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(vocab_it->size());
  for (const auto& [tok, id] : vocab_it->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return err(path + ".vocab[\"" + tok + "\"]", "must be an integer id in [0, 2^31), not " + quoted(id));
    }
    vocab.emplace(tok, static_cast<int32_t>(id.get<int64_t>()));
  }
  const auto merges_it = j.find("merges");
  std::vector<std::pair<std::string, std::string>> merges;
  if (merges_it != j.end() && !merges_it->is_null()) {
    if (!merges_it->is_array()) return err(path + ".merges", "must be an array");
    merges.reserve(merges_it->size());
    for (size_t i = 0; i < merges_it->size(); ++i) {
      const json& m = (*merges_it)[i];
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          return err(path + ".merges[" + std::to_string(i) + "]",
                     "must be two tokens separated by one space, not " + quoted(m));
        }
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        return err(path + ".merges[" + std::to_string(i) + "]", "must be \"a b\" or [\"a\", \"b\"], not " + quoted(m));
      }
    }
  }
  GB_ASSIGN_OR_RETURN(bpe, BpeModel::create(std::move(vocab), merges, std::move(opt), source + ": " + path));
  return ok_status();
}

// Cuts the added tokens of `trie` out of every text piece (Hugging Face's AddedVocabulary::find_matches).
void Tokenizer::Impl::split_added(std::vector<Piece>& pieces, const AddedTrie& trie, bool split_special) const {
  if (trie.empty()) return;
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& p : pieces) {
    if (p.added >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    const std::string_view s = p.text;
    size_t start_offset = 0;
    for (size_t pos = 0; pos < s.size();) {
      const auto [index, len] = trie.longest_at(s, pos);
      if (index < 0 || (split_special && added[index].special)) {
        pos += index < 0 ? 1 : len;
        continue;
      }
      const AddedToken& t = added[index];
      size_t start = pos, stop = pos + len;
      pos = stop;  // matches never overlap, whatever lstrip/rstrip do below
      if (t.single_word) {
        const auto word_before = [&] {
          if (start == 0) return false;
          size_t q = start - 1;
          while (q > 0 && (static_cast<uint8_t>(s[q]) & 0xC0) == 0x80) --q;
          size_t qq = q;
          return is_word_char(next_code_point(s, qq));
        };
        const auto word_after = [&] {
          if (stop >= s.size()) return false;
          size_t q = stop;
          return is_word_char(next_code_point(s, q));
        };
        if (word_before() || word_after()) continue;
      }
      if (t.lstrip) {
        size_t q = start;
        while (q > 0) {
          size_t c = q - 1;
          while (c > 0 && (static_cast<uint8_t>(s[c]) & 0xC0) == 0x80) --c;
          size_t cc = c;
          if (!is_white_space(next_code_point(s, cc))) break;
          q = c;
        }
        start = std::max(q, start_offset);
      }
      if (t.rstrip) {
        size_t q = stop;
        while (q < s.size()) {
          size_t c = q;
          if (!is_white_space(next_code_point(s, c))) break;
          q = c;
        }
        stop = q;
      }
      if (start_offset < start) out.push_back({std::string(s.substr(start_offset, start - start_offset)), -1});
      out.push_back({std::string(), index});
      start_offset = stop;
    }
    if (start_offset < s.size()) out.push_back({std::string(s.substr(start_offset)), -1});
  }
  pieces = std::move(out);
}

Status Tokenizer::Impl::pre_tokenize_and_merge(size_t step, std::string_view s, std::vector<int32_t>& out) const {
  if (s.empty()) return ok_status();  // empty pieces are dropped at every stage
  if (step == steps.size()) {
    bpe->tokenize(s, out);
    return ok_status();
  }
  if (const auto* bl = std::get_if<ByteLevelStep>(&steps[step])) {
    std::string with_prefix;
    if (bl->add_prefix_space && s.front() != ' ') {
      with_prefix = " " + std::string(s);
      s = with_prefix;
    }
    if (!bl->gpt2) return pre_tokenize_and_merge(step + 1, bytes_to_byte_level(s), out);
    std::vector<std::pair<size_t, size_t>> m;
    GB_RETURN_IF_ERROR(bl->gpt2->find_all(s, m));
    size_t prev = 0;
    for (const auto& [b, e] : m) {
      if (prev < b)
        GB_RETURN_IF_ERROR(pre_tokenize_and_merge(step + 1, bytes_to_byte_level(s.substr(prev, b - prev)), out));
      GB_RETURN_IF_ERROR(pre_tokenize_and_merge(step + 1, bytes_to_byte_level(s.substr(b, e - b)), out));
      prev = e;
    }
    if (prev < s.size()) GB_RETURN_IF_ERROR(pre_tokenize_and_merge(step + 1, bytes_to_byte_level(s.substr(prev)), out));
    return ok_status();
  }
  const SplitStep& sp = std::get<SplitStep>(steps[step]);
  // (begin, end, is_match) covering s.
  std::vector<std::pair<size_t, size_t>> m;
  if (sp.regex) {
    GB_RETURN_IF_ERROR(sp.regex->find_all(s, m));
  } else {
    for (size_t p = s.find(sp.literal); p != std::string_view::npos; p = s.find(sp.literal, p + sp.literal.size())) {
      m.emplace_back(p, p + sp.literal.size());
    }
  }
  struct Range {
    size_t b, e;
    bool match;
  };
  std::vector<Range> ranges;
  ranges.reserve(2 * m.size() + 1);
  size_t prev = 0;
  for (const auto& [b, e] : m) {
    if (prev != b) ranges.push_back({prev, b, false});
    ranges.push_back({b, e, true});
    prev = e;
  }
  if (prev != s.size()) ranges.push_back({prev, s.size(), false});
  if (sp.invert) {
    for (Range& r : ranges) r.match = !r.match;
  }
  std::vector<std::pair<size_t, size_t>> pieces;
  switch (sp.behavior) {
    case SplitBehavior::kRemoved:
      for (const Range& r : ranges) {
        if (!r.match) pieces.emplace_back(r.b, r.e);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Range& r : ranges) pieces.emplace_back(r.b, r.e);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const Range& r : ranges) {
        if (r.match && !prev_match && !pieces.empty()) {
          pieces.back().second = r.e;
        } else {
          pieces.emplace_back(r.b, r.e);
        }
        prev_match = r.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
        if (it->match && !prev_match && !pieces.empty()) {
          pieces.back().first = it->b;
        } else {
          pieces.emplace_back(it->b, it->e);
        }
        prev_match = it->match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (size_t i = 0; i < ranges.size(); ++i) {
        if (i > 0 && ranges[i].match == prev_match) {
          pieces.back().second = ranges[i].e;
        } else {
          pieces.emplace_back(ranges[i].b, ranges[i].e);
        }
        prev_match = ranges[i].match;
      }
      break;
    }
  }
  for (const auto& [b, e] : pieces) GB_RETURN_IF_ERROR(pre_tokenize_and_merge(step + 1, s.substr(b, e - b), out));
  return ok_status();
}

Result<Tokenizer> Tokenizer::from_json_text(std::string_view json_text, std::string_view source) {
  GB_ASSIGN_OR_RETURN(json root, parse_json_text<json>(json_text, source));
  auto impl = std::make_shared<Impl>();
  impl->source = std::string(source);
  GB_RETURN_IF_ERROR(impl->load(root));
  return Tokenizer(std::move(impl));
}

Result<Tokenizer> Tokenizer::load(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path, ec)) file = path / "tokenizer.json";
  if (!std::filesystem::is_regular_file(file, ec)) {
    return invalid_argument("tokenizer: " + file.string() +
                            " is not a regular file (a tokenizer.json, or a directory " + "holding one, is needed)");
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) return unavailable("tokenizer: cannot read " + file.string());
  return from_json_text(text.str(), file.string());
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  const Impl& im = *impl_;
  std::string replaced;
  if (options.invalid_utf8 == InvalidUtf8::kReplace) {
    replaced = utf8_replace_invalid(text);
    text = replaced;
  } else {
    GB_RETURN_IF_ERROR(validate_utf8(text, "encode"));
  }
  std::vector<Piece> pieces;
  if (!text.empty()) pieces.push_back({std::string(text), -1});
  im.split_added(pieces, im.raw_trie, options.split_special_tokens);
  for (Piece& p : pieces) {
    if (p.added >= 0) continue;
    for (NormalForm f : im.normalizers) {
      GB_ASSIGN_OR_RETURN(p.text, normalize_utf8(p.text, f));
    }
  }
  im.split_added(pieces, im.normalized_trie, options.split_special_tokens);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const Piece& p : pieces) {
    if (p.added >= 0) {
      ids.push_back(im.added[p.added].id);
    } else {
      GB_RETURN_IF_ERROR(im.pre_tokenize_and_merge(0, p.text, ids));
    }
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    const std::string* b = token_bytes(id);
    if (!b || (skip_special_tokens && impl_->special[id])) continue;
    bytes += *b;
  }
  return utf8_replace_invalid(bytes);
}

const std::string* Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(impl_->has_token.size()) || !impl_->has_token[id]) return nullptr;
  return &impl_->id_bytes[id];
}

const std::string* Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(impl_->has_token.size()) || !impl_->has_token[id]) return nullptr;
  return &impl_->id_token[id];
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto it = impl_->added_by_content.find(std::string(token)); it != impl_->added_by_content.end()) {
    return impl_->added[it->second].id;
  }
  return impl_->bpe->token_to_id(token);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < static_cast<int64_t>(impl_->special.size()) && impl_->special[id];
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->has_token.size()); }

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

std::string Tokenizer::describe() const {
  const Impl& im = *impl_;
  std::string s = "BPE, " + std::to_string(im.bpe->vocab().size()) + " tokens + " + std::to_string(im.added.size()) +
                  " added, " + std::to_string(im.bpe->num_merges()) + " merges";
  if (im.num_regexes > 0) {
    s += ", " + std::to_string(im.num_regexes) + " pre-tokenizer regex" + (im.num_regexes > 1 ? "es" : "") +
         (im.regex_jit ? " (PCRE2 JIT)" : " (PCRE2 interpreter)");
  }
  return s;
}

void Tokenizer::clear_cache() const { impl_->bpe->clear_cache(); }

}  // namespace genbridge::text
