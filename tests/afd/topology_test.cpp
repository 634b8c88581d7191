// Roles, expert ownership, stage splits and the dispatch layout.

#include "afd/topology.h"

#include <gtest/gtest.h>

#include <vector>

namespace genbridge::afd {
namespace {

AfdConfig config(int A, int F, int E = 8) {
  AfdConfig c;
  c.num_attention = A;
  c.num_ffn = F;
  c.num_experts = E;
  c.top_k = 2;
  c.hidden_size = 4;
  c.num_layers = 2;
  return c;
}

TEST(Topology, roles_from_rank_order) {
  Result<Topology> t = make_topology(config(2, 2), std::vector<int>(4, kRoleUndeclared));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->attention_world, (std::vector<int>{0, 1}));
  EXPECT_EQ(t->ffn_world, (std::vector<int>{2, 3}));
  EXPECT_EQ(t->rank_name(3), "ffn rank 1 (world rank 3)");
  EXPECT_EQ(t->expert_begin(1), 4);
  EXPECT_EQ(t->expert_end(1), 8);
  EXPECT_EQ(t->ffn_of_expert(3), 0);
  EXPECT_EQ(t->ffn_of_expert(4), 1);
}

TEST(Topology, roles_declared_by_an_mpmd_launch_in_any_order) {
  const std::vector<int> roles = {1, 0, 1, 0};  // ffn, attention, ffn, attention
  Result<Topology> t = make_topology(config(2, 2), roles);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->attention_world, (std::vector<int>{1, 3}));
  EXPECT_EQ(t->ffn_world, (std::vector<int>{0, 2}));
  EXPECT_EQ(t->rank_name(0), "ffn rank 0 (world rank 0)");
}

TEST(Topology, declared_counts_must_match_the_config) {
  const Status s = make_topology(config(2, 1), std::vector<int>{0, 1, 1}).status();
  EXPECT_EQ(s.message(),
            "afd: 1 ranks were started with --role attention and 2 with --role ffn, but the config has "
            "'attention_ranks' = 2 and 'ffn_ranks' = 1");
}

TEST(Topology, mixed_declared_and_undeclared_roles) {
  const Status s = make_topology(config(2, 1), std::vector<int>{0, kRoleUndeclared, 1}).status();
  EXPECT_NE(s.message().find("2 of 3 ranks were started with --role and 1 without"), std::string::npos) << s.message();
}

TEST(Topology, job_size_must_be_a_plus_f) {
  const Status s = make_topology(config(2, 1), std::vector<int>(4, kRoleUndeclared)).status();
  EXPECT_NE(s.message().find("the job has 4 ranks but the config asks for 2 attention + 1 FFN = 3 ranks"),
            std::string::npos);
}

