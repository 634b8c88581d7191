// Contract tests for attention/lightning_indexer against the fp64 reference, for every indexer key
// representation the build's target has; runs unchanged in every target build.
#include "mla_harness.h"

#include "genbridge/core/threading.h"
#include "support/each_cpu_target.h"

namespace genbridge::testing {
namespace {

struct IndexerRun {
  std::vector<int32_t> idx;
  std::vector<float> scores;
  Status st;
};

IndexerRun run_indexer(IndexerCache& cache, PagedBatch& b, const std::vector<float>& q, const std::vector<float>& w,
                int64_t heads, int64_t D, int64_t topk, TopkIndexFormat f) {
  const int64_t T = b.num_tokens();
  IndexerRun r;
  r.idx.assign(static_cast<size_t>(T * topk), -9);
  r.scores.assign(static_cast<size_t>(T * topk), -9.f);
  std::vector<float> qq = q, ww = w;
  r.st = ops::lightning_indexer(TensorView(qq.data(), DType::kF32, {T, heads, D}),
                                TensorView(ww.data(), DType::kF32, {T, heads}), cache.cache(), b.block_tables(),
                                b.context_lens(), b.query_start_loc(), f,
                                TensorView(r.idx.data(), DType::kI32, {T, topk}),
                                TensorView(r.scores.data(), DType::kF32, {T, topk}));
  return r;
}

void fill_keys(IndexerCache& cache, const PagedBatch& b, int64_t D, uint32_t seed) {
  for (int64_t s = 0; s < b.num_seqs(); ++s) {
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < b.ctx[s]; ++p) slots.push_back(b.slot(s, p));
    ASSERT_TRUE(cache.write(random_floats(slots.size() * D, seed + 3 * s, -1.f, 1.f), slots).ok());
  }
}

// Scores within tolerance of the fp64 reference; the selected set equals the reference's top-k except
// where the reference's scores tie within the tolerance at the k-th place (the documented near-ties).
TEST(LightningIndexer, matches_reference_scores_and_topk) {
  const int64_t D = 64, heads = 4, bs = 16;
  for (IndexerKeyFormat f : indexer_formats()) {
    for (int64_t topk : {8, 64}) {
      SCOPED_TRACE(label(f) + " topk=" + std::to_string(topk));
      IndexerCache cache(f, 16, bs, D);
      PagedBatch b({150, 9, 40}, {1, 2, 3}, bs, 16, 3);
      fill_keys(cache, b, D, 10);
      const auto q = random_floats(b.num_tokens() * heads * D, 20), w = random_floats(b.num_tokens() * heads, 21, 0.f, 1.f);
      const IndexerRun r = run_indexer(cache, b, q, w, heads, D, topk, TopkIndexFormat::kSequencePositions);
      ASSERT_TRUE(r.st.ok()) << r.st.to_string();
      for (int64_t t = 0; t < b.num_tokens(); ++t) {
        const auto [s, pos] = b.query(t);
        std::vector<double> keys;
        for (int64_t p = 0; p <= pos; ++p) keys.insert(keys.end(), cache.ref_key(b.slot(s, p)), cache.ref_key(b.slot(s, p)) + D);
        const std::vector<double> qt(q.begin() + t * heads * D, q.begin() + (t + 1) * heads * D);
        const std::vector<double> wt(w.begin() + t * heads, w.begin() + (t + 1) * heads);
        const std::vector<double> ref = ref::indexer_scores(qt, wt, heads, D, keys, pos + 1);
        const std::vector<int64_t> want = ref::topk_positions(ref, topk);
        const double tol = 1e-5 * (1 + *std::max_element(ref.begin(), ref.end()));
        std::vector<int64_t> got;
        for (int64_t j = 0; j < topk; ++j) {
          const int32_t v = r.idx[t * topk + j];
          if (j < static_cast<int64_t>(want.size())) {
            ASSERT_GE(v, 0);
            got.push_back(v);
            EXPECT_NEAR(r.scores[t * topk + j], ref[v], tol);
            if (j > 0) EXPECT_LT(got[j - 1], v) << "positions in increasing order";
          } else {
            EXPECT_EQ(v, -1);
            EXPECT_EQ(r.scores[t * topk + j], 0.f);
          }
        }
        if (got == want) continue;
        // Near-ties only: the k-th best reference score and every differing position's score agree within tol.
        std::vector<double> sorted = ref;
        std::sort(sorted.rbegin(), sorted.rend());
        const double kth = sorted[static_cast<size_t>(topk - 1)];
        for (int64_t p : got) {
          if (!std::binary_search(want.begin(), want.end(), p)) EXPECT_NEAR(ref[p], kth, 2 * tol) << "position " << p;
        }
      }
    }
  }
}

TEST(LightningIndexer, ties_go_to_the_lower_position_and_short_contexts_select_everything) {
  const int64_t D = 16, heads = 2, bs = 16, topk = 5;
  IndexerCache cache(IndexerKeyFormat::kBf16, 4, bs, D);
  PagedBatch b({12, 3}, {1, 1}, bs, 4, 5);
  for (int64_t s = 0; s < b.num_seqs(); ++s) {
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < b.ctx[s]; ++p) slots.push_back(b.slot(s, p));
    ASSERT_TRUE(cache.write(std::vector<float>(slots.size() * D, 0.5f), slots).ok());  // identical keys
  }
  const IndexerRun r = run_indexer(cache, b, std::vector<float>(2 * heads * D, 1.f), std::vector<float>(2 * heads, 1.f), heads,
                            D, topk, TopkIndexFormat::kSequencePositions);
  ASSERT_TRUE(r.st.ok()) << r.st.to_string();
  EXPECT_EQ(std::vector<int32_t>(r.idx.begin(), r.idx.begin() + 5), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(r.idx.begin() + 5, r.idx.end()), (std::vector<int32_t>{0, 1, 2, -1, -1}));
  EXPECT_EQ(r.scores[0], 16.f);  // 2 heads x (16 x 0.5)
}

