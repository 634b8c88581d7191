// Cross-target probe: runs gemma_rms_norm on fixed bf16 inputs, checks the contract tolerance against
// the fp64 oracle, and writes the output bits to a file so two target builds can be compared.
// With --qwen35 it runs a Qwen3.5-MoE checkpoint instead (make-model's tiny-qwen35, whose input, post-attention,
// final and q/k norms are Gemma norms) through the engine: each build within tolerance of the fp64 reference,
// and the two generations' Gemma providers visible in the model's outputs (some logits differ).
// With --v4-kernels it runs DeepSeek-V4's kernels on the representation both generations share (bf16 K = V
// rows: bf16_mla_kv_write, sharedkv_sparse_attention with sinks, kv_compress with and without overlap), whose
// contract is common code: the two builds must give the same bits.
// With --v4-model it runs a DeepSeek-V4 checkpoint (make-model's tiny-dsv4, bf16 rows: the representation both
// generations share) through the engine, 300-token prompt then 32 steps, prompt and compressed windows included:
// the two builds must give the same logits bits.
// Usage: gemma_probe [--qwen35 | --v4-kernels | --v4-model] OUT_FILE [PEER_FILE]. Exit 0 only when every element is
// within tolerance and, given PEER_FILE (another build's OUT_FILE), when at least one output bit differs from it
// (--v4-kernels: when every bit equals it).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/ops/attention/kv_compress.h"
#include "genbridge/ops/attention/sharedkv_sparse_attention.h"
#include "genbridge/ops/kv_cache/bf16_mla_kv_write.h"
#include "genbridge/ops/norm/gemma_rms_norm.h"
#include "ops/common/norm/norm_ref.h"
#include "runtime/engine/assembly.h"
#include "support/reference_forward.h"
#include "support/temp_dir.h"
#include "support/tensor_util.h"
#include "tools/make_model/synthetic.h"

namespace {

using namespace genbridge;

bool write_bytes(const char* path, const void* data, size_t n) {
  FILE* f = std::fopen(path, "wb");
  const bool ok = f && std::fwrite(data, 1, n, f) == n;
  if (f) std::fclose(f);
  if (!ok) std::fprintf(stderr, "cannot write %s\n", path);
  return ok;
}

bool read_bytes(const char* path, void* data, size_t n) {
  FILE* f = std::fopen(path, "rb");
  const bool ok = f && std::fread(data, 1, n, f) == n;
  if (f) std::fclose(f);
  if (!ok) std::fprintf(stderr, "cannot read %s\n", path);
  return ok;
}

// One 150-token prompt (past the gated delta rule's chunk and a KV page) and 32 greedy steps on tiny-qwen35:
// every step's logits against the fp64 reference (teacher-forced on this build's tokens): the median relative
// L2 must be within runtime.engine.qwen35_engine_test's bound. Writes the first step's logits (the same
// context in every build); with `peer`, some of them must differ from the other build's.
int qwen35(const char* out, const char* peer) {
  testing::TempDir dir;
  if (Status st = model::write_synthetic_checkpoint("tiny-qwen35", 7, dir / "m"); !st.ok()) {
    std::fprintf(stderr, "make-model failed: %s\n", st.to_string().c_str());
    return 1;
  }
  auto ckpt = model::Checkpoint::open(dir / "m");
  auto dev = runtime::DeviceOperator::create({});
  if (!ckpt.ok() || !dev.ok()) {
    std::fprintf(stderr, "open failed: %s\n", (ckpt.ok() ? dev.status() : ckpt.status()).to_string().c_str());
    return 1;
  }
  auto assembled = engine::assemble_engine(
      *ckpt, *dev, 4, {.engine = {.max_batch = 1, .record_logits = true}, .kv_pool = {.state_slots = 1}}, {});
  if (!assembled.ok()) {
    std::fprintf(stderr, "assembly failed: %s\n", assembled.status().to_string().c_str());
    return 1;
  }
  const int64_t V = ckpt->config().vocab_size;
  engine::Request r;
  for (int i = 0; i < 150; ++i)
    r.prompt.push_back(static_cast<int32_t>(engine::uniform_from(11, i) * static_cast<double>(V)));
  r.max_new_tokens = 32;
  engine::Engine& eng = *(*assembled)->engine;
  if (Status st = eng.submit(r); !st.ok() || !(st = eng.run_to_completion()).ok()) {
    std::fprintf(stderr, "engine failed: %s\n", st.to_string().c_str());
    return 1;
  }
  const engine::RequestResult& res = eng.results().at(0);
  if (res.tokens.size() != 32 || res.logits.size() != 32 * static_cast<size_t>(V)) {
    std::fprintf(stderr, "expected 32 steps of logits, got %zu tokens\n", res.tokens.size());
    return 1;
  }
  std::vector<int32_t> seq = r.prompt;
  seq.insert(seq.end(), res.tokens.begin(), res.tokens.end() - 1);
  const testing::ReferenceForward ref = testing::reference_forward(ckpt->config(), ckpt->weights(), seq);
  std::vector<double> errors;
  for (size_t i = 0; i < res.tokens.size(); ++i) {
    const auto want = ref.logits_at(static_cast<int64_t>(r.prompt.size() + i) - 1);
    double d2 = 0, n2 = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double d = res.logits[i * V + v] - want[v];
      d2 += d * d;
      n2 += want[v] * want[v];
    }
    errors.push_back(std::sqrt(d2 / n2));
  }
  std::sort(errors.begin(), errors.end());
  const double median = errors[errors.size() / 2];
  std::printf("target %.*s: tiny-qwen35, 32 steps after a 150-token prompt: median relative L2 vs fp64 %.4f%%\n",
              static_cast<int>(ops::build_target().size()), ops::build_target().data(), 100 * median);
  if (median > 1.5e-2) {
    std::fprintf(stderr, "the median error exceeds the engine's bound of 1.5%%\n");
    return 1;
  }
  const size_t n = static_cast<size_t>(V);
  if (!write_bytes(out, res.logits.data(), n * sizeof(float))) return 1;
  if (!peer) return 0;
  std::vector<float> theirs(n);
  if (!read_bytes(peer, theirs.data(), n * sizeof(float))) return 1;
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += std::memcmp(&res.logits[i], &theirs[i], sizeof(float)) != 0;
  std::printf("%zu of %zu first-step logits differ from %s\n", differ, n, peer);
  if (differ == 0) {
    std::fprintf(stderr, "the two builds' logits are bit-identical; their Gemma providers must differ for bf16\n");
    return 1;
  }
  return 0;
}

