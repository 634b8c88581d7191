#pragma once
// Internal: opening the files of a checkpoint. Every file the loader reads must be a regular file after
// following symbolic links. Anything else is refused, before any call that could block, with a message
// that says what the entry is: a FIFO or device (open() of a FIFO blocks until a writer appears), a
// directory, a dangling symbolic link (naming its target), a symbolic link loop, or unreadable.

#include <cstdint>
#include <filesystem>
#include <string>

#include "genbridge/core/status.h"

namespace genbridge::model::detail {

// JSON files of a checkpoint (config.json, the shard index) larger than this are refused unread.
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t{100} << 20;

// Whether a directory entry named `path` exists, without following it: a dangling or looping symbolic
// link exists (opening it then says what is wrong). Errors other than "no such entry" (e.g. a directory
// that cannot be searched) are InvalidArgument naming the path.
Result<bool> entry_exists(const std::filesystem::path& path);

// A read-only descriptor of a regular file, opened without blocking. Move-only; closes on destruction.
class RegularFile {
 public:
  // Opens `path` for reading. InvalidArgument "<path>: <what it is instead>" for every entry that is not
  // a regular file (checked with stat before open, and with fstat on the opened descriptor, so a file
  // swapped for a FIFO in between cannot block either). Blocking file I/O on a regular file only.
  static Result<RegularFile> open(const std::filesystem::path& path);
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  int fd() const { return fd_; }
  // The size fstat reported at open, in bytes.
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads `n` bytes at `offset` into `out`; a file that ends early (it shrank since open) is an error.
  Status read_exact(uint64_t offset, void* out, uint64_t n) const;

 private:
  RegularFile(int fd, uint64_t size, std::string path) : fd_(fd), size_(size), path_(std::move(path)) {}
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
};

// The whole content of a regular file of at most `max_bytes` bytes (RegularFile::open's errors, and
// InvalidArgument naming the limit when it is larger).
Result<std::string> read_regular_file(const std::filesystem::path& path, uint64_t max_bytes = kMaxJsonFileBytes);

}  // namespace genbridge::model::detail
