// Round trip of one MoE layer's transfer through each AFD connector over MPI, against raw MPI send/recv
// of the same bytes in the same run. A plain program launched by mpirun (2 ranks: attention, FFN):
//
//   mpirun -np 2 build/<preset>/bench/bench.afd.afd_transfer_bench [--iters N] [--rounds R]
//
// One round trip = attention: send_attn_output(hidden bf16 [tokens, H], top-1 routing) -> FFN: receive,
// no compute, send_ffn_output -> attention: recv_ffn_output(out bf16 [tokens, 1, H]). Raw MPI moves the
// same bytes (the connector's headers and routing block included), as one blocking MPI_Send/MPI_Recv
// each way on preallocated contiguous buffers (the connector sends two messages each way: header, rows). Methods are
// interleaved in rounds; each cell is the median of all its samples. Overhead = connector median / raw median - 1.

#ifdef GENBRIDGE_HAVE_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "afd/connector.h"
#include "afd/runner.h"
#include "afd/wire.h"
#include "genbridge/core/cpu_target.h"
#include "genbridge/core/formats.h"
#include "support/bench_util.h"

#ifndef GENBRIDGE_HAVE_MPI
// A build without MPI has nothing to measure here.
int main() {
  std::fprintf(stderr, "afd_transfer_bench: this build has no MPI (CMake did not find Open MPI)\n");
  return 0;
}
#else

using namespace genbridge;
using namespace genbridge::afd;

