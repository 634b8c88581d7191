#include "runtime/device/device_operator.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>

#include "genbridge/build_info.h"
#include "genbridge/ops/attention/lightning_indexer.h"
#include "genbridge/ops/attention/mla_decode.h"
#include "genbridge/ops/attention/sharedkv_sparse_attention.h"
#include "genbridge/ops/attention/sparse_mla_decode.h"
#include "genbridge/ops/kv_cache/bf16_indexer_key_write.h"
#include "genbridge/ops/kv_cache/bf16_kv_write.h"
#include "genbridge/ops/kv_cache/bf16_mla_kv_write.h"
#include "genbridge/ops/kv_cache/fp8_indexer_key_write.h"
#include "genbridge/ops/kv_cache/fp8_kv_write.h"
#include "genbridge/ops/kv_cache/fp8_mla_kv_write.h"
#include "genbridge/ops/kv_cache/int8_kv_write.h"
#include "genbridge/ops/kv_cache/int8_mla_kv_write.h"
#include "genbridge/ops/kv_cache/mxfp8_mla_kv_write.h"

namespace genbridge::runtime {
namespace {

using ops::KvCacheFormat;

// ---- Quantized weights: one representation per scheme, offered per generation below ----
using ops::WeightQuantScheme;
constexpr WeightQuantRepresentation kW8A8{WeightQuantScheme::kW8A8,
                                          DType::kI8,
                                          DType::kF32,
                                          WeightScaleGranularity::kPerOutputChannel,
                                          0,
                                          MxScaleLayout::kNone,
                                          ActivationQuant::kPerTokenInt8};
constexpr WeightQuantRepresentation kMxfp8{
    WeightQuantScheme::kMxfp8, DType::kFp8E4M3FN,    DType::kE8M0,          WeightScaleGranularity::kPerBlockAlongK,
    ops::kMxWeightBlock,       MxScaleLayout::kPair, ActivationQuant::kNone};
constexpr WeightQuantRepresentation kMxfp4{
    WeightQuantScheme::kMxfp4, DType::kFp4E2M1x2,    DType::kE8M0,          WeightScaleGranularity::kPerBlockAlongK,
    ops::kMxWeightBlock,       MxScaleLayout::kPair, ActivationQuant::kNone};
// Attention projections (GQA and MLA) and every expert MLP; router and LM head stay bf16 (their outputs
// pick tokens and experts, and they are a small share of the bytes), and so do the DSA indexer's
// projections (their scores pick the attended positions, whose near-ties a quantized score flips; ~7% of
// a DeepSeek-V3.2 layer's attention weight bytes).
constexpr QuantizedLayers kQuantizedLayers{true, true, true, false, false, false};
// A2/A3: INT8 is the only low-precision data path.
constexpr WeightQuantContract kAscend910WeightQuant{WeightQuantScheme::kW8A8, {kW8A8}, 1, kQuantizedLayers};
// A5: MXFP8 preferred (per-32 scales: smaller error than W8A8's per-channel scale at the same bytes),
// MXFP4 for the bytes; W8A8 is kept (A5 keeps the INT8 data path, and a W8A8 deployment moved from A2/A3
// keeps its representation and bits).
constexpr WeightQuantContract kAscend950WeightQuant{
    WeightQuantScheme::kMxfp8, {kMxfp8, kMxfp4, kW8A8}, 3, kQuantizedLayers};
// ---- end quantized weights ----

// ---- Quantized MoE dispatch: the generation's activation representation ----
// A2/A3: int8 per token with its fp32 scale, the W8A8 activations (W8A8 experts take the codes as they are, so
// the dispatch then changes no bit against the monolithic W8A8 engine). A5: MXFP8 (e4m3fn with an e8m0 scale
// per 32), its low-precision activation format; its per-32 scales follow outliers more closely than one scale
// per token, at 1 + 1/32 bytes per element.
constexpr DispatchRepresentation kInt8PerTokenDispatch{ActivationQuant::kPerTokenInt8, DType::kI8, DType::kF32, 0,
                                                       MxScaleLayout::kNone};
constexpr DispatchRepresentation kMxfp8Dispatch{ActivationQuant::kMxfp8, DType::kFp8E4M3FN, DType::kE8M0, 32,
                                                MxScaleLayout::kPair};
// ---- end quantized MoE dispatch ----

// Both generations keep the conv state in bf16 and the recurrent state in fp32 (A5's recurrent kernel
// reading bf16 state while the pool held fp32 is the mismatch this entry exists to rule out).
constexpr LinearStateFormat kLinearState{DType::kBF16, DType::kF32};

// docs/design.md#deviceoperator-contract, one row per generation.
constexpr GenerationContract kAscend910{
    .generation = Generation::kAscend910,
    .quantized_kv = KvCacheFormat::kInt8Fp16Scale,
    .slot_mapping = ops::SlotMapping::kBlockOffsetPairs,
    .kv_page_size = 128,
    .mx_scale_layout = MxScaleLayout::kNone,
    // ---- MLA + DSA ----
    .quantized_mla_kv = ops::MlaKvFormat::kInt8Fp16ScaleSplitRope,
    .indexer_keys = ops::IndexerKeyFormat::kBf16,
    .topk_indices = ops::TopkIndexFormat::kSequencePositions,
    // ---- end MLA + DSA ----
    // No FP8 data path: int8 + fp16 scale per row (the MLA representation), the rope part bf16 beside it.
    .quantized_sharedkv = ops::MlaKvFormat::kInt8Fp16ScaleSplitRope,
    .weight_quant = kAscend910WeightQuant,
    .linear_state = kLinearState,
    .quantized_dispatch = kInt8PerTokenDispatch,
};
constexpr GenerationContract kAscend950{
    .generation = Generation::kAscend950,
    .quantized_kv = KvCacheFormat::kFp8Fp32PackedScale,
    .slot_mapping = ops::SlotMapping::kFlat,
    .kv_page_size = 128,
    .mx_scale_layout = MxScaleLayout::kPair,
    // ---- MLA + DSA ----
    .quantized_mla_kv = ops::MlaKvFormat::kFp8TileScalePacked,
    .indexer_keys = ops::IndexerKeyFormat::kFp8HadamardPackedScale,
    .topk_indices = ops::TopkIndexFormat::kFlatKvSlots,
    // ---- end MLA + DSA ----
    // The CANN kv_compress_epilog row: bf16 rope, fp8 codes, E8M0 per 64, padded to 128 B (640 B).
    .quantized_sharedkv = ops::MlaKvFormat::kMxfp8RopeFirstPacked,
    .weight_quant = kAscend950WeightQuant,
    .linear_state = kLinearState,
    .quantized_dispatch = kMxfp8Dispatch,
};

std::string offered_weight_quant(const WeightQuantContract& w) {
  std::string out;
  for (int i = 0; i < w.num_offered; ++i) {
    if (i) out += ", ";
    out += ops::weight_quant_scheme_name(w.offered[i].scheme);
  }
  return out;
}

std::string describe_weight_quant(const WeightQuantRepresentation* r) {
  if (!r) return "none (bf16 weights)";
  switch (r->scheme) {
    case WeightQuantScheme::kW8A8:
      return "w8a8 (int8 weights + fp32 scale per output channel, int8 activations per token)";
    case WeightQuantScheme::kMxfp8:
      return "mxfp8 (fp8 e4m3fn weights + e8m0 scale per 32 along K, pair layout)";
    case WeightQuantScheme::kMxfp4:
      return "mxfp4 (fp4 e2m1 weights, two per byte, + e8m0 scale per 32 along K, pair layout)";
    case WeightQuantScheme::kNone:
      break;
  }
  return "none (bf16 weights)";
}

std::string describe_dispatch(const DispatchRepresentation* r) {
  if (!r) return "bf16 (2 B per element)";
  switch (r->activations) {
    case ActivationQuant::kPerTokenInt8:
      return "int8 + fp32 scale per token (H + 4 B per token)";
    case ActivationQuant::kMxfp8:
      return "mxfp8: fp8 e4m3fn + e8m0 scale per 32, pair layout (H + H/32 B per token)";
    case ActivationQuant::kNone:
      break;
  }
  return "bf16 (2 B per element)";
}

// The element-name spelling of a quantized representation in kv_cache_dtype.
std::string_view element_option(const GenerationContract& c) {
  return ops::kv_representation(c.quantized_kv).element == DType::kI8 ? "int8" : "fp8";
}

std::string describe_kv(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::kBf16:
      return "bf16 (head_dim * 2 B per (token, kv head))";
    case KvCacheFormat::kInt8Fp16Scale:
      return "int8 + fp16 scale per (token, kv head) in a separate scale cache (head_dim + 2 B per (token, kv head))";
    case KvCacheFormat::kFp8Fp32PackedScale:
      return "fp8 e4m3fn + fp32 scale per (token, kv head) packed at the end of the row (head_dim + 4 B per (token, "
             "kv head))";
  }
  return "?";
}

// Calls write(t0, n, slot_mapping) for consecutive chunks of tokens, the slot mapping of each chunk built on
// the stack in the generation's format (no allocation). Tokens stay in order, so chunking changes nothing
// (a repeated slot still keeps the last token).
template <typename Write>
Status for_slot_chunks(const char* op, ops::SlotMapping format, int64_t page, std::span<const int64_t> slots,
                       Write&& write) {
  const bool pairs = format == ops::SlotMapping::kBlockOffsetPairs;
  constexpr int64_t kChunk = 256;
  std::array<int32_t, 2 * kChunk> mapping;
  const int64_t total = static_cast<int64_t>(slots.size());
  int64_t t0 = 0;
  do {
    const int64_t n = std::min<int64_t>(kChunk, total - t0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = slots[t0 + i];
      if (s < 0 || s > std::numeric_limits<int32_t>::max()) {
        return invalid_argument(fmt::format("{}: slot {} of token {} is not a valid slot", op, s, t0 + i));
      }
      if (pairs) {
        mapping[2 * i] = static_cast<int32_t>(s / page);
        mapping[2 * i + 1] = static_cast<int32_t>(s % page);
      } else {
        mapping[i] = static_cast<int32_t>(s);
      }
    }
    const TensorView sm =
        pairs ? TensorView(mapping.data(), DType::kI32, {n, 2}) : TensorView(mapping.data(), DType::kI32, {n});
    GB_RETURN_IF_ERROR(write(t0, n, sm));
    t0 += n;
  } while (t0 < total);
  return ok_status();
}

// The write ops take one slot per token: `a` and `b` each have slots.size() rows.
Status check_one_slot_per_token(const char* op, std::span<const int64_t> slots, const char* a_name, const TensorView& a,
                                const char* b_name, const TensorView& b) {
  const int64_t total = static_cast<int64_t>(slots.size());
  if (a.rank() < 1 || a.dim(0) != total || b.rank() < 1 || b.dim(0) != total) {
    return invalid_argument(fmt::format("{}: {} slots for {} of shape {} and {} of shape {}; one slot per token", op,
                                        total, a_name, a.shape_string(), b_name, b.shape_string()));
  }
  return ok_status();
}
}  // namespace

