// docs/design.md#provider-staging: a generation-specific operator another generation cannot run has an explicit
// unsupported provider there, and the DeviceOperator never routes work to it. For Ascend910 (A2/A3, no FP8 data path):
// every KV representation its DeviceOperator offers is served by supported writers and readers, and an fp8 request is
// refused at start-up, before any operator is called.
#include <gtest/gtest.h>

#include <filesystem>

#include "genbridge/build_info.h"
#include "genbridge/ops/attention/paged_decode.h"
#include "genbridge/ops/kv_cache/fp8_kv_write.h"
#include "runtime/device/device_operator.h"
#include "support/tensor_util.h"

namespace genbridge::runtime {
namespace {

using ops::KvCacheFormat;
using testing::OwnedTensor;

bool is910_build() { return ops::build_target() == "Ascend910"; }

// Everything an operator could put in kv_cache_dtype, valid or not.
const std::vector<std::string>& kv_cache_dtype_candidates() {
  static const std::vector<std::string> v = {"auto", "bf16", "quantized", "int8", "fp8", "fp8_e4m3fn", "fp16", ""};
  return v;
}

// Pure contract facts, checked in every build: whatever kv_cache_dtype says, the Ascend910 contract only
// ever yields representations whose writer and reader Ascend910 implements (bf16, int8 + fp16 scale),
// and its slot-mapping format is the one its int8 writer takes.
TEST(Ascend910Routing, every_offered_representation_has_supported_providers) {
  const GenerationContract& c = contract_for(Generation::kAscend910);
  int offered = 0;
  for (const std::string& v : kv_cache_dtype_candidates()) {
    auto f = resolve_kv_cache_dtype(c, v);
    if (!f.ok()) continue;
    ++offered;
    EXPECT_NE(*f, KvCacheFormat::kFp8Fp32PackedScale) << "kv_cache_dtype=" << v;
  }
  EXPECT_EQ(offered, 4);  // auto, bf16, quantized, int8
  EXPECT_EQ(c.quantized_kv, KvCacheFormat::kInt8Fp16Scale);
  EXPECT_EQ(c.slot_mapping, ops::SlotMapping::kBlockOffsetPairs);
  for (const char* fp8 : {"fp8", "fp8_e4m3fn"}) {
    EXPECT_EQ(resolve_kv_cache_dtype(c, fp8).status().code(), StatusCode::kInvalidArgument) << fp8;
  }
}

struct EmptyPath {
  std::filesystem::path path;
  EmptyPath() {
    char tmpl[] = "/tmp/gb_route_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~EmptyPath() { std::filesystem::remove_all(path); }
};

// In the Ascend910 build: the unsupported providers exist and answer Unimplemented, an fp8 request
// never yields a DeviceOperator (so no operator can be reached), and every representation it does offer
// runs through its adapters without touching them.
TEST(Ascend910Routing, fp8_refused_at_startup_and_offered_representations_run) {
  if (!is910_build()) {
    GTEST_SKIP() << "runs in the Ascend910 build; this build targets " << ops::build_target();
  }
  EmptyPath empty;
  // 1. The explicit unsupported providers.
  OwnedTensor k(DType::kBF16, {1, 1, 64}), v(DType::kBF16, {1, 1, 64}), kc(DType::kU8, {1, 1, 128, 68}),
      vc(DType::kU8, {1, 1, 128, 68});
  std::vector<int32_t> slot = {0};
  EXPECT_EQ(ops::fp8_kv_write(k.view(), v.view(), TensorView(slot.data(), DType::kI32, {1}), kc.view(), vc.view()).code(),
            StatusCode::kUnimplemented);
  ops::PagedKvCache fp8{KvCacheFormat::kFp8Fp32PackedScale, kc.view(), vc.view(), {}, {}};
  OwnedTensor q(DType::kBF16, {1, 1, 64}), o(DType::kF32, {1, 1, 64});
  std::vector<int32_t> bt = {0}, cl = {1}, qsl = {0, 1};
  EXPECT_EQ(ops::paged_decode(q.view(), fp8, TensorView(bt.data(), DType::kI32, {1, 1}),
                              TensorView(cl.data(), DType::kI32, {1}), TensorView(qsl.data(), DType::kI32, {2}), 1.f,
                              o.view())
                .code(),
            StatusCode::kUnimplemented);
  // 2. fp8 is refused by create(): there is no DeviceOperator to call an operator through.
  for (const char* req : {"fp8", "fp8_e4m3fn"}) {
    auto dev = DeviceOperator::create({"", req, empty.path.string()});
    ASSERT_FALSE(dev.ok()) << req;
    EXPECT_EQ(dev.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(dev.status().message(),
              resolve_kv_cache_dtype(contract_for(Generation::kAscend910), req).status().message());
  }
  // 3. Every offered representation writes and attends through its providers successfully.
  for (const std::string& req : kv_cache_dtype_candidates()) {
    auto dev = DeviceOperator::create({"", req, empty.path.string()});
    if (!dev.ok()) continue;
    EXPECT_NE(dev->kv_format(), KvCacheFormat::kFp8Fp32PackedScale);
    const KvModelShape shape{1, 1, 64};
    auto pool = KvPagePool::create(dev->kv_page_geometry(shape), 2).value();
    ASSERT_TRUE(pool.admit(1, 3).ok());
    std::vector<int64_t> slots(3);
    ASSERT_TRUE(pool.slots(1, 0, 3, slots).ok());
    const ops::PagedKvCache view = dev->kv_layer_view(pool, shape, 0).value();
    OwnedTensor kk(DType::kBF16, {3, 1, 64}), vv(DType::kBF16, {3, 1, 64}), qq(DType::kBF16, {1, 2, 64}),
        out(DType::kF32, {1, 2, 64});
    testing::fill_uniform(kk.view(), 1);
    testing::fill_uniform(vv.view(), 2);
    testing::fill_uniform(qq.view(), 3);
    const Status w = dev->write_kv(view, kk.view(), vv.view(), slots);
    EXPECT_TRUE(w.ok()) << req << ": " << w.to_string();
    std::vector<int32_t> table(2), ctx = {3}, loc = {0, 1};
    const std::vector<SeqId> ids = {1};
    ASSERT_TRUE(pool.fill_block_tables(ids, 2, table).ok());
    const Status a = dev->attention(qq.view(), view,
                                    {TensorView(table.data(), DType::kI32, {1, 2}), TensorView(ctx.data(), DType::kI32, {1}),
                                     TensorView(loc.data(), DType::kI32, {2})},
                                    0.125f, out.view());
    EXPECT_TRUE(a.ok()) << req << ": " << a.to_string();
  }
}

}  // namespace
}  // namespace genbridge::runtime
