#pragma once
// A bf16 weight matrix in the dot kernel's packed layout (docs/linear.md, "Packed weights"): re-laid out
// once, at load, so that a call with any number of input rows reads the weight bytes front to back with
// every row of a tile in registers and packs nothing per call. Results are the same bits as the matrix
// it came from (the products and their order are the contract's).

#include <cstddef>
#include <cstdint>
#include <memory>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

class PackedWeights {
 public:
  PackedWeights() = default;
  // Bytes the packed form of a [rows, cols] matrix takes (a multiple of 64; rows padded to a multiple of 16,
  // cols to a multiple of 32).
  static size_t packed_bytes(int64_t rows, int64_t cols);
  // Packs w: bf16 [N, K], unit stride along K, any row stride; retains no view of w. dst: packed_bytes(N, K)
  // bytes, 64-byte aligned, that the caller keeps alive as long as the result (e.g. from allocate_packed,
  // shared by many matrices); nullptr: storage of its own (allocate_packed). Single-threaded.
  static Result<PackedWeights> pack(const TensorView& w, void* dst = nullptr);
  int64_t rows() const { return rows_; }  // N
  int64_t cols() const { return cols_; }  // K
  size_t bytes() const { return packed_bytes(rows_, cols_); }
  // Internal: the layout's words (ops/common/linear/dot_kernel.h).
  const uint32_t* words() const { return words_; }

 private:
  std::shared_ptr<void> own_;
  const uint32_t* words_ = nullptr;
  int64_t rows_ = 0, cols_ = 0;
};

// Memory for packed weights: 64-byte aligned; from 2 MiB up, 2 MiB-aligned and advised as transparent huge
// pages (packed weights are read as long streams, and with 4 KiB pages every 4 KiB costs a page walk: measured
// in docs/bench/engine.md). Null when the allocation fails.
std::shared_ptr<void> allocate_packed(size_t bytes);

}  // namespace genbridge::ops
