// Contract test for attention/paged_decode; runs unchanged in every target build. Ascend910 has no FP8
// data path: there the fp8 representation is the explicit unsupported provider, asserted exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>

#include "kv_harness.h"

namespace genbridge::testing {
namespace {

constexpr const char* kFp8Unsupported =
    "paged_decode: the fp8_e4m3fn+packed fp32 scale KV cache is not supported on Ascend910 (A2/A3 has no FP8 data "
    "path; its quantized KV cache is int8+fp16 scale)";

double norm(const std::vector<double>& v, size_t b, size_t n) {
  double s = 0;
  for (size_t i = b; i < b + n; ++i) s += v[i] * v[i];
  return std::sqrt(s);
}
double dist(const std::vector<double>& a, size_t ab, const std::vector<double>& r, size_t rb, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += (a[ab + i] - r[rb + i]) * (a[ab + i] - r[rb + i]);
  return std::sqrt(s);
}

// Format-derived bound on ||out - ref|| for one query row (see docs/kv_representations.md):
//   out - ref = sum_j dp_j (v^_j - c) + sum_j p_j dv_j with sum_j |dp_j| <= e^{2 delta} - 1, where
//   delta = scale * max_j sum_e |q_e| |dk_je| bounds every score change and c is the mean of the stored v^_j;
//   |dk_je| and |dv_je| are the per-element bounds of element_bound().
double quantized_row_bound(const TestCache& cache, const Problem& p, size_t s, int64_t i, int64_t h, double scale,
                           const std::vector<double>& qrow) {
  const KvCacheFormat f = cache.format();
  const int64_t d = p.head_dim, kh = h / (p.num_heads / p.kv_heads);
  const int64_t pos = p.ctx[s] - p.q_len[s] + i;
  const std::vector<int32_t> slots = p.slots_of(s);
  double dk = 0, dv = 0;
  std::vector<double> mean(static_cast<size_t>(d), 0.0);
  for (int64_t j = 0; j <= pos; ++j) {
    double ek = 0, ev = 0;  // sum_e |q_e| |dk_je|; sum_e |dv_je|^2
    const double sk = cache.stored_scale(true, slots[j], kh), sv = cache.stored_scale(false, slots[j], kh);
    for (int64_t e = 0; e < d; ++e) {
      const size_t idx = static_cast<size_t>((j * p.kv_heads + kh) * d + e);
      ek += std::fabs(qrow[e]) * element_bound(f, p.k[s][idx], sk);
      ev += std::pow(element_bound(f, p.v[s][idx], sv), 2);
      mean[e] += cache.stored(false, slots[j], kh, e) / static_cast<double>(pos + 1);
    }
    dk = std::max(dk, ek);
    dv = std::max(dv, std::sqrt(ev));
  }
  double spread = 0;
  for (int64_t j = 0; j <= pos; ++j) {
    double r = 0;
    for (int64_t e = 0; e < d; ++e) r += std::pow(cache.stored(false, slots[j], kh, e) - mean[e], 2);
    spread = std::max(spread, std::sqrt(r));
  }
  const double delta = scale * dk;
  return (std::exp(2 * delta) - 1) * spread + dv;
}

struct Case {
  KvCacheFormat format;
  int64_t head_dim, num_heads, kv_heads;
};

std::string case_name(const Case& c) {
  return format_label(c.format) + "_d" + std::to_string(c.head_dim) + "_h" + std::to_string(c.num_heads) + "_kv" +
         std::to_string(c.kv_heads);
}
// Keeps the ctest names stable (gtest would print the parameter's bytes, padding included).
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

class PagedDecodeContract : public ::testing::TestWithParam<Case> {};

// Sequences: a 1-token context, decode steps at ragged lengths, a chunked-prefill step (5 queries), a
// full prefill that crosses many pages, and a sequence with no query this step.
TEST_P(PagedDecodeContract, matches_fp64_reference) {
  const Case c = GetParam();
  Problem p = make_problem(c.num_heads, c.kv_heads, c.head_dim, 16, {1, 37, 300, 129, 50}, {1, 1, 5, 40, 0}, 11);
  TestCache cache(c.format, p.num_blocks, c.kv_heads, 16, c.head_dim);
  const Status wst = write_problem(cache, p);
  if (c.format == KvCacheFormat::kFp8Fp32PackedScale && !fp8_supported()) {
    EXPECT_EQ(wst.code(), StatusCode::kUnimplemented) << wst.to_string();
    OwnedTensor out(DType::kF32, {p.num_query_tokens, c.num_heads, c.head_dim});
    const Status st = run_attention(cache, p, out.view(), 0.125f);
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
    EXPECT_EQ(st.message(), kFp8Unsupported);
    return;
  }
  ASSERT_TRUE(wst.ok()) << wst.to_string();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  OwnedTensor out(DType::kF32, {p.num_query_tokens, c.num_heads, c.head_dim});
  const auto cache_before = cache.all_bytes();
  const auto query_before = p.query->bytes();
  const Status st = run_attention(cache, p, out.view(), static_cast<float>(scale));
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(cache.all_bytes(), cache_before) << "cache was mutated";
  EXPECT_EQ(p.query->bytes(), query_before) << "query was mutated";

  const std::vector<double> got = to_doubles(out.view());
  const std::vector<double> all_q = to_doubles(p.query->view());
  const size_t d = static_cast<size_t>(c.head_dim);
  double worst_stored = 0, worst_orig = 0, worst_bound_use = 0, worst_bound_size = 0;
  for (size_t s = 0; s < p.ctx.size(); ++s) {
    const std::vector<double> exact = reference(cache, p, s, scale, /*stored=*/true);
    const std::vector<double> orig = reference(cache, p, s, scale, /*stored=*/false);
    for (int64_t i = 0; i < p.q_len[s]; ++i) {
      for (int64_t h = 0; h < c.num_heads; ++h) {
        const size_t gb = static_cast<size_t>(((p.query_start_loc[s] + i) * c.num_heads + h)) * d;
        const size_t rb = static_cast<size_t>((i * c.num_heads + h)) * d;
        const double rn = norm(orig, rb, d);
        // The kernel's arithmetic on the values the cache holds: fp32 accumulation only.
        const double e_stored = dist(got, gb, exact, rb, d) / norm(exact, rb, d);
        worst_stored = std::max(worst_stored, e_stored);
        EXPECT_LE(e_stored, 1e-4) << "seq " << s << " query " << i << " head " << h;
        // End to end against the unquantized fp64 reference.
        const double e = dist(got, gb, orig, rb, d);
        worst_orig = std::max(worst_orig, e / rn);
        if (c.format == KvCacheFormat::kBf16) {
          EXPECT_LE(e, 1e-2 * rn) << "seq " << s << " query " << i << " head " << h;
        } else {
          const std::vector<double> qrow(all_q.begin() + gb, all_q.begin() + gb + d);
          const double bound = quantized_row_bound(cache, p, s, i, h, scale, qrow) + 1e-4 * rn;
          EXPECT_LE(e, bound) << "seq " << s << " query " << i << " head " << h;
          worst_bound_use = std::max(worst_bound_use, e / bound);
          worst_bound_size = std::max(worst_bound_size, bound / rn);
        }
      }
    }
  }
  // The bound must be able to fail: it stays below the output's own norm (a kernel that misreads a
  // scale or a row is off by more than that).
  if (c.format != KvCacheFormat::kBf16) {
    EXPECT_LT(worst_bound_size, 1.0);
  }
  RecordProperty("worst_rel_err_vs_stored", std::to_string(worst_stored));
  RecordProperty("worst_rel_err_vs_fp64", std::to_string(worst_orig));
  std::printf("[ %s D=%lld H=%lld/%lld ] rel err vs stored KV %.2e, vs fp64 %.2e, err/bound %.3f, bound/|ref| %.3f\n",
              format_label(c.format).c_str(), static_cast<long long>(c.head_dim), static_cast<long long>(c.num_heads),
              static_cast<long long>(c.kv_heads), worst_stored, worst_orig, worst_bound_use, worst_bound_size);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (KvCacheFormat f : all_formats()) {
    // Every supported head_dim (80 and 112 end with a 16-column group after their 32-column pairs).
    for (int64_t d : ops::kPagedDecodeHeadDims) v.push_back({f, d, 8, 2});
    v.push_back({f, 128, 4, 4});   // MHA: one query row per kv head
    v.push_back({f, 64, 12, 2});   // group of 6: row groups of 16 split a token's heads
    v.push_back({f, 64, 32, 1});   // MQA: 32 query heads on one kv head
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(representations, PagedDecodeContract, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

// Runs a problem in `f` and returns the output bytes (fp32 out), for determinism checks.
std::vector<std::byte> output_bits(KvCacheFormat f, int threads, DType out_dtype = DType::kF32, int64_t d = 128) {
  set_num_threads(threads);
  Problem p = make_problem(16, 4, d, 16, {700, 33, 260, 1}, {1, 20, 1, 1}, 5);
  TestCache cache(f, p.num_blocks, 4, 16, d);
  EXPECT_TRUE(write_problem(cache, p).ok());
  OwnedTensor out(out_dtype, {p.num_query_tokens, 16, d});
  const Status st = run_attention(cache, p, out.view(), 0.088f);
  EXPECT_TRUE(st.ok()) << st.to_string();
  set_num_threads(0);
  return out.bytes();
}

std::vector<KvCacheFormat> supported_formats() {
  std::vector<KvCacheFormat> v = {KvCacheFormat::kBf16, KvCacheFormat::kInt8Fp16Scale};
  if (fp8_supported()) v.push_back(KvCacheFormat::kFp8Fp32PackedScale);
  return v;
}

TEST(PagedDecode, bit_identical_across_runs_and_thread_counts) {
  for (KvCacheFormat f : supported_formats()) {
    const auto one = output_bits(f, 1);
    EXPECT_EQ(one, output_bits(f, 2)) << format_label(f);
    EXPECT_EQ(one, output_bits(f, 3)) << format_label(f);
    EXPECT_EQ(one, output_bits(f, 1)) << format_label(f);
    EXPECT_EQ(output_bits(f, 2, DType::kBF16), output_bits(f, 3, DType::kBF16)) << format_label(f);
    // A head_dim with a 16-column tail.
    EXPECT_EQ(output_bits(f, 1, DType::kF32, 112), output_bits(f, 3, DType::kF32, 112)) << format_label(f);
  }
}

// A query's result does not depend on the other sequences in the call.
TEST(PagedDecode, batch_invariant) {
  for (KvCacheFormat f : supported_formats()) {
    Problem p = make_problem(8, 2, 64, 16, {300, 45, 129}, {1, 3, 1}, 9);
    TestCache cache(f, p.num_blocks, 2, 16, 64);
    ASSERT_TRUE(write_problem(cache, p).ok());
    OwnedTensor all(DType::kF32, {p.num_query_tokens, 8, 64});
    ASSERT_TRUE(run_attention(cache, p, all.view(), 0.125f).ok());
    for (size_t s = 0; s < p.ctx.size(); ++s) {
      const int64_t q0 = p.query_start_loc[s], ql = p.q_len[s];
      std::vector<int32_t> table(p.block_tables.begin() + s * p.max_blocks,
                                 p.block_tables.begin() + (s + 1) * p.max_blocks);
      std::vector<int32_t> ctx = {p.ctx[s]}, qsl = {0, static_cast<int32_t>(ql)};
      const TensorView q = p.query->view().slice0(q0, q0 + ql);
      OwnedTensor alone(DType::kF32, {ql, 8, 64});
      const Status st = ops::paged_decode(q, cache.view(), TensorView(table.data(), DType::kI32, {1, p.max_blocks}),
                                          TensorView(ctx.data(), DType::kI32, {1}),
                                          TensorView(qsl.data(), DType::kI32, {2}), 0.125f, alone.view());
      ASSERT_TRUE(st.ok()) << st.to_string();
      const size_t bytes = static_cast<size_t>(ql * 8 * 64 * 4);
      EXPECT_EQ(0, std::memcmp(alone.data(), static_cast<const char*>(all.data()) + q0 * 8 * 64 * 4, bytes))
          << format_label(f) << " sequence " << s;
    }
  }
}

// Prefill through the op (all tokens as queries, causal) gives, for every token, exactly the result of a
// decode step at that token's position.
TEST(PagedDecode, causal_prefill_equals_decode_steps) {
  for (KvCacheFormat f : supported_formats()) {
    Problem p = make_problem(8, 2, 128, 16, {150}, {150}, 21);
    TestCache cache(f, p.num_blocks, 2, 16, 128);
    ASSERT_TRUE(write_problem(cache, p).ok());
    OwnedTensor pre(DType::kF32, {150, 8, 128});
    ASSERT_TRUE(run_attention(cache, p, pre.view(), 0.09f).ok());
    for (int32_t i : {0, 1, 15, 16, 63, 64, 100, 149}) {
      std::vector<int32_t> ctx = {i + 1}, qsl = {0, 1};
      OwnedTensor dec(DType::kF32, {1, 8, 128});
      const Status st = ops::paged_decode(p.query->view().slice0(i, i + 1), cache.view(), views(p).block_tables,
                                          TensorView(ctx.data(), DType::kI32, {1}),
                                          TensorView(qsl.data(), DType::kI32, {2}), 0.09f, dec.view());
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(0, std::memcmp(dec.data(), static_cast<const char*>(pre.data()) + i * 8 * 128 * 4, 8 * 128 * 4))
          << format_label(f) << " token " << i;
    }
  }
}

// Page sizes that are not multiples of the 16-key groups or the 64-key softmax chunks, and the
// contract's 128.
TEST(PagedDecode, odd_and_large_block_sizes) {
  for (KvCacheFormat f : supported_formats()) {
    for (int64_t bs : {5, 128}) {
      Problem p = make_problem(8, 2, 64, bs, {131, 7, 300}, {1, 7, 2}, 4);
      TestCache cache(f, p.num_blocks, 2, bs, 64);
      ASSERT_TRUE(write_problem(cache, p).ok());
      OwnedTensor out(DType::kF32, {p.num_query_tokens, 8, 64});
      ASSERT_TRUE(run_attention(cache, p, out.view(), 0.125f).ok());
      const std::vector<double> got = to_doubles(out.view());
      for (size_t s = 0; s < p.ctx.size(); ++s) {
        const std::vector<double> exact = reference(cache, p, s, 0.125, true);
        const size_t n = exact.size(), base = static_cast<size_t>(p.query_start_loc[s] * 8 * 64);
        EXPECT_LE(dist(got, base, exact, 0, n), 1e-4 * norm(exact, 0, n)) << format_label(f) << " bs " << bs;
      }
    }
  }
}

TEST(PagedDecode, strided_query_and_out_fp32_and_bf16) {
  for (KvCacheFormat f : supported_formats()) {
    for (DType qd : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (DType od : {DType::kF32, DType::kBF16}) {
        Problem p = make_problem(8, 2, 64, 16, {90, 20}, {2, 1}, 8, qd);
        TestCache cache(f, p.num_blocks, 2, 16, 64);
        ASSERT_TRUE(write_problem(cache, p).ok());
        // Query: heads padded to 100 elements, tokens to 1000; out: every other element.
        OwnedTensor qs(qd, {3 * 1000}), os(od, {3 * 8 * 64 * 2});
        const TensorView q = TensorView::strided(qs.data(), qd, {3, 8, 64}, {1000, 100, 1});
        const TensorView o = TensorView::strided(os.data(), od, {3, 8, 64}, {8 * 64 * 2, 64 * 2, 2});
        const std::vector<double> qv = to_doubles(p.query->view());
        for (int64_t i = 0; i < 3 * 8 * 64; ++i) set_element(q, logical_offset(q, i), static_cast<float>(qv[i]));
        const Views vw = views(p);
        ASSERT_TRUE(ops::paged_decode(q, cache.view(), vw.block_tables, vw.context_lens, vw.query_start_loc, 0.125f, o)
                        .ok());
        const std::vector<double> got = to_doubles(o);
        const double tol = od == DType::kBF16 ? 0x1p-8 : 1e-4;
        for (size_t s = 0; s < 2; ++s) {
          const std::vector<double> exact = reference(cache, p, s, 0.125, true);
          const size_t base = static_cast<size_t>(p.query_start_loc[s] * 8 * 64);
          EXPECT_LE(dist(got, base, exact, 0, exact.size()), tol * norm(exact, 0, exact.size()))
              << format_label(f) << " " << dtype_name(qd) << " -> " << dtype_name(od);
        }
        // Elements between the strided outputs are untouched.
        for (int64_t i = 1; i < 3 * 8 * 64 * 2; i += 2) {
          ASSERT_EQ(element_as_double(TensorView(os.data(), od, {3 * 8 * 64 * 2}), i), 0.0);
        }
      }
    }
  }
}

TEST(PagedDecode, empty_batches) {
  TestCache cache(KvCacheFormat::kBf16, 4, 2, 16, 64);
  OwnedTensor q(DType::kBF16, {0, 8, 64}), out(DType::kF32, {0, 8, 64});
  std::vector<int32_t> table(1), ctx(1), qsl = {0, 0};
  // No sequences at all.
  EXPECT_TRUE(ops::paged_decode(q.view(), cache.view(), TensorView(table.data(), DType::kI32, {0, 1}),
                                TensorView(ctx.data(), DType::kI32, {0}), TensorView(qsl.data(), DType::kI32, {1}),
                                0.1f, out.view())
                  .ok());
  // A sequence with cached tokens but no query this step; its block table is not read.
  ctx = {40};
  table = {-5};
  std::vector<int32_t> table3 = {-5, -5, -5};
  EXPECT_TRUE(ops::paged_decode(q.view(), cache.view(), TensorView(table3.data(), DType::kI32, {1, 3}),
                                TensorView(ctx.data(), DType::kI32, {1}), TensorView(qsl.data(), DType::kI32, {2}),
                                0.1f, out.view())
                  .ok());
}

TEST(PagedDecode, fp8_is_explicitly_unsupported_on_ascend910) {
  if (fp8_supported()) {
    // Here the fp8 cache is read (covered by matches_fp64_reference); the message below is 910-only.
    SUCCEED();
    return;
  }
  Problem p = make_problem(8, 2, 64, 16, {20}, {1}, 3);
  TestCache cache(KvCacheFormat::kFp8Fp32PackedScale, p.num_blocks, 2, 16, 64);
  OwnedTensor out(DType::kF32, {1, 8, 64});
  const auto before = out.bytes();
  const Status st = run_attention(cache, p, out.view(), 0.1f);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(st.message(), kFp8Unsupported);
  EXPECT_EQ(out.bytes(), before);
}

// The switch that makes head_dim a compile-time constant and the public list agree: every listed head_dim
// runs (decode across a page boundary, checked against the fp64 reference on the stored values in
// matches_fp64_reference), every other even head_dim up to 512 is Unimplemented with the list in the
// message, and nothing is written.
TEST(PagedDecode, head_dims_outside_the_list_are_unimplemented) {
  EXPECT_EQ(std::vector<int64_t>(ops::kPagedDecodeHeadDims.begin(), ops::kPagedDecodeHeadDims.end()),
            (std::vector<int64_t>{64, 80, 96, 112, 128, 192, 256}));
  for (KvCacheFormat f : supported_formats()) {
    for (int64_t d = 2; d <= 512; d += 2) {
      const bool listed = std::find(ops::kPagedDecodeHeadDims.begin(), ops::kPagedDecodeHeadDims.end(), d) !=
                          ops::kPagedDecodeHeadDims.end();
      TestCache cache(f, 4, 2, 16, d);
      OwnedTensor q(DType::kBF16, {1, 4, d}), out(DType::kF32, {1, 4, d});
      const auto before = out.bytes();
      std::vector<int32_t> table = {0}, ctx = {1}, qsl = {0, 1};
      const Status st = ops::paged_decode(q.view(), cache.view(), TensorView(table.data(), DType::kI32, {1, 1}),
                                          TensorView(ctx.data(), DType::kI32, {1}),
                                          TensorView(qsl.data(), DType::kI32, {2}), 0.1f, out.view());
      if (listed) {
        EXPECT_TRUE(st.ok()) << format_label(f) << " d " << d << ": " << st.to_string();
        continue;
      }
      EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << format_label(f) << " d " << d;
      EXPECT_EQ(st.message(), "paged_decode: head_dim=" + std::to_string(d) + " not in {64,80,96,112,128,192,256}");
      EXPECT_EQ(out.bytes(), before);
    }
  }
}

// ---- invalid arguments: the exact message of every check, and nothing written on error ----

struct Bad {
  TestCache cache{KvCacheFormat::kInt8Fp16Scale, 4, 2, 16, 64};
  OwnedTensor q{DType::kBF16, {3, 8, 64}}, out{DType::kF32, {3, 8, 64}};
  std::vector<int32_t> table = {0, 1, 2, 3}, ctx = {20, 2}, qsl = {0, 1, 3};
  TensorView bt() { return TensorView(table.data(), DType::kI32, {2, 2}); }
  TensorView cl() { return TensorView(ctx.data(), DType::kI32, {2}); }
  TensorView ql() { return TensorView(qsl.data(), DType::kI32, {3}); }
  void expect(const std::string& msg, const TensorView& qv, const ops::PagedKvCache& c, const TensorView& btv,
              const TensorView& clv, const TensorView& qlv, float scale, const TensorView& ov) {
    const auto before = out.bytes();
    const Status st = ops::paged_decode(qv, c, btv, clv, qlv, scale, ov);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), msg);
    EXPECT_EQ(out.bytes(), before) << "out written on error";
  }
  void expect(const std::string& msg) { expect(msg, q.view(), cache.view(), bt(), cl(), ql(), 0.125f, out.view()); }
};

TEST(PagedDecode, invalid_arguments) {
  Bad b;
  const ops::PagedKvCache good = b.cache.view();
  ASSERT_TRUE(ops::paged_decode(b.q.view(), good, b.bt(), b.cl(), b.ql(), 0.125f, b.out.view()).ok());
  const TensorView q = b.q.view(), out = b.out.view();
  std::vector<int8_t> i8(3 * 8 * 64);
  b.expect("paged_decode: query has dtype int8 but must be fp32, fp16 or bf16",
           TensorView(i8.data(), DType::kI8, {3, 8, 64}), good, b.bt(), b.cl(), b.ql(), 0.125f, out);
  b.expect("paged_decode: query has shape [24, 64] but must have rank 3 [num_query_tokens, num_heads, head_dim]",
           TensorView(b.q.data(), DType::kBF16, {24, 64}), good, b.bt(), b.cl(), b.ql(), 0.125f, out);
  b.expect("paged_decode: query has a null data pointer but 1536 elements",
           TensorView(nullptr, DType::kBF16, {3, 8, 64}), good, b.bt(), b.cl(), b.ql(), 0.125f, out);
  b.expect("paged_decode: out has dtype fp16 but must be fp32 or bf16", q, good, b.bt(), b.cl(), b.ql(), 0.125f,
           TensorView(b.out.data(), DType::kF16, {3, 8, 64}));
  b.expect("paged_decode: out has shape [3, 8, 32] but must have query's shape [3, 8, 64]", q, good, b.bt(), b.cl(),
           b.ql(), 0.125f, TensorView(b.out.data(), DType::kF32, {3, 8, 32}));
  {
    ops::PagedKvCache c = good;
    c.key_cache = TensorView(c.key_cache.data(), DType::kBF16, {4, 2, 16, 64});
    b.expect("paged_decode: key_cache has dtype bf16 but the int8+fp16 scale KV cache stores int8", q, c, b.bt(),
             b.cl(), b.ql(), 0.125f, out);
    c = good;
    c.format = KvCacheFormat::kBf16;
    b.expect("paged_decode: key_cache has dtype int8 but the bf16 KV cache stores bf16", q, c, b.bt(), b.cl(), b.ql(),
             0.125f, out);
    c = good;
    c.key_cache = TensorView(c.key_cache.data(), DType::kI8, {4, 2, 1024});
    b.expect("paged_decode: key_cache has shape [4, 2, 1024] but must have rank 4 [num_blocks, num_kv_heads, "
             "block_size, head_dim]",
             q, c, b.bt(), b.cl(), b.ql(), 0.125f, out);
    c = good;
    c.key_cache = TensorView(c.key_cache.data(), DType::kI8, {4, 2, 0, 64});
    b.expect("paged_decode: key_cache has shape [4, 2, 0, 64]; num_kv_heads, block_size and head_dim must be >= 1", q,
             c, b.bt(), b.cl(), b.ql(), 0.125f, out);
    c = good;
    c.key_cache = TensorView::strided(c.key_cache.data(), DType::kI8, {4, 2, 16, 64}, {2048, 1024, 32, 1});
    b.expect("paged_decode: key_cache is not contiguous; KV caches must be contiguous", q, c, b.bt(), b.cl(), b.ql(),
             0.125f, out);
    c = good;
    c.value_cache = TensorView(c.value_cache.data(), DType::kI8, {2, 2, 16, 64});
    b.expect("paged_decode: value_cache has shape [2, 2, 16, 64] but must have key_cache's shape [4, 2, 16, 64]", q, c,
             b.bt(), b.cl(), b.ql(), 0.125f, out);
    c = good;
    c.key_scale_cache = TensorView(c.key_scale_cache.data(), DType::kF32, {4, 2, 16});
    b.expect("paged_decode: key_scale_cache has dtype fp32 but the int8 KV cache keeps its scales in fp16", q, c,
             b.bt(), b.cl(), b.ql(), 0.125f, out);
    c = good;
    c.value_scale_cache = TensorView(c.value_scale_cache.data(), DType::kF16, {4, 16, 2});
    b.expect("paged_decode: value_scale_cache has shape [4, 16, 2] but must be [num_blocks, num_kv_heads, block_size] "
             "= [4, 2, 16]",
             q, c, b.bt(), b.cl(), b.ql(), 0.125f, out);
    c = good;
    c.format = KvCacheFormat::kFp8Fp32PackedScale;
    c.key_cache = TensorView(c.key_cache.data(), DType::kU8, {4, 2, 16, 64});
    c.value_cache = c.key_cache;
    if (fp8_supported()) {
      b.expect("paged_decode: query has head_dim 64 but the KV cache has head_dim 60", q, c, b.bt(), b.cl(), b.ql(),
               0.125f, out);
    }
  }
  b.expect("paged_decode: query has head_dim 32 but the KV cache has head_dim 64",
           TensorView(b.q.data(), DType::kBF16, {3, 8, 32}), good, b.bt(), b.cl(), b.ql(), 0.125f,
           TensorView(b.out.data(), DType::kF32, {3, 8, 32}));
  b.expect("paged_decode: query has 7 heads, which is not a positive multiple of the KV cache's 2 kv heads",
           TensorView(b.q.data(), DType::kBF16, {3, 7, 64}), good, b.bt(), b.cl(), b.ql(), 0.125f,
           TensorView(b.out.data(), DType::kF32, {3, 7, 64}));
  b.expect("paged_decode: softmax_scale is nan but must be finite and > 0", q, good, b.bt(), b.cl(), b.ql(), NAN, out);
  b.expect("paged_decode: softmax_scale is 0 but must be finite and > 0", q, good, b.bt(), b.cl(), b.ql(), 0.f, out);
  b.expect("paged_decode: block_tables has dtype int64 but must be int32", q, good,
           TensorView(b.table.data(), DType::kI64, {2, 1}), b.cl(), b.ql(), 0.125f, out);
  b.expect("paged_decode: block_tables has shape [4] but must have rank 2 [num_seqs, max_blocks_per_seq]", q, good,
           TensorView(b.table.data(), DType::kI32, {4}), b.cl(), b.ql(), 0.125f, out);
  b.expect("paged_decode: context_lens has shape [1] but must be [2] (num_seqs, the rows of block_tables)", q, good,
           b.bt(), TensorView(b.ctx.data(), DType::kI32, {1}), b.ql(), 0.125f, out);
  b.expect("paged_decode: query_start_loc has shape [2] but must be [3] (num_seqs + 1)", q, good, b.bt(), b.cl(),
           TensorView(b.qsl.data(), DType::kI32, {2}), 0.125f, out);
  b.qsl = {1, 1, 3};
  b.expect("paged_decode: query_start_loc[0] is 1 but must be 0");
  b.qsl = {0, 2, 1};
  b.expect("paged_decode: query_start_loc[2] = 1 is less than query_start_loc[1] = 2; it must be non-decreasing");
  b.qsl = {0, 1, 2};
  b.expect("paged_decode: query_start_loc[2] is 2 but must equal the number of query tokens 3");
  b.qsl = {0, 1, 3};
  b.ctx = {20, 1};
  b.expect("paged_decode: sequence 1 has 2 query tokens but context length 1; the context includes the query tokens");
  b.ctx = {33, 2};
  b.expect("paged_decode: sequence 0 has context length 33 but block_tables holds 2 blocks of 16 tokens (32)");
  b.ctx = {20, 2};
  b.table = {0, 4, 2, 3};
  b.expect("paged_decode: block_tables[0][1] = 4 is not a block of the KV cache (num_blocks = 4)");
  b.table = {0, 1, -1, 3};
  b.expect("paged_decode: block_tables[1][0] = -1 is not a block of the KV cache (num_blocks = 4)");
}

}  // namespace
}  // namespace genbridge::testing
