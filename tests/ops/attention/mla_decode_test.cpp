// Contract tests for attention/mla_decode and attention/sparse_mla_decode against the fp64 reference, in
// every MLA KV representation the build's target has; runs unchanged in every target build.
#include "mla_harness.h"

#include "genbridge/core/threading.h"
#include "support/each_cpu_target.h"

namespace genbridge::testing {
namespace {

struct Case {
  int64_t L, R, heads;
};

// Runs mla_decode (or sparse over `indices`) on the batch and returns out [tokens][heads][L] as fp32.
std::vector<float> run_dense(MlaCache& cache, PagedBatch& b, const std::vector<float>& ql, const std::vector<float>& qr,
                             const Case& k, float scale, Status* st = nullptr) {
  const int64_t T = b.num_tokens();
  std::vector<float> l = ql, r = qr, out(static_cast<size_t>(T * k.heads * k.L), -7.f);
  const Status s = ops::mla_decode(TensorView(l.data(), DType::kF32, {T, k.heads, k.L}),
                                   TensorView(r.data(), DType::kF32, {T, k.heads, k.R}), cache.cache(), b.block_tables(),
                                   b.context_lens(), b.query_start_loc(), scale,
                                   TensorView(out.data(), DType::kF32, {T, k.heads, k.L}));
  if (st) *st = s;
  EXPECT_TRUE(s.ok() || st) << s.to_string();
  return out;
}
std::vector<float> run_sparse(MlaCache& cache, PagedBatch& b, const std::vector<float>& ql,
                              const std::vector<float>& qr, const Case& k, float scale, std::vector<int32_t> idx,
                              int64_t topk, TopkIndexFormat f, Status* st = nullptr) {
  const int64_t T = b.num_tokens();
  std::vector<float> l = ql, r = qr, out(static_cast<size_t>(T * k.heads * k.L), -7.f);
  const Status s = ops::sparse_mla_decode(
      TensorView(l.data(), DType::kF32, {T, k.heads, k.L}), TensorView(r.data(), DType::kF32, {T, k.heads, k.R}),
      cache.cache(), TensorView(idx.data(), DType::kI32, {T, topk}), f, b.block_tables(), b.context_lens(),
      b.query_start_loc(), scale, TensorView(out.data(), DType::kF32, {T, k.heads, k.L}));
  if (st) *st = s;
  EXPECT_TRUE(s.ok() || st) << s.to_string();
  return out;
}

// out of query t against the reference over the given positions of its sequence.
void expect_reference(const MlaCache& cache, const PagedBatch& b, const std::vector<float>& ql,
                      const std::vector<float>& qr, const Case& k, float scale, const std::vector<float>& out,
                      int64_t t, const std::vector<int64_t>& positions) {
  const auto [s, pos] = b.query(t);
  std::vector<double> q1(ql.begin() + t * k.heads * k.L, ql.begin() + (t + 1) * k.heads * k.L);
  std::vector<double> q2(qr.begin() + t * k.heads * k.R, qr.begin() + (t + 1) * k.heads * k.R);
  std::vector<double> lat, rope, ref_out;
  for (int64_t p : positions) {
    const int64_t slot = b.slot(s, p);
    lat.insert(lat.end(), cache.ref_latent(slot), cache.ref_latent(slot) + k.L);
    rope.insert(rope.end(), cache.ref_rope(slot), cache.ref_rope(slot) + k.R);
  }
  ref::mla_attention(q1, q2, k.heads, k.L, k.R, lat, rope, static_cast<int64_t>(positions.size()), scale, ref_out);
  for (int64_t i = 0; i < k.heads * k.L; ++i) {
    const double want = ref_out[i];
    ASSERT_NEAR(out[t * k.heads * k.L + i], want, 2e-5 + 2e-5 * std::fabs(want)) << "token " << t << " element " << i;
  }
}

std::vector<Case> cases_for(MlaKvFormat f) {
  if (f == MlaKvFormat::kFp8TileScalePacked) return {{128, 16, 20}, {256, 64, 3}};
  if (f == MlaKvFormat::kMxfp8RopeFirstPacked) return {{128, 16, 20}, {448, 64, 3}};
  return {{128, 16, 20}, {40, 8, 3}, {512, 64, 2}};
}

TEST(MlaDecode, matches_reference_decode_and_chunked_prefill_every_format) {
  for (MlaKvFormat f : mla_formats()) {
    for (const Case& k : cases_for(f)) {
      SCOPED_TRACE(label(f) + " L=" + std::to_string(k.L) + " R=" + std::to_string(k.R));
      const int64_t bs = 16;
      MlaCache cache(f, 12, bs, k.L, k.R);
      PagedBatch b({40, 17, 5}, {1, 3, 5}, bs, 12, 7);
      fill_mla(cache, b, k.L, k.R, 100);
      const auto ql = random_floats(b.num_tokens() * k.heads * k.L, 31), qr = random_floats(b.num_tokens() * k.heads * k.R, 32);
      const float scale = 0.3f / std::sqrt(static_cast<float>(k.L));
      const auto out = run_dense(cache, b, ql, qr, k, scale);
      for (int64_t t = 0; t < b.num_tokens(); ++t) {
        std::vector<int64_t> pos(static_cast<size_t>(b.query(t).second + 1));
        std::iota(pos.begin(), pos.end(), 0);
        expect_reference(cache, b, ql, qr, k, scale, out, t, pos);
      }
    }
  }
}

// index_topk >= context with every position listed in order: the same bits as dense, in both index
// contracts; a subset (with -1 padding anywhere) matches the reference over that subset.
TEST(SparseMlaDecode, full_selection_equals_dense_bitwise_and_subsets_match_reference) {
  for (MlaKvFormat f : mla_formats()) {
    const Case k{128, 16, 20};
    SCOPED_TRACE(label(f));
    const int64_t bs = 16, topk = 48;
    MlaCache cache(f, 12, bs, k.L, k.R);
    PagedBatch b({40, 17, 5}, {1, 3, 2}, bs, 12, 9);
    fill_mla(cache, b, k.L, k.R, 200);
    const auto ql = random_floats(b.num_tokens() * k.heads * k.L, 41), qr = random_floats(b.num_tokens() * k.heads * k.R, 42);
    const float scale = 0.05f;
    const auto dense = run_dense(cache, b, ql, qr, k, scale);
    for (TopkIndexFormat fmt : {TopkIndexFormat::kSequencePositions, TopkIndexFormat::kFlatKvSlots}) {
      std::vector<int32_t> idx(static_cast<size_t>(b.num_tokens() * topk), -1);
      for (int64_t t = 0; t < b.num_tokens(); ++t) {
        const auto [s, pos] = b.query(t);
        for (int64_t p = 0; p <= pos; ++p) {
          idx[t * topk + p] =
              static_cast<int32_t>(fmt == TopkIndexFormat::kSequencePositions ? p : b.slot(s, p));
        }
      }
      const auto sparse = run_sparse(cache, b, ql, qr, k, scale, idx, topk, fmt);
      EXPECT_EQ(0, std::memcmp(sparse.data(), dense.data(), dense.size() * sizeof(float)));
    }
    // A random subset per query with -1 entries interleaved.
    std::mt19937 rng(5);
    std::vector<int32_t> idx(static_cast<size_t>(b.num_tokens() * topk), -1);
    for (int64_t t = 0; t < b.num_tokens(); ++t) {
      int64_t j = 0;
      for (int64_t p = b.query(t).second; p >= 0 && j < topk; --p) {  // descending: attended in the given order
        if (rng() % 3 == 0) continue;
        if (rng() % 4 == 0) ++j;  // leaves a -1 hole
        if (j < topk) idx[t * topk + j++] = static_cast<int32_t>(p);
      }
    }
    const auto sparse = run_sparse(cache, b, ql, qr, k, scale, idx, topk, TopkIndexFormat::kSequencePositions);
    for (int64_t t = 0; t < b.num_tokens(); ++t) {
      std::vector<int64_t> pos;
      for (int64_t j = 0; j < topk; ++j) {
        if (idx[t * topk + j] >= 0) pos.push_back(idx[t * topk + j]);
      }
      expect_reference(cache, b, ql, qr, k, scale, sparse, t, pos);
    }
  }
}

TEST(SparseMlaDecode, all_padding_gives_zeros) {
  const Case k{64, 0, 2};
  MlaCache cache(MlaKvFormat::kBf16, 2, 16, k.L, k.R);
  PagedBatch b({3}, {1}, 16, 2, 1);
  fill_mla(cache, b, k.L, k.R, 3);
  std::vector<int32_t> idx(4, -1);
  const auto out = run_sparse(cache, b, random_floats(2 * 64, 1), {}, k, 0.1f, idx, 4,
                              TopkIndexFormat::kSequencePositions);
  for (float v : out) EXPECT_EQ(v, 0.f);
}

TEST(MlaDecode, batch_and_thread_invariant) {
  for (MlaKvFormat f : mla_formats()) {
    const Case k{128, 16, 20};
    MlaCache cache(f, 12, 16, k.L, k.R);
    PagedBatch b({40, 17, 5}, {1, 3, 2}, 16, 12, 11);
    fill_mla(cache, b, k.L, k.R, 300);
    const auto ql = random_floats(b.num_tokens() * k.heads * k.L, 51), qr = random_floats(b.num_tokens() * k.heads * k.R, 52);
    set_num_threads(1);
    const auto one = run_dense(cache, b, ql, qr, k, 0.1f);
    set_num_threads(3);
    const auto three = run_dense(cache, b, ql, qr, k, 0.1f);
    set_num_threads(0);
    EXPECT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(float))) << label(f);
    // The first sequence alone (its query token is row 0): the same bits as in the batch.
    PagedBatch alone = b;
    alone.ctx.resize(1);
    alone.q_len.resize(1);
    alone.ctx32.resize(1);
    alone.qsl.resize(2);
    alone.tables.resize(static_cast<size_t>(alone.max_blocks));
    const std::vector<float> ql1(ql.begin(), ql.begin() + k.heads * k.L), qr1(qr.begin(), qr.begin() + k.heads * k.R);
    const auto single = run_dense(cache, alone, ql1, qr1, k, 0.1f);
    EXPECT_EQ(0, std::memcmp(single.data(), one.data(), single.size() * sizeof(float))) << label(f);
  }
}