const GenerationContract& contract_for(Generation g) { return g == Generation::kAscend910 ? kAscend910 : kAscend950; }

int64_t kv_row_bytes(KvCacheFormat f, int64_t d) { return ops::gqa_kv_row_bytes(f, d).main; }

int64_t kv_side_bytes(KvCacheFormat f) { return ops::gqa_kv_row_bytes(f, 0).scale; }

Result<KvCacheFormat> resolve_kv_cache_dtype(const GenerationContract& c, std::string_view v) {
  if (v == "auto" || v == "bf16") return KvCacheFormat::kBf16;
  if (v == "quantized" || v == element_option(c)) return c.quantized_kv;
  const bool other_element = v == "int8" || v == "fp8" || v == "fp8_e4m3fn";
  if (other_element) {
    return invalid_argument(
        fmt::format("kv_cache_dtype={}: {} ({}) has no {} KV representation; its quantized KV cache is {}; use "
                    "kv_cache_dtype=quantized (or {}), bf16 or auto",
                    v, generation_name(c.generation), generation_family(c.generation), v == "int8" ? "int8" : "fp8",
                    ops::kv_cache_format_name(c.quantized_kv), element_option(c)));
  }
  return invalid_argument(fmt::format("kv_cache_dtype={} is not one of auto, bf16, quantized ({} also accepts {})", v,
                                      generation_name(c.generation), element_option(c)));
}

int64_t quant_weight_bytes(const WeightQuantRepresentation& r, int64_t n, int64_t k) {
  const int64_t data = r.weight_element == DType::kFp4E2M1x2 ? n * ((k + 1) / 2) : n * k;
  if (r.granularity == WeightScaleGranularity::kPerOutputChannel) return data + n * 4;
  const int64_t blocks = (k + r.block_k - 1) / r.block_k;
  const int64_t slots = r.scale_layout == MxScaleLayout::kPair ? (blocks + 1) / 2 * 2 : blocks;
  return data + n * slots * static_cast<int64_t>(dtype_size(r.scale_dtype));
}

Result<const WeightQuantRepresentation*> resolve_weight_quant(const GenerationContract& c, std::string_view v) {
  const WeightQuantContract& w = c.weight_quant;
  if (v == "none") return static_cast<const WeightQuantRepresentation*>(nullptr);
  if (v == "auto") return w.find(w.preferred);
  for (WeightQuantScheme s : {WeightQuantScheme::kW8A8, WeightQuantScheme::kMxfp8, WeightQuantScheme::kMxfp4}) {
    if (v != ops::weight_quant_scheme_name(s)) continue;
    if (const WeightQuantRepresentation* r = w.find(s)) return r;
    return invalid_argument(fmt::format(
        "--weight-quant={}: {} ({}) cannot run {} weights; it offers {} (auto = {}), or none for bf16 weights", v,
        generation_name(c.generation), generation_family(c.generation), v, offered_weight_quant(w),
        ops::weight_quant_scheme_name(w.preferred)));
  }
  return invalid_argument(
      fmt::format("--weight-quant={} is not one of none, auto, w8a8, mxfp8, mxfp4 ({} offers {}; auto = {})", v,
                  generation_name(c.generation), offered_weight_quant(w), ops::weight_quant_scheme_name(w.preferred)));
}

