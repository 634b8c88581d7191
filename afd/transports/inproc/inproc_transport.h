#pragma once
// In-process transport: every rank is a thread of one process, and the ranks of a job share an
// InprocWorld. A message is copied once, directly from the sender's segments into the receiver's,
// by whichever side posts second (so a send completes when it is matched, like an MPI rendezvous).

#include <memory>
#include <string>

#include "afd/transport.h"
#include "genbridge/core/status.h"

namespace genbridge::afd {

class InprocWorld;

// A job of `size` ranks. init() of each rank waits at most `join_timeout_ms` for the others to join.
std::shared_ptr<InprocWorld> make_inproc_world(int size, int64_t join_timeout_ms = 60000);

// The endpoint of `world_rank` in `world`. Touches nothing until init().
std::unique_ptr<Transport> make_inproc_transport(std::shared_ptr<InprocWorld> world, int world_rank,
                                                 int declared_role = kRoleUndeclared);

// Marks `world_rank` failed (a worker thread died): every wait of every rank of the world ends with
// Unavailable naming the rank and `why`. Thread-safe; the first failure is the one reported.
void fail_rank(InprocWorld& world, int world_rank, const Status& why);

// The first failure recorded in the world, or OK.
Status world_failure(InprocWorld& world);

}  // namespace genbridge::afd
