// --weight-quant on DeepSeek-V4's FP8 + MXFP4 form (docs/quant_weights.md, "DeepSeek-V4"): what each quantized
// matrix holds, against the file's own codes and scales decoded here (e4m3 / e2m1 tabulated independently of
// core/formats, E8M0 as 2^(byte - 127)):
//  - an MXFP4 representation keeps the routed experts' codes, read in place, with the file's scales in the pair
//    layout; MXFP8 holds the FP8 linears' codes as they are, each block's scale repeated per 32 along K, and the
//    experts' e2m1 codes as the e4m3 codes of the same values: all exact;
//  - every other conversion (W8A8 anywhere, MXFP4 of the FP8 linears) equals the stable op applied to the values
//    decoded from the codes, W8A8 within half an int8 step of each value, and the measured error the weights line
//    prints is the error of those bits;
//  - --weight-quant auto resolves per generation: mxfp4 for the MXFP4 experts where the generation runs MXFP4, its
//    preferred representation (w8a8) where it does not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/deepseek_v4_quant.h"
#include "runtime/forward/quant_weights.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

using ops::WeightQuantScheme;

// e4m3fn and e2m1 values, tabulated from their definitions (not core/formats).
double e4m3(uint8_t code) {
  const int e = (code >> 3) & 0xF, m = code & 7;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (code & 0x80 ? -1.0 : 1.0) * ((code & 0x7F) == 0x7F ? NAN : mag);
}
double e2m1(uint8_t nibble) {
  static constexpr double kMagnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (nibble & 8 ? -1.0 : 1.0) * kMagnitude[nibble & 7];
}

// The file's value of rows [r0, r0 + N) of a weight (its FP8 or MXFP4 source), fp64 [N, K].
std::vector<double> source_values(const Checkpoint& ck, const TensorView& bound, int64_t r0, int64_t N) {
  const int64_t K = bound.dim(1);
  std::vector<double> v(static_cast<size_t>(N * K));
  if (const Checkpoint::Mxfp4Source* s = ck.mxfp4_source(bound)) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t byte = s->codes.data_as<const uint8_t>()[(r0 + n) * (K / 2) + k / 2];
        const int b = s->scales.data_as<const uint8_t>()[(r0 + n) * (K / 32) + k / 32];
        v[n * K + k] = std::ldexp(e2m1(k % 2 ? byte >> 4 : byte & 0xF), b - 127);
      }
    }
    return v;
  }
  const Checkpoint::Fp8Source* s = ck.fp8_source(bound);
  EXPECT_NE(s, nullptr);
  if (!s) return v;
  const int64_t bk = s->scale_inv.dim(1);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t si = ((r0 + n) / s->config.block_n) * bk + k / s->config.block_k;
      const int e = s->scale_inv.dtype() == DType::kE8M0 ? s->scale_inv.data_as<const uint8_t>()[si] - 127
                                                         : std::ilogb(s->scale_inv.data_as<const float>()[si]);
      v[n * K + k] = std::ldexp(e4m3(s->codes.data_as<const uint8_t>()[(r0 + n) * K + k]), e);
    }
  }
  return v;
}

// The values a quantized weight's matmul multiplies (quant_linear.h), fp64 [N, K].
std::vector<double> held_values(const ops::QuantWeight& q) {
  const int64_t N = q.data.dim(0), K = q.in_features;
  std::vector<double> v(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* d = q.data.data_as<const uint8_t>() + n * q.data.stride(0);
    for (int64_t k = 0; k < K; ++k) {
      double x = 0;
      if (q.scheme == WeightQuantScheme::kW8A8) {
        x = static_cast<double>(static_cast<int8_t>(d[k])) * q.scale.data_as<const float>()[n];
      } else {
        const int b = q.scale.data_as<const uint8_t>()[n * q.scale.stride(0) + k / 32];
        x = std::ldexp(
            q.scheme == WeightQuantScheme::kMxfp8 ? e4m3(d[k]) : e2m1(k % 2 ? d[k / 2] >> 4 : d[k / 2] & 0xF), b - 127);
      }
      v[n * K + k] = x;
    }
  }
  return v;
}

