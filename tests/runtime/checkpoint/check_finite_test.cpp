// Checkpoint::check_finite (the CLI's --check-weights): every bound weight is read; the first NaN / +Inf /
// -Inf in binding order is named with its file, tensor, flat index and value, for BF16, F16 and F32 files
// and for values that only become infinite when converted to bf16. The answer does not depend on the
// number of threads.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <functional>

#include "genbridge/core/formats.h"
#include "genbridge/core/threading.h"
#include "runtime/checkpoint/checkpoint.h"
#include "support/checkpoint_edit.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

using testing::TempDir;

using testing::RawTensor;
using testing::rewrite;

// Sets element `i` of tensor `name` to the bit pattern `bits` (of the tensor's element width).
void poke(std::vector<RawTensor>& tensors, const std::string& name, int64_t i, uint32_t bits) {
  for (RawTensor& t : tensors) {
    if (t.spec.name != name) continue;
    const size_t w = dtype_size(t.spec.dtype);
    ASSERT_LE((static_cast<size_t>(i) + 1) * w, t.bytes.size());
    if (w == 4) {
      std::memcpy(t.bytes.data() + i * 4, &bits, 4);
    } else {
      const uint16_t b = static_cast<uint16_t>(bits);
      std::memcpy(t.bytes.data() + i * 2, &b, 2);
    }
    return;
  }
  ADD_FAILURE() << "no tensor " << name;
}

std::string check_error(const std::filesystem::path& dir, const LoadOptions& options = {}) {
  Result<Checkpoint> ck = Checkpoint::open(dir, options);
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();  // opening does not scan
  if (!ck.ok()) return "open failed";
  const Status st = ck->check_finite();
  if (st.ok()) return "";
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  return st.message();
}

class CheckFinite : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(write_synthetic_checkpoint("tiny", 11, dir_.path()).ok()); }
  std::string file() const { return (dir_ / "model.safetensors").string(); }
  TempDir dir_;
};

TEST_F(CheckFinite, clean_checkpoint_passes_and_reports_the_scan) {
  const Checkpoint ck = Checkpoint::open(dir_.path()).value();
  WeightScan scan;
  const Status st = ck.check_finite(&scan);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(scan.bytes, model_weight_bytes(ck.config()));
  // tiny: embedding, final norm, LM head; per layer 2 norms + q/k/v/o + q/k norms, then 3 MoE layers with
  // router, 8 experts x 3, shared expert x 3 + its gate, and one dense layer x 3.
  EXPECT_EQ(scan.tensors, 3 + 4 * 8 + 3 * (1 + 8 * 3 + 3 + 1) + 3);
  EXPECT_GE(scan.seconds, 0.0);
}

TEST_F(CheckFinite, inf_in_lm_head_is_named) {
  rewrite(dir_.path(), [](std::vector<RawTensor>& t) { poke(t, "lm_head.weight", 60000, 0x7f80); });
  EXPECT_EQ(check_error(dir_.path()),
            file() +
                ": tensor 'lm_head.weight' holds +Inf at flat index 60000 (index [468, 96] of shape [512, 128]); "
                "every weight must be finite");
}

TEST_F(CheckFinite, the_first_in_binding_order_is_named) {
  // Binding order: embedding, layer 0..3 (norms, q/k/v/o, q/k norms, router, experts, shared expert), final
  // norm, LM head.
  rewrite(dir_.path(), [](std::vector<RawTensor>& t) {
    poke(t, "lm_head.weight", 5, 0x7fc0);
    poke(t, "model.layers.2.mlp.experts.3.up_proj.weight", 100, 0xff80);
    poke(t, "model.layers.2.self_attn.k_norm.weight", 7, 0xffc1);  // a NaN with the sign bit set
  });
  EXPECT_EQ(check_error(dir_.path()), file() +
                                          ": tensor 'model.layers.2.self_attn.k_norm.weight' holds NaN at flat index 7 "
                                          "(index [7] of shape [64]); every weight must be finite");
  rewrite(dir_.path(), [](std::vector<RawTensor>& t) { poke(t, "model.layers.2.self_attn.k_norm.weight", 7, 0x3f80); });
  EXPECT_EQ(check_error(dir_.path()), file() +
                                          ": tensor 'model.layers.2.mlp.experts.3.up_proj.weight' holds -Inf at flat "
                                          "index 100 (index [0, 100] of shape [64, 128]); every weight must be finite");
}

