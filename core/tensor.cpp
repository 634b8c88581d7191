#include "genbridge/core/tensor.h"

#include "genbridge/core/status.h"

namespace genbridge {
namespace {
void fill_contiguous_strides(int rank, const int64_t* shape, int64_t* strides) {
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
}
}  // namespace

TensorView::TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device)
    : TensorView(data, dtype, shape.begin(), static_cast<int>(shape.size()), device) {}

TensorView::TensorView(void* data, DType dtype, const int64_t* shape, int rank, Device device)
    : data_(data), dtype_(dtype), device_(device), rank_(rank) {
  GB_CHECK(rank >= 0 && rank <= kMaxRank, "tensor rank must be in [0, 8]");
  for (int i = 0; i < rank; ++i) shape_[i] = shape[i];
  fill_contiguous_strides(rank_, shape_.data(), strides_.data());
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides, Device device) {
  GB_CHECK(shape.size() == strides.size(), "shape and strides must have the same rank");
  TensorView v(data, dtype, shape, device);
  int i = 0;
  for (int64_t s : strides) v.strides_[i++] = s;
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= shape_[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t s = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape_[i]);
  }
  return s + "]";
}

TensorView TensorView::slice0(int64_t begin, int64_t end) const {
  GB_CHECK(rank_ >= 1 && begin >= 0 && begin <= end && end <= shape_[0], "slice0 out of range");
  TensorView v = *this;
  v.data_ = static_cast<char*>(data_) + static_cast<int64_t>(dtype_size(dtype_)) * begin * strides_[0];
  v.shape_[0] = end - begin;
  return v;
}

TensorView TensorView::reshaped(std::initializer_list<int64_t> shape) const {
  TensorView v(data_, dtype_, shape, device_);
  if (!is_contiguous() || v.numel() != numel()) {
    v.rank_ = -1;
  }
  return v;
}

}  // namespace genbridge