Result<const WeightQuantRepresentation*> resolve_mxfp4_weight_quant(const GenerationContract& c, std::string_view v) {
  GB_ASSIGN_OR_RETURN(const WeightQuantRepresentation* r, resolve_weight_quant(c, v));
  if (v != "auto") return r;
  const WeightQuantRepresentation* mxfp4 = c.weight_quant.find(WeightQuantScheme::kMxfp4);
  return mxfp4 ? mxfp4 : r;
}

Result<const DispatchRepresentation*> resolve_moe_dispatch(const GenerationContract& c, std::string_view v) {
  if (v == "bf16") return static_cast<const DispatchRepresentation*>(nullptr);
  if (v != "quantized") {
    return invalid_argument(fmt::format("--moe-dispatch={} is not one of bf16, quantized", v));
  }
  if (c.quantized_dispatch.activations == ActivationQuant::kNone) {
    return invalid_argument(fmt::format(
        "--moe-dispatch=quantized: {} ({}) has no quantized activation representation for the MoE dispatch; use "
        "--moe-dispatch=bf16",
        generation_name(c.generation), generation_family(c.generation)));
  }
  return &c.quantized_dispatch;
}

Status check_soc(const SocInfo& build, std::string_view selector, const std::optional<SocInfo>& detected) {
  const std::string build_text =
      fmt::format("this build targets {} ({}; built for {})", generation_name(build.generation),
                  generation_family(build.generation), build.soc);
  if (!selector.empty()) {
    auto configured = normalize_soc_selector(selector);
    if (!configured.ok()) {
      return invalid_argument(fmt::format("DeviceOperator: configured {}", configured.status().message()));
    }
    if (configured->generation != build.generation) {
      return invalid_argument(fmt::format(
          "DeviceOperator: the configured SoC {} (selector '{}', generation {}, {}) does not match: {}; use a build "
          "configured with -DGENBRIDGE_SOC={} or configure a {} SoC",
          configured->soc, selector, generation_name(configured->generation), generation_family(configured->generation),
          build_text, selector, generation_name(build.generation)));
    }
  }
  if (detected && detected->generation != build.generation) {
    const std::string code = detected->code ? fmt::format(", SoC code {}", detected->code) : std::string();
    return invalid_argument(fmt::format(
        "DeviceOperator: the device's SoC {} (detected by npu-smi{}, generation {}, {}) does not match: {}; run a "
        "build for {} on this machine",
        detected->soc, code, generation_name(detected->generation), generation_family(detected->generation), build_text,
        generation_name(detected->generation)));
  }
  return ok_status();
}

DeviceConfig DeviceConfig::from_flags(std::string soc_flag, std::string kv_cache_dtype) {
  DeviceConfig c;
  if (soc_flag.empty()) {
    if (const char* env = std::getenv(kSocEnv.data())) soc_flag = env;
  }
  c.soc = std::move(soc_flag);
  c.kv_cache_dtype = std::move(kv_cache_dtype);
  return c;
}

Result<DeviceOperator> DeviceOperator::create(const DeviceConfig& config) {
  GB_ASSIGN_OR_RETURN(const Generation gen, generation_from_target(ops::build_target()));
  SocInfo build{gen, std::string(ops::build_soc()), 0};
  if (auto n = normalize_soc_selector(build.soc); n.ok()) build.code = n->code;

  const char* path = std::getenv("PATH");
  const std::string path_env = config.path_env ? *config.path_env : std::string(path ? path : "");
  GB_ASSIGN_OR_RETURN(const std::optional<std::string> smi, read_npu_smi(path_env));
  std::optional<SocInfo> detected;
  if (smi) {
    auto parsed = parse_npu_smi(*smi);
    if (!parsed.ok()) {
      return unavailable(
          fmt::format("DeviceOperator: npu-smi is on the path but its output cannot be checked "
                      "against this build ({}): {}",
                      generation_name(gen), parsed.status().message()));
    }
    detected = *parsed;
  }
  GB_RETURN_IF_ERROR(check_soc(build, config.soc, detected));

  DeviceOperator d;
  d.contract_ = &contract_for(gen);
  GB_ASSIGN_OR_RETURN(d.kv_format_, resolve_kv_cache_dtype(*d.contract_, config.kv_cache_dtype));
  d.mla_kv_format_ = d.kv_format_ == KvCacheFormat::kBf16 ? ops::MlaKvFormat::kBf16 : d.contract_->quantized_mla_kv;
  GB_ASSIGN_OR_RETURN(d.weight_quant_, resolve_weight_quant(*d.contract_, config.weight_quant));
  GB_ASSIGN_OR_RETURN(d.mxfp4_weight_quant_, resolve_mxfp4_weight_quant(*d.contract_, config.weight_quant));
  GB_ASSIGN_OR_RETURN(d.moe_dispatch_, resolve_moe_dispatch(*d.contract_, config.moe_dispatch));
  const GenerationContract& c = *d.contract_;
  const std::string soc_text =
      config.soc.empty() ? std::string("no SoC configured") : fmt::format("configured SoC '{}'", config.soc);
  const std::string device_text = detected ? fmt::format("device {} (npu-smi)", detected->soc)
                                           : std::string("npu-smi not found, device not checked");
  std::string weights_text = describe_weight_quant(d.weight_quant_);
  if (d.mxfp4_weight_quant_ != d.weight_quant_) {
    weights_text += fmt::format("; a checkpoint's MXFP4 weights: {}, their own codes",
                                ops::weight_quant_scheme_name(d.mxfp4_weight_quant_->scheme));
  }
  d.log_line_ = fmt::format(
      "genbridge device: {} ({}) build for {}, {}, {} | KV cache (kv_cache_dtype={}): GQA {}; MLA {}, slot mapping {}, "
      "page {} tokens | MX scale layout: {} | weights (weight_quant={}): {} | MoE dispatch (moe_dispatch={}): {}",
      generation_name(gen), generation_family(gen), build.soc, soc_text, device_text, config.kv_cache_dtype,
      describe_kv(d.kv_format_), ops::mla_kv_format_name(d.mla_kv_format_),
      c.slot_mapping == ops::SlotMapping::kFlat ? "flat (block * block_size + offset)" : "[block, offset] pairs",
      c.kv_page_size, c.mx_scale_layout == MxScaleLayout::kPair ? "pair [..., K/64, 2]" : "none (no MX formats)",
      config.weight_quant, weights_text, config.moe_dispatch, describe_dispatch(d.moe_dispatch_));
  return d;
}

