#include "runtime/engine/npy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace genbridge::engine {
namespace {

namespace fs = std::filesystem;

std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A fresh directory per test, removed afterwards.
class NpyFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "genbridge_npy_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Every entry of the directory (a leftover temporary file shows up here).
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  fs::path dir_;
};

TEST_F(NpyFiles, header_and_payload_follow_format_1_0_and_no_temporary_file_is_left) {
  const fs::path path = dir_ / "logits.npy";
  std::vector<float> v{1.f, -2.f, 3.5f, 0.f, 7.f, 8.f};
  ASSERT_TRUE(write_npy_f32(path.string(), v, 2, 3).ok());
  const std::vector<char> bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(std::memcmp(bytes.data(), "\x93NUMPY\x01\x00", 8), 0);
  const size_t hlen = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + hlen) % 64, 0u);
  const std::string header(bytes.data() + 10, hlen);
  EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos);
  EXPECT_NE(header.find("'shape': (2, 3)"), std::string::npos);
  EXPECT_EQ(header.back(), '\n');
  ASSERT_EQ(bytes.size(), 10 + hlen + v.size() * 4);
  EXPECT_EQ(std::memcmp(bytes.data() + 10 + hlen, v.data(), v.size() * 4), 0);
  EXPECT_EQ(entries(), std::vector<std::string>{"logits.npy"});
  // A new file gets the usual permissions (0666 less the umask), not mkstemp's 0600.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(fs::status(path).permissions(), static_cast<fs::perms>(0666 & ~mask));
}

TEST_F(NpyFiles, replaces_an_existing_file_keeping_its_permissions) {
  const fs::path path = dir_ / "old.npy";
  std::ofstream(path) << "previous contents";
  fs::permissions(path, static_cast<fs::perms>(0640));
  std::vector<float> v{1.f, 2.f};
  ASSERT_TRUE(write_npy_f32(path.string(), v, 1, 2).ok());
  EXPECT_EQ(read_bytes(path).size(), 128u + 8u);
  EXPECT_EQ(fs::status(path).permissions(), static_cast<fs::perms>(0640));
  EXPECT_EQ(entries(), std::vector<std::string>{"old.npy"});
}

TEST_F(NpyFiles, a_symlink_keeps_pointing_at_the_new_file) {
  const fs::path target = dir_ / "target.npy", link = dir_ / "link.npy";
  std::ofstream(target) << "x";
  fs::create_symlink(target, link);
  std::vector<float> v{1.f, 2.f, 3.f};
  ASSERT_TRUE(write_npy_f32(link.string(), v, 1, 3).ok());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read_bytes(target).size(), 128u + 12u);
  EXPECT_EQ(entries(), (std::vector<std::string>{"link.npy", "target.npy"}));
}

// A full disk, simulated by a file size limit: the write fails with the system's reason, the previous
// file is untouched and no temporary file is left (before: a truncated file replaced it).
TEST_F(NpyFiles, a_failed_write_leaves_the_previous_file_and_no_temporary) {
  const fs::path path = dir_ / "logits.npy";
  std::ofstream(path) << "previous contents";
  const std::vector<float> v(4096, 1.f);
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 1000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const Status s = write_npy_f32(path.string(), v, 1, 4096, "--dump-logits");
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "--dump-logits " + path.string() + ": writing failed: File too large");
  const std::vector<char> bytes = read_bytes(path);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "previous contents");
  EXPECT_EQ(entries(), std::vector<std::string>{"logits.npy"});
}

TEST_F(NpyFiles, refused_paths_name_the_label_the_path_and_the_reason) {
  auto msg = [](const std::string& path) { return check_output_path("--dump-logits", path).message(); };
  EXPECT_EQ(msg(""), "--dump-logits '': the path is empty");
  EXPECT_EQ(msg(dir_.string()), "--dump-logits " + dir_.string() + ": is a directory; expected a file name");
  const std::string missing = (dir_ / "no-such-dir" / "x.npy").string();
  EXPECT_EQ(msg(missing),
            "--dump-logits " + missing + ": the directory " + (dir_ / "no-such-dir").string() + " does not exist");
  std::ofstream(dir_ / "file") << "x";
  const std::string under_file = (dir_ / "file" / "x.npy").string();
  EXPECT_EQ(msg(under_file), "--dump-logits " + under_file + ": cannot be examined: Not a directory");
  const fs::path dangling = dir_ / "dangling.npy";
  fs::create_symlink(dir_ / "nowhere.npy", dangling);
  EXPECT_EQ(msg(dangling.string()),
            "--dump-logits " + dangling.string() + ": is a symbolic link to a file that does not exist");
  const fs::path loop = dir_ / "loop.npy";
  fs::create_symlink(loop, loop);
  EXPECT_EQ(msg(loop.string()), "--dump-logits " + loop.string() + ": is a loop of symbolic links");
  // The same checks refuse the write itself, and nothing is created.
  std::vector<float> v{1.f};
  const Status s = write_npy_f32(missing, v, 1, 1, "--dump-logits");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), msg(missing));
  EXPECT_EQ(write_npy_f32(dir_.string(), v, 1, 1).message(),
            "write_npy_f32 " + dir_.string() + ": is a directory; expected a file name");
  EXPECT_EQ(entries(), (std::vector<std::string>{"dangling.npy", "file", "loop.npy"}));
}

// Character devices are written directly (a rename would replace the device node): /dev/null takes the
// bytes, /dev/full fails cleanly with ENOSPC.
TEST_F(NpyFiles, character_devices_are_written_directly_and_every_write_is_checked) {
  std::vector<float> v(1024, 2.f);
  EXPECT_TRUE(check_output_path("--dump-logits", "/dev/null").ok());
  EXPECT_TRUE(write_npy_f32("/dev/null", v, 1, 1024, "--dump-logits").ok());
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  ASSERT_TRUE(check_output_path("--dump-logits", "/dev/full").ok());
  const Status s = write_npy_f32("/dev/full", v, 1, 1024, "--dump-logits");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "--dump-logits /dev/full: writing failed: No space left on device");
  EXPECT_TRUE(fs::is_character_file("/dev/full"));
}

TEST_F(NpyFiles, a_fifo_nobody_reads_is_refused_without_waiting) {
  const fs::path fifo = dir_ / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(check_output_path("--trace", fifo.string()).ok());
  std::vector<float> v{1.f};
  EXPECT_EQ(write_npy_f32(fifo.string(), v, 1, 1, "--trace").message(),
            "--trace " + fifo.string() + ": no process has the FIFO open for reading");
}

// Standard output carries the results: a dump into it (e.g. /dev/stdout redirected to a file or a pipe)
// would interleave binary with them, or replace the file they go to.
TEST_F(NpyFiles, standard_output_is_refused) {
  const fs::path out = dir_ / "stdout.txt";
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ::dup2(fd, STDOUT_FILENO);
  ::close(fd);
  const std::string m1 = check_output_path("--dump-logits", "/dev/stdout").message();
  const std::string m2 = check_output_path("--dump-logits", out.string()).message();
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  EXPECT_EQ(m1, "--dump-logits /dev/stdout: is this process's standard output, where the results are printed");
  EXPECT_EQ(m2, "--dump-logits " + out.string() + ": is this process's standard output, where the results are printed");
}

TEST(Npy, shape_mismatch) {
  std::vector<float> v(5);
  EXPECT_EQ(write_npy_f32("/tmp/x.npy", v, 2, 3).message(), "write_npy_f32: 5 values do not form shape (2, 3)");
}

}  // namespace
}  // namespace genbridge::engine
