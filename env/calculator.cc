#include "env/calculator.h"

#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl::env {

namespace {

constexpr size_t kMaxExpressionBytes = 256;
constexpr int kMaxDepth = 32;

// A recursive-descent parser over int64 with overflow checks; `trace` (optional) gets each
// operation's line as it is evaluated.
class Parser {
 public:
  Parser(absl::string_view text, std::vector<std::string>* trace) : text_(text), trace_(trace) {}

  absl::StatusOr<int64_t> Parse() {
    absl::StatusOr<int64_t> value = Sum(0);
    if (!value.ok()) return value;
    Skip();
    if (at_ != text_.size()) return Error(absl::StrCat("unexpected '", text_.substr(at_, 1), "'"));
    return value;
  }

 private:
  absl::StatusOr<int64_t> Sum(int depth) {
    absl::StatusOr<int64_t> left = Product(depth);
    while (left.ok() && Peek("+-")) {
      const char op = text_[at_++];
      absl::StatusOr<int64_t> right = Product(depth);
      if (!right.ok()) return right;
      int64_t out;
      if (op == '+' ? __builtin_add_overflow(*left, *right, &out)
                    : __builtin_sub_overflow(*left, *right, &out)) {
        return Error("overflow");
      }
      Trace(*left, op, *right, out);
      left = out;
    }
    return left;
  }

  absl::StatusOr<int64_t> Product(int depth) {
    absl::StatusOr<int64_t> left = Factor(depth);
    while (left.ok() && Peek("*/")) {
      const char op = text_[at_++];
      absl::StatusOr<int64_t> right = Factor(depth);
      if (!right.ok()) return right;
      int64_t out;
      if (op == '*') {
        if (__builtin_mul_overflow(*left, *right, &out)) return Error("overflow");
      } else {
        if (*right == 0) return Error("division by zero");
        if (*right == -1 && *left == INT64_MIN) return Error("overflow");
        if (*left % *right != 0) {
          return Error(absl::StrCat(*left, "/", *right, " is not an integer"));
        }
        out = *left / *right;
      }
      Trace(*left, op, *right, out);
      left = out;
    }
    return left;
  }

  absl::StatusOr<int64_t> Factor(int depth) {
    if (depth > kMaxDepth) return Error("too deeply nested");
    Skip();
    if (Peek("-")) {
      ++at_;
      absl::StatusOr<int64_t> v = Factor(depth + 1);
      if (!v.ok()) return v;
      if (*v == INT64_MIN) return Error("overflow");
      return -*v;
    }
    if (Peek("(")) {
      ++at_;
      absl::StatusOr<int64_t> v = Sum(depth + 1);
      if (!v.ok()) return v;
      if (!Peek(")")) return Error("missing ')'");
      ++at_;
      return v;
    }
    const size_t start = at_;
    while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
    if (start == at_) {
      return Error(at_ < text_.size() ? absl::StrCat("unexpected '", text_.substr(at_, 1), "'")
                                      : "a number is missing at the end");
    }
    int64_t v;
    if (!absl::SimpleAtoi(text_.substr(start, at_ - start), &v)) return Error("number too large");
    return v;
  }

  // "a*b=c"; a multiplication by b >= 10 first adds a*(digit * 10^k) for each nonzero digit
  // of b, lowest first (long multiplication's partial products; none overflows: each is at
  // most a*b in magnitude).
  void Trace(int64_t a, char op, int64_t b, int64_t out) {
    if (trace_ == nullptr) return;
    if (op == '*' && b >= 10) {
      int64_t place = 1;
      for (int64_t rest = b; rest > 0; rest /= 10, place *= 10) {
        const int64_t part = rest % 10 * place;
        if (part != 0) trace_->push_back(absl::StrCat(a, "*", part, "=", a * part));
        if (rest < 10) break;  // place * 10 may overflow past b's last digit
      }
    }
    trace_->push_back(absl::StrCat(a, std::string(1, op), b, "=", out));
  }

  void Skip() {
    while (at_ < text_.size() && text_[at_] == ' ') ++at_;
  }
  bool Peek(absl::string_view chars) {
    Skip();
    return at_ < text_.size() && chars.find(text_[at_]) != absl::string_view::npos;
  }
  static absl::Status Error(const std::string& why) { return absl::InvalidArgumentError(why); }

  absl::string_view text_;
  std::vector<std::string>* trace_;  // null: not traced
  size_t at_ = 0;
};

}  // namespace

absl::StatusOr<int64_t> EvaluateExpression(absl::string_view expression,
                                           std::vector<std::string>* trace) {
  if (expression.size() > kMaxExpressionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("longer than ", kMaxExpressionBytes, " bytes"));
  }
  return Parser(expression, trace).Parse();
}

std::string ToolReply(absl::string_view expression, int64_t output_chars) {
  std::vector<std::string> lines;
  const absl::StatusOr<int64_t> value =
      EvaluateExpression(expression, output_chars > 0 ? &lines : nullptr);
  if (!value.ok()) return absl::StrCat("error: ", value.status().message());
  const std::string result = absl::StrCat(*value);
  const int64_t room = output_chars - static_cast<int64_t>(result.size());
  if (room <= 0) return result;
  std::string trace;
  for (const std::string& line : lines) absl::StrAppend(&trace, line, "\n");
  std::string reply;
  reply.reserve(static_cast<size_t>(output_chars));
  while (!trace.empty() && reply.size() + trace.size() <= static_cast<size_t>(room)) {
    reply += trace;
  }
  reply.append(static_cast<size_t>(room) - reply.size(), ' ');
  return reply + result;
}

