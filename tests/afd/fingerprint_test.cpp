// Connector::init compares every rank's fingerprint (what the job was started with) and ends the job on
// every rank, before any transfer, with an error naming the first item that differs, both values and both
// ranks.

#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "afd/connector.h"
#include "afd/support/toy_model.h"
#include "afd/transports/inproc/inproc_transport.h"

namespace genbridge::afd {
namespace {

using Items = std::vector<FingerprintItem>;

// init() of every rank of a 2A1F job, rank r with fingerprints[r]; returns each rank's status.
std::vector<Status> init_all(const std::vector<Items>& fingerprints, ConnectorKind kind = ConnectorKind::kSync) {
  AfdConfig cfg = testing::toy_config(kind, 2, 1, 1);
  cfg.init_timeout_ms = 5000;
  const int n = static_cast<int>(fingerprints.size());
  auto world = make_inproc_world(n, 5000);
  std::vector<Status> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Result<std::unique_ptr<Connector>> c = make_connector(cfg, make_inproc_transport(world, r));
      if (!c.ok()) {
        out[r] = c.status();
        return;
      }
      out[r] = (*c)->init(fingerprints[r]);
      (*c)->close().ignore();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

const Items kBase = {{"--model", "/m/a"}, {"--max-new-tokens", "4"}, {"--num-prompts", "5"}};

Items with(std::string name, std::string value) {
  Items items = kBase;
  for (auto& i : items) {
    if (i.name == name) i.value = value;
  }
  return items;
}

TEST(AfdFingerprint, equal_fingerprints_pass) {
  for (ConnectorKind kind : {ConnectorKind::kSync, ConnectorKind::kAsync}) {
    for (const Status& s : init_all({kBase, kBase, kBase}, kind)) EXPECT_TRUE(s.ok()) << s.to_string();
  }
}

TEST(AfdFingerprint, first_differing_item_is_named_with_both_values_and_ranks_on_every_rank) {
  const std::vector<Status> st = init_all({kBase, kBase, with("--max-new-tokens", "5")});
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(),
              "afd: the ranks of the job were started with different settings: --max-new-tokens is 4 on attention "
              "rank 0 (world rank 0) but 5 on ffn rank 0 (world rank 2); every rank of the job must be started with "
              "the same model, requests and flags");
  }
}

TEST(AfdFingerprint, items_are_compared_in_order) {
  // Both --model and --num-prompts differ on attention rank 1: the first item given is named.
  Items other = with("--model", "/m/b");
  other[2].value = "6";
  const std::vector<Status> st = init_all({kBase, other, kBase});
  for (const Status& s : st) {
    EXPECT_EQ(s.message(),
              "afd: the ranks of the job were started with different settings: --model is /m/a on attention rank 0 "
              "(world rank 0) but /m/b on attention rank 1 (world rank 1); every rank of the job must be started "
              "with the same model, requests and flags");
  }
}

TEST(AfdFingerprint, an_item_only_one_rank_has_differs) {
  Items extra = kBase;
  extra.push_back({"--prompt", "2 prompts, digest 0123456789abcdef"});
  for (const Status& s : init_all({kBase, kBase, extra})) {
    EXPECT_EQ(s.message(),
              "afd: the ranks of the job were started with different settings: --prompt is (not given) on attention "
              "rank 0 (world rank 0) but 2 prompts, digest 0123456789abcdef on ffn rank 0 (world rank 2); every rank "
              "of the job must be started with the same model, requests and flags");
  }
  Items fewer = kBase;
  fewer.pop_back();
  for (const Status& s : init_all({kBase, fewer, kBase})) {
    EXPECT_NE(s.message().find("--num-prompts is 5 on attention rank 0 (world rank 0) but (not given) on attention "
                               "rank 1 (world rank 1)"),
              std::string::npos)
        << s.message();
  }
}

TEST(AfdFingerprint, digest_is_stable_and_sensitive) {
  EXPECT_EQ(fingerprint_digest(""), "cbf29ce484222325");  // FNV-1a 64 offset basis
  EXPECT_EQ(fingerprint_digest("a"), "af63dc4c8601ec8c");
  EXPECT_NE(fingerprint_digest("1,2,3"), fingerprint_digest("1,2,4"));
}

}  // namespace
}  // namespace genbridge::afd
