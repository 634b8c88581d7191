// Contract tests for attention/sharedkv_sparse_attention (DeepSeek-V4's window + compressed attention over
// one shared key = value head, with per-head sinks) against the fp64 reference, in every MLA KV
// representation the build's target reads; runs unchanged in every target build.
#include "mla_harness.h"

#include "genbridge/core/threading.h"
#include "support/each_cpu_target.h"

namespace genbridge::testing {
namespace {

struct Shape {
  int64_t L, R, heads;
};

// Window slots [T][W] of `win` and compressed slots [T][C] of `cmp` (-1 padded); sinks [heads] or empty.
struct Lists {
  int64_t T = 0, W = 0, C = 0;
  std::vector<int32_t> window, compressed;
};

std::vector<float> run(const MlaCache& win, const MlaCache& cmp, const Lists& l, const std::vector<float>& q,
                       const Shape& k, float scale, std::vector<float> sinks, Status* st = nullptr) {
  const int64_t T = l.T, D = k.L + k.R;
  // q [T][H][L + R]: the nope and rope parts are strided views of it.
  std::vector<float> qq = q, out(static_cast<size_t>(T * k.heads * D), -7.f);
  std::vector<int32_t> w = l.window, c = l.compressed;
  int32_t dummy = 0;
  const TensorView qn = TensorView::strided(qq.data(), DType::kF32, {T, k.heads, k.L}, {k.heads * D, D, 1});
  const TensorView qr = TensorView::strided(qq.data() + k.L, DType::kF32, {T, k.heads, k.R}, {k.heads * D, D, 1});
  const Status s = ops::sharedkv_sparse_attention(
      qn, qr, win.cache(), TensorView(w.empty() ? &dummy : w.data(), DType::kI32, {T, l.W}), cmp.cache(),
      TensorView(c.empty() ? &dummy : c.data(), DType::kI32, {T, l.C}),
      sinks.empty() ? TensorView() : TensorView(sinks.data(), DType::kF32, {static_cast<int64_t>(sinks.size())}), scale,
      TensorView(out.data(), DType::kF32, {T, k.heads, D}));
  if (st) *st = s;
  EXPECT_TRUE(s.ok() || st) << s.to_string();
  return out;
}

// The reference's rows (latent then rope) of query t's list.
std::vector<double> ref_rows(const MlaCache& win, const MlaCache& cmp, const Lists& l, const Shape& k, int64_t t,
                             int64_t& n) {
  std::vector<double> rows;
  n = 0;
  auto add = [&](const MlaCache& c, int64_t slot) {
    rows.insert(rows.end(), c.ref_latent(slot), c.ref_latent(slot) + k.L);
    rows.insert(rows.end(), c.ref_rope(slot), c.ref_rope(slot) + k.R);
    ++n;
  };
  for (int64_t j = 0; j < l.W; ++j) {
    if (l.window[t * l.W + j] >= 0) add(win, l.window[t * l.W + j]);
  }
  for (int64_t j = 0; j < l.C; ++j) {
    if (l.compressed[t * l.C + j] >= 0) add(cmp, l.compressed[t * l.C + j]);
  }
  return rows;
}

void expect_reference(const MlaCache& win, const MlaCache& cmp, const Lists& l, const std::vector<float>& q,
                      const Shape& k, float scale, const std::vector<float>& sinks, const std::vector<float>& out) {
  const int64_t D = k.L + k.R;
  for (int64_t t = 0; t < l.T; ++t) {
    int64_t n = 0;
    const std::vector<double> rows = ref_rows(win, cmp, l, k, t, n);
    std::vector<double> qt(q.begin() + t * k.heads * D, q.begin() + (t + 1) * k.heads * D), s(sinks.begin(), sinks.end()), want;
    ref::sharedkv_attention(qt, k.heads, D, rows, n, scale, s, want);
    for (int64_t i = 0; i < k.heads * D; ++i) {
      ASSERT_NEAR(out[t * k.heads * D + i], want[i], 3e-5 + 3e-5 * std::fabs(want[i])) << "token " << t << " element " << i;
    }
  }
}

// Fills `slots` of the cache with random rows.
void fill(MlaCache& c, int64_t n, const Shape& k, uint32_t seed) {
  std::vector<int64_t> slots(static_cast<size_t>(n));
  std::iota(slots.begin(), slots.end(), 0);
  ASSERT_TRUE(c.write(random_floats(n * k.L, seed, -2.f, 2.f), random_floats(n * k.R, seed + 1, -2.f, 2.f), slots).ok());
}

// T queries: a window of up to W slots of a 4-block x 16 window cache, C compressed slots of a 3 x 16 cache,
// with -1 entries sprinkled in.
Lists make_lists(int64_t T, int64_t W, int64_t C, uint32_t seed) {
  std::mt19937 rng(seed);
  Lists l{T, W, C, {}, {}};
  for (int64_t i = 0; i < T * W; ++i) l.window.push_back(rng() % 7 == 0 ? -1 : static_cast<int32_t>(rng() % 64));
  for (int64_t i = 0; i < T * C; ++i) l.compressed.push_back(rng() % 5 == 0 ? -1 : static_cast<int32_t>(rng() % 48));
  return l;
}

std::vector<Shape> shapes_for(MlaKvFormat f) {
  if (f == MlaKvFormat::kBf16) return {{448, 64, 10}, {40, 8, 3}};
  if (f == MlaKvFormat::kFp8TileScalePacked) return {{512, 64, 10}, {128, 64, 3}};  // tiles of 128
  return {{448, 64, 10}, {128, 64, 3}};
}

TEST(SharedKvSparseAttention, matches_reference_with_and_without_sinks_every_format) {
  for (MlaKvFormat f : mla_formats()) {
    for (const Shape& k : shapes_for(f)) {
      SCOPED_TRACE(label(f) + " L=" + std::to_string(k.L) + " heads=" + std::to_string(k.heads));
      MlaCache win(f, 4, 16, k.L, k.R), cmp(f, 3, 16, k.L, k.R);
      fill(win, 64, k, 10);
      fill(cmp, 48, k, 20);
      const Lists l = make_lists(5, 37, 11, 3);
      const auto q = random_floats(l.T * k.heads * (k.L + k.R), 30);
      const float scale = 1.f / std::sqrt(static_cast<float>(k.L + k.R));
      expect_reference(win, cmp, l, q, k, scale, {}, run(win, cmp, l, q, k, scale, {}));
      std::vector<float> sinks = random_floats(static_cast<size_t>(k.heads), 40, -2.f, 3.f);
      sinks[0] = 30.f;  // dominates: the output is close to 0, still to the reference's relative accuracy
      expect_reference(win, cmp, l, q, k, scale, sinks, run(win, cmp, l, q, k, scale, sinks));
      // No compressed entries (a sliding-window-only layer): the compressed cache is not read.
      Lists swa = l;
      swa.C = 0;
      swa.compressed.clear();
      expect_reference(win, cmp, swa, q, k, scale, sinks, run(win, cmp, swa, q, k, scale, sinks));
    }
  }
}

TEST(SharedKvSparseAttention, the_list_boundary_does_not_change_the_bits) {
  // The same rows in the same order, split 20 + 10 or 30 + 0 between the two lists (both lists read the
  // same cache), give the same bits.
  const Shape k{128, 64, 9};
  for (MlaKvFormat f : mla_formats()) {
    MlaCache c(f, 4, 16, k.L, k.R);
    fill(c, 64, k, 50);
    Lists a = make_lists(3, 30, 0, 7);
    Lists b{3, 20, 10, {}, {}};
    for (int64_t t = 0; t < 3; ++t) {
      b.window.insert(b.window.end(), a.window.begin() + t * 30, a.window.begin() + t * 30 + 20);
      b.compressed.insert(b.compressed.end(), a.window.begin() + t * 30 + 20, a.window.begin() + (t + 1) * 30);
    }
    const auto q = random_floats(3 * k.heads * (k.L + k.R), 51);
    const std::vector<float> sinks(static_cast<size_t>(k.heads), 0.5f);
    const auto one = run(c, c, a, q, k, 0.07f, sinks), two = run(c, c, b, q, k, 0.07f, sinks);
    EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float))) << label(f);
  }
}

