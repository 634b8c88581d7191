#include "runtime/engine/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "genbridge/ops/linear_attention/gated_delta_rule.h"

namespace genbridge::engine {
namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Non-finite entries of a logits row: how many, and the first one. Exponent bits all ones = Inf or NaN; an
// integer test on the bits so that the scan vectorizes (it runs once per request per step).
struct NonFinite {
  int64_t count = 0;
  int64_t first = -1;
};
NonFinite find_non_finite(const float* x, int64_t n) {
  NonFinite r;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    r.count += (bits & 0x7f800000u) == 0x7f800000u;
  }
  if (r.count > 0) {
    for (r.first = 0; std::isfinite(x[r.first]); ++r.first) {
    }
  }
  return r;
}
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kRefused:
      return "refused";
    case FinishReason::kError:
      return "error";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

const char* scheduling_policy_name(SchedulingPolicy p) { return p == SchedulingPolicy::kFcfs ? "fcfs" : "priority"; }

const char* preemption_name(Preemption p) { return p == Preemption::kOff ? "off" : "recompute"; }

struct Engine::Active {
  size_t result_index = 0;  // in results_ (not streaming)
  RequestResult result;     // moved to results_ or the listener when the request ends
  Request request;
  double submit_time = 0;
  uint64_t arrival = 0;          // submission order
  int64_t kv_tokens_needed = 0;  // prompt + generated tokens that are fed back
  int64_t fed = 0;               // tokens in the KV cache: the prompt's, then the generated ones fed back
  int64_t choices_from = 0;      // record_choices: the positions before it were recorded before a preemption
  double last_token_time = 0;
  bool done = false;
  LogitsProcessor processor;  // the request's logits processing (penalties, logit_bias, ...)

  int64_t prompt_size() const { return static_cast<int64_t>(request.prompt.size()); }
  // The prompt and the generated tokens.
  int64_t known() const { return prompt_size() + static_cast<int64_t>(result.tokens.size()); }
  // Known tokens not in the KV cache yet: the prompt's rest while it is prefilled, 1 (the last drawn) while the
  // request decodes, all of them after a preemption. A forward that feeds them all draws the next token.
  int64_t pending() const { return known() - fed; }
  // Feeds its last drawn token next (a prompt's last token is a prefill's).
  bool decoding() const { return !result.tokens.empty() && pending() == 1; }
  int32_t token_at(int64_t i) const {
    return i < prompt_size() ? request.prompt[static_cast<size_t>(i)]
                             : result.tokens[static_cast<size_t>(i - prompt_size())];
  }
};

Engine::Engine(ForwardExecutor& executor, runtime::KvPagePool& pool, const EngineOptions& options)
    : executor_(executor), pool_(pool), options_(options) {
  options_.max_batch = std::max<int64_t>(1, options_.max_batch);
  options_.max_prefill_tokens = std::max<int64_t>(1, options_.max_prefill_tokens);
  // Gated DeltaNet layers (Qwen3.5) prefill in 64-token chunks from each call's first token, and a 1-token call
  // runs the per-token form: a prompt's bits depend on where calls split it unless every split falls on a
  // multiple of 64 and no piece but a whole 1-token prompt is a single token.
  for (int64_t l = 0; l < executor_.config().num_hidden_layers; ++l) {
    if (executor_.config().is_linear_layer(l)) split_granule_ = ops::kGatedDeltaRuleChunk;
  }
  // A prompt being prefilled then always gets a chunk: with at most max_batch - 1 decodes beside it the budget
  // holds 2 granules, enough for any rest that may not be split (65 tokens) or a whole granule.
  if (options_.max_num_batched_tokens > 0) {
    options_.max_num_batched_tokens =
        std::max(options_.max_num_batched_tokens, options_.max_batch + (split_granule_ > 1 ? 2 * split_granule_ - 1 : 0));
  }
  const int64_t vocab = executor_.config().vocab_size;
  logits_.resize(static_cast<size_t>(options_.max_batch * vocab));
  scratch_.resize(static_cast<size_t>(vocab));
  processed_.resize(static_cast<size_t>(vocab));
  masked_.resize(static_cast<size_t>(vocab));
  allowed_.resize(static_cast<size_t>((vocab + 31) / 32));
  metrics_.kv_bytes_per_token = pool_.geometry().bytes_per_token();
  prefix_caching_ = options_.prefix_caching && !pool_.has_state() && !options_.record_choices;
  if (prefix_caching_ && !pool_.prefix_cache_enabled()) pool_.enable_prefix_cache(1);
  if (options_.record_choices) {
    choice_sink_ = [this](const model::TokenChoices& c) {
      Active& a = *current_[static_cast<size_t>(c.seq_index)];
      if (c.position < a.choices_from) return;  // fed again after a preemption: recorded the first time
      RequestResult& r = a.result;
      RequestChoices& rc = r.choices;
      rc.records.push_back({.step = static_cast<int32_t>(r.tokens.size()),
                            .position = static_cast<int32_t>(c.position),
                            .layer = static_cast<int32_t>(c.layer),
                            .num_experts = static_cast<int32_t>(c.expert_ids.size()),
                            .num_index = static_cast<int32_t>(c.index_positions.size())});
      rc.expert_ids.insert(rc.expert_ids.end(), c.expert_ids.begin(), c.expert_ids.end());
      rc.expert_weights.insert(rc.expert_weights.end(), c.expert_weights.begin(), c.expert_weights.end());
      rc.index_positions.insert(rc.index_positions.end(), c.index_positions.begin(), c.index_positions.end());
    };
    executor_.set_choice_sink(&choice_sink_);
  }
}

