// Encode/decode oracle: genbridge's tokenizer (text_probe) against Hugging Face's own tokenizers library
// (the Rust crate, run by node through @anush008/tokenizers) on the same tokenizer.json, with Hugging
// Face's pure-JS tokenizers (@huggingface/tokenizers) as a second reference.
// For every case: identical ids (token for token), decode(ids) identical to the reference's decode and
// equal to NFC(x) (Qwen3) or x (no normalizer), every streamed piece valid UTF-8 and the pieces together
// equal to decode. Input that is not valid UTF-8 must be refused by default; with invalid_utf8 = replace
// it must encode as the reference encodes the WHATWG-decoded (U+FFFD-replaced) string.
// usage: node encode_oracle.mjs --probe PATH --tokenizer tokenizer.json [--fuzz N] [--docs REPO_ROOT]
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer as RustTokenizer } from "@anush008/tokenizers";
import { Tokenizer as JsTokenizer } from "@huggingface/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
let tokPath = args.tokenizer;
const fuzzCount = Number(args.fuzz ?? 200);
let tokJson = JSON.parse(fs.readFileSync(tokPath, "utf8"));
// --variant added_flags: the same tokenizer with added tokens that use lstrip, rstrip, single_word and
// normalized (the real files use none of them), and cases that exercise them.
const flagCases = [];
if (args.variant === "added_flags") {
  let id = [...Object.values(tokJson.model.vocab), ...tokJson.added_tokens.map((t) => t.id)].reduce((a, b) => Math.max(a, b)) + 1;
  const add = (content, o) => tokJson.added_tokens.push({ id: id++, content, single_word: false, lstrip: false,
                                                          rstrip: false, normalized: false, special: false, ...o });
  add("<mask>", { lstrip: true, rstrip: true, special: true });
  add("[SEP]", { rstrip: true, special: true });
  add("[CLS]", { lstrip: true });
  add("word", { single_word: true, normalized: true });
  add("café", { normalized: true });
  add("naïve", { normalized: false });
  add("<w>", { single_word: true, lstrip: true, rstrip: true });
  tokPath = path.join(fs.mkdtempSync(path.join(process.env.TMPDIR ?? "/tmp", "genbridge-oracle-")), "tokenizer.json");
  fs.writeFileSync(tokPath, JSON.stringify(tokJson));
  for (const t of ["a <mask> b", "a\t<mask>\tb <mask>\u2000x", "<mask><mask>  <mask>", " <mask>", "<mask> ",
                   "x [SEP]   next [SEP]\n\nend[SEP]", "  [CLS]x", "a\u3000[CLS] [CLS][CLS]",
                   "word words sword word_ word. (word) wordy 1word word1 ́word", "wörd word\u0301 word",
                   "cafe\u0301 café CAFÉ cafés", "nai\u0308ve naïve", "<w> a<w> <w>b ,<w>, é<w>",
                   "<mask>[SEP]<mask>", "\u00a0<mask>\u00a0", "[SEP][SEP] [SEP]"]) {
    flagCases.push({ name: "added_flags:" + JSON.stringify(t), text: t });
  }
}
const rust = RustTokenizer.fromFile(tokPath);
const js = new JsTokenizer(tokJson, {});
// split_special_tokens = true matches text as the same tokenizer without its special added tokens would;
// that tokenizer numbers its added tokens differently, so its ids are mapped back through their contents.
const rustNoSpecial = RustTokenizer.fromString(
  JSON.stringify({ ...tokJson, added_tokens: tokJson.added_tokens.filter((t) => !t.special) }));

const normType = tokJson.normalizer?.type ?? null;
const normalizes = normType === "NFC" ? "NFC" :
  (normType === null || (normType === "Sequence" && tokJson.normalizer.normalizers.length === 0)) ? "none" : "other";
const added = tokJson.added_tokens.map((t) => t.content);