// What the stable op gives for fp32 values `v` [N, K] in q's scheme (data then scales, as QuantizedWeights lays
// them out).
std::vector<uint8_t> stable_op_bytes(const runtime::WeightQuantRepresentation& r, const std::vector<double>& v,
                                     int64_t N, int64_t K) {
  std::vector<float> f(v.begin(), v.end());
  const int64_t cols = r.weight_element == DType::kFp4E2M1x2 ? K / 2 : K;
  std::vector<uint8_t> bytes(static_cast<size_t>(runtime::quant_weight_bytes(r, N, K)));
  ops::QuantWeight q{r.scheme, TensorView(bytes.data(), r.weight_element, {N, cols}), TensorView(), K};
  q.scale = r.granularity == runtime::WeightScaleGranularity::kPerOutputChannel
                ? TensorView(bytes.data() + N * cols, r.scale_dtype, {N})
                : TensorView(bytes.data() + N * cols, r.scale_dtype, {N, ops::mx_scale_pairs_of(K), 2});
  EXPECT_TRUE(ops::quantize_weight(TensorView(f.data(), DType::kF32, {N, K}), q).ok());
  return bytes;
}
std::vector<uint8_t> held_bytes(const ops::QuantWeight& q) {
  const auto n = [](const TensorView& t) { return static_cast<size_t>(t.numel()) * dtype_size(t.dtype()); };
  std::vector<uint8_t> b(n(q.data) + n(q.scale));
  std::memcpy(b.data(), q.data.data(), n(q.data));
  std::memcpy(b.data() + n(q.data), q.scale.data(), n(q.scale));
  return b;
}

// A quantized matrix with the rows of the bound weight it was made from.
struct Matrix {
  std::string name;
  const TensorView* bound;
  int64_t row_begin;
  const ops::QuantWeight* q;
  bool expert;  // a routed expert (MXFP4 in the file with expert_dtype "fp4")
};
std::vector<Matrix> matrices(const Checkpoint& ck, const QuantizedWeights& q) {
  std::vector<Matrix> out;
  const int64_t lr = ck.config().dsv4.o_lora_rank;
  for (int64_t l = 0; l < ck.config().num_hidden_layers; ++l) {
    const LayerWeights& lw = ck.weights().layers[static_cast<size_t>(l)];
    const QuantizedWeights::Layer& ql = q.layer(l);
    const std::string at = "layers." + std::to_string(l) + ".";
    if (ql.v4) {
      out.push_back({at + "attn.wq_a", &lw.v4.wq_a, 0, &ql.wq_a, false});
      out.push_back({at + "attn.wq_b", &lw.v4.wq_b, 0, &ql.wq_b, false});
      out.push_back({at + "attn.wkv", &lw.v4.wkv, 0, &ql.wkv, false});
      for (size_t g = 0; g < ql.wo_a.size(); ++g) {
        out.push_back({at + "attn.wo_a group " + std::to_string(g), &lw.v4.wo_a, static_cast<int64_t>(g) * lr,
                       &ql.wo_a[g], false});
      }
      out.push_back({at + "attn.wo_b", &lw.v4.wo_b, 0, &ql.wo_b, false});
    }
    if (ql.shared) {
      const MlpWeights& m = lw.moe.shared_expert;
      out.push_back({at + "ffn.shared_experts.w1", &m.gate_proj, 0, &ql.shared_expert.w_gate, false});
      out.push_back({at + "ffn.shared_experts.w3", &m.up_proj, 0, &ql.shared_expert.w_up, false});
      out.push_back({at + "ffn.shared_experts.w2", &m.down_proj, 0, &ql.shared_expert.w_down, false});
    }
    for (size_t e = 0; e < ql.experts.size(); ++e) {
      const MlpWeights& m = lw.moe.experts[e];
      const std::string ex = at + "ffn.experts." + std::to_string(e);
      out.push_back({ex + ".w1", &m.gate_proj, 0, &ql.experts[e].w_gate, true});
      out.push_back({ex + ".w3", &m.up_proj, 0, &ql.experts[e].w_up, true});
      out.push_back({ex + ".w2", &m.down_proj, 0, &ql.experts[e].w_down, true});
    }
  }
  return out;
}