Engine::~Engine() {
  if (options_.record_choices) executor_.set_choice_sink(nullptr);
}

Status Engine::submit(Request r) {
  const int64_t vocab = executor_.config().vocab_size;
  if (r.prompt.empty()) return invalid_argument(fmt::format("request {}: the prompt is empty", r.id));
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= vocab) {
      return invalid_argument(
          fmt::format("request {}: prompt token {} is outside the vocabulary [0, {})", r.id, t, vocab));
    }
  }
  if (r.max_new_tokens < 1) {
    return invalid_argument(fmt::format("request {}: max_new_tokens is {} but must be >= 1", r.id, r.max_new_tokens));
  }
  const int64_t max_pos = executor_.config().max_position_embeddings;
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  if (total > max_pos) {
    return invalid_argument(
        fmt::format("request {}: prompt ({}) + max_new_tokens ({}) = {} exceeds the model's "
                    "max_position_embeddings ({})",
                    r.id, r.prompt.size(), r.max_new_tokens, total, max_pos));
  }
  if (r.logprobs < -1 || r.logprobs > kMaxLogprobs) {
    return invalid_argument(
        fmt::format("request {}: logprobs is {} but must be -1 (none) or 0..{}", r.id, r.logprobs, kMaxLogprobs));
  }
  if (Status s = validate(r.sampling); !s.ok())
    return Status(s.code(), fmt::format("request {}: {}", r.id, s.message()));
  // Token ids of the sampling options and the forced tokens: within the vocabulary.
  const auto check_ids = [&](const char* what, const auto& ids, auto id_of) -> Status {
    for (const auto& e : ids) {
      if (const int32_t t = id_of(e); t < 0 || t >= vocab) {
        return invalid_argument(
            fmt::format("request {}: {} token {} is outside the vocabulary [0, {})", r.id, what, t, vocab));
      }
    }
    return ok_status();
  };
  const auto same = [](int32_t t) { return t; };
  GB_RETURN_IF_ERROR(check_ids("logit_bias", r.sampling.logit_bias, [](const auto& e) { return e.first; }));
  GB_RETURN_IF_ERROR(check_ids("allowed_token_ids", r.sampling.allowed_token_ids, same));
  GB_RETURN_IF_ERROR(check_ids("forced", r.forced, same));
  if (static_cast<int64_t>(r.forced.size()) > r.max_new_tokens) {
    return invalid_argument(
        fmt::format("request {}: {} forced tokens but max_new_tokens is {}", r.id, r.forced.size(), r.max_new_tokens));
  }
  if (r.priority != 0 && options_.policy == SchedulingPolicy::kFcfs) {
    return invalid_argument(fmt::format(
        "request {}: priority is {} but requests start in arrival order (scheduling policy fcfs)", r.id, r.priority));
  }
  if (!ids_.insert(r.id).second) return invalid_argument(fmt::format("request {}: the id is already in use", r.id));
  auto a = std::make_unique<Active>();
  a->result.id = r.id;
  a->arrival = next_arrival_++;
  a->submit_time = now_seconds();
  if (!streaming_) {
    a->result_index = results_.size();
    results_.push_back(RequestResult{.id = r.id});
  }
  a->kv_tokens_needed = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens - 1;
  {
    std::vector<int32_t> prompt = r.prompt;  // forced tokens count as prompt for the processing
    prompt.insert(prompt.end(), r.forced.begin(), r.forced.end());
    a->processor = LogitsProcessor(r.sampling, prompt, r.stop_tokens);
  }
  a->request = std::move(r);
  // After every waiting request of the same or a lower priority value (fcfs: every value is 0).
  const int32_t priority = a->request.priority;
  const auto at = std::upper_bound(waiting_.begin(), waiting_.end(), priority,
                                   [](int32_t p, const std::unique_ptr<Active>& w) { return p < w->request.priority; });
  waiting_.insert(at, std::move(a));
  return ok_status();
}