bool LastInteger(absl::string_view text, int64_t* value) {
  size_t end = text.size();
  while (end > 0 && !std::isdigit(static_cast<unsigned char>(text[end - 1]))) --end;
  if (end == 0) return false;
  size_t start = end;
  while (start > 0 && std::isdigit(static_cast<unsigned char>(text[start - 1]))) --start;
  if (start > 0 && text[start - 1] == '-') --start;
  return absl::SimpleAtoi(text.substr(start, end - start), value);
}

std::string CalculatorTools(const std::string& name) {
  nlohmann::ordered_json tool = {
      {"type", "function"},
      {"function",
       {{"name", name},
        {"description",
         "Evaluates an arithmetic expression of integers with + - * / and parentheses."},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"expression", {{"type", "string"}}}}},
          {"required", {"expression"}}}}}}};
  return nlohmann::ordered_json::array({tool}).dump();
}

absl::StatusOr<v1::StartEpisodeResponse> CalculatorEnvironment::StartEpisode(
    const v1::StartEpisodeRequest& request) {
  State state;
  if (!absl::SimpleAtoi(request.reference(), &state.answer)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calculator: reference: expected the answer as an integer, found '",
        request.reference().substr(0, 64), "'"));
  }
  state.call_open = Parameter(request, "call_open", kDefaultCallOpen);
  state.call_close = Parameter(request, "call_close", kDefaultCallClose);
  if (state.call_open.empty() || state.call_close.empty() || state.call_close.size() > 64) {
    return absl::InvalidArgumentError(
        "calculator: parameters call_open and call_close: expected 1 to 64 bytes each");
  }
  state.tool_name = Parameter(request, "tool_name", "");
  if (state.tool_name.size() > 64) {
    return absl::InvalidArgumentError("calculator: parameter tool_name: expected at most 64 bytes");
  }
  PRL_ASSIGN_OR_RETURN(state.output_chars,
                       IntParameter(request.parameters(), "output_chars", 0, "calculator"));
  if (state.output_chars < 0 || state.output_chars > kMaxOutputChars) {
    return absl::InvalidArgumentError(
        absl::StrCat("calculator: parameter output_chars: expected 0 to ", kMaxOutputChars,
                     " (characters of a tool reply; 0: the result alone), found ",
                     state.output_chars));
  }
  episodes_.Start(request.episode_id(), [&] { return state; });
  v1::StartEpisodeResponse response;
  if (state.tool_name.empty()) {
    response.add_stop_strings(state.call_close);
  } else {
    response.set_tools_json(CalculatorTools(state.tool_name));
  }
  return response;
}

absl::StatusOr<v1::StepResponse> CalculatorEnvironment::Step(const v1::StepRequest& request) {
  return episodes_.Step(request, [&](State& s) -> absl::StatusOr<v1::StepResponse> {
    v1::StepResponse response;
    if (!s.tool_name.empty() && request.tool_calls_size() > 0) {  // structured calls
      for (const v1::ToolCall& call : request.tool_calls()) {
        v1::EnvMessage* result = response.add_messages();
        result->set_role("tool");
        result->set_name(call.name());
        result->set_tool_call_id(call.id());
        const nlohmann::json args =
            nlohmann::json::parse(call.arguments_json(), nullptr, /*allow_exceptions=*/false);
        if (call.name() != s.tool_name) {
          result->set_content(absl::StrCat("error: unknown tool ", call.name().substr(0, 64)));
        } else if (!args.is_object() || !args.contains("expression") ||
                   !args["expression"].is_string()) {
          result->set_content("error: expected {\"expression\": \"...\"}");
        } else {
          result->set_content(ToolReply(args["expression"].get<std::string>(), s.output_chars));
        }
        ++s.calls;
      }
      return response;
    }
    const std::string& text = request.text();
    const size_t open = text.rfind(s.call_open);
    const bool call = text.size() >= s.call_close.size() &&
                      text.compare(text.size() - s.call_close.size(), s.call_close.size(),
                                   s.call_close) == 0 &&
                      open != std::string::npos &&
                      open + s.call_open.size() <= text.size() - s.call_close.size();
    if (s.tool_name.empty() && call && request.turn_end() == v1::TURN_END_STOP_STRING) {
      const size_t from = open + s.call_open.size();
      v1::EnvMessage* result = response.add_messages();
      result->set_role("tool");
      result->set_name("calculator");
      result->set_content(ToolReply(
          absl::string_view(text).substr(from, text.size() - s.call_close.size() - from),
          s.output_chars));
      ++s.calls;
      return response;
    }
    int64_t answer = 0;
    const bool right = LastInteger(text, &answer) && answer == s.answer;
    response.set_done(true);
    response.set_episode_reward(right ? 1.0 : 0.0);
    response.set_done_reason(absl::StrCat(right ? "right" : "wrong", " answer after ", s.calls,
                                          " calculator calls"));
    return response;
  });
}

absl::StatusOr<v1::EndEpisodeResponse> CalculatorEnvironment::EndEpisode(
    const v1::EndEpisodeRequest& request) {
  return episodes_.End(request, [](State&) { return v1::EndEpisodeResponse(); });  // 0: no answer
}

}  // namespace prl::env
