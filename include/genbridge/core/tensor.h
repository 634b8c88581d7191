#pragma once
// TensorView: a non-owning, device-tagged view of a strided tensor. Shapes are element counts and
// strides are in elements (not bytes). A view never owns or frees its memory.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "genbridge/core/dtype.h"

namespace genbridge {

// Where the memory lives. Host providers only accept kHost; a future device provider adds its kind.
enum class DeviceKind : uint8_t { kHost };

struct Device {
  DeviceKind kind = DeviceKind::kHost;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
};

inline constexpr int kMaxRank = 8;

class TensorView {
 public:
  TensorView() = default;
  // Contiguous (row-major) view of `data` with `shape`. Does not retain or copy `data`.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {});
  // Contiguous view with the shape given as a pointer and count.
  TensorView(void* data, DType dtype, const int64_t* shape, int rank, Device device = {});
  // Explicitly strided view; `strides` are in elements and may be any non-negative values.
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides, Device device = {});

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int rank() const { return rank_; }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank_ : i]; }
  int64_t stride(int i) const { return strides_[i < 0 ? i + rank_ : i]; }
  const int64_t* shape() const { return shape_.data(); }
  const int64_t* strides() const { return strides_.data(); }
  int64_t numel() const;
  bool is_contiguous() const;
  // "[2, 3, 4]"
  std::string shape_string() const;

  // View of rows [begin, end) along dimension 0 (no copy).
  TensorView slice0(int64_t begin, int64_t end) const;
  // View with a new shape; requires a contiguous view. Returns an empty view (rank -1) on mismatch.
  TensorView reshaped(std::initializer_list<int64_t> shape) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_{};
  int rank_ = 0;
  std::array<int64_t, kMaxRank> shape_{};
  std::array<int64_t, kMaxRank> strides_{};
};

}  // namespace genbridge
