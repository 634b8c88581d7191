// CPU target selection for the Highway-dispatched kernels (include/genbridge/core/cpu_target.h).
#include <hwy/highway.h>
#include <hwy/targets.h>

#include <atomic>
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

// The bf16 dot-product instruction (AVX512_BF16) has a target name of its own above avx512, so that
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

// Restricts to `target` and everything below it (numerically higher bits); 0 lifts the restriction (and allows the
// bf16 dot instruction where the CPU has it).
void restrict_locked(int64_t target) {
  const int64_t real = real_targets_locked();
  const int64_t allowed = target == 0 ? real : real & ~(target - 1);
  hwy::SetSupportedTargetsForTest(allowed == real ? 0 : allowed);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  g_bf16_dot.store(target == 0 && cpu_has_bf16_dot_locked(), std::memory_order_relaxed);
}

// The target bit named `name` ("best", and "avx512_bf16" where the CPU has it: 0, no restriction); nullopt when
// this build or CPU cannot run it.
std::optional<int64_t> parse(std::string_view name) {
  if (name == "best") return int64_t{0};
  std::lock_guard<std::mutex> lock(g_mu);
  if (name == kBf16DotName) return cpu_has_bf16_dot_locked() ? std::optional<int64_t>(0) : std::nullopt;
  for (int64_t t : bits_of(real_targets_locked()))
    if (name == name_of(t)) return t;
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
  if (cpu_has_bf16_dot_locked()) out.emplace_back(kBf16DotName);
  for (int64_t t : bits_of(real_targets_locked())) out.push_back(name_of(t));
  return out;
}

std::string cpu_target() {
  simd::ensure_cpu_target();
  if (simd::bf16_dot_enabled()) return std::string(kBf16DotName);
  const int64_t chosen = hwy::SupportedTargets() & HWY_TARGETS;
  return chosen == 0 ? "scalar" : name_of(chosen & -chosen);
}

Status set_cpu_target(std::string_view name) {
  const std::optional<int64_t> t = parse(name);
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
  return "cpu target: " + cpu_target() + " (available: " + join(cpu_targets_available()) + ")";
}

namespace simd {

bool bf16_dot_enabled() { return g_bf16_dot.load(std::memory_order_relaxed); }

void ensure_cpu_target() {
  static const bool applied = [] {
    const auto env = cpu_target_from_env();  // an invalid value is ignored here (the CLI refuses it first)
    const int64_t t = env.ok() && !env->empty() ? parse(*env).value_or(0) : 0;
    std::lock_guard<std::mutex> lock(g_mu);
    restrict_locked(t);
    return true;
  }();
  (void)applied;
}

}  // namespace simd
}  // namespace genbridge
