// Contract tests for the MLA and indexer KV writers (kv_cache/{bf16,int8,fp8}_mla_kv_write,
// kv_cache/{bf16,fp8}_indexer_key_write) against the fp64 reference's quantization; runs unchanged in
// every target build. On Ascend910 the fp8 writers are the explicit unsupported providers.
#include "../attention/mla_harness.h"

#include "genbridge/core/formats.h"
#include "support/each_cpu_target.h"

namespace genbridge::testing {
namespace {

constexpr int64_t kL = 256, kR = 32, kBs = 16, kBlocks = 4;

// Every stored element, read back exactly through the scalar codecs, equals the reference's.
TEST(MlaKvWrite, stored_rows_match_the_reference_every_format) {
  for (MlaKvFormat f : mla_formats()) {
    SCOPED_TRACE(label(f));
    MlaCache cache(f, kBlocks, kBs, kL, kR);
    const std::vector<int64_t> slots = {5, 17, 63, 0, 40};
    auto lat = random_floats(slots.size() * kL, 1, -3.f, 3.f);
    lat[3 * kL + 7] = 0.f;
    for (int64_t i = 0; i < kL; ++i) lat[4 * kL + i] = 0.f;  // an all-zero latent: finite scale, zero codes
    const auto rope = random_floats(slots.size() * kR, 2);
    ASSERT_TRUE(cache.write(lat, rope, slots).ok());
    const ops::MlaKvCache c = cache.cache();
    const ops::KvRowBytes rb = ops::mla_kv_row_bytes(f, kL, kR);
    for (size_t t = 0; t < slots.size(); ++t) {
      const int64_t s = slots[t];
      const uint8_t* row = static_cast<const uint8_t*>(c.kv_cache.data()) + s * rb.main;
      for (int64_t i = 0; i < kL; ++i) {
        double got = 0;
        if (f == MlaKvFormat::kBf16) {
          got = bf16_to_float(reinterpret_cast<const bf16_t*>(row)[i]);
        } else if (f == MlaKvFormat::kInt8Fp16ScaleSplitRope) {
          got = double{reinterpret_cast<const int8_t*>(row)[i]} * fp16_to_float(c.scale_cache.data_as<fp16_t>()[s]);
        } else if (f == MlaKvFormat::kFp8TileScalePacked) {
          float scale;
          std::memcpy(&scale, row + kL + 4 * (i / 128), 4);
          got = double{fp8_e4m3fn_to_float(fp8_e4m3fn_t{row[i]})} * scale;
        } else {  // rope first, then the codes, then one E8M0 byte per 64
          const uint8_t* codes = row + 2 * kR;
          got = double{fp8_e4m3fn_to_float(fp8_e4m3fn_t{codes[i]})} *
                double{e8m0_to_float(e8m0_t{codes[kL + i / 64]})};
        }
        ASSERT_EQ(got, cache.ref_latent(s)[i]) << "slot " << s << " element " << i;
      }
      const bf16_t* rope_row = f == MlaKvFormat::kInt8Fp16ScaleSplitRope ? c.rope_cache.data_as<bf16_t>() + s * kR
                               : f == MlaKvFormat::kMxfp8RopeFirstPacked
                                   ? reinterpret_cast<const bf16_t*>(row)
                                   : reinterpret_cast<const bf16_t*>(row + rb.main - 2 * kR);
      for (int64_t i = 0; i < kR; ++i) ASSERT_EQ(double{bf16_to_float(rope_row[i])}, cache.ref_rope(s)[i]);
    }
  }
}

TEST(MlaKvWrite, bytes_per_token_of_each_cache) {
  for (MlaKvFormat f : mla_formats()) {
    MlaCache cache(f, 2, 16, 512, 64);
    const ops::MlaKvCache c = cache.cache();
    const int64_t main = c.kv_cache.dim(2) * static_cast<int64_t>(dtype_size(c.kv_cache.dtype()));
    int64_t total = main;
    if (f == MlaKvFormat::kInt8Fp16ScaleSplitRope) total += 2 + c.rope_cache.dim(2) * 2;
    // mxfp8: 128 rope + 512 codes + 8 scale bytes = 648, padded to 768.
    EXPECT_EQ(total, f == MlaKvFormat::kBf16                    ? 1152
                     : f == MlaKvFormat::kInt8Fp16ScaleSplitRope ? 642
                     : f == MlaKvFormat::kFp8TileScalePacked     ? 656
                                                                 : 768)
        << label(f);
    const std::vector<int64_t> slots = {3};
    ASSERT_TRUE(cache.write(random_floats(512, 3), random_floats(64, 4), slots).ok()) << label(f);
  }
}

TEST(MlaKvWrite, repeated_slot_keeps_the_last_token_and_nothing_else_changes) {
  for (MlaKvFormat f : mla_formats()) {
    MlaCache a(f, kBlocks, kBs, kL, kR), b(f, kBlocks, kBs, kL, kR);
    const auto lat = random_floats(2 * kL, 5), rope = random_floats(2 * kR, 6);
    ASSERT_TRUE(a.write(lat, rope, {9, 9}).ok());
    ASSERT_TRUE(b.write(std::vector<float>(lat.begin() + kL, lat.end()), std::vector<float>(rope.begin() + kR, rope.end()),
                        {9})
                    .ok());
    EXPECT_EQ(a.all_bytes(), b.all_bytes()) << label(f);
  }
}

TEST(MlaKvWrite, slot_mapping_form_and_bad_arguments) {
  MlaCache cache(MlaKvFormat::kInt8Fp16ScaleSplitRope, kBlocks, kBs, kL, kR);
  auto lat = random_floats(kL, 7), rope = random_floats(kR, 8);
  std::vector<int32_t> flat = {3};
  const auto before = cache.all_bytes();
  const TensorView lv(lat.data(), DType::kF32, {1, kL}), rv(rope.data(), DType::kF32, {1, kR});
  Status st = ops::int8_mla_kv_write(lv, rv, TensorView(flat.data(), DType::kI32, {1}), cache.cache());
  EXPECT_EQ(st.message(),
            "int8_mla_kv_write: slot_mapping has shape [1] but must be [num_tokens, 2] ([block, offset] pairs) with "
            "num_tokens = 1");
  std::vector<int32_t> pair = {kBlocks, 0};
  st = ops::int8_mla_kv_write(lv, rv, TensorView(pair.data(), DType::kI32, {1, 2}), cache.cache());
  EXPECT_EQ(st.message(),
            "int8_mla_kv_write: slot_mapping[0] = [4, 0] is outside the cache: block must be in [0, 4) and offset in "
            "[0, 16)");
  pair = {0, 1};
  const TensorView short_rope(rope.data(), DType::kF32, {1, kR - 1});
  st = ops::int8_mla_kv_write(lv, short_rope, TensorView(pair.data(), DType::kI32, {1, 2}), cache.cache());
  EXPECT_EQ(st.message(), "int8_mla_kv_write: rope has shape [1, 31] but must be [num_tokens = 1, rope_dim = 32]");
  st = ops::bf16_mla_kv_write(lv, rv, TensorView(pair.data(), DType::kI32, {1, 2}), cache.cache());
  EXPECT_EQ(st.message(),
            "bf16_mla_kv_write: the cache is int8 latent+fp16 scale, bf16 rope cache but bf16_mla_kv_write writes bf16 "
            "latent+rope");
  EXPECT_EQ(cache.all_bytes(), before);
}

TEST(MlaKvWrite, fp8_writers_are_the_explicit_unsupported_providers_on_ascend910) {
  if (mla_fp8_supported()) GTEST_SKIP() << "the fp8 writers are checked above on this target";
  OwnedTensor kv(DType::kU8, {2, 16, 656});
  ops::MlaKvCache c;
  c.format = MlaKvFormat::kFp8TileScalePacked;
  c.kv_lora_rank = 512;
  c.rope_dim = 64;
  c.kv_cache = kv.view();
  OwnedTensor lat(DType::kF32, {1, 512}), rope(DType::kF32, {1, 64});
  std::vector<int32_t> slots = {1};
  Status st = ops::fp8_mla_kv_write(lat.view(), rope.view(), TensorView(slots.data(), DType::kI32, {1}), c);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(st.message(),
            "fp8_mla_kv_write is not supported on Ascend910 (A2/A3 has no FP8 data path; its quantized MLA KV cache is "
            "int8 latent + fp16 scale with a separate bf16 rope cache, written by int8_mla_kv_write)");
  OwnedTensor keys(DType::kU8, {2, 16, 132}), key(DType::kF32, {1, 128});
  ops::IndexerKeyCache ic{IndexerKeyFormat::kFp8HadamardPackedScale, 128, keys.view()};
  st = ops::fp8_indexer_key_write(key.view(), TensorView(slots.data(), DType::kI32, {1}), ic);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(st.message(),
            "fp8_indexer_key_write is not supported on Ascend910 (A2/A3 has no FP8 data path; its indexer keys are "
            "bf16, written by bf16_indexer_key_write)");
}

// bf16 keys are exact; fp8 keys are the Hadamard-rotated key, each code within half an fp8 step (plus the
// fp32 rotation's rounding) of the fp64 rotation, with the row's scale from the fp64 reference.
TEST(IndexerKeyWrite, stored_keys_match_the_reference) {
  const int64_t D = 128;
  for (IndexerKeyFormat f : indexer_formats()) {
    SCOPED_TRACE(label(f));
    IndexerCache cache(f, 2, 16, D);
    const std::vector<int64_t> slots = {0, 7, 31};
    const auto keys = random_floats(slots.size() * D, 11, -4.f, 4.f);
    ASSERT_TRUE(cache.write(keys, slots).ok());
    const ops::IndexerKeyCache c = cache.cache();
    for (size_t t = 0; t < slots.size(); ++t) {
      std::vector<double> x(keys.begin() + t * D, keys.begin() + (t + 1) * D);
      if (f == IndexerKeyFormat::kBf16) {
        for (int64_t i = 0; i < D; ++i) {
          ASSERT_EQ(double{bf16_to_float(c.key_cache.data_as<bf16_t>()[slots[t] * D + i])}, bf16_round(x[i]));
        }
        continue;
      }
      const std::vector<double> y = ref::hadamard(x);
      std::vector<double> deq;
      double ref_scale;
      ref::fp8_kv_row(y, ref_scale, deq);
      const uint8_t* row = static_cast<const uint8_t*>(c.key_cache.data()) + slots[t] * (D + 4);
      float scale;
      std::memcpy(&scale, row + D, 4);
      EXPECT_NEAR(scale, ref_scale, 1e-6 * ref_scale);
      for (int64_t i = 0; i < D; ++i) {
        const double got = double{fp8_e4m3fn_to_float(fp8_e4m3fn_t{row[i]})} * scale;
        // One e4m3fn step at |y| is at most |y| / 8 (and 2^-9 * scale among the subnormals).
        EXPECT_NEAR(got, y[i], std::max(std::fabs(y[i]) / 16, std::ldexp(double{scale}, -10)) * 1.001 + 1e-6) << i;
      }
    }
  }
}

TEST(MlaKvWrite, same_bits_on_every_cpu_target) {
  for (MlaKvFormat f : mla_formats()) {
    std::vector<std::byte> first;
    for_each_cpu_target([&](const std::string&) {
      const bool grouped = f == MlaKvFormat::kFp8TileScalePacked || f == MlaKvFormat::kMxfp8RopeFirstPacked;
      const int64_t L = grouped ? 384 : 371;
      MlaCache cache(f, kBlocks, kBs, L, 24);
      const auto lat = random_floats(3 * L, 21, -9.f, 9.f), rope = random_floats(3 * 24, 22);
      ASSERT_TRUE(cache.write(lat, rope, {1, 30, 50}).ok());
      if (first.empty()) first = cache.all_bytes();
      EXPECT_EQ(cache.all_bytes(), first) << label(f);
    });
  }
  for (IndexerKeyFormat f : indexer_formats()) {
    std::vector<std::byte> first;
    for_each_cpu_target([&](const std::string&) {
      IndexerCache cache(f, 2, 16, 64);
      ASSERT_TRUE(cache.write(random_floats(2 * 64, 23, -5.f, 5.f), {3, 20}).ok());
      if (first.empty()) first = cache.bytes();
      EXPECT_EQ(cache.bytes(), first) << label(f);
    });
  }
}

}  // namespace
}  // namespace genbridge::testing
