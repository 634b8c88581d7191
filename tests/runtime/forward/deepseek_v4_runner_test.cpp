// The engine's DeepSeek-V4 path (ModelRunner with V4Attention: the sliding-window ring in the state slot,
// compressed entries in the pages, the compressors' unfinished windows in the state slot, the indexer over
// compressed keys, hyper-connections, sqrt-softplus and hash routing, the SwiGLU clamp) in every target build:
//   - the state is exact: any split of a sequence into forwards (whole prompt, token by token, chunks of 3,
//     7, 128 and 129 tokens) gives the same logits bits, and so does batching it with other sequences;
//   - against the independent fp64 forward in tests/support (teacher-forced on the same tokens), with its
//     discrete choices (experts, indexer entries) compared where the reference's margin is clear.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/device_operator.h"
#include "runtime/forward/runner.h"
#include "support/deepseek_v4_reference_forward.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

const Checkpoint& checkpoint(const std::string& preset) {
  static genbridge::testing::TempDir dir;
  static std::map<std::string, std::unique_ptr<Checkpoint>> cache;
  auto& slot = cache[preset];
  if (!slot) {
    EXPECT_TRUE(write_synthetic_checkpoint(preset, 11, dir / preset).ok());
    slot = std::make_unique<Checkpoint>(std::move(Checkpoint::open(dir / preset)).value());
  }
  return *slot;
}

std::vector<int32_t> tokens(int64_t n, int64_t vocab, uint64_t salt = 12345u) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 2654435761u + salt) % static_cast<uint64_t>(vocab));
  return t;
}

