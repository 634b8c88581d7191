#include "text/synthetic_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "text/byte_level.h"
#include "text/regex.h"
#include "text/utf8.h"

namespace genbridge::text {
namespace {

using ojson = nlohmann::ordered_json;

// Qwen2/Qwen3's pre-tokenizer pattern.
constexpr const char* kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The training text (written for genbridge; any English would do).
constexpr const char* kCorpus =
    "The model reads a prompt, one token at a time, and writes the next token. Each layer of the model "
    "holds attention and a mixture of experts: the router picks the experts for every token, the experts "
    "compute their part, and the results are added back in a fixed order. The runtime keeps the keys and "
    "values of every sequence in pages of the cache, so that many requests can share the same decode step. "
    "When a request ends, its pages go back to the pool and another request takes them. A server turns "
    "text into tokens with the tokenizer, renders the chat with the template of the model, and streams the "
    "text back as it is generated. It is a small world of numbers: 1, 2, 3, 10, 42, 128 and 2026. Where "
    "does the time go? Into the matrix products, the memory traffic and the wait for the next message. "
    "We measure it, we write it down, and we make it faster without changing a single result. The quick "
    "brown fox jumps over the lazy dog; she sells sea shells by the sea shore. Hello, world! How are you "
    "today? I am fine, thank you, and you? Let us think step by step before we answer the question.\n";

std::vector<std::string> pre_tokens(const std::string& text) {
  auto re = Regex::compile(kPattern, "synthetic tokenizer pattern");
  GB_CHECK(re.ok(), "the built-in pattern compiles");
  std::vector<std::pair<size_t, size_t>> m;
  GB_CHECK(re->find_all(text, m).ok(), "the built-in pattern matches");
  std::vector<std::string> out;
  for (const auto& [b, e] : m) out.push_back(bytes_to_byte_level(text.substr(b, e - b)));
  return out;
}

std::vector<std::string> chars_of(const std::string& s) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    next_code_point(s, pos);
    out.push_back(s.substr(start, pos - start));
  }
  return out;
}

// Plain BPE training: repeatedly merge the most frequent adjacent pair (ties: the smaller pair of strings),
// until `budget` merges or no pair occurs twice. Small inputs only (a paragraph).
std::vector<std::pair<std::string, std::string>> train(const std::vector<std::string>& words, int64_t budget) {
  std::map<std::string, int64_t> counts;
  for (const std::string& w : words) ++counts[w];
  std::vector<std::pair<std::vector<std::string>, int64_t>> split;
  for (const auto& [w, n] : counts) split.emplace_back(chars_of(w), n);
  std::vector<std::pair<std::string, std::string>> merges;
  while (static_cast<int64_t>(merges.size()) < budget) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& [syms, n] : split) {
      for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += n;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int64_t best_n = 1;
    for (const auto& [p, n] : pairs) {
      if (n > best_n) best = &p, best_n = n;  // map order breaks ties toward the smaller pair
    }
    if (!best) break;
    const auto merge = *best;
    merges.push_back(merge);
    for (auto& [syms, n] : split) {
      std::vector<std::string> next;
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == merge.first && syms[i + 1] == merge.second) {
          next.push_back(merge.first + merge.second);
          ++i;
        } else {
          next.push_back(syms[i]);
        }
      }
      syms = std::move(next);
    }
  }
  return merges;
}

constexpr const char* kChatTemplate =
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- '# Tools\\n' }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- tool | tojson + '\\n' }}\n"
    "    {%- endfor %}\n"
    "    {{- '<|im_end|>\\n' }}\n"
    "{%- elif messages[0].role == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.role != 'system' or not loop.first %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}";

Status write_file(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) return unavailable("write_synthetic_tokenizer: cannot write " + tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return unavailable("write_synthetic_tokenizer: cannot rename " + tmp.string() + ": " + ec.message());
  return ok_status();
}

}  // namespace

