#pragma once
// Test helper: calls that must not block on a FIFO get a deadline, so a regression fails the test instead
// of hanging it.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <vector>

namespace genbridge::testing {

// Runs `fn` on its own thread and returns its result. If it has not returned within `seconds`, records a
// failure and unblocks it by opening each FIFO in `fifos` for writing and closing it again (a reader
// blocked in open() then returns and reads end-of-file).
template <typename Fn>
auto call_with_deadline(Fn fn, const std::vector<std::filesystem::path>& fifos, double seconds = 10) {
  auto done = std::async(std::launch::async, std::move(fn));
  if (done.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    ADD_FAILURE() << "the call blocked for more than " << seconds << " s (opening a FIFO?)";
    while (done.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      for (const auto& f : fifos) {
        const int fd = ::open(f.c_str(), O_WRONLY | O_NONBLOCK);
        if (fd >= 0) ::close(fd);
      }
    }
  }
  return done.get();
}

}  // namespace genbridge::testing