// Cases: the named corpus, the repository's documentation, and seeded random strings.
const cases = [...flagCases, ...JSON.parse(fs.readFileSync(path.join(here, "corpus.json"), "utf8")).cases.map((c) => ({ ...c }))];
if (args.docs) {
  const files = ["README.md", ...fs.readdirSync(path.join(args.docs, "docs")).filter((f) => f.endsWith(".md")).map((f) => "docs/" + f)];
  for (const f of files) cases.push({ name: "doc:" + f, text: fs.readFileSync(path.join(args.docs, f), "utf8") });
}
let seed = 12345;
const rand = () => { seed = (seed + 0x6d2b79f5) | 0; let t = seed; t = Math.imul(t ^ (t >>> 15), t | 1); t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
const pick = (a) => a[Math.floor(rand() * a.length)];
const range = (lo, hi) => String.fromCodePoint(lo + Math.floor(rand() * (hi - lo + 1)));
const pools = [
  () => pick(["the", " the", "Hello", " world", "ing", "tion", "A", "z", "Qwen", " DeepSeek"]),
  () => pick([" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\u00a0", "\u3000", "\u2009"]),
  () => range(0x30, 0x39).repeat(1 + Math.floor(rand() * 6)),
  () => range(0x21, 0x2f), () => range(0x3a, 0x40), () => pick(["'s", "'ll", "'T", "'re", "'Ve", "'d"]),
  () => range(0x4e00, 0x9fa5), () => range(0x3040, 0x309f), () => range(0x30a0, 0x30ff), () => range(0xac00, 0xd7a3),
  () => range(0x0300, 0x036f), () => range(0x0400, 0x04ff), () => range(0x0370, 0x03ff), () => range(0x0600, 0x06ff),
  () => range(0x0900, 0x097f), () => range(0x1f300, 0x1f64f), () => range(0x1f3fb, 0x1f3ff), () => "\u200d",
  () => range(0x2000, 0x206f), () => range(0xff01, 0xff5e), () => range(0x1d400, 0x1d7ff),
  () => pick(added),
];
for (let i = 0; i < fuzzCount; i++) {
  let s = "";
  const n = 1 + Math.floor(rand() * 30);
  for (let k = 0; k < n; k++) s += pick(pools)();
  cases.push({ name: `fuzz${i}`, text: s });
}
for (const c of cases.filter((c) => c.text !== undefined && /<\|im_start\|>|<｜User｜>/.test(c.text))) {
  cases.push({ name: c.name + ":split_special", text: c.text, split_special_tokens: true });
}
for (const c of cases.filter((c) => c.hex !== undefined)) {
  cases.push({ name: c.name + ":replace", hex: c.hex, invalid_utf8: "replace" });
}

const toHex = (buf) => Buffer.from(buf).toString("hex");
const requests = cases.map((c) => ({
  hex: c.hex ?? toHex(Buffer.from(c.text, "utf8")),
  invalid_utf8: c.invalid_utf8 ?? "error",
  split_special_tokens: c.split_special_tokens ?? false,
}));
const run = spawnSync(args.probe, ["encode", tokPath], { input: JSON.stringify(requests), maxBuffer: 1 << 30 });
if (run.status !== 0) {
  console.error(`text_probe failed (exit ${run.status}): ${run.stderr}`);
  process.exit(1);
}
const results = JSON.parse(run.stdout.toString());

// ignoreBOM: a U+FEFF is text here, not a byte-order mark to drop.
const fatal = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const lossy = new TextDecoder("utf-8", { ignoreBOM: true });
const show = (s) => JSON.stringify(s.length > 120 ? s.slice(0, 120) + "..." : s);
let failures = 0, jsDisagreements = 0, compared = 0;
const fail = (c, msg) => { failures++; console.log(`FAIL ${c.name}: ${msg}`); };
for (let i = 0; i < cases.length; i++) {
  const c = cases[i], r = results[i];
  const bytes = Buffer.from(requests[i].hex, "hex");
  let valid = true;
  try { fatal.decode(bytes); } catch { valid = false; }
  if (!valid && c.invalid_utf8 !== "replace") {
    if (!r.error || !r.error.includes("is not valid UTF-8")) fail(c, `invalid UTF-8 was not refused: ${JSON.stringify(r)}`);
    continue;
  }
  const text = lossy.decode(bytes);  // == c.text for valid input; U+FFFD-replaced otherwise
  if (r.error) { fail(c, `genbridge error: ${r.error}`); continue; }
  const ref = c.split_special_tokens ? rustNoSpecial : rust;
  let want = (await ref.encode(text, null, { addSpecialTokens: false })).getIds();
  if (c.split_special_tokens) want = want.map((id) => rust.tokenToId(rustNoSpecial.idToToken(id)));
  compared++;
  const got = r.ids;
  if (JSON.stringify(got) !== JSON.stringify(want)) {
    let k = 0;
    while (k < got.length && k < want.length && got[k] === want[k]) k++;
    const tok = (ids) => ids.slice(Math.max(0, k - 2), k + 3).map((id) => `${id}:${JSON.stringify(rust.idToToken(id))}`).join(" ");
    fail(c, `ids differ at index ${k} (genbridge ${got.length} ids, reference ${want.length}) for ${show(text)}\n` +
            `  genbridge: ${tok(got)}\n  reference: ${tok(want)}`);
    continue;
  }
  if (!c.split_special_tokens) {
    const jsIds = js.encode(text, { add_special_tokens: false }).ids;
    if (JSON.stringify(jsIds) !== JSON.stringify(want)) {
      jsDisagreements++;
      console.log(`note ${c.name}: @huggingface/tokenizers (JS) differs from the Rust reference; genbridge agrees with Rust`);
    }
  }
  const decoded = Buffer.from(r.decoded_hex, "hex").toString("utf8");
  const refDecoded = await rust.decode(want, false);
  if (decoded !== refDecoded) fail(c, `decode differs: genbridge ${show(decoded)} reference ${show(refDecoded)}`);
  // (lstrip/rstrip drop the whitespace they take, so the added_flags variant does not round-trip.)
  const roundTrip = args.variant ? null : normalizes === "NFC" ? text.normalize("NFC") : normalizes === "none" ? text : null;
  if (roundTrip !== null && decoded !== roundTrip) fail(c, `decode(encode(x)) ${show(decoded)} != ${normalizes}(x) ${show(roundTrip)}`);
  const refSkip = await rust.decode(want, true);
  const skip = Buffer.from(r.decoded_skip_special_hex, "hex").toString("utf8");
  if (skip !== refSkip) fail(c, `decode(skip_special_tokens) differs: genbridge ${show(skip)} reference ${show(refSkip)}`);
  let streamed = "";
  for (const [k, h] of r.stream_hex.entries()) {
    try { streamed += fatal.decode(Buffer.from(h, "hex")); } catch { fail(c, `streamed piece ${k} is not valid UTF-8: ${h}`); }
  }
  if (streamed !== decoded) fail(c, `streamed text ${show(streamed)} != decode ${show(decoded)}`);
}
console.log(`${path.basename(path.dirname(tokPath))}/${path.basename(tokPath)}: ${cases.length} cases, ${compared} compared ` +
            `id for id with the Rust reference, ${jsDisagreements} where the JS reference disagrees with Rust`);
console.log(`${cases.length - failures} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
