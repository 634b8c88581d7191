#pragma once
// Test helper: one thread per world rank, each with an in-process connector, running fn(connector).

#include <memory>
#include <thread>
#include <vector>

#include "afd/connector.h"
#include "afd/transports/inproc/inproc_transport.h"

namespace genbridge::afd::testing {

// Runs fn(rank, connector, init_status) on every world rank with its own config (cfgs[rank]); returns
// each rank's status. A rank whose fn fails marks itself failed in the world so the others unblock.
template <typename Fn>
std::vector<Status> run_ranks(const std::vector<AfdConfig>& cfgs, Fn fn) {
  const int n = static_cast<int>(cfgs.size());
  auto world = make_inproc_world(n, 5000);
  std::vector<Status> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Result<std::unique_ptr<Connector>> c = make_connector(cfgs[r], make_inproc_transport(world, r));
      if (!c.ok()) {
        out[r] = c.status();
        fail_rank(*world, r, out[r]);
        return;
      }
      const Status init = (*c)->init();
      out[r] = fn(r, **c, init);
      if (!out[r].ok()) fail_rank(*world, r, out[r]);
      (*c)->close().ignore();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

template <typename Fn>
std::vector<Status> run_ranks(const AfdConfig& cfg, Fn fn) {
  return run_ranks(std::vector<AfdConfig>(cfg.num_attention + cfg.num_ffn, cfg), fn);
}

}  // namespace genbridge::afd::testing
