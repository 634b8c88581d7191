#pragma once
// Worker-thread count used by multi-threaded host kernels. Results never depend on it where an op's
// contract says so (work is split by rows, never inside a reduction).

#include <string_view>

#include "genbridge/core/status.h"

namespace genbridge {

// Most threads one parallel loop uses (the pool's limit); larger requests are clamped to it.
inline constexpr int kMaxNumThreads = 255;
// The environment variable that sets the default thread count.
inline constexpr std::string_view kNumThreadsEnv = "GENBRIDGE_NUM_THREADS";

// Number of threads kernels may use (1..kMaxNumThreads). Defaults to GENBRIDGE_NUM_THREADS when it is
// valid (see num_threads_from_env), else the hardware count.
int num_threads();
// Sets the thread count for subsequent kernel calls; n <= 0 restores the default.
void set_num_threads(int n);
// The count GENBRIDGE_NUM_THREADS asks for: 0 when it is unset or empty; InvalidArgument naming the
// variable and its value when it is not a base-10 integer in [1, kMaxNumThreads]. Reads the environment.
Result<int> num_threads_from_env();

}  // namespace genbridge