TEST(SharedKvSparseAttention, latent_part_without_sinks_equals_sparse_mla_decode_bitwise) {
  const Shape k{128, 64, 9};
  for (MlaKvFormat f : mla_formats()) {
    MlaCache c(f, 4, 16, k.L, k.R);
    fill(c, 64, k, 60);
    const Lists l = make_lists(4, 25, 0, 9);
    const int64_t D = k.L + k.R;
    auto q = random_floats(l.T * k.heads * D, 61);
    const auto out = run(c, c, l, q, k, 0.09f, {});
    std::vector<float> mla(static_cast<size_t>(l.T * k.heads * k.L));
    std::vector<int32_t> idx = l.window, tables = {0}, ctx = {1}, qsl = {0, static_cast<int32_t>(l.T)};
    // kFlatKvSlots needs no block table entries; one sequence whose context covers its query tokens.
    ctx[0] = static_cast<int32_t>(l.T);
    tables.assign(4, 0);
    const Status st = ops::sparse_mla_decode(
        TensorView::strided(q.data(), DType::kF32, {l.T, k.heads, k.L}, {k.heads * D, D, 1}),
        TensorView::strided(q.data() + k.L, DType::kF32, {l.T, k.heads, k.R}, {k.heads * D, D, 1}),
        c.cache(), TensorView(idx.data(), DType::kI32, {l.T, l.W}), TopkIndexFormat::kFlatKvSlots,
        TensorView(tables.data(), DType::kI32, {1, 4}), TensorView(ctx.data(), DType::kI32, {1}),
        TensorView(qsl.data(), DType::kI32, {2}), 0.09f, TensorView(mla.data(), DType::kF32, {l.T, k.heads, k.L}));
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (int64_t r = 0; r < l.T * k.heads; ++r) {
      ASSERT_EQ(0, std::memcmp(out.data() + r * D, mla.data() + r * k.L, k.L * sizeof(float))) << label(f) << " row " << r;
    }
  }
}

