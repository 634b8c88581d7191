// Same bits on every CPU target for the norm, quant and kv_cache operators: each op runs
// under every CPU target this machine offers (tests/support/each_cpu_target.h) on inputs with tails (row
// lengths that are not multiples of 16 or 32), NaN, infinities and subnormals where the op takes them, and
// every output byte (and every returned status) must equal the first target's. Ops a build does not offer
// (the MX ops and fp8_kv_write on a generation without them) return the same Unimplemented everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../attention/kv_harness.h"
#include "../quant/quant_test_util.h"
#include "genbridge/core/cpu_target.h"
#include "genbridge/core/formats.h"
#include "genbridge/ops/norm/add_gemma_rms_norm.h"
#include "genbridge/ops/norm/add_rms_norm.h"
#include "genbridge/ops/norm/gemma_rms_norm.h"
#include "genbridge/ops/norm/rms_norm.h"
#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "genbridge/ops/quant/dynamic_quant_per_token.h"
#include "genbridge/ops/quant/mx_dequant.h"
#include "genbridge/ops/quant/normalize_mx_scale_layout.h"
#include "support/each_cpu_target.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kQNaN = std::numeric_limits<float>::quiet_NaN();

// Everything one target produced: every output tensor's bytes and every status, in call order.
struct Outputs {
  std::vector<uint8_t> bytes;
  std::vector<std::string> log;  // "<what>: <status>" per call, to name the first difference
  // Every call must succeed, except where this build does not offer the op (`offered` false): then it
  // must return Unimplemented.
  void add(const std::string& what, const Status& s, bool offered = true) {
    if (offered) {
      EXPECT_TRUE(s.ok()) << what << ": " << s.to_string();
    } else {
      EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << what << ": " << s.to_string();
    }
    log.push_back(what + ": " + s.to_string());
  }
  void add(const OwnedTensor& t) {
    const auto* p = reinterpret_cast<const uint8_t*>(t.bytes().data());
    bytes.insert(bytes.end(), p, p + t.bytes().size());
  }
};

// Values of `n` elements with a row structure: row r of `cols` gets its own magnitude; some rows carry the
// specials. kind 0: finite only (the norms' NaN rows are their own case); 1: plus NaN, +-inf, subnormals.
std::vector<float> values(int64_t rows, int64_t cols, uint64_t seed, int kind, DType d) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int e = static_cast<int>(r % 9) * 5 - 20;
    for (int64_t c = 0; c < cols; ++c) v[static_cast<size_t>(r * cols + c)] = std::ldexp(u(rng), e);
    float* row = v.data() + r * cols;
    if (r % 4 == 1) {
      for (int64_t c = 0; c < cols; c += 3) row[c] = std::ldexp(u(rng), -140);  // fp32 subnormals
    }
    if (kind == 1 && r % 4 == 2) row[cols - 1] = (r % 8 == 2) ? kQNaN : -kInf;  // in the tail
    if (kind == 1 && r % 4 == 3) row[cols / 2] = kInf;
  }
  for (float& x : v) {
    if (d == DType::kF16) x = fp16_to_float(float_to_fp16(x));
    if (d == DType::kBF16) x = bf16_to_float(float_to_bf16(x));
  }
  return v;
}

OwnedTensor tensor(DType d, std::vector<int64_t> shape, const std::vector<float>& v) {
  OwnedTensor t(d, std::move(shape));
  const TensorView tv = t.view();
  for (int64_t i = 0; i < tv.numel(); ++i) set_element(tv, i, v[static_cast<size_t>(i)]);
  return t;
}

const DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