void Engine::set_listener(EngineListener listener) {
  listener_ = std::move(listener);
  streaming_ = true;
}

void Engine::deliver(Active& a) {
  if (!streaming_) {
    results_[a.result_index] = std::move(a.result);
    return;
  }
  ids_.erase(a.request.id);
  if (listener_.on_finish) listener_.on_finish(std::move(a.result));
}

void Engine::finish(Active& a, FinishReason reason) {
  a.done = true;
  a.result.reason = reason;
  ++metrics_.requests_finished;
  if (pool_.contains(a.request.id)) pool_.release(a.request.id).ignore();
  deliver(a);
}

bool Engine::cancel(int64_t id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->request.id == id) {
      std::unique_ptr<Active> a = std::move(*it);
      waiting_.erase(it);
      ++metrics_.requests_cancelled;
      finish(*a, FinishReason::kCancelled);
      return true;
    }
  }
  for (auto& a : running_) {
    if (a->request.id == id && !a->done) {
      ++metrics_.requests_cancelled;
      finish(*a, FinishReason::kCancelled);
      std::erase_if(running_, [](const std::unique_ptr<Active>& r) { return r->done; });
      return true;
    }
  }
  return false;
}

void Engine::fail(Active& a, const std::string& what) {
  // The request cannot continue (no token can be drawn from this forward's results); the others can.
  a.result.message = fmt::format(
      "request {}, step {}: {}; the request was ended. The forward pass overflowed or the model's weights are not "
      "finite (genbridge run --check-weights scans them)",
      a.request.id, a.result.tokens.size(), what);
  ++metrics_.requests_failed;
  finish(a, FinishReason::kError);
}

Status Engine::take_results(std::span<Active* const> batch, const std::vector<bool>* sample) {
  const int64_t vocab = executor_.config().vocab_size;
  const std::span<const model::ActivationFault> faults = executor_.faults();
  for (size_t s = 0; s < batch.size(); ++s) {
    if (s < faults.size() && faults[s].found()) {
      fail(*batch[s], model::describe(faults[s]));
      continue;
    }
    if (sample && !(*sample)[s]) continue;
    GB_RETURN_IF_ERROR(sample_into(*batch[s], logits_.data() + s * vocab));
  }
  return ok_status();
}

