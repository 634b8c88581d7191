// CPU target selection for the Highway-dispatched kernels (include/genbridge/core/cpu_target.h).
#include <hwy/highway.h>
#include <hwy/targets.h>
#if HWY_ARCH_X86 && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/simd/dispatch.h"
#include "genbridge/core/cpu_target.h"

namespace genbridge {
namespace {

// Our names for Highway's targets: what users type in GENBRIDGE_CPU_TARGET and read in logs.
const char* name_of(int64_t t) {
  switch (t) {
#if HWY_ARCH_X86
    case HWY_AVX3_DL: return "avx512_dl";
    case HWY_AVX3: return "avx512";
    case HWY_AVX2: return "avx2";
    case HWY_SSE4: return "sse4";
    case HWY_SSSE3: return "ssse3";
#endif
#if HWY_ARCH_ARM
    case HWY_SVE2_128: return "sve2_128";
    case HWY_SVE_256: return "sve_256";
    case HWY_SVE2: return "sve2";
    case HWY_SVE: return "sve";
    case HWY_NEON: return "neon";
#endif
    case HWY_EMU128: return "scalar";
    case HWY_SCALAR: return "scalar";
    default: return "unknown";
  }
}

// Single target bits of `mask`, best (lowest bit) first.
std::vector<int64_t> bits_of(int64_t mask) {
  std::vector<int64_t> out;
  for (int64_t m = mask; m != 0; m &= m - 1) out.push_back(m & -m);
  return out;
}

std::mutex g_mu;
int64_t g_real = 0;  // what the CPU supports among the compiled targets (before any restriction)

// The bf16 dot-product instruction (AVX512_BF16) has a target name of its own beside avx512, so that
// GENBRIDGE_CPU_TARGET=avx512 runs the AVX-512 kernels without it (and tests compare the two).
constexpr std::string_view kBf16DotName = "avx512_bf16";
std::atomic<bool> g_bf16_dot{false};
int64_t real_targets_locked();

bool cpu_has_bf16_dot_locked() {
#if HWY_ARCH_X86 && defined(__GNUC__)
  return (real_targets_locked() & (HWY_AVX3 | HWY_AVX3_DL)) != 0 && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

#if HWY_ARCH_X86 && defined(__GNUC__)
#define GB_DOT_PROBE_TARGET __attribute__((target("avx512f,avx512bf16,fma"), noinline))
// A value that depends on every chain (so that none is optimized away).
GB_DOT_PROBE_TARGET float Sum(const __m512 (&a)[16]) {
  __m512 s = a[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, a[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float t = 0;
  for (float v : lanes) t += v;
  return t;
}
// 16 independent chains of one instruction each, so that its throughput, not its latency, bounds the loop.
GB_DOT_PROBE_TARGET float DotChains(int64_t iters, float seed) {
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3F803F80), y = (__m512bh)_mm512_set1_epi32(0x3F7F3F7F);
  __m512 a[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_set1_ps(seed + static_cast<float>(i));
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 16; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, y);
  return Sum(a);
}
GB_DOT_PROBE_TARGET float FmaChains(int64_t iters, float seed) {
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
  __m512 a[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_set1_ps(seed + static_cast<float>(i));
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 16; ++i) a[i] = _mm512_fmadd_ps(a[i], x, y);
  return Sum(a);
}
#undef GB_DOT_PROBE_TARGET
#endif

// The bf16 dot instruction's arithmetic rate over the FMA's on this CPU (flops per second; one vdpbf16ps is 32
// pair products and sums, 64 flops, one 512-bit FMA 32), measured once per process on the calling thread: a few
// alternated runs of register-only loops, about 0.25 ms in all, each at its best. 0 where the CPU lacks it.
// The roofs benchmark's loops give 2.0 on AMD Zen 5 and 0.49 on an Intel Xeon (family 6 model 207); this probe
// 0.50-0.53 on the latter (docs/bench/targets.md).
double g_dot_rate = -1;
double bf16_dot_rate_locked() {
  if (g_dot_rate >= 0) return g_dot_rate;
  g_dot_rate = 0;
#if HWY_ARCH_X86 && defined(__GNUC__)
  if (!cpu_has_bf16_dot_locked()) return g_dot_rate;
  constexpr int64_t kIters = 2048;
  volatile float seed = 1.0f;
  volatile float sink = 0;
  double dot = 1e30, fma = 1e30;
  const auto seconds = [&](float (*loop)(int64_t, float)) {
    const auto t0 = std::chrono::steady_clock::now();
    sink = sink + loop(kIters, seed);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int round = 0; round < 6; ++round) {  // the first runs also wake the vector units
    dot = std::min(dot, seconds(DotChains));
    fma = std::min(fma, seconds(FmaChains));
  }
  g_dot_rate = (simd::kBf16DotChainsFlopsPerIter / dot) / (16.0 * 32 / fma);  // a 512-bit FMA: 32 flops
#endif
  return g_dot_rate;
}

// Whether "best" takes the instruction: where it computes at least as fast as the FMAs. Where it is slower
// (half the FMA rate on the Intel Xeon measured) the avx512 kernels, which compute the same bits with FMAs, are
// faster on every bf16 row of the linear benchmark from 8 input rows on, and as fast for one.
bool bf16_dot_pays_locked() { return bf16_dot_rate_locked() >= 1.0; }

int64_t real_targets_locked() {  // (declared above)
  if (g_real == 0) {
    hwy::SetSupportedTargetsForTest(0);  // no restriction while we read the CPU's own set
    g_real = hwy::SupportedTargets() & HWY_TARGETS;
  }
  return g_real;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// What a target name asks for: Highway's targets restricted to `below` and everything under it (numerically
// higher bits; 0: no restriction), and whether the bf16 dot instruction runs on top of the best of them.
struct Choice {
  int64_t below = 0;
  enum class Dot { kNo, kWherePays, kYes } dot = Dot::kNo;
};
constexpr Choice kBest{0, Choice::Dot::kWherePays};

void restrict_locked(Choice c) {
  const int64_t real = real_targets_locked();
  const int64_t allowed = c.below == 0 ? real : real & ~(c.below - 1);
  hwy::SetSupportedTargetsForTest(allowed == real ? 0 : allowed);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  const bool dot = cpu_has_bf16_dot_locked() &&
                   (c.dot == Choice::Dot::kYes || (c.dot == Choice::Dot::kWherePays && bf16_dot_pays_locked()));
  g_bf16_dot.store(dot, std::memory_order_relaxed);
}

// The choice named `name` ("best": no restriction, the instruction where it pays; "avx512_bf16" where the CPU has
// it: the instruction in any case); nullopt when this build or CPU cannot run it.
std::optional<Choice> parse(std::string_view name) {
  if (name == "best") return kBest;
  std::lock_guard<std::mutex> lock(g_mu);
  if (name == kBf16DotName)
    return cpu_has_bf16_dot_locked() ? std::optional<Choice>(Choice{0, Choice::Dot::kYes}) : std::nullopt;
  for (int64_t t : bits_of(real_targets_locked()))
    if (name == name_of(t)) return Choice{t, Choice::Dot::kNo};
  return std::nullopt;
}

}  // namespace

std::vector<std::string> cpu_targets_compiled() {
  std::vector<std::string> out;
#if HWY_ARCH_X86
  if ((HWY_TARGETS & (HWY_AVX3 | HWY_AVX3_DL)) != 0) out.emplace_back(kBf16DotName);
#endif
  for (int64_t t : bits_of(HWY_TARGETS)) out.push_back(name_of(t));
  return out;
}

std::vector<std::string> cpu_targets_available() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<std::string> out;
  for (int64_t t : bits_of(real_targets_locked())) out.push_back(name_of(t));
  // Best first: the instruction above the AVX-512 code where it pays, just below it where it does not.
  if (cpu_has_bf16_dot_locked()) out.insert(out.begin() + (bf16_dot_pays_locked() ? 0 : 1), std::string(kBf16DotName));
  return out;
}

std::string cpu_target() {
  simd::ensure_cpu_target();
  if (simd::bf16_dot_enabled()) return std::string(kBf16DotName);
  const int64_t chosen = hwy::SupportedTargets() & HWY_TARGETS;
  return chosen == 0 ? "scalar" : name_of(chosen & -chosen);
}

Status set_cpu_target(std::string_view name) {
  const std::optional<Choice> t = parse(name);
  if (!t) {
    return invalid_argument("CPU target '" + std::string(name) + "' is not available here; available: " +
                            join(cpu_targets_available()) + " (or best); compiled into this build: " +
                            join(cpu_targets_compiled()));
  }
  simd::ensure_cpu_target();  // the environment's choice first, so that this call overrides it
  std::lock_guard<std::mutex> lock(g_mu);
  restrict_locked(*t);
  return ok_status();
}

Result<std::string> cpu_target_from_env() {
  const char* env = std::getenv(kCpuTargetEnv.data());
  if (env == nullptr || *env == '\0') return std::string();
  if (!parse(env)) {
    return invalid_argument(std::string(kCpuTargetEnv) + "=" + env + ": not a CPU target this machine can run; available: " +
                            join(cpu_targets_available()) + " (or best); compiled into this build: " +
                            join(cpu_targets_compiled()));
  }
  return std::string(env);
}

std::string cpu_target_line() {
  std::string line = "cpu target: " + cpu_target() + " (available: " + join(cpu_targets_available()) + ")";
  if (const double rate = cpu_bf16_dot_rate(); rate > 0) {
    char buf[96];
    std::snprintf(buf, sizeof buf, ", the bf16 dot instruction at %.2fx the FMA rate here", rate);
    line += buf;
  }
  return line;
}

double cpu_bf16_dot_rate() {
  std::lock_guard<std::mutex> lock(g_mu);
  return bf16_dot_rate_locked();
}

namespace simd {

float bf16_dot_chains(int64_t iters, float seed) {
#if HWY_ARCH_X86 && defined(__GNUC__)
  return DotChains(iters, seed);
#else
  (void)iters;
  return seed;
#endif
}

bool bf16_dot_enabled() { return g_bf16_dot.load(std::memory_order_relaxed); }

void ensure_cpu_target() {
  static const bool applied = [] {
    const auto env = cpu_target_from_env();  // an invalid value is ignored here (the CLI refuses it first)
    const Choice c = env.ok() && !env->empty() ? parse(*env).value_or(kBest) : kBest;
    std::lock_guard<std::mutex> lock(g_mu);
    restrict_locked(c);
    return true;
  }();
  (void)applied;
}

}  // namespace simd
}  // namespace genbridge
