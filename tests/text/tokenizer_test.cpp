// Tokenizer: hand-checked BPE merging, the load errors (each names the JSON path), invalid UTF-8, unknown
// ids, concurrency and very long inputs. Agreement with Hugging Face's implementation on real files is
// tests/text/oracle's job.
#include "text/tokenizer.h"

#include <gtest/gtest.h>
#include <utf8proc.h>

#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "support/temp_dir.h"
#include "text/byte_level.h"
#include "text/regex.h"
#include "text/synthetic_tokenizer.h"
#include "text/utf8.h"

namespace genbridge::text {
namespace {

using json = nlohmann::json;

// A byte-level BPE over the alphabet "abc" + space, with merges a+b (rank 0), ab+c (1), Ġ+a (2).
json tiny_tokenizer() {
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = id++;
  vocab["ab"] = id++;   // 256
  vocab["abc"] = id++;  // 257
  vocab["Ġa"] = id++;   // 258
  return json{
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", " ?\\p{L}+|\\s+"}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", json::array({{{"id", 259}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}}})},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b", "ab c", "Ġ a"})}}}};
}

Tokenizer load(const json& j) {
  auto t = Tokenizer::from_json_text(j.dump());
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return *t;
}

std::string load_error(const json& j) {
  auto t = Tokenizer::from_json_text(j.dump());
  EXPECT_FALSE(t.ok());
  return t.ok() ? "" : t.status().to_string();
}

TEST(Tokenizer, merges_by_rank) {
  const Tokenizer t = load(tiny_tokenizer());
  // "abc": a+b (rank 0) then ab+c (rank 1). " ab": Ġ+a (rank 2) would need 'a' before a+b takes it;
  // a+b ranks first, so the result is Ġ, ab.
  EXPECT_EQ(*t.encode("abc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(*t.encode(" ab"), (std::vector<int32_t>{32, 256}));  // 'Ġ' (the space byte) is id 32
}

TEST(Tokenizer, space_byte_is_its_own_id) {
  const Tokenizer t = load(tiny_tokenizer());
  EXPECT_EQ(*t.encode(" "), (std::vector<int32_t>{32}));
  EXPECT_EQ(*t.encode(" a"), (std::vector<int32_t>{258}));
  EXPECT_EQ(*t.encode("abab<|end|>c"), (std::vector<int32_t>{256, 256, 259, 'c'}));
}

TEST(Tokenizer, empty_input_gives_no_ids) {
  const Tokenizer t = load(tiny_tokenizer());
  EXPECT_TRUE(t.encode("")->empty());
  EXPECT_EQ(t.decode({}), "");
}

TEST(Tokenizer, invalid_utf8_is_refused_with_its_offset) {
  const Tokenizer t = load(tiny_tokenizer());
  auto r = t.encode("ab\xff");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().to_string(),
            "InvalidArgument: encode: input is not valid UTF-8: byte 0xff at byte offset 2 starts not a valid first "
            "byte here");
  r = t.encode("a\xe4\xbd");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().to_string(),
            "InvalidArgument: encode: input is not valid UTF-8: byte 0xe4 at byte offset 1 starts a multi-byte "
            "sequence cut off by the end of the input");
}

TEST(Tokenizer, invalid_utf8_replace_mode_encodes_u_fffd) {
  const Tokenizer t = load(tiny_tokenizer());
  EncodeOptions o;
  o.invalid_utf8 = InvalidUtf8::kReplace;
  const auto ids = t.encode(
      "a\xff"
      "b",
      o);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(t.decode(*ids),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(Tokenizer, decode_skips_unknown_ids_and_special_on_request) {
  const Tokenizer t = load(tiny_tokenizer());
  EXPECT_EQ(t.vocab_size(), 260);
  EXPECT_EQ(t.decode(std::vector<int32_t>{257, 999999, -1, 259, 32}), "abc<|end|> ");
  EXPECT_EQ(t.decode(std::vector<int32_t>{257, 259, 32}, /*skip_special_tokens=*/true), "abc ");
  EXPECT_EQ(t.token_bytes(999999), nullptr);
  EXPECT_EQ(*t.token_bytes(32), " ");
  EXPECT_EQ(*t.id_to_token(32), "Ġ");
  EXPECT_EQ(t.token_to_id("<|end|>"), 259);
  EXPECT_TRUE(t.is_special(259));
}

TEST(Tokenizer, split_special_tokens_encodes_them_as_text) {
  const Tokenizer t = load(tiny_tokenizer());
  EncodeOptions o;
  o.split_special_tokens = true;
  const auto ids = t.encode("<|end|>", o);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 7u);
  EXPECT_EQ(t.decode(*ids), "<|end|>");
}

TEST(Tokenizer, unsupported_normalizer_names_its_path) {
  json j = tiny_tokenizer();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Lowercase"}}})}};
  EXPECT_EQ(load_error(j),
            "InvalidArgument: tokenizer.json: $.normalizer.normalizers[1].type 'Lowercase' is not a supported "
            "normalizer (supported: NFC, NFD, NFKC, NFKD, Sequence)");
}

TEST(Tokenizer, unsupported_pre_tokenizer_names_its_path) {
  json j = tiny_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Whitespace"}};
  EXPECT_EQ(load_error(j),
            "InvalidArgument: tokenizer.json: $.pre_tokenizer.pretokenizers[1].type 'Whitespace' is not a supported "
            "pre-tokenizer (supported: Split, ByteLevel, Sequence)");
}

TEST(Tokenizer, unsupported_model_decoder_and_options_name_their_paths) {
  json j = tiny_tokenizer();
  j["model"]["type"] = "Unigram";
  EXPECT_EQ(load_error(j),
            "InvalidArgument: tokenizer.json: $.model.type 'Unigram' is not a supported model (supported: BPE)");
  j = tiny_tokenizer();
  j["decoder"] = {{"type", "Sequence"}, {"decoders", json::array({{{"type", "Replace"}}})}};
  EXPECT_EQ(load_error(j),
            "InvalidArgument: tokenizer.json: $.decoder.decoders[0].type 'Replace' is not a supported decoder "
            "(supported: ByteLevel)");
  j = tiny_tokenizer();
  j["model"]["byte_fallback"] = true;
  EXPECT_EQ(load_error(j), "InvalidArgument: tokenizer.json: $.model.byte_fallback is not supported (must be false)");
  j = tiny_tokenizer();
  j["model"]["continuing_subword_prefix"] = "##";
  EXPECT_EQ(load_error(j),
            "InvalidArgument: tokenizer.json: $.model.continuing_subword_prefix is not supported (must be null or "
            "\"\"): \"##\"");
  j = tiny_tokenizer();
  j["truncation"] = {{"max_length", 8}};
  EXPECT_EQ(load_error(j),
            "InvalidArgument: tokenizer.json: $.truncation is not supported (must be null): {\"max_length\":8}");
  j = tiny_tokenizer();
  j["post_processor"] = {{"type", "TemplateProcessing"}};
  EXPECT_EQ(load_error(j),
            "InvalidArgument: tokenizer.json: $.post_processor.type 'TemplateProcessing' is not a supported "
            "post-processor (supported: ByteLevel, Sequence)");
}

TEST(Tokenizer, merge_outside_the_vocabulary_names_the_merge) {
  json j = tiny_tokenizer();
  j["model"]["merges"].push_back("b c");
  EXPECT_EQ(load_error(j),
            "InvalidArgument: tokenizer.json: $.model.merges[3]: merge 'b c' needs token 'bc', which is not in the "
            "vocabulary");
  j = tiny_tokenizer();
  j["model"]["merges"].push_back("a b c");
  EXPECT_EQ(load_error(j),
            "InvalidArgument: tokenizer.json: $.model.merges[3] must be two tokens separated by one space, not "
            "\"a b c\"");
}

TEST(Tokenizer, bad_regex_and_bad_json_are_refused) {
  json j = tiny_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "[\\S]";
  EXPECT_EQ(load_error(j),
            "InvalidArgument: tokenizer.json: $.pre_tokenizer.pretokenizers[0].pattern.Regex: '\\S' inside a "
            "character class is not supported (pattern [\\S])");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(";
  EXPECT_NE(load_error(j).find("the regular expression does not compile (PCRE2: missing closing parenthesis"),
            std::string::npos);
  EXPECT_NE(Tokenizer::from_json_text("{\"model\":").status().to_string().find("tokenizer.json: malformed JSON"),
            std::string::npos);
}

TEST(Tokenizer, load_refuses_a_missing_file) {
  testing::TempDir dir;
  const auto r = Tokenizer::load(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().to_string(), "InvalidArgument: tokenizer: " + (dir.path() / "tokenizer.json").string() +
                                        " is not a regular file (a tokenizer.json, or a directory holding one, is "
                                        "needed)");
}

TEST(Tokenizer, split_behaviors) {
  // Split on "-" with each behavior, observed through the ids of single bytes (no merges apply).
  const auto ids_for = [](const char* behavior, bool invert) {
    json j = tiny_tokenizer();
    j["model"]["merges"] = json::array();
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}})}};
    auto t = Tokenizer::from_json_text(j.dump());
    EXPECT_TRUE(t.ok());
    return t->decode(*t->encode("a-b"));
  };
  // add_prefix_space marks where each piece starts (a space is prepended to every piece).
  EXPECT_EQ(ids_for("Isolated", false), " a - b");
  EXPECT_EQ(ids_for("Removed", false), " a b");
  EXPECT_EQ(ids_for("MergedWithPrevious", false), " a- b");
  EXPECT_EQ(ids_for("MergedWithNext", false), " a -b");
  EXPECT_EQ(ids_for("Contiguous", false), " a - b");
  EXPECT_EQ(ids_for("Removed", true), " -");
}

