// Checkpoint files that are not what they are named: FIFOs (which used to block open() forever),
// directories, dangling and looping symbolic links, unreadable files, NUL bytes and garbage after the JSON
// of config.json and the shard index, oversized JSON files. Each is refused at open with a message that
// names the file and says what is wrong; nothing blocks.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "runtime/checkpoint/checkpoint.h"
#include "support/deadline.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

class CheckpointFiles : public ::testing::Test {
 protected:
  void write(int shards = 1) { ASSERT_TRUE(write_synthetic_checkpoint("tiny", 3, dir_.path(), shards).ok()); }
  void SetUp() override { write(); }

  std::string p(const std::string& name) const { return (dir_ / name).string(); }
  // Checkpoint::open's message ("" when it opens), with a deadline: a blocked open fails the test.
  std::string open_error() {
    const Status st = testing::call_with_deadline([&] { return Checkpoint::open(dir_.path()).status(); }, fifos_);
    if (st.ok()) return "";
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    return st.message();
  }
  void make_fifo(const std::string& name) {
    fs::remove(dir_ / name);
    ASSERT_EQ(::mkfifo(p(name).c_str(), 0644), 0) << std::strerror(errno);
    fifos_.push_back(dir_ / name);
  }
  void make_dir(const std::string& name) {
    fs::remove(dir_ / name);
    fs::create_directory(dir_ / name);
  }
  void make_link(const std::string& name, const std::string& target) {
    fs::remove(dir_ / name);
    fs::create_symlink(target, dir_ / name);
  }
  // Checkpoint::open's message as a user without root's right to read any file: in a forked child that
  // drops to nobody when the test runs as root, else directly.
  std::string open_error_unprivileged(const fs::path& dir) {
    if (::geteuid() != 0) return Checkpoint::open(dir).status().message();
    fs::permissions(dir_.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                     fs::perms::others_read | fs::perms::others_exec);
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
      const std::string m = Checkpoint::open(dir).status().message();
      const ssize_t w = ::write(fds[1], m.data(), m.size());
      ::_exit(w == static_cast<ssize_t>(m.size()) ? 0 : 3);
    }
    ::close(fds[1]);
    std::string m;
    char buf[512];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) m.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    return m;
  }

  TempDir dir_;
  std::vector<fs::path> fifos_;
};

constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

// ---- FIFOs: open() of a FIFO blocks until a writer appears; they are refused before opening. ----

TEST_F(CheckpointFiles, config_json_is_a_fifo) {
  make_fifo("config.json");
  EXPECT_EQ(open_error(), p("config.json") + ": is a FIFO (named pipe), not a regular file");
}

TEST_F(CheckpointFiles, model_safetensors_is_a_fifo) {
  make_fifo("model.safetensors");
  EXPECT_EQ(open_error(), p("model.safetensors") + ": is a FIFO (named pipe), not a regular file");
}

TEST_F(CheckpointFiles, index_is_a_fifo) {
  make_fifo("model.safetensors.index.json");
  EXPECT_EQ(open_error(), p("model.safetensors.index.json") + ": is a FIFO (named pipe), not a regular file");
}

TEST_F(CheckpointFiles, shard_is_a_fifo) {
  fs::remove(dir_ / "model.safetensors");
  write(2);
  make_fifo(kShard2);
  EXPECT_EQ(open_error(), p(kShard2) + ": is a FIFO (named pipe), not a regular file");
}

TEST_F(CheckpointFiles, symbolic_link_to_a_fifo) {
  ASSERT_EQ(::mkfifo(p("pipe").c_str(), 0644), 0);
  fifos_.push_back(dir_ / "pipe");
  make_link("model.safetensors", "pipe");
  EXPECT_EQ(open_error(), p("model.safetensors") +
                              ": is a symbolic link to 'pipe', which is a FIFO (named pipe), not a regular file");
}

TEST_F(CheckpointFiles, character_device) {
  make_link("config.json", "/dev/null");
  EXPECT_EQ(open_error(),
            p("config.json") + ": is a symbolic link to '/dev/null', which is a character device, not a regular file");
}