void run_norms(Outputs& out) {
  for (DType d : kFloatTypes) {
    for (int64_t cols : {5, 16, 77, 200, 333}) {
      const int64_t rows = 6;
      const std::string what = std::string("norm ") + std::string(dtype_name(d)) + " cols " + std::to_string(cols);
      const auto xv = values(rows, cols, 11 + cols, 0, d);
      const auto rv = values(rows, cols, 12 + cols, 0, d);
      const auto wv = values(1, cols, 13 + cols, 0, d);
      OwnedTensor x = tensor(d, {rows, cols}, xv), res = tensor(d, {rows, cols}, rv), w = tensor(d, {cols}, wv);
      OwnedTensor y(d, {rows, cols}), rstd(DType::kF32, {rows, 1}), sum(d, {rows, cols});
      out.add(what + " rms_norm", ops::rms_norm(x.view(), w.view(), 1e-6f, y.view(), rstd.view()));
      out.add(y);
      out.add(rstd);
      out.add(what + " gemma_rms_norm", ops::gemma_rms_norm(x.view(), w.view(), 1e-6f, y.view(), rstd.view()));
      out.add(y);
      out.add(rstd);
      out.add(what + " add_rms_norm", ops::add_rms_norm(x.view(), w.view(), res.view(), 1e-5f, y.view(), sum.view()));
      out.add(y);
      out.add(sum);
      out.add(what + " add_gemma_rms_norm",
              ops::add_gemma_rms_norm(x.view(), w.view(), res.view(), 1e-5f, y.view(), sum.view()));
      out.add(y);
      out.add(sum);
      // A strided x (every other element): the any-stride path.
      OwnedTensor xs(d, {rows, 2 * cols});
      const TensorView xsv = TensorView::strided(xs.data(), d, {rows, cols}, {2 * cols, 2});
      for (int64_t i = 0; i < rows * cols; ++i) set_element(xsv, (i / cols) * 2 * cols + (i % cols) * 2, xv[static_cast<size_t>(i)]);
      out.add(what + " rms_norm strided", ops::rms_norm(xsv, w.view(), 1e-6f, y.view(), rstd.view()));
      out.add(y);
      out.add(rstd);
      // A NaN and an infinity in x: they propagate the same way everywhere.
      auto sv = xv;
      sv[static_cast<size_t>(cols - 1)] = kQNaN;
      sv[static_cast<size_t>(2 * cols)] = kInf;
      OwnedTensor xspecial = tensor(d, {rows, cols}, sv);
      out.add(what + " rms_norm specials", ops::rms_norm(xspecial.view(), w.view(), 1e-6f, y.view(), rstd.view()));
      out.add(y);
      out.add(rstd);
    }
  }
}

void run_int8_quant(Outputs& out) {
  for (DType d : kFloatTypes) {
    for (int64_t cols : {1, 15, 77, 300}) {
      const int64_t rows = 9;
      OwnedTensor x = tensor(d, {rows, cols}, values(rows, cols, 21 + cols, 1, d));
      OwnedTensor q(DType::kI8, {rows, cols}), s(DType::kF32, {rows});
      out.add(std::string("dynamic_quant_per_token ") + std::string(dtype_name(d)) + " cols " + std::to_string(cols),
              ops::dynamic_quant_per_token(x.view(), 1e-8f, q.view(), s.view()));
      out.add(q);
      out.add(s);
    }
  }
}

void run_mx(Outputs& out) {
  struct Case {
    DType dst;
    ops::MxScaleAlg alg;
    bool round;
  };
  const Case cases[] = {{DType::kFp8E4M3FN, ops::MxScaleAlg::kOcpFloor, false},
                        {DType::kFp8E4M3FN, ops::MxScaleAlg::kCeil, false},
                        {DType::kFp8E5M2, ops::MxScaleAlg::kBiasedExponent, true},
                        {DType::kFp8E5M2, ops::MxScaleAlg::kCeil, false},
                        {DType::kFp4E2M1x2, ops::MxScaleAlg::kBiasedExponent, false},
                        {DType::kFp4E2M1x2, ops::MxScaleAlg::kOcpFloor, false}};
  for (DType d : kFloatTypes) {
    // 17 whole blocks of 32 and a short one (the vectorized scale rule takes 16 at a time); block 64 with a tail.
    for (auto [cols, block] : {std::pair<int64_t, int64_t>{32 * 17 + 10, 32}, {200, 64}, {32, 32}}) {
      const int64_t rows = 5;
      // Specials in whole blocks: a NaN block, an inf block; subnormal rows; tiny and huge magnitudes.
      OwnedTensor x = tensor(d, {rows, cols}, values(rows, cols, 31 + cols, 1, d));
      for (const Case& c : cases) {
        const bool fp4 = c.dst == DType::kFp4E2M1x2;
        const int64_t pairs = ops::mx_scale_pairs(cols, block);
        OwnedTensor q(c.dst, {rows, fp4 ? cols / 2 : cols}), s(DType::kE8M0, {rows, pairs, 2});
        ops::MxQuantConfig cfg;
        cfg.block_size = block;
        cfg.dst = c.dst;
        cfg.scale_alg = c.alg;
        cfg.round_scale = c.round;
        const std::string what = std::string("mx ") + std::string(dtype_name(d)) + " -> " +
                                 std::string(dtype_name(c.dst)) + " alg " + std::to_string(static_cast<int>(c.alg)) +
                                 " cols " + std::to_string(cols);
        out.add(what + " dynamic_mx_quant", ops::dynamic_mx_quant(x.view(), cfg, q.view(), s.view()), mx_supported());
        out.add(q);
        out.add(s);
        OwnedTensor y(d, {rows, cols});
        out.add(what + " mx_dequant", ops::mx_dequant(q.view(), s.view(), block, y.view()), mx_supported());
        out.add(y);
      }
    }
  }
  for (int64_t n : {1, 17, 40}) {
    OwnedTensor flat(DType::kE8M0, {3, n}), pair(DType::kE8M0, {3, (n + 1) / 2, 2});
    for (size_t i = 0; i < flat.bytes().size(); ++i) flat.bytes()[i] = std::byte{static_cast<uint8_t>(i * 37 + 5)};
    out.add("normalize_mx_scale_layout n " + std::to_string(n), ops::normalize_mx_scale_layout(flat.view(), pair.view()),
            mx_supported());
    out.add(pair);
  }
}

