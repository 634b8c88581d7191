#include "text/grammar/grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <unordered_map>

namespace genbridge::text::grammar {

int32_t Grammar::next(int32_t s, uint8_t b) const {
  for (const ByteEdge& e : byte_edges(s)) {
    if (b < e.lo) break;
    if (b <= e.hi) return e.to;
  }
  return -1;
}

std::string Grammar::describe() const {
  return fmt::format("{} rule{}, {} state{}", num_rules(), num_rules() == 1 ? "" : "s", num_states(),
                     num_states() == 1 ? "" : "s");
}

GrammarBuilder::Expr GrammarBuilder::add(Node n) {
  nodes_.push_back(std::move(n));
  return static_cast<Expr>(nodes_.size() - 1);
}

GrammarBuilder::Expr GrammarBuilder::empty() { return add(Node{.kind = Kind::kEmpty}); }
GrammarBuilder::Expr GrammarBuilder::nothing() { return add(Node{.kind = Kind::kNothing}); }
GrammarBuilder::Expr GrammarBuilder::bytes(uint8_t lo, uint8_t hi) {
  return lo > hi ? nothing() : add(Node{.kind = Kind::kBytes, .lo = lo, .hi = hi});
}
GrammarBuilder::Expr GrammarBuilder::literal(std::string_view s) {
  std::vector<Expr> parts;
  parts.reserve(s.size());
  for (unsigned char c : s) parts.push_back(bytes(c, c));
  return seq(std::move(parts));
}
GrammarBuilder::Expr GrammarBuilder::seq(std::vector<Expr> parts) {
  if (parts.size() == 1) return parts[0];
  return add(Node{.kind = Kind::kSeq, .children = std::move(parts)});
}
GrammarBuilder::Expr GrammarBuilder::alt(std::vector<Expr> options) {
  if (options.size() == 1) return options[0];
  if (options.empty()) return nothing();
  return add(Node{.kind = Kind::kAlt, .children = std::move(options)});
}
GrammarBuilder::Expr GrammarBuilder::repeat(Expr e, int min, int max) {
  if (max != kUnbounded && max < min) return nothing();
  if (min == 1 && max == 1) return e;
  return add(Node{.kind = Kind::kRepeat, .a = min, .b = max, .children = {e}});
}
GrammarBuilder::Expr GrammarBuilder::call(RuleId rule) { return add(Node{.kind = Kind::kCall, .a = rule}); }

RuleId GrammarBuilder::declare(std::string name) {
  rules_.push_back(RuleDef{.name = std::move(name)});
  return static_cast<RuleId>(rules_.size() - 1);
}
void GrammarBuilder::define(RuleId rule, Expr body) { rules_[rule].body = body; }

namespace {

// UTF-8 encoding of one code point (0..0x10FFFF, not a surrogate).
int utf8_encode(char32_t c, uint8_t out[4]) {
  if (c < 0x80) {
    out[0] = static_cast<uint8_t>(c);
    return 1;
  }
  if (c < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (c >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    return 2;
  }
  if (c < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (c >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    return 3;
  }
  out[0] = static_cast<uint8_t>(0xF0 | (c >> 18));
  out[1] = static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F));
  out[2] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
  out[3] = static_cast<uint8_t>(0x80 | (c & 0x3F));
  return 4;
}

// Splits [lo, hi] into ranges whose UTF-8 encodings are products of byte ranges (every byte position an
// interval), the standard decomposition of a code-point range into byte-range sequences.
void utf8_sequences(char32_t lo, char32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not characters
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  for (char32_t b : {char32_t{0x7F}, char32_t{0x7FF}, char32_t{0xFFFF}}) {
    if (lo <= b && b < hi) {
      utf8_sequences(lo, b, out);
      utf8_sequences(b + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7F) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  const int n = hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
  for (int i = 1; i < n; ++i) {
    const char32_t m = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out->push_back(std::move(seq));
}

}  // namespace

GrammarBuilder::Expr GrammarBuilder::codepoints(char32_t lo, char32_t hi) {
  hi = std::min<char32_t>(hi, 0x10FFFF);
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  utf8_sequences(lo, hi, &seqs);
  std::vector<Expr> options;
  for (const auto& s : seqs) {
    std::vector<Expr> parts;
    for (auto [a, b] : s) parts.push_back(bytes(a, b));
    options.push_back(seq(std::move(parts)));
  }
  return alt(std::move(options));
}

namespace {

// One rule's expression automaton (Thompson construction): epsilon, byte-range and call edges.
struct Nfa {
  struct Edge {
    enum Kind : uint8_t { kEps, kBytes, kCall } kind = kEps;
    uint8_t lo = 0, hi = 0;
    int32_t rule = 0;
    int32_t to = 0;
  };
  std::vector<std::vector<Edge>> out;
  int32_t add() {
    out.emplace_back();
    return static_cast<int32_t>(out.size() - 1);
  }
};

// A deterministic rule before it joins the grammar: state 0 is the start.
struct Dfa {
  struct State {
    std::vector<Grammar::ByteEdge> bytes;  // sorted, disjoint
    std::vector<Grammar::CallEdge> calls;  // sorted by rule, one per rule
    bool final = false;
  };
  std::vector<State> states;
};

}  // namespace

namespace {

class NfaBuilder {
 public:
  explicit NfaBuilder(int64_t limit) : limit_(limit) {}
  Nfa nfa;
  int64_t limit_;
  bool exceeded = false;

  int32_t state() {
    if (static_cast<int64_t>(nfa.out.size()) >= limit_) exceeded = true;
    return nfa.add();
  }
  void eps(int32_t a, int32_t b) { nfa.out[a].push_back({.kind = Nfa::Edge::kEps, .to = b}); }
};

}  // namespace

Result<Grammar> GrammarBuilder::build(RuleId root, const BuildLimits& limits) const {
  if (root < 0 || root >= num_rules())
    return invalid_argument(fmt::format("grammar: the root rule {} does not exist", root));
  for (const RuleDef& r : rules_) {
    if (r.body < 0) return invalid_argument(fmt::format("grammar: rule '{}' is declared but never defined", r.name));
  }
  int64_t nfa_states_total = 0;
  std::vector<Dfa> dfas(rules_.size());
  for (size_t ri = 0; ri < rules_.size(); ++ri) {
    // Thompson construction, iteratively over the expression tree (deep sequences stay off the call stack).
    NfaBuilder nb(limits.max_nfa_states - nfa_states_total);
    Nfa& nfa = nb.nfa;
    struct Task {
      Expr e;
      int32_t start, end;
    };
    const int32_t s0 = nb.state(), e0 = nb.state();
    std::vector<Task> tasks{{rules_[ri].body, s0, e0}};
    while (!tasks.empty() && !nb.exceeded) {
      const Task t = tasks.back();
      tasks.pop_back();
      const Node& n = nodes_[t.e];
      switch (n.kind) {
        case Kind::kEmpty:
          nb.eps(t.start, t.end);
          break;
        case Kind::kNothing:
          break;
        case Kind::kBytes:
          nfa.out[t.start].push_back({.kind = Nfa::Edge::kBytes, .lo = n.lo, .hi = n.hi, .to = t.end});
          break;
        case Kind::kCall:
          nfa.out[t.start].push_back({.kind = Nfa::Edge::kCall, .rule = n.a, .to = t.end});
          break;
        case Kind::kSeq: {
          int32_t cur = t.start;
          for (size_t i = 0; i < n.children.size(); ++i) {
            const int32_t next = i + 1 == n.children.size() ? t.end : nb.state();
            tasks.push_back({n.children[i], cur, next});
            cur = next;
          }
          if (n.children.empty()) nb.eps(t.start, t.end);
          break;
        }
        case Kind::kAlt:
          for (Expr c : n.children) {
            const int32_t a = nb.state(), b = nb.state();
            nb.eps(t.start, a);
            nb.eps(b, t.end);
            tasks.push_back({c, a, b});
          }
          break;
        case Kind::kRepeat: {
          const Expr c = n.children[0];
          int32_t cur = t.start;
          for (int i = 0; i < n.a && !nb.exceeded; ++i) {
            const int32_t next = nb.state();
            tasks.push_back({c, cur, next});
            cur = next;
          }
          if (n.b == kUnbounded) {
            const int32_t a = nb.state(), b = nb.state();
            nb.eps(cur, a);
            nb.eps(b, cur);
            nb.eps(cur, t.end);
            tasks.push_back({c, a, b});
          } else {
            for (int i = n.a; i < n.b && !nb.exceeded; ++i) {
              const int32_t next = nb.state();
              nb.eps(cur, t.end);
              tasks.push_back({c, cur, next});
              cur = next;
            }
            nb.eps(cur, t.end);
          }
          break;
        }
      }
    }
    if (nb.exceeded) {
      return resource_exhausted(fmt::format(
          "grammar: the rules' automata exceed {} states (rule '{}'; BuildLimits::max_nfa_states): the schema or "
          "pattern repeats too much (lower maxLength, maxItems or a {{n,m}} count)",
          limits.max_nfa_states, rules_[ri].name));
    }
    nfa_states_total += static_cast<int64_t>(nfa.out.size());

    // Subset construction.
    auto closure = [&](std::vector<int32_t> set) {
      std::vector<int32_t> todo = set;
      std::vector<uint8_t> in(nfa.out.size(), 0);
      for (int32_t s : set) in[s] = 1;
      while (!todo.empty()) {
        const int32_t s = todo.back();
        todo.pop_back();
        for (const Nfa::Edge& e : nfa.out[s]) {
          if (e.kind == Nfa::Edge::kEps && !in[e.to]) {
            in[e.to] = 1;
            set.push_back(e.to);
            todo.push_back(e.to);
          }
        }
      }
      std::sort(set.begin(), set.end());
      return set;
    };
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> subsets;
    Dfa& dfa = dfas[ri];
    auto intern = [&](std::vector<int32_t> s) {
      auto [it, fresh] = ids.emplace(std::move(s), static_cast<int32_t>(subsets.size()));
      if (fresh) {
        subsets.push_back(it->first);
        dfa.states.emplace_back();
      }
      return it->second;
    };
    intern(closure({s0}));
    for (size_t d = 0; d < subsets.size(); ++d) {
      if (static_cast<int64_t>(subsets.size()) > limits.max_states) {
        return resource_exhausted(fmt::format(
            "grammar: rule '{}' determinizes to more than {} states (BuildLimits::max_states): the schema or pattern "
            "is too large for constrained decoding",
            rules_[ri].name, limits.max_states));
      }
      const std::vector<int32_t> subset = subsets[d];
      std::vector<uint16_t> cuts;  // interval boundaries in 0..256
      std::map<int32_t, std::vector<int32_t>> calls;
      bool final = false;
      for (int32_t s : subset) {
        if (s == e0) final = true;
        for (const Nfa::Edge& e : nfa.out[s]) {
          if (e.kind == Nfa::Edge::kBytes) {
            cuts.push_back(e.lo);
            cuts.push_back(static_cast<uint16_t>(e.hi + 1));
          } else if (e.kind == Nfa::Edge::kCall) {
            calls[e.rule].push_back(e.to);
          }
        }
      }
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      std::vector<Grammar::ByteEdge> edges;
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        const uint16_t lo = cuts[k], hi = static_cast<uint16_t>(cuts[k + 1] - 1);
        std::vector<int32_t> targets;
        for (int32_t s : subset) {
          for (const Nfa::Edge& e : nfa.out[s]) {
            if (e.kind == Nfa::Edge::kBytes && e.lo <= lo && hi <= e.hi) targets.push_back(e.to);
          }
        }
        if (targets.empty()) continue;
        std::sort(targets.begin(), targets.end());
        targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
        const int32_t to = intern(closure(std::move(targets)));
        if (!edges.empty() && edges.back().to == to && edges.back().hi + 1 == lo) {
          edges.back().hi = static_cast<uint8_t>(hi);
        } else {
          edges.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), to});
        }
      }
      std::vector<Grammar::CallEdge> call_edges;
      for (auto& [rule, targets] : calls) {
        std::sort(targets.begin(), targets.end());
        targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
        call_edges.push_back({rule, intern(closure(std::move(targets)))});
      }
      dfa.states[d].bytes = std::move(edges);
      dfa.states[d].calls = std::move(call_edges);
      dfa.states[d].final = final;
    }

