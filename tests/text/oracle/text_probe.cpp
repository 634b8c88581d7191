// The genbridge side of the oracle tests: reads a JSON request on stdin, answers JSON on stdout. The node
// scripts beside it run the reference implementations on the same input and compare.
//   text_probe encode TOKENIZER_JSON   stdin: [{"hex": "<UTF-8 bytes>", "invalid_utf8": "error"|"replace",
//                                              "split_special_tokens": bool}, ...]
//                                      stdout: [{"ids": [...], "decoded_hex": "...", "stream_hex": ["..", ..],
//                                                "decoded_skip_special_hex": "..."} or {"error": "..."}, ...]
//   text_probe chat MODEL_DIR          stdin: [{request}, ...] (messages, tools, add_generation_prompt, ...)
//                                      stdout: [{"text": "...", "ids": [...]} or {"error": "..."}, ...]
//                                      (renders MODEL_DIR/tokenizer_config.json's template, encodes the text
//                                      with MODEL_DIR/tokenizer.json)
//   text_probe synthetic DIR VOCAB     writes the make-model tokenizer for a VOCAB-row model into DIR
//   text_probe load TOKENIZER_JSON     loads, prints describe() or the error (exit 1)
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "text/chat_template.h"
#include "text/stream_decoder.h"
#include "text/synthetic_tokenizer.h"
#include "text/tokenizer.h"

namespace {

using genbridge::text::Tokenizer;
using json = nlohmann::ordered_json;

std::string to_hex(const std::string& s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) out += kDigits[c >> 4], out += kDigits[c & 15];
  return out;
}

std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  std::string s;
  char buf[1 << 16];
  while (std::cin.read(buf, sizeof buf) || std::cin.gcount() > 0) s.append(buf, static_cast<size_t>(std::cin.gcount()));
  return s;
}

int encode(const std::string& path) {
  auto tok = Tokenizer::load(path);
  if (!tok.ok()) {
    std::cerr << tok.status().to_string() << "\n";
    return 1;
  }
  const json requests = json::parse(read_stdin());
  json results = json::array();
  for (const json& r : requests) {
    genbridge::text::EncodeOptions opt;
    if (r.value("invalid_utf8", "error") == "replace") opt.invalid_utf8 = genbridge::text::InvalidUtf8::kReplace;
    opt.split_special_tokens = r.value("split_special_tokens", false);
    auto ids = tok->encode(from_hex(r.at("hex").get<std::string>()), opt);
    if (!ids.ok()) {
      results.push_back({{"error", ids.status().to_string()}});
      continue;
    }
    json res;
    res["ids"] = *ids;
    res["decoded_hex"] = to_hex(tok->decode(*ids));
    res["decoded_skip_special_hex"] = to_hex(tok->decode(*ids, true));
    genbridge::text::StreamDecoder stream(*tok);
    json pieces = json::array();
    for (int32_t id : *ids) pieces.push_back(to_hex(stream.push(id)));
    pieces.push_back(to_hex(stream.finish()));
    res["stream_hex"] = pieces;
    results.push_back(res);
  }
  std::cout << results.dump() << "\n";
  return 0;
}

int chat(const std::string& dir) {
  auto config = genbridge::text::TokenizerConfig::load(dir);
  auto tok = Tokenizer::load(dir);
  if (!config.ok() || !tok.ok()) {
    std::cerr << (config.ok() ? tok.status() : config.status()).to_string() << "\n";
    return 1;
  }
  const json requests = json::parse(read_stdin());
  json results = json::array();
  for (const json& r : requests) {
    auto text = config->render_chat(r);
    if (!text.ok()) {
      results.push_back({{"error", text.status().to_string()}});
      continue;
    }
    auto ids = tok->encode(*text);
    if (!ids.ok()) {
      results.push_back({{"error", ids.status().to_string()}});
      continue;
    }
    results.push_back({{"text", *text}, {"ids", *ids}});
  }
  std::cout << results.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "synthetic") {
    const auto st = genbridge::text::write_synthetic_tokenizer(argv[2], std::stoll(argv[3]));
    if (!st.ok()) std::cerr << st.to_string() << "\n";
    return st.ok() ? 0 : 1;
  }
  if (argc != 3) {
    std::fprintf(stderr, "usage: text_probe encode|chat|load PATH | synthetic DIR VOCAB\n");
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "encode") return encode(argv[2]);
  if (mode == "chat") return chat(argv[2]);
  if (mode == "load") {
    auto tok = Tokenizer::load(argv[2]);
    if (!tok.ok()) {
      std::cerr << tok.status().to_string() << "\n";
      return 1;
    }
    std::cout << tok->describe() << "\n";
    return 0;
  }
  std::fprintf(stderr, "text_probe: unknown mode '%s' (encode, chat, load)\n", mode.c_str());
  return 2;
}