Status write_synthetic_tokenizer(const std::filesystem::path& dir, int64_t vocab_size) {
  if (vocab_size < kMinSyntheticVocab || vocab_size > INT32_MAX) {
    return invalid_argument("write_synthetic_tokenizer: vocab_size " + std::to_string(vocab_size) + " is outside [" +
                            std::to_string(kMinSyntheticVocab) +
                            ", 2^31 - 1] (256 byte tokens + 5 special tokens must fit)");
  }
  const int64_t specials_start = vocab_size - 5;
  const std::vector<std::string> words = pre_tokens(kCorpus);
  const auto merges = train(words, specials_start - 256);

  ojson vocab = ojson::object();
  std::set<std::string> taken;
  int64_t next_id = 0;
  const auto add = [&](const std::string& tok) {
    if (next_id >= specials_start || !taken.insert(tok).second) return;
    vocab[tok] = next_id++;
  };
  for (int b = 0; b < 256; ++b) add(bytes_to_byte_level(std::string(1, static_cast<char>(b))));
  for (const auto& [a, b] : merges) add(a + b);
  // Decode-only filler: the paragraph's words, then pairs of them (the second with its leading space), in
  // first-seen order.
  std::vector<std::string> distinct;
  for (const std::string& w : words) {
    if (chars_of(w).size() > 1 && std::find(distinct.begin(), distinct.end(), w) == distinct.end()) {
      distinct.push_back(w);
    }
  }
  for (const std::string& w : distinct) add(w);
  for (size_t i = 0; i < distinct.size() && next_id < specials_start; ++i) {
    for (size_t j = 0; j < distinct.size() && next_id < specials_start; ++j) {
      if (distinct[j].rfind("\xC4\xA0", 0) == 0) add(distinct[i] + distinct[j]);  // U+0120 'Ġ' is the space
    }
  }
  for (int64_t k = 0; next_id < specials_start; ++k) add("<|filler_" + std::to_string(k) + "|>");

  const char* kAdded[5] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"};
  ojson added = ojson::array();
  for (int k = 0; k < 5; ++k) {
    const bool special = k < 3;
    added.push_back({{"id", specials_start + k},
                     {"content", kAdded[k]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", special}});
  }
  ojson merges_json = ojson::array();
  for (const auto& [a, b] : merges) merges_json.push_back({a, b});
  const ojson byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  ojson tok = {{"version", "1.0"},
               {"truncation", nullptr},
               {"padding", nullptr},
               {"added_tokens", added},
               {"normalizer", {{"type", "NFC"}}},
               {"pre_tokenizer",
                {{"type", "Sequence"},
                 {"pretokenizers",
                  {{{"type", "Split"}, {"pattern", {{"Regex", kPattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                   byte_level}}}},
               {"post_processor", byte_level},
               {"decoder", byte_level},
               {"model",
                {{"type", "BPE"},
                 {"dropout", nullptr},
                 {"unk_token", nullptr},
                 {"continuing_subword_prefix", ""},
                 {"end_of_word_suffix", ""},
                 {"fuse_unk", false},
                 {"byte_fallback", false},
                 {"ignore_merges", false},
                 {"vocab", vocab},
                 {"merges", merges_json}}}};
  ojson config = {{"add_bos_token", false},
                  {"bos_token", nullptr},
                  {"eos_token", "<|im_end|>"},
                  {"pad_token", "<|endoftext|>"},
                  {"unk_token", nullptr},
                  {"model_max_length", 131072},
                  {"tokenizer_class", "PreTrainedTokenizerFast"},
                  {"chat_template", kChatTemplate}};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return unavailable("write_synthetic_tokenizer: cannot create " + dir.string() + ": " + ec.message());
  GB_RETURN_IF_ERROR(write_file(dir / "tokenizer.json", tok.dump(1) + "\n"));
  return write_file(dir / "tokenizer_config.json", config.dump(2) + "\n");
}

}  // namespace genbridge::text