TEST(Tokenizer, concurrent_encodes_agree) {
  testing::TempDir dir;
  ASSERT_TRUE(write_synthetic_tokenizer(dir.path(), 8192).ok());
  const auto t = Tokenizer::load(dir.path());
  ASSERT_TRUE(t.ok());
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i)
    texts.push_back("The model " + std::to_string(i * 7919) + " reads tokens, 你好 " + std::string(i % 5, ' ') +
                    "end.");
  std::vector<std::vector<int32_t>> want;
  for (const auto& s : texts) want.push_back(*t->encode(s));
  t->clear_cache();
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int rep = 0; rep < 20; ++rep) {
        for (size_t i = th; i < texts.size(); i += 1) {
          if (*t->encode(texts[i]) != want[i]) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Tokenizer, megabyte_inputs_finish) {
  testing::TempDir dir;
  ASSERT_TRUE(write_synthetic_tokenizer(dir.path(), 512).ok());
  const auto t = Tokenizer::load(dir.path());
  ASSERT_TRUE(t.ok());
  const std::string spaces(1 << 20, ' ');
  const auto a = t->encode(spaces);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(t->decode(*a), spaces);
  const std::string word(1 << 20, 'e');
  const auto b = t->encode(word);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(t->decode(*b), word);
}

TEST(Regex, whitespace_is_onigurumas_white_space) {
  // U+180E is \s in PCRE2 but not White_Space (Oniguruma, Hugging Face): the rewrite makes them agree.
  auto re = Regex::compile("\\s+", "test");
  ASSERT_TRUE(re.ok());
  std::vector<std::pair<size_t, size_t>> m;
  ASSERT_TRUE(re->find_all("a\xE1\xA0\x8E"
                           "b\xE2\x80\x83"
                           "c",
                           m)
                  .ok());
  ASSERT_EQ(m.size(), 1u);  // only U+2003 EM SPACE
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{5, 8}));
  EXPECT_EQ(*translate_oniguruma_pattern("[^\\s\\p{L}]\\S", "t"),
            "[^\\t-\\r\\x20\\x{85}\\p{Z}\\p{L}][^\\t-\\r\\x20\\x{85}\\p{Z}]");
}