// tiny-dsv4 (seed 4) in DeepSeek's FP8 + MXFP4 form (V4-Flash's) and with FP8 experts (V4-Flash-Base's).
class DeepseekV4QuantWeights : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    for (const auto& [name, experts] : {std::pair{"fp4", V4ExpertDtype::kFp4}, std::pair{"fp8", V4ExpertDtype::kFp8}}) {
      ASSERT_TRUE(write_synthetic_checkpoint("tiny-dsv4", 4, *dir_ / name).ok());
      const Status s = convert_checkpoint_to_deepseek_v4_fp8(*dir_ / name, experts);
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static Checkpoint open(const char* form) { return Checkpoint::open(*dir_ / form).value(); }
  static const runtime::WeightQuantContract& contract() {
    static const runtime::DeviceOperator dev = runtime::DeviceOperator::create({}).value();
    return dev.contract().weight_quant;
  }
  static testing::TempDir* dir_;
};
testing::TempDir* DeepseekV4QuantWeights::dir_ = nullptr;

TEST_F(DeepseekV4QuantWeights, auto_keeps_mxfp4_experts_where_the_generation_runs_mxfp4) {
  runtime::DeviceConfig dc;
  dc.weight_quant = "auto";
  const runtime::DeviceOperator dev = runtime::DeviceOperator::create(dc).value();
  const runtime::WeightQuantRepresentation* mxfp4 = contract().find(WeightQuantScheme::kMxfp4);
  EXPECT_EQ(dev.weight_quant(), contract().find(contract().preferred));
  EXPECT_EQ(dev.mxfp4_weight_quant(), mxfp4 ? mxfp4 : dev.weight_quant());
  if (mxfp4) {
    EXPECT_NE(dev.log_line().find("; a checkpoint's MXFP4 weights: mxfp4, their own codes"), std::string::npos)
        << dev.log_line();
  } else {
    EXPECT_EQ(dev.mxfp4_weight_quant()->scheme, WeightQuantScheme::kW8A8);
    EXPECT_EQ(dev.log_line().find("MXFP4 weights"), std::string::npos) << dev.log_line();
  }
  // A scheme asked by name applies to every quantized weight, the MXFP4 ones included; none quantizes nothing.
  for (int i = 0; i < contract().num_offered; ++i) {
    dc.weight_quant = ops::weight_quant_scheme_name(contract().offered[i].scheme);
    const runtime::DeviceOperator named = runtime::DeviceOperator::create(dc).value();
    EXPECT_EQ(named.mxfp4_weight_quant(), named.weight_quant()) << dc.weight_quant;
  }
  dc.weight_quant = "none";
  EXPECT_EQ(runtime::DeviceOperator::create(dc).value().mxfp4_weight_quant(), nullptr);
}