TEST(LightningIndexer, flat_slot_contract_names_the_same_tokens) {
  const int64_t D = 32, heads = 3, bs = 16, topk = 10;
  for (IndexerKeyFormat f : indexer_formats()) {
    IndexerCache cache(f, 8, bs, D);
    PagedBatch b({70, 20}, {1, 2}, bs, 8, 8);
    fill_keys(cache, b, D, 30);
    const auto q = random_floats(b.num_tokens() * heads * D, 31), w = random_floats(b.num_tokens() * heads, 32);
    const IndexerRun pos = run_indexer(cache, b, q, w, heads, D, topk, TopkIndexFormat::kSequencePositions);
    const IndexerRun slot = run_indexer(cache, b, q, w, heads, D, topk, TopkIndexFormat::kFlatKvSlots);
    ASSERT_TRUE(pos.st.ok() && slot.st.ok());
    for (int64_t t = 0; t < b.num_tokens(); ++t) {
      for (int64_t j = 0; j < topk; ++j) {
        const int32_t p = pos.idx[t * topk + j];
        EXPECT_EQ(slot.idx[t * topk + j], p < 0 ? -1 : b.slot(b.query(t).first, p));
      }
    }
    EXPECT_EQ(pos.scores, slot.scores);
  }
}

TEST(LightningIndexer, same_bits_on_every_cpu_target_and_thread_count) {
  const int64_t D = 64, heads = 2, bs = 16, topk = 16;
  for (IndexerKeyFormat f : indexer_formats()) {
    IndexerRun first;
    for_each_cpu_target([&](const std::string&) {
      for (int threads : {1, 3}) {
        set_num_threads(threads);
        IndexerCache cache(f, 400, bs, D);
        PagedBatch b({3000, 1500}, {2, 2}, bs, 400, 12);  // enough work for the top-k to go parallel
        fill_keys(cache, b, D, 40);
        const IndexerRun r = run_indexer(cache, b, random_floats(b.num_tokens() * heads * D, 41),
                                  random_floats(b.num_tokens() * heads, 42), heads, D, topk,
                                  TopkIndexFormat::kSequencePositions);
        ASSERT_TRUE(r.st.ok());
        if (first.idx.empty()) first = r;
        EXPECT_EQ(r.idx, first.idx) << label(f);
        EXPECT_EQ(0, std::memcmp(r.scores.data(), first.scores.data(), r.scores.size() * sizeof(float))) << label(f);
      }
      set_num_threads(0);
    });
  }
}

