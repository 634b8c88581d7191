#pragma once
// The request fields that shape the output (docs/serving.md, "Tool calls and structured outputs"): tools,
// tool_choice, parallel_tool_calls, response_format, and vLLM's guided_json / guided_regex / guided_choice /
// structured_outputs. Each is honoured or refused with a 400 naming it; none is ignored.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "text/chat_template.h"
#include "tools/serve/openai.h"

namespace genbridge::serve {

// Validates the output fields of `body` (the request body with its key order: schemas list their properties in
// order, templates render tools as sent), sets r.tool_format / r.max_tool_calls and compiles r.grammar (within
// `limits`' deadline; stopped when `limits.cancelled`). r.prompts, r.max_tokens, r.template_tools and the stop
// tokens are set already: a grammar whose shortest output does not fit max_tokens is refused naming it. A body
// with none of these fields costs a few lookups.
std::optional<ApiError> parse_output_fields(const nlohmann::ordered_json& body, bool chat, const ServedModel& model,
                                            const text::RenderLimits& limits, ParsedRequest& r);

}  // namespace genbridge::serve
