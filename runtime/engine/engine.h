#pragma once
// Engine: continuous batching over the paged KV pool. Requests are admitted in the policy's order when the
// pool can hold them (EngineOptions::preemption: their whole prompt plus every token they may generate, reserved
// up front, or only the tokens they hold now, growing a page at a time and preempting the latest-arrived running
// request when the pool runs out); a request that could never fit is refused with a message; the others wait. Each
// iteration prefills newly admitted requests and then decodes one token for every running request. Results do
// not depend on batch composition (the kernels are batch-invariant), nor on preemption (a preempted request's
// tokens are fed again when it resumes, which gives the bits they had).
//
// A request whose logits are not finite (NaN or +-Inf out of the LM head: overflowing activations or
// non-finite weights), or whose hidden state overflowed on the way (model::ActivationFault: a non-finite
// element, or a row whose RMSNorm sum of squares overflows fp32 and would silently give 0; the message names
// the layer and the position), ends with FinishReason::kError and a message naming the request and the step
// (step k draws the request's k-th token, from 0: step 0 is the prefill's); its
// pages are freed and the other requests continue, since one request's values never enter another's
// (every kernel is row- or sequence-local). The run itself succeeds; callers report the failed requests
// (the CLI prints them and exits non-zero). Errors of the forward pass itself still end the run.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "genbridge/core/status.h"
#include "runtime/engine/executor.h"
#include "runtime/engine/logits_processor.h"
#include "runtime/engine/metrics.h"
#include "runtime/engine/sampler.h"
#include "runtime/engine/token_constraint.h"
#include "runtime/memory/kv_page_pool.h"