TEST(MlaDecode, same_bits_on_every_cpu_target) {
  for (MlaKvFormat f : mla_formats()) {
    const Case k{128, 24, 5};
    std::vector<float> first_dense, first_sparse;
    for_each_cpu_target([&](const std::string&) {
      MlaCache cache(f, 8, 16, k.L, k.R);
      PagedBatch b({33, 6}, {2, 1}, 16, 8, 13);
      fill_mla(cache, b, k.L, k.R, 400);
      const auto ql = random_floats(b.num_tokens() * k.heads * k.L, 61), qr = random_floats(b.num_tokens() * k.heads * k.R, 62);
      const auto dense = run_dense(cache, b, ql, qr, k, 0.2f);
      std::vector<int32_t> idx = {0, 5, -1, 31, 2, 7, -1, 32, 3, 1, 4, -1};
      const auto sparse = run_sparse(cache, b, ql, qr, k, 0.2f, idx, 4, TopkIndexFormat::kSequencePositions);
      if (first_dense.empty()) {
        first_dense = dense;
        first_sparse = sparse;
      }
      EXPECT_EQ(0, std::memcmp(dense.data(), first_dense.data(), dense.size() * sizeof(float))) << label(f);
      EXPECT_EQ(0, std::memcmp(sparse.data(), first_sparse.data(), sparse.size() * sizeof(float))) << label(f);
    });
  }
}

