#include "runtime/device/soc.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <regex>
#include <vector>

#include "soc_selectors.h"  // generated from cmake/GenbridgeSoc.cmake (the only selector table)

namespace genbridge::runtime {
namespace {

// Runtime SoC codes (torch_npu's SocVersion numbering).
struct CodeEntry {
  int code;
  const char* soc;
};
constexpr std::array<CodeEntry, 13> kCodes{{
    {220, "Ascend910B1"}, {221, "Ascend910B2"}, {222, "Ascend910B2C"}, {223, "Ascend910B3"}, {224, "Ascend910B4"},
    {225, "Ascend910B4_1"}, {250, "Ascend910_9391"}, {251, "Ascend910_9392"}, {252, "Ascend910_9381"},
    {253, "Ascend910_9382"}, {254, "Ascend910_9372"}, {255, "Ascend910_9362"}, {260, "Ascend950PR_9599"},
}};

int code_of(const std::string& soc) {
  for (const CodeEntry& e : kCodes) {
    if (soc == e.soc) return e.code;
  }
  if (soc.rfind("Ascend950", 0) == 0) return 260;  // every 950 part reports 260
  return 0;
}

SocInfo make(Generation g, std::string soc) {
  const int code = code_of(soc);
  return {g, std::move(soc), code};
}

}  // namespace

std::string_view generation_name(Generation g) { return g == Generation::kAscend910 ? "Ascend910" : "Ascend950"; }
std::string_view generation_family(Generation g) { return g == Generation::kAscend910 ? "A2/A3" : "A5"; }

Result<Generation> generation_from_target(std::string_view target) {
  if (target == "Ascend910") return Generation::kAscend910;
  if (target == "Ascend950") return Generation::kAscend950;
  return invalid_argument(fmt::format("provider target '{}' is not a known generation (Ascend910, Ascend950)", target));
}

std::string_view accepted_soc_selectors() { return generated::kAcceptedSocSelectors; }

Result<SocInfo> normalize_soc_selector(std::string_view selector) {
  // The build's table, compiled once; rows are tried in order, as genbridge_normalize_soc() does.
  static const std::vector<std::regex> patterns = [] {
    std::vector<std::regex> p;
    for (const generated::SocSelectorRow& row : generated::kSocSelectorRows) p.emplace_back(std::string(row.pattern));
    return p;
  }();
  const std::string s(selector);
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (!std::regex_match(s, patterns[i])) continue;
    const generated::SocSelectorRow& row = generated::kSocSelectorRows[i];
    GB_ASSIGN_OR_RETURN(Generation g, generation_from_target(row.target));
    return make(g, row.soc.empty() ? s : std::string(row.soc));
  }
  return invalid_argument(
      fmt::format("SoC selector '{}' is not known; accepted selectors: {}", selector, accepted_soc_selectors()));
}

Result<SocInfo> soc_from_code(int code) {
  for (const CodeEntry& e : kCodes) {
    if (e.code == code) return make(e.code >= 260 ? Generation::kAscend950 : Generation::kAscend910, e.soc);
  }
  return invalid_argument(fmt::format("runtime SoC code {} is not known; known codes: 220-225 (910B, A2), 250-255 "
                                      "(910_93, A3), 260 (950, A5)",
                                      code));
}

Result<SocInfo> parse_npu_smi(std::string_view text) {
  // A chip name as npu-smi prints it: "910B3" in the 910B device table, "Ascend910B3" / "Ascend 910B3"
  // elsewhere, "Ascend910_9382" or "Ascend950PR_9599" for full names, and a bare "Ascend910" (the A3
  // device table, which does not print the variant) or "Ascend950". Or a numeric SoC version.
  static const std::regex name(
      R"((?:^|[^A-Za-z0-9_])((?:Ascend ?)?(910B[1-4](?:C|_1)?|910_93[0-9]{2}|950(?:PR|DT)_[0-9]{4})|Ascend ?(910|950))(?![A-Za-z0-9_]))");
  static const std::regex code(R"(SoC[ _-]?Version\s*[:=]\s*([0-9]{3}))", std::regex::icase);
  std::vector<SocInfo> found;
  const std::string t(text);
  for (auto it = std::sregex_iterator(t.begin(), t.end(), name); it != std::sregex_iterator(); ++it) {
    const std::string full = (*it)[2].str(), bare = (*it)[3].str();
    if (bare == "910") {
      found.push_back({Generation::kAscend910, "Ascend910_93xx (variant not printed)", 0});
    } else if (bare == "950") {
      found.push_back({Generation::kAscend950, "Ascend950 (variant not printed)", 260});
    } else if (full.rfind("910B", 0) == 0) {
      if (code_of("Ascend" + full) != 0) found.push_back(make(Generation::kAscend910, "Ascend" + full));
    } else if (full.rfind("910_93", 0) == 0) {
      found.push_back(make(Generation::kAscend910, "Ascend" + full));
    } else {
      found.push_back(make(Generation::kAscend950, "Ascend" + full));
    }
  }
  for (auto it = std::sregex_iterator(t.begin(), t.end(), code); it != std::sregex_iterator(); ++it) {
    GB_ASSIGN_OR_RETURN(SocInfo s, soc_from_code(std::stoi((*it)[1].str())));
    found.push_back(std::move(s));
  }
  if (found.empty()) {
    const std::string first = t.substr(0, std::min<size_t>(t.find('\n'), 120));
    return invalid_argument(fmt::format("npu-smi output names no known SoC (first line: '{}')", first));
  }
  for (const SocInfo& s : found) {
    if (s.generation != found.front().generation) {
      return invalid_argument(fmt::format("npu-smi reports devices of two generations: {} ({}) and {} ({})",
                                          found.front().soc, generation_name(found.front().generation), s.soc,
                                          generation_name(s.generation)));
    }
  }
  return found.front();
}

std::string find_on_path(std::string_view name, std::string_view path_env) {
  size_t begin = 0;
  while (begin <= path_env.size()) {
    size_t end = path_env.find(':', begin);
    if (end == std::string_view::npos) end = path_env.size();
    const std::string dir(path_env.substr(begin, end - begin));
    if (!dir.empty()) {
      const std::string candidate = dir + "/" + std::string(name);
      struct stat st {};
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
        return candidate;
      }
    }
    begin = end + 1;
  }
  return {};
}

Result<std::optional<std::string>> read_npu_smi(std::string_view path_env) {
  const std::string exe = find_on_path("npu-smi", path_env);
  if (exe.empty()) return std::optional<std::string>{};
  const std::string cmd = "'" + exe + "' info 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return unavailable(fmt::format("npu-smi is at {} but could not be started", exe));
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int rc = ::pclose(pipe);
  if (rc != 0) {
    return unavailable(fmt::format("npu-smi at {} failed (exit status {}): {}", exe,
                                   WIFEXITED(rc) ? WEXITSTATUS(rc) : rc, out.substr(0, 200)));
  }
  return std::optional<std::string>(std::move(out));
}

}  // namespace genbridge::runtime
