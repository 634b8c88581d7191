// Stand-in for builds without MPI (CMake did not find Open MPI): the MPI transport exists in every build
// and says why it cannot start.

#include "afd/transport.h"

#ifndef GENBRIDGE_HAVE_MPI
namespace genbridge::afd {

namespace {

// Stand-in for builds without MPI: everything fails with a sentence saying why.
class UnbuiltMpiTransport final : public Transport {
 public:
  std::string_view name() const override { return "mpi"; }
  Status init() override {
    return unavailable(
        "mpi transport: this build of genbridge has no MPI (CMake did not find Open MPI's C library); install "
        "libopenmpi-dev and openmpi-bin and reconfigure, or use the inproc transport");
  }
  Status close() override { return ok_status(); }
  int world_rank() const override { return 0; }
  int world_size() const override { return 0; }
  std::span<const int> declared_roles() const override { return {}; }
  void set_rank_names(std::vector<std::string>) override {}
  Result<std::span<std::byte>> alloc_buffer(size_t) override { return init(); }
  Result<RequestId> isend(int, Channel, int, std::span<const ConstSegment>) override { return init(); }
  Result<RequestId> irecv(int, Channel, int, std::span<const MutSegment>) override { return init(); }
  Result<bool> test(RequestId, Completion*) override { return init(); }
  Result<int> wait_any(std::span<const RequestId>, Deadline, Completion*) override { return init(); }
  Status cancel(RequestId) override { return init(); }
  void abort_job(const Status&) override {}
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const MpiOptions&) { return std::make_unique<UnbuiltMpiTransport>(); }
bool mpi_transport_built() { return false; }

}  // namespace genbridge::afd
#endif
