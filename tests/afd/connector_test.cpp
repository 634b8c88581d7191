// The connector contract: construction is inert, init() says what is missing, the control plane is the
// only branch, metadata invariants and call misuse are errors with sentences, and the work item / state
// hand-off behaves as documented.

#include "afd/connector.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "afd/support/inproc_ranks.h"
#include "afd/support/toy_model.h"

namespace genbridge::afd {
namespace {

static_assert(!std::is_copy_constructible_v<BackendState> && !std::is_copy_assignable_v<BackendState>);
static_assert(std::is_nothrow_move_constructible_v<BackendState>);

// Counts every call; init() fails so that nothing else is reachable.
class CountingTransport final : public Transport {
 public:
  explicit CountingTransport(int* calls) : calls_(calls) {}
  std::string_view name() const override { return "counting"; }
  Status init() override { return ++*calls_, unavailable("counting transport: no job"); }
  Status close() override { return ++*calls_, ok_status(); }
  int world_rank() const override { return ++*calls_, 0; }
  int world_size() const override { return ++*calls_, 1; }
  std::span<const int> declared_roles() const override { return ++*calls_, std::span<const int>(); }
  void set_rank_names(std::vector<std::string>) override { ++*calls_; }
  Result<std::span<std::byte>> alloc_buffer(size_t) override { return ++*calls_, unavailable("x"); }
  Result<RequestId> isend(int, Channel, int, std::span<const ConstSegment>) override {
    return ++*calls_, unavailable("x");
  }
  Result<RequestId> irecv(int, Channel, int, std::span<const MutSegment>) override {
    return ++*calls_, unavailable("x");
  }
  Result<bool> test(RequestId, Completion*) override { return ++*calls_, unavailable("x"); }
  Result<int> wait_any(std::span<const RequestId>, Deadline, Completion*) override {
    return ++*calls_, unavailable("x");
  }
  Status cancel(RequestId) override { return ++*calls_, ok_status(); }
  void abort_job(const Status&) override { ++*calls_; }