KvPageGeometry DeviceOperator::kv_page_geometry(const KvModelShape& s) const {
  KvPageGeometry g;
  g.num_layers = s.num_layers;
  g.page_size = contract_->kv_page_size;
  if (s.sharedkv_dim > 0) {  // DeepSeek-V4: compressed entries in the pages, the window ring and compressors in state
    const ops::KvRowBytes row = ops::mla_kv_row_bytes(sharedkv_format(), s.sharedkv_dim, s.rope_dim);
    g.mla_row_bytes = row.main;
    g.mla_scale_bytes = row.scale;
    g.mla_rope_bytes = row.rope;
    if (s.index_head_dim > 0) {
      g.indexer_row_bytes = ops::indexer_key_row_bytes(sharedkv_indexer_key_format(), s.index_head_dim).main;
    }
    const int64_t width = s.sharedkv_dim + s.rope_dim;
    for (int64_t l = 0; l < s.num_layers; ++l) {
      const int64_t m = l < static_cast<int64_t>(s.compress_ratios.size()) ? s.compress_ratios[l] : 0;
      g.mla_rows_per_page.push_back(m > 0 ? g.page_size / m : 0);
      g.indexer_rows_per_page.push_back(m == 4 && s.index_head_dim > 0 ? g.page_size / m : 0);
      StateRegionBytes r{};
      r[kV4WindowRegion] = s.sliding_window * row.main;
      r[kV4WindowScaleRegion] = s.sliding_window * row.scale;
      r[kV4WindowRopeRegion] = s.sliding_window * row.rope;
      if (m > 0) {
        r[kV4CompressorRegion] = v4_compressor_state_rows(m) * 2 * v4_compressor_coff(m) * width * 4;
      }
      if (m == 4 && s.index_head_dim > 0) {
        r[kV4IndexerCompressorRegion] = v4_compressor_state_rows(m) * 2 * v4_compressor_coff(m) * s.index_head_dim * 4;
      }
      g.state.layers.push_back(r);
    }
    const bool compressors =
        std::any_of(s.compress_ratios.begin(), s.compress_ratios.end(), [](int64_t m) { return m > 0; });
    g.state.contents = compressors ? "sliding-window rings and compressor state" : "sliding-window rings";
    return g;
  }
  if (s.kv_lora_rank > 0) {
    const ops::KvRowBytes mla = ops::mla_kv_row_bytes(mla_kv_format_, s.kv_lora_rank, s.rope_dim);
    g.mla_row_bytes = mla.main;
    g.mla_scale_bytes = mla.scale;
    g.mla_rope_bytes = mla.rope;
  } else {
    g.num_kv_heads = s.num_kv_heads;
    g.row_bytes = kv_row_bytes(kv_format_, s.head_dim);
    g.side_row_bytes = kv_side_bytes(kv_format_);
  }
  if (s.index_head_dim > 0) {
    g.indexer_row_bytes = ops::indexer_key_row_bytes(contract_->indexer_keys, s.index_head_dim).main;
  }
  if (s.state_layers > 0) {
    const LinearStateFormat& f = contract_->linear_state;
    StateRegionBytes r{};
    r[kConvRegion] = (s.conv_kernel - 1) * s.conv_channels * static_cast<int64_t>(dtype_size(f.conv_dtype));
    r[kRecurrentRegion] =
        s.state_heads * s.state_key_dim * s.state_value_dim * static_cast<int64_t>(dtype_size(f.recurrent_dtype));
    g.state.layers.assign(static_cast<size_t>(s.state_layers), r);
    g.state.contents = "linear-attention state";
  }
  return g;
}

namespace {

bool same_geometry(const KvPageGeometry& a, const KvPageGeometry& b) {
  return a.num_layers == b.num_layers && a.num_kv_heads == b.num_kv_heads && a.page_size == b.page_size &&
         a.row_bytes == b.row_bytes && a.side_row_bytes == b.side_row_bytes && a.mla_row_bytes == b.mla_row_bytes &&
         a.mla_scale_bytes == b.mla_scale_bytes && a.mla_rope_bytes == b.mla_rope_bytes &&
         a.indexer_row_bytes == b.indexer_row_bytes && a.mla_rows_per_page == b.mla_rows_per_page &&
         a.indexer_rows_per_page == b.indexer_rows_per_page && a.state == b.state;
}

std::string geometry_text(const KvPageGeometry& g) {
  std::string t = fmt::format("layers {}, kv heads {}, page_size {}, row_bytes {}, side_row_bytes {}", g.num_layers,
                              g.num_kv_heads, g.page_size, g.row_bytes, g.side_row_bytes);
  if (g.mla_row_bytes + g.mla_scale_bytes + g.mla_rope_bytes + g.indexer_row_bytes > 0) {
    t += fmt::format(", mla_row_bytes {}, mla_scale_bytes {}, mla_rope_bytes {}, indexer_row_bytes {}", g.mla_row_bytes,
                     g.mla_scale_bytes, g.mla_rope_bytes, g.indexer_row_bytes);
  }
  if (!g.state.empty()) {
    t += fmt::format(", state layers {}, {} bytes per slot", g.state.num_layers(), g.state.bytes_per_slot());
  }
  return t;
}

Status check_pool(const KvPagePool& pool, const KvPageGeometry& want, std::string_view what, int64_t layer) {
  const KvPageGeometry& g = pool.geometry();
  if (!same_geometry(g, want)) {
    return invalid_argument(
        fmt::format("DeviceOperator: the pool's geometry ({}) is not the {} KV cache's for this "
                    "model ({}); size the pool with kv_page_geometry()",
                    geometry_text(g), what, geometry_text(want)));
  }
  if (layer < 0 || layer >= g.num_layers) {
    return invalid_argument(fmt::format("DeviceOperator: layer {} is not in [0, {})", layer, g.num_layers));
  }
  return ok_status();
}

}  // namespace

