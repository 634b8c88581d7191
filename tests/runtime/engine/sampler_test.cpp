#include "runtime/engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace genbridge::engine {
namespace {

std::vector<int32_t> scratch(size_t n) { return std::vector<int32_t>(n); }

TEST(Sampler, greedy_is_argmax_with_ties_to_lowest_id) {
  std::vector<float> l{0.1f, 3.f, -1.f, 3.f};
  auto s = scratch(4);
  EXPECT_EQ(*sample_token(l, {}, 0, s), 1);
}

TEST(Sampler, top_k_one_equals_greedy_at_any_temperature) {
  std::vector<float> l{0.5f, 0.2f, 2.5f, 2.4f, -3.f};
  auto s = scratch(5);
  for (uint64_t step = 0; step < 50; ++step) {
    EXPECT_EQ(*sample_token(l, {.temperature = 5.f, .top_k = 1, .seed = 9}, step, s), 2);
  }
}

TEST(Sampler, same_seed_and_step_same_token_and_seeds_differ) {
  std::vector<float> l(64);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i));
  auto s = scratch(64);
  const SamplingParams p{.temperature = 1.f, .seed = 1234};
  int differ = 0;
  for (uint64_t step = 0; step < 100; ++step) {
    EXPECT_EQ(*sample_token(l, p, step, s), *sample_token(l, p, step, s));
    SamplingParams q = p;
    q.seed = 99;
    differ += *sample_token(l, p, step, s) != *sample_token(l, q, step, s);
  }
  EXPECT_GT(differ, 10);
}

