#pragma once
// Every request field of /v1/completions and /v1/chat/completions that OpenAI's API or vLLM's extensions
// define, with what this server does with it: a request naming a field that is not here (or not for its
// endpoint) is refused (400 "Unrecognized request argument supplied: ...", OpenAI's answer), and each field
// here is honoured or refused by its parser in tools/serve/openai.cpp. docs/serving.md's field table says
// what each does; tests/serve (case field_table) sends every row of that table.

#include <span>
#include <string_view>

namespace genbridge::serve {

enum EndpointMask : unsigned { kCompletions = 1, kChat = 2, kBothEndpoints = 3 };

enum class FieldStatus {
  kHonoured,     // implemented (a value outside its rule: 400 naming the field)
  kDefaultOnly,  // accepted at its default (or neutral) value only; anything else: 400 naming the field
  kRefused,      // any value but null: 400 naming the field
};

struct RequestField {
  std::string_view name;
  unsigned endpoints;
  FieldStatus status;
};

// Every field, in the order docs/serving.md lists them.
std::span<const RequestField> request_fields();
// The field `name`, or nullptr.
const RequestField* find_request_field(std::string_view name);

}  // namespace genbridge::serve