void run_kv(Outputs& out) {
  for (KvCacheFormat f : all_formats()) {
    for (DType d : kFloatTypes) {
      for (int64_t dim : {80, 112}) {  // head sizes that are not multiples of 32
        const int64_t heads = 2, tokens = 7;
        TestCache cache(f, 4, heads, 16, dim);
        OwnedTensor k = tensor(d, {tokens, heads, dim}, values(tokens * heads, dim, 41 + dim, 1, d));
        OwnedTensor v = tensor(d, {tokens, heads, dim}, values(tokens * heads, dim, 42 + dim, 1, d));
        std::vector<int32_t> slots;
        for (int32_t t = 0; t < tokens; ++t) slots.push_back((t * 9 + 3) % 64);
        out.add(std::string(kv_cache_format_name(f)) + " " + std::string(dtype_name(d)) + " dim " +
                    std::to_string(dim),
                cache.write(k.view(), v.view(), slots), f != KvCacheFormat::kFp8Fp32PackedScale || mx_supported());
        for (OwnedTensor* t : {&cache.key(), &cache.value(), &cache.key_scales(), &cache.value_scales()}) out.add(*t);
      }
    }
  }
}

void expect_same_on_every_target(void (*run)(Outputs&)) {
  std::vector<std::string> targets;
  std::vector<Outputs> outs;
  for_each_cpu_target([&](const std::string& t) {
    targets.push_back(t);
    outs.emplace_back();
    run(outs.back());
  });
  ASSERT_FALSE(outs.empty());
  std::string names;
  for (const std::string& t : targets) names += " " + t;
  std::printf("cpu targets:%s; %zu calls, %zu output bytes each\n", names.c_str(), outs[0].log.size(),
              outs[0].bytes.size());
  // GENBRIDGE_TEST_DUMP_DIR: write the first target's bytes there (to compare builds of other commits).
  if (const char* dir = std::getenv("GENBRIDGE_TEST_DUMP_DIR")) {
    const std::string path = std::string(dir) + "/" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".bin";
    if (FILE* f = std::fopen(path.c_str(), "wb")) {
      std::fwrite(outs[0].bytes.data(), 1, outs[0].bytes.size(), f);
      std::fclose(f);
    }
  }
  for (size_t i = 1; i < outs.size(); ++i) {
    EXPECT_EQ(outs[i].log, outs[0].log) << targets[i] << " vs " << targets[0];
    ASSERT_EQ(outs[i].bytes.size(), outs[0].bytes.size()) << targets[i];
    if (std::memcmp(outs[i].bytes.data(), outs[0].bytes.data(), outs[0].bytes.size()) != 0) {
      size_t at = 0;
      while (outs[i].bytes[at] == outs[0].bytes[at]) ++at;
      ADD_FAILURE() << "cpu target " << targets[i] << " differs from " << targets[0] << " at output byte " << at
                    << " of " << outs[0].bytes.size();
    }
  }
}