// ---- Directories ----

TEST_F(CheckpointFiles, config_json_is_a_directory) {
  make_dir("config.json");  // used to read as empty text: "malformed JSON"
  EXPECT_EQ(open_error(), p("config.json") + ": is a directory, not a regular file");
}

TEST_F(CheckpointFiles, model_safetensors_is_a_directory) {
  make_dir("model.safetensors");
  EXPECT_EQ(open_error(), p("model.safetensors") + ": is a directory, not a regular file");
}

TEST_F(CheckpointFiles, index_and_shard_are_directories) {
  fs::remove(dir_ / "model.safetensors");
  write(2);
  make_dir(kShard2);
  EXPECT_EQ(open_error(), p(kShard2) + ": is a directory, not a regular file");
  make_dir("model.safetensors.index.json");
  EXPECT_EQ(open_error(), p("model.safetensors.index.json") + ": is a directory, not a regular file");
}

TEST_F(CheckpointFiles, model_directory_missing_or_a_file) {
  const fs::path gone = dir_ / "gone";
  EXPECT_EQ(Checkpoint::open(gone).status().message(), gone.string() + ": the model directory does not exist");
  EXPECT_EQ(
      Checkpoint::open(dir_ / "config.json").status().message(),
      p("config.json") + ": is not a directory (a model is a directory holding config.json and safetensors files)");
}

// ---- Symbolic links ----

TEST_F(CheckpointFiles, dangling_model_safetensors_link) {
  make_link("model.safetensors", "gone.safetensors");  // used to say "no model.safetensors ... in the directory"
  EXPECT_EQ(open_error(),
            p("model.safetensors") + ": is a dangling symbolic link: its target 'gone.safetensors' does not exist");
}

TEST_F(CheckpointFiles, dangling_config_json_link) {
  make_link("config.json", "/nonexistent/config.json");
  EXPECT_EQ(open_error(),
            p("config.json") + ": is a dangling symbolic link: its target '/nonexistent/config.json' does not exist");
}

TEST_F(CheckpointFiles, looping_model_safetensors_link) {
  make_link("model.safetensors", "model.safetensors");
  EXPECT_EQ(open_error(), p("model.safetensors") +
                              ": is a symbolic link loop: following 'model.safetensors' never reaches a file (too "
                              "many levels of symbolic links)");
  make_link("other.safetensors", "model.safetensors");
  make_link("model.safetensors", "other.safetensors");
  EXPECT_EQ(open_error(), p("model.safetensors") +
                              ": is a symbolic link loop: following 'other.safetensors' never reaches a file (too "
                              "many levels of symbolic links)");
}

TEST_F(CheckpointFiles, looping_index_next_to_a_good_single_file) {
  // Used to fall back silently to model.safetensors.
  make_link("model.safetensors.index.json", "model.safetensors.index.json");
  EXPECT_EQ(open_error(), p("model.safetensors.index.json") +
                              ": is a symbolic link loop: following 'model.safetensors.index.json' never reaches a "
                              "file (too many levels of symbolic links)");
}

TEST_F(CheckpointFiles, dangling_index_next_to_a_good_single_file) {
  make_link("model.safetensors.index.json", "elsewhere/index.json");
  EXPECT_EQ(open_error(), p("model.safetensors.index.json") +
                              ": is a dangling symbolic link: its target 'elsewhere/index.json' does not exist");
}

TEST_F(CheckpointFiles, dangling_shard_link) {
  fs::remove(dir_ / "model.safetensors");
  write(2);
  make_link(kShard2, "/nonexistent/shard");
  EXPECT_EQ(open_error(), p(kShard2) + ": is a dangling symbolic link: its target '/nonexistent/shard' does not exist");
}