Status DeviceOperator::check_kv_shape(const KvModelShape& s) const {
  if (s.sharedkv_dim > 0) {
    const ops::MlaKvFormat f = sharedkv_format();
    if (Status st = ops::check_mla_kv_dims(f, s.sharedkv_dim, s.rope_dim); !st.ok()) {
      return invalid_argument(fmt::format(
          "{} (DeepSeek-V4's shared K = V rows: head_dim - qk_rope_head_dim = {}; {} ({}), kv_cache_dtype resolved to "
          "{}){}",
          st.message(), s.sharedkv_dim, generation_name(contract_->generation),
          generation_family(contract_->generation), ops::mla_kv_format_name(f),
          f == ops::MlaKvFormat::kBf16 ? "" : "; use kv_cache_dtype=bf16"));
    }
    if (s.sliding_window < 1) {
      return invalid_argument(fmt::format("DeviceOperator: sliding_window is {} but must be >= 1", s.sliding_window));
    }
    for (size_t l = 0; l < s.compress_ratios.size(); ++l) {
      const int64_t m = s.compress_ratios[l];
      if (m < 0 || (m > 0 && contract_->kv_page_size % m != 0)) {
        return invalid_argument(
            fmt::format("DeviceOperator: compress_ratios[{}] = {} must be 0 or divide the KV page of {} tokens", l, m,
                        contract_->kv_page_size));
      }
    }
  }
  if (s.kv_lora_rank > 0) {
    if (Status st = ops::check_mla_kv_dims(mla_kv_format_, s.kv_lora_rank, s.rope_dim); !st.ok()) {
      return invalid_argument(fmt::format(
          "{} ({} ({}), kv_cache_dtype resolved to {}){}", st.message(), generation_name(contract_->generation),
          generation_family(contract_->generation), ops::mla_kv_format_name(mla_kv_format_),
          mla_kv_format_ == ops::MlaKvFormat::kBf16 ? "" : "; use kv_cache_dtype=bf16"));
    }
  }
  if (s.index_head_dim > 0) {
    const ops::IndexerKeyFormat keys = s.sharedkv_dim > 0 ? sharedkv_indexer_key_format() : contract_->indexer_keys;
    if (Status st = ops::check_indexer_key_dims(keys, s.index_head_dim); !st.ok()) {
      return invalid_argument(fmt::format("{} ({} ({}))", st.message(), generation_name(contract_->generation),
                                          generation_family(contract_->generation)));
    }
  }
  return ok_status();
}

namespace {

// An MLA cache view of `format` over `blocks` blocks of `rows` rows held in memory (main, scale, rope).
ops::MlaKvCache mla_view(ops::MlaKvFormat format, int64_t latent, int64_t rope, std::byte* main, std::byte* scale,
                         std::byte* rope_rows, int64_t blocks, int64_t rows, int64_t main_bytes) {
  ops::MlaKvCache v;
  v.format = format;
  v.kv_lora_rank = latent;
  v.rope_dim = rope;
  switch (format) {
    case ops::MlaKvFormat::kBf16:
      v.kv_cache = TensorView(main, DType::kBF16, {blocks, rows, latent + rope});
      break;
    case ops::MlaKvFormat::kInt8Fp16ScaleSplitRope:
      v.kv_cache = TensorView(main, DType::kI8, {blocks, rows, latent});
      v.scale_cache = TensorView(scale, DType::kF16, {blocks, rows});
      v.rope_cache = TensorView(rope_rows, DType::kBF16, {blocks, rows, rope});
      break;
    case ops::MlaKvFormat::kFp8TileScalePacked:
    case ops::MlaKvFormat::kMxfp8RopeFirstPacked:
      v.kv_cache = TensorView(main, DType::kU8, {blocks, rows, main_bytes});
      break;
  }
  return v;
}

}  // namespace

Result<ops::MlaKvCache> DeviceOperator::mla_layer_view(const KvPagePool& pool, const KvModelShape& shape,
                                                       int64_t layer) const {
  if (shape.kv_lora_rank <= 0) {
    return invalid_argument("DeviceOperator::mla_layer_view: the model has no MLA KV cache (kv_lora_rank is 0)");
  }
  GB_RETURN_IF_ERROR(check_kv_shape(shape));
  GB_RETURN_IF_ERROR(check_pool(pool, kv_page_geometry(shape), ops::mla_kv_format_name(mla_kv_format_), layer));
  const KvPageGeometry& g = pool.geometry();
  const KvLayerMemory m = pool.layer(layer);
  return mla_view(mla_kv_format_, shape.kv_lora_rank, shape.rope_dim, m.mla, m.mla_scale, m.mla_rope, pool.num_pages(),
                  g.page_size, g.mla_row_bytes);
}

Result<ops::IndexerKeyCache> DeviceOperator::indexer_layer_view(const KvPagePool& pool, const KvModelShape& shape,
                                                                int64_t layer) const {
  if (shape.index_head_dim <= 0) {
    return invalid_argument("DeviceOperator::indexer_layer_view: the model has no indexer (index_head_dim is 0)");
  }
  GB_RETURN_IF_ERROR(check_kv_shape(shape));
  const ops::IndexerKeyFormat keys = shape.sharedkv_dim > 0 ? sharedkv_indexer_key_format() : contract_->indexer_keys;
  GB_RETURN_IF_ERROR(check_pool(pool, kv_page_geometry(shape), ops::indexer_key_format_name(keys), layer));
  const KvPageGeometry& g = pool.geometry();
  const KvLayerMemory m = pool.layer(layer);
  ops::IndexerKeyCache v;
  v.format = keys;
  v.head_dim = shape.index_head_dim;
  const bool packed = ops::kv_representation(v.format).scale_placement == ops::KvScalePlacement::kPackedInRow;
  const int64_t rows = g.indexer_rows(layer);
  if (rows == 0) {
    return invalid_argument(fmt::format("DeviceOperator: layer {} keeps no indexer keys", layer));
  }
  v.key_cache = packed ? TensorView(m.indexer, DType::kU8, {pool.num_pages(), rows, g.indexer_row_bytes})
                       : TensorView(m.indexer, ops::kv_representation(v.format).element,
                                    {pool.num_pages(), rows, shape.index_head_dim});
  return v;
}

// ---- DeepSeek-V4 ----

namespace {

Status check_v4(const KvPagePool& pool, const KvModelShape& shape, int64_t layer, const char* what) {
  if (shape.sharedkv_dim <= 0) {
    return invalid_argument(
        fmt::format("DeviceOperator::{}: the model is not DeepSeek-V4 (no shared K = V rows)", what));
  }
  if (pool.num_state_slots() < 1) {
    return invalid_argument(fmt::format(
        "DeviceOperator::{}: the pool has no state slots; DeepSeek-V4 keeps each sequence's sliding window there",
        what));
  }
  if (layer < 0 || layer >= shape.num_layers) {
    return invalid_argument(
        fmt::format("DeviceOperator::{}: layer {} is not in [0, {})", what, layer, shape.num_layers));
  }
  return ok_status();
}

}  // namespace

Result<ops::MlaKvCache> DeviceOperator::v4_window_view(const KvPagePool& pool, const KvModelShape& shape,
                                                       int64_t layer) const {
  GB_RETURN_IF_ERROR(check_v4(pool, shape, layer, "v4_window_view"));
  GB_RETURN_IF_ERROR(check_kv_shape(shape));
  GB_RETURN_IF_ERROR(check_pool(pool, kv_page_geometry(shape), ops::mla_kv_format_name(sharedkv_format()), layer));
  const KvPageGeometry& g = pool.geometry();
  const StateLayerMemory m = pool.state_layer(layer);
  return mla_view(sharedkv_format(), shape.sharedkv_dim, shape.rope_dim, m.region[kV4WindowRegion],
                  m.region[kV4WindowScaleRegion], m.region[kV4WindowRopeRegion], pool.num_state_slots(),
                  shape.sliding_window, g.mla_row_bytes);
}

