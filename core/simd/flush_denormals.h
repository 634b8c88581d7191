#pragma once
// Internal: a scope in which the calling thread's floating-point unit treats denormal inputs as zero and flushes
// denormal results to zero (tininess detected before rounding), restoring the previous mode on exit. This is the
// denormal behaviour of the CPU's bf16 dot-product instruction (AVX512_BF16 vdpbf16ps ignores the control
// register and always works this way), so that plain fused multiply-adds run inside the scope give its bits:
// x86-64 sets MXCSR.FTZ and MXCSR.DAZ, aarch64 sets FPCR.FZ (which flushes inputs and results of single-precision
// operations, scalar and vector). The bf16 dot contract is in ops/common/linear/dot_kernel.h.
//
// Arithmetic meant to run in the mode must be in functions called (not inlined) from the scope: the compiler does
// not order floating-point operations against the control register write.

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace genbridge::simd {

class FlushDenormals {
 public:
  FlushDenormals() {
#if defined(__x86_64__) || defined(__i386__)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | kFtz | kDaz);
#elif defined(__aarch64__)
    uint64_t v;
    __asm__ volatile("mrs %0, fpcr" : "=r"(v));
    saved_ = v;
    __asm__ volatile("msr fpcr, %0" : : "r"(v | kFz));
#endif
  }
  ~FlushDenormals() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(static_cast<unsigned>(saved_));
#elif defined(__aarch64__)
    __asm__ volatile("msr fpcr, %0" : : "r"(saved_));
#endif
  }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  static constexpr unsigned kFtz = 0x8000u, kDaz = 0x0040u;  // MXCSR bits 15 and 6
  static constexpr uint64_t kFz = uint64_t{1} << 24;         // FPCR.FZ
  uint64_t saved_ = 0;
};

}  // namespace genbridge::simd
