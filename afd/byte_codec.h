#pragma once
// Internal: the one byte codec of what ranks hand each other through Connector::gather (a rank's metrics,
// an attention rank's engine results). Every rank of a job runs the same process image, so values travel
// in native byte order and floats as their bits; trivially copyable values only.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace genbridge::afd {

class ByteWriter {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put_bytes(&v, sizeof(T));
  }
  // The element count (uint64) then the elements.
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<uint64_t>(v.size());
    if (!v.empty()) put_bytes(v.data(), v.size() * sizeof(T));
  }
  void put_bytes(const void* data, size_t n) { out_.append(static_cast<const char*>(data), n); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads what a ByteWriter wrote, in the same order. A read past the end fails (false, the target left
// unchanged) and so does every read after it: ok() says whether every read so far succeeded.
class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  template <typename T>
  bool get(T* v) {
    static_assert(std::is_trivially_copyable_v<T>);
    return get_bytes(v, sizeof(T));
  }
  // The value, or a value-initialised T when the read fails.
  template <typename T>
  T get() {
    T v{};
    get(&v);
    return v;
  }
  template <typename T>
  bool get_vec(std::vector<T>* v) {
    static_assert(std::is_trivially_copyable_v<T>);
    uint64_t n = 0;
    if (!get(&n)) return false;
    if (n > remaining() / sizeof(T)) return fail();
    v->resize(n);
    return n == 0 || get_bytes(v->data(), n * sizeof(T));  // an empty vector's data() may be null
  }
  bool get_bytes(void* data, size_t n) {
    if (!ok_ || remaining() < n) return fail();
    if (n > 0) std::memcpy(data, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return in_.size() - pos_; }
  bool ok() const { return ok_; }
  bool done() const { return ok_ && pos_ == in_.size(); }

 private:
  bool fail() {
    ok_ = false;
    return false;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace genbridge::afd