    // Moore minimization: refine (final, edges by class) until the number of classes stops growing.
    const size_t n = dfa.states.size();
    std::vector<int32_t> cls(n);
    for (size_t s = 0; s < n; ++s) cls[s] = dfa.states[s].final ? 1 : 0;
    size_t num_classes = 0;
    for (;;) {
      std::map<std::vector<int64_t>, int32_t> sigs;
      std::vector<int32_t> next(n);
      for (size_t s = 0; s < n; ++s) {
        std::vector<int64_t> sig{cls[s]};
        int64_t prev_hi = -2, prev_cls = -1;
        for (const Grammar::ByteEdge& e : dfa.states[s].bytes) {
          const int64_t c = cls[e.to];
          if (c == prev_cls && prev_hi + 1 == e.lo) {
            sig.back() = e.hi;  // extend the previous interval
          } else {
            sig.insert(sig.end(), {-1, e.lo, c, e.hi});
          }
          prev_hi = e.hi;
          prev_cls = c;
        }
        for (const Grammar::CallEdge& e : dfa.states[s].calls) sig.insert(sig.end(), {-2, e.rule, cls[e.to]});
        next[s] = sigs.emplace(std::move(sig), static_cast<int32_t>(sigs.size())).first->second;
      }
      cls = std::move(next);
      if (sigs.size() == num_classes) break;
      num_classes = sigs.size();
    }
    // The minimal automaton: one state per class, the start's class first.
    std::vector<int32_t> order(num_classes, -1);
    int32_t count = 0;
    order[cls[0]] = count++;
    for (size_t s = 0; s < n; ++s) {
      if (order[cls[s]] < 0) order[cls[s]] = count++;
    }
    Dfa min;
    min.states.resize(num_classes);
    std::vector<uint8_t> done(num_classes, 0);
    for (size_t s = 0; s < n; ++s) {
      const int32_t m = order[cls[s]];
      if (done[m]) continue;
      done[m] = 1;
      Dfa::State& st = min.states[m];
      st.final = dfa.states[s].final;
      for (const Grammar::ByteEdge& e : dfa.states[s].bytes) {
        const int32_t to = order[cls[e.to]];
        if (!st.bytes.empty() && st.bytes.back().to == to && st.bytes.back().hi + 1 == e.lo) {
          st.bytes.back().hi = e.hi;
        } else {
          st.bytes.push_back({e.lo, e.hi, to});
        }
      }
      for (const Grammar::CallEdge& e : dfa.states[s].calls) st.calls.push_back({e.rule, order[cls[e.to]]});
    }
    dfa = std::move(min);
  }