double rel_l2(std::span<const float> got, std::span<const double> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// What one run recorded per position (where a forward ended): logits, and per layer the routed experts and the
// indexer's entries.
struct RunResult {
  std::vector<std::vector<float>> logits;                  // [position][vocab]; empty where not produced
  std::vector<std::vector<std::vector<int32_t>>> experts;  // [layer][position]
  std::vector<std::vector<std::vector<int32_t>>> entries;  // [layer][position], increasing
};

// Runs the sequences `seqs` through one runner, all in the same forwards: sequence i is fed in chunks of
// chunks[i % chunks.size()] tokens (a chunk that would cross the end is cut). Records every forward's last
// position of every sequence. kv: the kv_cache_dtype.
std::vector<RunResult> run(const Checkpoint& ck, const std::vector<std::vector<int32_t>>& seqs,
                           const std::vector<int64_t>& chunks, const std::string& kv = "auto") {
  const ModelConfig& c = ck.config();
  const int64_t V = c.vocab_size, L = c.num_hidden_layers, S = static_cast<int64_t>(seqs.size());
  std::vector<RunResult> res(static_cast<size_t>(S));
  auto dev = runtime::DeviceOperator::create({.kv_cache_dtype = kv});
  EXPECT_TRUE(dev.ok()) << dev.status().to_string();
  int64_t pages = 0, max_chunk = 1;
  for (const auto& s : seqs) pages += static_cast<int64_t>(s.size()) / 128 + 1;
  for (int64_t ch : chunks) max_chunk = std::max(max_chunk, ch);
  auto pool = runtime::KvPagePool::create(dev->kv_page_geometry(kv_model_shape(c)), pages, S);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  auto runner = ModelRunner::create(ck, *dev, *pool);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  if (!runner.ok()) return res;
  ForwardBatch batch = (*runner)->make_batch(max_chunk * S, S);
  // The choices of the last forward, by (sequence, position, layer).
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::pair<std::vector<int32_t>, std::vector<int32_t>>> choices;
  const ChoiceSink sink = [&](const TokenChoices& t) {
    choices[{t.seq_index, t.position, t.layer}] = {
        std::vector<int32_t>(t.expert_ids.begin(), t.expert_ids.end()),
        std::vector<int32_t>(t.index_positions.begin(), t.index_positions.end())};
  };
  batch.set_choice_sink(&sink);
  for (int64_t i = 0; i < S; ++i) {
    res[i].logits.resize(seqs[i].size());
    res[i].experts.assign(static_cast<size_t>(L), std::vector<std::vector<int32_t>>(seqs[i].size()));
    res[i].entries.assign(static_cast<size_t>(L), std::vector<std::vector<int32_t>>(seqs[i].size()));
  }
  std::vector<int64_t> done(static_cast<size_t>(S), 0);
  std::vector<float> logits;
  for (;;) {
    std::vector<int32_t> toks, q_lens;
    std::vector<runtime::SeqId> ids;
    std::vector<int64_t> which;
    for (int64_t i = 0; i < S; ++i) {
      const int64_t n = static_cast<int64_t>(seqs[i].size());
      if (done[i] >= n) continue;
      const int64_t q = std::min(chunks[i % chunks.size()], n - done[i]);
      const Status st = done[i] == 0 ? pool->admit(i, q, n) : pool->append(i, q);
      EXPECT_TRUE(st.ok()) << st.to_string();
      toks.insert(toks.end(), seqs[i].begin() + done[i], seqs[i].begin() + done[i] + q);
      q_lens.push_back(static_cast<int32_t>(q));
      ids.push_back(i);
      which.push_back(i);
    }
    if (ids.empty()) break;
    logits.assign(ids.size() * V, 0.0f);
    choices.clear();
    const Status st = (*runner)->forward(batch, {toks, ids, q_lens}, logits);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return res;
    for (size_t j = 0; j < which.size(); ++j) {
      const int64_t i = which[j];
      done[i] += q_lens[j];
      res[i].logits[done[i] - 1].assign(logits.begin() + j * V, logits.begin() + (j + 1) * V);
    }
    for (const auto& [key, val] : choices) {
      const auto [seq_index, pos, layer] = key;
      const int64_t i = which[seq_index];
      res[i].experts[layer][pos] = val.first;
      res[i].entries[layer][pos] = val.second;
    }
  }
  for (int64_t i = 0; i < S; ++i) EXPECT_TRUE(pool->release(i).ok());
  return res;
}

// Positions where both runs produced logits must agree bit for bit, and the choices everywhere.
void expect_same_bits(const RunResult& a, const RunResult& b, const std::string& what) {
  int64_t common = 0;
  for (size_t p = 0; p < a.logits.size(); ++p) {
    if (a.logits[p].empty() || b.logits[p].empty()) continue;
    ++common;
    ASSERT_EQ(a.logits[p], b.logits[p]) << what << ": position " << p;
  }
  EXPECT_GT(common, 0) << what;
  EXPECT_EQ(a.experts, b.experts) << what;
  EXPECT_EQ(a.entries, b.entries) << what;
}

// 700 tokens: five ratio-128 windows, 175 ratio-4 windows (past index_topk), five sliding windows.
constexpr int64_t kTokens = 700;

TEST(DeepseekV4Runner, any_split_into_forwards_gives_the_same_bits) {
  const Checkpoint& ck = checkpoint("tiny-dsv4");
  const std::vector<int32_t> seq = tokens(kTokens, ck.config().vocab_size);
  const RunResult one_by_one = run(ck, {seq}, {1})[0];
  for (int64_t chunk : {int64_t{3}, int64_t{7}, int64_t{128}, int64_t{129}, kTokens}) {
    expect_same_bits(run(ck, {seq}, {chunk})[0], one_by_one, "chunks of " + std::to_string(chunk));
  }
}

TEST(DeepseekV4Runner, a_sequence_batched_with_others_gives_the_bits_it_gives_alone) {
  const Checkpoint& ck = checkpoint("tiny-dsv4");
  const int64_t V = ck.config().vocab_size;
  const std::vector<std::vector<int32_t>> seqs = {tokens(300, V, 1), tokens(kTokens, V, 2), tokens(131, V, 3)};
  // Chunks differ per sequence, so each forward mixes prefill chunks and decodes of different lengths.
  const std::vector<RunResult> together = run(ck, seqs, {5, 64, 1});
  for (size_t i = 0; i < seqs.size(); ++i) {
    expect_same_bits(together[i], run(ck, {seqs[i]}, {17})[0], "sequence " + std::to_string(i));
  }
}

struct Accuracy {
  double median = 0, worst = 0;  // logits against the reference following the engine's choices
  double free_median = 0;        // against the reference's own choices
  int64_t steps = 0;
  int64_t experts_clear = 0, experts_differ = 0, entries_clear = 0, entries_differ = 0;
  int64_t first_layer_entries_clear = 0, first_layer_entries_differ = 0;  // the first ratio-4 layer: exact inputs
};

// The engine (one token per forward: every position's logits; any other split gives the same bits, above)
// against the fp64 reference. The discrete choices (experts, indexer entries) are compared with the reference's
// own where its margin is clear; the logits with the reference following the engine's choices, so that a near-tie
// the bf16 activations flip (the synthetic model has many: research notes, docs/deepseek.md) is not mistaken for
// a kernel error, and against its own choices too (free_median: the flips included).
Accuracy accuracy(const Checkpoint& ck, const std::string& kv) {
  const ModelConfig& c = ck.config();
  const int64_t L = c.num_hidden_layers;
  const std::vector<int32_t> seq = tokens(kTokens, c.vocab_size);
  const RunResult dec = run(ck, {seq}, {1}, kv)[0];
  const genbridge::testing::DeepseekV4Reference own =
      genbridge::testing::deepseek_v4_reference_forward(c, ck.weights(), seq);
  genbridge::testing::DeepseekV4Choices engine;
  engine.experts.resize(L);
  engine.index_selected.resize(L);
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t p = 0; p < kTokens; ++p) {
      engine.experts[l].emplace_back(dec.experts[l][p].begin(), dec.experts[l][p].end());
      engine.index_selected[l].emplace_back(dec.entries[l][p].begin(), dec.entries[l][p].end());
    }
  }
  const genbridge::testing::DeepseekV4Reference ref =
      genbridge::testing::deepseek_v4_reference_forward(c, ck.weights(), seq, &engine);
  int64_t first_sparse = -1;
  for (int64_t l = 0; l < L && first_sparse < 0; ++l) {
    if (c.dsv4.compress_ratio(l) == 4) first_sparse = l;
  }
  Accuracy a;
  std::vector<double> errors, free_errors;
  for (int64_t p = 0; p < kTokens; ++p) {
    const double err = rel_l2(dec.logits[p], ref.logits_at(p));
    errors.push_back(err);
    free_errors.push_back(rel_l2(dec.logits[p], own.logits_at(p)));
    a.worst = std::max(a.worst, err);
    for (int64_t l = 0; l < L; ++l) {
      // Experts: compared (as sets) where the reference's margin is clear of bf16's effect on the scores (~1e-2).
      if (own.expert_margin[l][p] > 0.02) {
        ++a.experts_clear;
        std::vector<int64_t> want = own.experts[l][p], have(dec.experts[l][p].begin(), dec.experts[l][p].end());
        std::sort(want.begin(), want.end());
        std::sort(have.begin(), have.end());
        a.experts_differ += want != have;
      }
      if (!own.index_selected[l].empty() && own.index_margin[l][p] > 0.05) {
        const bool differ =
            own.index_selected[l][p] != std::vector<int64_t>(dec.entries[l][p].begin(), dec.entries[l][p].end());
        ++a.entries_clear;
        a.entries_differ += differ;
        if (l == first_sparse) {
          ++a.first_layer_entries_clear;
          a.first_layer_entries_differ += differ;
        }
      }
    }
  }
  a.steps = static_cast<int64_t>(errors.size());
  std::sort(errors.begin(), errors.end());
  std::sort(free_errors.begin(), free_errors.end());
  a.median = errors[errors.size() / 2];
  a.free_median = free_errors[free_errors.size() / 2];
  std::printf(
      "tiny-dsv4 kv=%s: %lld positions, median relative L2 logit error vs fp64 following the engine's choices %.5f "
      "(worst %.5f), with the reference's own choices %.5f; experts differ at %lld of %lld clear (layer, position) "
      "pairs, indexer entries at %lld of %lld (first ratio-4 layer: %lld of %lld)\n",
      kv.c_str(), static_cast<long long>(a.steps), a.median, a.worst, a.free_median,
      static_cast<long long>(a.experts_differ), static_cast<long long>(a.experts_clear),
      static_cast<long long>(a.entries_differ), static_cast<long long>(a.entries_clear),
      static_cast<long long>(a.first_layer_entries_differ), static_cast<long long>(a.first_layer_entries_clear));
  return a;
}

// Measured (both generations compute the same bits with bf16 rows): following the engine's choices median
// 0.62%, worst 1.2%; with the reference's own choices median 1.39%; experts differ at 9 of 2657 clear (layer,
// position) pairs, indexer entries at 13 of 352 clear ones, none in the first ratio-4 layer. A wiring error
// (a wrong rope, window, visibility or stride) gives errors of order 1 and wrong choices everywhere.
TEST(DeepseekV4Runner, matches_the_fp64_reference_bf16_kv) {
  const Accuracy a = accuracy(checkpoint("tiny-dsv4"), "auto");
  EXPECT_LE(a.median, 1e-2);
  EXPECT_LE(a.worst, 3e-2);
  EXPECT_LE(a.free_median, 2.5e-2);
  EXPECT_GT(a.experts_clear, 2000);
  EXPECT_LE(100 * a.experts_differ, a.experts_clear);
  EXPECT_GT(a.entries_clear, 300);
  EXPECT_LE(10 * a.entries_differ, a.entries_clear);
  EXPECT_GT(a.first_layer_entries_clear, 150);
  EXPECT_EQ(a.first_layer_entries_differ, 0);
}

}  // namespace
}  // namespace genbridge::model