TEST(Topology, stage_bounds_cover_the_batch_in_order) {
  for (int n : {0, 1, 2, 5, 7}) {
    for (int S = 1; S <= 3; ++S) {
      int next = 0;
      for (int s = 0; s < S; ++s) {
        const auto [b, e] = stage_bounds(n, S, s);
        EXPECT_EQ(b, next);
        EXPECT_GE(e - b, n / S);
        EXPECT_LE(e - b, n / S + 1);
        next = e;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(DispatchLayout, tokens_go_only_to_ranks_owning_one_of_their_experts) {
  const Topology t = make_topology(config(1, 2), std::vector<int>(3, kRoleUndeclared)).value();
  // Experts 0..3 on FFN 0, 4..7 on FFN 1.
  int32_t ids[] = {0, 1,   // token 0: FFN 0 only
                   5, 2,   // token 1: both (slot 0 on FFN 1, slot 1 on FFN 0)
                   7, 4,   // token 2: FFN 1 only
                   3, 6};  // token 3: both
  DispatchLayout l;
  ASSERT_TRUE(compute_dispatch_layout(TensorView(ids, DType::kI32, {4, 2}), t, 0, &l).ok());
  EXPECT_EQ(l.token_offsets, (std::vector<int32_t>{0, 3, 6}));
  EXPECT_EQ(l.tokens, (std::vector<int32_t>{0, 1, 3, 1, 2, 3}));
  EXPECT_EQ(l.row_offsets, (std::vector<int32_t>{0, 4, 8}));
  EXPECT_EQ(l.rows_token, (std::vector<int32_t>{0, 0, 1, 3, 1, 2, 2, 3}));
  EXPECT_EQ(l.rows_slot, (std::vector<int32_t>{0, 1, 1, 0, 0, 0, 1, 1}));
  // FFN 1 receives tokens 1, 2, 3 with the slots FFN 0 computes as -1, and derives the same rows from them.
  int32_t got1[6];
  for (int i = 0; i < 3; ++i) write_sent_ids(TensorView(ids, DType::kI32, {4, 2}), l, l.tokens[3 + i], 1, got1 + 2 * i);
  EXPECT_EQ(std::vector<int32_t>(got1, got1 + 6), (std::vector<int32_t>{5, -1, 7, 4, -1, 6}));
  std::vector<int32_t> rt, rs;
  ASSERT_TRUE(append_owned_rows(got1, 3, 2, t, 1, 0, 0, &rt, &rs).ok());
  EXPECT_EQ(rt, (std::vector<int32_t>{0, 1, 1, 2}));
  EXPECT_EQ(rs, (std::vector<int32_t>{0, 0, 1, 1}));
}

TEST(DispatchLayout, strided_ids_empty_batch_and_bad_ids) {
  const Topology t = make_topology(config(1, 2), std::vector<int>(3, kRoleUndeclared)).value();
  int32_t ids[] = {6, 99, 1, 99};  // [2, 2] with row stride 2 inside a [2, 4] buffer? use column stride 2
  DispatchLayout l;
  ASSERT_TRUE(compute_dispatch_layout(TensorView::strided(ids, DType::kI32, {1, 2}, {4, 2}), t, 0, &l).ok());
  EXPECT_EQ(l.rows_slot, (std::vector<int32_t>{1, 0}));  // expert 1 (slot 1) on FFN 0, expert 6 (slot 0) on FFN 1
  ASSERT_TRUE(compute_dispatch_layout(TensorView(ids, DType::kI32, {0, 2}), t, 0, &l).ok());
  EXPECT_EQ(l.token_offsets, (std::vector<int32_t>{0, 0, 0}));
  int32_t bad[] = {0, 8};
  EXPECT_EQ(compute_dispatch_layout(TensorView(bad, DType::kI32, {1, 2}), t, 0, &l).message(),
            "afd dispatch: topk_ids[0, 1] is 8 but expert ids must be in 0..7");
  int32_t dup[] = {3, 3};
  EXPECT_EQ(compute_dispatch_layout(TensorView(dup, DType::kI32, {1, 2}), t, 0, &l).message(),
            "afd dispatch: topk_ids[0] selects expert 3 in slots 0 and 1; a token's top-k experts must differ");
}

// Two FFN ranks, experts 0..3 on FFN 0 and 4..7 on FFN 1, MoE layers 0 and 1; layer 1 has copies of expert 0
// on FFN 1 and of expert 5 on FFN 0.
Topology replicated_topology() {
  AfdConfig c = config(1, 2);
  c.redundant_experts = 2;
  c.replicas = {{0, 1, 1}, {0, 6, 0}, {1, 0, 1}, {1, 5, 0}};
  return make_topology(c, std::vector<int>(3, kRoleUndeclared)).value();
}

TEST(DispatchLayout, copies_split_an_experts_rows_between_its_holders_in_token_order) {
  const Topology t = replicated_topology();
  EXPECT_TRUE(t.holds(1, 0, 1));
  EXPECT_TRUE(t.holds(1, 0, 0));
  EXPECT_FALSE(t.holds(0, 0, 1));  // layer 0 copies expert 1, not 0
  EXPECT_EQ(t.held_range(1, 0), (std::pair<int, int>{0, 6}));  // 0..3 and a copy of 5
  EXPECT_EQ(t.held_range(1, 1), (std::pair<int, int>{0, 8}));
  EXPECT_EQ(t.held_range(-1, 0), (std::pair<int, int>{0, 7}));  // layer 0's copy of 6 too
  // Expert 0 in four tokens: rows 0 and 2 on its home FFN 0, rows 1 and 3 on the copy (FFN 1).
  int32_t ids[] = {0, 1,   //
                   0, 2,   //
                   3, 0,   //
                   0, 4};
  const TensorView v(ids, DType::kI32, {4, 2});
  DispatchLayout l;
  ASSERT_TRUE(compute_dispatch_layout(v, t, 1, &l).ok());
  EXPECT_EQ(l.slot_ffn, (std::vector<int8_t>{0, 0, 1, 0, 0, 0, 1, 1}));
  EXPECT_EQ(l.tokens, (std::vector<int32_t>{0, 1, 2, 1, 3}));
  EXPECT_EQ(l.rows_token, (std::vector<int32_t>{0, 0, 1, 2, 2, 1, 3, 3}));
  EXPECT_EQ(l.rows_slot, (std::vector<int32_t>{0, 1, 1, 0, 1, 0, 0, 1}));
  // FFN 1 gets tokens 1 and 3 and computes (1, slot 0) and (3, slots 0 and 1).
  int32_t got[4];
  write_sent_ids(v, l, 1, 1, got);
  write_sent_ids(v, l, 3, 1, got + 2);
  EXPECT_EQ(std::vector<int32_t>(got, got + 4), (std::vector<int32_t>{0, -1, 0, 4}));
  std::vector<int32_t> rt, rs;
  ASSERT_TRUE(append_owned_rows(got, 2, 2, t, 1, 1, 0, &rt, &rs).ok());
  EXPECT_EQ(rt, (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(rs, (std::vector<int32_t>{0, 0, 1}));
  // Layer 0 has no copy of expert 0: every row of it goes home.
  ASSERT_TRUE(compute_dispatch_layout(v, t, 0, &l).ok());
  EXPECT_EQ(l.slot_ffn, (std::vector<int8_t>{0, 0, 0, 0, 0, 0, 0, 1}));
  // ... so FFN 1 refuses a row of expert 0 in layer 0 (a sender that disagrees on the placement).
  rt.clear();
  rs.clear();
  EXPECT_EQ(append_owned_rows(got, 2, 2, t, 1, 0, 0, &rt, &rs).message(),
            "afd: ffn rank 1 (world rank 2) received a row of expert 0 in layer 0 (token 0, slot 0), which it does "
            "not hold");
}

}  // namespace
}  // namespace genbridge::afd