TEST(Sampler, frequencies_follow_the_softmax) {
  std::vector<float> l{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  auto s = scratch(3);
  std::vector<int> count(3);
  const int n = 20000;
  for (int step = 0; step < n; ++step) ++count[*sample_token(l, {.temperature = 1.f, .seed = 5}, step, s)];
  EXPECT_NEAR(count[0] / double(n), 0.5, 0.02);
  EXPECT_NEAR(count[1] / double(n), 0.3, 0.02);
  EXPECT_NEAR(count[2] / double(n), 0.2, 0.02);
}

TEST(Sampler, top_p_drops_the_tail) {
  std::vector<float> l{std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  auto s = scratch(3);
  for (int step = 0; step < 2000; ++step) {
    EXPECT_NE(*sample_token(l, {.temperature = 1.f, .top_p = 0.85f, .seed = 3}, step, s), 2);
  }
}

TEST(Sampler, invalid_parameters) {
  const std::string t = "0 or a number in [1.1754944e-38, 3.4028235e+38]", p = "a number in [1.1754944e-38, 1]";
  EXPECT_EQ(validate({.temperature = -1.f}).message(), "sampling: temperature is -1 but must be " + t);
  EXPECT_EQ(validate({.top_k = -2}).message(), "sampling: top_k is -2 but must be in [0, 2147483647]");
  EXPECT_EQ(validate({.top_p = 0.f}).message(), "sampling: top_p is 0 but must be " + p);
  EXPECT_EQ(validate({.top_p = 1.5f}).message(), "sampling: top_p is 1.5 but must be " + p);
  EXPECT_TRUE(validate({.temperature = 0.7f, .top_k = 40, .top_p = 0.9f}).ok());
}

// The ends of each range: infinity, NaN, subnormals (a temperature whose reciprocal overflows in float, a
// top_p that is nearly 0) and -0 are refused or accepted as the range says, on floats and on doubles.
TEST(Sampler, parameter_ranges_at_their_extremes) {
  constexpr float kMin = std::numeric_limits<float>::min(), kMax = std::numeric_limits<float>::max();
  constexpr float kSub = std::numeric_limits<float>::denorm_min();
  for (float t : {0.f, -0.f, kMin, 1.f, 2.f, kMax}) EXPECT_TRUE(validate({.temperature = t}).ok()) << t;
  for (float t : {kSub, kMin / 2, -kMin, INFINITY, -INFINITY, NAN}) {
    EXPECT_EQ(validate({.temperature = t}).code(), StatusCode::kInvalidArgument) << t;
  }
  for (float q : {kMin, 1e-30f, 0.5f, 1.f}) EXPECT_TRUE(validate({.top_p = q}).ok()) << q;
  for (float q : {0.f, -0.f, kSub, std::nextafter(1.f, 2.f), INFINITY, NAN}) {
    EXPECT_EQ(validate({.top_p = q}).code(), StatusCode::kInvalidArgument) << q;
  }
  EXPECT_TRUE(validate({.top_k = kMaxTopK}).ok());
  // Doubles as the parsers read them: checked on the float they become.
  EXPECT_TRUE(kTemperatureRange.contains(3.4028235e38));  // FLT_MAX as printed rounds to FLT_MAX
  EXPECT_FALSE(kTemperatureRange.contains(3.5e38));       // would become +inf
  EXPECT_FALSE(kTemperatureRange.contains(1e300));
  EXPECT_FALSE(kTemperatureRange.contains(1e-300));  // would become 0: greedy, silently
  EXPECT_FALSE(kTemperatureRange.contains(1e-40));   // a subnormal float
  EXPECT_TRUE(kTemperatureRange.contains(-0.0));
  EXPECT_TRUE(kTemperatureRange.contains(1.1754944e-38));  // FLT_MIN as printed
  EXPECT_FALSE(kTopPRange.contains(1e-46));                // would become 0
  EXPECT_FALSE(kTopPRange.contains(1e-300));
  EXPECT_FALSE(kTopPRange.contains(-0.0));
  EXPECT_FALSE(kTopPRange.contains(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_TRUE(kTopPRange.contains(1.0));
  EXPECT_FALSE(kTopPRange.contains(1.5));
  EXPECT_FALSE(kTemperatureRange.with_hi(2.f).contains(2.5));
  EXPECT_EQ(kTemperatureRange.with_hi(2.f).rule(), "0 or a number in [1.1754944e-38, 2]");
  // The sampler runs at both ends of the temperature range (no overflow in the logits' scale).
  std::vector<float> l{1.f, 3.f, 2.f};
  auto s = scratch(3);
  EXPECT_EQ(*sample_token(l, {.temperature = kMin, .seed = 1}, 0, s), 1);
  for (int step = 0; step < 8; ++step) EXPECT_TRUE(sample_token(l, {.temperature = kMax, .seed = 1}, step, s).ok());
  EXPECT_EQ(*sample_token(l, {.temperature = 1.f, .top_p = kMin, .seed = 1}, 0, s), 1);
}

TEST(Sampler, nan_and_positive_inf_logits_are_an_error_not_a_token) {
  auto s = scratch(3);
  for (const SamplingParams& p : {SamplingParams{}, SamplingParams{.temperature = 0.7f, .top_k = 2}}) {
    std::vector<float> l{1.f, NAN, 0.f};
    Result<int32_t> r = sample_token(l, p, 0, s);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), "sampling: logits[1] is nan; every logit must be finite or -inf (masked)");
    l = {1.f, 2.f, INFINITY};  // greedy would pick the +inf and sampling would divide inf by inf
    EXPECT_EQ(sample_token(l, p, 0, s).status().message(),
              "sampling: logits[2] is inf; every logit must be finite or -inf (masked)");
    l = {-INFINITY, 2.f, 1.f};  // -inf is a masked token (logits processing): never drawn
    EXPECT_EQ(*sample_token(l, p, 0, s), 1);
  }
}

// The oracle: log-softmax in long double summed from the smallest term up (another order than the
// sampler's), the top k by a stable sort of every id.
void expect_logprobs_match(const std::vector<float>& l, int32_t sampled, int k) {
  std::vector<long double> terms;
  const long double m = *std::max_element(l.begin(), l.end());
  for (float x : l) terms.push_back(std::exp(static_cast<long double>(x) - m));
  std::sort(terms.begin(), terms.end());
  long double sum = 0;
  for (long double t : terms) sum += t;
  const long double lse = m + std::log(sum);
  std::vector<int32_t> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  TokenLogprobs got;
  got.top.assign(3, TokenLogprob{99, 1.0});  // stale entries must go
  token_logprobs(l, sampled, k, &got);
  EXPECT_EQ(got.sampled.token, sampled);
  EXPECT_NEAR(got.sampled.logprob, static_cast<double>(l[sampled] - lse), 1e-12);
  ASSERT_EQ(got.top.size(), std::min<size_t>(static_cast<size_t>(k), l.size()));
  for (size_t i = 0; i < got.top.size(); ++i) {
    EXPECT_EQ(got.top[i].token, ids[i]) << "rank " << i;
    EXPECT_NEAR(got.top[i].logprob, static_cast<double>(l[ids[i]] - lse), 1e-12) << "rank " << i;
  }
}

TEST(Logprobs, log_softmax_in_fp64_top_k_sorted_ties_to_the_lower_id) {
  // Ties (3.0 three times, -1 twice) across the cut, a large offset (exp would overflow without the max).
  std::vector<float> l{0.5f, 3.f, -1.f, 3.f, 2.f, -1.f, 3.f, 1000.f, 0.f};
  for (int k : {0, 1, 2, 3, 4, 5, 9, 20}) expect_logprobs_match(l, 2, k);
  std::vector<float> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 8.0);
  big[500] = big[17];  // a tie inside the top
  for (int k : {1, 7, 20}) expect_logprobs_match(big, 999, k);
}

TEST(Logprobs, probabilities_sum_to_one_and_a_uniform_row_gives_log_one_over_n) {
  std::vector<float> l(64, 0.25f);
  TokenLogprobs lp;
  token_logprobs(l, 5, 3, &lp);
  EXPECT_NEAR(lp.sampled.logprob, -std::log(64.0), 1e-14);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token, 0);
  EXPECT_EQ(lp.top[2].token, 2);
  std::vector<float> r{1.f, 2.f, 3.f};
  double total = 0;
  for (int32_t t = 0; t < 3; ++t) {
    token_logprobs(r, t, 0, &lp);
    total += std::exp(lp.sampled.logprob);
  }
  EXPECT_NEAR(total, 1.0, 1e-15);
}

}  // namespace
}  // namespace genbridge::engine

