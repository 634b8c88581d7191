#include "tools/fingerprint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "genbridge/build_info.h"
#include "runtime/checkpoint/config.h"
#include "runtime/checkpoint/safetensors.h"

namespace genbridge::tools {
namespace {

// 64-bit FNV-1a: small, stable across builds and machines, good enough to tell inputs apart (not a
// defence against someone crafting a collision).
class Fnv1a {
 public:
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ p[i]) * 0x100000001b3ull;
  }
  void add(std::string_view s) {
    add_u64(s.size());
    add(s.data(), s.size());
  }
  void add_u64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    add(b, 8);
  }
  std::string hex() const { return fmt::format("{:016x}", h_); }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

constexpr int kSamples = 64;
constexpr uint64_t kSampleBytes = 4096;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads exactly n bytes at `offset`; errno or EIO (short file) on failure, 0 on success.
int read_at(int fd, void* buf, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno;
    if (r == 0) return EIO;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return 0;
}

Status hash_file(const std::string& path, Fnv1a* h) {
  auto failed = [&](int e) {
    return unavailable(
        fmt::format("model weights: cannot read {} for the weight identity: {}", path, std::strerror(e)));
  };
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return failed(errno);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return failed(errno);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  h->add(std::filesystem::path(path).filename().string());
  h->add_u64(size);
  unsigned char len_bytes[8];
  if (int e = read_at(fd.get(), len_bytes, 8, 0)) return failed(e);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(len_bytes[i]) << (8 * i);
  // Checkpoint::open validated the file; a header past its end means it changed since.
  if (header_len > model::kSafetensorsMaxHeaderBytes || header_len > size - 8) return failed(EIO);
  std::string buf(header_len, '\0');
  if (int e = read_at(fd.get(), buf.data(), header_len, 8)) return failed(e);
  h->add(buf);
  const uint64_t data_begin = 8 + header_len, data_len = size - data_begin;
  if (data_len <= kSamples * kSampleBytes) {
    buf.resize(data_len);
    if (int e = read_at(fd.get(), buf.data(), data_len, data_begin)) return failed(e);
    h->add(buf);
    return ok_status();
  }
  buf.resize(kSampleBytes);
  for (int i = 0; i < kSamples; ++i) {
    const uint64_t offset = data_begin + (data_len - kSampleBytes) * static_cast<uint64_t>(i) / (kSamples - 1);
    if (int e = read_at(fd.get(), buf.data(), kSampleBytes, offset)) return failed(e);
    h->add(buf);
  }
  return ok_status();
}

std::string digest_of_prompts(const std::vector<std::vector<int32_t>>& prompts, int64_t* tokens) {
  Fnv1a h;
  *tokens = 0;
  h.add_u64(prompts.size());
  for (const auto& p : prompts) {
    h.add_u64(p.size());
    for (int32_t t : p) h.add_u64(static_cast<uint32_t>(t));
    *tokens += static_cast<int64_t>(p.size());
  }
  return h.hex();
}

}  // namespace

Result<std::string> weight_identity(const model::Checkpoint& checkpoint) {
  Fnv1a h;
  uint64_t bytes = 0;
  const auto& files = checkpoint.store().files();
  for (const auto& f : files) {
    GB_RETURN_IF_ERROR(hash_file(f->path(), &h));
    bytes += f->file_size();
  }
  return fmt::format("{} ({} file{}, {} bytes)", h.hex(), files.size(), files.size() == 1 ? "" : "s", bytes);
}

namespace {

// The items naming the build and the model (run's and serve's fingerprints both start with them).
Result<std::vector<afd::FingerprintItem>> model_identity(const RunOptions& o, const model::Checkpoint& checkpoint) {
  const model::ModelConfig& c = checkpoint.config();
  GB_ASSIGN_OR_RETURN(const std::string weights, weight_identity(checkpoint));
  Fnv1a config_hash;
  config_hash.add(model::to_config_json(c));
  const std::string not_given = "(not given)";
  return std::vector<afd::FingerprintItem>{
      {"build", fmt::format("{} ({})", ops::build_target(), ops::build_soc())},
      // Whether --model was given, not its path: nodes may mount the same checkpoint at different paths; the
      // config and weight identity below decide whether two checkpoints are the same.
      {"--model", o.model_dir.empty() ? std::string("(not given: the synthetic model of --preset)")
                                      : std::string("(given: a checkpoint directory)")},
      {"--preset", o.model_dir.empty() ? o.preset : not_given},
      {"--model-seed", o.model_dir.empty() ? std::to_string(o.model_seed) : not_given},
      {"model config (--model)",
       fmt::format("{} layers, hidden {}, heads {}/{} x {}, {} experts top-{}, vocab {} (config.json digest {})",
                   c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                   c.num_experts, c.num_experts_per_tok, c.vocab_size, config_hash.hex())},
      {"model weights (--model)", weights},
  };
}

}  // namespace