// Where the generation runs MXFP4: the experts' QuantWeight is the file's codes (the same bytes, read in place)
// and E8M0 scales (in the pair layout, the odd count's padding byte 0), with MXFP8 or MXFP4 for the rest.
TEST_F(DeepseekV4QuantWeights, native_mxfp4_experts_hold_the_files_codes_and_scales) {
  const runtime::WeightQuantRepresentation* mxfp4 = contract().find(WeightQuantScheme::kMxfp4);
  if (!mxfp4) GTEST_SKIP() << "the generation has no MXFP4 data path: its experts convert (w8a8_* below)";
  const Checkpoint ck = open("fp4");
  for (const runtime::WeightQuantRepresentation* main : {contract().find(contract().preferred), mxfp4}) {
    SCOPED_TRACE(std::string(ops::weight_quant_scheme_name(main->scheme)));
    QuantizeOptions o;
    o.mxfp4_repr = mxfp4;
    auto q = QuantizedWeights::quantize(ck, *main, contract().layers, o);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    int experts = 0;
    for (const Matrix& m : matrices(ck, **q)) {
      if (!m.expert) continue;
      const Checkpoint::Mxfp4Source* s = ck.mxfp4_source(*m.bound);
      ASSERT_NE(s, nullptr) << m.name;
      ASSERT_EQ(m.q->scheme, WeightQuantScheme::kMxfp4) << m.name;
      EXPECT_EQ(m.q->data.data(), s->codes.data()) << m.name << ": the codes are not read in place";
      ASSERT_EQ(m.q->data.numel(), s->codes.numel());
      EXPECT_EQ(std::memcmp(m.q->data.data(), s->codes.data(), static_cast<size_t>(s->codes.numel())), 0) << m.name;
      const int64_t N = s->scales.dim(0), blocks = s->scales.dim(1), pairs = ops::mx_scale_pairs_of(m.q->in_features);
      ASSERT_EQ(m.q->scale.dim(1), pairs);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t j = 0; j < 2 * pairs; ++j) {
          const uint8_t want = j < blocks ? s->scales.data_as<const uint8_t>()[n * blocks + j] : 0;
          ASSERT_EQ(m.q->scale.data_as<const uint8_t>()[n * 2 * pairs + j], want)
              << m.name << " [" << n << ", " << j << "]";
        }
      }
      ++experts;
    }
    const ModelConfig& c = ck.config();
    EXPECT_EQ(experts, 3 * c.num_experts * c.num_hidden_layers);
    EXPECT_EQ((*q)->from_mxfp4().kept, experts);
    EXPECT_EQ((*q)->from_mxfp4().requantized, 0);
    EXPECT_NE((*q)->describe().find("MXFP4 blocks (" + std::to_string(experts) + " matrices, "), std::string::npos)
        << (*q)->describe();
    EXPECT_NE((*q)->describe().find(": " + std::to_string(experts) +
                                    " exactly (the file's codes, read in place, and scales)"),
              std::string::npos)
        << (*q)->describe();
  }
}

// Where the generation runs MXFP8: the FP8 128 x 128-block linears hold the file's e4m3 codes, each block's E8M0
// scale repeated per 32 along K (wo_a's groups: their rows of it), and the MXFP4 experts the e4m3 codes of their
// values under the same scales; so every held value is the file's. The FP8 experts of the V4-Flash-Base form (F32
// power-of-two scales) likewise.
TEST_F(DeepseekV4QuantWeights, mxfp8_holds_the_fp8_codes_and_every_value_exactly) {
  const runtime::WeightQuantRepresentation* mxfp8 = contract().find(WeightQuantScheme::kMxfp8);
  if (!mxfp8) GTEST_SKIP() << "the generation has no MXFP8 data path";
  for (const char* form : {"fp4", "fp8"}) {
    SCOPED_TRACE(form);
    const Checkpoint ck = open(form);
    auto q = QuantizedWeights::quantize(ck, *mxfp8, contract().layers);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    int fp8 = 0;
    for (const Matrix& m : matrices(ck, **q)) {
      const int64_t N = m.q->data.dim(0), K = m.q->in_features;
      ASSERT_EQ(m.q->scheme, WeightQuantScheme::kMxfp8);
      EXPECT_EQ(held_values(*m.q), source_values(ck, *m.bound, m.row_begin, N)) << m.name;
      const Checkpoint::Fp8Source* s = ck.fp8_source(*m.bound);
      if (!s) continue;
      ++fp8;
      EXPECT_EQ(std::memcmp(m.q->data.data(), s->codes.data_as<const uint8_t>() + m.row_begin * K,
                            static_cast<size_t>(N * K)),
                0)
          << m.name << ": not the file's codes";
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t j = 0; j * 32 < K; ++j) {
          const int64_t si = ((m.row_begin + n) / 128) * s->scale_inv.dim(1) + j * 32 / 128;
          const int want = s->scale_inv.dtype() == DType::kE8M0
                               ? s->scale_inv.data_as<const uint8_t>()[si]
                               : std::ilogb(s->scale_inv.data_as<const float>()[si]) + 127;
          ASSERT_EQ(m.q->scale.data_as<const uint8_t>()[n * m.q->scale.stride(0) + j], want)
              << m.name << " [" << n << ", " << j << "]";
        }
      }
    }
    EXPECT_EQ((*q)->from_fp8().kept, fp8);
    EXPECT_EQ((*q)->from_fp8().requantized, 0);
    EXPECT_EQ((*q)->from_mxfp4().requantized, 0);
    EXPECT_EQ((*q)->from_mxfp4().reencoded, (*q)->from_mxfp4().matrices);
  }
}

