#pragma once
// Internal: a Jinja2 template parsed into a tree, and its renderer. The subset is what chat templates use
// (Qwen2/Qwen3, DeepSeek-V3, Llama 3 and their kin); the environment is transformers' (trim_blocks and
// lstrip_blocks on, loopcontrols, tojson without HTML escaping, raise_exception, strftime_now).
// Anything outside the subset is refused at parse time with the construct and its line.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/status.h"
#include "text/chat_template.h"
#include "text/jinja/value.h"

namespace genbridge::text::jinja {

struct Expr;
struct Node;
using ExprPtr = std::unique_ptr<Expr>;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kList,
    kTuple,
    kDict,
    kAttr,
    kIndex,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kUnary,
    kBinary,
    kCond
  };
  Kind kind;
  int line = 0;
  Value literal;              // kLiteral
  std::string name;           // kName, kAttr (attribute), kFilter/kTest (filter/test), kUnary/kBinary (op)
  std::vector<ExprPtr> args;  // operands; kCall/kFilter/kTest: [callee or subject, positional args...];
                              // kDict: key, value, key, value...; kSlice: [object, start, stop, step]
                              // (absent parts null)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall/kFilter/kTest keyword arguments
  bool negated = false;                                 // kTest: "is not"
  int height = 1;                                       // levels of this tree (bounded at parse)
};

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kCallMacroBlock };
  Kind kind;
  int line = 0;
  std::string text;                                     // kText
  ExprPtr expr;                                         // kOutput, kFor (iterable), kSet (value)
  std::vector<std::pair<ExprPtr, Body>> branches;       // kIf: (condition, body)...
  Body body, else_body;                                 // kFor, kSetBlock, kMacro; kIf/kFor else
  std::vector<std::string> targets;                     // kFor loop variables; kSet/kSetBlock names
  std::string attr;                                     // kSet "ns.attr"
  ExprPtr filter;                                       // kFor "if" clause
  std::string name;                                     // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default may be null)
};

struct Macro {
  const Node* node;
};

class Template {
 public:
  // Parses `source` with transformers' environment. InvalidArgument "chat template line 3: ..." for a
  // syntax error, a construct outside the subset or nesting deeper than kMaxTemplateNesting.
  static Result<Template> parse(std::string_view source);
  // Renders with `context` (a dict) as the global variables, within `limits` (chat_template.h).
  Result<std::string> render(const Value& context, const RenderLimits& limits) const;

 private:
  std::shared_ptr<Body> body_;
};

}  // namespace genbridge::text::jinja
