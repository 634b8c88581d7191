// What the launcher (mpirun) tells a process of an MPI job before MPI_Init: compiled in every build, with
// or without MPI, because the tools read it before choosing what to start.

#include <cstdlib>

#include "afd/transport.h"

namespace genbridge::afd {

int launcher_world_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return -1;
}

bool launcher_says_ffn(int declared_role, int num_attention) {
  if (declared_role != kRoleUndeclared) return declared_role == static_cast<int>(Role::kFfn);
  const int rank = launcher_world_rank();
  return rank >= 0 && rank >= num_attention;
}

}  // namespace genbridge::afd