TEST_F(CheckFinite, every_dtype_and_kind_of_value) {
  struct Case {
    DType dtype;
    uint32_t bits;
    const char* expect;  // nullptr: finite
  };
  const Case cases[] = {
      {DType::kBF16, 0x7f80, "+Inf"},      {DType::kBF16, 0xff80, "-Inf"},      {DType::kBF16, 0x7f81, "NaN"},
      {DType::kBF16, 0xffff, "NaN"},       {DType::kBF16, 0x7f7f, nullptr},     {DType::kBF16, 0x8001, nullptr},
      {DType::kF16, 0x7c00, "+Inf"},       {DType::kF16, 0xfc00, "-Inf"},       {DType::kF16, 0x7e00, "NaN"},
      {DType::kF16, 0x7bff, nullptr},      {DType::kF16, 0x8000, nullptr},      {DType::kF32, 0x7f800000u, "+Inf"},
      {DType::kF32, 0xff800000u, "-Inf"},  {DType::kF32, 0x7f800001u, "NaN"},   {DType::kF32, 0xffc00000u, "NaN"},
      {DType::kF32, 0x7f7fffffu, nullptr}, {DType::kF32, 0x00000001u, nullptr},
  };
  const ModelConfig cfg = synthetic_preset_config("tiny").value();
  for (const DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    TempDir dir;
    ASSERT_TRUE(write_synthetic_checkpoint(cfg, 12, dir.path(), 1, dt).ok());
    for (const Case& c : cases) {
      if (c.dtype != dt) continue;
      rewrite(dir.path(), [&](std::vector<RawTensor>& t) { poke(t, "model.norm.weight", 77, c.bits); });
      // kNative reads the file's own dtype.
      const std::string got = check_error(dir.path(), {.precision = WeightPrecision::kNative});
      if (!c.expect) {
        EXPECT_EQ(got, "") << dtype_name(dt) << " " << c.bits;
      } else {
        EXPECT_EQ(got, (dir / "model.safetensors").string() + ": tensor 'model.norm.weight' holds " + c.expect +
                           " at flat index 77 (index [77] of shape [128]); every weight must be finite")
            << dtype_name(dt) << " " << c.bits;
      }
    }
  }
}

TEST_F(CheckFinite, f32_value_beyond_bf16_range_is_named_after_conversion) {
  const ModelConfig cfg = synthetic_preset_config("tiny").value();
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint(cfg, 13, dir.path(), 1, DType::kF32).ok());
  rewrite(dir.path(), [](std::vector<RawTensor>& t) {
    poke(t, "model.layers.1.mlp.down_proj.weight", 9, std::bit_cast<uint32_t>(-3.4e38f));
  });
  EXPECT_EQ(check_error(dir.path(), {.precision = WeightPrecision::kNative}), "");  // finite in the file
  EXPECT_EQ(check_error(dir.path()),
            (dir / "model.safetensors").string() +
                ": tensor 'model.layers.1.mlp.down_proj.weight' holds -Inf at flat index 9 (index [0, 9] of shape "
                "[128, 256]) after conversion to bf16 (the file holds F32 -3.4e+38, beyond bf16's range); every "
                "weight must be finite");
}

TEST_F(CheckFinite, answer_does_not_depend_on_the_thread_count) {
  // The embedding has 65536 elements: two scan chunks. Non-finite values in both, and later in the LM head.
  rewrite(dir_.path(), [](std::vector<RawTensor>& t) {
    poke(t, "model.embed_tokens.weight", 32768, 0xff80);  // first element of the second chunk
    poke(t, "model.embed_tokens.weight", 65535, 0x7fc0);
    poke(t, "lm_head.weight", 0, 0x7f80);
  });
  const std::string want = file() +
                           ": tensor 'model.embed_tokens.weight' holds -Inf at flat index 32768 (index [256, 0] of "
                           "shape [512, 128]); every weight must be finite";
  const Checkpoint ck = Checkpoint::open(dir_.path()).value();
  for (const int threads : {1, 2, 3}) {
    set_num_threads(threads);
    EXPECT_EQ(ck.check_finite().message(), want) << threads;
  }
  set_num_threads(0);
}

}  // namespace
}  // namespace genbridge::model