namespace {

// The one list of what the flags of a job give its ranks to agree on, in order: the model's identity,
// then each flag as typed. `requests` null: `serve`, whose requests come later over HTTP, so the flags of
// prompts, sampling and warm-up are not its own and are left out.
Result<std::vector<afd::FingerprintItem>> flag_fingerprint(const RunOptions& o, const model::Checkpoint& checkpoint,
                                                           const std::vector<engine::Request>* requests) {
  GB_ASSIGN_OR_RETURN(std::vector<afd::FingerprintItem> items, model_identity(o, checkpoint));
  const bool run = requests != nullptr;
  std::vector<std::vector<int32_t>> prompts;
  if (run) {
    for (const auto& r : *requests) prompts.push_back(r.prompt);
  }
  int64_t tokens = 0, typed_tokens = 0, text_tokens = 0;
  const std::string prompts_digest = digest_of_prompts(prompts, &tokens);
  const std::string typed_digest = digest_of_prompts(o.prompt_tokens, &typed_tokens);
  const std::string text_digest = digest_of_prompts(o.prompt_text_tokens, &text_tokens);
  const bool generated = o.prompts.empty() && o.prompt_texts.empty();
  const std::string not_given = "(not given)";
  auto or_not_given = [&](const std::string& v) { return v.empty() ? not_given : v; };
  auto counted = [](size_t n, int64_t t, const std::string& digest) {
    return fmt::format("{} prompt{}, {} tokens, digest {}", n, n == 1 ? "" : "s", t, digest);
  };
  struct Flag {
    bool run_only;  // a flag of `run` (and `afd-worker`) only
    afd::FingerprintItem item;
  };
  const Flag flags[] = {
      {true, {"--num-prompts", generated ? std::to_string(o.num_prompts) : not_given}},
      {true, {"--prompt-len", generated ? std::to_string(o.prompt_len) : not_given}},
      {true, {"--prompt", o.prompts.empty() ? not_given : counted(o.prompts.size(), typed_tokens, typed_digest)}},
      // The ids the model's tokenizer gave (ranks with different tokenizer.json files disagree here).
      {true,
       {"--prompt-text",
        o.prompt_texts.empty() ? not_given : counted(o.prompt_texts.size(), text_tokens, text_digest)}},
      {true,
       {"prompts",
        fmt::format("{} requests, {} tokens, digest {}", run ? requests->size() : 0, tokens, prompts_digest)}},
      {true, {"--max-new-tokens", std::to_string(o.max_new_tokens)}},
      {true, {"--stop-token", o.stop_tokens.empty() ? not_given : fmt::format("{}", fmt::join(o.stop_tokens, ","))}},
      {true, {"--temperature", fmt::format("{}", o.temperature)}},
      {true, {"--top-k", std::to_string(o.top_k)}},
      {true, {"--top-p", fmt::format("{}", o.top_p)}},
      {true, {"--seed", std::to_string(o.seed)}},
      {false, {"--max-batch", std::to_string(o.max_batch)}},
      {false, {"--max-num-batched-tokens", std::to_string(o.max_num_batched_tokens)}},
      {false, {"--preemption", o.preemption}},
      {false, {"--enable-prefix-caching", o.enable_prefix_caching ? "on" : "off"}},
      {false, {"--kv-cache-dtype", o.kv_cache_dtype}},
      {false, {"--weight-quant", o.weight_quant}},
      {false, {"--moe-dispatch", o.moe_dispatch}},
      {false, {"--kv-memory-mb", std::to_string(o.kv_memory_mb)}},
      {false, {"--afd", or_not_given(o.afd)}},
      {false, {"--afd-connector", o.afd_connector}},
      {false, {"--afd-stages", std::to_string(o.afd_stages)}},
      {false, {"--afd-timeout", fmt::format("{}", o.afd_timeout_s)}},
      {true, {"--afd-warmup-steps", std::to_string(o.afd_warmup_steps)}},
      {false, {"--afd-transport", o.afd_transport}},
      {false, {"--scheduling-policy", o.scheduling_policy}},
      {false, {"--afd-link-latency-us", std::to_string(o.afd_link_latency_us)}},
      {false, {"--afd-link-gbps", fmt::format("{}", o.afd_link_gbps)}},
      {false, {"--afd-redundant-experts", std::to_string(o.afd_redundant_experts)}},
  };
  for (const Flag& f : flags) {
    if (run || !f.run_only) items.push_back(f.item);
  }
  return items;
}

}  // namespace

Result<std::vector<afd::FingerprintItem>> run_fingerprint(const RunOptions& o, const model::Checkpoint& checkpoint,
                                                          const std::vector<engine::Request>& requests) {
  return flag_fingerprint(o, checkpoint, &requests);
}

Result<std::vector<afd::FingerprintItem>> serve_fingerprint(const RunOptions& o, const model::Checkpoint& checkpoint) {
  return flag_fingerprint(o, checkpoint, nullptr);
}

}  // namespace genbridge::tools
