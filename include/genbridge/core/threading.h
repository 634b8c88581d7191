#pragma once
// Worker-thread count used by multi-threaded host kernels. Results never depend on it where an op's
// contract says so (work is split by rows, never inside a reduction).

namespace genbridge {

// Number of threads kernels may use (>= 1). Defaults to GENBRIDGE_NUM_THREADS or the hardware count.
int num_threads();
// Sets the thread count for subsequent kernel calls; n <= 0 restores the default.
void set_num_threads(int n);

}  // namespace genbridge
