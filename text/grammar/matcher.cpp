#include "text/grammar/matcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <numeric>
#include <unordered_map>

#include "text/grammar/stack_sets.h"

namespace genbridge::text::grammar {

namespace {
const std::string kNoBytes;
inline void set_bit(std::span<uint32_t> m, int32_t id) { m[id >> 5] |= uint32_t{1} << (id & 31); }
inline bool has_bit(std::span<const uint32_t> m, int32_t id) { return (m[id >> 5] >> (id & 31)) & 1; }
// Sets kept by a walk or a matcher before they are rebuilt from the current one (each holds 1 KiB of transitions).
constexpr int64_t kMaxSets = 8192;
}  // namespace

std::shared_ptr<const Vocabulary> Vocabulary::build(const Tokenizer& tokenizer, int64_t size) {
  std::vector<std::string> tokens(static_cast<size_t>(std::min<int64_t>(size, tokenizer.vocab_size())));
  for (size_t id = 0; id < tokens.size(); ++id) {
    const int32_t i = static_cast<int32_t>(id);
    if (tokenizer.is_special(i)) continue;
    if (const std::string* b = tokenizer.token_bytes(i)) tokens[id] = *b;
  }
  return from_bytes(std::move(tokens), size);
}

std::shared_ptr<const Vocabulary> Vocabulary::from_bytes(std::vector<std::string> tokens, int64_t size) {
  auto v = std::shared_ptr<Vocabulary>(new Vocabulary());
  v->size_ = std::max<int64_t>(size, static_cast<int64_t>(tokens.size()));
  v->bytes_ = std::move(tokens);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < v->bytes_.size(); ++i) {
    if (!v->bytes_[i].empty()) ids.push_back(static_cast<int32_t>(i));
  }
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return v->bytes_[a] != v->bytes_[b] ? v->bytes_[a] < v->bytes_[b] : a < b; });
  // Preorder trie from the sorted tokens: the path of the previous token is kept, the common prefix reused.
  v->node_byte_.push_back(0);
  v->node_end_.push_back(0);
  v->node_tok_.push_back(0);
  std::vector<int32_t> path{0};  // path[d] = node at depth d
  std::string prev;
  bool single[256] = {};
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string& b = v->bytes_[ids[k]];
    size_t common = 0;
    while (common < prev.size() && common < b.size() && prev[common] == b[common]) ++common;
    while (path.size() > common + 1) {
      v->node_end_[path.back()] = static_cast<int32_t>(v->node_byte_.size());
      path.pop_back();
    }
    for (size_t d = common; d < b.size(); ++d) {
      path.push_back(static_cast<int32_t>(v->node_byte_.size()));
      v->node_byte_.push_back(static_cast<uint8_t>(b[d]));
      v->node_end_.push_back(0);
      v->node_tok_.push_back(static_cast<int32_t>(k));
    }
    if (b.size() == 1) single[static_cast<uint8_t>(b[0])] = true;
    prev = b;
  }
  while (!path.empty()) {
    v->node_end_[path.back()] = static_cast<int32_t>(v->node_byte_.size());
    path.pop_back();
  }
  v->node_tok_.push_back(static_cast<int32_t>(ids.size()));
  v->tokens_ = std::move(ids);
  v->every_byte_ = std::all_of(std::begin(single), std::end(single), [](bool x) { return x; });
  return v;
}

const std::string& Vocabulary::bytes(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < bytes_.size() ? bytes_[id] : kNoBytes;
}

CompiledGrammar::~CompiledGrammar() = default;