 private:
  int* calls_;
};

AfdConfig small(ConnectorKind kind, int A = 1, int F = 1, int S = 1) {
  AfdConfig c = testing::toy_config(kind, A, F, S);
  c.timeout_ms = 3000;
  return c;
}

TEST(Connector, construction_touches_no_transport) {
  for (ConnectorKind kind : {ConnectorKind::kSync, ConnectorKind::kAsync}) {
    int calls = 0;
    Result<std::unique_ptr<Connector>> c = make_connector(small(kind), std::make_unique<CountingTransport>(&calls));
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(calls, 0);
    EXPECT_EQ((*c)->init().message(), "counting transport: no job");
    EXPECT_GT(calls, 0);
  }
}

TEST(Connector, make_connector_validates_the_config) {
  AfdConfig c = small(ConnectorKind::kSync);
  c.async_dp = true;
  int calls = 0;
  EXPECT_EQ(make_connector(c, std::make_unique<CountingTransport>(&calls)).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(Connector, mpi_init_says_what_is_missing) {
  // Not started by mpirun (ctest does not set the launcher's variables; make sure).
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) unsetenv(v);
  Result<std::unique_ptr<Connector>> c = make_connector(small(ConnectorKind::kSync), make_mpi_transport({}));
  ASSERT_TRUE(c.ok());
  const Status s = (*c)->init();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  if (mpi_transport_built()) {
    EXPECT_EQ(s.message().substr(0, 64), "mpi transport: this process was not started by mpirun (none of O");
  } else {
    EXPECT_EQ(s.message().substr(0, 43), "mpi transport: this build of genbridge has ");
  }
#ifdef GENBRIDGE_HAVE_MPI
  EXPECT_TRUE(mpi_transport_built());
#else
  EXPECT_FALSE(mpi_transport_built());
#endif
}

TEST(Connector, only_the_sync_connector_has_a_control_plane) {
  int calls = 0;
  auto sync = make_connector(small(ConnectorKind::kSync), std::make_unique<CountingTransport>(&calls)).value();
  auto async = make_connector(small(ConnectorKind::kAsync), std::make_unique<CountingTransport>(&calls)).value();
  EXPECT_NE(sync->control_plane(), nullptr);
  EXPECT_EQ(async->control_plane(), nullptr);
  EXPECT_EQ(sync->name(), "sync");
  EXPECT_EQ(async->name(), "async");
  EXPECT_EQ(sync->recv_work_item().status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(async->recv_attn_output(0).status().code(), StatusCode::kUnimplemented);
}

TEST(Connector, calls_before_init) {
  int calls = 0;
  auto c = make_connector(small(ConnectorKind::kAsync), std::make_unique<CountingTransport>(&calls)).value();
  EXPECT_EQ(c->recv_ffn_output(TensorView(), 0).status().message(),
            "afd async connector: recv_ffn_output() before init()");
}

TEST(Connector, mismatched_settings_between_roles_fail_init_on_every_rank) {
  AfdConfig attn = small(ConnectorKind::kSync, 2, 1, 2);
  AfdConfig ffn = attn;
  ffn.num_stages = 1;
  std::vector<Status> init(3);
  testing::run_ranks({attn, attn, ffn}, [&](int r, Connector&, const Status& s) {
    init[r] = s;
    return ok_status();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(init[r].message(),
              "afd config mismatch: 'stages' is 2 on world rank 0 but 1 on world rank 2; every rank of the job must be "
              "started with the same AFD settings")
        << "rank " << r;
  }
}

TEST(TransferMeta, invariants) {
  const AfdConfig cfg = small(ConnectorKind::kSync, 2, 1, 2);  // layer 0 dense, max 8 tokens
  EXPECT_TRUE(validate_meta(TransferMeta::attention(1, 1, 0, 8), Role::kAttention, cfg).ok());
  EXPECT_TRUE(validate_meta(TransferMeta::attention(1, 0, 0, 0), Role::kAttention, cfg).ok());  // idle stage
  EXPECT_EQ(validate_meta(TransferMeta::attention(0, 0, 0, 1), Role::kAttention, cfg).message(),
            "afd transfer: layer 0 is listed in 'dense_layers'; dense layers stay on the attention side");
  EXPECT_EQ(validate_meta(TransferMeta::attention(4, 0, 0, 1), Role::kAttention, cfg).message(),
            "afd transfer: layer 4 is outside 0..3");
  EXPECT_EQ(validate_meta(TransferMeta::attention(1, 2, 0, 1), Role::kAttention, cfg).message(),
            "afd transfer: stage 2 is outside 0..1 ('stages' is 2)");
  EXPECT_EQ(validate_meta(TransferMeta::attention(1, 0, 0, 9), Role::kAttention, cfg).message(),
            "afd transfer: seq_lens[0] is 9 but must be in 0..8 ('max_tokens_per_stage')");
  EXPECT_EQ(validate_meta(TransferMeta::attention(1, 0, -1, 1), Role::kAttention, cfg).message(),
            "afd transfer: step -1 is negative");
  TransferMeta m = TransferMeta::attention(1, 0, 0, 1);
  m.num_seq_lens = 2;
  EXPECT_EQ(validate_meta(m, Role::kAttention, cfg).message(),
            "afd transfer: seq_lens has 2 entries but must have exactly 1 on the attention side");
  EXPECT_TRUE(validate_meta(m, Role::kFfn, cfg).ok());
  m.num_seq_lens = 0;
  EXPECT_EQ(validate_meta(m, Role::kFfn, cfg).message(),
            "afd transfer: seq_lens has 0 entries but must have 1..2 on the ffn side");
}

// Hand-driven 1A1F sync step: the attention side's misuse errors, the FFN work item's fields, the
// state hand-off (copy path, reuse) and a clean finish.
TEST(Connector, sync_hand_driven_step) {
  const AfdConfig cfg = small(ConnectorKind::kSync, 1, 1, 1);  // H 48, E 8, k 2, layers 1..3 MoE
  const int H = cfg.hidden_size, K = cfg.top_k;
  std::vector<bf16_t> hidden(3 * H);
  for (int i = 0; i < 3 * H; ++i) hidden[i] = float_to_bf16(static_cast<float>(i % 17));
  int32_t ids[] = {0, 7, 3, 4, 6, 1};
  float w[] = {0.5f, 0.5f, 0.25f, 0.75f, 1.0f, 0.0f};
  const Routing routing{TensorView(ids, DType::kI32, {3, K}), TensorView(w, DType::kF32, {3, K})};
  const TensorView hv(hidden.data(), DType::kBF16, {3, H});
  std::vector<bf16_t> out(3 * K * H);
  const TensorView ov(out.data(), DType::kBF16, {3, K, H});

  std::vector<Status> st = testing::run_ranks(cfg, [&](int r, Connector& c, const Status& init) -> Status {
    GB_RETURN_IF_ERROR(init);
    if (r == 0) {
      EXPECT_EQ(c.role(), Role::kAttention);
      ControlPlane* cp = c.control_plane();
      EXPECT_EQ(c.send_attn_output(hv, TransferMeta::attention(1, 0, 0, 3), routing).message(),
                "afd send_attn_output: step 0 was not announced; the sync connector needs "
                "control_plane()->send_step(0, ...) before the step's first transfer");
      const int tokens[] = {3};
      GB_RETURN_IF_ERROR(cp->send_step(0, tokens, false));
      EXPECT_EQ(c.send_attn_output(hv, TransferMeta::attention(2, 0, 0, 3), routing).message(),
                "afd send_attn_output: stage 0 expects MoE layer 1 next (each step sends the MoE layers in order) but "
                "got layer 2");
      const Routing two{TensorView(ids, DType::kI32, {2, K}), TensorView(w, DType::kF32, {2, K})};
      EXPECT_EQ(c.send_attn_output(hv.slice0(0, 2), TransferMeta::attention(1, 0, 0, 2), two).message(),
                "afd send_attn_output: stage 0 of step 0 has 2 tokens but send_step announced 3");
      EXPECT_EQ(c.send_attn_output(TensorView(hidden.data(), DType::kF32, {3, H}), TransferMeta::attention(1, 0, 0, 3),
                                   routing)
                    .message(),
                "afd send_attn_output: hidden must be bf16 [3, 48] with unit stride along hidden, got fp32 [3, 48] "
                "(layer 1, stage 0)");
      EXPECT_EQ(c.recv_ffn_output(ov, 0).status().message(),
                "afd recv_ffn_output: stage 0 has no outstanding transfer");
      EXPECT_EQ(c.recv_work_item().status().code(), StatusCode::kUnimplemented);
      for (int layer = 1; layer <= 3; ++layer) {
        GB_RETURN_IF_ERROR(c.send_attn_output(hv, TransferMeta::attention(layer, 0, 0, 3), routing));
        GB_ASSIGN_OR_RETURN(TransferMeta m, c.recv_ffn_output(ov, 0));
        EXPECT_EQ(m.layer, layer);
        // The stand-in FFN writes expert id + layer into every element of a row.
        for (int t = 0; t < 3; ++t) {
          for (int j = 0; j < K; ++j) {
            EXPECT_EQ(bf16_to_float(out[(t * K + j) * H + 5]), static_cast<float>(ids[t * K + j] + layer));
          }
        }
      }
      EXPECT_EQ(cp->send_step(0, tokens, false).message(),
                "afd send_step: step 0 must be numbered above the previous step 0");
      return c.finish();
    }
    EXPECT_EQ(c.role(), Role::kFfn);
    EXPECT_EQ(c.send_attn_output(hv, TransferMeta::attention(1, 0, 0, 3), routing).message(),
              "afd sync connector: send_attn_output() is a call of the attention side but ffn rank 0 (world rank 1) is "
              "an ffn rank");
    EXPECT_EQ(c.recv_attn_output(0).status().message(),
              "afd recv_attn_output: no step is active; call control_plane()->recv_step() first");
    GB_ASSIGN_OR_RETURN(StepControl ctl, c.control_plane()->recv_step());
    EXPECT_FALSE(ctl.stop);
    EXPECT_EQ(ctl.stage_tokens(0, 0), 3);
    std::vector<bf16_t> own(3 * K * H);
    for (int layer = 1; layer <= 3; ++layer) {
      GB_ASSIGN_OR_RETURN(FfnWorkItem item, c.recv_attn_output(0));
      EXPECT_EQ(item.meta.layer, layer);
      EXPECT_EQ(item.meta.num_seq_lens, 1);
      EXPECT_EQ(item.meta.seq_lens[0], 3);
      EXPECT_EQ(item.hidden.dim(0), 3);
      EXPECT_EQ(std::memcmp(item.hidden.data(), hidden.data(), hidden.size() * 2), 0);
      EXPECT_EQ(item.row_token.size(), 6u);
      EXPECT_EQ(item.expert_begin, 0);
      EXPECT_EQ(item.expert_end, 8);
      const int32_t* got_ids = item.topk_ids.data_as<const int32_t>();
      // Layer 2 writes into the connector's own buffer (no copy); layers 1 and 3 into ours (copied).
      const bool in_place = layer == 2;
      bf16_t* dst = in_place ? item.out.data_as<bf16_t>() : own.data();
      for (size_t row = 0; row < item.row_token.size(); ++row) {
        const int e = got_ids[item.row_token[row] * K + item.row_slot[row]];
        for (int i = 0; i < H; ++i) dst[row * H + i] = float_to_bf16(static_cast<float>(e + layer));
      }
      EXPECT_EQ(c.send_ffn_output(TensorView(own.data(), DType::kBF16, {5, H}), BackendState()).message(),
                "afd send_ffn_output: the state was not handed out by this connector's last receive of that work, or "
                "was already given back");
      EXPECT_EQ(c.send_ffn_output(TensorView(own.data(), DType::kBF16, {5, H}), std::move(item.state)).code(),
                StatusCode::kInvalidArgument)
          << "wrong row count";
      const TensorView src = in_place ? item.out : TensorView(own.data(), DType::kBF16, {6, H});
      GB_RETURN_IF_ERROR(c.send_ffn_output(src, std::move(item.state)));
      EXPECT_FALSE(item.state.valid());
      EXPECT_EQ(c.send_ffn_output(src, std::move(item.state)).code(), StatusCode::kInvalidArgument) << "reuse";
    }
    GB_ASSIGN_OR_RETURN(StepControl end, c.control_plane()->recv_step());
    EXPECT_TRUE(end.stop);
    return ok_status();
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.to_string();
}

// A quantized dispatch (dispatch_row_bytes > 0): the attention side sends rows of opaque bytes, the FFN side gets
// them as uint8 [M, dispatch_row_bytes], two attention ranks' segments packed in rank order (sync 2A1F); bf16 rows
// are refused; expert outputs still travel in bf16.
TEST(Connector, quantized_dispatch_rows_travel_as_bytes) {
  AfdConfig cfg = small(ConnectorKind::kSync, 2, 1, 1);  // H 48
  cfg.dispatch_row_bytes = 52;
  const int K = cfg.top_k, H = cfg.hidden_size, R = cfg.dispatch_row_bytes;
  const int n[2] = {3, 2};
  std::vector<uint8_t> rows[2];
  for (int a = 0; a < 2; ++a) {
    for (int i = 0; i < n[a] * R; ++i) rows[a].push_back(static_cast<uint8_t>(31 * a + i));
  }
  int32_t ids[] = {0, 7, 3, 4, 6, 1};
  float w[] = {0.5f, 0.5f, 0.25f, 0.75f, 1.0f, 0.0f};
  std::vector<Status> st = testing::run_ranks(cfg, [&](int r, Connector& c, const Status& init) -> Status {
    GB_RETURN_IF_ERROR(init);
    if (r < 2) {
      const int m = n[r];
      const Routing routing{TensorView(ids, DType::kI32, {m, K}), TensorView(w, DType::kF32, {m, K})};
      const int tokens[] = {m};
      GB_RETURN_IF_ERROR(c.control_plane()->send_step(0, tokens, false));
      std::vector<bf16_t> bf16(static_cast<size_t>(m * H));
      EXPECT_EQ(c.send_attn_output(TensorView(bf16.data(), DType::kBF16, {m, H}), TransferMeta::attention(1, 0, 0, m),
                                   routing)
                    .message(),
                fmt::format("afd send_attn_output: hidden must be uint8 [{}, 52] with unit stride along the row (a "
                            "quantized dispatch's codes and scales), got bf16 [{}, 48] (layer 1, stage 0)",
                            m, m));
      std::vector<bf16_t> out(static_cast<size_t>(m * K * H));
      for (int layer = 1; layer <= 3; ++layer) {
        GB_RETURN_IF_ERROR(c.send_attn_output(TensorView(rows[r].data(), DType::kU8, {m, R}),
                                              TransferMeta::attention(layer, 0, 0, m), routing));
        GB_ASSIGN_OR_RETURN(TransferMeta got, c.recv_ffn_output(TensorView(out.data(), DType::kBF16, {m, K, H}), 0));
        EXPECT_EQ(got.layer, layer);
        EXPECT_EQ(bf16_to_float(out[H + 3]), static_cast<float>(layer));
      }
      return c.finish();
    }
    GB_ASSIGN_OR_RETURN(StepControl ctl, c.control_plane()->recv_step());
    EXPECT_FALSE(ctl.stop);
    for (int layer = 1; layer <= 3; ++layer) {
      GB_ASSIGN_OR_RETURN(FfnWorkItem item, c.recv_attn_output(0));
      EXPECT_EQ(item.hidden.dtype(), DType::kU8);
      EXPECT_EQ(item.hidden.dim(0), 5);
      EXPECT_EQ(item.hidden.dim(1), R);
      EXPECT_EQ(std::memcmp(item.hidden.data(), rows[0].data(), rows[0].size()), 0);
      EXPECT_EQ(std::memcmp(item.hidden.data_as<uint8_t>() + rows[0].size(), rows[1].data(), rows[1].size()), 0);
      for (int64_t i = 0; i < item.out.numel(); ++i) item.out.data_as<bf16_t>()[i] = float_to_bf16(layer);
      GB_RETURN_IF_ERROR(c.send_ffn_output(item.out, std::move(item.state)));
    }
    GB_ASSIGN_OR_RETURN(StepControl end, c.control_plane()->recv_step());
    EXPECT_TRUE(end.stop);
    return ok_status();
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.to_string();
}

// Ranks that disagree on the dispatch's rows fail init naming the key.
TEST(Connector, mismatched_dispatch_rows_fail_init) {
  AfdConfig attn = small(ConnectorKind::kAsync, 1, 1, 1);
  AfdConfig ffn = attn;
  ffn.dispatch_row_bytes = 52;
  std::vector<Status> init(2);
  testing::run_ranks({attn, ffn}, [&](int r, Connector&, const Status& s) {
    init[r] = s;
    return ok_status();
  });
  for (const Status& s : init) {
    EXPECT_EQ(s.message(),
              "afd config mismatch: 'dispatch_row_bytes' is 0 on world rank 0 but 52 on world rank 1; every rank of "
              "the job must be started with the same AFD settings");
  }
}

// The async FIFO holds two transfers per stage; a third is refused.
TEST(Connector, async_fifo_depth) {
  const AfdConfig cfg = small(ConnectorKind::kAsync, 1, 1, 1);
  const int H = cfg.hidden_size, K = cfg.top_k;
  std::vector<bf16_t> hidden(H);
  int32_t ids[] = {2, 5};
  float w[] = {0.5f, 0.5f};
  const Routing routing{TensorView(ids, DType::kI32, {1, K}), TensorView(w, DType::kF32, {1, K})};
  const TensorView hv(hidden.data(), DType::kBF16, {1, H});
  std::vector<bf16_t> out(K * H);
  std::vector<Status> st = testing::run_ranks(cfg, [&](int r, Connector& c, const Status& init) -> Status {
    GB_RETURN_IF_ERROR(init);
    if (r == 0) {
      GB_RETURN_IF_ERROR(c.send_attn_output(hv, TransferMeta::attention(1, 0, 0, 1), routing));
      GB_RETURN_IF_ERROR(c.send_attn_output(hv, TransferMeta::attention(2, 0, 0, 1), routing));
      EXPECT_EQ(c.send_attn_output(hv, TransferMeta::attention(3, 0, 0, 1), routing).message(),
                "afd send_attn_output: stage 0 already has 2 outstanding transfers (layers 1 and 2); call "
                "recv_ffn_output(0) first");
      for (int layer = 1; layer <= 2; ++layer) {
        GB_ASSIGN_OR_RETURN(TransferMeta m, c.recv_ffn_output(TensorView(out.data(), DType::kBF16, {1, K, H}), 0));
        EXPECT_EQ(m.layer, layer);
      }
      GB_RETURN_IF_ERROR(c.send_attn_output(hv, TransferMeta::attention(3, 0, 0, 1), routing));
      GB_RETURN_IF_ERROR(c.recv_ffn_output(TensorView(out.data(), DType::kBF16, {1, K, H}), 0).status());
      return c.finish();
    }
    int served = 0;
    for (;;) {
      GB_ASSIGN_OR_RETURN(std::optional<FfnWorkItem> item, c.recv_work_item());
      if (!item) break;
      EXPECT_EQ(item->source, 0);
      EXPECT_EQ(item->meta.layer, 1 + served);
      GB_RETURN_IF_ERROR(c.send_ffn_output(item->out, std::move(item->state)));
      ++served;
    }
    EXPECT_EQ(served, 3);
    return ok_status();
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace genbridge::afd
