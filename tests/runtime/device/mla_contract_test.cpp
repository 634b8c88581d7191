// The DeviceOperator's MLA + DSA contract: the per-generation data, the pool geometry of MLA
// and indexer rows, the adapters (write_mla_kv, write_indexer_keys, mla_attention, index_topk,
// sparse_attention) through a real pool, and the load-time dimension checks.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "genbridge/build_info.h"
#include "genbridge/ops/attention/lightning_indexer.h"
#include "genbridge/ops/attention/sparse_mla_decode.h"
#include "runtime/device/device_operator.h"

namespace genbridge::runtime {
namespace {

bool is910() { return ops::build_target() == "Ascend910"; }

DeviceOperator make(const std::string& kv_cache_dtype) {
  // An empty PATH directory: no npu-smi, nothing detected.
  static const std::filesystem::path empty = std::filesystem::temp_directory_path() / "gb_mla_contract_empty_path";
  std::filesystem::create_directories(empty);
  return DeviceOperator::create({"", kv_cache_dtype, empty.string()}).value();
}

TEST(MlaContract, per_generation_data) {
  const GenerationContract& a = contract_for(Generation::kAscend910);
  EXPECT_EQ(a.quantized_mla_kv, ops::MlaKvFormat::kInt8Fp16ScaleSplitRope);
  EXPECT_EQ(a.indexer_keys, ops::IndexerKeyFormat::kBf16);
  EXPECT_EQ(a.topk_indices, ops::TopkIndexFormat::kSequencePositions);
  const GenerationContract& b = contract_for(Generation::kAscend950);
  EXPECT_EQ(b.quantized_mla_kv, ops::MlaKvFormat::kFp8TileScalePacked);
  EXPECT_EQ(b.indexer_keys, ops::IndexerKeyFormat::kFp8HadamardPackedScale);
  EXPECT_EQ(b.topk_indices, ops::TopkIndexFormat::kFlatKvSlots);
}

// Bytes per token and layer the pool reserves at DeepSeek's dimensions, for each kv_cache_dtype.
TEST(MlaContract, pool_geometry_bytes_per_token) {
  const KvModelShape shape{3, 0, 0, 512, 64, 128};
  const int64_t idx = is910() ? 256 : 132;
  const DeviceOperator bf16 = make("bf16"), quant = make("quantized");
  EXPECT_EQ(bf16.mla_kv_format(), ops::MlaKvFormat::kBf16);
  EXPECT_EQ(bf16.kv_page_geometry(shape).bytes_per_token_per_layer(), 1152 + idx);
  EXPECT_EQ(quant.kv_page_geometry(shape).bytes_per_token_per_layer(), (is910() ? 642 : 656) + idx);
  EXPECT_EQ(quant.kv_page_geometry(shape).bytes_per_token(), 3 * ((is910() ? 642 : 656) + idx));
  // A V3 model (no indexer): MLA rows only.
  EXPECT_EQ(bf16.kv_page_geometry({3, 0, 0, 512, 64, 0}).bytes_per_token_per_layer(), 1152);
  auto pool = KvPagePool::create(quant.kv_page_geometry(shape), 2).value();
  EXPECT_EQ(pool.total_bytes(), 2 * 128 * 3 * ((is910() ? 642 : 656) + idx));
  auto mla = quant.mla_layer_view(pool, shape, 2);
  ASSERT_TRUE(mla.ok()) << mla.status().to_string();
  EXPECT_EQ(mla->format, quant.contract().quantized_mla_kv);
  EXPECT_EQ(mla->kv_cache.dim(0), 2);
  EXPECT_EQ(mla->kv_cache.dim(1), 128);
  auto keys = quant.indexer_layer_view(pool, shape, 0);
  ASSERT_TRUE(keys.ok()) << keys.status().to_string();
  EXPECT_EQ(keys->format, quant.indexer_key_format());
  EXPECT_EQ(quant.kv_layer_view(pool, shape, 0).status().message(),
            "DeviceOperator::kv_layer_view: the model keeps MLA latent rows (kv_lora_rank > 0), not K/V rows; use "
            "mla_layer_view()");
  EXPECT_EQ(quant.mla_layer_view(pool, shape, 3).status().message(), "DeviceOperator: layer 3 is not in [0, 3)");
}

TEST(MlaContract, load_time_dimension_checks_name_the_key) {
  const DeviceOperator quant = make("quantized"), bf16 = make("bf16");
  const Status latent = quant.check_kv_shape({1, 0, 0, 100, 64, 0});
  const Status index = quant.check_kv_shape({1, 0, 0, 512, 64, 96});
  if (is910()) {
    EXPECT_TRUE(latent.ok()) << latent.to_string();
    EXPECT_TRUE(index.ok()) << index.to_string();
  } else {
    EXPECT_EQ(
        latent.message(),
        "kv_lora_rank=100 is not a multiple of 128, which the fp8_e4m3fn latent+fp32 scale per 128+bf16 rope, "
        "packed MLA KV cache requires (one scale per tile of 128 latent elements) (Ascend950 (A5), kv_cache_dtype "
        "resolved to fp8_e4m3fn latent+fp32 scale per 128+bf16 rope, packed); use kv_cache_dtype=bf16");
    EXPECT_EQ(index.message(),
              "index_head_dim=96 is not a power of two, which the fp8_e4m3fn (Hadamard-rotated)+packed fp32 scale "
              "indexer key cache requires (Walsh-Hadamard rotation) (Ascend950 (A5))");
  }
  EXPECT_TRUE(bf16.check_kv_shape({1, 0, 0, 100, 64, 0}).ok());
}

// Through a real pool: the indexer's selection in the generation's contract, handed unchanged to
// sparse_attention, gives mla_attention's bits when index_topk >= context, and the direct op's result
// over the same positions otherwise.
TEST(MlaContract, adapters_through_the_pool) {
  const int64_t L = 128, R = 32, D = 64, heads = 4, iheads = 2;
  const KvModelShape shape{1, 0, 0, L, R, D};
  for (const std::string& kvd : {"bf16", "quantized"}) {
    SCOPED_TRACE(kvd);
    const DeviceOperator dev = make(kvd);
    ASSERT_TRUE(dev.check_kv_shape(shape).ok());
    auto pool = KvPagePool::create(dev.kv_page_geometry(shape), 6).value();
    const ops::MlaKvCache mla = dev.mla_layer_view(pool, shape, 0).value();
    const ops::IndexerKeyCache keys = dev.indexer_layer_view(pool, shape, 0).value();
    const std::vector<int64_t> lens = {300, 9};
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (size_t s = 0; s < lens.size(); ++s) {
      ASSERT_TRUE(pool.admit(static_cast<SeqId>(s), lens[s]).ok());
      std::vector<int64_t> slots(lens[s]);
      ASSERT_TRUE(pool.slots(static_cast<SeqId>(s), 0, lens[s], slots).ok());
      std::vector<float> lat(lens[s] * L), rope(lens[s] * R), key(lens[s] * D);
      for (float& x : lat) x = u(rng);
      for (float& x : rope) x = u(rng);
      for (float& x : key) x = u(rng);
      ASSERT_TRUE(dev.write_mla_kv(mla, TensorView(lat.data(), DType::kF32, {lens[s], L}),
                                   TensorView(rope.data(), DType::kF32, {lens[s], R}), slots)
                      .ok());
      ASSERT_TRUE(dev.write_indexer_keys(keys, TensorView(key.data(), DType::kF32, {lens[s], D}), slots).ok());
    }
    const std::vector<SeqId> ids = {0, 1};
    const int64_t max_blocks = 3;
    std::vector<int32_t> tables(ids.size() * max_blocks), ctx = {300, 9}, qsl = {0, 1, 2};
    ASSERT_TRUE(pool.fill_block_tables(ids, max_blocks, tables).ok());
    const AttentionBatch batch{TensorView(tables.data(), DType::kI32, {2, max_blocks}),
                               TensorView(ctx.data(), DType::kI32, {2}), TensorView(qsl.data(), DType::kI32, {3})};
    std::vector<float> ql(2 * heads * L), qr(2 * heads * R), qi(2 * iheads * D), w(2 * iheads);
    for (float& x : ql) x = u(rng);
    for (float& x : qr) x = u(rng);
    for (float& x : qi) x = u(rng);
    for (float& x : w) x = 0.5f + 0.5f * u(rng);
    const TensorView qlv(ql.data(), DType::kF32, {2, heads, L}), qrv(qr.data(), DType::kF32, {2, heads, R});
    std::vector<float> dense(2 * heads * L), sparse(2 * heads * L), direct(2 * heads * L);
    ASSERT_TRUE(
        dev.mla_attention(qlv, qrv, mla, batch, 0.1f, TensorView(dense.data(), DType::kF32, {2, heads, L})).ok());
    for (int64_t topk : {320, 64}) {
      std::vector<int32_t> idx(2 * topk);
      const TensorView idxv(idx.data(), DType::kI32, {2, topk});
      ASSERT_TRUE(dev.index_topk(TensorView(qi.data(), DType::kF32, {2, iheads, D}),
                                 TensorView(w.data(), DType::kF32, {2, iheads}), keys, batch, idxv)
                      .ok());
      // The contract: positions (< context) or the pool's flat slots of the same tokens.
      std::vector<int64_t> slots0(300);
      ASSERT_TRUE(pool.slots(0, 0, 300, slots0).ok());
      for (int64_t j = 0; j < std::min<int64_t>(topk, 300); ++j) {
        const int32_t v = idx[j];
        if (dev.topk_index_format() == ops::TopkIndexFormat::kSequencePositions) {
          EXPECT_TRUE(v >= 0 && v < 300) << v;
        } else {
          EXPECT_NE(std::find(slots0.begin(), slots0.end(), v), slots0.end()) << v;
        }
      }
      ASSERT_TRUE(
          dev.sparse_attention(qlv, qrv, mla, idxv, batch, 0.1f, TensorView(sparse.data(), DType::kF32, {2, heads, L}))
              .ok());
      ASSERT_TRUE(ops::sparse_mla_decode(qlv, qrv, mla, idxv, dev.topk_index_format(), batch.block_tables,
                                         batch.context_lens, batch.query_start_loc, 0.1f,
                                         TensorView(direct.data(), DType::kF32, {2, heads, L}))
                      .ok());
      EXPECT_EQ(0, std::memcmp(sparse.data(), direct.data(), sparse.size() * sizeof(float)));
      if (topk >= 300)
        EXPECT_EQ(0, std::memcmp(sparse.data(), dense.data(), dense.size() * sizeof(float)));
      else
        EXPECT_NE(0, std::memcmp(sparse.data(), dense.data(), heads * L * sizeof(float)));
    }
  }
}

TEST(MlaContract, info_line_states_the_contract) {
  const std::string line = make("quantized").mla_contract_line();
  if (is910()) {
    EXPECT_EQ(
        line,
        "genbridge MLA/DSA contract: MLA KV int8 latent+fp16 scale, bf16 rope cache (642 B per token and layer at "
        "kv_lora_rank 512 + rope 64; kv_cache_dtype=quantized: int8 latent+fp16 scale, bf16 rope cache, 642 B), "
        "slot mapping [block, offset] pairs | indexer keys bf16 (256 B per token at "
        "index_head_dim 128) | sparse attention top-k indices: int32 sequence positions, -1 padded");
  } else {
    EXPECT_EQ(line,
              "genbridge MLA/DSA contract: MLA KV fp8_e4m3fn latent+fp32 scale per 128+bf16 rope, packed (656 B per "
              "token and layer at kv_lora_rank 512 + rope 64; kv_cache_dtype=quantized: fp8_e4m3fn latent+fp32 scale "
              "per 128+bf16 rope, packed, 656 B), slot mapping flat | indexer keys fp8_e4m3fn "
              "(Hadamard-rotated)+packed fp32 scale (132 B per token at index_head_dim 128) | sparse attention top-k "
              "indices: int32 flat KV slots (block * block_size + offset), -1 padded");
  }
}

TEST(MlaContract, deepseek_v4_rows_per_generation) {
  // bf16 unless kv_cache_dtype=quantized: A2/A3 int8 + fp16 scale + bf16 rope beside (448 + 2 + 128 B), A5 the
  // 640-byte MXFP8 row.
  EXPECT_EQ(make("bf16").sharedkv_format(), ops::MlaKvFormat::kBf16);
  const DeviceOperator quant = make("quantized");
  EXPECT_EQ(quant.sharedkv_format(),
            is910() ? ops::MlaKvFormat::kInt8Fp16ScaleSplitRope : ops::MlaKvFormat::kMxfp8RopeFirstPacked);
  EXPECT_EQ(ops::mla_kv_row_bytes(quant.sharedkv_format(), 448, 64).total(), is910() ? 578 : 640);
  if (is910()) {
    EXPECT_EQ(quant.sharedkv_contract_line(),
              "genbridge DeepSeek-V4 contract: window ring and compressed K = V rows int8 latent+fp16 scale, bf16 rope "
              "cache (578 B per row at 448 + rope 64; kv_cache_dtype=quantized: int8 latent+fp16 scale, bf16 rope "
              "cache, 578 B) | indexer keys bf16 (256 B at 128; quantized: bf16) | compressor state fp32");
  } else {
    EXPECT_EQ(make("auto").sharedkv_contract_line(),
              "genbridge DeepSeek-V4 contract: window ring and compressed K = V rows bf16 latent+rope (1024 B per row "
              "at 448 + rope 64; kv_cache_dtype=quantized: bf16 rope+fp8_e4m3fn latent+E8M0 scale per 64, packed, "
              "640 B) | indexer keys bf16 (256 B at 128; quantized: fp8_e4m3fn (Hadamard-rotated)+packed fp32 scale) "
              "| compressor state fp32");
  }
}

// DeepSeek-V4's memory through the pool: per layer the sliding-window ring (state), compressed entries (pages:
// page_size / ratio rows), indexer keys (ratio-4 layers) and the compressors' unfinished windows (state), in
// the representation in force; views of the right shapes, and refusals naming what is missing.
TEST(MlaContract, deepseek_v4_memory_through_the_pool) {
  KvModelShape s;
  s.num_layers = 3;
  s.sharedkv_dim = 448;
  s.rope_dim = 64;
  s.sliding_window = 128;
  s.compress_ratios = {0, 4, 128};
  s.index_head_dim = 128;
  for (const char* kv : {"bf16", "quantized"}) {
    SCOPED_TRACE(kv);
    const DeviceOperator dev = make(kv);
    const ops::KvRowBytes row = dev.sharedkv_row_bytes(s);
    const KvPageGeometry g = dev.kv_page_geometry(s);
    EXPECT_EQ(g.mla_rows_per_page, (std::vector<int64_t>{0, 32, 1}));
    EXPECT_EQ(g.indexer_rows_per_page, (std::vector<int64_t>{0, 32, 0}));
    const int64_t key_bytes = ops::indexer_key_row_bytes(dev.sharedkv_indexer_key_format(), 128).main;
    EXPECT_EQ(g.bytes_per_page(), 33 * row.total() + 32 * key_bytes);
    ASSERT_EQ(g.state.num_layers(), 3);
    for (int64_t l = 0; l < 3; ++l) {
      EXPECT_EQ(g.state.layers[l][kV4WindowRegion], 128 * row.main);
      EXPECT_EQ(g.state.layers[l][kV4WindowScaleRegion], 128 * row.scale);
      EXPECT_EQ(g.state.layers[l][kV4WindowRopeRegion], 128 * row.rope);
    }
    // fp32 [kv | gate] rows: ratio 4 keeps 8 rows of 2 x 1024, ratio 128 keeps 128 rows of 2 x 512; the
    // indexer's compressor 8 rows of 2 x 256.
    EXPECT_EQ(g.state.layers[0][kV4CompressorRegion], 0);
    EXPECT_EQ(g.state.layers[1][kV4CompressorRegion], 8 * 2048 * 4);
    EXPECT_EQ(g.state.layers[2][kV4CompressorRegion], 128 * 1024 * 4);
    EXPECT_EQ(g.state.layers[1][kV4IndexerCompressorRegion], 8 * 512 * 4);
    EXPECT_EQ(g.state.layers[2][kV4IndexerCompressorRegion], 0);
    auto pool = KvPagePool::create(g, 4, 2);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    const ops::MlaKvCache win = dev.v4_window_view(*pool, s, 0).value();
    EXPECT_EQ(win.format, dev.sharedkv_format());
    EXPECT_EQ(win.kv_cache.dim(0), 2);    // one block per state slot
    EXPECT_EQ(win.kv_cache.dim(1), 128);  // of sliding_window rows
    const ops::MlaKvCache comp = dev.v4_compressed_view(*pool, s, 1).value();
    EXPECT_EQ(comp.kv_cache.dim(0), 4);
    EXPECT_EQ(comp.kv_cache.dim(1), 32);
    EXPECT_EQ(dev.v4_compressed_view(*pool, s, 2).value().kv_cache.dim(1), 1);
    EXPECT_EQ(dev.v4_indexer_view(*pool, s, 1).value().key_cache.dim(1), 32);
    const TensorView state = dev.v4_compressor_state_view(*pool, s, 2, false).value();
    EXPECT_EQ(state.shape_string(), "[2, 128, 1024]");
    EXPECT_EQ(dev.v4_compressor_state_view(*pool, s, 1, true).value().shape_string(), "[2, 8, 512]");
    EXPECT_EQ(dev.v4_compressed_view(*pool, s, 0).status().message(),
              "DeviceOperator::v4_compressed_view: layer 0 attends to its sliding window only");
    EXPECT_EQ(dev.v4_indexer_view(*pool, s, 2).status().message(), "DeviceOperator: layer 2 keeps no indexer keys");
    EXPECT_EQ(dev.v4_compressor_state_view(*pool, s, 0, false).status().message(),
              "DeviceOperator::v4_compressor_state_view: layer 0 has no compressor");
    auto stateless = KvPagePool::create(g, 4, 0);
    ASSERT_TRUE(stateless.ok());
    EXPECT_EQ(dev.v4_window_view(*stateless, s, 0).status().message(),
              "DeviceOperator::v4_window_view: the pool has no state slots; DeepSeek-V4 keeps each sequence's sliding "
              "window there");
  }
  s.compress_ratios = {0, 4, 96};
  EXPECT_EQ(make("bf16").check_kv_shape(s).message(),
            "DeviceOperator: compress_ratios[2] = 96 must be 0 or divide the KV page of 128 tokens");
}

}  // namespace
}  // namespace genbridge::runtime