TEST(MlaDecode, invalid_arguments_name_op_value_and_rule) {
  const Case k{64, 16, 2};
  MlaCache cache(MlaKvFormat::kBf16, 4, 16, k.L, k.R);
  PagedBatch b({20}, {1}, 16, 4, 3);
  fill_mla(cache, b, k.L, k.R, 5);
  const auto ql = random_floats(k.heads * k.L, 1), qr = random_floats(k.heads * k.R, 2);
  Status st;
  Case wrong = k;
  wrong.L = 48;
  run_dense(cache, b, random_floats(k.heads * 48, 1), qr, wrong, 0.1f, &st);
  EXPECT_EQ(st.message(), "mla_decode: q_latent has shape [1, 2, 48] but must be [num_query_tokens, num_heads, "
                          "kv_lora_rank = 64]");
  std::vector<int32_t> idx = {20};
  run_sparse(cache, b, ql, qr, k, 0.1f, idx, 1, TopkIndexFormat::kSequencePositions, &st);
  EXPECT_EQ(st.message(), "sparse_mla_decode: topk_indices[0][0] = 20 is not a position the query may see: sequence "
                          "positions must be in [0, 19] (or -1 for padding)");
  idx = {64};
  run_sparse(cache, b, ql, qr, k, 0.1f, idx, 1, TopkIndexFormat::kFlatKvSlots, &st);
  EXPECT_EQ(st.message(), "sparse_mla_decode: topk_indices[0][0] = 64 is not a KV slot: flat slots must be in [0, 64) "
                          "(num_blocks * block_size) or -1 for padding");
  run_dense(cache, b, ql, qr, k, 0.f, &st);
  EXPECT_EQ(st.message(), "mla_decode: softmax_scale is 0 but must be finite and > 0");
}

TEST(MlaDecode, fp8_cache_is_the_explicit_unsupported_case_on_ascend910) {
  if (mla_fp8_supported()) GTEST_SKIP() << "fp8 is read above on this target";
  OwnedTensor kv(DType::kU8, {2, 16, 128 + 4 + 32});
  ops::MlaKvCache c{MlaKvFormat::kFp8TileScalePacked, 128, 16, kv.view(), {}, {}};
  OwnedTensor ql(DType::kF32, {1, 1, 128}), qr(DType::kF32, {1, 1, 16}), out(DType::kF32, {1, 1, 128});
  PagedBatch b({1}, {1}, 16, 2, 1);
  const Status st = ops::mla_decode(ql.view(), qr.view(), c, b.block_tables(), b.context_lens(), b.query_start_loc(),
                                    0.1f, out.view());
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(st.message(), "mla_decode: the fp8 MLA KV cache is not supported on Ascend910 (A2/A3 has no FP8 data "
                          "path; its quantized MLA KV cache is int8 latent + fp16 scale with a separate bf16 rope cache)");
}

}  // namespace
}  // namespace genbridge::testing