Status Engine::sample_into(Active& a, const float* logits) {
  RequestResult& res = a.result;
  const int64_t vocab = executor_.config().vocab_size;
  const uint64_t step = res.tokens.size();
  if (const NonFinite bad = find_non_finite(logits, vocab); bad.count > 0) {
    fail(a, fmt::format("the logits contain {} non-finite value{} of {} (first: token {} = {})", bad.count,
                        bad.count == 1 ? "" : "s", vocab, bad.first, logits[bad.first]));
    return ok_status();
  }
  // A forced token (teacher forcing), or a draw from the logits after the request's processing and under its
  // constraint (engine.h, Request::constraint).
  const uint64_t num_forced = a.request.forced.size();
  const bool forced = step < num_forced;
  int32_t tok = 0;
  if (forced) {
    tok = a.request.forced[step];
  } else {
    TokenConstraint* c = a.request.constraint.get();
    if (c) {
      // The tokens left to draw, this one included (forced tokens are not the constraint's).
      const int64_t remaining = a.request.max_new_tokens - static_cast<int64_t>(step);
      Result<int64_t> n = c->allowed_tokens(allowed_, remaining);
      if (!n.ok() || *n == 0) {
        if (!n.ok())
          a.result.message = fmt::format("request {}, step {}: {}", a.request.id, step, n.status().message());
        finish(a, n.ok() ? FinishReason::kStop : FinishReason::kError);
        return ok_status();
      }
    }
    std::span<const float> row(logits, vocab);
    if (a.processor.active()) {
      std::copy(logits, logits + vocab, processed_.begin());
      a.processor.apply(processed_);
      row = processed_;
    }
    if (c) {
      // Logprobs below stay those of the model's own distribution.
      if (a.processor.active() && !any_allowed_drawable(row, allowed_)) row = std::span<const float>(logits, vocab);
      apply_token_mask(row, allowed_, masked_);
      row = masked_;
    }
    GB_ASSIGN_OR_RETURN(tok, sample_token(row, a.request.sampling, step - num_forced, scratch_));
    a.processor.observe(tok);
    if (c) {
      if (Status s = c->accept(tok); !s.ok()) {
        a.result.message = fmt::format("request {}, step {}: {}", a.request.id, step, s.message());
        finish(a, FinishReason::kError);
        return ok_status();
      }
    }
  }
  const double t = now_seconds();
  if (step == 0) {
    metrics_.ttft_seconds.push_back(t - (streaming_ ? a.submit_time : start_time_));
  } else {
    metrics_.tpot_seconds.push_back(t - a.last_token_time);
  }
  a.last_token_time = t;
  res.tokens.push_back(tok);
  ++generated_;
  if (options_.record_logits) res.logits.insert(res.logits.end(), logits, logits + vocab);
  const TokenLogprobs* lp = nullptr;
  if (a.request.logprobs >= 0) {  // only requests that asked pay for the log-sum-exp
    res.logprobs.emplace_back();
    token_logprobs(std::span<const float>(logits, vocab), tok, a.request.logprobs, &res.logprobs.back());
    lp = &res.logprobs.back();
  }
  if (listener_.on_token) listener_.on_token(a.request.id, tok, lp);
  const auto& stops = a.request.stop_tokens;
  if (!forced && std::find(stops.begin(), stops.end(), tok) != stops.end()) {
    finish(a, FinishReason::kStop);
  } else if (static_cast<int64_t>(res.tokens.size()) >= a.request.max_new_tokens) {
    finish(a, FinishReason::kLength);
  }
  return ok_status();
}

int64_t Engine::piece_size(const Active& a, int64_t budget) const {
  const int64_t pending = a.pending();
  if (split_granule_ == 1) return std::min(pending, budget);
  // Gated DeltaNet: the prompt in multiples of the granule, never leaving a 1-token piece (a whole 1-token prompt
  // excepted); the generated tokens (fed again after a preemption) one per forward, as they were first fed.
  if (a.fed >= a.prompt_size()) return std::min<int64_t>(1, budget);
  const int64_t rest = a.prompt_size() - a.fed;
  int64_t n = std::min(rest, budget);
  if (n < rest) {
    n = n / split_granule_ * split_granule_;
    if (rest - n == 1) n -= split_granule_;
  }
  return n;
}

void Engine::append_pending(Active& a, int64_t n, std::vector<int32_t>& tokens) {
  for (int64_t i = a.fed; i < a.fed + n; ++i) tokens.push_back(a.token_at(i));
  a.fed += n;
}

bool Engine::runs_before(const Active& x, const Active& y) const {
  if (options_.policy == SchedulingPolicy::kPriority && x.request.priority != y.request.priority) {
    return x.request.priority < y.request.priority;
  }
  return x.arrival < y.arrival;
}

void Engine::cache_pages(std::span<Active* const> batch) {
  if (!prefix_caching_) return;
  for (Active* a : batch) pool_.cache_full_pages(a->request.id, [a](int64_t i) { return a->token_at(i); });
  metrics_.prefix_cache_evictions = pool_.evictions();
  metrics_.prefix_cache_pages = pool_.cached_pages();
}

std::vector<std::unique_ptr<Engine::Active>>::reverse_iterator Engine::newest_running() {
  return std::find_if(running_.rbegin(), running_.rend(), [](const std::unique_ptr<Active>& r) { return !r->done; });
}