// Every conversion that cannot keep the values (W8A8; MXFP4 of the FP8 linears) equals the stable op on the values
// decoded from the file's codes (not the bf16 copy: they are equal here, the dequantization being exact, but the
// conversion reads the codes), and the relative RMS error the weights line prints is that of the held values.
// W8A8: every value within half an int8 step of its row's scale.
TEST_F(DeepseekV4QuantWeights, requantized_matrices_are_the_stable_op_on_the_decoded_codes) {
  int checked = 0;
  for (int i = 0; i < contract().num_offered; ++i) {
    const runtime::WeightQuantRepresentation& r = contract().offered[i];
    if (r.scheme == WeightQuantScheme::kMxfp8) continue;  // exact (above)
    SCOPED_TRACE(std::string(ops::weight_quant_scheme_name(r.scheme)));
    const Checkpoint ck = open("fp4");
    auto q = QuantizedWeights::quantize(ck, r, contract().layers);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    double err2[2] = {0, 0}, ref2[2] = {0, 0};
    for (const Matrix& m : matrices(ck, **q)) {
      if (m.expert && r.scheme == WeightQuantScheme::kMxfp4) continue;  // kept (above)
      const int64_t N = m.q->data.dim(0), K = m.q->in_features;
      const std::vector<double> v = source_values(ck, *m.bound, m.row_begin, N);
      EXPECT_EQ(held_bytes(*m.q), stable_op_bytes(r, v, N, K)) << m.name;
      const std::vector<double> h = held_values(*m.q);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k) {
          const double d = h[n * K + k] - v[n * K + k];
          err2[m.expert] += d * d;
          ref2[m.expert] += v[n * K + k] * v[n * K + k];
          if (r.scheme == WeightQuantScheme::kW8A8) {
            ASSERT_LE(std::fabs(d), 0.5 * m.q->scale.data_as<const float>()[n] * (1 + 1e-6)) << m.name;
          }
        }
      }
      ++checked;
    }
    // (QuantizedWeights decodes the held values in fp32, this test in fp64.)
    EXPECT_NEAR((*q)->from_fp8().rel_rms_error(), std::sqrt(err2[0] / ref2[0]), 1e-5 * std::sqrt(err2[0] / ref2[0]));
    EXPECT_GT((*q)->from_fp8().rel_rms_error(), 0);
    EXPECT_EQ((*q)->from_fp8().requantized, (*q)->from_fp8().matrices);
    if (r.scheme == WeightQuantScheme::kW8A8) {
      EXPECT_NEAR((*q)->from_mxfp4().rel_rms_error(), std::sqrt(err2[1] / ref2[1]),
                  1e-5 * std::sqrt(err2[1] / ref2[1]));
      EXPECT_EQ((*q)->from_mxfp4().requantized, (*q)->from_mxfp4().matrices);
      // The line a run prints, with the bytes and the measured error.
      const std::string d = (*q)->describe();
      EXPECT_NE(d.find("the checkpoint's MXFP4 blocks (96 matrices, 0.4 MiB in the file) -> w8a8, 0.8 MiB: 96 "
                       "requantized from the decoded values (relative RMS error "),
                std::string::npos)
          << d;
      EXPECT_NE(d.find("the checkpoint's FP8 blocks (36 matrices, "), std::string::npos) << d;
      std::printf("tiny-dsv4 FP8 + MXFP4 form -> w8a8: relative RMS error FP8 linears %.4f%%, MXFP4 experts %.4f%%\n",
                  100 * (*q)->from_fp8().rel_rms_error(), 100 * (*q)->from_mxfp4().rel_rms_error());
    } else {
      std::printf("tiny-dsv4 FP8 linears -> mxfp4: relative RMS error %.4f%%\n",
                  100 * (*q)->from_fp8().rel_rms_error());
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace genbridge::model
