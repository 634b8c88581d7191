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
//
//   mpirun -np 2 build/<preset>/bench/bench.afd.afd_transfer_bench --dispatch [--iters N]
//
// measures the quantized MoE dispatch instead (docs/afd.md#quantized-dispatch): the same round trip through the
// sync connector with bf16 rows and with each generation's quantized rows (int8 + fp32 scale per token: H + 4 bytes;
// MXFP8: H + H/32 bytes), interleaved every iteration, so each cell's bytes and time stand against bf16's of the same
// run. Expert outputs travel in bf16 either way. Beside them, on world rank 0 while the other rank sleeps, what the
// rows cost to make and to decode (runtime/device/moe_dispatch.h: quantize_dispatch of bf16 [tokens, H],
// dequantize_dispatch to fp32), medians of the same number of calls, where the build's generation has the
// representation's data path.

#ifdef GENBRIDGE_HAVE_MPI
#include <mpi.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "afd/connector.h"
#include "afd/runner.h"
#include "afd/wire.h"
#include "genbridge/build_info.h"
#include "genbridge/core/cpu_target.h"
#include "genbridge/core/formats.h"
#include "genbridge/core/threading.h"
#include "runtime/device/moe_dispatch.h"
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

AfdConfig bench_config(ConnectorKind kind, int hidden, int dispatch_row_bytes = 0) {
  AfdConfig c;
  c.dispatch_row_bytes = dispatch_row_bytes;
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
// `dispatch_row_bytes` > 0: the dispatch sends rows of that many bytes (a quantized dispatch) instead of bf16 rows.
class ConnectorMethod final : public Method {
 public:
  ConnectorMethod(int rank, ConnectorKind kind, int hidden, int dispatch_row_bytes = 0)
      : hidden_(hidden), row_bytes_(dispatch_row_bytes) {
    Result<std::unique_ptr<Connector> > made =
        make_connector(bench_config(kind, hidden, dispatch_row_bytes), make_mpi_transport({}));
    if (!made.ok()) die(made.status());
    c_ = std::move(made).value();
    if (Status s = c_->init(); !s.ok()) die(s);
    if (rank == 0) {
      hidden_buf_.resize(static_cast<size_t>(kMaxTokens) * hidden);
      for (size_t i = 0; i < hidden_buf_.size(); ++i) hidden_buf_[i] = float_to_bf16(static_cast<float>(i % 251));
      rows_buf_.resize(static_cast<size_t>(kMaxTokens) * std::max(row_bytes_, 1));
      for (size_t i = 0; i < rows_buf_.size(); ++i) rows_buf_[i] = static_cast<uint8_t>(i % 251);
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
      const TensorView hv = row_bytes_ > 0 ? TensorView(rows_buf_.data(), DType::kU8, {n, row_bytes_})
                                           : TensorView(hidden_buf_.data(), DType::kBF16, {n, hidden_});
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
  int row_bytes_;
  std::unique_ptr<Connector> c_;
  std::vector<bf16_t> hidden_buf_, out_;
  std::vector<uint8_t> rows_buf_;
  std::vector<int32_t> ids_;
  std::vector<float> w_;
};

// The quantized dispatch's representations, named as the table prints them.
struct Representation {
  const char* name;
  const runtime::DispatchRepresentation* rep;
};
std::vector<Representation> representations() {
  return {{"int8 + fp32 / token (A2/A3)", &runtime::contract_for(runtime::Generation::kAscend910).quantized_dispatch},
          {"MXFP8 e4m3 + e8m0 / 32 (A5)", &runtime::contract_for(runtime::Generation::kAscend950).quantized_dispatch}};
}

// Median microseconds of quantize_dispatch and dequantize_dispatch on bf16 [n, H]; negative where the build's
// generation has no data path for the representation.
std::pair<double, double> row_costs(const runtime::DispatchRepresentation& r, int n, int hidden, int iters) {
  std::vector<bf16_t> x(static_cast<size_t>(n) * hidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(static_cast<float>(static_cast<int>(i % 251) - 125) / 16);
  const int64_t row = runtime::dispatch_row_bytes(r, hidden);
  std::vector<uint32_t> rows(static_cast<size_t>((n * row + 3) / 4));
  std::vector<float> y(static_cast<size_t>(n) * hidden);
  const TensorView xv(x.data(), DType::kBF16, {n, hidden}), rv(rows.data(), DType::kU8, {n, row}),
      yv(y.data(), DType::kF32, {n, hidden});
  if (!runtime::quantize_dispatch(r, xv, rv).ok()) return {-1, -1};
  std::vector<double> q, d;
  for (int i = 0; i < iters; ++i) {
    double t0 = MPI_Wtime();
    if (Status s = runtime::quantize_dispatch(r, xv, rv); !s.ok()) die(s);
    double t1 = MPI_Wtime();
    if (Status s = runtime::dequantize_dispatch(r, rv, yv); !s.ok()) die(s);
    double t2 = MPI_Wtime();
    q.push_back((t1 - t0) * 1e6);
    d.push_back((t2 - t1) * 1e6);
  }
  return {median(q), median(d)};
}

// Waits for the other rank at a barrier without spinning (1 ms naps), so that work measured on the other rank
// meanwhile has the cores to itself.
void quiet_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  for (int flag = 0; !flag;) {
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (!flag) usleep(1000);
  }
}

// --dispatch: bf16 rows against each representation's quantized rows, sync connector, the same run; then, with
// the FFN rank asleep, what making and decoding the rows costs on world rank 0.
void dispatch_table(int rank, int iters, int warmup) {
  const int kDispatchTokens[] = {1, 4, 16, 64, 256};
  const std::vector<Representation> reps = representations();
  struct Cell {
    int n, hidden;
    std::vector<double> median_us, ratio;  // per method (bf16 first); ratio to bf16 of the same iteration
  };
  std::vector<Cell> cells;
  for (int hidden : kHidden) {
    std::vector<std::unique_ptr<ConnectorMethod> > methods;
    methods.push_back(std::make_unique<ConnectorMethod>(rank, ConnectorKind::kSync, hidden));
    for (const Representation& r : reps) {
      methods.push_back(std::make_unique<ConnectorMethod>(
          rank, ConnectorKind::kSync, hidden, static_cast<int>(runtime::dispatch_row_bytes(*r.rep, hidden))));
    }
    const size_t M = methods.size();
    std::vector<int> done(M, 0);
    for (int n : kDispatchTokens) {
      std::vector<std::vector<double> > t(M);
      for (int i = 0; i < warmup + iters; ++i) {
        for (size_t m = 0; m < M; ++m) {
          MPI_Barrier(MPI_COMM_WORLD);
          const double t0 = MPI_Wtime();
          methods[m]->round_trip(rank, n, done[m]++);
          const double t1 = MPI_Wtime();
          if (i >= warmup) t[m].push_back((t1 - t0) * 1e6);
        }
      }
      Cell c{n, hidden, {}, {}};
      for (size_t m = 0; m < M; ++m) {
        std::vector<double> ratio;
        for (size_t i = 0; i < t[0].size(); ++i) ratio.push_back(t[m][i] / t[0][i]);
        c.median_us.push_back(median(t[m]));
        c.ratio.push_back(median(ratio));
      }
      cells.push_back(std::move(c));
    }
    for (auto& m : methods) m->finish(rank);
  }
  if (rank != 0) {
    quiet_barrier();
    return;
  }
  std::printf(
      "round trip of one layer (top-1, 1A1F, S=1, sync connector), %d samples per cell, microseconds (median); bf16 "
      "and quantized rows interleaved every iteration; x bf16 = median over iterations of quantized/bf16 of the same "
      "iteration; quantize / decode: quantize_dispatch and dequantize_dispatch of [tokens, hidden] on world rank 0 "
      "while the other rank sleeps, %d threads, median of %d calls, n/a where this build (%s) has no data path\n\n",
      iters, num_threads(), iters, std::string(ops::build_target()).c_str());
  std::printf(
      "| tokens | hidden | dispatch rows | bytes A->F | x bf16 | bytes F->A | round trip us | x bf16 | quantize us | "
      "decode us |\n");
  std::printf("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  const auto us = [](double v) {
    char b[32];
    std::snprintf(b, sizeof(b), "%.2f", v);
    return v < 0 ? std::string("n/a") : std::string(b);
  };
  for (const Cell& c : cells) {
    const int n = c.n, hidden = c.hidden;
    const size_t work_bf16 = wire::work_meta_bytes(n, 1) + wire::dispatch_rows_bytes(n, int64_t{2} * hidden);
    std::printf("| %d | %d | bf16 | %zu | 1 | %zu | %.2f | 1 | - | - |\n", n, hidden, work_bf16,
                result_bytes(n, hidden), c.median_us[0]);
    for (size_t m = 1; m < c.median_us.size(); ++m) {
      const runtime::DispatchRepresentation& r = *reps[m - 1].rep;
      const size_t work =
          wire::work_meta_bytes(n, 1) + wire::dispatch_rows_bytes(n, runtime::dispatch_row_bytes(r, hidden));
      const auto [q, d] = row_costs(r, n, hidden, iters);
      std::printf("| %d | %d | %s | %zu | %.3f | %zu | %.2f | %.3f | %s | %s |\n", n, hidden, reps[m - 1].name, work,
                  static_cast<double>(work) / static_cast<double>(work_bf16), result_bytes(n, hidden), c.median_us[m],
                  c.ratio[m], us(q).c_str(), us(d).c_str());
    }
    std::fflush(stdout);
  }
  quiet_barrier();
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 64;
  bool dispatch = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--dispatch")) dispatch = true;
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
    std::printf("load average (1 min) at start: %.2f\n", genbridge::bench::load_average());
  }
  if (dispatch) {
    dispatch_table(rank, iters, warmup);
    if (rank == 0) std::printf("\nload average (1 min) at end: %.2f\n", genbridge::bench::load_average());
    MPI_Finalize();
    return 0;
  }
  if (rank == 0) {
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