void Engine::preempt_newest() {
  const auto it = newest_running();
  if (it == running_.rend()) return;
  Active& v = **it;
  pool_.release(v.request.id).ignore();
  ++metrics_.preemptions;
  metrics_.recomputed_tokens += v.fed;
  v.choices_from = std::max(v.choices_from, v.fed);
  v.fed = 0;
  std::unique_ptr<Active> owned = std::move(*it);
  running_.erase(std::next(it).base());
  waiting_.insert(waiting_.begin(), std::move(owned));  // resumed before new requests
}

bool Engine::make_room(Active& a, int64_t n) {
  if (options_.preemption == Preemption::kOff) return true;  // the reservation holds every token
  while (pool_.growth_room(a.request.id) < n) {
    const auto newest = newest_running();
    const bool self = newest != running_.rend() && newest->get() == &a;
    preempt_newest();
    if (self) return false;
  }
  return true;
}

Result<Engine::Piece> Engine::admit_front(int64_t budget) {
  Active& a = *waiting_.front();
  const bool reserve = options_.preemption == Preemption::kOff;
  const int64_t reserve_tokens = reserve ? a.kv_tokens_needed : 0;
  std::vector<int32_t> hit;  // cached pages of its longest prefix, leaving its last token to feed
  if (prefix_caching_) {
    // Its known tokens: the prompt, joined with the generated ones only for a request resumed after a preemption.
    std::span<const int32_t> tokens = a.request.prompt;
    std::vector<int32_t> joined;
    if (!a.result.tokens.empty()) {
      joined = a.request.prompt;
      joined.insert(joined.end(), a.result.tokens.begin(), a.result.tokens.end());
      tokens = joined;
    }
    hit = pool_.lookup_prefix(tokens, (a.known() - 1) / pool_.geometry().page_size);
  }
  if (!pool_.can_admit(a.known(), reserve_tokens, hit)) return Piece{&a, 0};
  if (!reserve) {
    // Leaves a page for every running request whose next token starts a page, so that admitting does not make
    // this step preempt what it just admitted.
    int64_t at_page_end = 0;
    for (const auto& r : running_) {
      if (!r->done && pool_.capacity(r->request.id) == pool_.length(r->request.id)) ++at_page_end;
    }
    if (pool_.pages_for(a.known()) - static_cast<int64_t>(hit.size()) + at_page_end > pool_.free_pages() &&
        !running_.empty()) {
      return Piece{&a, 0};
    }
  }
  const int64_t cached = static_cast<int64_t>(hit.size()) * pool_.geometry().page_size;
  a.fed = cached;  // the prefix is in the KV cache
  const int64_t n = piece_size(a, budget);
  if (n == 0) {
    a.fed = 0;
    return Piece{&a, 0};
  }
  GB_RETURN_IF_ERROR(pool_.admit(a.request.id, cached + n, reserve_tokens, hit));
  if (prefix_caching_) {
    metrics_.prefix_cache_queries += a.known();
    metrics_.prefix_cache_hits += cached;
  }
  // running_ stays in the policy's order (a resumed request goes back to its place), so that its last request is the
  // one to preempt and every other one is older.
  const auto at = std::upper_bound(running_.begin(), running_.end(), waiting_.front(),
                                   [this](const std::unique_ptr<Active>& x, const std::unique_ptr<Active>& y) {
                                     return runs_before(*x, *y);
                                   });
  running_.insert(at, std::move(waiting_.front()));
  waiting_.erase(waiting_.begin());
  return Piece{&a, n};
}

Status Engine::prefill(const std::vector<Piece>& pieces) {
  // Group pieces up to max_prefill_tokens per forward (a longer one runs alone).
  size_t i = 0;
  while (i < pieces.size()) {
    std::vector<int32_t> tokens, q_lens;
    std::vector<runtime::SeqId> ids;
    std::vector<Active*> batch;
    std::vector<bool> sample;
    size_t j = i;
    while (j < pieces.size() && static_cast<int64_t>(ids.size()) < options_.max_batch) {
      const Piece& p = pieces[j];
      if (!ids.empty() && static_cast<int64_t>(tokens.size()) + p.n > options_.max_prefill_tokens) break;
      append_pending(*p.a, p.n, tokens);
      q_lens.push_back(static_cast<int32_t>(p.n));
      ids.push_back(p.a->request.id);
      batch.push_back(p.a);
      sample.push_back(p.a->pending() == 0);
      ++j;
    }
    const double t0 = now_seconds();
    if (options_.record_choices) current_ = batch;
    GB_RETURN_IF_ERROR(executor_.forward({tokens, ids, q_lens}, logits_));
    metrics_.prefill_seconds += now_seconds() - t0;
    metrics_.prefill_tokens += static_cast<int64_t>(tokens.size());
    cache_pages(batch);
    GB_RETURN_IF_ERROR(take_results(batch, &sample));
    i = j;
  }
  return ok_status();
}

