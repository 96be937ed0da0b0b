// The JavaScript baseline of `prl bench tokenizer` (bench/tokenizer_bench.cc): transformers.js'
// tokenizer (@lenml/tokenizers, installed by scripts/setup_test_references.sh) encodes the same
// corpus as prl; only the encode loop is timed.
//   node tokenizer_bench.cjs MODEL_DIR CORPUS.json ITERATIONS SHARD NUM_SHARDS BARRIER_DIR
// Encodes documents SHARD, SHARD + NUM_SHARDS, ... once untimed (warm-up), writes
// BARRIER_DIR/ready.SHARD, waits for BARRIER_DIR/go (so that parallel shards run together),
// then times ITERATIONS passes and prints {"seconds", "bytes", "tokens"} for one pass.
"use strict";
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require("@lenml/tokenizers");

const [modelDir, corpusFile, iterations, shard, numShards, barrier] = process.argv.slice(2);
const read = (name) => JSON.parse(fs.readFileSync(path.join(modelDir, name), "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: read("tokenizer.json"),
  tokenizerConfig: read("tokenizer_config.json"),
});
const docs = JSON.parse(fs.readFileSync(corpusFile, "utf8")).filter(
  (_, i) => i % Number(numShards) === Number(shard));
const pass = () => {
  let tokens = 0;
  for (const doc of docs) tokens += tokenizer.encode(doc, { add_special_tokens: false }).length;
  return tokens;
};
pass();
fs.writeFileSync(path.join(barrier, `ready.${shard}`), "");
const sleeper = new Int32Array(new SharedArrayBuffer(4));
while (!fs.existsSync(path.join(barrier, "go"))) Atomics.wait(sleeper, 0, 0, 1);
const start = process.hrtime.bigint();
let tokens = 0;
for (let i = 0; i < Number(iterations); ++i) tokens = pass();
const seconds = Number(process.hrtime.bigint() - start) / 1e9 / Number(iterations);
const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d, "utf8"), 0);
process.stdout.write(JSON.stringify({ seconds, bytes, tokens }));