Result<ops::MlaKvCache> DeviceOperator::v4_compressed_view(const KvPagePool& pool, const KvModelShape& shape,
                                                           int64_t layer) const {
  GB_RETURN_IF_ERROR(check_v4(pool, shape, layer, "v4_compressed_view"));
  GB_RETURN_IF_ERROR(check_kv_shape(shape));
  GB_RETURN_IF_ERROR(check_pool(pool, kv_page_geometry(shape), ops::mla_kv_format_name(sharedkv_format()), layer));
  const KvPageGeometry& g = pool.geometry();
  if (g.mla_rows(layer) == 0) {
    return invalid_argument(
        fmt::format("DeviceOperator::v4_compressed_view: layer {} attends to its sliding window only", layer));
  }
  const KvLayerMemory m = pool.layer(layer);
  return mla_view(sharedkv_format(), shape.sharedkv_dim, shape.rope_dim, m.mla, m.mla_scale, m.mla_rope,
                  pool.num_pages(), g.mla_rows(layer), g.mla_row_bytes);
}

Result<ops::IndexerKeyCache> DeviceOperator::v4_indexer_view(const KvPagePool& pool, const KvModelShape& shape,
                                                             int64_t layer) const {
  GB_RETURN_IF_ERROR(check_v4(pool, shape, layer, "v4_indexer_view"));
  return indexer_layer_view(pool, shape, layer);
}

Result<TensorView> DeviceOperator::v4_compressor_state_view(const KvPagePool& pool, const KvModelShape& shape,
                                                            int64_t layer, bool indexer) const {
  GB_RETURN_IF_ERROR(check_v4(pool, shape, layer, "v4_compressor_state_view"));
  GB_RETURN_IF_ERROR(check_pool(pool, kv_page_geometry(shape), "DeepSeek-V4 compressor state", layer));
  const int64_t m = shape.compress_ratios[layer];
  const int region = indexer ? kV4IndexerCompressorRegion : kV4CompressorRegion;
  if (pool.geometry().state.layers[layer][region] == 0) {
    return invalid_argument(fmt::format("DeviceOperator::v4_compressor_state_view: layer {} has no {}compressor", layer,
                                        indexer ? "indexer " : ""));
  }
  const int64_t width = indexer ? shape.index_head_dim : shape.sharedkv_dim + shape.rope_dim;
  return TensorView(pool.state_layer(layer).region[region], DType::kF32,
                    {pool.num_state_slots(), v4_compressor_state_rows(m), 2 * v4_compressor_coff(m) * width});
}

ops::KvRowBytes DeviceOperator::sharedkv_row_bytes(const KvModelShape& shape) const {
  return ops::mla_kv_row_bytes(sharedkv_format(), shape.sharedkv_dim, shape.rope_dim);
}

ops::MlaKvCache DeviceOperator::sharedkv_view(std::byte* main, std::byte* scale, std::byte* rope, int64_t rows,
                                              const KvModelShape& shape) const {
  return mla_view(sharedkv_format(), shape.sharedkv_dim, shape.rope_dim, main, scale, rope, 1, rows,
                  sharedkv_row_bytes(shape).main);
}

Status DeviceOperator::write_sharedkv(const ops::MlaKvCache& cache, const TensorView& nope, const TensorView& rope,
                                      std::span<const int64_t> slots) const {
  if (cache.format != sharedkv_format()) {
    return invalid_argument(fmt::format(
        "DeviceOperator::write_sharedkv: the cache is {} but the shared K = V representation in force is {}",
        ops::mla_kv_format_name(cache.format), ops::mla_kv_format_name(sharedkv_format())));
  }
  return write_mla_rows("DeviceOperator::write_sharedkv", cache, nope, rope, slots);
}

Status DeviceOperator::sharedkv_attention(const TensorView& q_nope, const TensorView& q_rope,
                                          const ops::MlaKvCache& window_cache, const TensorView& window_slots,
                                          const ops::MlaKvCache& compressed_cache, const TensorView& compressed_slots,
                                          const TensorView& sinks, float softmax_scale, const TensorView& out) const {
  for (const ops::MlaKvCache* c : {&window_cache, &compressed_cache}) {
    if (c->format != sharedkv_format() && !(c == &compressed_cache && compressed_slots.numel() == 0)) {
      return invalid_argument(fmt::format(
          "DeviceOperator::sharedkv_attention: a cache is {} but the shared K = V representation in force is {}",
          ops::mla_kv_format_name(c->format), ops::mla_kv_format_name(sharedkv_format())));
    }
  }
  return ops::sharedkv_sparse_attention(q_nope, q_rope, window_cache, window_slots, compressed_cache, compressed_slots,
                                        sinks, softmax_scale, out);
}

// ---- end DeepSeek-V4 ----

Result<LinearStateCache> DeviceOperator::state_layer_view(const KvPagePool& pool, const KvModelShape& shape,
                                                          int64_t layer) const {
  if (shape.state_layers <= 0) {
    return invalid_argument("DeviceOperator::state_layer_view: the model has no linear-attention layers");
  }
  const KvPageGeometry want = kv_page_geometry(shape);
  if (!same_geometry(pool.geometry(), want)) {
    return invalid_argument(fmt::format(
        "DeviceOperator: the pool's geometry ({}) is not the linear-attention state's for this model ({}); size the "
        "pool with kv_page_geometry()",
        geometry_text(pool.geometry()), geometry_text(want)));
  }
  if (layer < 0 || layer >= shape.state_layers) {
    return invalid_argument(
        fmt::format("DeviceOperator: linear-attention layer {} is not in [0, {})", layer, shape.state_layers));
  }
  const LinearStateFormat& f = contract_->linear_state;
  const StateLayerMemory m = pool.state_layer(layer);
  const int64_t slots = pool.num_state_slots();
  return LinearStateCache{
      .conv = TensorView(m.region[kConvRegion], f.conv_dtype, {slots, shape.conv_kernel - 1, shape.conv_channels}),
      .recurrent = TensorView(m.region[kRecurrentRegion], f.recurrent_dtype,
                              {slots, shape.state_heads, shape.state_key_dim, shape.state_value_dim}),
  };
}