namespace genbridge::engine {
namespace {

// min_p keeps the tokens at least min_p times as likely as the likeliest (after temperature).
TEST(Sampler, min_p_drops_tokens_below_the_ratio) {
  std::vector<float> l{std::log(0.5f), std::log(0.3f), std::log(0.2f), std::log(0.04f)};
  auto s = scratch(4);
  std::vector<int> count(4);
  for (int step = 0; step < 4000; ++step) {
    ++count[*sample_token(l, {.temperature = 1.f, .seed = 8, .min_p = 0.5f}, step, s)];
  }
  EXPECT_EQ(count[2] + count[3], 0) << "0.2 and 0.04 are below 0.5 x 0.5";
  EXPECT_NEAR(count[0] / 4000.0, 0.5 / 0.8, 0.03);
  // At temperature 0.5 the ratios square: 0.3/0.5 = 0.6 becomes 0.36 < 0.5, so only the likeliest remains.
  for (int step = 0; step < 200; ++step) {
    EXPECT_EQ(*sample_token(l, {.temperature = 0.5f, .seed = 8, .min_p = 0.5f}, step, s), 0);
  }
}

// min_p's cut is made before the sort: a cut that keeps every token draws exactly what no cut draws, and a cut
// with top_k / top_p draws from the same order.
TEST(Sampler, min_p_that_keeps_every_token_changes_no_draw) {
  std::vector<float> l(3000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i)) * 3.0);
  auto s = scratch(l.size());
  for (uint64_t step = 0; step < 300; ++step) {
    const SamplingParams none{.temperature = 0.9f, .top_k = 40, .top_p = 0.9f, .seed = 4};
    SamplingParams all = none;
    all.min_p = 1e-6f;  // e^-6 / e^3 = 1.2e-4 > 1e-6: every token is kept
    EXPECT_EQ(*sample_token(l, none, step, s), *sample_token(l, all, step, s)) << step;
  }
}

TEST(Sampler, masked_tokens_are_never_drawn_and_all_masked_is_an_error) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> l{-inf, 0.f, -inf, 0.f};
  auto s = scratch(4);
  for (int step = 0; step < 500; ++step) {
    const int32_t t = *sample_token(l, {.temperature = 1.5f, .seed = 2}, step, s);
    EXPECT_TRUE(t == 1 || t == 3);
  }
  EXPECT_EQ(*sample_token(l, {}, 0, s), 1);
  std::vector<float> all(3, -inf);
  EXPECT_EQ(sample_token(all, {}, 0, s).status().message(), "sampling: every token is masked (every logit is -inf)");
  std::vector<float> pos{0.f, inf};
  EXPECT_EQ(sample_token(pos, {}, 0, s).status().message(),
            "sampling: logits[1] is inf; every logit must be finite or -inf (masked)");
}

TEST(Sampler, validate_names_each_sampling_control_and_its_range) {
  const auto msg = [](SamplingParams p) { return validate(p).message(); };
  SamplingParams p;
  p.min_p = 1.5f;
  EXPECT_EQ(msg(p), "sampling: min_p is 1.5 but must be a number in [0, 1]");
  p = {};
  p.presence_penalty = -2.5f;
  EXPECT_EQ(msg(p), "sampling: presence_penalty is -2.5 but must be a number in [-2, 2]");
  p = {};
  p.repetition_penalty = 0.f;
  EXPECT_EQ(msg(p), "sampling: repetition_penalty is 0 but must be a number in [1.1754944e-38, 3.4028235e+38]");
  p = {};
  p.logit_bias = {{3, 101.f}};
  EXPECT_EQ(msg(p), "sampling: logit_bias of token 3 is 101 but must be a number in [-100, 100]");
  p = {};
  p.min_tokens = -1;
  EXPECT_EQ(msg(p), "sampling: min_tokens is -1 but must be >= 0");
}

}  // namespace
}  // namespace genbridge::engine