// A query's selection and scores do not depend on the other queries of the call.
TEST(LightningIndexer, batch_invariant) {
  const int64_t D = 32, heads = 3, bs = 16, topk = 7;
  for (IndexerKeyFormat f : indexer_formats()) {
    IndexerCache cache(f, 12, bs, D);
    PagedBatch b({90, 40}, {1, 3}, bs, 12, 14);
    fill_keys(cache, b, D, 50);
    const auto q = random_floats(b.num_tokens() * heads * D, 51), w = random_floats(b.num_tokens() * heads, 52);
    const IndexerRun all = run_indexer(cache, b, q, w, heads, D, topk, TopkIndexFormat::kSequencePositions);
    PagedBatch first = b;  // the first sequence alone
    first.ctx.resize(1);
    first.q_len.resize(1);
    first.ctx32.resize(1);
    first.qsl.resize(2);
    first.tables.resize(static_cast<size_t>(first.max_blocks));
    const IndexerRun one = run_indexer(cache, first, std::vector<float>(q.begin(), q.begin() + heads * D),
                                       std::vector<float>(w.begin(), w.begin() + heads), heads, D, topk,
                                       TopkIndexFormat::kSequencePositions);
    ASSERT_TRUE(all.st.ok() && one.st.ok());
    EXPECT_EQ(one.idx, std::vector<int32_t>(all.idx.begin(), all.idx.begin() + topk)) << label(f);
    EXPECT_EQ(0, std::memcmp(one.scores.data(), all.scores.data(), topk * sizeof(float))) << label(f);
  }
}

