#include "text/chat_template.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "text/jinja/template.h"
#include "text/json_text.h"

namespace genbridge::text {

using ojson = nlohmann::ordered_json;

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  GB_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::parse(source));
  ChatTemplate c;
  c.template_ = std::make_shared<const jinja::Template>(std::move(t));
  return c;
}

Result<std::string> ChatTemplate::render(const ojson& context, const RenderLimits& limits) const {
  if (!context.is_object()) return invalid_argument("chat template: the context must be a JSON object");
  GB_ASSIGN_OR_RETURN(jinja::Value ctx, jinja::from_json(context, limits.max_value_depth));
  return template_->render(ctx, limits);
}

Result<TokenizerConfig> TokenizerConfig::from_json_text(std::string_view json_text, std::string_view source) {
  GB_ASSIGN_OR_RETURN(ojson root, parse_json_text<ojson>(json_text, source));
  const std::string src(source);
  if (!root.is_object()) return invalid_argument(src + ": $ must be a JSON object");
  TokenizerConfig c;
  const auto token = [&](const char* key, std::optional<std::string>& out) -> Status {
    const auto it = root.find(key);
    if (it == root.end() || it->is_null()) return ok_status();
    if (it->is_string()) {
      out = it->get<std::string>();
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      out = (*it)["content"].get<std::string>();
    } else {
      return invalid_argument(src + ": $." + key + " must be a string or an object with a string 'content'");
    }
    return ok_status();
  };
  GB_RETURN_IF_ERROR(token("bos_token", c.bos_token));
  GB_RETURN_IF_ERROR(token("eos_token", c.eos_token));
  GB_RETURN_IF_ERROR(token("pad_token", c.pad_token));
  GB_RETURN_IF_ERROR(token("unk_token", c.unk_token));
  for (const auto& [key, out] :
       {std::pair<const char*, bool*>{"add_bos_token", &c.add_bos_token}, {"add_eos_token", &c.add_eos_token}}) {
    const auto it = root.find(key);
    if (it == root.end() || it->is_null()) continue;
    if (!it->is_boolean()) return invalid_argument(src + ": $." + key + " must be a boolean");
    *out = it->get<bool>();
  }
  const auto it = root.find("chat_template");
  if (it == root.end() || it->is_null()) return c;
  const auto parse = [&](const ojson& text, const std::string& path) -> Result<ChatTemplate> {
    if (!text.is_string()) return invalid_argument(src + ": " + path + " must be a string");
    auto t = ChatTemplate::parse(text.get<std::string>());
    if (!t.ok()) return invalid_argument(src + ": " + path + ": " + t.status().message());
    return t;
  };
  if (it->is_string()) {
    GB_ASSIGN_OR_RETURN(c.chat_template, parse(*it, "$.chat_template"));
    return c;
  }
  if (!it->is_array())
    return invalid_argument(src + ": $.chat_template must be a string or a list of {name, template}");
  for (size_t i = 0; i < it->size(); ++i) {
    const ojson& e = (*it)[i];
    const std::string path = "$.chat_template[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template")) {
      return invalid_argument(src + ": " + path + " must be {\"name\": ..., \"template\": ...}");
    }
    GB_ASSIGN_OR_RETURN(ChatTemplate t, parse(e["template"], path + ".template"));
    const std::string name = e["name"].get<std::string>();
    if (name == "default") {
      c.chat_template = t;
    } else {
      c.named_templates.emplace(name, std::move(t));
    }
  }
  return c;
}

namespace {

Result<std::string> read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return invalid_argument("tokenizer config: cannot read " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<ChatTemplate> parse_template_file(const std::filesystem::path& file) {
  GB_ASSIGN_OR_RETURN(std::string source, read_file(file));
  auto t = ChatTemplate::parse(source);
  if (!t.ok()) return invalid_argument(file.string() + ": " + t.status().message());
  return t;
}

}  // namespace

Result<TokenizerConfig> TokenizerConfig::load(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (!fs::is_regular_file(path, ec)) {
      return invalid_argument(
          "tokenizer config: " + path.string() +
          " is not a regular file (a tokenizer_config.json, or a directory holding one, is needed)");
    }
    GB_ASSIGN_OR_RETURN(std::string text, read_file(path));
    return from_json_text(text, path.string());
  }
  const fs::path config_file = path / kTokenizerConfigFile, template_file = path / kChatTemplateFile,
                 template_dir = path / kChatTemplateDir;
  const bool has_config = fs::is_regular_file(config_file, ec), has_template = fs::is_regular_file(template_file, ec),
             has_dir = fs::is_directory(template_dir, ec);
  if (!has_config && !has_template) {
    return invalid_argument("tokenizer config: " + path.string() + " holds neither " + kTokenizerConfigFile + " nor " +
                            kChatTemplateFile);
  }
  TokenizerConfig c;
  if (has_config) {
    GB_ASSIGN_OR_RETURN(std::string text, read_file(config_file));
    GB_ASSIGN_OR_RETURN(c, from_json_text(text, config_file.string()));
  }
  // Template files replace every template of tokenizer_config.json, as transformers loads them.
  if (!has_template && !has_dir) return c;
  c.chat_template.reset();
  c.named_templates.clear();
  if (has_template) {
    GB_ASSIGN_OR_RETURN(c.chat_template, parse_template_file(template_file));
  }
  if (has_dir) {
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(template_dir, ec)) {
      if (e.path().extension() == ".jinja" && e.is_regular_file(ec)) files.push_back(e.path());
    }
    if (ec) return invalid_argument("tokenizer config: cannot list " + template_dir.string() + ": " + ec.message());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      GB_ASSIGN_OR_RETURN(ChatTemplate t, parse_template_file(f));
      c.named_templates.insert_or_assign(f.stem().string(), std::move(t));
    }
  }
  return c;
}

Result<std::string> TokenizerConfig::render_chat(const ojson& request, const RenderLimits& limits) const {
  if (!request.is_object() || !request.contains("messages")) {
    return invalid_argument("render_chat: the request must be an object with \"messages\"");
  }
  const bool has_tools = request.contains("tools") && !request["tools"].is_null();
  const ChatTemplate* t = chat_template ? &*chat_template : nullptr;
  if (has_tools) {
    if (const auto it = named_templates.find("tool_use"); it != named_templates.end()) t = &it->second;
  }
  if (!t)
    return invalid_argument(
        "render_chat: the tokenizer has no chat template (no chat_template in tokenizer_config.json, no "
        "chat_template.jinja)");
  // Checked before the copy below (nlohmann's copy recurses).
  if (jinja::json_deeper_than(request, limits.max_value_depth)) {
    return jinja::from_json(request, limits.max_value_depth).status();
  }
  ojson ctx = ojson::object();
  const auto put = [&](const char* key, const std::optional<std::string>& v) {
    if (v) ctx[key] = *v;
  };
  put("bos_token", bos_token);
  put("eos_token", eos_token);
  put("pad_token", pad_token);
  put("unk_token", unk_token);
  ctx["tools"] = nullptr;
  ctx["add_generation_prompt"] = false;
  for (const auto& [k, v] : request.items()) ctx[k] = v;
  return t->render(ctx, limits);
}

}  // namespace genbridge::text