TEST(SharedKvSparseAttention, empty_lists_give_zeros_even_with_sinks) {
  const Shape k{64, 16, 3};
  MlaCache c(MlaKvFormat::kBf16, 2, 16, k.L, k.R);
  fill(c, 32, k, 70);
  Lists l{2, 3, 2, {-1, -1, -1, -1, -1, -1}, {-1, -1, -1, -1}};
  const auto out = run(c, c, l, random_floats(2 * k.heads * 80, 71), k, 0.1f, {1.f, 2.f, 3.f});
  for (float v : out) ASSERT_EQ(v, 0.f);
}

TEST(SharedKvSparseAttention, batch_thread_and_cpu_target_invariant) {
  for (MlaKvFormat f : mla_formats()) {
    const Shape k{f == MlaKvFormat::kFp8TileScalePacked ? 512 : 448, 64, 16};
    MlaCache win(f, 4, 16, k.L, k.R), cmp(f, 3, 16, k.L, k.R);
    fill(win, 64, k, 80);
    fill(cmp, 48, k, 81);
    const Lists l = make_lists(6, 40, 24, 82);
    const auto q = random_floats(l.T * k.heads * (k.L + k.R), 83);
    const std::vector<float> sinks = random_floats(16, 84);
    set_num_threads(1);
    const auto one = run(win, cmp, l, q, k, 0.05f, sinks);
    set_num_threads(3);
    const auto three = run(win, cmp, l, q, k, 0.05f, sinks);
    set_num_threads(0);
    EXPECT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(float))) << label(f);
    // The last query alone gives its rows of the batch's result.
    Lists last{1, l.W, l.C, std::vector<int32_t>(l.window.end() - l.W, l.window.end()),
               std::vector<int32_t>(l.compressed.end() - l.C, l.compressed.end())};
    const int64_t row = k.heads * (k.L + k.R);
    const auto alone = run(win, cmp, last, std::vector<float>(q.end() - row, q.end()), k, 0.05f, sinks);
    EXPECT_EQ(0, std::memcmp(alone.data(), one.data() + 5 * row, row * sizeof(float))) << label(f);
    std::vector<float> first;
    for_each_cpu_target([&](const std::string& target) {
      const auto got = run(win, cmp, l, q, k, 0.05f, sinks);
      if (first.empty()) first = got;
      EXPECT_EQ(0, std::memcmp(got.data(), first.data(), got.size() * sizeof(float))) << label(f) << " " << target;
    });
  }
}

