#include "bench/tokenizer_bench.h"

#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

namespace prl::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Documents of 1-8 KB mixing the kinds of text a prompt set holds.
std::vector<std::string> MakeCorpus(int64_t bytes) {
  static const char* const kWords[] = {
      "the",       "model",      "learns",   "from",     "rewards",    "while",   "actors",
      "generate",  "samples",    "Pipeline", "weights",  "are",        "swapped", "in",
      "flight",    "between",    "decode",   "steps",    "importance", "ratio",   "group",
      "advantage", "normalised", "per",      "prompt",   "isn't",      "we'll",   "it's",
      "GPU",       "throughput", "latency",  "tokens/s", "e.g.",       "(see",    "below)"};
  static const char* const kPieces[] = {
      "def reward(sample):\n    return 1.0 if sample.answer == ref else 0.0\n",
      "for (int i = 0; i < n; ++i) {\n\tacc += x[i] * w[i];\n}\n",
      "{\"role\": \"user\", \"content\": \"Solve 12*7+3\"}\n",
      "强化学习中的策略梯度方法，通过奖励信号来更新模型参数。",
      "日本語のテキストも含まれています。カタカナ、ひらがな、漢字。",
      "Обучение с подкреплением для языковых моделей. ",
      "التعلم المعزز للنماذج اللغوية الكبيرة. ",
      "😀👍🏽 👨‍👩‍👧‍👦 🇯🇵 ✅ ",
      "    \n\n\t\t  ",
      "x = 3.14159265358979323846; y = 2718281828459045; ",
      "<|im_start|>assistant\n<think>\nLet me check.\n</think>\n",
  };
  std::mt19937 rng(1);
  std::vector<std::string> docs;
  int64_t total = 0;
  while (total < bytes) {
    std::string doc;
    const size_t target = 1024 + rng() % 7168;
    while (doc.size() < target) {
      if (rng() % 4 == 0) {
        doc += kPieces[rng() % std::size(kPieces)];
      } else {
        for (int w = 0; w < 12; ++w) {
          doc += kWords[rng() % std::size(kWords)];
          doc += rng() % 10 == 0 ? ", " : " ";
        }
        doc += absl::StrCat(rng() % 100000, ". ");
      }
    }
    total += static_cast<int64_t>(doc.size());
    docs.push_back(std::move(doc));
  }
  return docs;
}

struct Throughput {
  double mb_per_s = 0.0;
  int64_t tokens = 0;  // per pass
};

// `threads` workers encode documents t, t + threads, ...; the clock covers `iterations` passes.
absl::StatusOr<Throughput> MeasurePrl(const tokenizer::Tokenizer& t,
                                      const std::vector<std::string>& docs, int threads,
                                      int iterations) {
  std::vector<int64_t> tokens(threads, 0);
  std::vector<absl::Status> errors(threads);
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      for (int it = 0; it < iterations; ++it) {
        tokens[w] = 0;
        for (size_t i = w; i < docs.size(); i += threads) {
          absl::StatusOr<std::vector<int32_t>> ids = t.Encode(docs[i], false);
          if (!ids.ok()) {
            errors[w] = ids.status();
            return;
          }
          tokens[w] += static_cast<int64_t>(ids->size());
        }
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
  Throughput out;
  int64_t bytes = 0;
  for (const std::string& d : docs) bytes += static_cast<int64_t>(d.size());
  for (int w = 0; w < threads; ++w) {
    PRL_RETURN_IF_ERROR(errors[w]);
    out.tokens += tokens[w];
  }
  out.mb_per_s = static_cast<double>(bytes) / seconds / 1e6;
  return out;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// `processes` node processes, one shard each, started together once all have loaded.
absl::StatusOr<Throughput> MeasureJs(const TokenizerBenchOptions& o, const std::string& corpus,
                                     const std::string& dir, int processes) {
  const std::string barrier = absl::StrCat(dir, "/barrier", processes);
  mkdir(barrier.c_str(), 0755);
  std::vector<FILE*> pipes;
  for (int p = 0; p < processes; ++p) {
    const std::string command =
        absl::StrCat("NODE_PATH='", o.js_modules, "' '", o.node, "' '", o.js_driver, "' '", o.model,
                     "' '", corpus, "' ", o.iterations, " ", p, " ", processes, " '", barrier, "'");
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", command));
    pipes.push_back(pipe);
  }
  // Wait until every process has loaded and warmed up; one whose pipe is readable before it is
  // ready has exited (it prints only at the end).
  for (int p = 0; p < processes; ++p) {
    while (!Exists(absl::StrCat(barrier, "/ready.", p))) {
      pollfd fd = {fileno(pipes[p]), POLLIN, 0};
      if (poll(&fd, 1, 20) > 0) break;
    }
  }
  std::ofstream(barrier + "/go") << "";
  Throughput out;
  double slowest = 0.0;
  int64_t bytes = 0;
  std::string failure;
  for (FILE* pipe : pipes) {
    std::string text;
    char buffer[4096];
    for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) text.append(buffer, n);
    const int rc = pclose(pipe);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (rc != 0 || !j.is_object() || !j.contains("seconds")) {
      failure = absl::StrCat(
          "the JavaScript baseline failed (", o.js_driver, ", exit ", rc,
          "); run scripts/setup_test_references.sh, or pass --node '' for no baseline");
      continue;
    }
    slowest = std::max(slowest, j["seconds"].get<double>());
    bytes += j["bytes"].get<int64_t>();
    out.tokens += j["tokens"].get<int64_t>();
  }
  if (!failure.empty()) return absl::FailedPreconditionError(failure);
  out.mb_per_s = static_cast<double>(bytes) / slowest / 1e6;
  return out;
}

}  // namespace