int64_t CompiledGrammar::min_tokens() const { return costs_[grammar_.rule_start(grammar_.root())]; }

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::compile(Grammar grammar,
                                                                        std::shared_ptr<const Vocabulary> vocabulary,
                                                                        const CompileOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto cg = std::shared_ptr<CompiledGrammar>(new CompiledGrammar(std::move(grammar), std::move(vocabulary)));
  const Grammar& g = cg->grammar_;
  const Vocabulary& v = *cg->vocab_;
  const int32_t num_nodes = static_cast<int32_t>(v.num_trie_nodes());
  const int64_t words = v.num_words();
  cg->nodes_.resize(static_cast<size_t>(g.num_states()));
  auto sets = std::make_unique<StackSets>(g);
  std::vector<uint32_t> bits(static_cast<size_t>(words));
  // Tokens that leave the state's rule part-way: grouped by what is left of them once it was left (their
  // suffix), which the stack below the state decides.
  std::unordered_map<std::string, std::vector<int32_t>> suffixes;
  struct Frame {
    int32_t end, set;
    int32_t esc_begin, esc_end;  // offsets (bytes into the token) where the rule was left, in `escapes`
  };
  std::vector<Frame> frames;
  std::vector<int32_t> escapes;
  // Where each state's accepted tokens lead (their sets as frame lists), for the token costs computed after the
  // walks: per state, a list of results {complete, stacks (states, innermost first)}.
  // The tokens leading there are kept with each result (sorted ids), to be grouped by cost once costs are known.
  struct Result {
    bool complete = false;
    std::vector<std::vector<int32_t>> stacks;
    std::vector<int32_t> tokens;
  };
  std::vector<std::vector<Result>> results(static_cast<size_t>(g.num_states()));
  std::vector<int32_t> result_sets;                 // set ids of the state being walked
  std::vector<std::vector<int32_t>> result_tokens;  // their tokens
  std::unordered_map<int32_t, int32_t> result_index;
  int64_t polls = 0;
  auto stopped = [&]() -> Status {
    if (std::chrono::steady_clock::now() >= options.deadline) {
      return deadline_exceeded(fmt::format("compiling the grammar ({}) passed its deadline", g.describe()));
    }
    if (options.cancelled && options.cancelled()) {
      return unavailable(fmt::format("compiling the grammar ({}) was cancelled", g.describe()));
    }
    return ok_status();
  };
  for (int32_t t = 0; t < g.num_states(); ++t) {
    if (g.byte_edges(t).empty()) continue;
    GB_RETURN_IF_ERROR(stopped());
    if (sets->num_sets() > kMaxSets) sets = std::make_unique<StackSets>(g);
    suffixes.clear();
    result_sets.clear();
    result_tokens.clear();
    result_index.clear();
    const int32_t start = sets->push(StackSets::kEmptyStack, t);
    frames.clear();
    escapes.clear();
    frames.push_back({num_nodes, sets->raw_set(std::span<const int32_t>(&start, 1)), 0, 0});
    auto mark_uncertain = [&](int32_t k0, int32_t k1, int32_t e0, int32_t e1) {
      for (int32_t k = k0; k < k1; ++k) {
        const int32_t id = v.sorted_token(k);
        const std::string& tb = v.bytes(id);
        for (int32_t e = e0; e < e1; ++e) suffixes[tb.substr(static_cast<size_t>(escapes[e]))].push_back(id);
      }
    };
    for (int32_t i = 1; i < num_nodes;) {
      if ((++polls & 0xFFFFF) == 0) GB_RETURN_IF_ERROR(stopped());
      while (frames.back().end <= i) frames.pop_back();
      const Frame parent = frames.back();
      escapes.resize(static_cast<size_t>(parent.esc_end));
      const int32_t depth = static_cast<int32_t>(frames.size());  // bytes read once node i's byte is
      const int32_t c = sets->next(parent.set, v.node_byte(i));
      const int32_t end = v.subtree_end(i);
      if (c == StackSets::kDeadSet) {
        if (parent.esc_begin < parent.esc_end) {
          mark_uncertain(v.token_begin(i), v.token_begin(end), parent.esc_begin, parent.esc_end);
        }
        i = end;
        continue;
      }
      const int32_t k1 = v.token_begin(i + 1);
      if (v.token_begin(i) < k1) {
        auto [it, fresh] = result_index.emplace(c, static_cast<int32_t>(result_sets.size()));
        if (fresh) {
          result_sets.push_back(c);
          result_tokens.emplace_back();
        }
        std::vector<int32_t>& to = result_tokens[it->second];
        for (int32_t k = v.token_begin(i); k < k1; ++k) to.push_back(v.sorted_token(k));
      }
      if (sets->complete(c)) escapes.push_back(depth);  // left the rule here
      const int32_t esc_end = static_cast<int32_t>(escapes.size());
      if (sets->stacks(c).empty()) {  // only left the rule: whatever follows depends on the stack below
        if (parent.esc_begin < esc_end) mark_uncertain(k1, v.token_begin(end), parent.esc_begin, esc_end);
        i = end;
        continue;
      }
      frames.push_back({end, c, parent.esc_begin, esc_end});
      ++i;
    }
    Node& n = cg->nodes_[t];
    for (size_t r = 0; r < result_sets.size(); ++r) {
      const int32_t c = result_sets[r];
      Result res{.complete = sets->complete(c), .tokens = std::move(result_tokens[r])};
      for (int32_t st : sets->stacks(c)) {
        std::vector<int32_t> frames_of;
        for (int32_t x = st; x != StackSets::kEmptyStack; x = sets->parent(x)) frames_of.push_back(sets->state(x));
        res.stacks.push_back(std::move(frames_of));
      }
      std::sort(res.tokens.begin(), res.tokens.end());
      results[t].push_back(std::move(res));
    }
    n.suffix_begin = static_cast<int32_t>(cg->suffixes_.size());
    for (auto& [suffix, ids] : suffixes) {
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      cg->suffixes_.push_back({static_cast<int32_t>(cg->suffix_bytes_.size()), static_cast<int32_t>(suffix.size()),
                               static_cast<int32_t>(cg->unc_ids_.size()), 0});
      cg->suffix_bytes_ += suffix;
      cg->unc_ids_.insert(cg->unc_ids_.end(), ids.begin(), ids.end());
      cg->suffixes_.back().tok_end = static_cast<int32_t>(cg->unc_ids_.size());
      cg->stats_.uncertain_tokens += static_cast<int64_t>(ids.size());
    }
    n.suffix_end = static_cast<int32_t>(cg->suffixes_.size());
    ++cg->stats_.nodes;
  }
  // Token costs: what finishing each state's rule takes in tokens, the least over its accepted tokens (1 + the
  // cost of where the token leads, a set's least) and its calls (the callee's start + the return state); final
  // states 0. Relaxed until nothing changes. A token's cost counts the frames it opened, so each step along
  // the cheapest way lowers the cost of the whole stack by one: what the budget needs (fill_mask).
  constexpr int64_t kInf = Grammar::kUnreachable;
  std::vector<int64_t> cost(static_cast<size_t>(g.num_states()), kInf);
  for (int32_t s0 = 0; s0 < g.num_states(); ++s0) {
    if (g.is_final(s0)) cost[s0] = 0;
  }
  auto result_cost = [&](const Result& r) {
    int64_t best = r.complete ? 0 : kInf;
    for (const auto& frames_of : r.stacks) {
      int64_t sum = 0;
      for (int32_t f : frames_of) sum = std::min(kInf, sum + cost[f]);
      best = std::min(best, sum);
    }
    return best;
  };
  for (bool changed = true; changed;) {
    changed = false;
    GB_RETURN_IF_ERROR(stopped());
    for (int32_t s0 = g.num_states() - 1; s0 >= 0; --s0) {
      int64_t best = cost[s0];
      for (const Result& r : results[s0]) best = std::min(best, 1 + result_cost(r));
      for (const Grammar::CallEdge& e : g.call_edges(s0)) {
        best = std::min(best, cost[g.rule_start(e.rule)] + cost[e.to]);
      }
      if (best < cost[s0]) {
        cost[s0] = best;
        changed = true;
      }
    }
  }
  cg->costs_.resize(cost.size());
  for (size_t s0 = 0; s0 < cost.size(); ++s0) cg->costs_[s0] = static_cast<int32_t>(std::min(cost[s0], kInf));
  // Each state's accepted tokens grouped by what they leave to finish the frames they are in or opened (least
  // first), each group a bitmask or a list of ids, whichever is smaller.
  for (int32_t s0 = 0; s0 < g.num_states(); ++s0) {
    std::vector<std::pair<int64_t, const Result*>> by_cost;
    for (const Result& r : results[s0]) by_cost.emplace_back(result_cost(r), &r);
    std::sort(by_cost.begin(), by_cost.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    Node& n = cg->nodes_[s0];
    n.group_begin = static_cast<int32_t>(cg->groups_.size());
    for (size_t a = 0; a < by_cost.size();) {
      size_t b = a;
      int64_t count = 0;
      while (b < by_cost.size() && by_cost[b].first == by_cost[a].first)
        count += static_cast<int64_t>(by_cost[b++].second->tokens.size());
      Group grp{.cost = static_cast<int32_t>(std::min(by_cost[a].first, kInf))};
      if (count * 32 > v.size()) {
        std::fill(bits.begin(), bits.end(), 0);
        for (size_t k = a; k < b; ++k) {
          for (int32_t id : by_cost[k].second->tokens) set_bit(bits, id);
        }
        grp.bits = static_cast<int32_t>(cg->acc_bits_.size());
        cg->acc_bits_.insert(cg->acc_bits_.end(), bits.begin(), bits.end());
        ++cg->stats_.bitmask_groups;
      } else {
        grp.list_begin = static_cast<int32_t>(cg->acc_ids_.size());
        for (size_t k = a; k < b; ++k) {
          const auto& ids = by_cost[k].second->tokens;
          cg->acc_ids_.insert(cg->acc_ids_.end(), ids.begin(), ids.end());
        }
        grp.list_end = static_cast<int32_t>(cg->acc_ids_.size());
        cg->stats_.accepted_entries += count;
      }
      cg->groups_.push_back(grp);
      a = b;
    }
    n.group_end = static_cast<int32_t>(cg->groups_.size());
  }
  cg->stats_.memory_bytes = static_cast<int64_t>(
      cg->acc_ids_.size() * 4 + cg->unc_ids_.size() * 4 + cg->acc_bits_.size() * 4 + cg->nodes_.size() * sizeof(Node) +
      cg->groups_.size() * sizeof(Group) + cg->suffixes_.size() * sizeof(Suffix) + cg->suffix_bytes_.size());
  cg->stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::shared_ptr<const CompiledGrammar>(std::move(cg));
}

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar, std::vector<int32_t> stop_tokens)
    : g_(std::move(grammar)),
      stops_(std::move(stop_tokens)),
      sets_(std::make_unique<StackSets>(g_->grammar(), &g_->costs_)) {
  const int32_t root = sets_->push(StackSets::kEmptyStack, g_->grammar().rule_start(g_->grammar().root()));
  cur_ = sets_->closure_set(std::span<const int32_t>(&root, 1));
}

Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;

