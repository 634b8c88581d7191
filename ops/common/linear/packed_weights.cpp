// ops::PackedWeights: the owning form of the dot kernel's packed bf16 layout (ops/common/linear/dot_kernel.h).
#include "genbridge/ops/linear/packed_weights.h"

#include <sys/mman.h>

#include <cstdlib>
#include <string>

#include "ops/common/linear/dot_kernel.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops {

size_t PackedWeights::packed_bytes(int64_t rows, int64_t cols) {
  return detail::packed_bf16_words(rows, cols) * sizeof(uint32_t);  // whole 64-byte lines: 16 words per step pair
}

std::shared_ptr<void> allocate_packed(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = bytes >= kHuge ? kHuge : 64;
  const size_t size = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size == 0 ? align : size);
  if (!p) return nullptr;
  // Advice only: where transparent huge pages are off, the memory is ordinary pages.
  if (align == kHuge) (void)madvise(p, size, MADV_HUGEPAGE);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

Result<PackedWeights> PackedWeights::pack(const TensorView& w, void* dst) {
  constexpr const char* kOp = "pack_weights";
  if (w.dtype() != DType::kBF16) {
    return invalid_argument("pack_weights: w has dtype " + std::string(dtype_name(w.dtype())) +
                            "; only bf16 weights are packed");
  }
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "w", w, 2, "([N, K])"));
  GB_RETURN_IF_ERROR(detail::check_unit_last_stride(kOp, "w", w));
  PackedWeights p;
  p.rows_ = w.dim(0);
  p.cols_ = w.dim(1);
  const size_t bytes = packed_bytes(p.rows_, p.cols_);
  if (bytes == 0) return p;
  if (!dst) {
    p.own_ = allocate_packed(bytes);
    if (!p.own_) return resource_exhausted("pack_weights: cannot allocate " + std::to_string(bytes) + " bytes");
    dst = p.own_.get();
  }
  detail::pack_bf16_panels(w.data_as<const bf16_t>(), w.stride(0), p.rows_, p.cols_, static_cast<uint32_t*>(dst));
  p.words_ = static_cast<const uint32_t*>(dst);
  return p;
}

}  // namespace genbridge::ops
