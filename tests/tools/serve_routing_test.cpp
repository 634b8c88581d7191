// The service's choice of worker (engine) for a request: the least loaded one, or with prefix caching
// (ServiceOptions::route_by_first_tokens) the one its first tokens name, so that requests sharing them (a chat's
// turns, a common system prompt) meet the pages that worker cached; load still wins past a quarter batch (at least 2)
// or when the named worker is full and another is not.
#include <gtest/gtest.h>

#include <vector>

#include "tools/serve/service.h"

namespace genbridge::serve {
namespace {

std::vector<int64_t> loads(const GenerationService& s, int workers) {
  std::vector<int64_t> out;
  for (int w = 0; w < workers; ++w) out.push_back(s.unfinished(w));
  return out;
}

GenerationRequest req(std::vector<int32_t> prompt) { return {.prompt = std::move(prompt), .max_tokens = 1}; }

TEST(ServeRouting, least_loaded_without_prefix_caching) {
  GenerationService s(WorkerPools{.workers = 3, .pages_per_worker = 8, .bytes_per_page = 1},
                      {.max_batch = 8, .max_queued_requests = 64});
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(s.submit(req({1, 2, 3, 4, 5})).ok());
  EXPECT_EQ(loads(s, 3), (std::vector<int64_t>{2, 2, 2}));
}

TEST(ServeRouting, requests_sharing_their_first_tokens_go_to_one_worker_until_it_is_a_quarter_batch_busier) {
  GenerationService s(WorkerPools{.workers = 3, .pages_per_worker = 8, .bytes_per_page = 1},
                      {.max_batch = 8, .max_queued_requests = 64, .route_by_first_tokens = 4});
  // max_batch 8: the named worker takes requests while it holds fewer than 2 more than the least loaded.
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(s.submit(req({1, 2, 3, 4, 5 + i})).ok());
  std::vector<int64_t> l = loads(s, 3);
  const int named = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
  EXPECT_EQ(l[named], 2);
  ASSERT_TRUE(s.submit(req({1, 2, 3, 4, 9})).ok());  // 2 more than the least loaded (0): to the least loaded
  l = loads(s, 3);
  EXPECT_EQ(l[named], 2);
  // A prompt of no more than the first tokens, or other first tokens: the least loaded.
  ASSERT_TRUE(s.submit(req({1, 2, 3, 4})).ok());
  l = loads(s, 3);
  EXPECT_EQ(l[0] + l[1] + l[2], 4);
  EXPECT_EQ(*std::max_element(l.begin(), l.end()), 2);
}

TEST(ServeRouting, a_small_batch_keeps_a_chat_on_its_worker_while_that_one_has_a_free_slot) {
  // max_batch 2 (a quarter batch rounds to 0; the slack is 2): two chats naming the same worker both go there while
  // it has room, so that each one's next turn finds its pages whichever chat is running; a third request, with the
  // named worker full and another free, goes to the least loaded.
  GenerationService s(WorkerPools{.workers = 2, .pages_per_worker = 8, .bytes_per_page = 1},
                      {.max_batch = 2, .max_queued_requests = 64, .route_by_first_tokens = 4});
  ASSERT_TRUE(s.submit(req({7, 7, 7, 7, 1})).ok());
  std::vector<int64_t> l = loads(s, 2);
  const int named = l[0] == 1 ? 0 : 1;
  ASSERT_TRUE(s.submit(req({7, 7, 7, 7, 2})).ok());
  l = loads(s, 2);
  EXPECT_EQ(l[named], 2);
  EXPECT_EQ(l[1 - named], 0);
  ASSERT_TRUE(s.submit(req({7, 7, 7, 7, 3})).ok());
  l = loads(s, 2);
  EXPECT_EQ(l[named], 2);
  EXPECT_EQ(l[1 - named], 1);
}

TEST(ServeRouting, every_worker_full_keeps_the_request_on_its_named_worker) {
  GenerationService s(WorkerPools{.workers = 2, .pages_per_worker = 8, .bytes_per_page = 1},
                      {.max_batch = 1, .max_queued_requests = 64, .route_by_first_tokens = 4});
  ASSERT_TRUE(s.submit(req({5, 5, 5, 5, 1})).ok());
  std::vector<int64_t> l = loads(s, 2);
  const int named = l[0] == 1 ? 0 : 1;
  ASSERT_TRUE(s.submit(req({5, 5, 5, 5, 2})).ok());  // named full, the other free: there
  l = loads(s, 2);
  EXPECT_EQ(l[1 - named], 1);
  ASSERT_TRUE(s.submit(req({5, 5, 5, 5, 3})).ok());  // both full: back to its cache (queued there)
  l = loads(s, 2);
  EXPECT_EQ(l[named], 2);
  EXPECT_EQ(l[1 - named], 1);
}

}  // namespace
}  // namespace genbridge::serve
