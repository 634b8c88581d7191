#pragma once
// The cross-CPU bit-identity check: every stable op of the build and the engine, run on fixed
// inputs under every CPU target this machine can run, must give the same output bytes. Each case also
// prints one line "cross_cpu digest <case> <FNV-1a 64 of its output bytes>" so that the digests of two
// machines (x86-64 and aarch64 under qemu, see tests/cross_cpu/CMakeLists.txt) can be compared.
//
// Inputs come from a fixed integer generator (no <random> distributions, whose algorithms the standard
// leaves to the library) and include tails (sizes not multiple of 16), strided views, -0, subnormals,
// large magnitudes and, where the op defines the result, NaN and infinities.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "genbridge/core/formats.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "support/each_cpu_target.h"

namespace genbridge::cross_cpu {

// A tensor that owns its bytes: contiguous, or rank-2 with a row stride (the gap is filled too, so a
// kernel reading it would be caught, and hashed on output, so a kernel writing it would be).
class Buf {
 public:
  Buf(DType dtype, std::vector<int64_t> shape, int64_t row_stride = 0)
      : dtype_(dtype), shape_(std::move(shape)), row_stride_(row_stride) {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    if (row_stride_ > 0) n = (shape_[0] - 1) * row_stride_ + shape_[1];
    elems_ = n;
    bytes_.assign(static_cast<size_t>(n) * dtype_size(dtype_), std::byte{0});
  }
  TensorView view() {
    if (row_stride_ > 0) return TensorView::strided(bytes_.data(), dtype_, {shape_[0], shape_[1]}, {row_stride_, 1});
    return TensorView(bytes_.data(), dtype_, shape_.data(), static_cast<int>(shape_.size()));
  }
  DType dtype() const { return dtype_; }
  int64_t elems() const { return elems_; }
  std::vector<std::byte>& bytes() { return bytes_; }
  template <typename T>
  T* as() { return reinterpret_cast<T*>(bytes_.data()); }