absl::StatusOr<Report> RunTokenizerBench(const TokenizerBenchOptions& options) {
  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  PRL_ASSIGN_OR_RETURN(const std::unique_ptr<tokenizer::Tokenizer> t,
                       tokenizer::Tokenizer::Load(options.model));
  const std::vector<std::string> docs = MakeCorpus(options.corpus_bytes);
  int64_t bytes = 0;
  for (const std::string& d : docs) bytes += static_cast<int64_t>(d.size());
  PRL_RETURN_IF_ERROR(MeasurePrl(*t, docs, 1, 1).status());  // warm-up, as the JS driver does
  PRL_ASSIGN_OR_RETURN(const Throughput one, MeasurePrl(*t, docs, 1, options.iterations));
  PRL_ASSIGN_OR_RETURN(const Throughput all, MeasurePrl(*t, docs, threads, options.iterations));

  Throughput js_one, js_all;
  const bool js = !options.node.empty();
  if (js) {
    char dir_template[] = "/tmp/prl_tokenizer_bench_XXXXXX";
    if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
    const std::string corpus = absl::StrCat(dir_template, "/corpus.json");
    std::ofstream(corpus) << nlohmann::json(docs).dump();
    PRL_ASSIGN_OR_RETURN(js_one, MeasureJs(options, corpus, dir_template, 1));
    PRL_ASSIGN_OR_RETURN(js_all, MeasureJs(options, corpus, dir_template, threads));
  }
  Report report;
  report.bench = "tokenizer";
  report.machine = MachineInfo();
  report.setup = {{"model", options.model},
                  {"corpus", absl::StrFormat("%d documents, %.2f MB (mixed scripts, code, emoji)",
                                             docs.size(), bytes / 1e6)},
                  {"tokens per pass",
                   js ? absl::StrCat(one.tokens, " (prl), ", js_one.tokens, " (transformers.js)")
                      : absl::StrCat(one.tokens)},
                  {"iterations", absl::StrCat(options.iterations, " timed passes after a warm-up")},
                  {"all cores", absl::StrCat(threads, " threads / node processes")}};
  const std::string js_name = "transformers.js (@lenml/tokenizers, node)";
  report.results.push_back(
      {"encode_1_thread", one.mb_per_s, "MB/s", js ? js_name : "", js_one.mb_per_s});
  report.results.push_back({absl::StrCat("encode_", threads, "_threads"), all.mb_per_s, "MB/s",
                            js ? absl::StrCat(js_name, " x", threads, " processes") : "",
                            js_all.mb_per_s});
  return report;
}

}  // namespace prl::bench
