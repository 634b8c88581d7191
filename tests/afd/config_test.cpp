// The closed AFD config schema: every rule is a start-up error naming the key and the rule.

#include "afd/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>

namespace genbridge::afd {
namespace {

constexpr const char* kValid =
    R"({"attention_ranks": 2, "ffn_ranks": 2, "stages": 2, "connector": "async", "transport": "mpi",
        "async_dp": true, "max_tokens_per_stage": 64, "timeout_ms": 5000, "idle_timeout_ms": 7000, "init_timeout_ms": 9000,
        "num_experts": 8, "top_k": 2, "hidden_size": 128, "num_layers": 4, "dense_layers": [0, 2]})";

std::string error_of(std::string_view json) {
  Result<AfdConfig> r = parse_afd_config(json);
  EXPECT_FALSE(r.ok()) << json;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

// A valid config with one key replaced.
std::string with(std::string_view key, std::string_view value) {
  nlohmann::json j = nlohmann::json::parse(kValid);
  j[std::string(key)] = nlohmann::json::parse(value);
  return j.dump();
}

TEST(AfdConfig, parses_every_key) {
  Result<AfdConfig> r = parse_afd_config(kValid);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const AfdConfig& c = *r;
  EXPECT_EQ(c.num_attention, 2);
  EXPECT_EQ(c.num_ffn, 2);
  EXPECT_EQ(c.num_stages, 2);
  EXPECT_EQ(c.connector, ConnectorKind::kAsync);
  EXPECT_EQ(c.transport, TransportKind::kMpi);
  EXPECT_TRUE(c.async_dp);
  EXPECT_EQ(c.max_tokens_per_stage, 64);
  EXPECT_EQ(c.timeout_ms, 5000);
  EXPECT_EQ(c.init_timeout_ms, 9000);
  EXPECT_EQ(c.idle_timeout_ms, 7000);
  EXPECT_EQ(c.experts_per_ffn(), 4);
  EXPECT_EQ(c.moe_layers(), (std::vector<int>{1, 3}));
}

TEST(AfdConfig, dispatch_row_bytes) {
  EXPECT_EQ(parse_afd_config(kValid)->dispatch_row_bytes, 0);
  EXPECT_EQ(parse_afd_config(kValid)->dispatch_bytes_per_token(), 256);  // bf16 rows
  EXPECT_EQ(parse_afd_config(with("dispatch_row_bytes", "132"))->dispatch_bytes_per_token(), 132);
  for (const char* bad : {"128", "130", "-4"}) {
    EXPECT_EQ(error_of(with("dispatch_row_bytes", bad)),
              std::string("afd config: 'dispatch_row_bytes' is ") + bad +
                  " but must be 0 (bf16 rows) or a multiple of 4 above 'hidden_size' (128): a quantized row holds one "
                  "byte per element and its scales");
  }
}

TEST(AfdConfig, unknown_key) {
  EXPECT_EQ(error_of(with("stage", "2")).substr(0, 30), "afd config: unknown key 'stage");
}

TEST(AfdConfig, attention_or_ffn_ranks_not_positive) {
  EXPECT_EQ(error_of(with("attention_ranks", "0")),
            "afd config: 'attention_ranks' is 0 but must be in 1..64 (A, the number of attention ranks)");
  EXPECT_EQ(error_of(with("ffn_ranks", "-1")),
            "afd config: 'ffn_ranks' is -1 but must be in 1..64 (F, the number of FFN ranks)");
}

TEST(AfdConfig, experts_not_divisible_by_ffn_ranks) {
  EXPECT_EQ(error_of(with("ffn_ranks", "3")),
            "afd config: 'num_experts' is 8 but must be divisible by 'ffn_ranks' (3) so that every FFN rank owns the "
            "same number of experts");
}

TEST(AfdConfig, stages_outside_one_to_three) {
  EXPECT_EQ(error_of(with("stages", "0")), "afd config: 'stages' is 0 but must be in 1..3");
  EXPECT_EQ(error_of(with("stages", "4")), "afd config: 'stages' is 4 but must be in 1..3");
}

TEST(AfdConfig, async_dp_with_the_sync_connector) {
  EXPECT_EQ(error_of(with("connector", "\"sync\"")).substr(0, 56),
            "afd config: 'async_dp' is true but 'connector' is \"sync\"");
}

TEST(AfdConfig, every_default_deadline_is_finite) {
  const AfdConfig c;
  EXPECT_GE(c.timeout_ms, 1);
  EXPECT_GE(c.init_timeout_ms, 1);
  EXPECT_GE(c.idle_timeout_ms, 1) << "an FFN or attention rank would wait forever for a stopped peer";
}

TEST(AfdConfig, wrong_types_and_values) {
  EXPECT_EQ(error_of(with("stages", "\"2\"")), "afd config: 'stages' must be an integer, got \"2\"");
  EXPECT_EQ(error_of(with("connector", "\"fast\"")),
            "afd config: 'connector' is \"fast\" but must be \"sync\" or \"async\"");
  EXPECT_EQ(error_of(with("transport", "\"nccl\"")),
            "afd config: 'transport' is \"nccl\" but must be \"inproc\" or \"mpi\"");
  EXPECT_EQ(error_of(with("async_dp", "1")), "afd config: 'async_dp' must be true or false, got 1");
  EXPECT_EQ(error_of(with("timeout_ms", "0")), "afd config: 'timeout_ms' is 0 but must be >= 1");
  EXPECT_EQ(error_of(with("init_timeout_ms", "0")), "afd config: 'init_timeout_ms' is 0 but must be >= 1");
  // Every wait has a deadline: 0 no longer means "wait forever".
  EXPECT_EQ(error_of(with("idle_timeout_ms", "0")),
            "afd config: 'idle_timeout_ms' is 0 but must be >= 1 (every wait has a deadline)");
  EXPECT_EQ(error_of(with("idle_timeout_ms", "-1")),
            "afd config: 'idle_timeout_ms' is -1 but must be >= 1 (every wait has a deadline)");
  EXPECT_EQ(error_of(with("top_k", "9")),
            "afd config: 'top_k' is 9 but must be in 1..8 (at most num_experts and at most 16)");
  EXPECT_EQ(error_of("[1, 2]"), "afd config: must be a JSON object, got array");
  EXPECT_EQ(error_of("{"), "afd config: the text is not valid JSON");
}

TEST(AfdConfig, dense_layers_rules) {
  EXPECT_EQ(error_of(with("dense_layers", "[4]")), "afd config: 'dense_layers' contains 4 but layers are 0..3");
  EXPECT_EQ(error_of(with("dense_layers", "[2, 1]")),
            "afd config: 'dense_layers' must be strictly ascending, but 1 follows 2");
  EXPECT_EQ(error_of(with("dense_layers", "[0, 1, 2, 3]")),
            "afd config: 'dense_layers' lists all 4 layers; AFD needs at least one MoE layer for the FFN ranks");
}

TEST(AfdConfig, message_size_limit) {
  EXPECT_NE(error_of(with("max_tokens_per_stage", "100000000")).find("the limit is 1 GiB per message"),
            std::string::npos);
}

TEST(AfdConfig, topology_string) {
  AfdConfig c;
  ASSERT_TRUE(apply_topology_string("2A1F", &c).ok());
  EXPECT_EQ(c.num_attention, 2);
  EXPECT_EQ(c.num_ffn, 1);
  ASSERT_TRUE(apply_topology_string("16a4f", &c).ok());
  EXPECT_EQ(c.num_attention, 16);
  for (const char* bad : {"0A1F", "2A", "A1F", "2A1F ", "2B1F", "2A0F", ""}) {
    const Status s = apply_topology_string(bad, &c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("must look like <A>A<F>F"), std::string::npos) << s.message();
  }
}

TEST(AfdConfig, topology_counts_leave_the_range_to_the_caller) {
  const std::optional<TopologyCounts> t = parse_topology_counts("65a0F");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->num_attention, 65);
  EXPECT_EQ(t->num_ffn, 0);
  for (const char* bad : {"2A", "A1F", "2A1F ", "2B1F", "", "99999999999A1F"}) {
    EXPECT_FALSE(parse_topology_counts(bad).has_value()) << bad;
  }
}

