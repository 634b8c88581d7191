#include "tools/serve/structured_output.h"

namespace genbridge::serve {

namespace grammar = text::grammar;

StructuredSupport::StructuredSupport(const text::Tokenizer& tokenizer, const text::TokenizerConfig* config,
                                     int64_t vocab_size)
    : vocab_(grammar::Vocabulary::build(tokenizer, vocab_size)) {
  if (config) tools_ = probe_template(*config);
}

Result<std::shared_ptr<const grammar::CompiledGrammar>> StructuredSupport::compile(
    const std::string& key, const std::function<Result<grammar::Grammar>()>& build,
    const grammar::CompileOptions& options) {
  {
    std::lock_guard lk(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Built outside the lock: two requests with the same new grammar may both compile it (the second keeps its own).
  auto g = build();
  if (!g.ok()) return g.status();
  auto cg = grammar::CompiledGrammar::compile(std::move(g).value(), vocab_, options);
  if (!cg.ok()) return cg.status();
  std::lock_guard lk(mu_);
  if (index_.find(key) == index_.end()) {
    lru_.emplace_front(key, *cg);
    index_[key] = lru_.begin();
    if (lru_.size() > kCacheEntries) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
  }
  return *cg;
}

namespace {

class GrammarConstraint final : public engine::TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const grammar::CompiledGrammar> g, std::vector<int32_t> stops)
      : matcher_(std::move(g), std::move(stops)) {}
  Result<int64_t> allowed_tokens(std::span<uint32_t> allowed, int64_t remaining) override {
    return matcher_.fill_mask(allowed, remaining);
  }
  Status accept(int32_t token) override { return matcher_.accept(token); }

 private:
  grammar::Matcher matcher_;
};

}  // namespace

std::shared_ptr<engine::TokenConstraint> make_token_constraint(std::shared_ptr<const grammar::CompiledGrammar> grammar,
                                                               std::vector<int32_t> stop_tokens) {
  return std::make_shared<GrammarConstraint>(std::move(grammar), std::move(stop_tokens));
}

}  // namespace genbridge::serve