namespace {

constexpr int kLayers = 16;  // MoE layers per step (one round trip each)
const int kTokens[] = {1, 4, 16, 64, 256, 512};
const int kHidden[] = {2048, 4096, 7168};
constexpr int kMaxTokens = 512;

[[noreturn]] void die(const Status& s) {
  std::fprintf(stderr, "afd_transfer_bench: %s\n", s.to_string().c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

// Bytes the connector moves per round trip (header and top-1 routing included); raw MPI moves the same
// bytes, as one message each way.
size_t work_bytes(int tokens, int hidden) {
  return wire::work_meta_bytes(tokens, 1) + wire::rows_bytes(tokens, hidden);
}
size_t result_bytes(int tokens, int hidden) { return wire::kHeaderBytes + wire::rows_bytes(tokens, hidden); }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

AfdConfig bench_config(ConnectorKind kind, int hidden) {
  AfdConfig c;
  c.connector = kind;
  c.transport = TransportKind::kMpi;
  c.num_attention = 1;
  c.num_ffn = 1;
  c.num_stages = 1;
  c.num_experts = 1;
  c.top_k = 1;
  c.hidden_size = hidden;
  c.num_layers = kLayers;
  c.max_tokens_per_stage = kMaxTokens;
  c.timeout_ms = 60000;
  return c;
}

// One method's round trip, driven identically on both ranks so that methods can alternate every
// iteration (the load on a shared machine then hits all methods alike).
class Method {
 public:
  virtual ~Method() = default;
  virtual void round_trip(int rank, int tokens, int iteration) = 0;
};

// Raw MPI: the same bytes as the connector's messages, one blocking send/recv each way.
class RawMpi final : public Method {
 public:
  RawMpi(int hidden, size_t max_bytes) : hidden_(hidden), a_(max_bytes), b_(max_bytes) {}
  void round_trip(int rank, int tokens, int) override {
    const int work = static_cast<int>(work_bytes(tokens, hidden_));
    const int result = static_cast<int>(result_bytes(tokens, hidden_));
    if (rank == 0) {
      MPI_Send(a_.data(), work, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(b_.data(), result, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(a_.data(), work, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(b_.data(), result, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
    }
  }

 private:
  int hidden_;
  std::vector<char> a_, b_;
};

// A connector over MPI: attention sends one layer and receives its outputs; the FFN rank receives,
// computes nothing and sends the item's output rows back. Steps of kLayers layers.
class ConnectorMethod final : public Method {
 public:
  ConnectorMethod(int rank, ConnectorKind kind, int hidden) : hidden_(hidden) {
    Result<std::unique_ptr<Connector> > made = make_connector(bench_config(kind, hidden), make_mpi_transport({}));
    if (!made.ok()) die(made.status());
    c_ = std::move(made).value();
    if (Status s = c_->init(); !s.ok()) die(s);
    if (rank == 0) {
      hidden_buf_.resize(static_cast<size_t>(kMaxTokens) * hidden);
      for (size_t i = 0; i < hidden_buf_.size(); ++i) hidden_buf_[i] = float_to_bf16(static_cast<float>(i % 251));
      out_.resize(static_cast<size_t>(kMaxTokens) * hidden);
      ids_.assign(kMaxTokens, 0);
      w_.assign(kMaxTokens, 1.0f);
    }
  }

  // `iteration` counts this method's round trips; a step is kLayers of them (token count fixed per step).
  void round_trip(int rank, int n, int iteration) override {
    const int layer = iteration % kLayers;
    const int64_t step = iteration / kLayers;
    ControlPlane* cp = c_->control_plane();
    if (rank == 0) {
      if (cp && layer == 0) {
        const int counts[] = {n};
        if (Status s = cp->send_step(step, counts, false); !s.ok()) die(s);
      }
      const Routing routing{TensorView(ids_.data(), DType::kI32, {n, 1}), TensorView(w_.data(), DType::kF32, {n, 1})};
      const TensorView hv(hidden_buf_.data(), DType::kBF16, {n, hidden_});
      if (Status s = c_->send_attn_output(hv, TransferMeta::attention(layer, 0, step, n), routing); !s.ok()) die(s);
      Result<TransferMeta> r = c_->recv_ffn_output(TensorView(out_.data(), DType::kBF16, {n, 1, hidden_}), 0);
      if (!r.ok()) die(r.status());
      return;
    }
    FfnWorkItem item;
    if (cp) {
      if (layer == 0) {
        Result<StepControl> ctl = cp->recv_step();
        if (!ctl.ok()) die(ctl.status());
      }
      Result<FfnWorkItem> got = c_->recv_attn_output(0);
      if (!got.ok()) die(got.status());
      item = std::move(got).value();
    } else {
      Result<std::optional<FfnWorkItem> > got = c_->recv_work_item();
      if (!got.ok()) die(got.status());
      item = std::move(*std::move(got).value());
    }
    if (Status s = c_->send_ffn_output(item.out, std::move(item.state)); !s.ok()) die(s);
  }

  void finish(int rank) {
    if (rank == 0) {
      if (Status s = c_->finish(); !s.ok()) die(s);
    } else if (ControlPlane* cp = c_->control_plane()) {
      Result<StepControl> ctl = cp->recv_step();
      if (!ctl.ok() || !ctl->stop) die(ctl.ok() ? internal_error("expected the stop message") : ctl.status());
    } else {
      Result<std::optional<FfnWorkItem> > got = c_->recv_work_item();
      if (!got.ok() || got->has_value()) die(got.ok() ? internal_error("expected the end of work") : got.status());
    }
    if (Status s = c_->close(); !s.ok()) die(s);
  }

 private:
  int hidden_;
  std::unique_ptr<Connector> c_;
  std::vector<bf16_t> hidden_buf_, out_;
  std::vector<int32_t> ids_;
  std::vector<float> w_;
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
  }
  iters = std::max(kLayers, iters / kLayers * kLayers);  // whole steps
  const int warmup = kLayers;
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) std::fprintf(stderr, "afd_transfer_bench: run with mpirun -np 2 (got %d ranks)\n", size);
    MPI_Finalize();
    return 2;
  }
  if (rank == 0) {
    std::printf("cpu_model: %s\ncpu_target: %s (no kernel runs here: the transfer is memory copies and MPI)\n",
                genbridge::bench::cpu_model_name().c_str(), genbridge::cpu_target().c_str());
    std::printf(
        "round trip of one layer (top-1, 1A1F, S=1), %d samples per cell, microseconds (median); overhead = "
        "median over iterations of connector/raw of the same iteration, minus 1\n\n",
        iters);
    std::printf(
        "| tokens | hidden | bytes A->F | bytes F->A | raw MPI us | sync us | sync overhead | async us | async "
        "overhead |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  for (int hidden : kHidden) {
    RawMpi raw(hidden, work_bytes(kMaxTokens, hidden));
    ConnectorMethod sync(rank, ConnectorKind::kSync, hidden);
    ConnectorMethod async(rank, ConnectorKind::kAsync, hidden);
    Method* methods[3] = {&raw, &sync, &async};
    int done[3] = {0, 0, 0};
    for (int n : kTokens) {
      std::vector<double> t[3];
      for (int i = 0; i < warmup + iters; ++i) {
        for (int m = 0; m < 3; ++m) {
          MPI_Barrier(MPI_COMM_WORLD);
          const double t0 = MPI_Wtime();
          methods[m]->round_trip(rank, n, done[m]++);
          const double t1 = MPI_Wtime();
          if (i >= warmup) t[m].push_back((t1 - t0) * 1e6);
        }
      }
      if (rank == 0) {
        std::vector<double> rs, ra;
        for (size_t i = 0; i < t[0].size(); ++i) {
          rs.push_back(t[1][i] / t[0][i]);
          ra.push_back(t[2][i] / t[0][i]);
        }
        std::printf("| %d | %d | %zu | %zu | %.2f | %.2f | %+.1f%% | %.2f | %+.1f%% |\n", n, hidden,
                    work_bytes(n, hidden), result_bytes(n, hidden), median(t[0]), median(t[1]), (median(rs) - 1) * 100,
                    median(t[2]), (median(ra) - 1) * 100);
        std::fflush(stdout);
      }
    }
    sync.finish(rank);
    async.finish(rank);
  }
  MPI_Finalize();
  return 0;
}

#endif  // GENBRIDGE_HAVE_MPI