namespace genbridge::engine {

struct Request {
  int64_t id = 0;  // unique per engine
  std::vector<int32_t> prompt;
  int max_new_tokens = 16;
  std::vector<int32_t> stop_tokens;  // generating one of these ends the request (the token is kept)
  SamplingParams sampling;
  int logprobs = -1;  // -1: none; k in [0, kMaxLogprobs]: each token's logprob and the k most likely tokens'
  // Teacher forcing: the first forced.size() tokens are these instead of drawn ones (each with its logprobs,
  // as a drawn token's). They never end the request on a stop token, count as prompt for the logits
  // processing (penalties, min_tokens), and the draws after them use the steps a request without them would
  // (a seed gives the same tokens). The server feeds a prompt this way to report its tokens' logprobs
  // (`echo`): the kernels give a prompt fed one token per step the same logits as its prefill.
  std::vector<int32_t> forced;
  // Which tokens may be drawn (structured outputs); null: any. Used on the engine's thread only. It sees the
  // drawn tokens only (never the forced ones), and its budget is the tokens left to draw. Its mask applies
  // after the logits processing; when the processing leaves none of its tokens drawable (min_tokens holding
  // back the stop token of a complete output, allowed_token_ids disjoint from its tokens) the constraint wins:
  // that draw is among its tokens by the raw logits, so the output still completes within max_new_tokens.
  std::shared_ptr<TokenConstraint> constraint;
  // Under SchedulingPolicy::kPriority, waiting requests start lowest value first, equal values in arrival
  // order (vLLM's `priority`); a running request is preempted only for want of KV pages (Preemption::kRecompute:
  // the highest value first, then the latest arrival). Must be 0 under kFcfs.
  int32_t priority = 0;
};

// kLength: max_new_tokens generated; kStop: a stop token generated; kRefused: could never fit the KV pool
// (nothing generated); kError: non-finite logits or overflowing activations at some step (the tokens before it are
// kept); kCancelled: ended by Engine::cancel (the tokens before it are kept).
enum class FinishReason { kLength, kStop, kRefused, kError, kCancelled };
// "length", "stop", "refused", "error", "cancelled".
const char* finish_reason_name(FinishReason r);

// A request's routing and indexer choices (EngineOptions::record_choices): one record per (step, position,
// layer) with something to report (a MoE or a DSA layer), in the order the forwards made them; each
// record's experts and indexer positions lie back to back in the vectors below (model::TokenChoices).
struct ChoiceRecord {
  int32_t step = 0;  // the request's step (step 0: the prefill, which records every prompt position)
  int32_t position = 0;
  int32_t layer = 0;
  int32_t num_experts = 0;  // 0 on a dense layer
  int32_t num_index = 0;    // 0 on a layer without an indexer
};
struct RequestChoices {
  std::vector<ChoiceRecord> records;
  std::vector<int32_t> expert_ids;
  std::vector<float> expert_weights;
  std::vector<int32_t> index_positions;
};

struct RequestResult {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // generated tokens, in order
  FinishReason reason = FinishReason::kLength;
  std::string message;                  // why a request was refused or failed (empty otherwise)
  std::vector<float> logits;            // [tokens.size(), vocab] when EngineOptions::record_logits
  std::vector<TokenLogprobs> logprobs;  // one per token when Request::logprobs >= 0
  RequestChoices choices;               // when EngineOptions::record_choices
};

// Whether the request generated what it was asked to (kLength or kStop), as opposed to refused or failed.
inline bool completed(const RequestResult& r) {
  return r.reason == FinishReason::kLength || r.reason == FinishReason::kStop;
}

// The order in which waiting requests start: arrival (kFcfs), or Request::priority then arrival (kPriority).
enum class SchedulingPolicy : uint8_t { kFcfs, kPriority };
// "fcfs" / "priority".
const char* scheduling_policy_name(SchedulingPolicy p);

// What admission takes from the KV pool. kOff: a request's prompt plus max_new_tokens, reserved at admission (a
// running request never runs out; a pool sized for half the requests at full length runs half of them). kRecompute
// (vLLM's preemption mode): only the tokens a request holds, growing a page at a time; when a running request needs
// a page and none is free, the last running request in the policy's order (the latest arrival; under kPriority the
// highest priority value, then the latest arrival) is preempted: its pages (and state slot) are freed and it goes
// back to the front of the waiting queue (resumed before new requests, and back in its place among the running
// ones, so an older request is never preempted for it and the oldest always progresses), where its prompt and the
// tokens it generated are fed again on resumption (for Gated DeltaNet models, the generated ones one per step, as
// they were first fed), so its tokens are the same bits. A request that could never fit the whole pool is refused
// either way.
enum class Preemption : uint8_t { kOff, kRecompute };
// "off" / "recompute".
const char* preemption_name(Preemption p);

struct EngineOptions {
  int64_t max_batch = 32;             // most sequences decoded together
  int64_t max_prefill_tokens = 4096;  // most prompt tokens per prefill forward (a longer prompt runs alone)
  // Chunked prefill: 0 prefills each admitted prompt whole (grouped up to max_prefill_tokens per forward) before
  // the running requests decode; N > 0 makes every step one forward of at most N tokens: the running requests'
  // decodes first, then chunks of the prompts being prefilled (the oldest first) with the tokens left, so a long
  // prompt is prefilled over several steps while the others keep decoding. (The metrics split such a forward's
  // time between decode and prefill in proportion to their tokens.) At least max_batch (every running request decodes each
  // step); a step's prefill forward also stays within max_prefill_tokens. The tokens are the same either way
  // (the kernels are batch-invariant: a prompt fed in chunks gives the logits of its whole prefill). Models with
  // Gated DeltaNet layers (Qwen3.5) split prompts only at multiples of 64 tokens, never leaving a 1-token piece,
  // and need a budget of at least max_batch + 127 (raised to it).
  int64_t max_num_batched_tokens = 0;
  bool record_logits = false;         // keep each step's last-position logits per request
  bool record_choices = false;        // keep each token's routed experts and indexer top-k per request
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  Preemption preemption = Preemption::kOff;
  // Automatic prefix caching (vLLM's): every full KV page is kept, named by its tokens and everything before them,
  // until the pool needs the page (least recently released first); a request starts on the cached pages of the
  // longest prefix of its tokens (whole pages; its last token is always fed, for its logits) and prefills the
  // rest, with the tokens and logits it would have computed. Not for models with per-sequence state (Qwen3.5's
  // Gated DeltaNet, DeepSeek-V4's windows: a page does not hold what the state after it was) nor with
  // record_choices (a cached prefix's routing is not computed again): the engine then leaves it off.
  bool prefix_caching = false;
};

// Streaming use (a server): the engine hands each generated token and each finished request to these
// instead of keeping results (results() stays empty), on the thread that runs step(). Either may be empty.
struct EngineListener {
  // `logprobs`: the token's log-probabilities when its request asked for them (Request::logprobs >= 0), else
  // nullptr; valid during the call only.
  std::function<void(int64_t id, int32_t token, const TokenLogprobs* logprobs)> on_token;
  std::function<void(RequestResult&& result)> on_finish;  // every request ends here once, refused ones too
};

struct Progress {
  int64_t finished = 0, total = 0, generated_tokens = 0, running = 0, waiting = 0;
};

class Engine {
 public:
  // `executor` and `pool` must outlive the engine; the pool must be the one the executor's model uses.
  Engine(ForwardExecutor& executor, runtime::KvPagePool& pool, const EngineOptions& options);
  ~Engine();