namespace genbridge::engine {
namespace {

// The draw as the sampler defines it, written plainly: every unmasked token in play, sorted in full by
// (logit descending, id ascending), fp64 softmax sums in that order, then min_p, top-k, top-p and the inverse
// CDF. The sampler leaves negligible tokens out and sorts by radix; its draws must equal these.
int32_t naive_draw(const std::vector<float>& l, const SamplingParams& p, uint64_t step) {
  std::vector<int32_t> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  const double inv_t = 1.0 / p.temperature, top = static_cast<double>(l[ids[0]]) * inv_t;
  const double min_log = p.min_p > 0.f ? std::log(static_cast<double>(p.min_p)) : -HUGE_VAL;
  size_t k = p.top_k > 0 ? std::min<size_t>(p.top_k, ids.size()) : ids.size();
  for (size_t i = 0; i < k; ++i) {
    const double x = static_cast<double>(l[ids[i]]) * inv_t - top;
    if (!(x >= min_log) || std::isinf(x)) {
      k = i;
      break;
    }
  }
  double total = 0;
  for (size_t i = 0; i < k; ++i) total += std::exp(static_cast<double>(l[ids[i]]) * inv_t - top);
  size_t keep = k;
  double mass = total;
  if (p.top_p < 1.f) {
    double cum = 0;
    for (size_t i = 0; i < k; ++i) {
      cum += std::exp(static_cast<double>(l[ids[i]]) * inv_t - top);
      if (cum / total >= static_cast<double>(p.top_p)) {
        keep = i + 1;
        mass = cum;
        break;
      }
    }
  }
  const double u = uniform_from(p.seed, step) * mass;
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += std::exp(static_cast<double>(l[ids[i]]) * inv_t - top);
    if (u < cum) return ids[i];
  }
  return ids[keep - 1];
}

TEST(Sampler, draws_over_a_large_vocabulary_equal_the_plain_full_sort) {
  // 151,936 logits: a peaked head, a long tail far below it (left out by the sampler), runs of equal values
  // (ties to the lower id), -0 beside +0 and masked tokens.
  const size_t vocab = 151936;
  std::vector<float> l(vocab);
  uint64_t r = 7;
  auto next = [&] {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(r >> 11) * 0x1.0p-53;
  };
  for (size_t i = 0; i < vocab; ++i) l[i] = static_cast<float>(next() * 12.0 - 6.0);
  for (size_t i = 0; i < 64; ++i) l[(i * 2371) % vocab] = 28.f + static_cast<float>(i % 8) * 0.25f;  // ties
  for (size_t i = 0; i < 100; ++i) l[(i * 977 + 5) % vocab] = -std::numeric_limits<float>::infinity();
  l[11] = -0.f;
  l[12] = 0.f;
  auto s = scratch(vocab);
  const std::vector<SamplingParams> params{
      {.temperature = 0.5f, .seed = 2},  // the tail is more than 40 below the head: left out
      {.temperature = 1.f, .seed = 3},
      {.temperature = 8.f, .seed = 4},  // the tail stays in play: the radix sort of most of the vocabulary
      {.temperature = 30.f, .top_p = 0.9f, .seed = 5},
      {.temperature = 20.f, .top_k = 5000, .seed = 6},
      {.temperature = 0.7f, .top_k = 40, .top_p = 0.95f, .seed = 7},
      {.temperature = 12.f, .seed = 8, .min_p = 0.001f},
  };
  for (const SamplingParams& p : params) {
    for (uint64_t step = 0; step < 24; ++step) {
      ASSERT_EQ(*sample_token(l, p, step, s), naive_draw(l, p, step))
          << "temperature " << p.temperature << " step " << step;
    }
  }
  // Every logit equal: the order is the ids', and the draw is uniform over them.
  std::vector<float> flat(vocab, 0.5f);
  flat[3] = -0.f;
  for (uint64_t step = 0; step < 8; ++step) {
    const SamplingParams p{.temperature = 1.f, .seed = 11};
    ASSERT_EQ(*sample_token(flat, p, step, s), naive_draw(flat, p, step));
  }
}

}  // namespace
}  // namespace genbridge::engine
