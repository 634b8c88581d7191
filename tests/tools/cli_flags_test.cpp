// Every flag of `genbridge run`, `afd-worker`, `make-model` and `info` at its extremes (0, negative, huge,
// not a number, empty) and in the combinations that would silently ignore it, run on the built binary:
// the exit code, the exact message and that nothing was printed as a result. One table; each row is a
// ctest case (tools.cli_flags_test.Cli/Flags.refused/<row>).
//
// Placeholders in arguments and messages: $MODEL (a tiny checkpoint made once per process), $DIR (an
// empty scratch directory), $PHYS_MIB (this machine's physical memory in MiB).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/core/cpu_target.h"
#include "text/tokenizer.h"

#ifndef GENBRIDGE_CLI
#error "GENBRIDGE_CLI (the path of the genbridge binary) must be defined by tests/tools/CMakeLists.txt"
#endif

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
    s.replace(pos, from.size(), to);
  return s;
}

struct Env {
  std::string name, value;  // value "<unset>" unsets
};

// Runs the binary with `args` and `env` (GENBRIDGE_NUM_THREADS is unset unless given), optionally with a
// file size limit (a full disk), within 60 s.
Outcome run_cli(const std::vector<std::string>& args, const std::vector<Env>& env, const fs::path& scratch,
                long fsize_limit = -1, const fs::path& stdout_to = {}) {
  const fs::path out_path = stdout_to.empty() ? scratch / "stdout.txt" : stdout_to, err_path = scratch / "stderr.txt";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | (stdout_to.empty() ? O_TRUNC : 0), 0600);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out < 0 || err < 0) ::_exit(120);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::unsetenv("GENBRIDGE_NUM_THREADS");
    ::unsetenv("GENBRIDGE_SOC");
    ::setenv("GENBRIDGE_CACHE_DIR", (scratch / "cache").c_str(), 1);
    for (const Env& e : env) {
      if (e.value == "<unset>") {
        ::unsetenv(e.name.c_str());
      } else {
        ::setenv(e.name.c_str(), e.value.c_str(), 1);
      }
    }
    if (fsize_limit >= 0) {
      ::signal(SIGXFSZ, SIG_IGN);
      struct rlimit r;
      ::getrlimit(RLIMIT_FSIZE, &r);
      r.rlim_cur = static_cast<rlim_t>(fsize_limit);
      ::setrlimit(RLIMIT_FSIZE, &r);
    }
    std::vector<char*> argv;
    // GENBRIDGE_TEST_CLI runs the table against another binary (e.g. an older build, to see what it misses).
    const char* other = std::getenv("GENBRIDGE_TEST_CLI");
    std::string prog = other && *other ? other : GENBRIDGE_CLI;
    argv.push_back(prog.data());
    std::vector<std::string> copies = args;
    for (auto& a : copies) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(prog.c_str(), argv.data());
    ::_exit(127);
  }
  Outcome o;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "genbridge did not finish within 60 s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (stdout_to.empty()) o.out = slurp(out_path);
  o.err = slurp(err_path);
  return o;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

std::string phys_mib() {
  return std::to_string(static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE) >> 20);
}

// One tiny checkpoint per test process.
class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::temp_directory_path() / "genbridge_cli_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    model_ = root_ / "tiny";
    const Outcome o = run_cli({"make-model", "--preset", "tiny", "--seed", "1", model_.string()}, {}, root_);
    ASSERT_EQ(o.exit_code, 0) << o.err;
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  void SetUp() override {
    scratch_ = root_ / ("case" + std::to_string(++counter_));
    fs::create_directories(scratch_ / "dir");
  }
  std::string expand(const std::string& s) const {
    auto join = [](const std::vector<std::string>& v) {
      std::string j;
      for (const auto& x : v) j += (j.empty() ? "" : " ") + x;
      return j;
    };
    // $CPU_AVAILABLE / $CPU_COMPILED: this machine's CPU targets (genbridge/core/cpu_target.h).
    return replace_all(replace_all(replace_all(replace_all(replace_all(s, "$MODEL", model_.string()), "$DIR",
                                                           (scratch_ / "dir").string()),
                                               "$PHYS_MIB", phys_mib()),
                                   "$CPU_AVAILABLE", join(genbridge::cpu_targets_available())),
                       "$CPU_COMPILED", join(genbridge::cpu_targets_compiled()));
  }
  std::vector<std::string> expand(const std::vector<std::string>& v) const {
    std::vector<std::string> r;
    for (const auto& s : v) r.push_back(expand(s));
    return r;
  }
  Outcome run(const std::vector<std::string>& args, const std::vector<Env>& env = {}, long fsize = -1) const {
    return run_cli(expand(args), env, scratch_, fsize);
  }
  static inline fs::path root_, model_;
  static inline int counter_ = 0;
  fs::path scratch_;
};

// ---------------------------------------------------------------------------------------------------
// The table: arguments, environment, exit code and the exact line stderr must hold.

struct Row {
  const char* name;
  std::vector<std::string> args;
  int exit_code;
  std::string message;
  std::vector<Env> env = {};
};

std::ostream& operator<<(std::ostream& os, const Row& r) { return os << r.name; }

