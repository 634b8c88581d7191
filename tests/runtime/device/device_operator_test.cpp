// DeviceOperator: the per-generation contracts (docs/design.md#deviceoperator-contract), kv_cache_dtype resolution, the
// start-up SoC check (configured selector, npu-smi present or absent), the log line, and the adapters end to end with
// the KV page pool. Runs in both target builds; expectations that depend on the build's own generation are derived from
// genbridge::ops::build_target().
#include "runtime/device/device_operator.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "genbridge/build_info.h"
#include "genbridge/core/formats.h"
#include "genbridge/ops/kv_cache/bf16_kv_write.h"
#include "genbridge/ops/kv_cache/fp8_kv_write.h"
#include "genbridge/ops/kv_cache/int8_kv_write.h"
#include "ops/common/attention/attention_ref.h"
#include "support/tensor_util.h"

namespace genbridge::runtime {
namespace {

using ops::KvCacheFormat;
using testing::OwnedTensor;

Generation build_generation() { return generation_from_target(ops::build_target()).value(); }
Generation other_generation() {
  return build_generation() == Generation::kAscend910 ? Generation::kAscend950 : Generation::kAscend910;
}
bool is910() { return build_generation() == Generation::kAscend910; }

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/gb_dev_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string fake_npu_smi(const std::string& output) const {
    const auto p = path / "npu-smi";
    std::ofstream(p) << "#!/bin/sh\ncat <<'EOF'\n" << output << "EOF\n";
    ::chmod(p.c_str(), 0755);
    return path.string();
  }
};

TEST(GenerationContract, matches_the_design_table) {
  const GenerationContract& a = contract_for(Generation::kAscend910);
  EXPECT_EQ(a.quantized_kv, KvCacheFormat::kInt8Fp16Scale);
  EXPECT_EQ(ops::kv_representation(a.quantized_kv).element, DType::kI8);
  EXPECT_EQ(ops::kv_representation(a.quantized_kv).scale, DType::kF16);
  EXPECT_EQ(ops::kv_representation(a.quantized_kv).scale_placement, ops::KvScalePlacement::kSeparateCache);
  EXPECT_EQ(a.slot_mapping, ops::SlotMapping::kBlockOffsetPairs);
  EXPECT_EQ(a.kv_page_size, 128);
  EXPECT_EQ(a.mx_scale_layout, MxScaleLayout::kNone);
  const GenerationContract& b = contract_for(Generation::kAscend950);
  EXPECT_EQ(b.quantized_kv, KvCacheFormat::kFp8Fp32PackedScale);
  EXPECT_EQ(ops::kv_representation(b.quantized_kv).element, DType::kFp8E4M3FN);
  EXPECT_EQ(ops::kv_representation(b.quantized_kv).scale, DType::kF32);
  EXPECT_EQ(ops::kv_representation(b.quantized_kv).scale_placement, ops::KvScalePlacement::kPackedInRow);
  EXPECT_EQ(b.slot_mapping, ops::SlotMapping::kFlat);
  EXPECT_EQ(b.kv_page_size, 128);
  EXPECT_EQ(b.mx_scale_layout, MxScaleLayout::kPair);
  // Bytes per (token, kv head) for K or V: D + 2 (130 at D = 128) and D + 4 (132); bf16 2D on both.
  for (int64_t d : {64, 128, 256}) {
    EXPECT_EQ(kv_row_bytes(a.quantized_kv, d) + kv_side_bytes(a.quantized_kv), d + 2);
    EXPECT_EQ(kv_row_bytes(b.quantized_kv, d) + kv_side_bytes(b.quantized_kv), d + 4);
    EXPECT_EQ(kv_row_bytes(KvCacheFormat::kBf16, d) + kv_side_bytes(KvCacheFormat::kBf16), 2 * d);
  }
}

TEST(GenerationContract, kv_cache_dtype_is_configuration_the_representation_is_the_generation) {
  const GenerationContract& a = contract_for(Generation::kAscend910);
  const GenerationContract& b = contract_for(Generation::kAscend950);
  for (const GenerationContract* c : {&a, &b}) {
    EXPECT_EQ(resolve_kv_cache_dtype(*c, "auto").value(), KvCacheFormat::kBf16);
    EXPECT_EQ(resolve_kv_cache_dtype(*c, "bf16").value(), KvCacheFormat::kBf16);
    EXPECT_EQ(resolve_kv_cache_dtype(*c, "quantized").value(), c->quantized_kv);
  }
  EXPECT_EQ(resolve_kv_cache_dtype(a, "int8").value(), KvCacheFormat::kInt8Fp16Scale);
  EXPECT_EQ(resolve_kv_cache_dtype(b, "fp8").value(), KvCacheFormat::kFp8Fp32PackedScale);
  EXPECT_EQ(resolve_kv_cache_dtype(a, "fp8").status().message(),
            "kv_cache_dtype=fp8: Ascend910 (A2/A3) has no fp8 KV representation; its quantized KV cache is "
            "int8+fp16 scale; use kv_cache_dtype=quantized (or int8), bf16 or auto");
  EXPECT_EQ(resolve_kv_cache_dtype(a, "fp8_e4m3fn").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(resolve_kv_cache_dtype(b, "int8").status().message(),
            "kv_cache_dtype=int8: Ascend950 (A5) has no int8 KV representation; its quantized KV cache is "
            "fp8_e4m3fn+packed fp32 scale; use kv_cache_dtype=quantized (or fp8), bf16 or auto");
  EXPECT_EQ(resolve_kv_cache_dtype(a, "fp16").status().message(),
            "kv_cache_dtype=fp16 is not one of auto, bf16, quantized (Ascend910 also accepts int8)");
}

TEST(StartupCheck, configured_selector_must_match_the_build) {
  const SocInfo a2{Generation::kAscend910, "Ascend910B1", 220};
  const SocInfo a5{Generation::kAscend950, "Ascend950PR_9599", 260};
  for (const char* sel : {"", "910B", "Ascend910B3", "910", "910C", "Ascend910_9392"}) {
    EXPECT_TRUE(check_soc(a2, sel, std::nullopt).ok()) << sel;
  }
  for (const char* sel : {"", "950", "Ascend950", "Ascend950DT_9591"}) EXPECT_TRUE(check_soc(a5, sel, std::nullopt).ok()) << sel;
  EXPECT_EQ(check_soc(a2, "950", std::nullopt).message(),
            "DeviceOperator: the configured SoC Ascend950PR_9599 (selector '950', generation Ascend950, A5) does not "
            "match: this build targets Ascend910 (A2/A3; built for Ascend910B1); use a build configured with "
            "-DGENBRIDGE_SOC=950 or configure a Ascend910 SoC");
  EXPECT_EQ(check_soc(a5, "Ascend910_9382", std::nullopt).message(),
            "DeviceOperator: the configured SoC Ascend910_9382 (selector 'Ascend910_9382', generation Ascend910, "
            "A2/A3) does not match: this build targets Ascend950 (A5; built for Ascend950PR_9599); use a build "
            "configured with -DGENBRIDGE_SOC=Ascend910_9382 or configure a Ascend950 SoC");
  EXPECT_EQ(check_soc(a2, "910X", std::nullopt).message(),
            "DeviceOperator: configured SoC selector '910X' is not known; accepted selectors: 910B, "
            "Ascend910B1..Ascend910B4, 910, 910C, Ascend910_93xx (e.g. Ascend910_9382, Ascend910_9392), 950, "
            "Ascend950, Ascend950PR_xxxx, Ascend950DT_xxxx");
}

TEST(StartupCheck, detected_soc_must_match_the_build) {
  const SocInfo a2{Generation::kAscend910, "Ascend910B1", 220};
  EXPECT_TRUE(check_soc(a2, "", soc_from_code(253).value()).ok());  // an A3 device runs the Ascend910 build
  const Status st = check_soc(a2, "910B", soc_from_code(260).value());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "DeviceOperator: the device's SoC Ascend950PR_9599 (detected by npu-smi, SoC code 260, generation "
            "Ascend950, A5) does not match: this build targets Ascend910 (A2/A3; built for Ascend910B1); run a build "
            "for Ascend950 on this machine");
}

// Selectors of the build's own generation and of the other one.
const char* own_selector() { return is910() ? "910C" : "Ascend950DT_9591"; }
const char* other_selector() { return is910() ? "950" : "910B"; }

TEST(DeviceOperatorCreate, matching_selector_and_no_npu_smi) {
  TempDir empty;
  for (const char* sel : {"", own_selector()}) {
    auto dev = DeviceOperator::create({sel, "auto", empty.path.string()});
    ASSERT_TRUE(dev.ok()) << dev.status().to_string();
    EXPECT_EQ(dev->contract().generation, build_generation());
    EXPECT_EQ(dev->kv_format(), KvCacheFormat::kBf16);
  }
  auto dev = DeviceOperator::create({own_selector(), "quantized", empty.path.string()});
  ASSERT_TRUE(dev.ok());
  EXPECT_EQ(dev->kv_format(), contract_for(build_generation()).quantized_kv);
  const std::string line = dev->log_line();
  EXPECT_EQ(line.find('\n'), std::string::npos);
  if (is910()) {
    EXPECT_EQ(line,
              "genbridge device: Ascend910 (A2/A3) build for Ascend910B1, configured SoC '910C', npu-smi not found, "
              "device not checked | KV cache (kv_cache_dtype=quantized): GQA int8 + fp16 scale per (token, kv head) in a "
              "separate scale cache (head_dim + 2 B per (token, kv head)); MLA int8 latent+fp16 scale, bf16 rope cache, "
              "slot mapping [block, offset] pairs, page "
              "128 tokens | MX scale layout: none (no MX formats) | weights (weight_quant=none): none (bf16 weights) | "
              "MoE dispatch (moe_dispatch=bf16): bf16 (2 B per element)");
  } else {
    EXPECT_EQ(line,
              "genbridge device: Ascend950 (A5) build for Ascend950PR_9599, configured SoC 'Ascend950DT_9591', "
              "npu-smi not found, device not checked | KV cache (kv_cache_dtype=quantized): GQA fp8 e4m3fn + fp32 scale "
              "per (token, kv head) packed at the end of the row (head_dim + 4 B per (token, kv head)); MLA fp8_e4m3fn "
              "latent+fp32 scale per 128+bf16 rope, packed, slot mapping "
              "flat (block * block_size + offset), page 128 tokens | MX scale layout: pair [..., K/64, 2] | weights "
              "(weight_quant=none): none (bf16 weights) | MoE dispatch (moe_dispatch=bf16): bf16 (2 B per element)");
  }
}

TEST(DeviceOperatorCreate, mismatching_selector_is_a_startup_error_naming_both) {
  TempDir empty;
  auto dev = DeviceOperator::create({other_selector(), "auto", empty.path.string()});
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = dev.status().message();
  EXPECT_NE(m.find(std::string("generation ") + std::string(generation_name(other_generation()))), std::string::npos) << m;
  EXPECT_NE(m.find(std::string("this build targets ") + std::string(ops::build_target())), std::string::npos) << m;
}

TEST(DeviceOperatorCreate, unknown_kv_cache_dtype_or_foreign_representation_is_refused) {
  TempDir empty;
  auto fp16 = DeviceOperator::create({"", "fp16", empty.path.string()});
  EXPECT_EQ(fp16.status().code(), StatusCode::kInvalidArgument);
  auto foreign = DeviceOperator::create({"", is910() ? "fp8" : "int8", empty.path.string()});
  EXPECT_EQ(foreign.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().message().find("has no"), std::string::npos);
}

TEST(DeviceOperatorCreate, detected_device_via_npu_smi) {
  TempDir own, other, garbage;
  const std::string own_text = is910() ? "| 0     910B3               | OK            | 93.4        36 |\n"
                                       : "| 0     Ascend950PR_9599    | OK            | 120.3       41 |\n";
  const std::string other_text = is910() ? "| 0     Ascend950PR_9599    | OK            | 120.3       41 |\n"
                                         : "| 0     910B3               | OK            | 93.4        36 |\n";
  auto ok = DeviceOperator::create({"", "auto", own.fake_npu_smi(own_text)});
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_NE(ok->log_line().find(is910() ? "device Ascend910B3 (npu-smi)" : "device Ascend950PR_9599 (npu-smi)"),
            std::string::npos)
      << ok->log_line();
  auto bad = DeviceOperator::create({"", "auto", other.fake_npu_smi(other_text)});
  ASSERT_FALSE(bad.ok());
  const std::string& m = bad.status().message();
  EXPECT_NE(m.find("detected by npu-smi"), std::string::npos) << m;
  EXPECT_NE(m.find(std::string("this build targets ") + std::string(ops::build_target())), std::string::npos) << m;
  auto unreadable = DeviceOperator::create({"", "auto", garbage.fake_npu_smi("no devices\n")});
  EXPECT_EQ(unreadable.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(unreadable.status().message(),
            std::string("DeviceOperator: npu-smi is on the path but its output cannot be checked against this build (") +
                std::string(ops::build_target()) + "): npu-smi output names no known SoC (first line: 'no devices')");
}

// ---- adapters with the pool: write K/V to pool slots, attention through pool block tables ----

// Every kv_cache_dtype value this build's generation accepts.
std::vector<std::string> accepted_kv_dtypes() {
  return {"auto", "bf16", "quantized", is910() ? "int8" : "fp8"};
}

TEST(DeviceOperatorAdapters, write_and_attend_through_the_pool_match_fp64) {
  TempDir empty;
  const int64_t layers = 2, kv_heads = 2, heads = 8, d = 128;
  for (const std::string& kvd : accepted_kv_dtypes()) {
    auto dev = DeviceOperator::create({"", kvd, empty.path.string()}).value();
    const KvPageGeometry g = dev.kv_page_geometry({layers, kv_heads, d});
    EXPECT_EQ(g.page_size, 128);
    EXPECT_EQ(g.row_bytes + g.side_row_bytes, kv_row_bytes(dev.kv_format(), d) + kv_side_bytes(dev.kv_format()));
    auto pool = KvPagePool::create(g, 8).value();
    EXPECT_EQ(pool.total_bytes(), 8 * 128 * layers * 2 * kv_heads * (g.row_bytes + g.side_row_bytes));
    // Two sequences: 300 tokens (prefill through write_kv in one call, more than one 256-token chunk)
    // and 9 tokens; then one decode query each, attention on layer 1.
    const std::vector<int64_t> lens = {300, 9};
    std::vector<std::vector<float>> k(2), v(2);
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto view = dev.kv_layer_view(pool, {layers, kv_heads, d}, 1);
    ASSERT_TRUE(view.ok()) << view.status().to_string();
    EXPECT_EQ(view->format, dev.kv_format());
    for (size_t s = 0; s < 2; ++s) {
      ASSERT_TRUE(pool.admit(static_cast<SeqId>(s), lens[s]).ok());
      k[s].resize(lens[s] * kv_heads * d);
      v[s].resize(lens[s] * kv_heads * d);
      for (float& x : k[s]) x = u(rng);
      for (size_t i = 0; i < v[s].size(); ++i) v[s][i] = 0.5f * u(rng) + static_cast<float>(i % d) / d;
      std::vector<int64_t> slots(lens[s]);
      ASSERT_TRUE(pool.slots(static_cast<SeqId>(s), 0, lens[s], slots).ok());
      const Status st = dev.write_kv(*view, TensorView(k[s].data(), DType::kF32, {lens[s], kv_heads, d}),
                                     TensorView(v[s].data(), DType::kF32, {lens[s], kv_heads, d}), slots);
      ASSERT_TRUE(st.ok()) << kvd << ": " << st.to_string();
    }
    const std::vector<SeqId> ids = {0, 1};
    std::vector<int32_t> tables(2 * 4), ctx = {300, 9}, qsl = {0, 1, 2};
    ASSERT_TRUE(pool.fill_block_tables(ids, 4, tables).ok());
    OwnedTensor q(DType::kBF16, {2, heads, d}), out(DType::kF32, {2, heads, d});
    testing::fill_uniform(q.view(), 9);
    const AttentionBatch batch{TensorView(tables.data(), DType::kI32, {2, 4}), TensorView(ctx.data(), DType::kI32, {2}),
                               TensorView(qsl.data(), DType::kI32, {3})};
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    const Status st = dev.attention(q.view(), *view, batch, scale, out.view());
    ASSERT_TRUE(st.ok()) << kvd << ": " << st.to_string();
    const std::vector<double> got = testing::to_doubles(out.view()), qd = testing::to_doubles(q.view());
    // Loose end-to-end tolerance per representation; the op's contract test holds the exact bounds.
    const double tol = dev.kv_format() == KvCacheFormat::kBf16 ? 1e-2 : (dev.kv_format() == KvCacheFormat::kInt8Fp16Scale ? 2e-2 : 8e-2);
    for (size_t s = 0; s < 2; ++s) {
      std::vector<double> qs(qd.begin() + s * heads * d, qd.begin() + (s + 1) * heads * d), ref;
      std::vector<double> kd(k[s].begin(), k[s].end()), vd(v[s].begin(), v[s].end());
      ref::attention(qs, 1, heads, kd, vd, lens[s], kv_heads, d, scale, ref);
      double err = 0, nrm = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        err += (got[s * heads * d + i] - ref[i]) * (got[s * heads * d + i] - ref[i]);
        nrm += ref[i] * ref[i];
      }
      EXPECT_LE(std::sqrt(err), tol * std::sqrt(nrm)) << kvd << " sequence " << s;
    }
    // Layer 0 was never written: its view is distinct memory.
    EXPECT_NE(dev.kv_layer_view(pool, {layers, kv_heads, d}, 0)->key_cache.data(), view->key_cache.data());
  }
}

// write_kv's chunked slot mapping in the generation's format stores exactly what one direct call of the
// representation's writer with that format stores.
TEST(DeviceOperatorAdapters, write_kv_equals_the_generations_writer) {
  TempDir empty;
  auto dev = DeviceOperator::create({"", "quantized", empty.path.string()}).value();
  const int64_t n = 600, heads = 2, d = 64;
  auto pool_a = KvPagePool::create(dev.kv_page_geometry({1, heads, d}), 6).value();
  auto pool_b = KvPagePool::create(dev.kv_page_geometry({1, heads, d}), 6).value();
  const ops::PagedKvCache a = dev.kv_layer_view(pool_a, {1, heads, d}, 0).value(),
                         b = dev.kv_layer_view(pool_b, {1, heads, d}, 0).value();
  // Unwritten slots hold whatever the allocation held: start both pools from the same bytes.
  for (const KvPagePool* p : {&pool_a, &pool_b}) {
    const KvLayerMemory m = p->layer(0);
    std::memset(m.key, 0, 6 * 128 * heads * p->geometry().row_bytes);
    std::memset(m.value, 0, 6 * 128 * heads * p->geometry().row_bytes);
    if (m.key_side) std::memset(m.key_side, 0, 6 * 128 * heads * 2);
    if (m.value_side) std::memset(m.value_side, 0, 6 * 128 * heads * 2);
  }
  OwnedTensor k(DType::kBF16, {n, heads, d}), v(DType::kBF16, {n, heads, d});
  testing::fill_uniform(k.view(), 1);
  testing::fill_uniform(v.view(), 2);
  std::vector<int64_t> slots(n);
  std::vector<int32_t> flat(n), pairs(2 * n);
  for (int64_t t = 0; t < n; ++t) {
    slots[t] = (t * 37) % (6 * 128);
    flat[t] = static_cast<int32_t>(slots[t]);
    pairs[2 * t] = static_cast<int32_t>(slots[t] / 128);
    pairs[2 * t + 1] = static_cast<int32_t>(slots[t] % 128);
  }
  ASSERT_TRUE(dev.write_kv(a, k.view(), v.view(), slots).ok());
  if (is910()) {
    ASSERT_TRUE(ops::int8_kv_write(k.view(), v.view(), TensorView(pairs.data(), DType::kI32, {n, 2}), b.key_cache,
                                   b.value_cache, b.key_scale_cache, b.value_scale_cache)
                    .ok());
  } else {
    ASSERT_TRUE(
        ops::fp8_kv_write(k.view(), v.view(), TensorView(flat.data(), DType::kI32, {n}), b.key_cache, b.value_cache).ok());
  }
  const int64_t bytes = 6 * 128 * heads * pool_a.geometry().row_bytes;
  EXPECT_EQ(0, std::memcmp(pool_a.layer(0).key, pool_b.layer(0).key, bytes));
  EXPECT_EQ(0, std::memcmp(pool_a.layer(0).value, pool_b.layer(0).value, bytes));
  if (pool_a.geometry().side_row_bytes > 0) {
    EXPECT_EQ(0, std::memcmp(pool_a.layer(0).key_side, pool_b.layer(0).key_side, 6 * 128 * heads * 2));
  }
}

TEST(DeviceOperatorAdapters, invalid_requests) {
  TempDir empty;
  auto dev = DeviceOperator::create({"", "quantized", empty.path.string()}).value();
  auto bf16_dev = DeviceOperator::create({"", "bf16", empty.path.string()}).value();
  auto pool = KvPagePool::create(dev.kv_page_geometry({1, 2, 64}), 2).value();
  const std::string q_row = is910() ? "64, side_row_bytes 2" : "68, side_row_bytes 0";
  EXPECT_EQ(bf16_dev.kv_layer_view(pool, {1, 2, 64}, 0).status().message(),
            "DeviceOperator: the pool's geometry (layers 1, kv heads 2, page_size 128, row_bytes " + q_row +
                ") is not the bf16 KV cache's for this model (layers 1, kv heads 2, page_size 128, row_bytes 128, "
                "side_row_bytes 0); size the pool with kv_page_geometry()");
  EXPECT_EQ(dev.kv_layer_view(pool, {1, 2, 128}, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dev.kv_layer_view(pool, {1, 2, 64}, 1).status().message(), "DeviceOperator: layer 1 is not in [0, 1)");
  const ops::PagedKvCache view = dev.kv_layer_view(pool, {1, 2, 64}, 0).value();
  OwnedTensor k(DType::kBF16, {2, 2, 64}), v(DType::kBF16, {2, 2, 64});
  const std::vector<int64_t> one = {0}, bad = {0, -4};
  EXPECT_EQ(dev.write_kv(view, k.view(), v.view(), one).message(),
            "DeviceOperator::write_kv: 1 slots for key of shape [2, 2, 64] and value of shape [2, 2, 64]; one slot "
            "per token");
  EXPECT_EQ(dev.write_kv(view, k.view(), v.view(), bad).message(),
            "DeviceOperator::write_kv: slot -4 of token 1 is not a valid slot");
  auto bf16_pool = KvPagePool::create(bf16_dev.kv_page_geometry({1, 2, 64}), 2).value();
  const ops::PagedKvCache bf16_view = bf16_dev.kv_layer_view(bf16_pool, {1, 2, 64}, 0).value();
  EXPECT_EQ(dev.write_kv(bf16_view, k.view(), v.view(), std::vector<int64_t>{0, 1}).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace genbridge::runtime