Status Engine::decode(std::vector<Active*>& batch) {
  // One pending token each (the last drawn; after a preemption of a Gated DeltaNet model, the next one fed again).
  std::vector<int32_t> tokens;
  std::vector<runtime::SeqId> ids;
  std::vector<Active*> fed;
  std::vector<bool> sample;
  for (Active* a : batch) {
    if (!pool_.contains(a->request.id)) continue;  // preempted by an older request this step
    if (!make_room(*a, 1)) continue;
    GB_RETURN_IF_ERROR(pool_.append(a->request.id, 1));
    append_pending(*a, 1, tokens);
    ids.push_back(a->request.id);
    fed.push_back(a);
    sample.push_back(a->pending() == 0);
  }
  if (fed.empty()) return ok_status();
  const std::vector<int32_t> q_lens(fed.size(), 1);
  const double t0 = now_seconds();
  if (options_.record_choices) current_ = fed;
  GB_RETURN_IF_ERROR(executor_.forward({tokens, ids, q_lens}, logits_));
  metrics_.decode_seconds += now_seconds() - t0;
  metrics_.decode_tokens += static_cast<int64_t>(tokens.size());
  cache_pages(fed);
  return take_results(fed, &sample);
}

bool Engine::refuse_front_if_never_fits() {
  Active& a = *waiting_.front();
  const int64_t prompt = static_cast<int64_t>(a.request.prompt.size());
  if (pool_.pages_for(a.kv_tokens_needed) > pool_.num_pages()) {
    a.result.reason = FinishReason::kRefused;
    a.result.message = fmt::format(
        "request {} needs {} KV pages ({} prompt + {} new tokens at {} tokens per page) but the pool has only {} "
        "pages; raise --kv-memory-mb or lower --max-new-tokens",
        a.request.id, pool_.pages_for(a.kv_tokens_needed), prompt, a.request.max_new_tokens,
        pool_.geometry().page_size, pool_.num_pages());
  } else if (const std::string why = pool_.never_fits(prompt, a.kv_tokens_needed); !why.empty()) {
    a.result.reason = FinishReason::kRefused;
    a.result.message = fmt::format("request {} {}; raise --max-batch or --kv-memory-mb", a.request.id, why);
  }
  if (a.result.reason != FinishReason::kRefused) return false;
  ++metrics_.requests_refused;
  ++metrics_.requests_finished;
  std::unique_ptr<Active> refused = std::move(waiting_.front());
  waiting_.erase(waiting_.begin());
  deliver(*refused);
  return true;
}