TEST(AfdConfig, the_connector_decides_lockstep) {
  AfdConfig c;
  set_connector(ConnectorKind::kAsync, &c);
  EXPECT_EQ(c.connector, ConnectorKind::kAsync);
  EXPECT_TRUE(c.async_dp);
  set_connector(ConnectorKind::kSync, &c);
  EXPECT_EQ(c.connector, ConnectorKind::kSync);
  EXPECT_FALSE(c.async_dp);
}

TEST(AfdConfig, valid_config_is_checked_once_at_creation) {
  AfdConfig bad = parse_afd_config(kValid).value();
  bad.num_stages = 4;
  const Result<ValidAfdConfig> refused = ValidAfdConfig::create(bad);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), validate(bad).message());
  const Result<ValidAfdConfig> valid = ValidAfdConfig::create(parse_afd_config(kValid).value());
  ASSERT_TRUE(valid.ok());
  EXPECT_EQ(canonical_settings(*valid), canonical_settings(parse_afd_config(kValid).value()));
}

TEST(AfdConfig, canonical_settings_name_the_first_difference) {
  AfdConfig a = parse_afd_config(kValid).value();
  AfdConfig b = a;
  EXPECT_EQ(first_differing_key(canonical_settings(a), canonical_settings(b), nullptr, nullptr), "");
  b.num_stages = 1;
  b.top_k = 1;
  std::string va, vb;
  EXPECT_EQ(first_differing_key(canonical_settings(a), canonical_settings(b), &va, &vb), "stages");
  EXPECT_EQ(va, "2");
  EXPECT_EQ(vb, "1");
}

