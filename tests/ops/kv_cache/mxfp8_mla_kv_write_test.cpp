// Exact-byte tests of kv_cache/mxfp8_mla_kv_write (MlaKvFormat::kMxfp8RopeFirstPacked: DeepSeek-V4's shared
// K = V row on a generation with an FP8 data path): the rope bytes, the E8M0 scale bytes at their rule's
// boundaries, the codes, the zero padding, the slots and nothing else written. Runs unchanged in every
// target build; on Ascend910 the writer is the explicit unsupported provider.
#include "../attention/mla_harness.h"

#include "genbridge/core/formats.h"

namespace genbridge::testing {
namespace {

constexpr int64_t kBs = 4, kBlocks = 3;

struct Mxfp8Cache {
  int64_t L, R, row;
  OwnedTensor kv;
  Mxfp8Cache(int64_t l, int64_t r)
      : L(l), R(r), row(ops::mla_kv_row_bytes(MlaKvFormat::kMxfp8RopeFirstPacked, l, r).main), kv(DType::kU8, {kBlocks, kBs, row}) {
    std::fill(kv.bytes().begin(), kv.bytes().end(), std::byte{0xAB});
  }
  ops::MlaKvCache cache() {
    ops::MlaKvCache c;
    c.format = MlaKvFormat::kMxfp8RopeFirstPacked;
    c.kv_lora_rank = L;
    c.rope_dim = R;
    c.kv_cache = kv.view();
    return c;
  }
  Status write(std::vector<float> latent, std::vector<float> rope, std::vector<int32_t> slots) {
    const int64_t n = static_cast<int64_t>(slots.size());
    return ops::mxfp8_mla_kv_write(TensorView(latent.data(), DType::kF32, {n, L}),
                                   TensorView(rope.data(), DType::kF32, {n, R}),
                                   TensorView(slots.data(), DType::kI32, {n}), cache());
  }
  const uint8_t* slot_row(int64_t slot) const { return reinterpret_cast<const uint8_t*>(kv.bytes().data()) + slot * row; }
};

TEST(Mxfp8MlaKvWrite, row_bytes_are_rope_codes_scales_and_zero_padding) {
  if (!mla_fp8_supported()) GTEST_SKIP() << "the explicit unsupported provider is checked below";
  EXPECT_EQ(ops::mla_kv_row_bytes(MlaKvFormat::kMxfp8RopeFirstPacked, 448, 64).main, 640);  // 583 used
  Mxfp8Cache c(256, 64);  // 128 rope + 256 codes + 4 scales = 388 bytes, padded to 512
  ASSERT_EQ(c.row, 512);
  std::vector<float> lat(256, 0.f), rope(64);
  // Group 0: amax 3 -> 3/448 in (2^-8, 2^-7]: byte 127 - 7 = 120; 1 / 2^-7 = 128 = 0x70, -3 / 2^-7 = -384 = 0xFC.
  for (int i = 0; i < 64; ++i) lat[i] = 1.f;
  lat[5] = -3.f;
  // Group 1: amax 56 = 448 / 8 exactly: the scale is 2^-3 itself (byte 124), 56 -> 448 = 0x7E, no saturation.
  for (int i = 64; i < 128; ++i) lat[i] = 0.5f;
  lat[70] = 56.f;
  // Group 2: all zero: the amax floor 1e-4 gives 1e-4 / 448 in (2^-23, 2^-22]: byte 105, codes 0.
  // Group 3: a NaN is skipped for the amax (2 -> 2/448 in (2^-8, 2^-7]: byte 120) and encodes as NaN; +inf
  // elsewhere would make the byte 254 (next test).
  for (int i = 192; i < 256; ++i) lat[i] = -0.25f;
  lat[200] = 2.f;
  lat[201] = std::nanf("");
  for (int i = 0; i < 64; ++i) rope[i] = 0.001f * static_cast<float>(i) - 0.01f;
  ASSERT_TRUE(c.write(lat, rope, {6}).ok());
  const uint8_t* row = c.slot_row(6);
  for (int i = 0; i < 64; ++i) {
    uint16_t bits;
    std::memcpy(&bits, row + 2 * i, 2);
    ASSERT_EQ(bits, float_to_bf16(rope[i]).bits) << "rope " << i;
  }
  const uint8_t* codes = row + 128;
  const uint8_t* scales = codes + 256;
  EXPECT_EQ(scales[0], 120);
  EXPECT_EQ(scales[1], 124);
  EXPECT_EQ(scales[2], 105);
  EXPECT_EQ(scales[3], 120);
  EXPECT_EQ(codes[0], 0x70);
  EXPECT_EQ(codes[5], 0xFC);
  EXPECT_EQ(codes[70], 0x7E);
  EXPECT_EQ(codes[64], 0x48);  // 0.5 / 2^-3 = 4 = 2^2: exponent 9
  for (int i = 128; i < 192; ++i) ASSERT_EQ(codes[i], 0) << i;
  EXPECT_EQ(codes[200], 0x78);               // 2 / 2^-7 = 256
  EXPECT_EQ(codes[201] & 0x7F, 0x7F);        // NaN
  EXPECT_EQ(codes[192], 0xE0);               // -0.25 / 2^-7 = -32 = -2^5: exponent 12
  for (int64_t i = 388; i < 512; ++i) ASSERT_EQ(row[i], 0) << "padding byte " << i;
  // Every other slot is untouched.
  for (int64_t s = 0; s < kBlocks * kBs; ++s) {
    if (s == 6) continue;
    for (int64_t i = 0; i < c.row; ++i) ASSERT_EQ(c.slot_row(s)[i], 0xAB) << "slot " << s;
  }
}

TEST(Mxfp8MlaKvWrite, scale_byte_rule_at_its_boundaries) {
  if (!mla_fp8_supported()) GTEST_SKIP() << "the explicit unsupported provider is checked below";
  Mxfp8Cache c(64, 0);
  // amax -> byte: a power of two times 448 is its own scale; one ulp above takes the next power; inf and the
  // inf clamps to 254 (2^127; FLT_MAX / 448 needs only 2^120); tiny values use the 1e-4 floor.
  const std::vector<std::pair<float, int>> cases = {
      {448.f, 127}, {std::nextafter(448.f, 1e9f), 128}, {std::nextafter(448.f, 0.f), 127}, {224.f, 126},
      {1.f, 119}, {1e-30f, 105}, {INFINITY, 254}, {FLT_MAX, 247}, {448.f * 0x1p100f, 227}};
  for (const auto& [amax, byte] : cases) {
    std::vector<float> lat(64, 0.f);
    lat[17] = -amax;
    ASSERT_TRUE(c.write(lat, {}, {2}).ok());
    EXPECT_EQ(c.slot_row(2)[64], byte) << "amax " << amax;
    std::vector<int> ref_bytes;
    std::vector<double> deq;
    ref::mxfp8_mla_latent_row(std::vector<double>(lat.begin(), lat.end()), ref_bytes, deq);
    EXPECT_EQ(ref_bytes[0], byte) << "reference, amax " << amax;
  }
}

TEST(Mxfp8MlaKvWrite, slots_are_flat_and_checked_before_writing) {
  if (!mla_fp8_supported()) GTEST_SKIP() << "the explicit unsupported provider is checked below";
  Mxfp8Cache c(64, 16);
  const auto before = c.kv.bytes();
  std::vector<float> lat(64, 1.f), rope(16, 1.f);
  std::vector<int32_t> pair = {1, 0};
  Status st = ops::mxfp8_mla_kv_write(TensorView(lat.data(), DType::kF32, {1, 64}),
                                      TensorView(rope.data(), DType::kF32, {1, 16}),
                                      TensorView(pair.data(), DType::kI32, {1, 2}), c.cache());
  EXPECT_EQ(st.message(), "mxfp8_mla_kv_write: slot_mapping has shape [1, 2] but must be [num_tokens] (flat slots) with "
                          "num_tokens = 1");
  st = c.write({}, {}, {});
  EXPECT_TRUE(st.ok()) << st.to_string();
  st = c.write(std::vector<float>(128, 1.f), std::vector<float>(32, 1.f), {3, 12});
  EXPECT_EQ(st.message(), "mxfp8_mla_kv_write: slot_mapping[1] = 12 is outside the cache's 12 slots (num_blocks * "
                          "block_size)");
  ops::MlaKvCache wrong = c.cache();
  wrong.kv_lora_rank = 96;
  st = ops::mxfp8_mla_kv_write(TensorView(lat.data(), DType::kF32, {1, 64}), TensorView(rope.data(), DType::kF32, {1, 16}),
                               TensorView(pair.data(), DType::kI32, {1}), wrong);
  EXPECT_EQ(st.message(), "mxfp8_mla_kv_write: kv_lora_rank=96 is not a multiple of 64, which the bf16 rope+fp8_e4m3fn "
                          "latent+E8M0 scale per 64, packed MLA KV cache requires (one scale per tile of 64 latent "
                          "elements)");
  EXPECT_EQ(c.kv.bytes(), before);
}

TEST(Mxfp8MlaKvWrite, is_the_explicit_unsupported_provider_on_ascend910) {
  if (mla_fp8_supported()) GTEST_SKIP() << "the writer is checked above on this target";
  Mxfp8Cache c(448, 64);
  const Status st = c.write(std::vector<float>(448, 1.f), std::vector<float>(64, 1.f), {0});
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(st.message(), "mxfp8_mla_kv_write is not supported on Ascend910 (A2/A3 has no FP8 data path; its KV rows "
                          "are bf16, written by bf16_mla_kv_write, or int8 + fp16 scale, written by int8_mla_kv_write)");
}

}  // namespace
}  // namespace genbridge::testing
