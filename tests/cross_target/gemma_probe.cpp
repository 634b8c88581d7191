// Cross-target probe: runs gemma_rms_norm on fixed bf16 inputs, checks the contract tolerance against
// the fp64 oracle, and writes the output bits to a file so two target builds can be compared.
// Usage: gemma_probe OUT_FILE [PEER_FILE]. Exit 0 only when every element is within tolerance and,
// given PEER_FILE (another build's OUT_FILE), when at least one output bit differs from it.
#include <cmath>
#include <cstdio>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/ops/norm/gemma_rms_norm.h"
#include "ops/common/norm/norm_ref.h"
#include "support/tensor_util.h"

int main(int argc, char** argv) {
  using namespace genbridge;
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: gemma_probe OUT_FILE [PEER_FILE]\n");
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
  std::printf("target %.*s: %zu outputs, worst error / tolerance = %.4f\n", static_cast<int>(ops::build_target().size()),
              ops::build_target().data(), got.size(), worst);
  const size_t nbytes = static_cast<size_t>(rows * cols) * sizeof(bf16_t);
  FILE* f = std::fopen(argv[1], "wb");
  if (!f || std::fwrite(y.bytes().data(), 1, nbytes, f) != nbytes) {
    std::fprintf(stderr, "cannot write %s\n", argv[1]);
    return 1;
  }
  std::fclose(f);
  if (worst > 1.0) return 1;
  if (argc == 3) {
    std::vector<uint16_t> peer(static_cast<size_t>(rows * cols));
    FILE* p = std::fopen(argv[2], "rb");
    if (!p || std::fread(peer.data(), 1, nbytes, p) != nbytes) {
      std::fprintf(stderr, "cannot read %s\n", argv[2]);
      return 1;
    }
    std::fclose(p);
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