std::string DeviceOperator::state_contract_line(const KvModelShape& s) const {
  const StateSlotGeometry g = kv_page_geometry(s).state;
  if (g.empty()) return "";
  const double mib_per_seq = static_cast<double>(g.bytes_per_slot()) / (1 << 20);
  if (s.sharedkv_dim > 0) {  // DeepSeek-V4
    int64_t compressors = 0, indexer_compressors = 0;
    for (int64_t l = 0; l < g.num_layers(); ++l) {
      compressors += g.layers[l][kV4CompressorRegion] > 0;
      indexer_compressors += g.layers[l][kV4IndexerCompressorRegion] > 0;
    }
    std::string text = fmt::format("{}: the last {} shared K = V rows of each of the {} layers ({}, {} B per row)",
                                   g.contents, s.sliding_window, s.num_layers,
                                   ops::mla_kv_format_name(sharedkv_format()), sharedkv_row_bytes(s).total());
    if (compressors > 0) {
      text += fmt::format(", the unfinished windows of {} compressor{}", compressors, compressors == 1 ? "" : "s");
      if (indexer_compressors > 0) {
        text += fmt::format(" and {} indexer compressor{}", indexer_compressors, indexer_compressors == 1 ? "" : "s");
      }
      text += " (fp32 [kv | gate] rows)";
    }
    return text + fmt::format("; {:.2f} MiB per sequence", mib_per_seq);
  }
  const LinearStateFormat& f = contract_->linear_state;
  return fmt::format(
      "{}: conv {} [K-1 = {}, {}] time-major, recurrent {} [{}, {}, {}] key-major; {:.2f} MiB per sequence ({} "
      "layers)",
      g.contents, dtype_name(f.conv_dtype), s.conv_kernel - 1, s.conv_channels, dtype_name(f.recurrent_dtype),
      s.state_heads, s.state_key_dim, s.state_value_dim, mib_per_seq, s.state_layers);
}

Result<ops::PagedKvCache> DeviceOperator::kv_layer_view(const KvPagePool& pool, const KvModelShape& shape,
                                                        int64_t layer) const {
  if (shape.kv_lora_rank > 0) {
    return invalid_argument(
        "DeviceOperator::kv_layer_view: the model keeps MLA latent rows (kv_lora_rank > 0), not "
        "K/V rows; use mla_layer_view()");
  }
  GB_RETURN_IF_ERROR(check_pool(pool, kv_page_geometry(shape), ops::kv_cache_format_name(kv_format_), layer));
  const KvPageGeometry& g = pool.geometry();
  const int64_t d = shape.head_dim;
  const KvLayerMemory m = pool.layer(layer);
  const int64_t pages = pool.num_pages(), heads = g.num_kv_heads, ps = g.page_size;
  ops::PagedKvCache v;
  v.format = kv_format_;
  switch (kv_format_) {
    case KvCacheFormat::kBf16:
      v.key_cache = TensorView(m.key, DType::kBF16, {pages, heads, ps, d});
      v.value_cache = TensorView(m.value, DType::kBF16, {pages, heads, ps, d});
      break;
    case KvCacheFormat::kInt8Fp16Scale:
      v.key_cache = TensorView(m.key, DType::kI8, {pages, heads, ps, d});
      v.value_cache = TensorView(m.value, DType::kI8, {pages, heads, ps, d});
      v.key_scale_cache = TensorView(m.key_side, DType::kF16, {pages, heads, ps});
      v.value_scale_cache = TensorView(m.value_side, DType::kF16, {pages, heads, ps});
      break;
    case KvCacheFormat::kFp8Fp32PackedScale:
      v.key_cache = TensorView(m.key, DType::kU8, {pages, heads, ps, g.row_bytes});
      v.value_cache = TensorView(m.value, DType::kU8, {pages, heads, ps, g.row_bytes});
      break;
  }
  return v;
}

Status DeviceOperator::write_kv(const ops::PagedKvCache& cache, const TensorView& key, const TensorView& value,
                                std::span<const int64_t> slots) const {
  if (cache.format != kv_format_) {
    return invalid_argument(
        fmt::format("DeviceOperator::write_kv: the cache is {} but the representation in force is {}",
                    ops::kv_cache_format_name(cache.format), ops::kv_cache_format_name(kv_format_)));
  }
  GB_RETURN_IF_ERROR(check_one_slot_per_token("DeviceOperator::write_kv", slots, "key", key, "value", value));
  const int64_t page = cache.key_cache.rank() == 4 ? cache.key_cache.dim(2) : 1;
  return for_slot_chunks("DeviceOperator::write_kv", contract_->slot_mapping, page, slots,
                         [&](int64_t t0, int64_t n, const TensorView& sm) -> Status {
                           const TensorView k = key.slice0(t0, t0 + n), v = value.slice0(t0, t0 + n);
                           switch (kv_format_) {
                             case KvCacheFormat::kBf16:
                               return ops::bf16_kv_write(k, v, sm, cache.key_cache, cache.value_cache);
                             case KvCacheFormat::kInt8Fp16Scale:
                               return ops::int8_kv_write(k, v, sm, cache.key_cache, cache.value_cache,
                                                         cache.key_scale_cache, cache.value_scale_cache);
                             case KvCacheFormat::kFp8Fp32PackedScale:
                               return ops::fp8_kv_write(k, v, sm, cache.key_cache, cache.value_cache);
                           }
                           return ok_status();
                         });
}

Status DeviceOperator::attention(const TensorView& query, const ops::PagedKvCache& cache, const AttentionBatch& batch,
                                 float softmax_scale, const TensorView& out) const {
  if (cache.format != kv_format_) {
    return invalid_argument(
        fmt::format("DeviceOperator::attention: the cache is {} but the representation in force is {}",
                    ops::kv_cache_format_name(cache.format), ops::kv_cache_format_name(kv_format_)));
  }
  return ops::paged_decode(query, cache, batch.block_tables, batch.context_lens, batch.query_start_loc, softmax_scale,
                           out);
}

}  // namespace genbridge::runtime