TEST_F(CheckpointFiles, links_to_regular_files_load) {
  // The usual Hugging Face cache layout: every file a link into a blob store.
  const Checkpoint direct = Checkpoint::open(dir_.path()).value();
  TempDir linked;
  for (const char* f : {"config.json", "model.safetensors"}) fs::create_symlink(dir_ / f, linked / f);
  Result<Checkpoint> via_links = Checkpoint::open(linked.path());
  ASSERT_TRUE(via_links.ok()) << via_links.status().to_string();
  const TensorView a = direct.weights().lm_head, b = via_links->weights().lm_head;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * 2), 0);
}

// ---- Permissions (root reads every file: the check runs as nobody in a child process) ----

TEST_F(CheckpointFiles, unreadable_config_json) {
  fs::permissions(dir_ / "config.json", fs::perms::none);
  EXPECT_EQ(open_error_unprivileged(dir_.path()), p("config.json") + ": permission denied: this user may not read it");
}

TEST_F(CheckpointFiles, unreadable_model_safetensors) {
  fs::permissions(dir_ / "model.safetensors", fs::perms::none);
  EXPECT_EQ(open_error_unprivileged(dir_.path()),
            p("model.safetensors") + ": permission denied: this user may not read it");
}

TEST_F(CheckpointFiles, unsearchable_model_directory) {
  const fs::path sub = dir_ / "sub";
  fs::create_directory(sub);
  for (const char* f : {"config.json", "model.safetensors"}) fs::rename(dir_ / f, sub / f);
  fs::permissions(sub, fs::perms::owner_read | fs::perms::owner_write);  // nobody may search it
  fs::permissions(sub, fs::perms::others_read, fs::perm_options::add);
  EXPECT_EQ(
      open_error_unprivileged(sub),
      (sub / "config.json").string() + ": permission denied: a directory on the path may not be searched by this user");
  fs::permissions(sub, fs::perms::owner_all);
}

// ---- What follows the JSON of config.json and the index ----

TEST_F(CheckpointFiles, config_json_with_nul_and_garbage_after_it) {
  const std::vector<char> good = testing::read_file_bytes(dir_ / "config.json");
  const std::string text(good.begin(), good.end());
  testing::write_file_bytes(dir_ / "config.json", text + std::string("\0garbage", 8));
  EXPECT_EQ(open_error(), p("config.json") + ": NUL byte (0x00) at byte offset " + std::to_string(text.size()) +
                              "; JSON text cannot contain one");
  testing::write_file_bytes(dir_ / "config.json", text + "\n}");
  EXPECT_EQ(open_error(), p("config.json") + ": unexpected '}' (0x7d) at byte offset " +
                              std::to_string(text.size() + 1) +
                              " after the end of the JSON object; only whitespace may follow it");
  // Trailing whitespace of any kind is fine in config.json.
  testing::write_file_bytes(dir_ / "config.json", text + " \t\r\n\n");
  EXPECT_EQ(open_error(), "");
}

TEST_F(CheckpointFiles, index_with_nul_and_garbage_after_it) {
  fs::remove(dir_ / "model.safetensors");
  write(2);
  const std::vector<char> good = testing::read_file_bytes(dir_ / "model.safetensors.index.json");
  const std::string text(good.begin(), good.end());
  testing::write_file_bytes(dir_ / "model.safetensors.index.json", text + std::string("\0\0\0{}", 5));
  EXPECT_EQ(open_error(), p("model.safetensors.index.json") + ": NUL byte (0x00) at byte offset " +
                              std::to_string(text.size()) + "; JSON text cannot contain one");
  testing::write_file_bytes(dir_ / "model.safetensors.index.json", text + "xyz");
  EXPECT_EQ(open_error(), p("model.safetensors.index.json") + ": unexpected 'x' (0x78) at byte offset " +
                              std::to_string(text.size()) +
                              " after the end of the JSON object; only whitespace may follow it");
}

TEST_F(CheckpointFiles, oversized_json_files_are_not_read) {
  // Sparse files: the size is real, no blocks are written.
  ASSERT_EQ(::truncate(p("config.json").c_str(), (100 << 20) + 1), 0);
  EXPECT_EQ(open_error(), p("config.json") + ": the file has 104857601 bytes, more than the 104857600-byte limit");
}

}  // namespace
}  // namespace genbridge::model
