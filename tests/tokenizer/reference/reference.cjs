// The JavaScript references of prl's tokenizer tests, run by tests/tokenizer/*_test.cc:
//   node reference.cjs encode MODEL_DIR TEXTS.json   -> [{ids, ids_plain, text, text_skip}, ...]
//     transformers.js' tokenizer (@lenml/tokenizers) loaded from MODEL_DIR/tokenizer.json and
//     tokenizer_config.json; ids with and without special tokens, and the decode of `ids` with
//     and without skip_special_tokens.
//   node reference.cjs render CASES.json             -> [{text} | {error}, ...]
//     @huggingface/jinja: each case {template, context} rendered.
"use strict";
const fs = require("fs");
const path = require("path");

function encode(modelDir, textsFile) {
  const { TokenizerLoader } = require("@lenml/tokenizers");
  const tokenizer = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(
      fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8")),
  });
  const decode = (ids, skip) =>
    ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: skip });
  const texts = JSON.parse(fs.readFileSync(textsFile, "utf8"));
  return texts.map((text) => {
    const ids = tokenizer.encode(text);
    return {
      ids,
      ids_plain: tokenizer.encode(text, { add_special_tokens: false }),
      text: decode(ids, false),
      text_skip: decode(ids, true),
    };
  });
}

function render(casesFile) {
  const { Template } = require("@huggingface/jinja");
  const cases = JSON.parse(fs.readFileSync(casesFile, "utf8"));
  return cases.map(({ template, context }) => {
    try {
      return { text: new Template(template).render(context) };
    } catch (e) {
      return { error: String(e.message || e) };
    }
  });
}

const [mode, ...args] = process.argv.slice(2);
let result;
if (mode === "encode") {
  result = encode(args[0], args[1]);
} else if (mode === "render") {
  result = render(args[0]);
} else {
  console.error("usage: node reference.cjs encode MODEL_DIR TEXTS.json | render CASES.json");
  process.exit(2);
}
process.stdout.write(JSON.stringify(result));