const std::string kHelp = "Run with --help for more information.";
// A run on the tiny model, quiet, small: the flags under test are appended (and replace the small sizes).
std::vector<std::string> R(std::vector<std::string> more) {
  std::vector<std::string> a{"run", "--model", "$MODEL", "--quiet"};
  for (const char* f : {"--max-new-tokens", "--num-prompts", "--prompt-len"}) {
    if (std::find(more.begin(), more.end(), f) != more.end()) continue;
    a.push_back(f);
    a.push_back(std::string(f) == "--prompt-len" ? "3" : "2");
  }
  a.insert(a.end(), more.begin(), more.end());
  return a;
}
// The same without --num-prompts/--prompt-len (for rows that set them or use --prompt).
std::vector<std::string> Rbare(std::vector<std::string> more) {
  std::vector<std::string> a{"run", "--model", "$MODEL", "--quiet", "--max-new-tokens", "2"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}
// `serve` on the tiny model on a port it can never bind (the rows must fail before listening).
std::vector<std::string> S(std::vector<std::string> more) {
  std::vector<std::string> a{"serve", "--model", "$MODEL", "--quiet", "--host", "256.0.0.1", "--port", "0"};
  for (size_t i = 0; i + 1 < more.size(); ++i) {
    if (more[i] == "--port") a.resize(a.size() - 2);  // the row's own --port
  }
  a.insert(a.end(), more.begin(), more.end());
  return a;
}
std::vector<std::string> W(std::vector<std::string> more) {
  std::vector<std::string> a{"afd-worker", "--model", "$MODEL", "--quiet"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// `flag value` n times.
std::vector<std::string> repeated(const std::string& flag, const std::string& value, int n) {
  std::vector<std::string> a;
  for (int i = 0; i < n; ++i) {
    a.push_back(flag);
    a.push_back(value);
  }
  return a;
}

const std::string kIds = "; expected comma-separated token ids in [0, 2147483647]";
const std::string kU64 = ": expected an integer in [0, 18446744073709551615]";
const std::string kTemp = ": expected 0 or a number in [1.1754944e-38, 3.4028235e+38]";
const std::string kTopP = ": expected a number in [1.1754944e-38, 1]";

const std::vector<Row> kRows = {
    // --model
    {"model_empty", {"run", "--model", ""}, 2, "genbridge run: --model '': the value is empty"},
    // --preset, --model-seed: the synthetic model; an error with --model
    {"preset_empty", R({"--preset", ""}), 2,
     "genbridge run: --preset '': expected one of tiny | tiny-gemma | small | tiny-dsa | "
     "tiny-dsv3 | tiny-dsv3-noq | small-dsa | tiny-qwen35 | tiny-qwen35-split | small-qwen35 | tiny-dsv4 | "
     "small-dsv4"},
    {"preset_unknown", R({"--preset", "huge"}), 2,
     "genbridge run: --preset huge: expected one of tiny | tiny-gemma | small | tiny-dsa | "
     "tiny-dsv3 | tiny-dsv3-noq | small-dsa | tiny-qwen35 | tiny-qwen35-split | small-qwen35 | tiny-dsv4 | "
     "small-dsv4"},
    {"preset_with_model", R({"--preset", "tiny"}), 2,
     "genbridge run: --preset chooses the synthetic model, which is not used with --model $MODEL; drop one of them"},
    {"model_seed_negative", R({"--model-seed", "-1"}), 2, "genbridge run: --model-seed -1" + kU64},
    {"model_seed_huge", R({"--model-seed", "18446744073709551616"}), 2,
     "genbridge run: --model-seed 18446744073709551616" + kU64},
    {"model_seed_not_a_number", R({"--model-seed", "x"}), 2, "genbridge run: --model-seed x" + kU64},
    {"model_seed_empty", R({"--model-seed", ""}), 2, "genbridge run: --model-seed ''" + kU64},
    {"model_seed_with_model", R({"--model-seed", "3"}), 2,
     "genbridge run: --model-seed chooses the synthetic model, which is not used with --model $MODEL; drop one of "
     "them"},
    // --num-prompts
    {"num_prompts_zero", Rbare({"--num-prompts", "0"}), 2,
     "genbridge run: --num-prompts 0: expected an integer in [1, 4096]"},
    {"num_prompts_negative", Rbare({"--num-prompts", "-1"}), 2,
     "genbridge run: --num-prompts -1: expected an integer in [1, 4096]"},
    {"num_prompts_huge", Rbare({"--num-prompts", "99999999999"}), 2,
     "genbridge run: --num-prompts 99999999999: expected an integer in [1, 4096]"},
    {"num_prompts_not_a_number", Rbare({"--num-prompts", "8x"}), 2,
     "genbridge run: --num-prompts 8x: expected an integer in [1, 4096]"},
    {"num_prompts_empty", Rbare({"--num-prompts", ""}), 2,
     "genbridge run: --num-prompts '': expected an integer in [1, 4096]"},
    {"num_prompts_with_prompt", Rbare({"--num-prompts", "2", "--prompt", "1,2"}), 2,
     "genbridge run: --num-prompts shapes the generated prompts, which are not used with --prompt; drop one of them"},
    // --prompt-len
    {"prompt_len_zero", Rbare({"--prompt-len", "0"}), 2,
     "genbridge run: --prompt-len 0: expected an integer in [1, 1048576]"},
    {"prompt_len_negative", Rbare({"--prompt-len", "-5"}), 2,
     "genbridge run: --prompt-len -5: expected an integer in [1, 1048576]"},
    {"prompt_len_huge", Rbare({"--prompt-len", "1048577"}), 2,
     "genbridge run: --prompt-len 1048577: expected an integer in [1, 1048576]"},
    {"prompt_len_not_a_number", Rbare({"--prompt-len", "1.5"}), 2,
     "genbridge run: --prompt-len 1.5: expected an integer in [1, 1048576]"},
    {"prompt_len_empty", Rbare({"--prompt-len", ""}), 2,
     "genbridge run: --prompt-len '': expected an integer in [1, 1048576]"},
    {"prompt_len_with_prompt", Rbare({"--prompt-len", "4", "--prompt", "1"}), 2,
     "genbridge run: --prompt-len shapes the generated prompts, which are not used with --prompt; drop one of them"},
    {"prompt_len_past_max_positions", Rbare({"--prompt-len", "4095"}), 2,
     "genbridge run: --prompt-len 4095 + --max-new-tokens 2 = 4097 tokens exceeds the model's max_position_embeddings "
     "(4096)"},
    // --prompt (before: 4294967297 decoded as token 1, 99999999999999999999 as -1, "1,2," was accepted)
    {"prompt_wraps_32_bits", Rbare({"--prompt", "4294967297"}), 2,
     "genbridge run: --prompt 4294967297: item 1 (4294967297) is not a token id" + kIds},
    {"prompt_huge", Rbare({"--prompt", "99999999999999999999"}), 2,
     "genbridge run: --prompt 99999999999999999999: item 1 (99999999999999999999) is not a token id" + kIds},
    {"prompt_negative", Rbare({"--prompt", "-1"}), 2,
     "genbridge run: --prompt -1: item 1 (-1) is not a token id" + kIds},
    {"prompt_trailing_comma", Rbare({"--prompt", "1,2,"}), 2, "genbridge run: --prompt 1,2,: item 3 is empty" + kIds},
    {"prompt_leading_comma", Rbare({"--prompt", ",1"}), 2, "genbridge run: --prompt ,1: item 1 is empty" + kIds},
    {"prompt_double_comma", Rbare({"--prompt", "1,,2"}), 2, "genbridge run: --prompt 1,,2: item 2 is empty" + kIds},
    {"prompt_not_a_number", Rbare({"--prompt", "1,x"}), 2,
     "genbridge run: --prompt 1,x: item 2 (x) is not a token id" + kIds},
    {"prompt_spaces", Rbare({"--prompt", "1, 2"}), 2,
     "genbridge run: --prompt 1, 2: item 2 ( 2) is not a token id" + kIds},
    {"prompt_empty", Rbare({"--prompt", ""}), 2, "genbridge run: --prompt '': the prompt is empty" + kIds},
    {"prompt_outside_vocabulary", Rbare({"--prompt", "1,512"}), 2,
     "genbridge run: --prompt 1,512: token 512 is outside the model's vocabulary [0, 512)"},
    {"prompt_past_max_positions",
     {"run", "--model", "$MODEL", "--quiet", "--prompt", "1,2,3", "--max-new-tokens", "4094"},
     2,
     "genbridge run: --prompt 1,2,3 (3 tokens) + --max-new-tokens 4094 = 4097 tokens exceeds the model's "
     "max_position_embeddings (4096)"},
    // --prompt-text (encoded with the model's tokenizer.json; one line per message whatever the text)
    {"prompt_text_empty", Rbare({"--prompt-text", ""}), 2, "genbridge run: --prompt-text '': the prompt is empty"},
    {"prompt_text_empty_after_a_good_one", Rbare({"--prompt-text", "hi", "--prompt-text", ""}), 2,
     "genbridge run: --prompt-text '': the prompt is empty"},
    {"prompt_text_with_prompt", Rbare({"--prompt-text", "hi", "--prompt", "1,2"}), 2,
     "genbridge run: --prompt and --prompt-text both give the prompts; use one of them"},
    {"prompt_text_with_num_prompts", Rbare({"--prompt-text", "hi", "--num-prompts", "2"}), 2,
     "genbridge run: --num-prompts shapes the generated prompts, which are not used with --prompt-text; drop one of "
     "them"},
    {"prompt_text_with_prompt_len", Rbare({"--prompt-text", "hi", "--prompt-len", "3"}), 2,
     "genbridge run: --prompt-len shapes the generated prompts, which are not used with --prompt-text; drop one of "
     "them"},
    {"prompt_text_too_many", Rbare(repeated("--prompt-text", "hi", 4097)), 2,
     "genbridge run: --prompt-text is given 4097 times; at most 4096 prompts"},
    {"prompt_text_invalid_utf8", Rbare({"--prompt-text", "ok\xff"}), 2,
     "genbridge run: --prompt-text \"ok\xef\xbf\xbd\": encode: input is not valid UTF-8: byte 0xff at byte offset 2 "
     "starts not a valid first byte here"},
    {"prompt_text_past_max_positions",
     {"run", "--model", "$MODEL", "--quiet", "--prompt-text", "hello world\n\t\"x\"", "--max-new-tokens", "4094"},
     2,
     "genbridge run: --prompt-text \"hello world\\n\\t\\\"x\\\"\" (9 tokens) + --max-new-tokens 4094 = 4103 tokens "
     "exceeds the model's max_position_embeddings (4096)"},
    {"worker_prompt_text_empty", W({"--prompt-text", ""}), 2,
     "genbridge afd-worker: --prompt-text '': the prompt is empty"},
    // --max-new-tokens
    {"max_new_tokens_zero", R({"--max-new-tokens", "0"}), 2,
     "genbridge run: --max-new-tokens 0: expected an integer in [1, 1048576]"},
    {"max_new_tokens_negative", R({"--max-new-tokens", "-1"}), 2,
     "genbridge run: --max-new-tokens -1: expected an integer in [1, 1048576]"},
    {"max_new_tokens_huge", R({"--max-new-tokens", "4294967298"}), 2,
     "genbridge run: --max-new-tokens 4294967298: expected an integer in [1, 1048576]"},
    {"max_new_tokens_not_a_number", R({"--max-new-tokens", "two"}), 2,
     "genbridge run: --max-new-tokens two: expected an integer in [1, 1048576]"},
    {"max_new_tokens_empty", R({"--max-new-tokens", ""}), 2,
     "genbridge run: --max-new-tokens '': expected an integer in [1, 1048576]"},
    // --stop-token (before: -5 and 99999 were accepted)
    {"stop_token_negative", R({"--stop-token", "-5"}), 2,
     "genbridge run: --stop-token -5: expected an integer in [0, 2147483647]"},
    {"stop_token_outside_vocabulary", R({"--stop-token", "99999"}), 2,
     "genbridge run: --stop-token 99999: expected a token id in [0, 512) (the model's vocabulary)"},
    {"stop_token_vocabulary_size", R({"--stop-token", "5", "--stop-token", "512"}), 2,
     "genbridge run: --stop-token 512: expected a token id in [0, 512) (the model's vocabulary)"},
    {"stop_token_huge", R({"--stop-token", "2147483648"}), 2,
     "genbridge run: --stop-token 2147483648: expected an integer in [0, 2147483647]"},
    {"stop_token_not_a_number", R({"--stop-token", "eos"}), 2,
     "genbridge run: --stop-token eos: expected an integer in [0, 2147483647]"},
    {"stop_token_empty", R({"--stop-token", ""}), 2,
     "genbridge run: --stop-token '': expected an integer in [0, 2147483647]"},
    // --temperature: 0 or a normal float (before: 3.5e38 became +inf and 1e-300 became 0 after the check, so
    // the run failed with exit 1 or turned greedy)
    {"temperature_negative", R({"--temperature", "-1"}), 2, "genbridge run: --temperature -1" + kTemp},
    {"temperature_nan", R({"--temperature", "nan"}), 2, "genbridge run: --temperature nan" + kTemp},
    {"temperature_inf", R({"--temperature", "inf"}), 2, "genbridge run: --temperature inf" + kTemp},
    {"temperature_huge", R({"--temperature", "1e400"}), 2, "genbridge run: --temperature 1e400" + kTemp},
    {"temperature_past_float", R({"--temperature", "3.5e38"}), 2, "genbridge run: --temperature 3.5e38" + kTemp},
    {"temperature_underflows_to_zero", R({"--temperature", "1e-300"}), 2,
     "genbridge run: --temperature 1e-300" + kTemp},
    {"temperature_subnormal", R({"--temperature", "1e-40"}), 2, "genbridge run: --temperature 1e-40" + kTemp},
    {"temperature_tiny_negative", R({"--temperature", "-1e-50"}), 2, "genbridge run: --temperature -1e-50" + kTemp},
    {"temperature_hex", R({"--temperature", "0x1p0"}), 2, "genbridge run: --temperature 0x1p0" + kTemp},
    {"temperature_not_a_number", R({"--temperature", "hot"}), 2, "genbridge run: --temperature hot" + kTemp},
    {"temperature_empty", R({"--temperature", ""}), 2, "genbridge run: --temperature ''" + kTemp},
    {"worker_temperature_past_float", W({"--afd", "1A1F", "--temperature", "3.5e38"}), 2,
     "genbridge afd-worker: --temperature 3.5e38" + kTemp},
    // --top-k
    {"top_k_negative", R({"--top-k", "-3"}), 2, "genbridge run: --top-k -3: expected an integer in [0, 2147483647]"},
    {"top_k_huge", R({"--top-k", "2147483648"}), 2,
     "genbridge run: --top-k 2147483648: expected an integer in [0, 2147483647]"},
    {"top_k_not_an_integer", R({"--top-k", "2.5"}), 2,
     "genbridge run: --top-k 2.5: expected an integer in [0, 2147483647]"},
    {"top_k_exponent", R({"--top-k", "1e3"}), 2, "genbridge run: --top-k 1e3: expected an integer in [0, 2147483647]"},
    {"top_k_not_a_number", R({"--top-k", "all"}), 2,
     "genbridge run: --top-k all: expected an integer in [0, 2147483647]"},
    {"top_k_empty", R({"--top-k", ""}), 2, "genbridge run: --top-k '': expected an integer in [0, 2147483647]"},
    // --top-p: a normal float in (0, 1] (before: 1e-46 became 0 after the check and the run failed, exit 1)
    {"top_p_zero", R({"--top-p", "0"}), 2, "genbridge run: --top-p 0" + kTopP},
    {"top_p_negative_zero", R({"--top-p", "-0"}), 2, "genbridge run: --top-p -0" + kTopP},
    {"top_p_underflows_to_zero", R({"--top-p", "1e-46"}), 2, "genbridge run: --top-p 1e-46" + kTopP},
    {"top_p_tiny", R({"--top-p", "1e-300"}), 2, "genbridge run: --top-p 1e-300" + kTopP},
    {"top_p_subnormal", R({"--top-p", "1e-40"}), 2, "genbridge run: --top-p 1e-40" + kTopP},
    {"top_p_huge", R({"--top-p", "1e400"}), 2, "genbridge run: --top-p 1e400" + kTopP},
    {"top_p_negative", R({"--top-p", "-0.5"}), 2, "genbridge run: --top-p -0.5" + kTopP},
    {"top_p_above_one", R({"--top-p", "1.5"}), 2, "genbridge run: --top-p 1.5" + kTopP},
    {"top_p_nan", R({"--top-p", "nan"}), 2, "genbridge run: --top-p nan" + kTopP},
    {"top_p_not_a_number", R({"--top-p", "x"}), 2, "genbridge run: --top-p x" + kTopP},
    {"top_p_empty", R({"--top-p", ""}), 2, "genbridge run: --top-p ''" + kTopP},
    {"worker_top_p_underflows_to_zero", W({"--afd", "1A1F", "--top-p", "1e-46"}), 2,
     "genbridge afd-worker: --top-p 1e-46" + kTopP},
    // --seed
    {"seed_negative", R({"--seed", "-1"}), 2, "genbridge run: --seed -1" + kU64},
    {"seed_huge", R({"--seed", "18446744073709551616"}), 2, "genbridge run: --seed 18446744073709551616" + kU64},
    {"seed_not_a_number", R({"--seed", "0x10"}), 2, "genbridge run: --seed 0x10" + kU64},
    {"seed_not_an_integer", R({"--seed", "1.5"}), 2, "genbridge run: --seed 1.5" + kU64},
    {"seed_exponent", R({"--seed", "1e3"}), 2, "genbridge run: --seed 1e3" + kU64},
    {"seed_empty", R({"--seed", ""}), 2, "genbridge run: --seed ''" + kU64},
    // --max-batch
    {"max_batch_zero", R({"--max-batch", "0"}), 2, "genbridge run: --max-batch 0: expected an integer in [1, 4096]"},
    {"max_batch_negative", R({"--max-batch", "-2"}), 2,
     "genbridge run: --max-batch -2: expected an integer in [1, 4096]"},
    {"max_batch_huge", R({"--max-batch", "4097"}), 2,
     "genbridge run: --max-batch 4097: expected an integer in [1, 4096]"},
    {"max_batch_not_a_number", R({"--max-batch", "x"}), 2,
     "genbridge run: --max-batch x: expected an integer in [1, 4096]"},
    {"max_batch_empty", R({"--max-batch", ""}), 2, "genbridge run: --max-batch '': expected an integer in [1, 4096]"},
    // --kv-memory-mb (before: -1 meant unlimited, 8796093022208 reported a negative budget, 100000000 took 12 s)
    {"kv_memory_negative", R({"--kv-memory-mb", "-1"}), 2,
     "genbridge run: --kv-memory-mb -1: expected an integer in [0, 8796093022207]"},
    {"kv_memory_overflows_bytes", R({"--kv-memory-mb", "8796093022208"}), 2,
     "genbridge run: --kv-memory-mb 8796093022208: expected an integer in [0, 8796093022207]"},
    {"kv_memory_past_physical_memory", R({"--kv-memory-mb", "100000000"}), 2,
     "genbridge run: --kv-memory-mb 100000000: more than this machine's physical memory ($PHYS_MIB MiB)"},
    {"kv_memory_not_a_number", R({"--kv-memory-mb", "1G"}), 2,
     "genbridge run: --kv-memory-mb 1G: expected an integer in [0, 8796093022207]"},
    {"kv_memory_empty", R({"--kv-memory-mb", ""}), 2,
     "genbridge run: --kv-memory-mb '': expected an integer in [0, 8796093022207]"},
    // --kv-cache-dtype
    {"kv_cache_dtype_unknown", R({"--kv-cache-dtype", "fp4"}), 2,
     "genbridge run: --kv-cache-dtype fp4: expected one of auto | bf16 | quantized"},
    {"kv_cache_dtype_empty", R({"--kv-cache-dtype", ""}), 2,
     "genbridge run: --kv-cache-dtype '': expected one of auto | bf16 | quantized"},
    // --weight-quant
    {"weight_quant_unknown", R({"--weight-quant", "int4"}), 2,
     "genbridge run: --weight-quant int4: expected one of none | auto | w8a8 | mxfp8 | mxfp4"},
    // --moe-dispatch
    {"moe_dispatch_unknown", R({"--moe-dispatch", "int8"}), 2,
     "genbridge run: --moe-dispatch int8: expected one of bf16 | quantized"},
    // --soc
    {"soc_empty", R({"--soc", ""}), 2, "genbridge run: --soc '': the value is empty"},
    // --threads (before: -1 was accepted)
    {"threads_negative", R({"--threads", "-1"}), 2, "genbridge run: --threads -1: expected an integer in [0, 255]"},
    {"threads_huge", R({"--threads", "256"}), 2, "genbridge run: --threads 256: expected an integer in [0, 255]"},
    {"threads_not_a_number", R({"--threads", "many"}), 2,
     "genbridge run: --threads many: expected an integer in [0, 255]"},
    {"threads_empty", R({"--threads", ""}), 2, "genbridge run: --threads '': expected an integer in [0, 255]"},
    // GENBRIDGE_NUM_THREADS (before: abc and -3 were ignored silently)
    {"num_threads_env_not_a_number",
     R({}),
     2,
     "genbridge run: GENBRIDGE_NUM_THREADS=abc: expected an integer in [1, 255] (unset it to use every core)",
     {{"GENBRIDGE_NUM_THREADS", "abc"}}},
    {"num_threads_env_negative",
     R({}),
     2,
     "genbridge run: GENBRIDGE_NUM_THREADS=-3: expected an integer in [1, 255] (unset it to use every core)",
     {{"GENBRIDGE_NUM_THREADS", "-3"}}},
    {"num_threads_env_zero",
     R({}),
     2,
     "genbridge run: GENBRIDGE_NUM_THREADS=0: expected an integer in [1, 255] (unset it to use every core)",
     {{"GENBRIDGE_NUM_THREADS", "0"}}},
    // GENBRIDGE_CPU_TARGET: a target this build or this CPU cannot run is refused, naming what can.
    {"run_env_cpu_target",
     R({}),
     2,
     "genbridge run: GENBRIDGE_CPU_TARGET=avx9: not a CPU target this machine can run; available: $CPU_AVAILABLE (or "
     "best); "
     "compiled into this build: $CPU_COMPILED",
     {{"GENBRIDGE_CPU_TARGET", "avx9"}}},
    // --dump-logits and --trace: checked before decoding
    {"dump_logits_empty", R({"--dump-logits", ""}), 2, "genbridge run: --dump-logits '': the value is empty"},
    {"dump_logits_directory", R({"--dump-logits", "$DIR"}), 2,
     "genbridge run: --dump-logits $DIR: is a directory; expected a file name"},
    {"dump_logits_missing_directory", R({"--dump-logits", "$DIR/missing/x.npy"}), 2,
     "genbridge run: --dump-logits $DIR/missing/x.npy: the directory $DIR/missing does not exist"},
    {"trace_empty", R({"--afd", "1A1F", "--trace", ""}), 2, "genbridge run: --trace '': the value is empty"},
    {"trace_directory", R({"--afd", "1A1F", "--trace", "$DIR"}), 2,
     "genbridge run: --trace $DIR: is a directory; expected a file name"},
    {"trace_missing_directory", R({"--afd", "1A1F", "--trace", "$DIR/missing/t.json"}), 2,
     "genbridge run: --trace $DIR/missing/t.json: the directory $DIR/missing does not exist"},
    {"trace_and_dump_same_file", R({"--afd", "1A1F", "--trace", "$DIR/x", "--dump-logits", "$DIR/x"}), 2,
     "genbridge run: --trace $DIR/x and --dump-logits $DIR/x name the same file"},
    // --dump-choices: checked like --dump-logits
    {"dump_choices_empty", R({"--dump-choices", ""}), 2, "genbridge run: --dump-choices '': the value is empty"},
    {"dump_choices_directory", R({"--dump-choices", "$DIR"}), 2,
     "genbridge run: --dump-choices $DIR: is a directory; expected a file name"},
    {"dump_choices_missing_directory", R({"--dump-choices", "$DIR/missing/c.jsonl"}), 2,
     "genbridge run: --dump-choices $DIR/missing/c.jsonl: the directory $DIR/missing does not exist"},
    {"dump_choices_stdout", R({"--dump-choices", "/dev/stdout"}), 2,
     "genbridge run: --dump-choices /dev/stdout: is this process's standard output, where the results are printed"},
    {"dump_choices_and_logits_same_file", R({"--dump-logits", "$DIR/x", "--dump-choices", "$DIR/x"}), 2,
     "genbridge run: --dump-logits $DIR/x and --dump-choices $DIR/x name the same file"},
    {"afd_dump_choices_directory", R({"--afd", "2A1F", "--dump-choices", "$DIR"}), 2,
     "genbridge run: --dump-choices $DIR: is a directory; expected a file name"},
    // --afd
    {"afd_empty", R({"--afd", ""}), 2, "genbridge run: --afd '': the value is empty"},
    {"afd_malformed", R({"--afd", "2X"}), 2,
     "genbridge run: --afd 2X: expected <A>A<F>F with A attention ranks in [1, 64] and F FFN ranks in [1, 64], e.g. "
     "2A1F"},
    {"afd_zero_ranks", R({"--afd", "0A1F"}), 2,
     "genbridge run: --afd 0A1F: expected <A>A<F>F with A attention ranks in [1, 64] and F FFN ranks in [1, 64], e.g. "
     "2A1F"},
    {"afd_negative_ranks", R({"--afd", "2A-1F"}), 2,
     "genbridge run: --afd 2A-1F: expected <A>A<F>F with A attention ranks in [1, 64] and F FFN ranks in [1, 64], e.g. "
     "2A1F"},
    {"afd_too_many_ranks", R({"--afd", "65A1F"}), 2,
     "genbridge run: --afd 65A1F: expected <A>A<F>F with A attention ranks in [1, 64] and F FFN ranks in [1, 64], e.g. "
     "2A1F"},
    {"afd_huge", R({"--afd", "99999999999A1F"}), 2,
     "genbridge run: --afd 99999999999A1F: expected <A>A<F>F with A attention ranks in [1, 64] and F FFN ranks in [1, "
     "64], e.g. 2A1F"},
    {"afd_experts_not_divisible", R({"--afd", "1A3F"}), 2,
     "genbridge run: --afd 1A3F: the model's 8 experts cannot be split evenly over 3 FFN ranks"},
    // --afd-* flags: ranges, and an error without --afd (before: --afd-stages 4 without --afd was ignored)
    {"afd_stages_zero", R({"--afd", "1A1F", "--afd-stages", "0"}), 2,
     "genbridge run: --afd-stages 0: expected an integer in [1, 3]"},
    {"afd_stages_huge", R({"--afd", "1A1F", "--afd-stages", "4"}), 2,
     "genbridge run: --afd-stages 4: expected an integer in [1, 3]"},
    {"afd_stages_negative", R({"--afd", "1A1F", "--afd-stages", "-1"}), 2,
     "genbridge run: --afd-stages -1: expected an integer in [1, 3]"},
    {"afd_stages_not_a_number", R({"--afd", "1A1F", "--afd-stages", "two"}), 2,
     "genbridge run: --afd-stages two: expected an integer in [1, 3]"},
    {"afd_stages_empty", R({"--afd", "1A1F", "--afd-stages", ""}), 2,
     "genbridge run: --afd-stages '': expected an integer in [1, 3]"},
    {"afd_stages_without_afd", R({"--afd-stages", "2"}), 2,
     "genbridge run: --afd-stages applies to AFD runs only; add --afd (the topology, e.g. 2A1F) or drop --afd-stages"},
    {"afd_connector_unknown", R({"--afd", "1A1F", "--afd-connector", "rdma"}), 2,
     "genbridge run: --afd-connector rdma: expected one of sync | async"},
    {"afd_connector_without_afd", R({"--afd-connector", "async"}), 2,
     "genbridge run: --afd-connector applies to AFD runs only; add --afd (the topology, e.g. 2A1F) or drop "
     "--afd-connector"},
    {"afd_transport_mpi_in_run", R({"--afd", "1A1F", "--afd-transport", "mpi"}), 2,
     "genbridge run: --afd-transport mpi: `genbridge run` runs every rank in this process (inproc); for MPI launch "
     "ranks with mpirun and `genbridge afd-worker` (see docs/afd_mpi.md)"},
    {"afd_transport_unknown", R({"--afd", "1A1F", "--afd-transport", "tcp"}), 2,
     "genbridge run: --afd-transport tcp: expected one of inproc | mpi"},
    {"afd_transport_without_afd", R({"--afd-transport", "inproc"}), 2,
     "genbridge run: --afd-transport applies to AFD runs only; add --afd (the topology, e.g. 2A1F) or drop "
     "--afd-transport"},
    // --afd-timeout (before: nan, inf and 1e300 reported "'timeout_ms' is -9223372036854775808")
    {"afd_timeout_nan", R({"--afd", "1A1F", "--afd-timeout", "nan"}), 2,
     "genbridge run: --afd-timeout nan: expected a number of seconds in [0.001, 86400]"},
    {"afd_timeout_inf", R({"--afd", "1A1F", "--afd-timeout", "inf"}), 2,
     "genbridge run: --afd-timeout inf: expected a number of seconds in [0.001, 86400]"},
    {"afd_timeout_huge", R({"--afd", "1A1F", "--afd-timeout", "1e300"}), 2,
     "genbridge run: --afd-timeout 1e300: expected a number of seconds in [0.001, 86400]"},
    {"afd_timeout_zero", R({"--afd", "1A1F", "--afd-timeout", "0"}), 2,
     "genbridge run: --afd-timeout 0: expected a number of seconds in [0.001, 86400]"},
    {"afd_timeout_negative", R({"--afd", "1A1F", "--afd-timeout", "-1"}), 2,
     "genbridge run: --afd-timeout -1: expected a number of seconds in [0.001, 86400]"},
    {"afd_timeout_not_a_number", R({"--afd", "1A1F", "--afd-timeout", "30s"}), 2,
     "genbridge run: --afd-timeout 30s: expected a number of seconds in [0.001, 86400]"},
    {"afd_timeout_empty", R({"--afd", "1A1F", "--afd-timeout", ""}), 2,
     "genbridge run: --afd-timeout '': expected a number of seconds in [0.001, 86400]"},
    // the link model's flags
    {"afd_link_latency_negative", R({"--afd", "1A1F", "--afd-link-latency-us", "-1"}), 2,
     "genbridge run: --afd-link-latency-us -1: expected an integer in [0, 10000000]"},
    {"afd_link_latency_huge", R({"--afd", "1A1F", "--afd-link-latency-us", "10000001"}), 2,
     "genbridge run: --afd-link-latency-us 10000001: expected an integer in [0, 10000000]"},
    {"afd_link_gbps_below_resolution", R({"--afd", "1A1F", "--afd-link-gbps", "0.0001"}), 2,
     "genbridge run: --afd-link-gbps 0.0001: below the model's resolution of 0.001 Gb/s (1 Mb/s); 0 means unlimited"},
    {"afd_link_gbps_huge", R({"--afd", "1A1F", "--afd-link-gbps", "1e7"}), 2,
     "genbridge run: --afd-link-gbps 1e7: expected a number in [0, 1000000]"},
    {"afd_link_gbps_nan", R({"--afd", "1A1F", "--afd-link-gbps", "nan"}), 2,
     "genbridge run: --afd-link-gbps nan: expected a number in [0, 1000000]"},
    {"afd_link_latency_without_afd", R({"--afd-link-latency-us", "170"}), 2,
     "genbridge run: --afd-link-latency-us applies to AFD runs only; add --afd (the topology, e.g. 2A1F) or drop "
     "--afd-link-latency-us"},
    {"afd_link_past_the_timeout", R({"--afd", "1A1F", "--afd-timeout", "0.1", "--afd-link-latency-us", "200000"}), 1,
     "genbridge run: InvalidArgument: afd config: over the link model ('link_latency_us' 200000, 'link_bandwidth_mbps' "
     "0) one stage's largest transfer (2097152 bytes) would take 200.000 ms, at least 'timeout_ms' (100)"},
    {"serve_afd_link_gbps_negative", S({"--afd", "1A1F", "--afd-link-gbps", "-1"}), 2,
     "genbridge serve: --afd-link-gbps -1: expected a number in [0, 1000000]"},
    {"max_num_batched_tokens_negative", R({"--max-num-batched-tokens", "-1"}), 2,
     "genbridge run: --max-num-batched-tokens -1: expected an integer in [0, 1048576]"},
    {"max_num_batched_tokens_huge", R({"--max-num-batched-tokens", "1048577"}), 2,
     "genbridge run: --max-num-batched-tokens 1048577: expected an integer in [0, 1048576]"},
    {"serve_max_num_batched_tokens_not_a_number", S({"--max-num-batched-tokens", "many"}), 2,
     "genbridge serve: --max-num-batched-tokens many: expected an integer in [0, 1048576]"},
    {"max_num_seqs_and_max_batch", R({"--max-num-seqs", "4", "--max-batch", "4"}), 2,
     "genbridge run: --max-num-seqs is --max-batch under vLLM's name; give one of them"},
    {"serve_max_num_seqs_zero", S({"--max-num-seqs", "0"}), 2,
     "genbridge serve: --max-num-seqs 0: expected an integer in [1, 4096]"},
    {"enable_prefix_caching_with_dump_choices", R({"--enable-prefix-caching", "--dump-choices", "/tmp/choices.jsonl"}), 2,
     "genbridge run: --enable-prefix-caching and --dump-choices: a cached prefix's routing is not computed again, so "
     "the dump would miss it; drop one of them"},
    {"enable_prefix_caching_qwen35",
     {"run", "--preset", "tiny-qwen35", "--quiet", "--enable-prefix-caching", "--max-new-tokens", "2"}, 2,
     "genbridge run: --enable-prefix-caching: this Qwen3.5 model keeps per-sequence state (Gated DeltaNet's) that a "
     "cached KV page does not hold; drop the flag"},
    {"preemption_unknown", R({"--preemption", "swap"}), 2,
     "genbridge run: --preemption swap: expected one of off | recompute"},
    {"serve_preemption_empty", S({"--preemption", ""}), 2,
     "genbridge serve: --preemption '': expected one of off | recompute"},
    // redundant experts
    {"afd_redundant_experts_without_load", R({"--afd", "1A2F", "--afd-redundant-experts", "2"}), 2,
     "genbridge run: --afd-redundant-experts 2 needs --afd-expert-load FILE: the copies go to the experts a measured "
     "load shows hottest (write one with genbridge run --afd ... --afd-expert-load-out FILE)"},
    {"afd_expert_load_without_redundant_experts", R({"--afd", "1A2F", "--afd-expert-load", "$DIR/load.json"}), 2,
     "genbridge run: --afd-expert-load $DIR/load.json places redundant experts; give --afd-redundant-experts N (N > "
     "0) or drop it"},
    {"afd_redundant_experts_without_afd", R({"--afd-redundant-experts", "2"}), 2,
     "genbridge run: --afd-redundant-experts applies to AFD runs only; add --afd (the topology, e.g. 2A1F) or drop "
     "--afd-redundant-experts"},
    {"afd_expert_load_missing_file",
     R({"--afd", "1A2F", "--afd-redundant-experts", "2", "--afd-expert-load", "$DIR/missing.json"}), 2,
     "genbridge run: expert load: $DIR/missing.json: cannot open: No such file or directory"},
    {"afd_redundant_experts_huge", R({"--afd", "1A2F", "--afd-redundant-experts", "70000"}), 2,
     "genbridge run: --afd-redundant-experts 70000: expected an integer in [0, 65536]"},
    {"afd_expert_load_out_missing_directory", R({"--afd", "1A2F", "--afd-expert-load-out", "$DIR/missing/l.json"}), 2,
     "genbridge run: --afd-expert-load-out $DIR/missing/l.json: the directory $DIR/missing does not exist"},
    {"afd_expert_load_out_without_afd", R({"--afd-expert-load-out", "$DIR/l.json"}), 2,
     "genbridge run: --afd-expert-load-out applies to AFD runs only; add --afd (the topology, e.g. 2A1F) or drop "
     "--afd-expert-load-out"},
    {"serve_afd_redundant_experts_without_load", S({"--afd", "1A2F", "--afd-redundant-experts", "2"}), 2,
     "genbridge serve: --afd-redundant-experts 2 needs --afd-expert-load FILE: the copies go to the experts a "
     "measured load shows hottest (write one with genbridge run --afd ... --afd-expert-load-out FILE)"},
    {"afd_timeout_without_afd", R({"--afd-timeout", "5"}), 2,
     "genbridge run: --afd-timeout applies to AFD runs only; add --afd (the topology, e.g. 2A1F) or drop "
     "--afd-timeout"},
    // CLI11's own checks keep exit code 2
    {"unknown_flag", R({"--temprature", "1"}), 2,
     "genbridge run: The following arguments were not expected: 1 --temprature"},
    {"missing_value", R({"--threads"}), 2, "genbridge run: --threads: 1 required INT missing"},
    {"no_subcommand", {}, 2, "genbridge: A subcommand is required"},

    // afd-worker: the same flags and checks, plus its own
    {"worker_without_afd", W({}), 2,
     "genbridge afd-worker: --afd is required: the job's topology, e.g. 2A1F (2 attention ranks, 1 FFN rank)"},
    {"worker_inproc_transport", W({"--afd", "1A1F", "--afd-transport", "inproc"}), 2,
     "genbridge afd-worker: --afd-transport inproc: `genbridge afd-worker` is one process of an mpirun job (mpi); for "
     "the in-process transport use `genbridge run --afd`"},
    {"worker_role_unknown", W({"--afd", "1A1F", "--role", "router"}), 2,
     "genbridge afd-worker: --role router: expected one of attention | ffn"},
    {"worker_role_empty", W({"--afd", "1A1F", "--role", ""}), 2,
     "genbridge afd-worker: --role '': expected one of attention | ffn"},
    {"worker_threads_negative", W({"--afd", "1A1F", "--threads", "-1"}), 2,
     "genbridge afd-worker: --threads -1: expected an integer in [0, 255]"},
    {"worker_timeout_nan", W({"--afd", "1A1F", "--afd-timeout", "nan"}), 2,
     "genbridge afd-worker: --afd-timeout nan: expected a number of seconds in [0.001, 86400]"},
    {"worker_kv_memory_negative", W({"--afd", "1A1F", "--kv-memory-mb", "-1"}), 2,
     "genbridge afd-worker: --kv-memory-mb -1: expected an integer in [0, 8796093022207]"},
    {"worker_stop_token_outside_vocabulary", W({"--afd", "1A1F", "--stop-token", "600"}), 2,
     "genbridge afd-worker: --stop-token 600: expected a token id in [0, 512) (the model's vocabulary)"},
    {"worker_prompt_trailing_comma", W({"--afd", "1A1F", "--prompt", "7,"}), 2,
     "genbridge afd-worker: --prompt 7,: item 2 is empty" + kIds},
    {"worker_dump_logits_directory", W({"--afd", "1A1F", "--dump-logits", "$DIR"}), 2,
     "genbridge afd-worker: --dump-logits $DIR: is a directory; expected a file name"},
    {"worker_env_threads",
     W({"--afd", "1A1F"}),
     2,
     "genbridge afd-worker: GENBRIDGE_NUM_THREADS=abc: expected an integer in [1, 255] (unset it to use every core)",
     {{"GENBRIDGE_NUM_THREADS", "abc"}}},
    {"worker_env_cpu_target",
     W({"--afd", "1A1F"}),
     2,
     "genbridge afd-worker: GENBRIDGE_CPU_TARGET=avx9: not a CPU target this machine can run; available: "
     "$CPU_AVAILABLE (or best); "
     "compiled into this build: $CPU_COMPILED",
     {{"GENBRIDGE_CPU_TARGET", "avx9"}}},

    // serve: every numeric flag at its extremes, refused before the model loads or the listener opens
    {"serve_port_negative", S({"--port", "-1"}), 2, "genbridge serve: --port -1: expected an integer in [0, 65535]"},
    {"serve_port_huge", S({"--port", "65536"}), 2, "genbridge serve: --port 65536: expected an integer in [0, 65535]"},
    {"serve_port_exponent", S({"--port", "8e3"}), 2, "genbridge serve: --port 8e3: expected an integer in [0, 65535]"},
    {"serve_max_queued_zero", S({"--max-queued-requests", "0"}), 2,
     "genbridge serve: --max-queued-requests 0: expected an integer in [1, 1048576]"},
    {"serve_max_queued_huge", S({"--max-queued-requests", "1048577"}), 2,
     "genbridge serve: --max-queued-requests 1048577: expected an integer in [1, 1048576]"},
    {"serve_default_max_tokens_zero", S({"--default-max-tokens", "0"}), 2,
     "genbridge serve: --default-max-tokens 0: expected an integer in [1, 1048576]"},
    {"serve_default_max_tokens_not_an_integer", S({"--default-max-tokens", "16.5"}), 2,
     "genbridge serve: --default-max-tokens 16.5: expected an integer in [1, 1048576]"},
    {"serve_http_threads_negative", S({"--http-threads", "-1"}), 2,
     "genbridge serve: --http-threads -1: expected an integer in [0, 16384]"},
    {"serve_http_threads_huge", S({"--http-threads", "16385"}), 2,
     "genbridge serve: --http-threads 16385: expected an integer in [0, 16384]"},
    // The default --http-threads (one per running or waiting request) of a huge queue (before: serve started
    // the threads one by one until the machine ran out of them)
    {"serve_default_http_threads_past_the_limit", S({"--max-queued-requests", "1048576"}), 2,
     "genbridge serve: --max-batch 32 + --max-queued-requests 1048576 + 8 = 1048616 HTTP threads (the default of "
     "--http-threads: one per running or waiting request) is more than 16384; lower --max-queued-requests or "
     "--max-batch, or give --http-threads in [1, 16384] (connections beyond it wait for a thread)"},
    {"serve_default_http_threads_past_the_limit_afd", S({"--afd", "4A1F", "--max-batch", "4096"}), 2,
     "genbridge serve: --max-batch 4096 x 4 attention ranks + --max-queued-requests 64 + 8 = 16456 HTTP threads "
     "(the default of --http-threads: one per running or waiting request) is more than 16384; lower "
     "--max-queued-requests or --max-batch, or give --http-threads in [1, 16384] (connections beyond it wait for a "
     "thread)"},
    {"serve_request_timeout_zero", S({"--request-timeout", "0"}), 2,
     "genbridge serve: --request-timeout 0: expected a number of seconds in [0.001, 86400]"},
    {"serve_request_timeout_huge", S({"--request-timeout", "1e400"}), 2,
     "genbridge serve: --request-timeout 1e400: expected a number of seconds in [0.001, 86400]"},
    {"serve_request_timeout_subnormal", S({"--request-timeout", "1e-310"}), 2,
     "genbridge serve: --request-timeout 1e-310: expected a number of seconds in [0.001, 86400]"},
    {"serve_request_timeout_nan", S({"--request-timeout", "nan"}), 2,
     "genbridge serve: --request-timeout nan: expected a number of seconds in [0.001, 86400]"},
    {"serve_shutdown_timeout_negative", S({"--shutdown-timeout", "-1"}), 2,
     "genbridge serve: --shutdown-timeout -1: expected a number of seconds in [0, 86400]"},
    {"serve_shutdown_timeout_huge", S({"--shutdown-timeout", "86401"}), 2,
     "genbridge serve: --shutdown-timeout 86401: expected a number of seconds in [0, 86400]"},
    {"serve_shutdown_timeout_inf", S({"--shutdown-timeout", "inf"}), 2,
     "genbridge serve: --shutdown-timeout inf: expected a number of seconds in [0, 86400]"},
    {"serve_max_batch_zero", S({"--max-batch", "0"}), 2,
     "genbridge serve: --max-batch 0: expected an integer in [1, 4096]"},
    {"serve_kv_memory_negative", S({"--kv-memory-mb", "-1"}), 2,
     "genbridge serve: --kv-memory-mb -1: expected an integer in [0, 8796093022207]"},
    {"serve_kv_memory_past_physical_memory", S({"--kv-memory-mb", "100000000"}), 2,
     "genbridge serve: --kv-memory-mb 100000000: more than this machine's physical memory ($PHYS_MIB MiB)"},
    {"serve_threads_huge", S({"--threads", "256"}), 2,
     "genbridge serve: --threads 256: expected an integer in [0, 255]"},
    {"serve_afd_stages_huge", S({"--afd", "1A1F", "--afd-stages", "4"}), 2,
     "genbridge serve: --afd-stages 4: expected an integer in [1, 3]"},
    {"serve_afd_timeout_zero", S({"--afd", "1A1F", "--afd-timeout", "0"}), 2,
     "genbridge serve: --afd-timeout 0: expected a number of seconds in [0.001, 86400]"},
    {"serve_model_seed_negative", {"serve", "--model-seed", "-1"}, 2, "genbridge serve: --model-seed -1" + kU64},

    // make-model
    {"make_preset_unknown",
     {"make-model", "--preset", "huge", "$DIR/m"},
     2,
     "genbridge make-model: --preset huge: expected one of tiny | tiny-gemma | small | tiny-dsa | "
     "tiny-dsv3 | tiny-dsv3-noq | small-dsa | tiny-qwen35 | tiny-qwen35-split | small-qwen35 | tiny-dsv4 | "
     "small-dsv4"},
    {"make_preset_empty",
     {"make-model", "--preset", "", "$DIR/m"},
     2,
     "genbridge make-model: --preset '': expected one of tiny | tiny-gemma | small | tiny-dsa | "
     "tiny-dsv3 | tiny-dsv3-noq | small-dsa | tiny-qwen35 | tiny-qwen35-split | small-qwen35 | tiny-dsv4 | "
     "small-dsv4"},
    {"make_seed_negative", {"make-model", "--seed", "-1", "$DIR/m"}, 2, "genbridge make-model: --seed -1" + kU64},
    {"make_seed_huge",
     {"make-model", "--seed", "18446744073709551616", "$DIR/m"},
     2,
     "genbridge make-model: --seed 18446744073709551616" + kU64},
    {"make_seed_not_a_number", {"make-model", "--seed", "x", "$DIR/m"}, 2, "genbridge make-model: --seed x" + kU64},
    {"make_seed_empty", {"make-model", "--seed", "", "$DIR/m"}, 2, "genbridge make-model: --seed ''" + kU64},
    {"make_shards_zero",
     {"make-model", "--shards", "0", "$DIR/m"},
     2,
     "genbridge make-model: --shards 0: expected an integer in [1, 64]"},
    {"make_shards_negative",
     {"make-model", "--shards", "-1", "$DIR/m"},
     2,
     "genbridge make-model: --shards -1: expected an integer in [1, 64]"},
    {"make_shards_huge",
     {"make-model", "--shards", "65", "$DIR/m"},
     2,
     "genbridge make-model: --shards 65: expected an integer in [1, 64]"},
    {"make_shards_not_a_number",
     {"make-model", "--shards", "two", "$DIR/m"},
     2,
     "genbridge make-model: --shards two: expected an integer in [1, 64]"},
    {"make_shards_empty",
     {"make-model", "--shards", "", "$DIR/m"},
     2,
     "genbridge make-model: --shards '': expected an integer in [1, 64]"},
    {"make_out_dir_empty", {"make-model", ""}, 2, "genbridge make-model: OUT_DIR '': the value is empty"},
    {"make_out_dir_missing", {"make-model"}, 2, "genbridge make-model: OUT_DIR is required"},
    {"make_env_threads",
     {"make-model", "$DIR/m"},
     2,
     "genbridge make-model: GENBRIDGE_NUM_THREADS=-3: expected an integer in [1, 255] (unset it to use every core)",
     {{"GENBRIDGE_NUM_THREADS", "-3"}}},
    {"make_env_cpu_target",
     {"make-model", "$DIR/m"},
     2,
     "genbridge make-model: GENBRIDGE_CPU_TARGET=avx9: not a CPU target this machine can run; available: "
     "$CPU_AVAILABLE (or best); "
     "compiled into this build: $CPU_COMPILED",
     {{"GENBRIDGE_CPU_TARGET", "avx9"}}},

    // info (before: `info --soc foo` printed part of its report, then the error)
    {"info_soc_empty", {"info", "--soc", ""}, 2, "genbridge info: --soc '': the value is empty"},
    {"info_soc_unknown",
     {"info", "--soc", "foo"},
     1,
     "genbridge info: InvalidArgument: DeviceOperator: configured SoC selector 'foo' is not known; accepted selectors: "
     "910B, Ascend910B1..Ascend910B4, 910, 910C, Ascend910_93xx (e.g. Ascend910_9382, Ascend910_9392), 950, "
     "Ascend950, Ascend950PR_xxxx, Ascend950DT_xxxx"},
    {"info_soc_env_unknown",
     {"info"},
     1,
     "genbridge info: InvalidArgument: DeviceOperator: configured SoC selector 'foo' is not known; accepted selectors: "
     "910B, Ascend910B1..Ascend910B4, 910, 910C, Ascend910_93xx (e.g. Ascend910_9382, Ascend910_9392), 950, "
     "Ascend950, Ascend950PR_xxxx, Ascend950DT_xxxx",
     {{"GENBRIDGE_SOC", "foo"}}},
    {"info_env_cpu_target",
     {"info"},
     2,
     "genbridge info: GENBRIDGE_CPU_TARGET=avx9: not a CPU target this machine can run; available: $CPU_AVAILABLE (or "
     "best); "
     "compiled into this build: $CPU_COMPILED",
     {{"GENBRIDGE_CPU_TARGET", "avx9"}}},
};

class Flags : public CliTest, public ::testing::WithParamInterface<Row> {};

TEST_P(Flags, refused) {
  const Row& row = GetParam();
  const Outcome o = run(row.args, row.env);
  EXPECT_EQ(o.exit_code, row.exit_code) << o.err;
  const std::string want = expand(row.message);
  const auto err = lines(o.err);
  EXPECT_NE(std::find(err.begin(), err.end(), want), err.end()) << "stderr:\n"
                                                                << o.err << "\nwanted the line:\n"
                                                                << want;
  if (row.exit_code == 2 && !err.empty() && err[0].find(": The following") == std::string::npos) {
    // Flag-value errors come alone (or with the help hint), never after a log line.
    EXPECT_EQ(err[0], want);
  }
  EXPECT_EQ(o.out, "") << "nothing may be printed as a result";
}

INSTANTIATE_TEST_SUITE_P(Cli, Flags, ::testing::ValuesIn(kRows),
                         [](const ::testing::TestParamInfo<Row>& i) { return std::string(i.param.name); });

// ---------------------------------------------------------------------------------------------------
// Exit codes of the one run path: 0, 3 (a request refused), 1 (failed), 2 (usage), the same for `run`
// and `run --afd` (before: `run --afd` returned 0 with refused requests). afd-worker: tests/tools/CMakeLists.txt.

int count_results(const std::string& out) {
  int n = 0;
  for (const auto& l : lines(out)) n += l.rfind("request ", 0) == 0;
  return n;
}

TEST_F(CliTest, exit_codes_of_run_and_run_afd_agree) {
  for (const std::vector<std::string> afd :
       {std::vector<std::string>{}, {"--afd", "2A1F"}, {"--afd", "1A2F", "--afd-connector", "async"}}) {
    auto args = [&](std::vector<std::string> more) {
      std::vector<std::string> a = R(std::move(more));
      a.insert(a.end(), afd.begin(), afd.end());
      return a;
    };
    const std::string mode = afd.empty() ? "run" : "run " + afd[1];
    const Outcome ok = run(args({}));
    EXPECT_EQ(ok.exit_code, 0) << mode << ok.err;
    EXPECT_EQ(count_results(ok.out), 2) << mode;
    // 600 prompt tokens need 5 pages of 128; 1 MiB holds 4 pages of this model: every request is refused.
    const Outcome refused = run(args({"--kv-memory-mb", "1", "--prompt-len", "600"}));
    EXPECT_EQ(refused.exit_code, 3) << mode << refused.err;
    EXPECT_EQ(count_results(refused.out), 2) << mode;
    EXPECT_NE(refused.out.find("request 0: refused: request 0 needs 5 KV pages"), std::string::npos) << refused.out;
    const Outcome failed = run({"run", "--model", (scratch_ / "no-model").string(), "--quiet"});
    EXPECT_EQ(failed.exit_code, 1) << mode << failed.err;
    EXPECT_EQ(failed.out, "");
    const Outcome usage = run(args({"--threads", "-1"}));
    EXPECT_EQ(usage.exit_code, 2) << mode;
  }
}

// The ends of the sampling ranges as --help prints them are accepted and run to the end (the smallest
// temperature is greedy in effect, the largest uniform; both are finite floats, as is 1 / temperature).
TEST_F(CliTest, sampling_bounds_as_printed_run_to_the_end) {
  for (const std::vector<std::string>& more : {std::vector<std::string>{"--temperature", "1.1754944e-38"},
                                               {"--temperature", "3.4028235e+38", "--top-k", "2147483647"},
                                               {"--temperature", "1", "--top-p", "1.1754944e-38"},
                                               {"--temperature", "-0", "--seed", "18446744073709551615"}}) {
    const Outcome o = run(R(more));
    EXPECT_EQ(o.exit_code, 0) << more[1] << ": " << o.err;
    EXPECT_EQ(count_results(o.out), 2) << more[1];
  }
}

// A refused request among finished ones still makes the exit code 3; the others' results are printed.
TEST_F(CliTest, one_refused_request_among_finished_ones_exits_3) {
  std::string long_prompt = "1";
  for (int i = 1; i < 600; ++i) long_prompt += ",1";
  for (const std::vector<std::string> afd : {std::vector<std::string>{}, {"--afd", "2A1F"}}) {
    std::vector<std::string> a = {"run", "--model",  "$MODEL", "--quiet",  "--max-new-tokens", "2", "--kv-memory-mb",
                                  "1",   "--prompt", "5,6",    "--prompt", long_prompt};
    a.insert(a.end(), afd.begin(), afd.end());
    const Outcome o = run(a);
    EXPECT_EQ(o.exit_code, 3) << o.err;
    EXPECT_NE(o.out.find("request 0 (length, 2 tokens)"), std::string::npos) << o.out;
    EXPECT_NE(o.out.find("request 1: refused:"), std::string::npos) << o.out;
  }
}

// serve binds its port before it loads the model; then it refuses --enable-prefix-caching for a model with state
// (exit 2), with and without --afd.
TEST_F(CliTest, serve_refuses_prefix_caching_for_a_model_with_state) {
  for (const std::vector<std::string> afd : {std::vector<std::string>{}, {"--afd", "1A1F"}}) {
    std::vector<std::string> a = {"serve", "--preset", "tiny-dsv4", "--quiet", "--port", "0", "--enable-prefix-caching"};
    a.insert(a.end(), afd.begin(), afd.end());
    const Outcome o = run(a);
    EXPECT_EQ(o.exit_code, 2) << o.err;
    EXPECT_NE(o.err.find("genbridge serve: --enable-prefix-caching: this DeepSeek-V4 model keeps per-sequence state "
                         "(the sliding window's and the compressors') that a cached KV page does not hold; drop the flag"),
              std::string::npos)
        << o.err;
  }
}

// --max-num-seqs (vLLM's name) sets --max-batch: with 1, three requests run one at a time.
TEST_F(CliTest, max_num_seqs_is_max_batch) {
  for (const char* flag : {"--max-num-seqs", "--max-batch"}) {
    const Outcome o = run({"run", "--model", "$MODEL", "--num-prompts", "3", "--prompt-len", "4", "--max-new-tokens",
                           "2", flag, "1"});
    EXPECT_EQ(o.exit_code, 0) << o.err;
    const std::string all = o.out + o.err;
    EXPECT_NE(all.find("requests 0/3 finished, 1 running, 2 waiting"), std::string::npos) << flag << ": " << all;
  }
}

// ---------------------------------------------------------------------------------------------------
// Output files: a bad path fails before anything is decoded or printed; a failed write fails before the
// results are printed and leaves no file; a good one leaves exactly the file.

TEST_F(CliTest, dump_logits_is_written_before_the_results_and_leaves_no_temporary_file) {
  for (const std::vector<std::string> afd : {std::vector<std::string>{}, {"--afd", "2A1F"}}) {
    const fs::path dir = scratch_ / "dir" / (afd.empty() ? "mono" : "afd");
    fs::create_directories(dir);
    std::vector<std::string> a = R({"--dump-logits", (dir / "x.npy").string()});
    a.insert(a.end(), afd.begin(), afd.end());
    const Outcome o = run(a);
    EXPECT_EQ(o.exit_code, 0) << o.err;
    EXPECT_EQ(count_results(o.out), 2);
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    EXPECT_EQ(names, std::vector<std::string>{"x.npy"});
    // 2 requests x 2 generated tokens = 4 rows of 512 fp32 logits after a 128-byte header.
    EXPECT_EQ(fs::file_size(dir / "x.npy"), 128u + 4u * 512u * 4u);
  }
}

TEST_F(CliTest, dump_logits_to_dev_full_fails_before_printing_results) {
  for (const std::vector<std::string> afd : {std::vector<std::string>{}, {"--afd", "2A1F"}}) {
    std::vector<std::string> a = R({"--dump-logits", "/dev/full"});
    a.insert(a.end(), afd.begin(), afd.end());
    const Outcome o = run(a);
    EXPECT_EQ(o.exit_code, 1);
    EXPECT_EQ(o.err, "genbridge run: Unavailable: --dump-logits /dev/full: writing failed: No space left on device\n");
    EXPECT_EQ(o.out, "");
  }
}

// A full disk (a file size limit) before: a truncated or 0-byte file after all results were printed.
TEST_F(CliTest, dump_logits_on_a_full_disk_fails_before_printing_and_leaves_no_file) {
  const fs::path dir = scratch_ / "dir";
  const std::string path = (dir / "x.npy").string();
  const Outcome o = run(R({"--dump-logits", path}), {}, /*fsize=*/1000);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.err, "genbridge run: Unavailable: --dump-logits " + path + ": writing failed: File too large\n");
  EXPECT_EQ(o.out, "");
  EXPECT_TRUE(fs::is_empty(dir));
}

// /dev/null is a character device: written directly (the run succeeds and the device stays one).
TEST_F(CliTest, dump_logits_to_dev_null_succeeds) {
  const Outcome o = run(R({"--dump-logits", "/dev/null"}));
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
}

// --dump-choices: one JSON line per request, step, position and MoE layer (tiny: layers 0, 2 and 3; 2
// experts and their weights each; layer 1 is dense and has nothing to report), grouped by request; `run --afd 2A1F`
// writes the same bytes; /dev/full fails before the results are printed.
TEST_F(CliTest, dump_choices_writes_json_lines_and_afd_writes_the_same) {
  std::string mono;
  for (const std::vector<std::string> afd : {std::vector<std::string>{}, {"--afd", "2A1F"}}) {
    const fs::path dir = scratch_ / "dir" / (afd.empty() ? "mono" : "afd");
    fs::create_directories(dir);
    std::vector<std::string> a = R({"--dump-choices", (dir / "c.jsonl").string(), "--max-new-tokens", "3"});
    a.insert(a.end(), afd.begin(), afd.end());
    const Outcome o = run(a);
    EXPECT_EQ(o.exit_code, 0) << o.err;
    EXPECT_EQ(count_results(o.out), 2);
    const std::string text = slurp(dir / "c.jsonl");
    const std::vector<std::string> ls = lines(text);
    // Per request: 3 prompt positions (step 0) + 2 fed-back tokens (steps 1, 2), 3 MoE layers each.
    const int64_t kLayers[] = {0, 2, 3};
    ASSERT_EQ(ls.size(), 2u * 5u * 3u);
    for (size_t i = 0; i < ls.size(); ++i) {
      const nlohmann::json j = nlohmann::json::parse(ls[i]);
      const int64_t pos = static_cast<int64_t>(i % 15) / 3;
      EXPECT_EQ(j.at("request").get<int64_t>(), static_cast<int64_t>(i / 15)) << ls[i];
      EXPECT_EQ(j.at("step").get<int64_t>(), pos < 3 ? 0 : pos - 2) << ls[i];
      EXPECT_EQ(j.at("position").get<int64_t>(), pos) << ls[i];
      EXPECT_EQ(j.at("layer").get<int64_t>(), kLayers[i % 3]) << ls[i];
      ASSERT_EQ(j.at("experts").size(), 2u) << ls[i];
      ASSERT_EQ(j.at("weights").size(), 2u) << ls[i];
      EXPECT_FALSE(j.contains("index_topk")) << ls[i];
      for (const auto& e : j.at("experts")) EXPECT_TRUE(e.get<int64_t>() >= 0 && e.get<int64_t>() < 8) << ls[i];
    }
    if (afd.empty()) {
      mono = text;
    } else {
      EXPECT_EQ(text, mono) << "run --afd 2A1F wrote other choices than run";
    }
  }
  const Outcome full = run(R({"--dump-choices", "/dev/full"}));
  EXPECT_EQ(full.exit_code, 1);
  EXPECT_EQ(full.err,
            "genbridge run: Unavailable: --dump-choices /dev/full: writing failed: No space left on device\n");
  EXPECT_EQ(full.out, "");
}

// Results that cannot be written to stdout (a full disk) are a failure (before: exit 0).
TEST_F(CliTest, a_failed_write_to_stdout_exits_1) {
  const Outcome o = run_cli(expand(R({})), {}, scratch_, -1, "/dev/full");
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.err, "genbridge: writing to standard output failed: No space left on device\n");
}

// `info` validates the SoC before printing anything; a good selector prints the whole report.
TEST_F(CliTest, info_prints_the_whole_report_or_nothing) {
  const Outcome good = run({"info"});
  EXPECT_EQ(good.exit_code, 0) << good.err;
  EXPECT_EQ(good.out.rfind("provider target: ", 0), 0u) << good.out;
  EXPECT_NE(good.out.find("manifest:"), std::string::npos);
  const Outcome bad = run({"info", "--soc", "foo"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.out, "");
}

// ---------------------------------------------------------------------------------------------------
// Text in, text out: make-model writes the tokenizer files; --prompt-text runs exactly the ids the model's
// tokenizer gives (the same results as --prompt with those ids) and prints each result decoded.

std::vector<std::string> result_lines(const std::string& out, bool text) {
  std::vector<std::string> v;
  for (const auto& l : lines(out)) {
    if (l.rfind("request ", 0) == 0 && (l.find(" text: ") != std::string::npos) == text) v.push_back(l);
  }
  return v;
}

TEST_F(CliTest, make_model_writes_a_tokenizer_of_the_model_vocabulary) {
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) EXPECT_TRUE(fs::is_regular_file(model_ / f)) << f;
  auto tok = genbridge::text::Tokenizer::load(model_ / "tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  // The tiny preset's vocabulary is 512: the last id is a token, the next is not.
  EXPECT_NE(tok->token_bytes(511), nullptr);
  EXPECT_EQ(tok->token_bytes(512), nullptr);
  EXPECT_EQ(tok->decode(*tok->encode("hello world")), "hello world");
}

TEST_F(CliTest, prompt_text_runs_the_tokenizer_ids_and_prints_the_decoded_text) {
  auto tok = genbridge::text::Tokenizer::load(model_ / "tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const std::vector<std::string> texts = {"hello world", "line one\nline \"two\"\t\x01 <|im_start|>"};
  std::vector<std::string> text_args, id_args;
  for (const auto& t : texts) {
    auto ids = tok->encode(t);
    ASSERT_TRUE(ids.ok());
    std::string csv;
    for (int32_t id : *ids) csv += (csv.empty() ? "" : ",") + std::to_string(id);
    text_args.insert(text_args.end(), {"--prompt-text", t});
    id_args.insert(id_args.end(), {"--prompt", csv});
  }
  for (const std::vector<std::string>& afd : {std::vector<std::string>{}, {"--afd", "2A1F"}}) {
    auto args = [&](const std::vector<std::string>& prompts) {
      std::vector<std::string> a = {"run", "--model", "$MODEL", "--quiet", "--max-new-tokens", "6"};
      a.insert(a.end(), prompts.begin(), prompts.end());
      a.insert(a.end(), afd.begin(), afd.end());
      return a;
    };
    const Outcome by_text = run(args(text_args)), by_ids = run(args(id_args));
    ASSERT_EQ(by_text.exit_code, 0) << by_text.err;
    ASSERT_EQ(by_ids.exit_code, 0) << by_ids.err;
    const auto ids_lines = result_lines(by_ids.out, false);
    ASSERT_EQ(ids_lines.size(), texts.size());
    EXPECT_EQ(result_lines(by_text.out, false), ids_lines);
    EXPECT_TRUE(result_lines(by_ids.out, true).empty()) << "--prompt prints no text lines";
    // Each text line follows its ids line and holds the decoded tokens as a JSON string (one line).
    const auto all = lines(by_text.out);
    for (size_t r = 0; r < texts.size(); ++r) {
      const auto it = std::find(all.begin(), all.end(), ids_lines[r]);
      ASSERT_NE(it, all.end());
      ASSERT_NE(it + 1, all.end());
      const std::string prefix = "request " + std::to_string(r) + " text: ";
      ASSERT_EQ(it[1].rfind(prefix, 0), 0u) << it[1];
      std::vector<int32_t> generated;
      std::istringstream in(ids_lines[r].substr(ids_lines[r].find("): ") + 3));
      for (int32_t id; in >> id;) generated.push_back(id);
      ASSERT_EQ(generated.size(), 6u) << ids_lines[r];
      EXPECT_EQ(nlohmann::json::parse(it[1].substr(prefix.size())).get<std::string>(), tok->decode(generated));
    }
  }
}

TEST_F(CliTest, prompt_text_on_a_checkpoint_without_a_tokenizer_names_the_file) {
  const fs::path bare = scratch_ / "dir" / "bare";
  fs::create_directories(bare);
  for (const auto& e : fs::directory_iterator(model_)) {
    if (e.path().filename().string().rfind("tokenizer", 0) != 0) fs::copy(e.path(), bare / e.path().filename());
  }
  const Outcome o = run({"run", "--model", bare.string(), "--quiet", "--prompt-text", "hi"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.err, "genbridge run: --prompt-text needs the model's tokenizer, but " +
                       (bare / "tokenizer.json").string() +
                       " does not exist (make-model writes one; for a Hugging Face checkpoint, put its tokenizer.json "
                       "next to the weights)\n");
  EXPECT_EQ(o.out, "");
  // The same checkpoint runs token ids as before.
  const Outcome ids = run({"run", "--model", bare.string(), "--quiet", "--prompt", "1,2", "--max-new-tokens", "2"});
  EXPECT_EQ(ids.exit_code, 0) << ids.err;
}

// The cached synthetic model (no --model) has a tokenizer too, even one cached before tokenizers were written.
TEST_F(CliTest, prompt_text_on_the_cached_synthetic_model) {
  const std::vector<std::string> a = {"run", "--preset",      "tiny", "--quiet", "--max-new-tokens",
                                      "2",   "--prompt-text", "hi"};
  const Outcome first = run(a);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(result_lines(first.out, true).size(), 1u) << first.out;
  const fs::path cached = scratch_ / "cache" / "models" / "tiny-seed0";
  ASSERT_TRUE(fs::is_regular_file(cached / "tokenizer.json"));
  fs::remove(cached / "tokenizer.json");
  fs::remove(cached / "tokenizer_config.json");
  const Outcome again = run(a);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out.substr(0, again.out.find("\n\n")), first.out.substr(0, first.out.find("\n\n")));
  EXPECT_TRUE(fs::is_regular_file(cached / "tokenizer_config.json"));
}

// Every flag of `run` states its range or choices and its default in --help.
TEST_F(CliTest, help_states_range_and_default_of_every_flag) {
  const Outcome o = run({"run", "--help"});
  ASSERT_EQ(o.exit_code, 0);
  for (const char* s :
       {"Integer in [1, 4096]. Default: 8", "Integer in [0, 255]. Default: 0",
        "Integer in [0, 8796093022207]. Default: 0", "A number in [1.1754944e-38, 1]. Default: 1",
        "0 or a number in [1.1754944e-38, 3.4028235e+38]. Default: 0",
        "A number of seconds in [0.001, 86400]. Default: 30", "One of sync | async. Default: sync",
        "Exit status: 0 every request finished; 3 some request", "--prompt-text TEXT", "request N text: \"...\""}) {
    EXPECT_NE(o.out.find(s), std::string::npos) << s << "\n" << o.out;
  }
}

}  // namespace

// GENBRIDGE_CPU_TARGET restricts the kernels: `info` names the target in force, and `run` prints the same
// tokens and writes the same logits (bit for bit) whichever CPU target runs it.
TEST_F(CliTest, every_cpu_target_runs_the_same_tokens_and_logits_and_info_names_it) {
  auto request_lines = [](const std::string& out) {
    std::string r;
    for (const auto& l : lines(out))
      if (l.rfind("request ", 0) == 0) r += l + "\n";
    return r;
  };
  auto read_file = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  std::string first_tokens, first_logits;
  for (const std::string& t : genbridge::cpu_targets_available()) {
    const Outcome info = run({"info"}, {{"GENBRIDGE_CPU_TARGET", t}});
    EXPECT_EQ(info.exit_code, 0) << info.err;
    EXPECT_NE(info.out.find("cpu target: " + t + " (available: "), std::string::npos) << info.out;
    const std::string npy = expand("$DIR/") + t + ".npy";
    const Outcome r = run(R({"--max-new-tokens", "6", "--dump-logits", npy}), {{"GENBRIDGE_CPU_TARGET", t}});
    ASSERT_EQ(r.exit_code, 0) << t << ": " << r.err;
    ASSERT_EQ(count_results(r.out), 2) << r.out;
    const std::string logits = read_file(npy);
    ASSERT_GT(logits.size(), 2u * 6u * 512u * 4u) << npy;
    if (first_tokens.empty()) {
      first_tokens = request_lines(r.out);
      first_logits = logits;
    }
    EXPECT_EQ(request_lines(r.out), first_tokens) << "cpu target " << t;
    EXPECT_TRUE(logits == first_logits) << "cpu target " << t << ": logits differ from "
                                        << genbridge::cpu_targets_available()[0];
  }
}

// --weight-quant: the scheme in force and the weight bytes are printed; AFD gives monolithic's tokens; a scheme
// the generation cannot run fails at start-up naming the generation and what it offers.
namespace {
TEST_F(CliTest, weight_quant_prints_the_scheme_and_bytes_and_afd_agrees) {
  const bool a5 = genbridge::ops::build_target() == std::string_view("Ascend950");
  const std::vector<std::string> base = {"run",   "--model",  "$MODEL", "--max-new-tokens", "6",   "--prompt",
                                         "1,2,3", "--prompt", "7,8",    "--weight-quant",   "auto"};
  const Outcome mono = run(base);
  ASSERT_EQ(mono.exit_code, 0) << mono.err;
  const std::string scheme = a5 ? "mxfp8" : "w8a8";
  EXPECT_NE(mono.err.find("weights: " + scheme + " for attention projections and experts ("), std::string::npos)
      << mono.err;
  EXPECT_NE(mono.err.find("| weights (weight_quant=auto): " + scheme + " ("), std::string::npos) << mono.err;
  std::vector<std::string> afd = base;
  afd.insert(afd.end(), {"--afd", "2A2F"});
  const Outcome split = run(afd);
  ASSERT_EQ(split.exit_code, 0) << split.err;
  auto requests = [](const std::string& out) {
    std::string r;
    for (const auto& l : lines(out)) {
      if (l.rfind("request ", 0) == 0) r += l + "\n";
    }
    return r;
  };
  EXPECT_EQ(requests(split.out), requests(mono.out));
  EXPECT_EQ(count_results(mono.out), 2);
  const Outcome none = run({"run", "--model", "$MODEL", "--max-new-tokens", "2", "--prompt", "1,2,3"});
  EXPECT_NE(none.err.find("weights: bf16 (weight_quant=none), "), std::string::npos) << none.err;
  if (!a5) {
    const Outcome mx = run({"run", "--model", "$MODEL", "--quiet", "--prompt", "1,2", "--weight-quant", "mxfp4"});
    EXPECT_EQ(mx.exit_code, 1);
    EXPECT_NE(mx.err.find("--weight-quant=mxfp4: Ascend910 (A2/A3) cannot run mxfp4 weights; it offers w8a8 (auto = "
                          "w8a8), or none for bf16 weights"),
              std::string::npos)
        << mx.err;
    EXPECT_EQ(mx.out, "");
  }
}
}  // namespace

// serve --weight-quant: a scheme the generation cannot run is a start-up error naming the generation, with
// run's exit code (1) and before the listener opens; a scheme it runs is quantized at start-up (the weights
// line). --host 256.0.0.1 cannot be bound: a server that got past the device ends there instead of serving.
namespace {
TEST_F(CliTest, serve_weight_quant_the_generation_cannot_run_fails_at_start_up_like_run) {
  const bool a5 = genbridge::ops::build_target() == std::string_view("Ascend950");
  const std::vector<std::string> serve = {"serve", "--model", "$MODEL", "--host", "256.0.0.1", "--port", "0"};
  if (!a5) {
    std::vector<std::string> bad = serve;
    bad.insert(bad.end(), {"--weight-quant", "mxfp8"});
    const Outcome s = run(bad);
    const Outcome r = run({"run", "--model", "$MODEL", "--quiet", "--prompt", "1,2", "--weight-quant", "mxfp8"});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(s.exit_code, r.exit_code) << s.err;
    EXPECT_NE(s.err.find("genbridge serve: "), std::string::npos) << s.err;
    EXPECT_NE(s.err.find("--weight-quant=mxfp8: Ascend910 (A2/A3) cannot run mxfp8 weights; it offers w8a8 (auto = "
                         "w8a8), or none for bf16 weights"),
              std::string::npos)
        << s.err;
    EXPECT_EQ(s.err.find("weights: "), std::string::npos) << s.err;
    EXPECT_EQ(s.err.find("listening"), std::string::npos) << s.err;
  }
  std::vector<std::string> good = serve;
  good.insert(good.end(), {"--weight-quant", "w8a8"});
  const Outcome s = run(good);
  EXPECT_EQ(s.exit_code, 1) << s.err;  // the listener cannot bind
  EXPECT_NE(s.err.find("weights: w8a8 for attention projections and experts ("), std::string::npos) << s.err;
  EXPECT_EQ(s.err.find("listening"), std::string::npos) << s.err;
}
}  // namespace
