// `prl task export`: the built-in arithmetic task's prompts as a prompt file (JSONL lines
// {"text": "12+34=", "reference": "46"}), so that the same problems can run as task.name =
// prompts through any model's own tokenizer, or be submitted with `prl submit`. With --chat,
// chat prompts ({"messages": [{"role": "user", "content": "12+34="}], "reference": "46"},
// optionally a system message and chat_template_kwargs) for models with a chat template: what
// tools (the calculator's, an agent's) render into.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/config_flags.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "task/arithmetic_task.h"

namespace prl::cli {

namespace {

struct ExportFlags {
  std::shared_ptr<ConfigFlags> config;
  std::string split = "train", out;
  int64_t count = 1000;
  bool chat = false;
  std::string system;       // --chat: a system message first ("" none)
  std::string kwargs_json;  // --chat: chat_template_kwargs, a JSON object ("" none)
};

absl::Status RunExportTask(const ExportFlags& f, const config::RunConfig& c) {
  if (f.split != "train" && f.split != "eval") {
    return absl::InvalidArgumentError(
        absl::StrCat("--split: expected train or eval, found '", f.split, "'"));
  }
  if (f.count < 1 || f.count > 10'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--count: expected 1 to 10000000, found ", f.count));
  }
  task::ArithmeticConfig t;
  t.min_digits = c.task.min_digits;
  t.max_digits = c.task.max_digits;
  t.operations = c.task.operations;
  const bool train = f.split == "train";
  // The seeds prl run draws its warm-start (train) and held-out (eval) problems with.
  PRL_ASSIGN_OR_RETURN(
      const std::vector<task::ArithmeticProblem> problems,
      task::GenerateProblems(t, train ? task::Split::kTrain : task::Split::kHeldOut,
                             train ? c.run.seed * 7919 + 1 : c.run.seed, f.count));
  nlohmann::ordered_json kwargs;
  if (!f.kwargs_json.empty()) {
    kwargs = nlohmann::ordered_json::parse(f.kwargs_json, nullptr, /*allow_exceptions=*/false);
    if (!f.chat || kwargs.is_discarded() || !kwargs.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--chat-template-kwargs: expected a JSON object, with --chat, found '",
          f.kwargs_json.substr(0, 64), "'"));
    }
  }
  if (!f.system.empty() && !f.chat) {
    return absl::InvalidArgumentError("--system: a system message needs --chat");
  }
  std::string text;
  for (const task::ArithmeticProblem& p : problems) {
    nlohmann::ordered_json line;
    if (f.chat) {
      line["messages"] = nlohmann::ordered_json::array();
      if (!f.system.empty()) line["messages"].push_back({{"role", "system"}, {"content", f.system}});
      line["messages"].push_back({{"role", "user"}, {"content", p.prompt}});
      if (!kwargs.is_null()) line["chat_template_kwargs"] = kwargs;
    } else {
      line["text"] = p.prompt;
    }
    line["reference"] = p.answer;
    absl::StrAppend(&text, line.dump(), "\n");
  }
  PRL_RETURN_IF_ERROR(WriteFileAtomically(f.out, text));
  std::printf("wrote %s: %lld %s prompts of the arithmetic task\n", f.out.c_str(),
              static_cast<long long>(problems.size()), f.split.c_str());
  return absl::OkStatus();
}

}  // namespace

void RegisterTaskCommands(CLI::App& app, CommandRegistry& registry) {
  CLI::App* task = app.add_subcommand("task", "The built-in task");
  task->require_subcommand(1);
  auto f = std::make_shared<ExportFlags>();
  CLI::App* exp = task->add_subcommand(
      "export", "Write the arithmetic task's prompts and answers as a JSONL prompt file");
  f->config = std::make_shared<ConfigFlags>(exp);
  f->config->Shorthand("--seed", "run.seed")
      .Shorthand("--min-digits", "task.min_digits")
      .Shorthand("--max-digits", "task.max_digits")
      .Shorthand("--operations", "task.operations");
  exp->add_option("--split", f->split, "train or eval (held out: never among the train ones)")
      ->capture_default_str();
  exp->add_option("--count", f->count, "Prompts to write")->capture_default_str();
  exp->add_option("--out", f->out, "The JSONL file to write")->required();
  exp->add_flag("--chat", f->chat, "Chat prompts (messages) instead of text");
  exp->add_option("--system", f->system, "--chat: a system message before each question");
  exp->add_option("--chat-template-kwargs", f->kwargs_json,
                  "--chat: template variables, a JSON object, e.g. '{\"enable_thinking\": false}'");
  registry.Add(exp, [f] {
    return f->config->Run([&](const config::RunConfig& c) { return RunExportTask(*f, c); });
  });
}

}  // namespace prl::cli
