// write_synthetic_tokenizer: the files load, fit the model's vocabulary exactly, put the special tokens at
// the end, are byte-identical for the same vocabulary size, and refuse a vocabulary too small to hold them.
#include "text/synthetic_tokenizer.h"

#include <gtest/gtest.h>

#include "support/temp_dir.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace genbridge::text {
namespace {

TEST(SyntheticTokenizer, fills_the_vocabulary_with_specials_at_the_end) {
  for (int64_t vocab : {kMinSyntheticVocab, int64_t{512}, int64_t{8192}}) {
    testing::TempDir dir;
    ASSERT_TRUE(write_synthetic_tokenizer(dir.path(), vocab).ok());
    const auto t = Tokenizer::load(dir.path());
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(t->vocab_size(), vocab);
    for (int32_t id = 0; id < vocab; ++id) ASSERT_NE(t->token_bytes(id), nullptr) << "id " << id << " of " << vocab;
    EXPECT_EQ(t->token_to_id("<|endoftext|>"), vocab - 5);
    EXPECT_EQ(t->token_to_id("<|im_end|>"), vocab - 3);
    EXPECT_TRUE(t->is_special(static_cast<int32_t>(vocab - 3)));
    EXPECT_FALSE(t->is_special(static_cast<int32_t>(vocab - 1)));  // </think>, as in Qwen3
    const std::string text = "The model reads a prompt: 你好, 42 tokens!\n";
    EXPECT_EQ(t->decode(*t->encode(text)), text);
  }
}

TEST(SyntheticTokenizer, merges_shorten_english) {
  testing::TempDir dir;
  ASSERT_TRUE(write_synthetic_tokenizer(dir.path(), 512).ok());
  const auto t = Tokenizer::load(dir.path());
  const std::string text = "the model and the token";
  EXPECT_LT(t->encode(text)->size(), text.size() / 2);
}

TEST(SyntheticTokenizer, same_vocabulary_gives_identical_files) {
  testing::TempDir a, b;
  ASSERT_TRUE(write_synthetic_tokenizer(a.path(), 8192).ok());
  ASSERT_TRUE(write_synthetic_tokenizer(b.path(), 8192).ok());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_EQ(testing::read_file_bytes(a / f), testing::read_file_bytes(b / f)) << f;
  }
}

TEST(SyntheticTokenizer, chat_template_renders_chatml) {
  testing::TempDir dir;
  ASSERT_TRUE(write_synthetic_tokenizer(dir.path(), 512).ok());
  const auto c = TokenizerConfig::load(dir.path());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->eos_token, "<|im_end|>");
  const auto text = c->render_chat(nlohmann::ordered_json::parse(
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
          "add_generation_prompt": true})"));
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
}

TEST(SyntheticTokenizer, refuses_a_vocabulary_below_the_minimum) {
  testing::TempDir dir;
  const Status st = write_synthetic_tokenizer(dir.path(), 260);
  EXPECT_EQ(st.to_string(),
            "InvalidArgument: write_synthetic_tokenizer: vocab_size 260 is outside [261, 2^31 - 1] (256 byte tokens "
            "+ 5 special tokens must fit)");
}

}  // namespace
}  // namespace genbridge::text