// DeepSeek-V4's indexer scores compressed keys (entry s = window s of 4 tokens) and a query at position p
// sees the entries s < (p + 1) / 4: the op computes that selection when each query token is its own
// sequence of context (p + 1) / 4 over the entries' block table, with V4's two scale factors (64^-1/2 on
// the head weights, 128^-1/2 on the ReLU'd dots; both positive, so both fold into the weights). A query
// with no complete window is not passed (the runner fills its row with -1).
TEST(LightningIndexer, serves_deepseek_v4_compressed_keys_one_sequence_per_query) {
  const int64_t D = 128, heads = 8, bs = 8, entries = 32, topk = 6;
  for (IndexerKeyFormat f : indexer_formats()) {
    SCOPED_TRACE(label(f));
    IndexerCache cache(f, entries / bs, bs, D);
    const std::vector<int32_t> pages = {2, 0, 3, 1};  // the entries' block table, shuffled
    std::vector<int64_t> slots;
    for (int64_t s = 0; s < entries; ++s) slots.push_back(int64_t{pages[s / bs]} * bs + s % bs);
    ASSERT_TRUE(cache.write(random_floats(entries * D, 70, -1.f, 1.f), slots).ok());
    const std::vector<int64_t> positions = {3, 4, 11, 30, 127, 90};  // visible: 1, 1, 3, 7, 32, 22
    const int64_t T = static_cast<int64_t>(positions.size());
    std::vector<int32_t> tables, ctx, qsl = {0};
    for (int64_t p : positions) {
      tables.insert(tables.end(), pages.begin(), pages.end());
      ctx.push_back(static_cast<int32_t>((p + 1) / 4));
      qsl.push_back(qsl.back() + 1);
    }
    const auto q = random_floats(T * heads * D, 71), w = random_floats(T * heads, 72, -1.f, 1.f);
    std::vector<float> folded(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      folded[i] = static_cast<float>(w[i] / std::sqrt(static_cast<double>(heads)) / std::sqrt(static_cast<double>(D)));
    }
    std::vector<int32_t> idx(static_cast<size_t>(T * topk), -9);
    std::vector<float> qq = q;
    const Status st = ops::lightning_indexer(
        TensorView(qq.data(), DType::kF32, {T, heads, D}), TensorView(folded.data(), DType::kF32, {T, heads}),
        cache.cache(), TensorView(tables.data(), DType::kI32, {T, 4}), TensorView(ctx.data(), DType::kI32, {T}),
        TensorView(qsl.data(), DType::kI32, {T + 1}), TopkIndexFormat::kSequencePositions,
        TensorView(idx.data(), DType::kI32, {T, topk}), TensorView());
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (int64_t t = 0; t < T; ++t) {
      const int64_t visible = (positions[t] + 1) / 4;
      // V4's formula in fp64: sum_h (w_h 64^-1/2) ReLU(q_h . K_s) 128^-1/2 over s < visible.
      std::vector<double> scores(static_cast<size_t>(visible), 0.0);
      for (int64_t s = 0; s < visible; ++s) {
        for (int64_t h = 0; h < heads; ++h) {
          double dot = 0;
          for (int64_t i = 0; i < D; ++i) dot += double{q[(t * heads + h) * D + i]} * cache.ref_key(slots[s])[i];
          scores[s] += double{w[t * heads + h]} / std::sqrt(double(heads)) * std::max(dot, 0.0) / std::sqrt(double(D));
        }
      }
      std::vector<int64_t> want = ref::topk_positions(scores, std::min(topk, visible));
      want.resize(static_cast<size_t>(topk), -1);
      for (int64_t j = 0; j < topk; ++j) EXPECT_EQ(idx[t * topk + j], want[j]) << "query " << t << " pick " << j;
    }
  }
}

TEST(LightningIndexer, invalid_arguments_and_unsupported_keys) {
  const int64_t D = 32, heads = 2, bs = 16;
  IndexerCache cache(IndexerKeyFormat::kBf16, 2, bs, D);
  PagedBatch b({5}, {1}, bs, 2, 1);
  std::vector<float> q(heads * D, 1.f), w(heads + 1, 1.f);
  std::vector<int32_t> idx(4, 0);
  Status st = ops::lightning_indexer(TensorView(q.data(), DType::kF32, {1, heads, D}),
                                     TensorView(w.data(), DType::kF32, {1, heads + 1}), cache.cache(), b.block_tables(),
                                     b.context_lens(), b.query_start_loc(), TopkIndexFormat::kSequencePositions,
                                     TensorView(idx.data(), DType::kI32, {1, 4}), TensorView());
  EXPECT_EQ(st.message(), "lightning_indexer: weights has shape [1, 3] but must be [1, 2] ([num_query_tokens, "
                          "index_n_heads])");
  if (mla_fp8_supported()) return;
  OwnedTensor keys(DType::kU8, {2, 16, D + 4});
  ops::IndexerKeyCache fp8{IndexerKeyFormat::kFp8HadamardPackedScale, D, keys.view()};
  st = ops::lightning_indexer(TensorView(q.data(), DType::kF32, {1, heads, D}),
                              TensorView(w.data(), DType::kF32, {1, heads}), fp8, b.block_tables(), b.context_lens(),
                              b.query_start_loc(), TopkIndexFormat::kSequencePositions,
                              TensorView(idx.data(), DType::kI32, {1, 4}), TensorView());
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(st.message(), "lightning_indexer: fp8 indexer keys are not supported on Ascend910 (A2/A3 has no FP8 data "
                          "path; its indexer keys are bf16)");
}

}  // namespace
}  // namespace genbridge::testing