// DeepSeek-V4's kernels on bf16 rows, fixed inputs: the attention's output rows (with sinks) and the three
// compressors' entries, fp32, written back to back; with `peer`, every byte must equal the other build's.
int v4_kernels(const char* out, const char* peer) {
  constexpr int64_t L = 448, R = 64, D = L + R, H = 16, T = 3, kBlocks = 4, kBs = 32, W = 40, C = 24;
  testing::OwnedTensor cache(DType::kBF16, {kBlocks, kBs, D}), lat(DType::kF32, {kBlocks * kBs, L}),
      rope(DType::kF32, {kBlocks * kBs, R}), q(DType::kF32, {T, H, D}), sinks(DType::kF32, {H}),
      o(DType::kF32, {T, H, D});
  testing::fill_uniform(lat.view(), 31, -2.f, 2.f);
  testing::fill_uniform(rope.view(), 32, -2.f, 2.f);
  testing::fill_uniform(q.view(), 33, -1.f, 1.f);
  testing::fill_uniform(sinks.view(), 34, -1.f, 2.f);
  std::vector<int32_t> slots(kBlocks * kBs), win(T * W), cmp(T * C);
  for (int32_t i = 0; i < kBlocks * kBs; ++i) slots[i] = (i * 37) % (kBlocks * kBs);
  for (int64_t i = 0; i < T * W; ++i) win[i] = i % 11 == 0 ? -1 : static_cast<int32_t>((i * 13) % (kBlocks * kBs));
  for (int64_t i = 0; i < T * C; ++i) cmp[i] = static_cast<int32_t>((i * 29 + 5) % (kBlocks * kBs));
  const ops::MlaKvCache c{ops::MlaKvFormat::kBf16, L, R, cache.view(), {}, {}};
  Status st =
      ops::bf16_mla_kv_write(lat.view(), rope.view(), TensorView(slots.data(), DType::kI32, {kBlocks * kBs}), c);
  auto* qd = static_cast<float*>(q.data());
  if (st.ok()) {
    st = ops::sharedkv_sparse_attention(TensorView::strided(qd, DType::kF32, {T, H, L}, {H * D, D, 1}),
                                        TensorView::strided(qd + L, DType::kF32, {T, H, R}, {H * D, D, 1}), c,
                                        TensorView(win.data(), DType::kI32, {T, W}), c,
                                        TensorView(cmp.data(), DType::kI32, {T, C}), sinks.view(), 0.044f, o.view());
  }
  std::vector<float> result(static_cast<const float*>(o.data()), static_cast<const float*>(o.data()) + T * H * D);
  for (const auto& [ratio, width, overlap] :
       {std::tuple<int64_t, int64_t, bool>{4, 512, true}, {4, 128, true}, {128, 512, false}}) {
    if (!st.ok()) break;
    const int64_t coff = overlap ? 2 : 1, windows = 3, rows = (windows + (overlap ? 1 : 0)) * ratio;
    testing::OwnedTensor kv(DType::kBF16, {rows, coff * width}), gate(DType::kBF16, {rows, coff * width}),
        ape(DType::kF32, {ratio, coff * width}), e(DType::kF32, {windows, width});
    testing::fill_uniform(kv.view(), 40 + static_cast<uint32_t>(ratio), -2.f, 2.f);
    testing::fill_uniform(gate.view(), 50 + static_cast<uint32_t>(width), -3.f, 3.f);
    testing::fill_uniform(ape.view(), 60, -1.f, 1.f);
    st = ops::kv_compress(kv.view(), gate.view(), ape.view(), ratio, overlap, false, e.view());
    result.insert(result.end(), static_cast<const float*>(e.data()),
                  static_cast<const float*>(e.data()) + windows * width);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "v4 kernels failed: %s\n", st.to_string().c_str());
    return 1;
  }
  const size_t nbytes = result.size() * sizeof(float);
  std::printf("target %.*s: %zu V4 kernel outputs\n", static_cast<int>(ops::build_target().size()),
              ops::build_target().data(), result.size());
  if (!write_bytes(out, result.data(), nbytes)) return 1;
  if (!peer) return 0;
  std::vector<float> other(result.size());
  if (!read_bytes(peer, other.data(), nbytes)) return 1;
  int64_t differ = 0;
  for (size_t i = 0; i < result.size(); ++i) differ += std::memcmp(&result[i], &other[i], sizeof(float)) != 0;
  std::printf("%lld of %zu outputs differ from %s\n", static_cast<long long>(differ), result.size(), peer);
  if (differ != 0) {
    std::fprintf(stderr, "the shared bf16 contract must give the same bits in every generation's build\n");
    return 1;
  }
  return 0;
}