 private:
  DType dtype_;
  std::vector<int64_t> shape_;
  int64_t row_stride_ = 0;
  int64_t elems_ = 0;
  std::vector<std::byte> bytes_;
};

// splitmix64: the same sequence on every machine.
class Gen {
 public:
  explicit Gen(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // A multiple of 2^-24 in [lo, hi): exact in fp32 for the ranges used here.
  float uniform(float lo, float hi) {
    const float u = static_cast<float>(next() >> 40) * 0x1p-24f;
    return lo + (hi - lo) * u;
  }

 private:
  uint64_t s_;
};

inline void set_float(Buf& b, int64_t i, float v) {
  switch (b.dtype()) {
    case DType::kF32: b.as<float>()[i] = v; break;
    case DType::kBF16: b.as<bf16_t>()[i] = float_to_bf16(v); break;
    case DType::kF16: b.as<fp16_t>()[i] = float_to_fp16(v); break;
    default: ADD_FAILURE() << "set_float: not a float dtype"; break;
  }
}

// Edge values sprinkled into float inputs (every 29th element, in turn).
enum class Edges { kNone, kFinite, kNonFinite };

// Fills every element of the buffer (gaps included) with uniform values in [lo, hi); with edges, every
// 29th element is in turn -0, +0, a subnormal (of fp32, or of the tensor's type), a large value, and with
// kNonFinite also NaN, +inf, -inf.
inline void fill(Buf& b, uint64_t seed, float lo = -2.f, float hi = 2.f, Edges edges = Edges::kFinite) {
  Gen g(seed);
  const float big = b.dtype() == DType::kF16 ? 6.0e4f : 3.0e4f;
  const float tiny = b.dtype() == DType::kF16 ? 3.0e-7f : 1.0e-39f;
  std::vector<float> specials = {-0.0f, 0.0f, tiny, -big, big};
  if (edges == Edges::kNonFinite) {
    specials.insert(specials.end(), {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity()});
  }
  size_t k = 0;
  for (int64_t i = 0; i < b.elems(); ++i) {
    float v = g.uniform(lo, hi);
    if (edges != Edges::kNone && i % 29 == 17) v = specials[k++ % specials.size()];
    set_float(b, i, v);
  }
}

inline void fill_bytes(Buf& b, uint64_t seed) {
  Gen g(seed);
  for (auto& x : b.bytes()) x = static_cast<std::byte>(g.next() >> 56);
}

// One output of a case: its bytes and element type (for the digest's NaN canonicalisation).
struct Output {
  DType dtype;
  std::vector<std::byte> bytes;
};
struct CaseResult {
  bool unimplemented = false;  // the op is not in this build (Unimplemented): nothing to compare
  std::vector<Output> outputs;
};

inline Output output_of(Buf& b) { return {b.dtype(), b.bytes()}; }
inline Output output_of(DType dtype, const void* p, size_t n) {
  std::vector<std::byte> bytes(n);
  if (n) std::memcpy(bytes.data(), p, n);
  return {dtype, std::move(bytes)};
}

// Result of an op call inside a case: Unimplemented marks the case; any other error fails the test.
inline bool op_ok(const Status& st, CaseResult& r) {
  if (st.ok()) return true;
  if (st.code() == StatusCode::kUnimplemented) {
    r.unimplemented = true;
  } else {
    ADD_FAILURE() << st.to_string();
  }
  return false;
}

// FNV-1a 64 of the outputs. NaNs of fp32/bf16/fp16 outputs are hashed as one canonical NaN: the hardware's
// generated NaN differs between instruction sets (x86-64 makes the negative quiet NaN, Arm the positive
// one), and the ops' contracts say "NaN", not which. The same-machine comparison is exact, NaNs included.
inline uint64_t digest(const CaseResult& r) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto eat = [&](const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 0x100000001b3ull;
  };
  for (const Output& o : r.outputs) {
    const size_t n = o.bytes.size();
    eat(&n, sizeof n);
    if (o.dtype == DType::kF32) {
      for (size_t i = 0; i + 4 <= n; i += 4) {
        uint32_t u;
        std::memcpy(&u, o.bytes.data() + i, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) u = 0x7fc00000u;
        eat(&u, 4);
      }
    } else if (o.dtype == DType::kBF16 || o.dtype == DType::kF16) {
      const uint16_t inf = o.dtype == DType::kBF16 ? 0x7f80 : 0x7c00;
      const uint16_t qnan = o.dtype == DType::kBF16 ? 0x7fc0 : 0x7e00;
      for (size_t i = 0; i + 2 <= n; i += 2) {
        uint16_t u;
        std::memcpy(&u, o.bytes.data() + i, 2);
        if ((u & 0x7fff) > inf) u = qnan;
        eat(&u, 2);
      }
    } else {
      eat(o.bytes.data(), n);
    }
  }
  return h;
}

// Runs `run` under every available CPU target, asserts the outputs are byte-identical to the first
// (best) target's, and prints the case's digest line.
inline void check_case(const std::string& name, const std::function<CaseResult()>& run) {
  SCOPED_TRACE("case " + name);
  std::vector<std::string> targets;
  std::vector<CaseResult> results;
  genbridge::testing::for_each_cpu_target([&](const std::string& t) {
    targets.push_back(t);
    results.push_back(run());
  });
  ASSERT_FALSE(results.empty());
  const CaseResult& first = results[0];
  for (size_t i = 1; i < results.size(); ++i) {
    const CaseResult& r = results[i];
    ASSERT_EQ(r.unimplemented, first.unimplemented) << targets[i] << " vs " << targets[0];
    ASSERT_EQ(r.outputs.size(), first.outputs.size()) << targets[i] << " vs " << targets[0];
    for (size_t o = 0; o < r.outputs.size(); ++o) {
      const auto& a = first.outputs[o].bytes;
      const auto& b = r.outputs[o].bytes;
      ASSERT_EQ(a.size(), b.size());
      size_t diff = 0;
      while (diff < a.size() && a[diff] == b[diff]) ++diff;
      EXPECT_EQ(diff, a.size()) << "output " << o << " of case " << name << ": cpu target " << targets[i]
                                << " differs from " << targets[0] << " first at byte " << diff << " of " << a.size();
    }
  }
  if (first.unimplemented) {
    std::printf("cross_cpu digest %s unimplemented\n", name.c_str());
  } else {
    std::printf("cross_cpu digest %s %016llx\n", name.c_str(), static_cast<unsigned long long>(digest(first)));
  }
  std::fflush(stdout);
}

inline const char* short_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    default: return "other";
  }
}

inline constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

}  // namespace genbridge::cross_cpu
