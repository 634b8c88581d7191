#pragma once
// Safetensors files: a memory-mapped, validated reader with zero-copy views, and a streaming writer.
// Format: an 8-byte little-endian header length N, N bytes of JSON header mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section that follows the
// header) plus an optional "__metadata__" object of strings, then the data section.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/dtype.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::model {

// Headers larger than this are refused (the reference implementation's limit).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = uint64_t{100} << 20;

// Options for reading checkpoint files.
struct MapOptions {
  // true: map the file (zero-copy; pages are read on first touch, or at open with `populate`). If the file
  // is truncated while mapped, the next touch of a page past its new end raises SIGBUS and kills the
  // process (mmap semantics; populating does not prevent it, and no error can be returned). false: read
  // the whole file into memory the process owns at open, so later changes to the file cannot affect it.
  bool use_mmap = true;
  bool populate = false;  // with use_mmap: read every page at open (MAP_POPULATE) instead of on first touch
};

// A read-only image of a whole regular file: a private memory mapping of the file, or the file read into
// anonymous memory the process owns (MapOptions::use_mmap = false). Page-aligned either way. Move-only;
// unmaps on destruction. The bytes are PROT_READ: writing through a pointer into them faults.
class MappedFile {
 public:
  // Maps or reads `path`, which must be a regular file after following symbolic links (a FIFO, device,
  // directory, dangling or looping link is InvalidArgument saying which; nothing blocks on a FIFO).
  static Result<MappedFile> open(const std::filesystem::path& path, const MapOptions& options);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Whether the bytes are a memory mapping of the file (false: an owned copy read at open).
  bool is_mapped() const { return mapped_; }

 private:
  MappedFile(const std::byte* data, uint64_t size, bool mapped) : data_(data), size_(size), mapped_(mapped) {}
  void release();
  const std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
};

// One header entry, validated. `offset` is the absolute byte offset of the data in the file.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as written: "BF16", "F16", "F32", "I64", "F8_E4M3", ...
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  int64_t numel() const;
};

// One opened safetensors file. Move-only; views stay valid while the object (moved or not) is alive.
class SafetensorsFile {
 public:
  // Maps (or reads, see MapOptions) and validates the file: regular file, header length, JSON (nothing but
  // spaces after it), dtypes, shapes, and that the tensors' byte ranges tile the data section exactly (no
  // overlap, no gap, no trailing bytes). InvalidArgument names the file, the tensor and the rule. Blocking
  // file I/O.
  static Result<SafetensorsFile> open(const std::filesystem::path& path, const MapOptions& options = {});

  const std::string& path() const { return path_; }
  // Header entries sorted by name.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // The entry named `name`, or nullptr.
  const SafetensorsTensor* find(std::string_view name) const;
  // Zero-copy read-only view of a BF16, F16 or F32 tensor (other dtypes: InvalidArgument naming it).
  Result<TensorView> view(const SafetensorsTensor& tensor) const;
  // view() of the entry named `name` (InvalidArgument when absent).
  Result<TensorView> view(std::string_view name) const;
  // The "__metadata__" object (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_size() const { return map_->size(); }
  // The whole file image, mapped or read (views point into it).
  const MappedFile& mapping() const { return *map_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The safetensors dtype name for `t` ("BF16", ...), or "" when the format has no code for it.
std::string_view safetensors_dtype_name(DType t);
// Bytes per element of a safetensors dtype name, or 0 when unknown or sub-byte.
size_t safetensors_dtype_size(std::string_view name);

// Declaration of one tensor to write.
struct SafetensorsTensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
};

// Streams a safetensors file: the header is written from the specs at create(), then each tensor's bytes
// in spec order. The header is space-padded so the data section starts at a 64-byte boundary; tensors are
// laid out back to back in spec order, and create() refuses an order that would leave a tensor misaligned
// for its element size. Writes to "<path>.tmp" and renames on finish(). Blocking file I/O.
class SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> create(const std::filesystem::path& path, std::vector<SafetensorsTensorSpec> specs,
                                          const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = delete;
  ~SafetensorsWriter();  // an unfinished writer removes its temporary file

  // Appends the next tensor's bytes (numel * element size, little-endian); does not retain `data`.
  Status write_next(const void* data, size_t nbytes);
  // Checks every tensor was written, flushes, closes and renames into place.
  Status finish();

 private:
  SafetensorsWriter() = default;
  std::filesystem::path path_, tmp_path_;
  std::vector<SafetensorsTensorSpec> specs_;
  std::vector<uint64_t> nbytes_;
  size_t next_ = 0;
  std::FILE* file_ = nullptr;
};

// One tensor with its bytes, for write_safetensors().
struct SafetensorsTensorData {
  SafetensorsTensorSpec spec;
  const void* data = nullptr;  // numel * element size bytes; not retained
};
// Writes a whole file in one call (SafetensorsWriter underneath), tensors ordered by element size (largest
// first, otherwise as given) so that each is aligned.
Status write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsTensorData>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace genbridge::model
