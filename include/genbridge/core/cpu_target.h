#pragma once
// The CPU instruction-set target the host kernels run on. Every hot kernel is compiled for several targets
// (Google Highway: scalar, sse4, avx2, avx512 on x86-64; scalar and neon on aarch64; plus avx512_bf16, the
// avx512 code with the AVX512_BF16 dot-product instruction for bf16 weights, where the CPU has it) and the best one
// this CPU supports is chosen once per process: the highest instruction set, with the bf16 dot instruction where it
// computes at least as fast as the FMAs (measured once per process, cpu_bf16_dot_rate). Results are the same bits on every target: the kernels'
// reduction-order contracts do not depend on the vector width.
//
// This is instruction-set dispatch inside the host backend. It has nothing to do with the provider target
// (the accelerator generation), which the build chooses and nothing at run time changes.

#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/status.h"

namespace genbridge {

// The environment variable that restricts the kernels to a lower target than the CPU's best (e.g. to
// measure or test the avx2 path on an AVX-512 machine).
inline constexpr std::string_view kCpuTargetEnv = "GENBRIDGE_CPU_TARGET";

// The target the kernels run on now, e.g. "avx2". Applies GENBRIDGE_CPU_TARGET on first use (an invalid
// value is ignored here; cpu_target_from_env reports it, and the CLI refuses it first).
std::string cpu_target();
// The targets compiled into this build that this CPU can run, best first: the first is the one "best" picks (the
// last is always "scalar").
std::vector<std::string> cpu_targets_available();
// Every target compiled into this build, best first, whether or not this CPU runs it.
std::vector<std::string> cpu_targets_compiled();
// Restricts the kernels to `name` (one of cpu_targets_available()) and the targets below it; "best" lifts
// the restriction. Not to be called while kernels run on other threads (start-up and tests only).
// InvalidArgument names the value and the available targets.
Status set_cpu_target(std::string_view name);
// The target GENBRIDGE_CPU_TARGET asks for: "" when unset or empty; InvalidArgument naming the variable,
// its value and the available targets when this build or this CPU cannot run it. Reads the environment.
Result<std::string> cpu_target_from_env();
// One line for logs and `genbridge info`: "cpu target: avx2 (available: avx512 avx2 sse4 scalar)", and where the
// CPU has the bf16 dot instruction ", the bf16 dot instruction at 0.49x the FMA rate here".
std::string cpu_target_line();
// The bf16 dot instruction's arithmetic rate over the FMA's on this CPU, flops per second (measured on first call,
// about 0.25 ms; later calls return that figure); 0 where the CPU lacks the instruction. "best" takes the
// instruction where this is at least 1, and cpu_targets_available() lists avx512_bf16 just below avx512 elsewhere.
double cpu_bf16_dot_rate();

}  // namespace genbridge