bool Matcher::complete() const { return sets_->complete(cur_); }

int64_t Matcher::min_tokens_to_complete() const { return sets_->cost_set(cur_); }

int64_t Matcher::fill_mask(std::span<uint32_t> allowed, int64_t remaining) {
  std::fill(allowed.begin(), allowed.end(), 0);
  if (finished_ || remaining < 1) return 0;
  if (sets_->num_sets() > kMaxSets) {  // keep the transition tables small: start over from the current set
    auto fresh = std::make_unique<StackSets>(g_->grammar(), &g_->costs_);
    cur_ = fresh->import_set(*sets_, cur_);
    sets_ = std::move(fresh);
  }
  const CompiledGrammar& cg = *g_;
  const Vocabulary& v = cg.vocabulary();
  // After a token other than a stop token, `remaining - 1` tokens are left, of which one is the stop token; the
  // token may be taken if what it leaves costs no more.
  const int64_t cap = remaining - 1 - (stops_.empty() ? 0 : 1);
  const std::vector<int32_t> stacks(sets_->stacks(cur_).begin(), sets_->stacks(cur_).end());
  for (int32_t st : stacks) {
    const CompiledGrammar::Node& n = cg.nodes_[sets_->state(st)];
    // The groups whose tokens leave no more than the budget allows (all of them, but near its end).
    const int64_t room = cap - sets_->cost(sets_->parent(st));
    for (int32_t k = n.group_begin; k < n.group_end && cg.groups_[k].cost <= room; ++k) {
      const CompiledGrammar::Group& grp = cg.groups_[k];
      if (grp.bits >= 0) {
        const uint32_t* b = cg.acc_bits_.data() + grp.bits;
        for (size_t w = 0; w < allowed.size(); ++w) allowed[w] |= b[w];
      } else {
        for (int32_t j = grp.list_begin; j < grp.list_end; ++j) set_bit(allowed, cg.acc_ids_[j]);
      }
    }
    if (n.suffix_begin == n.suffix_end) continue;
    // Tokens that leave this state's rule: the rest of each is read from the stack below (once per suffix).
    const int32_t below_stack = sets_->parent(st);
    if (below_stack == StackSets::kEmptyStack) continue;  // the output would be complete: nothing may follow
    const int32_t from = sets_->closure_set(std::span<const int32_t>(&below_stack, 1));
    for (int32_t k = n.suffix_begin; k < n.suffix_end; ++k) {
      const CompiledGrammar::Suffix& sf = cg.suffixes_[k];
      const int32_t c = sets_->next(from, std::string_view(cg.suffix_bytes_).substr(sf.bytes_begin, sf.bytes_len));
      if (c == StackSets::kDeadSet || sets_->cost_set(c) > cap) continue;
      for (int32_t j = sf.tok_begin; j < sf.tok_end; ++j) set_bit(allowed, cg.unc_ids_[j]);
    }
  }
  if (sets_->complete(cur_)) {
    for (int32_t id : stops_) {
      if (id >= 0 && id < v.size()) set_bit(allowed, id);
    }
  }
  int64_t count = 0;
  for (uint32_t w : allowed) count += std::popcount(w);
  return count;
}

Status Matcher::accept(int32_t token) {
  if (finished_) return invalid_argument(fmt::format("grammar: token {} comes after the stop token", token));
  if (std::find(stops_.begin(), stops_.end(), token) != stops_.end()) {
    if (!sets_->complete(cur_)) {
      return invalid_argument(fmt::format("grammar: stop token {} before the output is complete", token));
    }
    finished_ = true;
    return ok_status();
  }
  const std::string& b = g_->vocabulary().bytes(token);
  if (b.empty()) return invalid_argument(fmt::format("grammar: token {} is never allowed (a special token)", token));
  const int32_t next = sets_->next(cur_, b);
  if (next == StackSets::kDeadSet) {
    return invalid_argument(fmt::format("grammar: token {} does not continue the grammar", token));
  }
  cur_ = next;
  return ok_status();
}

Status Matcher::accept_bytes(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int32_t next = sets_->next(cur_, static_cast<uint8_t>(bytes[i]));
    if (next == StackSets::kDeadSet) {
      return invalid_argument(
          fmt::format("grammar: byte {} (0x{:02x}) does not continue the grammar", i, static_cast<uint8_t>(bytes[i])));
    }
    cur_ = next;
  }
  return ok_status();
}

}  // namespace genbridge::text::grammar