TEST(SharedKvSparseAttention, invalid_arguments_name_op_value_and_rule) {
  const Shape k{64, 16, 2};
  MlaCache win(MlaKvFormat::kBf16, 2, 16, k.L, k.R), cmp(MlaKvFormat::kBf16, 1, 16, k.L, k.R);
  fill(win, 32, k, 90);
  const auto q = random_floats(k.heads * 80, 91);
  Status st;
  Lists l{1, 2, 1, {0, 32}, {3}};
  run(win, cmp, l, q, k, 0.1f, {}, &st);
  EXPECT_EQ(st.message(), "sharedkv_sparse_attention: window_slots[0][1] = 32 is not a slot of window_cache: flat slots "
                          "must be in [0, 32) (num_blocks * block_size) or -1 for padding");
  l = {1, 2, 1, {0, 1}, {16}};
  run(win, cmp, l, q, k, 0.1f, {}, &st);
  EXPECT_EQ(st.message(), "sharedkv_sparse_attention: compressed_slots[0][0] = 16 is not a slot of compressed_cache: "
                          "flat slots must be in [0, 16) (num_blocks * block_size) or -1 for padding");
  l = {1, 2, 1, {0, 1}, {-2}};
  run(win, cmp, l, q, k, 0.1f, {}, &st);
  EXPECT_EQ(st.message(), "sharedkv_sparse_attention: compressed_slots[0][0] = -2 is not a slot of compressed_cache: "
                          "flat slots must be in [0, 16) (num_blocks * block_size) or -1 for padding");
  l = {1, 2, 1, {0, 1}, {2}};
  run(win, cmp, l, q, k, 0.1f, {1.f, NAN}, &st);
  EXPECT_EQ(st.message(), "sharedkv_sparse_attention: sinks[1] is nan but must be finite");
  run(win, cmp, l, q, k, 0.1f, {1.f, 2.f, 3.f}, &st);
  EXPECT_EQ(st.message(), "sharedkv_sparse_attention: sinks has dtype fp32 and shape [3] but must be contiguous fp32 [2] "
                          "(num_heads)");
  run(win, cmp, l, q, k, -1.f, {}, &st);
  EXPECT_EQ(st.message(), "sharedkv_sparse_attention: softmax_scale is -1 but must be finite and > 0");
  MlaCache narrow(MlaKvFormat::kBf16, 1, 16, 32, k.R);
  run(win, narrow, l, q, k, 0.1f, {}, &st);
  EXPECT_EQ(st.message(), "sharedkv_sparse_attention: compressed_cache holds rows of 32 + 16 but window_cache rows of "
                          "64 + 16 (kv_lora_rank + rope_dim); they must agree");
}

TEST(SharedKvSparseAttention, mxfp8_cache_is_the_explicit_unsupported_case_on_ascend910) {
  if (mla_fp8_supported()) GTEST_SKIP() << "mxfp8 rows are read above on this target";
  OwnedTensor kv(DType::kU8, {2, 16, 640}), q(DType::kF32, {1, 1, 512}), out(DType::kF32, {1, 1, 512});
  ops::MlaKvCache c{MlaKvFormat::kMxfp8RopeFirstPacked, 448, 64, kv.view(), {}, {}};
  std::vector<int32_t> slots = {0};
  float* qd = static_cast<float*>(q.data());
  const Status st = ops::sharedkv_sparse_attention(
      TensorView::strided(qd, DType::kF32, {1, 1, 448}, {512, 512, 1}),
      TensorView::strided(qd + 448, DType::kF32, {1, 1, 64}, {512, 512, 1}), c, TensorView(slots.data(), DType::kI32, {1, 1}), c,
      TensorView(slots.data(), DType::kI32, {1, 0}), TensorView(), 0.1f, out.view());
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(st.message(), "sharedkv_sparse_attention: the MXFP8 (E8M0 per 64) KV cache is not supported on Ascend910 "
                          "(A2/A3 has no FP8 data path; its KV rows are bf16 or int8 + fp16 scale)");
}

}  // namespace
}  // namespace genbridge::testing
