#pragma once
// What a serving loop's wait for work saw: the one vocabulary of an idle attention rank (afd/serve_job.h)
// and of the service that feeds it (tools/serve/service.h).

namespace genbridge::afd {

enum class WorkWait {
  kTimeout,  // nothing happened before the timeout
  kMine,     // something for this worker (a request, a cancel), or the service stopping or failing
  kOther,    // something for another worker only
};

}  // namespace genbridge::afd