TEST(AfdConfig, link_model_keys) {
  // kValid: 64 tokens per stage x min(top_k 2, 4 experts per FFN rank) x 128 x 2 = 32768 bytes, the largest
  // message; timeout_ms 5000.
  const AfdConfig c = parse_afd_config(with("link_latency_us", "170")).value();
  EXPECT_EQ(c.link_latency_us, 170);
  EXPECT_EQ(c.link_bandwidth_mbps, 0);
  EXPECT_EQ(parse_afd_config(with("link_bandwidth_mbps", "100000"))->link_bandwidth_mbps, 100000);
  EXPECT_EQ(parse_afd_config(kValid)->link_latency_us, 0);
  EXPECT_EQ(error_of(with("link_latency_us", "-1")),
            "afd config: 'link_latency_us' is -1 but must be in 0..10000000 (microseconds)");
  EXPECT_EQ(error_of(with("link_bandwidth_mbps", "1000000001")),
            "afd config: 'link_bandwidth_mbps' is 1000000001 but must be in 0..1000000000 (megabits per second; 0: "
            "unlimited)");
  EXPECT_EQ(error_of(with("link_latency_us", "\"170\"")),
            "afd config: 'link_latency_us' must be an integer, got \"170\"");
  // 5 s of latency reaches the 5 s deadline; at 1 Mb/s the 32768-byte message takes 262 ms on the wire.
  EXPECT_EQ(error_of(with("link_latency_us", "5000000")),
            "afd config: over the link model ('link_latency_us' 5000000, 'link_bandwidth_mbps' 0) one stage's largest "
            "transfer (32768 bytes) would take 5000.000 ms, at least 'timeout_ms' (5000)");
  nlohmann::json j = nlohmann::json::parse(kValid);
  j["link_latency_us"] = 4800000;
  j["link_bandwidth_mbps"] = 1;
  EXPECT_NE(error_of(j.dump()).find("would take 5062.144 ms, at least 'timeout_ms' (5000)"), std::string::npos);
  j["link_latency_us"] = 4000000;
  EXPECT_TRUE(parse_afd_config(j.dump()).ok());
}

TEST(AfdConfig, ranks_that_disagree_on_the_link_are_told_which_key_differs) {
  AfdConfig a = parse_afd_config(kValid).value();
  AfdConfig b = a;
  b.link_bandwidth_mbps = 100000;
  std::string va, vb;
  EXPECT_EQ(first_differing_key(canonical_settings(a), canonical_settings(b), &va, &vb), "link_bandwidth_mbps");
  EXPECT_EQ(va, "0");
  EXPECT_EQ(vb, "100000");
}

}  // namespace
}  // namespace genbridge::afd