  // Queues a request. InvalidArgument for a malformed request (empty prompt, token outside the vocabulary,
  // max_new_tokens < 1, bad sampling parameters, duplicate id): nothing is queued.
  Status submit(Request request);
  // Runs until every submitted request has finished or been refused. `progress` (optional) is called after
  // every iteration. Returns the first forward error, leaving unfinished requests unreported.
  Status run_to_completion(const std::function<void(const Progress&)>& progress = {});
  // Results in submission order (complete after run_to_completion).
  const std::vector<RequestResult>& results() const { return results_; }
  const EngineMetrics& metrics() const { return metrics_; }

  // Streaming use: set the listener before the first submit, then call step() while has_work(). One
  // thread owns the engine: submit, step and cancel are not thread-safe.
  void set_listener(EngineListener listener);
  // One iteration: admits waiting requests in the policy's order, prefills them, decodes one token of every other
  // running request. Does nothing without work. Returns a forward error (the engine is then unusable).
  Status step();
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  // Ends request `id`, waiting or running, with FinishReason::kCancelled and frees its KV pages. False when
  // the engine holds no unfinished request `id`.
  bool cancel(int64_t id);

 private:
  struct Active;
  // One forward's worth of a request: `n` of its pending tokens (Active::pending).
  struct Piece {
    Active* a;
    int64_t n;
  };
  Status prefill(const std::vector<Piece>& pieces);
  Status decode(std::vector<Active*>& batch);
  // max_num_batched_tokens > 0: admission and one step of decodes plus prefill chunks.
  Status chunked_step();
  // Refuses the first waiting request (and returns true) when it can never fit the pool.
  bool refuse_front_if_never_fits();
  // Admits the first waiting request when the pool can hold it, taking the pages of its first piece of at most
  // `budget` tokens (and the reservation under Preemption::kOff); moves it to running_ and returns the piece, or
  // n == 0 (nothing changed) when it must wait.
  Result<Piece> admit_front(int64_t budget);
  // How many of a's pending tokens one forward may feed, at most `budget` (0: none fits the split rules).
  int64_t piece_size(const Active& a, int64_t budget) const;
  // Appends a's next `n` pending tokens to `tokens` (the pool already holds their pages).
  void append_pending(Active& a, int64_t n, std::vector<int32_t>& tokens);
  // Preemption::kRecompute: makes room in the pool for a to grow by `n` tokens by preempting the latest running
  // requests (preempt_newest); false when a itself was preempted (it was the latest).
  bool make_room(Active& a, int64_t n);
  // The last running request not done (rend() when none).
  std::vector<std::unique_ptr<Active>>::reverse_iterator newest_running();
  // Frees the pages of the last running request not done (the latest in the policy's order: the latest arrival, or
  // under kPriority the latest of the highest priority value) and puts it at the front of the waiting queue.
  void preempt_newest();
  // The policy's order of requests: arrival, or priority value then arrival.
  bool runs_before(const Active& x, const Active& y) const;
  // Per sequence of the last forward: ends it on an activation fault, else samples its token (only where
  // `sample` is null or sample[s] is set: a prompt chunk that is not its prompt's last draws nothing).
  Status take_results(std::span<Active* const> batch, const std::vector<bool>* sample = nullptr);
  Status sample_into(Active& a, const float* logits);
  // Ends `a` with FinishReason::kError: "request R, step S: <what>; the request was ended. ...".
  void fail(Active& a, const std::string& what);
  void finish(Active& a, FinishReason reason);
  void deliver(Active& a);

  ForwardExecutor& executor_;
  runtime::KvPagePool& pool_;
  EngineOptions options_;
  std::vector<std::unique_ptr<Active>> waiting_;  // in the policy's order
  std::vector<std::unique_ptr<Active>> running_;
  std::vector<RequestResult> results_;
  EngineListener listener_;
  bool streaming_ = false;
  std::unordered_set<int64_t> ids_;  // ids in use (streaming: unfinished requests only)
  EngineMetrics metrics_;
  std::vector<float> logits_;
  model::ChoiceSink choice_sink_;  // record_choices: into the Active of current_[seq_index]
  std::vector<Active*> current_;   // the sequences of the forward in flight
  std::vector<int32_t> scratch_;
  std::vector<float> processed_;   // one sequence's logits after its LogitsProcessor
  std::vector<float> masked_;      // a constrained request's row with the disallowed tokens masked
  std::vector<uint32_t> allowed_;  // its allowed tokens, one bit each
  int64_t generated_ = 0;
  double start_time_ = 0;
  int64_t split_granule_ = 1;  // chunked prefill splits prompts at multiples of this (engine.cpp)
  bool prefix_caching_ = false;  // EngineOptions::prefix_caching where it applies
  uint64_t next_arrival_ = 0;
  // Publishes the full pages of the sequences of the last forward in the prefix cache.
  void cache_pages(std::span<Active* const> batch);
};

}  // namespace genbridge::engine
