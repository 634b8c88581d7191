// StreamDecoder: characters split over tokens are held back and released whole; the streamed text equals
// decode() of the same ids, replacements included.
#include "text/stream_decoder.h"

#include <gtest/gtest.h>

#include <random>

#include "support/temp_dir.h"
#include "text/synthetic_tokenizer.h"
#include "text/utf8.h"

namespace genbridge::text {
namespace {

class StreamDecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(write_synthetic_tokenizer(dir_.path(), 512).ok());
    auto t = Tokenizer::load(dir_.path());
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    tok_ = std::make_unique<Tokenizer>(*t);
  }
  testing::TempDir dir_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(StreamDecoderTest, emoji_bytes_are_held_until_complete) {
  // The synthetic vocabulary has no merges over these bytes: 😀 (F0 9F 98 80) is four byte tokens.
  const auto ids = *tok_->encode("\xF0\x9F\x98\x80!");
  ASSERT_EQ(ids.size(), 5u);
  StreamDecoder s(*tok_);
  EXPECT_EQ(s.push(ids[0]), "");
  EXPECT_EQ(s.push(ids[1]), "");
  EXPECT_EQ(s.push(ids[2]), "");
  EXPECT_EQ(s.pending_bytes(), 3u);
  EXPECT_EQ(s.push(ids[3]), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.push(ids[4]), "!");
  EXPECT_EQ(s.finish(), "");
}

TEST_F(StreamDecoderTest, truncated_character_at_the_end_becomes_one_replacement) {
  const auto ids = *tok_->encode("a\xE4\xBD\xA0");  // a 你
  StreamDecoder s(*tok_);
  std::string out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) out += s.push(ids[i]);  // the last byte never comes
  EXPECT_EQ(out, "a");
  EXPECT_EQ(s.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(s.pending_bytes(), 0u);
}

TEST_F(StreamDecoderTest, invalid_byte_is_replaced_at_once) {
  // 0xE4 then 'x': the sequence can no longer complete, so it is replaced when 'x' arrives.
  const int32_t e4 = 0xE4, x = 'x';
  StreamDecoder s(*tok_);
  EXPECT_EQ(s.push(e4), "");
  EXPECT_EQ(s.push(x), "\xEF\xBF\xBDx");
}

TEST_F(StreamDecoderTest, random_id_streams_equal_decode_and_are_valid_utf8) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(-3, static_cast<int32_t>(tok_->vocab_size()) + 3);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids(1 + trial % 40);
    for (int32_t& i : ids) i = id(rng);
    for (bool skip : {false, true}) {
      StreamDecoder s(*tok_, skip);
      std::string streamed;
      for (int32_t i : ids) {
        const std::string piece = s.push(i);
        ASSERT_TRUE(validate_utf8(piece, "piece").ok());
        streamed += piece;
      }
      streamed += s.finish();
      ASSERT_EQ(streamed, tok_->decode(ids, skip)) << "trial " << trial;
    }
  }
}

TEST_F(StreamDecoderTest, special_tokens_are_skipped_on_request) {
  const int32_t im_end = *tok_->token_to_id("<|im_end|>");
  StreamDecoder keep(*tok_), skip(*tok_, true);
  EXPECT_EQ(keep.push(im_end), "<|im_end|>");
  EXPECT_EQ(skip.push(im_end), "");
}

}  // namespace
}  // namespace genbridge::text
