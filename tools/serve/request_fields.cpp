#include "tools/serve/request_fields.h"

#include <array>

namespace genbridge::serve {

namespace {
using S = FieldStatus;
constexpr unsigned C = kCompletions, H = kChat, B = kBothEndpoints;
constexpr std::array kFields{
    // The request.
    RequestField{"model", B, S::kHonoured},
    RequestField{"prompt", C, S::kHonoured},
    RequestField{"messages", H, S::kHonoured},
    RequestField{"stream", B, S::kHonoured},
    RequestField{"stream_options", B, S::kHonoured},
    RequestField{"max_tokens", B, S::kHonoured},
    RequestField{"max_completion_tokens", H, S::kHonoured},
    RequestField{"n", B, S::kHonoured},
    RequestField{"best_of", B, S::kHonoured},
    RequestField{"echo", B, S::kHonoured},
    RequestField{"logprobs", B, S::kHonoured},
    RequestField{"top_logprobs", H, S::kHonoured},
    RequestField{"return_tokens_as_token_ids", B, S::kHonoured},
    RequestField{"return_token_ids", B, S::kHonoured},
    RequestField{"request_id", B, S::kHonoured},
    // Sampling.
    RequestField{"temperature", B, S::kHonoured},
    RequestField{"top_p", B, S::kHonoured},
    RequestField{"top_k", B, S::kHonoured},
    RequestField{"min_p", B, S::kHonoured},
    RequestField{"seed", B, S::kHonoured},
    RequestField{"presence_penalty", B, S::kHonoured},
    RequestField{"frequency_penalty", B, S::kHonoured},
    RequestField{"repetition_penalty", B, S::kHonoured},
    RequestField{"logit_bias", B, S::kHonoured},
    RequestField{"allowed_token_ids", B, S::kHonoured},
    RequestField{"stop", B, S::kHonoured},
    RequestField{"stop_token_ids", B, S::kHonoured},
    RequestField{"include_stop_str_in_output", B, S::kHonoured},
    RequestField{"ignore_eos", B, S::kHonoured},
    RequestField{"min_tokens", B, S::kHonoured},
    RequestField{"skip_special_tokens", B, S::kHonoured},
    RequestField{"spaces_between_special_tokens", B, S::kHonoured},
    RequestField{"truncate_prompt_tokens", B, S::kHonoured},
    RequestField{"add_special_tokens", B, S::kHonoured},
    // Chat templates.
    RequestField{"add_generation_prompt", H, S::kHonoured},
    RequestField{"continue_final_message", H, S::kHonoured},
    RequestField{"chat_template", H, S::kHonoured},
    RequestField{"chat_template_kwargs", H, S::kHonoured},
    RequestField{"documents", H, S::kHonoured},
    RequestField{"include_reasoning", H, S::kHonoured},
    // Identifiers and hints with no effect on the output by definition.
    RequestField{"user", B, S::kHonoured},
    RequestField{"safety_identifier", B, S::kHonoured},
    RequestField{"prompt_cache_key", B, S::kHonoured},
    RequestField{"cache_salt", B, S::kHonoured},
    // Accepted at their default only.
    RequestField{"service_tier", B, S::kDefaultOnly},
    RequestField{"store", B, S::kDefaultOnly},
    RequestField{"metadata", B, S::kDefaultOnly},
    RequestField{"modalities", H, S::kDefaultOnly},
    RequestField{"priority", B, S::kDefaultOnly},  // honoured under --scheduling-policy priority
    RequestField{"use_beam_search", B, S::kDefaultOnly},
    RequestField{"length_penalty", B, S::kDefaultOnly},
    RequestField{"bad_words", H, S::kDefaultOnly},
    // Refused.
    RequestField{"suffix", C, S::kRefused},
    RequestField{"prompt_logprobs", B, S::kRefused},
    RequestField{"prompt_embeds", C, S::kRefused},
    RequestField{"reasoning_effort", H, S::kRefused},
    RequestField{"verbosity", H, S::kRefused},
    RequestField{"audio", H, S::kRefused},
    RequestField{"prediction", H, S::kRefused},
    RequestField{"web_search_options", H, S::kRefused},
    RequestField{"functions", H, S::kRefused},
    RequestField{"function_call", H, S::kRefused},
    RequestField{"logits_processors", B, S::kRefused},
    RequestField{"kv_transfer_params", B, S::kRefused},
    RequestField{"vllm_xargs", B, S::kRefused},
    RequestField{"mm_processor_kwargs", H, S::kRefused},
    // Tool calling and structured outputs (tools/serve/output_fields.cpp).
    RequestField{"tools", H, S::kHonoured},
    RequestField{"tool_choice", H, S::kHonoured},
    RequestField{"parallel_tool_calls", H, S::kHonoured},
    RequestField{"response_format", B, S::kHonoured},
    RequestField{"guided_json", B, S::kHonoured},
    RequestField{"guided_regex", B, S::kHonoured},
    RequestField{"guided_choice", B, S::kHonoured},
    RequestField{"structured_outputs", B, S::kHonoured},
    RequestField{"guided_grammar", B, S::kRefused},
    RequestField{"guided_decoding_backend", B, S::kRefused},
    RequestField{"guided_whitespace_pattern", B, S::kRefused},
    RequestField{"structural_tag", H, S::kRefused},
};
}  // namespace

std::span<const RequestField> request_fields() { return kFields; }

const RequestField* find_request_field(std::string_view name) {
  for (const RequestField& f : kFields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

}  // namespace genbridge::serve
