// Chat-template oracle: genbridge renders a model's own chat_template (text_probe chat) and
// @huggingface/jinja renders the same template on the same requests; the texts must be identical, and
// genbridge's ids for the rendered prompt must equal Hugging Face tokenizers' (Rust) ids.
// The variables follow transformers' apply_chat_template: the special tokens, then the request, with
// tools = null and add_generation_prompt = false where the request has none.
// usage: node chat_oracle.mjs --probe PATH --model DIR --name qwen3|deepseek_v3|synthetic
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";
import { Tokenizer as RustTokenizer } from "@anush008/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const config = JSON.parse(fs.readFileSync(path.join(args.model, "tokenizer_config.json"), "utf8"));
const rust = RustTokenizer.fromFile(path.join(args.model, "tokenizer.json"));
const template = new Template(config.chat_template);
const tokenString = (t) => (t === null || t === undefined ? undefined : typeof t === "string" ? t : t.content);

const cases = JSON.parse(fs.readFileSync(path.join(here, "chat_cases.json"), "utf8")).cases
  .filter((c) => !c.templates || c.templates.includes(args.name));
const run = spawnSync(args.probe, ["chat", args.model], { input: JSON.stringify(cases.map((c) => c.request)), maxBuffer: 1 << 28 });
if (run.status !== 0) {
  console.error(`text_probe failed (exit ${run.status}): ${run.stderr}`);
  process.exit(1);
}
const results = JSON.parse(run.stdout.toString());
let failures = 0;
for (let i = 0; i < cases.length; i++) {
  const c = cases[i], r = results[i];
  const ctx = {};
  for (const k of ["bos_token", "eos_token", "pad_token", "unk_token"]) {
    const v = tokenString(config[k]);
    if (v !== undefined) ctx[k] = v;
  }
  Object.assign(ctx, { tools: null, add_generation_prompt: false }, structuredClone(c.request));
  let want;
  try {
    want = template.render(ctx);
  } catch (e) {
    failures++;
    console.log(`FAIL ${c.name}: @huggingface/jinja failed: ${e.message}`);
    continue;
  }
  if (r.error) {
    failures++;
    console.log(`FAIL ${c.name}: genbridge failed: ${r.error}`);
    continue;
  }
  if (r.text !== want) {
    failures++;
    let k = 0;
    while (k < r.text.length && r.text[k] === want[k]) k++;
    console.log(`FAIL ${c.name}: texts differ at character ${k}\n  genbridge: ${JSON.stringify(r.text.slice(Math.max(0, k - 40), k + 60))}\n` +
                `  reference: ${JSON.stringify(want.slice(Math.max(0, k - 40), k + 60))}`);
    continue;
  }
  const ids = (await rust.encode(want, null, { addSpecialTokens: false })).getIds();
  if (JSON.stringify(ids) !== JSON.stringify(r.ids)) {
    failures++;
    console.log(`FAIL ${c.name}: ids of the rendered prompt differ from Hugging Face tokenizers'`);
  }
}
console.log(`${args.name}: ${cases.length} chats rendered by genbridge and by @huggingface/jinja`);
console.log(`${cases.length - failures} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
