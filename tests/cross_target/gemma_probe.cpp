// Cross-target probe: runs gemma_rms_norm on fixed bf16 inputs, checks the contract tolerance against
// the fp64 oracle, and writes the output bits to a file so two target builds can be compared.
// With --qwen35 it runs a Qwen3.5-MoE checkpoint instead (make-model's tiny-qwen35, whose input, post-attention,
// final and q/k norms are Gemma norms) through the engine: each build within tolerance of the fp64 reference,
// and the two generations' Gemma providers visible in the model's outputs (some logits differ).
// Usage: gemma_probe [--qwen35] OUT_FILE [PEER_FILE]. Exit 0 only when every element is within tolerance and,
// given PEER_FILE (another build's OUT_FILE), when at least one output bit differs from it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "genbridge/build_info.h"
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

}  // namespace

int main(int argc, char** argv) {
  using namespace genbridge;
  if (argc >= 2 && std::strcmp(argv[1], "--qwen35") == 0) {
    if (argc != 3 && argc != 4) {
      std::fprintf(stderr, "usage: gemma_probe [--qwen35] OUT_FILE [PEER_FILE]\n");
      return 2;
    }
    return qwen35(argv[2], argc == 4 ? argv[3] : nullptr);
  }
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: gemma_probe [--qwen35] OUT_FILE [PEER_FILE]\n");
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