  // Join the rules into one numbering.
  Grammar g;
  g.root_ = root;
  int32_t total = 0;
  for (size_t r = 0; r < rules_.size(); ++r) {
    g.rule_start_.push_back(total);
    g.rule_name_.push_back(rules_[r].name);
    total += static_cast<int32_t>(dfas[r].states.size());
  }
  if (total > limits.max_states) {
    return resource_exhausted(
        fmt::format("grammar: the rules determinize to {} states, more than {} "
                    "(BuildLimits::max_states)",
                    total, limits.max_states));
  }
  g.final_.resize(total);
  g.state_rule_.resize(total);
  g.byte_begin_.push_back(0);
  g.call_begin_.push_back(0);
  for (size_t r = 0; r < rules_.size(); ++r) {
    const int32_t base = g.rule_start_[r];
    for (size_t s = 0; s < dfas[r].states.size(); ++s) {
      const Dfa::State& st = dfas[r].states[s];
      g.final_[base + s] = st.final;
      g.state_rule_[base + s] = static_cast<RuleId>(r);
      for (Grammar::ByteEdge e : st.bytes) {
        e.to += base;
        g.byte_edges_.push_back(e);
      }
      for (Grammar::CallEdge e : st.calls) {
        e.to += base;
        g.call_edges_.push_back(e);
      }
      g.byte_begin_.push_back(static_cast<int32_t>(g.byte_edges_.size()));
      g.call_begin_.push_back(static_cast<int32_t>(g.call_edges_.size()));
    }
  }

