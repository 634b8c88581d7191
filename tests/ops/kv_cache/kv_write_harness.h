#pragma once
// Shared contract checks for the kv_cache/*_kv_write operators: stored rows bit-exact against the fp64
// reference of the format's definition, untouched rows unchanged, repeated slots, thread-count
// independence, every input dtype and strided inputs. The same file runs unchanged in every target build.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../attention/kv_harness.h"

namespace genbridge::testing {

// Rows with the edges the scale rule must handle, then random rows: all zeros, an amax below the
// tiny clamp, an amax exactly on a power of two, large magnitudes, a single non-zero element.
inline void fill_edge_rows(std::vector<float>& x, int64_t rows, int64_t d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  x.assign(static_cast<size_t>(rows * d), 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * d;
    switch (r % 7) {
      case 0: break;  // all zero
      case 1:
        for (int64_t c = 0; c < d; ++c) row[c] = u(rng) * 1e-9f;  // below both tiny clamps' scale rules
        break;
      case 2:
        for (int64_t c = 0; c < d; ++c) row[c] = u(rng) / 4.f;
        row[d / 3] = -1.0f;  // amax exactly 1
        break;
      case 3:
        for (int64_t c = 0; c < d; ++c) row[c] = u(rng) * 3000.f;
        break;
      case 4: row[d - 1] = 0.37f; break;
      default:
        for (int64_t c = 0; c < d; ++c) row[c] = u(rng);
    }
  }
}

// Writes rows (input dtype `in`, optionally strided) through the format's writer and checks every stored
// byte against the reference, that untouched rows keep their bytes, and that inputs are unmutated.
inline void check_writer(KvCacheFormat f, DType in, bool strided, int64_t d = 128, uint64_t seed = 1) {
  const int64_t heads = 3, bs = 16, blocks = 6, tokens = 23;
  TestCache cache(f, blocks, heads, bs, d);
  // Pre-fill the cache with a pattern so untouched rows are recognisable.
  for (OwnedTensor* t : {&cache.key(), &cache.value(), &cache.key_scales(), &cache.value_scales()}) {
    for (size_t i = 0; i < t->bytes().size(); ++i) t->bytes()[i] = std::byte{static_cast<uint8_t>(0x5a ^ i)};
  }
  const std::vector<std::byte> before = cache.all_bytes();
  std::vector<float> kx, vx;
  fill_edge_rows(kx, tokens * heads, d, seed);
  fill_edge_rows(vx, tokens * heads, d, seed + 100);
  const int64_t pad = strided ? 2 : 1;
  OwnedTensor ks(in, {tokens * heads * d * pad}), vs(in, {tokens * heads * d * pad});
  const TensorView kv = strided ? TensorView::strided(ks.data(), in, {tokens, heads, d}, {heads * d * 2, d * 2, 2})
                                : TensorView(ks.data(), in, {tokens, heads, d});
  const TensorView vv = strided ? TensorView::strided(vs.data(), in, {tokens, heads, d}, {heads * d * 2, d * 2, 2})
                                : TensorView(vs.data(), in, {tokens, heads, d});
  for (int64_t i = 0; i < tokens * heads * d; ++i) {
    set_element(kv, logical_offset(kv, i), kx[i]);
    set_element(vv, logical_offset(vv, i), vx[i]);
  }
  // The exact input values after rounding to the input dtype.
  const std::vector<double> kin = to_doubles(kv), vin = to_doubles(vv);
  const auto k_bytes = ks.bytes(), v_bytes = vs.bytes();
  // Scattered slots across blocks (every third slot, reversed).
  std::vector<int32_t> slots(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) slots[t] = static_cast<int32_t>((blocks * bs - 1) - 3 * t);

  const Status st = cache.write(kv, vv, slots);
  if (f == KvCacheFormat::kFp8Fp32PackedScale && !fp8_supported()) {
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
    EXPECT_EQ(cache.all_bytes(), before);
    return;
  }
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(ks.bytes(), k_bytes) << "key was mutated";
  EXPECT_EQ(vs.bytes(), v_bytes) << "value was mutated";

  int64_t mismatches = 0;
  std::vector<bool> written(static_cast<size_t>(blocks * bs), false);
  for (int64_t t = 0; t < tokens; ++t) {
    written[slots[t]] = true;
    for (int64_t h = 0; h < heads; ++h) {
      for (int is_key = 0; is_key < 2; ++is_key) {
        const std::vector<double>& src = is_key ? kin : vin;
        std::vector<double> row(src.begin() + (t * heads + h) * d, src.begin() + (t * heads + h + 1) * d);
        double scale = 1.0;
        std::vector<double> want = row;
        if (f == KvCacheFormat::kInt8Fp16Scale) ref::int8_kv_row(row, scale, want);
        if (f == KvCacheFormat::kFp8Fp32PackedScale) ref::fp8_kv_row(row, scale, want);
        if (f == KvCacheFormat::kBf16) {
          for (double& w : want) w = bf16_to_float(float_to_bf16(static_cast<float>(w)));
        }
        const double got_scale = cache.stored_scale(is_key, slots[t], h);
        EXPECT_EQ(got_scale, scale) << "token " << t << " head " << h << (is_key ? " key" : " value");
        EXPECT_TRUE(std::isfinite(got_scale) && got_scale > 0);
        for (int64_t c = 0; c < d; ++c) {
          if (cache.stored(is_key, slots[t], h, c) != want[c] && ++mismatches < 5) {
            ADD_FAILURE() << "token " << t << " head " << h << " element " << c << (is_key ? " key" : " value")
                          << ": stored " << cache.stored(is_key, slots[t], h, c) << " want " << want[c]
                          << " (input " << row[c] << ", scale " << scale << ")";
          }
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  // Rows of slots nobody wrote keep their bytes; compare element by element through the accessors.
  TestCache fresh(f, blocks, heads, bs, d);
  for (OwnedTensor* t : {&fresh.key(), &fresh.value(), &fresh.key_scales(), &fresh.value_scales()}) {
    for (size_t i = 0; i < t->bytes().size(); ++i) t->bytes()[i] = std::byte{static_cast<uint8_t>(0x5a ^ i)};
  }
  for (int64_t slot = 0; slot < blocks * bs; ++slot) {
    if (written[slot]) continue;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t c = 0; c < d; c += 7) {
        const double a = cache.stored_code(true, slot, h, c), b = fresh.stored_code(true, slot, h, c);
        ASSERT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << "untouched slot " << slot << " changed";
      }
    }
  }
}

// On a build where `f`'s writer is the explicit unsupported provider: asserts that a write returns
// Unimplemented and leaves the cache untouched, and returns true (the caller stops there).
inline bool unsupported_here(KvCacheFormat f) {
  if (f != KvCacheFormat::kFp8Fp32PackedScale || fp8_supported()) return false;
  TestCache cache(f, 2, 2, 16, 64);
  const auto before = cache.all_bytes();
  OwnedTensor k(DType::kF32, {1, 2, 64}), v(DType::kF32, {1, 2, 64});
  const Status st = cache.write(k.view(), v.view(), {3});
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.to_string();
  EXPECT_EQ(cache.all_bytes(), before);
  return true;
}

// Output bytes of one write with the given thread count.
inline std::vector<std::byte> writer_bits(KvCacheFormat f, int threads) {
  set_num_threads(threads);
  const int64_t heads = 8, d = 128, tokens = 300;
  TestCache cache(f, 4, heads, 128, d);
  OwnedTensor k(DType::kBF16, {tokens, heads, d}), v(DType::kBF16, {tokens, heads, d});
  fill_uniform(k.view(), 1);
  fill_uniform(v.view(), 2);
  std::vector<int32_t> slots(tokens);
  for (int64_t t = 0; t < tokens; ++t) slots[t] = static_cast<int32_t>((t * 5) % 512);
  EXPECT_TRUE(cache.write(k.view(), v.view(), slots).ok());
  set_num_threads(0);
  return cache.all_bytes();
}

// Two tokens aimed at one slot: the later one is what the cache holds.
inline void check_repeated_slot_keeps_last(KvCacheFormat f) {
  TestCache a(f, 2, 2, 16, 64), b(f, 2, 2, 16, 64);
  OwnedTensor k(DType::kF32, {3, 2, 64}), v(DType::kF32, {3, 2, 64});
  fill_uniform(k.view(), 3);
  fill_uniform(v.view(), 4);
  ASSERT_TRUE(a.write(k.view(), v.view(), {7, 9, 7}).ok());
  ASSERT_TRUE(b.write(k.view().slice0(1, 3), v.view().slice0(1, 3), {9, 7}).ok());
  EXPECT_EQ(a.all_bytes(), b.all_bytes());
}

inline void check_empty_write(KvCacheFormat f) {
  TestCache cache(f, 2, 2, 16, 64);
  const auto before = cache.all_bytes();
  OwnedTensor k(DType::kBF16, {0, 2, 64}), v(DType::kBF16, {0, 2, 64});
  EXPECT_TRUE(cache.write(k.view(), v.view(), {}).ok());
  EXPECT_EQ(cache.all_bytes(), before);
}

}  // namespace genbridge::testing

// The contract tests every writer shares (formats the build supports; fp8 on Ascend910 asserts Unimplemented).
#define GB_KV_WRITE_CONTRACT_TESTS(Suite, format)                                                           \
  TEST(Suite, stored_rows_match_reference_for_every_input_dtype) {                                          \
    for (auto in : {::genbridge::DType::kF32, ::genbridge::DType::kF16, ::genbridge::DType::kBF16})         \
      ::genbridge::testing::check_writer(format, in, false);                                                \
  }                                                                                                         \
  TEST(Suite, strided_input) { ::genbridge::testing::check_writer(format, ::genbridge::DType::kBF16, true); } \
  TEST(Suite, every_head_dim_attention_supports) {                                                          \
    for (int64_t d : ::genbridge::ops::kPagedDecodeHeadDims)                                                \
      ::genbridge::testing::check_writer(format, ::genbridge::DType::kBF16, false, d, 40 + d);              \
  }                                                                                                         \
  TEST(Suite, head_dims_not_multiple_of_16) {                                                               \
    ::genbridge::testing::check_writer(format, ::genbridge::DType::kF32, false, 17, 5);                     \
    ::genbridge::testing::check_writer(format, ::genbridge::DType::kF32, false, 1, 6);                      \
  }                                                                                                         \
  TEST(Suite, bit_identical_across_thread_counts) {                                                         \
    if (::genbridge::testing::unsupported_here(format)) return;                                              \
    const auto one = ::genbridge::testing::writer_bits(format, 1);                                          \
    EXPECT_EQ(one, ::genbridge::testing::writer_bits(format, 2));                                           \
    EXPECT_EQ(one, ::genbridge::testing::writer_bits(format, 3));                                           \
  }                                                                                                         \
  TEST(Suite, repeated_slot_keeps_last_token) {                                                             \
    if (::genbridge::testing::unsupported_here(format)) return;                                              \
    ::genbridge::testing::check_repeated_slot_keeps_last(format);                                           \
  }                                                                                                         \
  TEST(Suite, empty_tokens_write_nothing) {                                                                 \
    if (::genbridge::testing::unsupported_here(format)) return;                                              \
    ::genbridge::testing::check_empty_write(format);                                                        \
  }
