#pragma once
// The link model: a transport decorator that makes every message on the data channels (dispatch and
// combine) arrive as if it had crossed a network link of a configured one-way latency and bandwidth, so
// that the overlap of the micro-batch pipeline and the async connector's deferred receive can be measured
// on one host (docs/afd.md, "The link model").
//
// Each directed pair of ranks (sender -> receiver) is one link. A message of b bytes sent at time t leaves
// when the link is free, occupies it for b x 8 / bandwidth, and arrives `latency` after it has left:
//   depart = max(t, end of the previous message on the link);  arrival = depart + wire(b) + latency.
// The sender stamps the arrival time into a 16-byte header in front of the message; the receiver's
// transport holds a received message back until that time (a timed wait: the core is free meanwhile, as
// it would be while a NIC receives). Messages on one link keep their order. The control plane (settings
// exchange, the sync connector's step messages, the server's relay) is not delayed: its messages are small
// and once per step, and it must work even when ranks disagree on the link settings, so that the settings
// exchange can name the difference.
//
// The arrival time is read off CLOCK_MONOTONIC on both sides, so the model is for ranks on one host (one
// process, or mpirun processes and network namespaces of one machine); between real hosts the link is real.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "afd/config.h"
#include "afd/transport.h"

namespace genbridge::afd {

struct LinkModel {
  int64_t latency_us = 0;      // one-way latency per message
  int64_t bandwidth_mbps = 0;  // megabits per second; 0: unlimited
  bool enabled() const { return latency_us > 0 || bandwidth_mbps > 0; }
  // Nanoseconds a message of `bytes` bytes occupies the link (0 when the bandwidth is unlimited).
  int64_t wire_ns(size_t bytes) const;
};

// The link settings of an AFD config ('link_latency_us', 'link_bandwidth_mbps').
LinkModel link_model_of(const AfdConfig& cfg);

// Bytes the link model puts in front of every data-channel message.
inline constexpr size_t kLinkHeaderBytes = 16;

// `inner` with the link model applied to its data channels. Requests ids are the decorator's own.
std::unique_ptr<Transport> make_link_transport(std::unique_ptr<Transport> inner, LinkModel link);

}  // namespace genbridge::afd