namespace genbridge::runtime {

// ---- MLA + DSA ----

std::string DeviceOperator::mla_contract_line() const {
  constexpr int64_t kLatent = 512, kRope = 64, kIndexDim = 128;  // DeepSeek-V3.2's dimensions, for the byte counts
  const ops::KvRowBytes mla = ops::mla_kv_row_bytes(mla_kv_format_, kLatent, kRope);
  const ops::KvRowBytes quant = ops::mla_kv_row_bytes(contract_->quantized_mla_kv, kLatent, kRope);
  const ops::KvRowBytes idx = ops::indexer_key_row_bytes(contract_->indexer_keys, kIndexDim);
  return fmt::format(
      "genbridge MLA/DSA contract: MLA KV {} ({} B per token and layer at kv_lora_rank {} + rope {}; "
      "kv_cache_dtype=quantized: {}, {} B), slot mapping {} | indexer keys {} ({} B per token at index_head_dim {}) | "
      "sparse attention top-k indices: {}",
      ops::mla_kv_format_name(mla_kv_format_), mla.total(), kLatent, kRope,
      ops::mla_kv_format_name(contract_->quantized_mla_kv), quant.total(),
      contract_->slot_mapping == ops::SlotMapping::kFlat ? "flat" : "[block, offset] pairs",
      ops::indexer_key_format_name(contract_->indexer_keys), idx.total(), kIndexDim,
      ops::topk_index_format_name(contract_->topk_indices));
}

ops::MlaKvFormat DeviceOperator::sharedkv_format() const {
  return kv_format_ == KvCacheFormat::kBf16 ? ops::MlaKvFormat::kBf16 : contract_->quantized_sharedkv;
}

ops::IndexerKeyFormat DeviceOperator::sharedkv_indexer_key_format() const {
  return kv_format_ == KvCacheFormat::kBf16 ? ops::IndexerKeyFormat::kBf16 : contract_->indexer_keys;
}

std::string DeviceOperator::sharedkv_contract_line() const {
  constexpr int64_t kNope = 448, kRope = 64;  // DeepSeek-V4's shared K = V head: 448 + 64 rope
  const ops::KvRowBytes in_force = ops::mla_kv_row_bytes(sharedkv_format(), kNope, kRope);
  const ops::KvRowBytes quant = ops::mla_kv_row_bytes(contract_->quantized_sharedkv, kNope, kRope);
  constexpr int64_t kIndexDim = 128;
  return fmt::format(
      "genbridge DeepSeek-V4 contract: window ring and compressed K = V rows {} ({} B per row at {} + rope {}; "
      "kv_cache_dtype=quantized: {}, {} B) | indexer keys {} ({} B at {}; quantized: {}) | compressor state fp32",
      ops::mla_kv_format_name(sharedkv_format()), in_force.total(), kNope, kRope,
      ops::mla_kv_format_name(contract_->quantized_sharedkv), quant.total(),
      ops::indexer_key_format_name(sharedkv_indexer_key_format()),
      ops::indexer_key_row_bytes(sharedkv_indexer_key_format(), kIndexDim).total(), kIndexDim,
      ops::indexer_key_format_name(contract_->indexer_keys));
}

Status DeviceOperator::write_mla_kv(const ops::MlaKvCache& cache, const TensorView& latent, const TensorView& rope,
                                    std::span<const int64_t> slots) const {
  if (cache.format != mla_kv_format_) {
    return invalid_argument(
        fmt::format("DeviceOperator::write_mla_kv: the cache is {} but the MLA representation in force is {}",
                    ops::mla_kv_format_name(cache.format), ops::mla_kv_format_name(mla_kv_format_)));
  }
  return write_mla_rows("DeviceOperator::write_mla_kv", cache, latent, rope, slots);
}

Status DeviceOperator::write_mla_rows(const char* what, const ops::MlaKvCache& cache, const TensorView& latent,
                                      const TensorView& rope, std::span<const int64_t> slots) const {
  GB_RETURN_IF_ERROR(check_one_slot_per_token(what, slots, "latent", latent, "rope", rope));
  const int64_t page = cache.kv_cache.rank() == 3 ? cache.kv_cache.dim(1) : 1;
  return for_slot_chunks(what, contract_->slot_mapping, page, slots,
                         [&](int64_t t0, int64_t n, const TensorView& sm) -> Status {
                           const TensorView l = latent.slice0(t0, t0 + n), r = rope.slice0(t0, t0 + n);
                           switch (cache.format) {
                             case ops::MlaKvFormat::kBf16:
                               return ops::bf16_mla_kv_write(l, r, sm, cache);
                             case ops::MlaKvFormat::kInt8Fp16ScaleSplitRope:
                               return ops::int8_mla_kv_write(l, r, sm, cache);
                             case ops::MlaKvFormat::kFp8TileScalePacked:
                               return ops::fp8_mla_kv_write(l, r, sm, cache);
                             case ops::MlaKvFormat::kMxfp8RopeFirstPacked:
                               return ops::mxfp8_mla_kv_write(l, r, sm, cache);
                           }
                           return ok_status();
                         });
}

Status DeviceOperator::write_indexer_keys(const ops::IndexerKeyCache& cache, const TensorView& key,
                                          std::span<const int64_t> slots) const {
  if (cache.format != contract_->indexer_keys && cache.format != sharedkv_indexer_key_format()) {
    return invalid_argument(
        fmt::format("DeviceOperator::write_indexer_keys: the cache is {} but the generation's indexer keys are {}",
                    ops::indexer_key_format_name(cache.format), ops::indexer_key_format_name(contract_->indexer_keys)));
  }
  const int64_t total = static_cast<int64_t>(slots.size());
  if (key.rank() < 1 || key.dim(0) != total) {
    return invalid_argument(
        fmt::format("DeviceOperator::write_indexer_keys: {} slots for key of shape {}; one slot per token", total,
                    key.shape_string()));
  }
  const int64_t page = cache.key_cache.rank() == 3 ? cache.key_cache.dim(1) : 1;
  return for_slot_chunks("DeviceOperator::write_indexer_keys", contract_->slot_mapping, page, slots,
                         [&](int64_t t0, int64_t n, const TensorView& sm) -> Status {
                           const TensorView k = key.slice0(t0, t0 + n);
                           switch (cache.format) {
                             case ops::IndexerKeyFormat::kBf16:
                               return ops::bf16_indexer_key_write(k, sm, cache);
                             case ops::IndexerKeyFormat::kFp8HadamardPackedScale:
                               return ops::fp8_indexer_key_write(k, sm, cache);
                           }
                           return ok_status();
                         });
}

Status DeviceOperator::mla_attention(const TensorView& q_latent, const TensorView& q_rope, const ops::MlaKvCache& cache,
                                     const AttentionBatch& batch, float softmax_scale, const TensorView& out) const {
  if (cache.format != mla_kv_format_) {
    return invalid_argument(
        fmt::format("DeviceOperator::mla_attention: the cache is {} but the MLA representation in force is {}",
                    ops::mla_kv_format_name(cache.format), ops::mla_kv_format_name(mla_kv_format_)));
  }
  return ops::mla_decode(q_latent, q_rope, cache, batch.block_tables, batch.context_lens, batch.query_start_loc,
                         softmax_scale, out);
}

Status DeviceOperator::index_topk(const TensorView& q, const TensorView& weights, const ops::IndexerKeyCache& keys,
                                  const AttentionBatch& batch, const TensorView& topk_indices) const {
  if (keys.format != contract_->indexer_keys && keys.format != sharedkv_indexer_key_format()) {
    return invalid_argument(
        fmt::format("DeviceOperator::index_topk: the key cache is {} but the generation's indexer keys are {}",
                    ops::indexer_key_format_name(keys.format), ops::indexer_key_format_name(contract_->indexer_keys)));
  }
  return ops::lightning_indexer(q, weights, keys, batch.block_tables, batch.context_lens, batch.query_start_loc,
                                contract_->topk_indices, topk_indices, TensorView());
}

Status DeviceOperator::sparse_attention(const TensorView& q_latent, const TensorView& q_rope,
                                        const ops::MlaKvCache& cache, const TensorView& topk_indices,
                                        const AttentionBatch& batch, float softmax_scale, const TensorView& out) const {
  if (cache.format != mla_kv_format_) {
    return invalid_argument(
        fmt::format("DeviceOperator::sparse_attention: the cache is {} but the MLA representation in force is {}",
                    ops::mla_kv_format_name(cache.format), ops::mla_kv_format_name(mla_kv_format_)));
  }
  return ops::sparse_mla_decode(q_latent, q_rope, cache, topk_indices, contract_->topk_indices, batch.block_tables,
                                batch.context_lens, batch.query_start_loc, softmax_scale, out);
}

// ---- end MLA + DSA ----

}  // namespace genbridge::runtime