Status Engine::chunked_step() {
  // One forward: the running requests that decode feed their last token, and the tokens left go to chunks of the
  // others' pending tokens: first those of the requests already running (prompts being prefilled, requests fed
  // again after a preemption; oldest first), then those of newly admitted ones (in the policy's order). Every
  // weight is read once for both (the kernels are batch-invariant, so neither changes the other's bits).
  std::vector<Active*> batch;  // the decodes, then the chunks
  std::vector<int32_t> tokens, q_lens;
  std::vector<runtime::SeqId> ids;
  std::vector<bool> sample;  // a piece that feeds its request's last pending token: draw a token
  const auto add = [&](Active& a, int64_t n) {
    append_pending(a, n, tokens);
    q_lens.push_back(static_cast<int32_t>(n));
    ids.push_back(a.request.id);
    batch.push_back(&a);
    sample.push_back(a.pending() == 0);
  };
  for (size_t i = 0; i < running_.size(); ++i) {
    Active& a = *running_[i];
    if (a.done || !a.decoding()) continue;
    if (!make_room(a, 1)) break;  // a was the newest running request
    GB_RETURN_IF_ERROR(pool_.append(a.request.id, 1));
    add(a, 1);
  }
  const int64_t decodes = static_cast<int64_t>(batch.size());
  int64_t budget = std::min(options_.max_num_batched_tokens - decodes, options_.max_prefill_tokens);
  const bool reserved = options_.preemption == Preemption::kOff;
  for (auto& a : running_) {
    if (budget <= 0) break;
    if (a->done || a->decoding() || a->pending() == 0) continue;  // pending 0: it decodes in this forward
    // A chunk takes free pages only (preempting would drop decodes already in this forward).
    const int64_t n =
        piece_size(*a, reserved ? budget : std::min(budget, pool_.growth_room(a->request.id)));
    if (n == 0) break;  // the oldest first: a younger request does not pass it
    GB_RETURN_IF_ERROR(pool_.append(a->request.id, n));
    add(*a, n);
    budget -= n;
  }
  while (budget > 0 && !waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_batch) {
    if (refuse_front_if_never_fits()) continue;
    GB_ASSIGN_OR_RETURN(const Piece p, admit_front(budget));
    if (p.n == 0) break;
    add(*p.a, p.n);
    budget -= p.n;
  }
  if (!batch.empty()) {
    const double t0 = now_seconds();
    if (options_.record_choices) current_ = batch;
    GB_RETURN_IF_ERROR(executor_.forward({tokens, ids, q_lens}, logits_));
    // The forward's time goes to decode and prefill in proportion to their tokens.
    const double dt = now_seconds() - t0, total = static_cast<double>(tokens.size());
    const int64_t prompt_tokens = static_cast<int64_t>(tokens.size()) - decodes;
    metrics_.decode_seconds += dt * static_cast<double>(decodes) / total;
    metrics_.prefill_seconds += dt * static_cast<double>(prompt_tokens) / total;
    metrics_.decode_tokens += decodes;
    metrics_.prefill_tokens += prompt_tokens;
    cache_pages(batch);
    GB_RETURN_IF_ERROR(take_results(batch, &sample));
  } else if (!running_.empty() && !reserved) {
    // Every running request waits for pages that only a preemption frees: the latest gives them back.
    preempt_newest();
  }
  std::erase_if(running_, [](const std::unique_ptr<Active>& a) { return a->done; });
  if (batch.empty() && running_.empty() && !waiting_.empty()) {
    return internal_error("engine: no progress possible although the pool is empty");
  }
  return ok_status();
}

Status Engine::step() {
  if (options_.max_num_batched_tokens > 0) return chunked_step();
  // Admission, in the policy's order (waiting_ is kept in it; preempted requests first).
  std::vector<Piece> admitted;
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_batch) {
    if (refuse_front_if_never_fits()) continue;
    GB_ASSIGN_OR_RETURN(const Piece p, admit_front(std::numeric_limits<int64_t>::max()));
    if (p.n == 0) break;  // waits for running requests to free pages
    admitted.push_back(p);
  }
  if (!admitted.empty()) GB_RETURN_IF_ERROR(prefill(admitted));
  std::vector<Active*> decoding;
  for (auto& a : running_) {
    const bool just_admitted =
        std::any_of(admitted.begin(), admitted.end(), [&](const Piece& p) { return p.a == a.get(); });
    if (!a->done && !just_admitted) decoding.push_back(a.get());
  }
  if (!decoding.empty()) GB_RETURN_IF_ERROR(decode(decoding));
  std::erase_if(running_, [](const std::unique_ptr<Active>& a) { return a->done; });
  if (admitted.empty() && decoding.empty() && running_.empty() && !waiting_.empty()) {
    return internal_error("engine: no progress possible although the pool is empty");
  }
  return ok_status();
}

Status Engine::run_to_completion(const std::function<void(const Progress&)>& progress) {
  start_time_ = now_seconds();
  const int64_t total = static_cast<int64_t>(waiting_.size() + running_.size()) + metrics_.requests_finished;
  while (has_work()) {
    GB_RETURN_IF_ERROR(step());
    if (progress) {
      progress(Progress{.finished = metrics_.requests_finished,
                        .total = total,
                        .generated_tokens = generated_,
                        .running = static_cast<int64_t>(running_.size()),
                        .waiting = static_cast<int64_t>(waiting_.size())});
    }
  }
  return ok_status();
}

}  // namespace genbridge::engine
