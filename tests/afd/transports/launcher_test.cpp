// What mpirun tells a process before MPI_Init (afd/transport.h): its world rank and whether it will be
// an FFN rank.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "afd/transport.h"

namespace genbridge::afd {
namespace {

// Sets the launcher's variables for one test and restores what was there.
class LauncherEnv {
 public:
  LauncherEnv() {
    for (const char* v : kVars) {
      const char* s = std::getenv(v);
      saved_.emplace_back(s ? std::optional<std::string>(s) : std::nullopt);
      ::unsetenv(v);
    }
  }
  ~LauncherEnv() {
    for (size_t i = 0; i < std::size(kVars); ++i) {
      if (saved_[i]) {
        ::setenv(kVars[i], saved_[i]->c_str(), 1);
      } else {
        ::unsetenv(kVars[i]);
      }
    }
  }

 private:
  static constexpr const char* kVars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  std::vector<std::optional<std::string>> saved_;
};

TEST(Launcher, no_launcher_means_no_rank) {
  LauncherEnv env;
  EXPECT_EQ(launcher_world_rank(), -1);
  EXPECT_FALSE(launcher_says_ffn(kRoleUndeclared, 1));
}

TEST(Launcher, open_mpi_rank_comes_first) {
  LauncherEnv env;
  ::setenv("PMI_RANK", "5", 1);
  EXPECT_EQ(launcher_world_rank(), 5);
  ::setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  EXPECT_EQ(launcher_world_rank(), 2);
}

TEST(Launcher, role_from_rank_order_unless_declared) {
  LauncherEnv env;
  ::setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  EXPECT_TRUE(launcher_says_ffn(kRoleUndeclared, 2));
  EXPECT_FALSE(launcher_says_ffn(kRoleUndeclared, 3));
  EXPECT_FALSE(launcher_says_ffn(static_cast<int>(Role::kAttention), 2));
  EXPECT_TRUE(launcher_says_ffn(static_cast<int>(Role::kFfn), 3));
}

}  // namespace
}  // namespace genbridge::afd