TEST(Utf8, normalization_by_stretches_equals_whole_string_normalization) {
  // normalize_utf8 hands utf8proc only the non-ASCII stretches; utf8proc on the whole string is the oracle.
  const char* pool[] = {"a",
                        "e",
                        " ",
                        "\n",
                        "x",
                        "\xCC\x81",
                        "\xCC\x88",
                        "\xCC\xA3",
                        "\xC3\xA9",
                        "\xEA\xB0\x80",
                        "\xE1\x84\x80",
                        "\xE1\x85\xA1",
                        "\xEF\xAC\x81",
                        "\xE2\x84\xAB",
                        "\xC3\x85",
                        "\xF0\x9F\x98\x80"};
  std::mt19937 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s;
    for (int k = 0; k < 1 + trial % 12; ++k) s += pool[rng() % std::size(pool)];
    const std::pair<NormalForm, int> forms[] = {{NormalForm::kNFC, UTF8PROC_COMPOSE},
                                                {NormalForm::kNFD, UTF8PROC_DECOMPOSE},
                                                {NormalForm::kNFKC, UTF8PROC_COMPOSE | UTF8PROC_COMPAT}};
    for (const auto& [form, options] : forms) {
      utf8proc_uint8_t* whole = nullptr;
      const auto n =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                       &whole, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | options));
      ASSERT_GE(n, 0);
      const std::string want(reinterpret_cast<char*>(whole), static_cast<size_t>(n));
      std::free(whole);
      ASSERT_EQ(*normalize_utf8(s, form), want) << "trial " << trial;
    }
  }
}

TEST(Utf8, replacement_follows_maximal_subparts) {
  EXPECT_EQ(utf8_replace_invalid("\xF0\x9F\x98"
                                 "A"),
            "\xEF\xBF\xBD"
            "A");                                                           // one U+FFFD for a cut 4-byte prefix
  EXPECT_EQ(utf8_replace_invalid("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: two bytes, two U+FFFD
  EXPECT_EQ(utf8_replace_invalid("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(utf8_replace_invalid("\xE4\xBD"), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace genbridge::text