TEST(CrossTarget, norms_give_the_same_bits_on_every_cpu_target) { expect_same_on_every_target(run_norms); }

// Outputs larger than half the last-level cache (32 MiB on the CI machines) are written with non-temporal
// stores from the first element aligned for them (the row starts here are 16-byte aligned at best): the same
// bytes, under every CPU target with such stores (not scalar), as the same rows normalised 256 at a time
// (2-4 MiB per call), whose outputs stay in the cache.
TEST(CrossTarget, large_norm_outputs_give_the_bytes_of_small_calls) {
  constexpr int64_t kCols = 4100, kChunk = 256;  // 4100: rows start at every 8-byte offset mod 32 for bf16
  for (DType d : {DType::kF32, DType::kBF16}) {
    const int64_t rows = (int64_t{20} << 20) / (kCols * static_cast<int64_t>(dtype_size(d)));  // y: 20 MiB
    OwnedTensor x(d, {rows, kCols}), res(d, {rows, kCols}), w(d, {kCols});
    fill_uniform(x.view(), 31, -3.f, 3.f);
    fill_uniform(res.view(), 32, -3.f, 3.f);
    fill_uniform(w.view(), 33, -1.f, 1.f);
    const auto chunk = [&](const OwnedTensor& t, int64_t r0, int64_t n) {
      return TensorView::strided(const_cast<std::byte*>(t.bytes().data()) + r0 * kCols * dtype_size(d), d,
                                 {n, kCols}, {kCols, 1});
    };
    OwnedTensor y(d, {rows, kCols}), sum(d, {rows, kCols}), y2(d, {rows, kCols}), sum2(d, {rows, kCols});
    OwnedTensor rstd(DType::kF32, {rows, 1}), rs(DType::kF32, {kChunk, 1});
    for_each_cpu_target([&](const std::string& target) {
      if (target == "scalar") return;
      for (bool add : {false, true}) {
        const std::string what = target + " " + std::string(dtype_name(d)) + (add ? " add_rms_norm" : " rms_norm");
        ASSERT_TRUE((add ? ops::add_rms_norm(x.view(), w.view(), res.view(), 1e-5f, y.view(), sum.view())
                         : ops::rms_norm(x.view(), w.view(), 1e-6f, y.view(), rstd.view()))
                        .ok())
            << what;
        for (int64_t r0 = 0; r0 < rows; r0 += kChunk) {
          const int64_t n = std::min(kChunk, rows - r0);
          const Status st =
              add ? ops::add_rms_norm(chunk(x, r0, n), w.view(), chunk(res, r0, n), 1e-5f, chunk(y2, r0, n),
                                      chunk(sum2, r0, n))
                  : ops::rms_norm(chunk(x, r0, n), w.view(), 1e-6f, chunk(y2, r0, n),
                                  TensorView::strided(rs.bytes().data(), DType::kF32, {n, 1}, {1, 1}));
          ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
        }
        EXPECT_TRUE(y.bytes() == y2.bytes()) << what << ": y differs";
        if (add) {
          EXPECT_TRUE(sum.bytes() == sum2.bytes()) << what << ": residual_sum differs";
        }
        std::memset(y2.bytes().data(), 0, y2.bytes().size());  // the next comparison sees only its own writes
      }
    });
  }
}
TEST(CrossTarget, dynamic_quant_per_token_gives_the_same_bits_on_every_cpu_target) {
  expect_same_on_every_target(run_int8_quant);
}
TEST(CrossTarget, mx_ops_give_the_same_bits_on_every_cpu_target) { expect_same_on_every_target(run_mx); }
TEST(CrossTarget, kv_writers_give_the_same_bits_on_every_cpu_target) { expect_same_on_every_target(run_kv); }

// The comparisons above mean something only with several targets: the default build compiles scalar, sse4,
// avx2 and avx512 on x86-64 (neon and scalar on aarch64), and every machine runs at least two of them. A
// build for one machine (GENBRIDGE_ARCH_FLAGS=-march=native) may compile fewer; then there is nothing to ask.
TEST(CrossTarget, the_comparison_covers_several_cpu_targets) {
  if (cpu_targets_compiled().size() < 3) GTEST_SKIP() << "this build compiles fewer than three CPU targets";
  EXPECT_GE(cpu_targets_available().size(), 2u);
}

}  // namespace
}  // namespace genbridge::testing
