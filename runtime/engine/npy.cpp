#include "runtime/engine/npy.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

namespace genbridge::engine {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int e) { return std::strerror(e); }

bool same_file(const struct stat& a, int fd) {
  struct stat b;
  return fstat(fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// What check_output_path found: where the bytes go and how.
struct OutputPlan {
  bool direct = false;                  // a character device or FIFO: written in place
  std::string target;                   // the file to create or replace (symlinks resolved), or the device
  std::string dir;                      // the directory of `target` (temporary files go there)
  std::optional<mode_t> existing_mode;  // permissions of the regular file being replaced
};

Result<OutputPlan> plan_output(std::string_view label, const std::string& path) {
  auto refuse = [&](const std::string& why) {
    return invalid_argument(fmt::format("{} {}: {}", label, path.empty() ? "''" : path, why));
  };
  if (path.empty()) return refuse("the path is empty");
  OutputPlan plan;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return refuse("is a directory; expected a file name");
    if (S_ISCHR(st.st_mode)) {
      plan.direct = true;
      plan.target = path;
      return plan;
    }
    if (same_file(st, STDOUT_FILENO)) return refuse("is this process's standard output, where the results are printed");
    if (same_file(st, STDERR_FILENO)) return refuse("is this process's standard error, where the log is printed");
    if (S_ISFIFO(st.st_mode)) {
      plan.direct = true;
      plan.target = path;
      return plan;
    }
    if (!S_ISREG(st.st_mode)) return refuse("is not a regular file, a character device or a FIFO");
    std::error_code ec;
    const fs::path resolved = fs::canonical(path, ec);
    if (ec) return refuse(fmt::format("cannot be resolved: {}", ec.message()));
    plan.target = resolved.string();
    plan.dir = resolved.parent_path().string();
    plan.existing_mode = st.st_mode & 07777;
  } else {
    const int e = errno;
    struct stat lst;
    if (e == ENOENT && ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
      return refuse("is a symbolic link to a file that does not exist");
    }
    if (e == ELOOP) return refuse("is a loop of symbolic links");
    if (e != ENOENT) return refuse(fmt::format("cannot be examined: {}", errno_text(e)));
    const fs::path p(path);
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    struct stat dst;
    if (::stat(dir.c_str(), &dst) != 0) {
      const int de = errno;
      if (de == ENOENT) return refuse(fmt::format("the directory {} does not exist", dir.string()));
      return refuse(fmt::format("the directory {} cannot be examined: {}", dir.string(), errno_text(de)));
    }
    if (!S_ISDIR(dst.st_mode)) return refuse(fmt::format("{} is not a directory", dir.string()));
    plan.target = path;
    plan.dir = dir.string();
  }
  if (::access(plan.dir.c_str(), W_OK | X_OK) != 0) {
    return refuse(fmt::format("cannot create files in the directory {}: {}", plan.dir, errno_text(errno)));
  }
  return plan;
}

// Writes every byte of `parts` to `fd`; errno of the first failure, or 0.
int write_all(int fd, std::span<const std::span<const std::byte>> parts) {
  for (std::span<const std::byte> part : parts) {
    const std::byte* p = part.data();
    size_t left = part.size();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno;
      if (n == 0) return EIO;
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  return 0;
}

mode_t new_file_mode() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return 0666 & ~mask;
}

}  // namespace

Status check_output_path(std::string_view label, const std::string& path) { return plan_output(label, path).status(); }

Status write_output_file(std::string_view label, const std::string& path,
                         std::span<const std::span<const std::byte>> parts) {
  GB_ASSIGN_OR_RETURN(const OutputPlan plan, plan_output(label, path));
  auto failed = [&](const std::string& what, int e) {
    return unavailable(fmt::format("{} {}: {} failed: {}", label, path, what, errno_text(e)));
  };
  if (plan.direct) {
    // O_NONBLOCK: opening a FIFO nobody reads fails (ENXIO) instead of waiting forever.
    const int fd = ::open(plan.target.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      if (e == ENXIO) return unavailable(fmt::format("{} {}: no process has the FIFO open for reading", label, path));
      return failed("opening", e);
    }
    const int flags = ::fcntl(fd, F_GETFL);
    int e = (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) ? errno : 0;
    if (e == 0) e = write_all(fd, parts);
    if (::close(fd) != 0 && e == 0) e = errno;
    return e == 0 ? ok_status() : failed("writing", e);
  }

  const fs::path target(plan.target);
  std::string tmp = (fs::path(plan.dir) / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return failed(fmt::format("creating a temporary file in {}", plan.dir), errno);
  int e = write_all(fd, parts);
  if (e == 0 && ::fchmod(fd, plan.existing_mode.value_or(new_file_mode())) != 0) e = errno;
  // The sync makes a late error (delayed allocation, a network file system) show up here, not never.
  if (e == 0 && ::fsync(fd) != 0) e = errno;
  if (::close(fd) != 0 && e == 0) e = errno;
  if (e == 0 && ::rename(tmp.c_str(), plan.target.c_str()) != 0) e = errno;
  if (e != 0) {
    ::unlink(tmp.c_str());
    return failed("writing", e);
  }
  return ok_status();
}

Status write_npy_f32(const std::string& path, std::span<const float> data, int64_t rows, int64_t cols,
                     std::string_view label) {
  if (rows < 0 || cols < 0 || static_cast<int64_t>(data.size()) != rows * cols) {
    return invalid_argument(
        fmt::format("write_npy_f32: {} values do not form shape ({}, {})", data.size(), rows, cols));
  }
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  // Magic (6) + version (2) + length (2) + header + '\n' must be a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  const unsigned char preamble[10] = {0x93,
                                      'N',
                                      'U',
                                      'M',
                                      'P',
                                      'Y',
                                      1,
                                      0,
                                      static_cast<unsigned char>(header.size() & 0xff),
                                      static_cast<unsigned char>(header.size() >> 8)};
  const std::span<const std::byte> parts[] = {
      std::as_bytes(std::span(preamble)), std::as_bytes(std::span(header.data(), header.size())), std::as_bytes(data)};
  return write_output_file(label, path, parts);
}

}  // namespace genbridge::engine