// DeepSeek-V4 through the engine with bf16 rows: every step's logits; with `peer`, every bit must equal the other
// build's (the generations differ only in their quantized representations).
int v4_model(const char* out, const char* peer) {
  testing::TempDir dir;
  if (Status st = model::write_synthetic_checkpoint("tiny-dsv4", 7, dir / "m"); !st.ok()) {
    std::fprintf(stderr, "make-model failed: %s\n", st.to_string().c_str());
    return 1;
  }
  auto ckpt = model::Checkpoint::open(dir / "m");
  auto dev = runtime::DeviceOperator::create({.kv_cache_dtype = "bf16"});
  if (!ckpt.ok() || !dev.ok()) {
    std::fprintf(stderr, "open failed: %s\n", (ckpt.ok() ? dev.status() : ckpt.status()).to_string().c_str());
    return 1;
  }
  auto assembled = engine::assemble_engine(
      *ckpt, *dev, 4, {.engine = {.max_batch = 1, .record_logits = true}, .kv_pool = {.state_slots = 1}}, {});
  if (!assembled.ok()) {
    std::fprintf(stderr, "assembly failed: %s\n", assembled.status().to_string().c_str());
    return 1;
  }
  const int64_t V = ckpt->config().vocab_size;
  engine::Request r;
  for (int i = 0; i < 300; ++i)
    r.prompt.push_back(static_cast<int32_t>(engine::uniform_from(13, i) * static_cast<double>(V)));
  r.max_new_tokens = 32;
  engine::Engine& eng = *(*assembled)->engine;
  if (Status st = eng.submit(r); !st.ok() || !(st = eng.run_to_completion()).ok()) {
    std::fprintf(stderr, "engine failed: %s\n", st.to_string().c_str());
    return 1;
  }
  const engine::RequestResult& res = eng.results().at(0);
  if (res.tokens.size() != 32 || res.logits.size() != 32 * static_cast<size_t>(V)) {
    std::fprintf(stderr, "expected 32 steps of logits, got %zu tokens\n", res.tokens.size());
    return 1;
  }
  const size_t nbytes = res.logits.size() * sizeof(float);
  std::printf("target %.*s: tiny-dsv4, 32 steps after a 300-token prompt, bf16 rows\n",
              static_cast<int>(ops::build_target().size()), ops::build_target().data());
  if (!write_bytes(out, res.logits.data(), nbytes)) return 1;
  if (!peer) return 0;
  std::vector<float> other(res.logits.size());
  if (!read_bytes(peer, other.data(), nbytes)) return 1;
  const int64_t differ = std::memcmp(other.data(), res.logits.data(), nbytes) == 0 ? 0 : 1;
  std::printf("logits %s %s\n", differ ? "differ from" : "equal bit for bit", peer);
  if (differ) {
    std::fprintf(stderr, "the shared bf16 contract must give the same bits in every generation's build\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace genbridge;
  if (argc >= 2 && std::strcmp(argv[1], "--v4-model") == 0) {
    if (argc != 3 && argc != 4) {
      std::fprintf(stderr, "usage: gemma_probe [--qwen35 | --v4-kernels | --v4-model] OUT_FILE [PEER_FILE]\n");
      return 2;
    }
    return v4_model(argv[2], argc == 4 ? argv[3] : nullptr);
  }
  if (argc >= 2 && std::strcmp(argv[1], "--v4-kernels") == 0) {
    if (argc != 3 && argc != 4) {
      std::fprintf(stderr, "usage: gemma_probe [--qwen35 | --v4-kernels | --v4-model] OUT_FILE [PEER_FILE]\n");
      return 2;
    }
    return v4_kernels(argv[2], argc == 4 ? argv[3] : nullptr);
  }
  if (argc >= 2 && std::strcmp(argv[1], "--qwen35") == 0) {
    if (argc != 3 && argc != 4) {
      std::fprintf(stderr, "usage: gemma_probe [--qwen35 | --v4-kernels | --v4-model] OUT_FILE [PEER_FILE]\n");
      return 2;
    }
    return qwen35(argv[2], argc == 4 ? argv[3] : nullptr);
  }
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: gemma_probe [--qwen35 | --v4-kernels | --v4-model] OUT_FILE [PEER_FILE]\n");
    return 2;
  }
  const int64_t rows = 64, cols = 4096;
  testing::OwnedTensor x(DType::kBF16, {rows, cols}), w(DType::kBF16, {cols}), y(DType::kBF16, {rows, cols}),
      rstd(DType::kF32, {rows, 1});
  testing::fill_uniform(x.view(), 2024, -3.f, 3.f);
  testing::fill_uniform(w.view(), 2025, -0.5f, 0.5f);
  const Status st = ops::gemma_rms_norm(x.view(), w.view(), 1e-6f, y.view(), rstd.view());
  if (!st.ok()) {
    std::fprintf(stderr, "gemma_rms_norm failed: %s\n", st.to_string().c_str());
    return 1;
  }
  std::vector<double> w_eff = testing::to_doubles(w.view()), ref_y, ref_rstd;
  for (double& v : w_eff) v += 1.0;
  ref::rms_norm(testing::to_doubles(x.view()), w_eff, rows, 1e-6, ref_y, ref_rstd);
  const std::vector<double> got = testing::to_doubles(y.view());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - ref_y[i]) / (2e-2 + 2e-2 * std::abs(ref_y[i])));
  }
  std::printf("target %.*s: %zu outputs, worst error / tolerance = %.4f\n",
              static_cast<int>(ops::build_target().size()), ops::build_target().data(), got.size(), worst);
  const size_t nbytes = static_cast<size_t>(rows * cols) * sizeof(bf16_t);
  if (!write_bytes(argv[1], y.bytes().data(), nbytes)) return 1;
  if (worst > 1.0) return 1;
  if (argc == 3) {
    std::vector<uint16_t> peer(static_cast<size_t>(rows * cols));
    if (!read_bytes(argv[2], peer.data(), nbytes)) return 1;
    const bf16_t* mine = y.view().data_as<const bf16_t>();
    int64_t differ = 0;
    for (int64_t i = 0; i < rows * cols; ++i) differ += mine[i].bits != peer[i];
    std::printf("%lld of %lld bf16 outputs differ from %s\n", static_cast<long long>(differ),
                static_cast<long long>(rows * cols), argv[2]);
    if (differ == 0) {
      std::fprintf(stderr, "the two builds' outputs are bit-identical; the providers must differ for bf16\n");
      return 1;
    }
  }
  return 0;
}
