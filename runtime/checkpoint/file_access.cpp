#include "runtime/checkpoint/file_access.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace genbridge::model::detail {
namespace {

// What a non-regular entry is, as a phrase ("a FIFO (named pipe)").
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// The text of a symbolic link, or "?" when it cannot be read.
std::string link_target(const std::string& p) {
  std::string buf(4096, '\0');
  const ssize_t n = ::readlink(p.c_str(), buf.data(), buf.size());
  if (n < 0) return "?";
  buf.resize(static_cast<size_t>(n));
  return buf;
}

Status not_regular(const std::string& p, mode_t mode, bool via_link) {
  const std::string kind = kind_of(mode);
  if (via_link) {
    return invalid_argument(
        fmt::format("{}: is a symbolic link to '{}', which is {}, not a regular file", p, link_target(p), kind));
  }
  return invalid_argument(fmt::format("{}: is {}, not a regular file", p, kind));
}

// An errno from stat/lstat/open of `p`, as a sentence naming `p`.
Status errno_status(const std::string& p, int e, bool via_link) {
  if (via_link && e == ENOENT) {
    return invalid_argument(
        fmt::format("{}: is a dangling symbolic link: its target '{}' does not exist", p, link_target(p)));
  }
  if (via_link && e == ELOOP) {
    return invalid_argument(fmt::format(
        "{}: is a symbolic link loop: following '{}' never reaches a file (too many levels of symbolic links)", p,
        link_target(p)));
  }
  if (e == EACCES || e == EPERM) {
    return invalid_argument(fmt::format("{}: permission denied: this user may not read it", p));
  }
  return invalid_argument(fmt::format("{}: cannot open: {}", p, std::strerror(e)));
}

}  // namespace

Result<bool> entry_exists(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) return true;
  const int e = errno;
  if (e == ENOENT) return false;
  if (e == EACCES) {
    return invalid_argument(
        fmt::format("{}: permission denied: a directory on the path may not be searched by this user", path.string()));
  }
  return invalid_argument(fmt::format("{}: cannot look it up: {}", path.string(), std::strerror(e)));
}

Result<RegularFile> RegularFile::open(const std::filesystem::path& path) {
  const std::string p = path.string();
  struct stat st {};
  bool via_link = false;
  if (::lstat(p.c_str(), &st) != 0) {
    const int e = errno;
    if (e == EACCES) {
      return invalid_argument(
          fmt::format("{}: permission denied: a directory on the path may not be searched by this user", p));
    }
    return errno_status(p, e, false);
  }
  if (S_ISLNK(st.st_mode)) {
    via_link = true;
    if (::stat(p.c_str(), &st) != 0) return errno_status(p, errno, true);
  }
  if (!S_ISREG(st.st_mode)) return not_regular(p, st.st_mode, via_link);
  // O_NONBLOCK: should the entry have become a FIFO since the stat above, open() still returns at once
  // (and fstat below refuses it). Regular-file reads ignore the flag.
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return errno_status(p, errno, via_link);
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return invalid_argument(fmt::format("{}: cannot stat: {}", p, std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return not_regular(p, st.st_mode, via_link);
  }
  return RegularFile(fd, static_cast<uint64_t>(st.st_size), p);
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(other.fd_), size_(other.size_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status RegularFile::read_exact(uint64_t offset, void* out, uint64_t n) const {
  auto* dst = static_cast<unsigned char*>(out);
  uint64_t done = 0;
  while (done < n) {
    // Linux transfers at most ~2 GiB per call.
    const size_t want = static_cast<size_t>(std::min<uint64_t>(n - done, uint64_t{1} << 30));
    const ssize_t got = ::pread(fd_, dst + done, want, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return invalid_argument(fmt::format("{}: read error at byte {}: {}", path_, offset + done, std::strerror(errno)));
    }
    if (got == 0) {
      return invalid_argument(
          fmt::format("{}: the file ends at byte {}, but {} bytes were to be read from byte {} (it shrank after it was "
                      "opened?)",
                      path_, offset + done, n, offset));
    }
    done += static_cast<uint64_t>(got);
  }
  return ok_status();
}

Result<std::string> read_regular_file(const std::filesystem::path& path, uint64_t max_bytes) {
  GB_ASSIGN_OR_RETURN(RegularFile file, RegularFile::open(path));
  if (file.size() > max_bytes) {
    return invalid_argument(
        fmt::format("{}: the file has {} bytes, more than the {}-byte limit", file.path(), file.size(), max_bytes));
  }
  std::string text(static_cast<size_t>(file.size()), '\0');
  GB_RETURN_IF_ERROR(file.read_exact(0, text.data(), text.size()));
  return text;
}

}  // namespace genbridge::model::detail