  // Fewest bytes to finish each state's rule: relax until nothing changes (Bellman-Ford; costs are >= 0).
  constexpr int32_t kInf = Grammar::kUnreachable;
  g.min_bytes_.assign(total, kInf);
  for (int32_t s = 0; s < total; ++s) {
    if (g.final_[s]) g.min_bytes_[s] = 0;
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t s = total - 1; s >= 0; --s) {
      int64_t best = g.min_bytes_[s];
      for (const Grammar::ByteEdge& e : g.byte_edges(s)) {
        if (g.min_bytes_[e.to] != kInf) best = std::min<int64_t>(best, int64_t{1} + g.min_bytes_[e.to]);
      }
      for (const Grammar::CallEdge& e : g.call_edges(s)) {
        const int32_t callee = g.min_bytes_[g.rule_start_[e.rule]];
        if (callee != kInf && g.min_bytes_[e.to] != kInf) {
          best = std::min<int64_t>(best, int64_t{callee} + g.min_bytes_[e.to]);
        }
      }
      if (best >= kInf) continue;  // (a finite sum past int32 would be a grammar of gigabytes)
      if (best < g.min_bytes_[s]) {
        g.min_bytes_[s] = static_cast<int32_t>(best);
        changed = true;
      }
    }
  }
  // Left recursion: a rule reaching a call of itself without reading a byte would grow the stack forever. Edges of
  // the "no byte read" graph: a call site to the callee's start (a push), and past a nullable callee to the
  // return state (no push). A strongly connected component holding a push edge is left recursion.
  {
    std::vector<std::vector<std::pair<int32_t, bool>>> adj(total);
    for (int32_t s = 0; s < total; ++s) {
      for (const Grammar::CallEdge& e : g.call_edges(s)) {
        adj[s].push_back({g.rule_start_[e.rule], true});
        if (g.min_bytes_[g.rule_start_[e.rule]] == 0) adj[s].push_back({e.to, false});
      }
    }
    // Iterative Tarjan.
    std::vector<int32_t> index(total, -1), low(total, 0), comp(total, -1), stack;
    std::vector<uint8_t> on(total, 0);
    int32_t counter = 0, ncomp = 0;
    struct Frame {
      int32_t v;
      size_t i;
    };
    for (int32_t v0 = 0; v0 < total; ++v0) {
      if (index[v0] >= 0 || adj[v0].empty()) continue;
      std::vector<Frame> work{{v0, 0}};
      index[v0] = low[v0] = counter++;
      stack.push_back(v0);
      on[v0] = 1;
      while (!work.empty()) {
        Frame& f = work.back();
        if (f.i < adj[f.v].size()) {
          const int32_t w = adj[f.v][f.i++].first;
          if (index[w] < 0) {
            index[w] = low[w] = counter++;
            stack.push_back(w);
            on[w] = 1;
            work.push_back({w, 0});
          } else if (on[w]) {
            low[f.v] = std::min(low[f.v], index[w]);
          }
          continue;
        }
        const int32_t v = f.v;
        work.pop_back();
        if (!work.empty()) low[work.back().v] = std::min(low[work.back().v], low[v]);
        if (low[v] == index[v]) {
          for (;;) {
            const int32_t w = stack.back();
            stack.pop_back();
            on[w] = 0;
            comp[w] = ncomp;
            if (w == v) break;
          }
          ++ncomp;
        }
      }
    }
    for (int32_t s = 0; s < total; ++s) {
      for (auto [to, push] : adj[s]) {
        if (push && comp[s] >= 0 && comp[s] == comp[to]) {
          return invalid_argument(fmt::format(
              "grammar: rule '{}' reaches a call of itself without reading a byte (left recursion, e.g. a $ref that "
              "refers to itself); such a grammar has no finite derivation to follow",
              rules_[g.state_rule_[s]].name));
        }
      }
    }
  }

  for (size_t r = 0; r < rules_.size(); ++r) {
    if (g.min_bytes_[g.rule_start_[r]] == kInf) {
      return invalid_argument(
          fmt::format("grammar: rule '{}' can never complete (every way through it goes on forever)", rules_[r].name));
    }
  }

  // Edges into states that cannot finish their rule lead nowhere: drop them.
  std::vector<Grammar::ByteEdge> bytes;
  std::vector<Grammar::CallEdge> calls;
  std::vector<int32_t> byte_begin{0}, call_begin{0};
  for (int32_t s = 0; s < total; ++s) {
    for (const Grammar::ByteEdge& e : g.byte_edges(s)) {
      if (g.min_bytes_[e.to] != kInf) bytes.push_back(e);
    }
    for (const Grammar::CallEdge& e : g.call_edges(s)) {
      if (g.min_bytes_[e.to] != kInf) calls.push_back(e);
    }
    byte_begin.push_back(static_cast<int32_t>(bytes.size()));
    call_begin.push_back(static_cast<int32_t>(calls.size()));
  }
  g.byte_edges_ = std::move(bytes);
  g.call_edges_ = std::move(calls);
  g.byte_begin_ = std::move(byte_begin);
  g.call_begin_ = std::move(call_begin);
  return g;
}

}  // namespace genbridge::text::grammar
