// Loopback tests of `genbridge serve`: one case per invocation, each starting its own server on a free port
// (--port 0 --port-file) and stopping it with SIGTERM (it must exit 0). Every wait is bounded: each HTTP
// call has a timeout, every poll a deadline, and the whole case a watchdog.
// usage: node serve_test.mjs --case NAME --genbridge PATH --model DIR --work DIR [--clients N --rounds N
//        --max-tokens N --prompt-len N] [--client-dir DIR] [--serve-args "FLAGS"] [--mpirun PATH] [--idle-ms N]
// --serve-args: more `genbridge serve` flags for every server (e.g. "--afd 2A1F"). --mpirun: every server is
// an mpirun job of A + F `genbridge serve` processes (A with --role attention, then F with --role ffn, from the
// flags' --afd <A>A<F>F, which must include --afd-transport mpi); it is stopped by SIGTERM to world rank 0
// and mpirun must exit 0. Its ranks are found by their environment wherever mpirun placed them (on other
// "hosts" too: tests/support/netns_hosts.sh).
// --drain-tokens: the in-flight request's length in sigterm_drains (default 1500). --docs: docs/serving.md (field_table
// sends every row of its field table). --oracle-dir: the text oracle's
// npm packages (tests/text/oracle): openai_client then checks its chats' prompts exactly against the model's own
// template rendered by @huggingface/jinja and encoded by Hugging Face tokenizers. --state-of dsv4|qwen35: the
// model's per-sequence state, which kv_state_lines expects /metrics to name.
import { execFileSync, spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import zlib from "node:zlib";
import path from "node:path";
import { createRequire } from "node:module";
import { toolCases } from "./tools_cases.mjs";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const G = args.genbridge, MODEL = args.model, WORK = args.work;
const SERVE_ARGS = (args["serve-args"] ?? "").split(" ").filter((a) => a.length > 0);
const MPIRUN = args.mpirun;
// The mpirun job's ranks: A attention, F FFN (--afd in --serve-args).
const [MPI_A, MPI_F] = (() => {
  const i = SERVE_ARGS.indexOf("--afd");
  const m = i >= 0 ? /^(\d+)A(\d+)F$/i.exec(SERVE_ARGS[i + 1] ?? "") : null;
  return m ? [Number(m[1]), Number(m[2])] : [1, 1];
})();
const mpiRoles = (flags, ffnCmd = [G, ...flags, "--role", "ffn"]) =>
  ["--bind-to", "none", "-np", String(MPI_A), G, ...flags, "--role", "attention", ":", "-np", String(MPI_F), ...ffnCmd];
const NAME = path.basename(MODEL);
fs.mkdirSync(WORK, { recursive: true });
const servers = [];
let failures = 0;
const watchdog = setTimeout(() => {
  console.log(`FAIL: the case ran past its ${Number(args.watchdog ?? 100)} s watchdog`);
  for (const s of servers) console.log(`-- server log:\n${s.log()}`);
  cleanup();
  process.exit(1);
}, Number(args.watchdog ?? 100) * 1000);
function cleanup() { for (const s of servers) if (s.proc.exitCode === null) s.proc.kill("SIGKILL"); }
process.on("exit", cleanup);

function check(cond, what, extra) {
  if (cond) { console.log(`ok: ${what}`); return; }
  failures++;
  console.log(`FAIL: ${what}${extra !== undefined ? `\n  got: ${typeof extra === "string" ? extra : JSON.stringify(extra)}` : ""}`);
}
function eq(got, want, what) {
  const g = JSON.stringify(got), w = JSON.stringify(want);
  check(g === w, what, g === w ? undefined : `${g}\n  want: ${w}`);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function startServer(extra = [], model = MODEL, quiet = true) {
  const portFile = path.join(WORK, `port.${process.pid}.${servers.length}`);
  fs.rmSync(portFile, { force: true });
  const flags = ["serve", "--model", model, "--port", "0", "--port-file", portFile, ...(quiet ? ["--quiet"] : []),
                 ...SERVE_ARGS, ...extra];
  const proc = MPIRUN
    ? spawn(MPIRUN, mpiRoles(flags), { stdio: ["ignore", "pipe", "pipe"] })
    : spawn(G, flags, { stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  proc.stdout.on("data", (d) => (log += d));
  proc.stderr.on("data", (d) => (log += d));
  const exited = new Promise((r) => proc.on("exit", (code, sig) => r({ code, sig })));
  const s = { proc, exited, log: () => log, portFile };
  servers.push(s);
  const deadline = Date.now() + 60000;
  while (!fs.existsSync(portFile)) {
    if (proc.exitCode !== null || Date.now() > deadline) throw new Error(`the server did not start:\n${log}`);
    await sleep(20);
  }
  s.port = Number(fs.readFileSync(portFile, "utf8"));
  s.base = `http://127.0.0.1:${s.port}`;
  return s;
}
// The pid of world rank `rank` of server `s`'s mpirun job, or null: the genbridge process whose command line
// has the server's port file and whose environment names the rank. Not necessarily a child of mpirun: a rank
// on another "host" is a child of that host's Open MPI daemon (the hosts share this machine's processes).
function mpiRankPid(s, rank) {
  let pids = [];
  try { pids = fs.readdirSync("/proc").filter((p) => /^\d+$/.test(p)); } catch { return null; }
  for (const pid of pids) {
    try {
      const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
      if (cmd[0] !== G || !cmd.includes(s.portFile)) continue;
      if (fs.readFileSync(`/proc/${pid}/environ`, "utf8").split("\0").includes(`OMPI_COMM_WORLD_RANK=${rank}`)) return Number(pid);
    } catch { /* exited, or not ours to read */ }
  }
  return null;
}
// SIGTERM to the server: the process, or world rank 0 of an mpirun job.
function terminate(s) {
  if (!MPIRUN) { s.proc.kill("SIGTERM"); return; }
  const pid = mpiRankPid(s, 0);
  check(pid !== null, "found world rank 0 of the mpirun job");
  if (pid !== null) process.kill(pid, "SIGTERM");
}
async function stopServer(s, what = "SIGTERM: the server exits 0") {
  terminate(s);
  const r = await Promise.race([s.exited, sleep(30000).then(() => ({ code: "timeout" }))]);
  eq(r.code, 0, what);
  if (r.code !== 0) console.log(s.log());
  return r;
}

async function post(s, route, body, timeoutMs = 60000) {
  const res = await fetch(s.base + route, { method: "POST", headers: { "content-type": "application/json" },
                                            body: typeof body === "string" ? body : JSON.stringify(body),
                                            signal: AbortSignal.timeout(timeoutMs) });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* SSE or not JSON */ }
  return { status: res.status, text, json, headers: res.headers };
}
async function metrics(s) {
  const text = await (await fetch(s.base + "/metrics", { signal: AbortSignal.timeout(10000) })).text();
  const m = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const i = line.lastIndexOf(" ");
    m[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return m;
}
async function waitMetrics(s, pred, what, ms = 15000) {
  const deadline = Date.now() + ms;
  let m;
  for (;;) {
    m = await metrics(s);
    if (pred(m)) break;
    if (Date.now() > deadline) break;
    await sleep(20);
  }
  check(pred(m), what, m);
  return m;
}

// Parses a server-sent-event body: every event "data: ...", the last "[DONE]".
function parseSse(text) {
  const events = text.split("\n\n").filter((e) => e.length > 0);
  const chunks = [];
  let done = false, wellFormed = true, comments = 0;
  for (const e of events) {
    if (e.startsWith(":")) { ++comments; continue; }  // an SSE comment: readers skip it
    if (!e.startsWith("data: ") || done) wellFormed = false;
    const data = e.slice(6);
    if (data === "[DONE]") { done = true; continue; }
    try { chunks.push(JSON.parse(data)); } catch { wellFormed = false; }
  }
  return { chunks, done, wellFormed, comments };
}
// The text, token ids and finish reason of choice `index` of a stream's chunks, and the usage of the chunk that
// carries it (only with stream_options.include_usage: OpenAI's last chunk, with no choices).
function joinChunks(chunks, chat, index = 0) {
  let text = "", ids = [], finish, usage;
  for (const c of chunks) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices ?? []) {
      if (ch.index !== index) continue;
      text += chat ? (ch.delta?.content ?? "") : ch.text;
      ids = ids.concat(ch.token_ids ?? []);
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { text, ids, finish, usage };
}

// The text the server puts before a completions text prompt when it encodes it with special tokens (the default):
// tokenizer_config.json's bos_token when its add_bos_token is true (DeepSeek-V3's, as transformers' Llama-style
// tokenizers and vLLM add it), else nothing. `genbridge run --prompt-text` encodes the text as given, so a
// comparison with it puts this before the prompt (the BOS token's text encodes to its id).
function bosText(model = MODEL) {
  const config = JSON.parse(fs.readFileSync(path.join(model, "tokenizer_config.json"), "utf8"));
  const bos = config.bos_token;
  return config.add_bos_token && bos ? (typeof bos === "string" ? bos : bos.content) : "";
}

// `genbridge run` on the same model: [{ids, text}] per prompt, greedy. `extra`: more flags (--dump-logits).
function runCli(prompts, maxNew, model = MODEL, extra = []) {
  const flags = [];
  for (const p of prompts) {
    if (typeof p === "string") flags.push("--prompt-text", p);
    else flags.push("--prompt", p.join(","));
  }
  const out = execFileSync(G, ["run", "--model", model, ...flags, "--max-new-tokens", String(maxNew), "--quiet", ...extra],
                           { encoding: "utf8", timeout: 120000, maxBuffer: 1 << 26 });
  const res = [];
  for (const line of out.split("\n")) {
    let m = /^request (\d+) \((\w+), (\d+) tokens\): ?(.*)$/.exec(line);
    if (m) res[Number(m[1])] = { ids: m[4].trim() ? m[4].trim().split(" ").map(Number) : [] };
    m = /^request (\d+) text: (.*)$/.exec(line);
    if (m) res[Number(m[1])].text = JSON.parse(m[2]);
  }
  return res;
}

// The prompt ids of chat requests as transformers would build them, by the references the text oracle runs: the
// model directory's chat template (chat_template.jinja, else tokenizer_config.json's) rendered by @huggingface/jinja
// in transformers' context (the special tokens, tools = null, then the request with add_generation_prompt, as the
// server sends it), encoded by Hugging Face tokenizers (Rust) without added special tokens. [{text, ids}] per chat.
async function referenceChatPrompts(chats, model = MODEL) {
  const req = createRequire(path.join(args["oracle-dir"], "package.json"));
  const { Template } = req("@huggingface/jinja");
  const { Tokenizer } = req("@anush008/tokenizers");
  const config = JSON.parse(fs.readFileSync(path.join(model, "tokenizer_config.json"), "utf8"));
  const jinjaFile = path.join(model, "chat_template.jinja");
  const template = new Template(fs.existsSync(jinjaFile) ? fs.readFileSync(jinjaFile, "utf8") : config.chat_template);
  const tokenizer = Tokenizer.fromFile(path.join(model, "tokenizer.json"));
  const special = {};
  for (const k of ["bos_token", "eos_token", "pad_token", "unk_token"]) {
    const v = config[k];
    if (v !== null && v !== undefined) special[k] = typeof v === "string" ? v : v.content;
  }
  const out = [];
  for (const c of chats) {
    const ctx = { ...special, tools: null, messages: structuredClone(c.messages), add_generation_prompt: true };
    if (c.tools) ctx.tools = structuredClone(c.tools);
    Object.assign(ctx, structuredClone(c.chat_template_kwargs ?? {}));
    const text = template.render(ctx);
    out.push({ text, ids: (await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds() });
  }
  return out;
}

// A float32 .npy file (genbridge run --dump-logits): {rows, cols, data}.
function readNpyF32(file) {
  const b = fs.readFileSync(file);
  const major = b[6];
  const hlen = major === 1 ? b.readUInt16LE(8) : b.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12) + hlen;
  const header = b.slice(major === 1 ? 10 : 12, start).toString("latin1");
  const [rows, cols] = /'shape': \((\d+), (\d+)\)/.exec(header).slice(1).map(Number);
  const data = new Float32Array(b.buffer.slice(b.byteOffset + start, b.byteOffset + start + rows * cols * 4));
  return { rows, cols, data };
}
// The oracle of logprobs: fp64 log-softmax of one logits row; the chosen token's and the top k (ties to the
// lower id).
function logSoftmaxRow(npy, row, chosen, k) {
  const x = npy.data.subarray(row * npy.cols, (row + 1) * npy.cols);
  let m = -Infinity;
  for (const v of x) m = Math.max(m, v);
  let sum = 0;
  for (const v of x) sum += Math.exp(v - m);
  const lse = m + Math.log(sum);
  const ids = Array.from(x.keys()).sort((a, b) => x[b] - x[a] || a - b).slice(0, k);
  return { chosen: x[chosen] - lse, top: ids.map((i) => ({ id: i, logprob: x[i] - lse })) };
}
const close = (a, b, tol = 1e-9) => typeof a === "number" && Math.abs(a - b) <= tol;
// The logprobs of a stream's chunks joined: legacy completions arrays or chat content entries.
function joinLogprobs(chunks, chat) {
  // (Keys in the server's order: eq compares JSON text.)
  const out = chat ? { content: [] } : { text_offset: [], token_logprobs: [], tokens: [], top_logprobs: [] };
  for (const c of chunks) {
    const lp = c.choices?.[0]?.logprobs;
    if (!lp) continue;
    for (const key of Object.keys(out)) out[key] = out[key].concat(lp[key]);
  }
  return out;
}

function curl(s, route, body, extra = []) {
  const a = ["-sS", "-N", "--max-time", "60", "-w", "\n%{http_code}", ...extra];
  if (body !== undefined) a.push("-H", "content-type: application/json", "--data-binary", JSON.stringify(body));
  const out = execFileSync("curl", [...a, s.base + route], { encoding: "utf8", timeout: 70000 });
  const i = out.lastIndexOf("\n");
  const text = out.slice(0, i);
  let json = null;
  try { json = JSON.parse(text); } catch { /* SSE */ }
  return { status: Number(out.slice(i + 1)), text, json };
}

// One loopback connection: `send` is the bytes to send (with halfClose, sent together with the client's
// shutdown of its sending side: one end()), or a function that writes (it may await; then, with
// halfClose, the client shuts its side). Everything the server sends is read until it closes the
// connection or `ms` pass. Returns the bytes (latin1) and why reading ended: "closed" (the server closed),
// "timeout", or a socket error code.
function rawExchange(s, send, { halfClose = false, ms = 20000 } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(s.port, "127.0.0.1");
    const chunks = [];
    let done = false;
    const t0 = Date.now();
    const finish = (why) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      resolve({ text: Buffer.concat(chunks).toString("latin1"), why, ms: Date.now() - t0 });
    };
    const timer = setTimeout(() => finish("timeout"), ms);
    sock.on("data", (d) => chunks.push(d));
    sock.on("end", () => finish("closed"));
    sock.on("error", (e) => { if (chunks.length === 0) finish(e.code); else finish("closed"); });
    sock.on("connect", async () => {
      if (typeof send !== "function") { if (halfClose) sock.end(send); else sock.write(send); return; }
      try { await send(sock); } catch { /* the server closed first */ }
      if (halfClose) sock.end();
    });
  });
}
// Writes `data` and waits until it is handed to the kernel (or the socket fails).
const sockWrite = (sock, data) => new Promise((r) => sock.write(data, () => r()));
// The HTTP/1.1 responses in `text`, in order: {status, headers (lower-case names), body, json}.
function parseResponses(text) {
  const out = [];
  let i = 0;
  while (i < text.length) {
    const h = text.indexOf("\r\n\r\n", i);
    if (h < 0) break;
    const lines = text.slice(i, h).split("\r\n");
    const headers = {};
    for (const l of lines.slice(1)) { const k = l.indexOf(":"); headers[l.slice(0, k).toLowerCase()] = l.slice(k + 1).trim(); }
    let body = "", j = h + 4;
    if (headers["transfer-encoding"] === "chunked") {
      for (;;) {
        const e = text.indexOf("\r\n", j);
        const n = e < 0 ? NaN : parseInt(text.slice(j, e), 16);
        if (Number.isNaN(n)) { j = text.length; break; }
        body += text.slice(e + 2, e + 2 + n);
        j = e + 2 + n + 2;
        if (n === 0) break;
      }
    } else {
      const n = Number(headers["content-length"] ?? 0);
      body = text.slice(j, j + n);
      j += n;
    }
    let json = null;
    try { json = JSON.parse(body); } catch { /* SSE */ }
    out.push({ status: Number(lines[0].split(" ")[1]), line: lines[0], headers, body, json });
    i = j;
  }
  return out;
}
const httpGet = (route, extra = "") => `GET ${route} HTTP/1.1\r\nHost: 127.0.0.1\r\n${extra}\r\n`;
const httpPost = (route, body, extra = "") =>
  `POST ${route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}\r\n${body}`;
const chunkedHead = (route, extra = "") =>
  `POST ${route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n${extra}\r\n`;
const chunk = (data) => `${Buffer.byteLength(data).toString(16)}\r\n${data}\r\n`;
// The resident memory of process `pid` in MiB (/proc/PID/status VmRSS).
const rssMiB = (pid) => Number(/VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))[1]) / 1024;
const nested = (n) => "[".repeat(n) + "]".repeat(n);
const depthMessage = (at) => `The request body nests arrays and objects more than 128 levels deep (level 129 opens at byte ${at}); this server's limit is 128 levels.`;

const cases = {
  // --weight-quant Q (--quant Q; --scheme: the scheme in force, e.g. auto's): the start-up log names it, and
  // greedy completions (two at once: with --afd 2A1F one per attention rank) return the tokens of
  // `genbridge run --weight-quant Q` (with --run-args, e.g. its --afd), which differ from the bf16 tokens on
  // these prompts (so a server ignoring the flag fails).
  async weight_quant() {
    const Q = args.quant, scheme = args.scheme ?? args.quant;
    const runArgs = (args["run-args"] ?? "").split(" ").filter((a) => a.length > 0);
    const prompts = [[5, 17, 33, 2, 250, 99], [7, 8, 9]];
    const N = 12;
    const want = runCli(prompts, N, MODEL, ["--weight-quant", Q, ...runArgs]);
    const bf16 = runCli(prompts, N);
    check(JSON.stringify(want[0].ids) !== JSON.stringify(bf16[0].ids),
          `genbridge run --weight-quant ${Q}: other tokens than bf16 on prompt 0 (the case can fail)`, [want, bf16]);
    const s = await startServer(["--weight-quant", Q], MODEL, /*quiet=*/false);
    const req = (p) => ({ model: NAME, prompt: p, max_tokens: N, temperature: 0, ignore_eos: true, return_token_ids: true });
    const rs = await Promise.all(prompts.map((p) => post(s, "/v1/completions", req(p))));
    eq(rs.map((r) => [r.status, r.json?.choices?.[0]?.token_ids]), want.map((w) => [200, w.ids]),
       `greedy completions: the tokens of genbridge run --weight-quant ${Q} ${runArgs.join(" ")}`);
    const r = await post(s, "/v1/completions", { ...req(prompts[0]), stream: true });
    const j = joinChunks(parseSse(r.text).chunks, false);
    eq(j.ids, want[0].ids, "streamed completion: the same tokens");
    // The weights line (under mpirun each rank's share, printed by world rank 0 once every rank has loaded:
    // before the first step, so before the replies above).
    const wantLog = MPIRUN ? [`weights quantized per rank at load:`, `(world rank 0): ${scheme} for the attention side (`,
                              `(world rank ${MPI_A}): ${scheme} for routed experts [0, `]
                           : [`weights: ${scheme} for attention projections and experts (`];
    for (const w of wantLog) check(s.log().includes(w), `start-up log: ${w}`, s.log());
    await stopServer(s);
  },
  // curl against every endpoint, streamed and not; the tokens are genbridge run's.
  async curl_endpoints() {
    const s = await startServer(["--max-batch", "8"]);
    let r = curl(s, "/health");
    eq([r.status, r.json], [200, { status: "ok" }], "GET /health");
    r = curl(s, "/v1/models");
    eq([r.status, r.json.object, r.json.data.map((d) => [d.id, d.object])], [200, "list", [[NAME, "model"]]], "GET /v1/models");
    const prompt = "Hello world, this is genbridge.";
    const want = runCli([bosText() + prompt], 8)[0];
    const req = { model: NAME, prompt, max_tokens: 8, temperature: 0, return_token_ids: true, ignore_eos: true };
    r = curl(s, "/v1/completions", req);
    eq(r.status, 200, "POST /v1/completions: 200");
    const c = r.json;
    eq([c.object, c.model, c.choices.length, c.choices[0].finish_reason], ["text_completion", NAME, 1, "length"],
       "completion: object, model, one choice, finish_reason length");
    eq(c.choices[0].token_ids, want.ids, "completion: the tokens of genbridge run");
    eq(c.choices[0].text, want.text, "completion: the text of genbridge run");
    eq([c.usage.completion_tokens, c.usage.total_tokens - c.usage.prompt_tokens], [8, 8], "completion: usage");
    r = curl(s, "/v1/completions", { ...req, stream: true });
    let sse = parseSse(r.text);
    check(r.status === 200 && sse.wellFormed && sse.done, "streamed completion: well-formed events ending in [DONE]", r.text);
    let j = joinChunks(sse.chunks, false);
    eq([j.text, j.ids, j.finish, j.usage, sse.chunks.some((ch) => "usage" in ch)], [want.text, want.ids, "length", undefined, false],
       "streamed completion: the same text and tokens, finish_reason, no usage unless asked");
    r = curl(s, "/v1/completions", { ...req, stream: true, stream_options: { include_usage: true } });
    sse = parseSse(r.text);
    const tail = sse.chunks[sse.chunks.length - 1];
    eq([sse.done, tail.choices, tail.usage?.completion_tokens, joinChunks(sse.chunks.slice(0, -1), false).text],
       [true, [], 8, want.text], "stream_options.include_usage: a last chunk with no choices and the usage");
    // Chat.
    const chat = { model: NAME, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi there" }],
                   max_tokens: 6, temperature: 0, return_token_ids: true };
    r = curl(s, "/v1/chat/completions", chat);
    eq([r.status, r.json.object, r.json.choices[0].message.role, r.json.choices[0].finish_reason,
        r.json.usage.completion_tokens], [200, "chat.completion", "assistant", "length", 6], "POST /v1/chat/completions");
    const chatText = r.json.choices[0].message.content, chatIds = r.json.choices[0].token_ids;
    r = curl(s, "/v1/chat/completions", { ...chat, stream: true });
    sse = parseSse(r.text);
    check(sse.wellFormed && sse.done, "streamed chat: well-formed events ending in [DONE]", r.text);
    eq(sse.chunks[0].choices[0].delta.role, "assistant", "streamed chat: the first delta names the role");
    j = joinChunks(sse.chunks, true);
    eq([j.text, j.ids, j.finish, j.usage], [chatText, chatIds, "length", undefined],
       "streamed chat: the same content and tokens as the non-streamed reply (no usage unless asked)");
    // Stop strings, matched across a token boundary and not emitted.
    // Token boundaries: the text of the first k tokens is a prefix of the text of 16 (greedy).
    const full = curl(s, "/v1/completions", { ...req, max_tokens: 16 }).json.choices[0].text;
    let stop = null, at = -1, probes = 0;
    for (let k = 2; k < 16 && stop === null; ++k) {
      ++probes;
      const p = curl(s, "/v1/completions", { ...req, max_tokens: k }).json.choices[0].text.length;
      const cand = full.slice(p - 1, p + 1);
      if (p >= 1 && cand.length === 2 && full.indexOf(cand) === p - 1 && !/\uFFFD/.test(cand)) { stop = cand; at = p - 1; }
    }
    check(stop !== null, "found a two-character stop string across a token boundary", full);
    if (stop !== null) {
      r = curl(s, "/v1/completions", { ...req, max_tokens: 16, stop: [stop] });
      eq([r.json.choices[0].text, r.json.choices[0].finish_reason], [full.slice(0, at), "stop"],
         `stop ${JSON.stringify(stop)}: the text before it, finish_reason stop`);
      r = curl(s, "/v1/completions", { ...req, max_tokens: 16, stop, stream: true });
      j = joinChunks(parseSse(r.text).chunks, false);
      eq([j.text, j.finish], [full.slice(0, at), "stop"], "streamed stop: the same text, finish_reason stop");
      // A long request that reaches its stop string early: the server ends it in the engine (its KV pages
      // freed, the rest never generated) and counts it as finished by stop.
      r = curl(s, "/v1/completions", { ...req, max_tokens: 4000, stop, stream: true });
      j = joinChunks(parseSse(r.text).chunks, false);
      eq([j.text, j.finish], [full.slice(0, at), "stop"], "4000-token request: ends at the stop string");
      await waitMetrics(s, (m) => m['genbridge_requests_finished_total{reason="stop"}'] >= 1 &&
                                   m.genbridge_kv_pages_used === 0 && m.genbridge_running_requests === 0 &&
                                   m.genbridge_generation_tokens_total < 3000,
                        "metrics: ended by stop in the engine, KV freed, far fewer than 4000 tokens generated");
      // The engine may have generated all 16 tokens (length) before the server saw the stop string; if not,
      // the request ends as "stop". Never as a cancellation (that counter means clients that went away).
      // Every request so far: 5 above, the 16-token one, the probes for the stop string and the 3 with it.
      const sent = 6 + probes + 3;
      await waitMetrics(s, (m) => m['genbridge_requests_finished_total{reason="stop"}'] +
                                   m['genbridge_requests_finished_total{reason="length"}'] === sent &&
                                   m['genbridge_requests_finished_total{reason="cancelled"}'] === 0,
                        "metrics: the stop-string requests count as finished by stop or length, not cancelled");
    }
    r = curl(s, "/metrics");
    check(r.status === 200 && /# TYPE genbridge_time_to_first_token_seconds histogram/.test(r.text) &&
          /# TYPE genbridge_time_per_output_token_seconds histogram/.test(r.text), "GET /metrics: Prometheus text with TTFT/TPOT histograms");
    const m = await metrics(s);
    eq([m['genbridge_requests_total{outcome="accepted"}'] >= 8, m.genbridge_kv_pages_used, m.genbridge_running_requests,
        m.genbridge_queue_depth], [true, 0, 0, 0], "metrics: every request accepted, no KV pages or requests left");
    await stopServer(s);
  },

  // Logprobs over HTTP: greedy requests' logprobs equal an fp64 log-softmax of `genbridge run --dump-logits`
  // rows; streamed chunks carry the same entries as the non-streamed reply; a stop string drops the logprobs
  // of the tokens whose text starts in it.
  async logprobs() {
    const prompt = [5, 17, 33, 2, 250, 99];
    const N = 12, K = 3;
    const npyFile = path.join(WORK, "logits.npy");
    const want = runCli([prompt], N, MODEL, ["--dump-logits", npyFile])[0];
    const npy = readNpyF32(npyFile);
    eq([npy.rows, want.ids.length], [N, N], "genbridge run --dump-logits: one row per token");
    const s = await startServer([]);
    const req = { model: NAME, prompt, max_tokens: N, temperature: 0, ignore_eos: true, return_token_ids: true, logprobs: K };
    let r = await post(s, "/v1/completions", req);
    const c = r.json?.choices?.[0];
    eq([r.status, c?.token_ids], [200, want.ids], "completion with logprobs: 200, genbridge run's tokens");
    const lp = c.logprobs;
    eq([lp.tokens.length, lp.token_logprobs.length, lp.top_logprobs.length, lp.text_offset.length], [N, N, N, N],
       "legacy logprobs: one entry per token in each list");
    let bad = [];
    for (let i = 0; i < N; ++i) {
      const o = logSoftmaxRow(npy, i, want.ids[i], K);
      const top = Object.values(lp.top_logprobs[i]);
      if (!close(lp.token_logprobs[i], o.chosen) || !close(Math.max(...top), o.top[0].logprob) ||
          !(lp.top_logprobs[i][lp.tokens[i]] >= o.chosen - 1e-9) || top.length > K + 1 ||
          !top.every((v) => o.top.some((t) => close(v, t.logprob)) || close(v, o.chosen))) bad.push(i);
    }
    eq(bad, [], "token_logprobs and top_logprobs: the fp64 log-softmax of genbridge run's logits");
    check(lp.text_offset[0] === 0 && lp.text_offset.every((v, i) => i === 0 || v >= lp.text_offset[i - 1]),
          "text_offset: from 0, non-decreasing", lp.text_offset);
    r = await post(s, "/v1/completions", { ...req, stream: true });
    let sse = parseSse(r.text);
    eq(joinLogprobs(sse.chunks, false), lp, "streamed completion: the chunks' logprobs joined equal the reply's");
    // Sampled (temperature 1.5, top_k 2): the logprobs are still the model's raw distribution, not the
    // tempered and truncated one the token was drawn from: the first token's values are the greedy reply's.
    const raw = (await post(s, "/v1/chat/completions", { model: NAME, messages: [{ role: "user", content: "x" }], max_tokens: 1,
                                                          temperature: 0, logprobs: true, top_logprobs: 5 })).json?.choices?.[0]?.logprobs?.content?.[0];
    const hot = (await post(s, "/v1/chat/completions", { model: NAME, messages: [{ role: "user", content: "x" }], max_tokens: 1,
                                                          temperature: 1.5, top_k: 2, seed: 11, logprobs: true, top_logprobs: 5 }))
                  .json?.choices?.[0]?.logprobs?.content?.[0];
    eq(hot?.top_logprobs, raw?.top_logprobs, "sampled: the same top_logprobs as greedy (raw distribution)");
    check(raw && hot && raw.top_logprobs.slice(0, 2).some((t) => t.token === hot.token && t.logprob === hot.logprob),
          "sampled: the drawn token (one of the top 2) with its raw logprob", [hot, raw]);
    // Chat: the same oracle on a chat prompt's tokens (run with the rendered prompt's ids).
    const chat = { model: NAME, messages: [{ role: "user", content: "Hi there" }], max_tokens: 6, temperature: 0,
                   ignore_eos: true, return_token_ids: true, logprobs: true, top_logprobs: 2 };
    r = await post(s, "/v1/chat/completions", chat);
    const cc = r.json?.choices?.[0];
    const content = cc?.logprobs?.content ?? [];
    eq([r.status, content.length, content.map((e) => e.top_logprobs.length)], [200, 6, [2, 2, 2, 2, 2, 2]],
       "chat logprobs: one entry per token, top_logprobs of 2");
    eq(Buffer.from(content.flatMap((e) => e.bytes)).toString("utf8"), cc.message.content,
       "chat logprobs: the tokens' bytes are the content");
    check(content.every((e, i) => e.top_logprobs[0].logprob >= e.logprob - 1e-12 && e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob &&
                                  close(e.logprob, e.top_logprobs[0].logprob)),
          "greedy chat: the chosen token is the most likely, top_logprobs sorted", content);
    r = await post(s, "/v1/chat/completions", { ...chat, stream: true });
    sse = parseSse(r.text);
    eq(joinLogprobs(sse.chunks, true), cc.logprobs, "streamed chat: the chunks' logprobs joined equal the reply's");
    r = await post(s, "/v1/chat/completions", { ...chat, logprobs: false, top_logprobs: undefined });
    eq(r.json?.choices?.[0]?.logprobs, null, "chat without logprobs: null");
    // Stop: a two-character stop string that begins inside a token's text; the logprobs are those of the
    // tokens whose text starts before it (from the full reply's text_offset), streamed or not.
    const full = [...c.text];
    let stop = null, at = -1;
    for (let j = 2; j < N - 1 && stop === null; ++j) {
      const p = lp.text_offset[j] - 1;
      const cand = full.slice(p, p + 2).join("");
      if (p >= 1 && [...cand].length === 2 && full.join("").indexOf(cand) === full.slice(0, p).join("").length &&
          !/\uFFFD/.test(cand)) { stop = cand; at = p; }
    }
    check(stop !== null, "found a stop string that begins inside a token", c.text);
    if (stop !== null) {
      const keep = lp.text_offset.filter((o) => o < at).length;
      const wantLp = { text_offset: lp.text_offset.slice(0, keep), token_logprobs: lp.token_logprobs.slice(0, keep),
                       tokens: lp.tokens.slice(0, keep), top_logprobs: lp.top_logprobs.slice(0, keep) };
      r = await post(s, "/v1/completions", { ...req, stop });
      eq([r.json?.choices?.[0]?.text, r.json?.choices?.[0]?.finish_reason, r.json?.choices?.[0]?.logprobs],
         [full.slice(0, at).join(""), "stop", wantLp], `stop ${JSON.stringify(stop)}: its tokens' logprobs are not sent`);
      r = await post(s, "/v1/completions", { ...req, stop, stream: true });
      sse = parseSse(r.text);
      eq([joinChunks(sse.chunks, false).text, joinLogprobs(sse.chunks, false)], [full.slice(0, at).join(""), wantLp],
         "streamed stop: the same text and logprobs");
    }
    await stopServer(s);
  },

  // Every refusal: its status and exact OpenAI-style error.
  async errors() {
    const s = await startServer(["--kv-memory-mb", "4", "--max-batch", "1", "--max-queued-requests", "1"]);
    const base = { model: NAME, prompt: [1, 2, 3, 4, 5], max_tokens: 2, temperature: 0 };
    const cases = [
      ["/v1/completions", '{"model": ', 400, "The request body is not valid JSON (parse error at byte 11).", null],
      ["/v1/completions", "[1, 2]", 400, "The request body must be a JSON object, got [1,2].", null],
      ["/v1/completions", { ...base, model: 7 }, 400, "'model' must be a string, got 7.", "model"],
      ["/v1/completions", { ...base, model: "gpt-4" }, 404, `The model 'gpt-4' does not exist; this server serves '${NAME}'.`, "model"],
      ["/v1/completions", { model: NAME }, 400, "'prompt' is required.", "prompt"],
      ["/v1/completions", { ...base, prompt: 5 }, 400, "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists, got 5.", "prompt"],
      ["/v1/completions", { ...base, prompt: ["a", 5] }, 400, "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists, got [\"a\",5].", "prompt"],
      ["/v1/completions", { ...base, prompt: [1, 512] }, 400, "'prompt' token 512 is outside the vocabulary [0, 512).", "prompt"],
      ["/v1/completions", { ...base, prompt: "" }, 400, "'prompt' is empty: it encodes to no token.", "prompt"],
      ["/v1/completions", { ...base, max_tokens: "8" }, 400, "'max_tokens' must be an integer, got \"8\".", "max_tokens"],
      ["/v1/completions", { ...base, max_tokens: 0 }, 400, "'max_tokens' must be at least 1, got 0.", "max_tokens"],
      ["/v1/completions", { ...base, max_tokens: -3 }, 400, "'max_tokens' must be at least 1, got -3.", "max_tokens"],
      ["/v1/completions", { ...base, max_tokens: 1e30 }, 400, "'max_tokens' must be an integer, got 1e+30.", "max_tokens"],
      ["/v1/completions", { ...base, max_tokens: 5000 }, 400,
       "This model's maximum context length is 4096 tokens, but the request asks for 5005 (5 prompt + 5000 completion tokens); lower 'max_tokens' or shorten the prompt.", "max_tokens"],
      ["/v1/completions", { ...base, max_tokens: 2100 }, 400,
       "The request needs 17 KV pages (5 prompt + 2100 completion tokens at 128 tokens per page) but the server's KV pool holds 16 pages (--kv-memory-mb 4); lower 'max_tokens' or shorten the prompt.", "max_tokens"],
      ["/v1/completions", { ...base, temperature: -1 }, 400, "'temperature' must be 0 or a number in [1.1754944e-38, 2], got -1.", "temperature"],
      // Numbers at the sampler's limits and beyond a double (JSON.stringify cannot write 1e400: raw bodies).
      ["/v1/completions", { ...base, temperature: 1e-300 }, 400, "'temperature' must be 0 or a number in [1.1754944e-38, 2], got 1e-300.", "temperature"],
      ["/v1/completions", { ...base, top_p: 1e-300 }, 400, "'top_p' must be a number in [1.1754944e-38, 1], got 1e-300.", "top_p"],
      ["/v1/completions", { ...base, top_p: 1e-46 }, 400, "'top_p' must be a number in [1.1754944e-38, 1], got 1e-46.", "top_p"],
      ["/v1/completions", `{"model": "${NAME}", "prompt": [1, 2], "temperature": 1e400}`, 400,
       "'temperature' is 1e400, a number beyond the range of a double (magnitude at most 1.7976931348623157e+308).", "temperature"],
      ["/v1/completions", `{"model": "${NAME}", "prompt": [1, 2, -1e400]}`, 400,
       "'prompt[2]' is -1e400, a number beyond the range of a double (magnitude at most 1.7976931348623157e+308).", "prompt[2]"],
      ["/v1/chat/completions", `{"model": "${NAME}", "messages": [{"role": "user", "content": "hi"}], "seed": 1e999}`, 400,
       "'seed' is 1e999, a number beyond the range of a double (magnitude at most 1.7976931348623157e+308).", "seed"],
      ["/v1/completions", { ...base, seed: 18446744073709551616 }, 400,
       "'seed' must be an integer in [-9223372036854775808, 18446744073709551615], got 1.8446744073709552e+19.", "seed"],
      ["/v1/completions", { ...base, frequency_penalty: 2.5 }, 400,
       "'frequency_penalty' must be a number in [-2, 2], got 2.5.", "frequency_penalty"],
      ["/v1/completions", { ...base, temperature: "hot" }, 400, "'temperature' must be a number, got \"hot\".", "temperature"],
      ["/v1/completions", { ...base, top_p: 0 }, 400, "'top_p' must be a number in [1.1754944e-38, 1], got 0.", "top_p"],
      ["/v1/completions", { ...base, top_k: -2 }, 400, "'top_k' must be -1 or 0 (no limit) or an integer in [1, 2147483647], got -2.", "top_k"],
      ["/v1/completions", { ...base, seed: 1.5 }, 400, "'seed' must be an integer, got 1.5.", "seed"],
      ["/v1/completions", { ...base, n: 0 }, 400, "'n' must be an integer in [1, 128], got 0.", "n"],
      ["/v1/completions", { ...base, frobnicate: true }, 400, "Unrecognized request argument supplied: frobnicate", "frobnicate"],
      ["/v1/completions", { ...base, stop: ["a", "b", "c", "d", "e"] }, 400, "'stop' holds 5 strings; at most 4 are allowed.", "stop"],
      ["/v1/completions", { ...base, stop: [""] }, 400, "'stop' strings must not be empty.", "stop"],
      ["/v1/completions", { ...base, stop: 3 }, 400, "'stop' must be a string or a list of strings, got 3.", "stop"],
      ["/v1/completions", { ...base, stream: "yes" }, 400, "'stream' must be a boolean, got \"yes\".", "stream"],
      ["/v1/completions", { ...base, logprobs: 21 }, 400, "'logprobs' must be between 0 and 20, got 21.", "logprobs"],
      ["/v1/completions", { ...base, logprobs: -1 }, 400, "'logprobs' must be between 0 and 20, got -1.", "logprobs"],
      ["/v1/completions", { ...base, logprobs: true }, 400, "'logprobs' must be an integer, got true.", "logprobs"],
      ["/v1/completions", { ...base, top_logprobs: 2 }, 400,
       "'top_logprobs' belongs to /v1/chat/completions; /v1/completions takes 'logprobs': k.", "top_logprobs"],
      ["/v1/completions", { ...base, suffix: "x" }, 400,
       "'suffix' is not supported by this server: it inserts text after the completion (fill-in-the-middle), which this server does not do; got \"x\".", "suffix"],
      ["/v1/chat/completions", { model: NAME, messages: [{ role: "user", content: "hi" }], logprobs: 2 }, 400,
       "'logprobs' must be a boolean, got 2.", "logprobs"],
      ["/v1/chat/completions", { model: NAME, messages: [{ role: "user", content: "hi" }], logprobs: true, top_logprobs: 21 }, 400,
       "'top_logprobs' must be between 0 and 20, got 21.", "top_logprobs"],
      ["/v1/chat/completions", { model: NAME, messages: [{ role: "user", content: "hi" }], top_logprobs: 3 }, 400,
       "'top_logprobs' requires 'logprobs': true.", "top_logprobs"],
      ["/v1/chat/completions", { model: NAME }, 400, "'messages' is required.", "messages"],
      ["/v1/chat/completions", { model: NAME, messages: [] }, 400, "'messages' is empty.", "messages"],
      ["/v1/chat/completions", { model: NAME, messages: [{ content: "hi" }] }, 400, "'messages[0].role' must be a string.", "messages[0].role"],
      ["/v1/chat/completions", { model: NAME, messages: [{ role: "user", content: 5 }] }, 400,
       "'messages[0].content' must be a string, null or a list of text parts, got 5.", "messages[0].content"],
    ];
    for (const [route, body, status, message, param] of cases) {
      const r = await post(s, route, body);
      eq([r.status, r.json?.error?.message, r.json?.error?.param ?? null, r.json?.error?.type],
         [status, message, param, "invalid_request_error"], `${route} ${typeof body === "string" ? body : JSON.stringify(body)}`);
    }
    let r = await post(s, "/v1/completions", { ...base, model: "gpt-4" });
    eq([r.status, r.json.error.code], [404, "model_not_found"], "unknown model: 404 model_not_found");
    r = await post(s, "/v1/completions", { ...base, max_tokens: 5000 });
    eq(r.json.error.code, "context_length_exceeded", "beyond the context: code context_length_exceeded");
    r = await fetch(s.base + "/v1/nothing", { signal: AbortSignal.timeout(10000) });
    eq([r.status, (await r.json()).error.message], [404, "No route GET /v1/nothing."], "unknown route: 404 JSON error");
    // A full queue: one request running (--max-batch 1), one waiting (--max-queued-requests 1), the next: 429.
    // The running request must outlast the two that follow it; should it finish first (a slow client
    // machine), the attempt is repeated (at most 5).
    let got429 = null;
    for (let attempt = 0; attempt < 5 && !got429; ++attempt) {
      const ac = new AbortController();
      const running = await fetch(s.base + "/v1/completions", {
        method: "POST", body: JSON.stringify({ ...base, prompt: [1, 2, 3], max_tokens: 2040, stream: true }),
        headers: { "content-type": "application/json" }, signal: ac.signal });
      const reader = running.body.getReader();
      await reader.read();  // the first token: it runs
      const waiting = post(s, "/v1/completions", { ...base, max_tokens: 2 });
      const deadline = Date.now() + 5000;
      let queued = false;
      while (!queued && Date.now() < deadline) {
        const m = await metrics(s);
        queued = m.genbridge_queue_depth === 1 && m.genbridge_running_requests === 1;
        if (m['genbridge_requests_finished_total{reason="length"}'] > 0 && !queued) break;
      }
      if (queued) {
        const r = await post(s, "/v1/completions", base);
        if (r.status === 429) got429 = r;
      }
      ac.abort();
      const w = await waiting;
      eq([w.status, w.json?.choices?.[0]?.finish_reason], [200, "length"], "the waiting request completes once the first is gone");
    }
    eq([got429?.status, got429?.json?.error?.message, got429?.json?.error?.type, got429?.json?.error?.code,
        got429?.headers?.get("retry-after")],
       [429, "The server's queue is full (--max-queued-requests 1: that many requests are waiting to start); retry later.",
        "rate_limit_error", "queue_full", "1"], "a full queue: 429 with Retry-After");
    await waitMetrics(s, (m) => m['genbridge_requests_total{outcome="queue_full"}'] === 1 &&
                                 m['genbridge_requests_finished_total{reason="cancelled"}'] >= 1 &&
                                 m.genbridge_kv_pages_used === 0 && m.genbridge_running_requests === 0,
                      "metrics: 1 refused for a full queue, the aborted stream cancelled, no KV pages held");
    await stopServer(s);
  },

  // A client that goes away mid-stream: its request is cancelled and its KV pages freed (/metrics).
  async disconnect() {
    const s = await startServer(["--max-batch", "4"]);
    const ac = new AbortController();
    const res = await fetch(s.base + "/v1/completions", {
      method: "POST", headers: { "content-type": "application/json" }, signal: ac.signal,
      body: JSON.stringify({ model: NAME, prompt: [1, 2, 3], max_tokens: 4000, temperature: 0, stream: true }) });
    const reader = res.body.getReader();
    await reader.read();
    await reader.read();
    const during = await metrics(s);
    eq([during.genbridge_running_requests, during.genbridge_kv_pages_used > 0], [1, true], "mid-stream: 1 running, KV pages held");
    ac.abort();
    const m = await waitMetrics(s, (x) => x['genbridge_requests_finished_total{reason="cancelled"}'] === 1 &&
                                           x.genbridge_kv_pages_used === 0 && x.genbridge_running_requests === 0,
                                "after the disconnect: cancelled, KV pages freed, nothing running");
    check(m.genbridge_generation_tokens_total < 4000, "it stopped generating", m.genbridge_generation_tokens_total);
    await stopServer(s);
  },

  // A client that goes away while it waits for a non-streamed reply: its request is cancelled and its KV
  // pages freed (the server polls the connection while the request runs).
  async disconnect_non_streamed() {
    const s = await startServer(["--max-batch", "4"]);
    const ac = new AbortController();
    const pending = fetch(s.base + "/v1/completions", {
      method: "POST", headers: { "content-type": "application/json" }, signal: ac.signal,
      body: JSON.stringify({ model: NAME, prompt: [1, 2, 3], max_tokens: 4000, temperature: 0, ignore_eos: true }) })
      .then((r) => r.status, (e) => e.name);
    await waitMetrics(s, (m) => m.genbridge_running_requests === 1 && m.genbridge_kv_pages_used > 0 &&
                                 m.genbridge_generation_tokens_total > 0, "while it waits: 1 running, KV pages held");
    ac.abort();
    eq(await pending, "AbortError", "the client gave up");
    const m = await waitMetrics(s, (x) => x['genbridge_requests_finished_total{reason="cancelled"}'] === 1 &&
                                           x.genbridge_kv_pages_used === 0 && x.genbridge_running_requests === 0,
                                "after the disconnect: cancelled, KV pages freed, nothing running", 30000);
    check(m.genbridge_generation_tokens_total < 4000 && m['genbridge_requests_finished_total{reason="length"}'] === 0,
          "it stopped generating", m.genbridge_generation_tokens_total);
    // The server goes on: a short request still gets its reply.
    const r = await post(s, "/v1/completions", { model: NAME, prompt: [1, 2, 3], max_tokens: 2, temperature: 0 });
    eq(r.status, 200, "a later request is served");
    await stopServer(s);
  },

  // Clients that go away while their requests wait in the queue (one streamed, one not; --max-batch 1 and a
  // long stream running): both are cancelled without ever starting (one first token in all: the running one's).
  async disconnect_queued() {
    const s = await startServer(["--max-batch", "1"]);
    const body = (stream) => JSON.stringify({ model: NAME, prompt: [1, 2, 3], max_tokens: 4000, temperature: 0, stream, ignore_eos: true });
    const acA = new AbortController(), acB = new AbortController(), acC = new AbortController();
    const a = await fetch(s.base + "/v1/completions", { method: "POST", headers: { "content-type": "application/json" },
                                                        signal: acA.signal, body: body(true) });
    const reader = a.body.getReader();
    await reader.read();  // A runs
    const b = fetch(s.base + "/v1/completions", { method: "POST", headers: { "content-type": "application/json" },
                                                  signal: acB.signal, body: body(true) }).then((r) => r.body.getReader().read()).catch((e) => e.name);
    const c = fetch(s.base + "/v1/completions", { method: "POST", headers: { "content-type": "application/json" },
                                                  signal: acC.signal, body: body(false) }).then((r) => r.status, (e) => e.name);
    await waitMetrics(s, (m) => m.genbridge_queue_depth === 2 && m.genbridge_running_requests === 1, "B and C queued behind A");
    acB.abort();
    acC.abort();
    eq([await b, await c], ["AbortError", "AbortError"], "B and C gave up");
    await waitMetrics(s, (m) => m['genbridge_requests_finished_total{reason="cancelled"}'] === 2 && m.genbridge_queue_depth === 0 &&
                                 m.genbridge_running_requests === 1, "B and C cancelled while queued (A still running)", 30000);
    acA.abort();
    const m = await waitMetrics(s, (x) => x['genbridge_requests_finished_total{reason="cancelled"}'] === 3 &&
                                           x.genbridge_kv_pages_used === 0 && x.genbridge_running_requests === 0,
                                "A cancelled too, no KV pages held", 30000);
    eq([m.genbridge_time_to_first_token_seconds_count, m['genbridge_requests_finished_total{reason="length"}']], [1, 0],
       "B and C never started (one first token: A's), A never finished");
    await stopServer(s);
  },

  // --scheduling-policy: under fcfs (the default) a 'priority' other than 0 is refused naming the flag; under
  // priority with --max-batch 1, four requests queued behind a running one start (and, one at a time, finish)
  // lowest priority first, equal priorities in arrival order.
  async priority_order() {
    const fcfs = await startServer([]);
    const refused = await post(fcfs, "/v1/completions", { model: NAME, prompt: [1, 2, 3], max_tokens: 2, priority: 3 });
    eq([refused.status, refused.json?.error?.param, refused.json?.error?.message],
       [400, "priority", "'priority' is 3 but this server starts requests in arrival order; start it with " +
                         "--scheduling-policy priority to order them by priority."], "fcfs: priority 3 refused");
    await stopServer(fcfs);
    const s = await startServer(["--max-batch", "1", "--scheduling-policy", "priority"]);
    const outOfRange = await post(s, "/v1/completions", { model: NAME, prompt: [1, 2, 3], max_tokens: 2, priority: 2147483648 });
    eq([outOfRange.status, outOfRange.json?.error?.param], [400, "priority"], "priority beyond int32: 400 naming it");
    const acA = new AbortController();
    const a = await fetch(s.base + "/v1/completions", {
      method: "POST", headers: { "content-type": "application/json" }, signal: acA.signal,
      body: JSON.stringify({ model: NAME, prompt: [1, 2, 3], max_tokens: 4000, temperature: 0, stream: true, ignore_eos: true }) });
    const reader = a.body.getReader();
    await reader.read();  // A runs in the only slot
    const order = [];
    const pending = [];
    const queue = [["p5a", 5], ["p-1", -1], ["p0", 0], ["p5b", 5]];
    for (let i = 0; i < queue.length; ++i) {
      const [name, priority] = queue[i];
      // 400 tokens each (tens of ms on the tiny model), so that the order in which the answers arrive is the
      // order in which the requests ran.
      pending.push(post(s, "/v1/completions", { model: NAME, prompt: [4, 5, 6], max_tokens: 400, temperature: 0, ignore_eos: true, priority })
        .then((r) => { order.push(name); return r.status; }));
      await waitMetrics(s, (m) => m.genbridge_queue_depth === i + 1, `${name} queued behind A`);
    }
    acA.abort();
    eq(await Promise.all(pending), [200, 200, 200, 200], "all four answered");
    eq(order, ["p-1", "p0", "p5a", "p5b"], "lowest priority first, ties in arrival order");
    await stopServer(s);
  },

  // --request-timeout: a request still running then is cancelled (its KV pages freed) and answered 504.
  async request_timeout() {
    const s = await startServer(["--request-timeout", "0.05"]);
    const r = await post(s, "/v1/completions", { model: NAME, prompt: [1, 2, 3], max_tokens: 4000, temperature: 0 });
    eq([r.status, r.json?.error?.message, r.json?.error?.type, r.json?.error?.code],
       [504, "The request did not finish within --request-timeout 0.05 s.", "server_error", "timeout"], "non-streamed: 504");
    const res = await fetch(s.base + "/v1/completions", {
      method: "POST", headers: { "content-type": "application/json" }, signal: AbortSignal.timeout(60000),
      body: JSON.stringify({ model: NAME, prompt: [1, 2, 3], max_tokens: 4000, temperature: 0, stream: true }) });
    const sse = parseSse(await res.text());
    eq([sse.wellFormed, sse.done, sse.chunks[sse.chunks.length - 1]?.error?.code], [true, true, "timeout"],
       "streamed: an error event, then [DONE]");
    await waitMetrics(s, (m) => m['genbridge_requests_finished_total{reason="cancelled"}'] === 2 && m.genbridge_kv_pages_used === 0,
                      "both cancelled, no KV pages held");
    await stopServer(s);
  },

  // A request whose logits turn non-finite (an +Inf in lm_head.weight): 500 naming the step, the server goes on.
  async non_finite() {
    const s = await startServer([]);
    const body = { model: NAME, prompt: [1, 2, 3], max_tokens: 4, temperature: 0 };
    const r = await post(s, "/v1/completions", body);
    const msg = /^request \d+, step 0: the logits contain 1 non-finite value of 512 \(first: token 17 = -?inf\); the request was ended\./;
    check(r.status === 500 && r.json?.error?.type === "server_error" && r.json?.error?.code === "generation_error" &&
          msg.test(r.json?.error?.message), "non-streamed: 500 naming the step", r.text);
    const res = await fetch(s.base + "/v1/completions", {
      method: "POST", headers: { "content-type": "application/json" }, signal: AbortSignal.timeout(60000),
      body: JSON.stringify({ ...body, stream: true }) });
    const sse = parseSse(await res.text());
    const last = sse.chunks[sse.chunks.length - 1];
    check(sse.wellFormed && sse.done && last?.error?.code === "generation_error" && msg.test(last?.error?.message),
          "streamed: an error event, then [DONE]", JSON.stringify(sse));
    const h = await fetch(s.base + "/health", { signal: AbortSignal.timeout(10000) });
    eq(h.status, 200, "the server stays healthy");
    await waitMetrics(s, (m) => m['genbridge_requests_finished_total{reason="error"}'] === 2 && m.genbridge_kv_pages_used === 0,
                      "metrics: 2 ended by an error, no KV pages held");
    await stopServer(s);
  },

  // A hostile chat template (the model directory's tokenizer_config.json, chosen per request by
  // chat_template_kwargs.mode): nested range(1000000) loops and a 1 MB string printed a million times are 400
  // naming the limit within seconds; a render slowed by 30 MB scans stops at --request-timeout (504), when its
  // client leaves (the server's CPU time stops growing) and at SIGTERM (exit 0 within seconds). The server
  // answers a plain chat request and /health 200 throughout.
  async chat_template_limits() {
    const dir = path.join(WORK, "hostile_template_model");
    fs.rmSync(dir, { recursive: true, force: true });
    fs.mkdirSync(dir, { recursive: true });
    for (const f of fs.readdirSync(MODEL)) {
      if (f !== "tokenizer_config.json") fs.symlinkSync(path.resolve(MODEL, f), path.join(dir, f));
    }
    const config = JSON.parse(fs.readFileSync(path.join(MODEL, "tokenizer_config.json"), "utf8"));
    config.chat_template =
      "{%- if mode == 'loop' -%}{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}" +
      "{%- elif mode == 'big' -%}{% set s = 'x' * 1000000 %}{% for i in range(1000000) %}{{ s }}{% endfor %}" +
      "{%- elif mode == 'slow' -%}{% set s = 'x' * 30000000 %}{% for i in range(1000000) %}{% if 'y' in s %}{% endif %}{% endfor %}" +
      "{%- else -%}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
      "<|im_start|>assistant\n{%- endif -%}";
    fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(config));
    const chat = (mode) => ({ model: "hostile_template_model", messages: [{ role: "user", content: "hi" }], max_tokens: 2,
                              temperature: 0, chat_template_kwargs: mode ? { mode } : undefined });
    const healthy = async (what) => {
      const h = await fetch(s.base + "/health", { signal: AbortSignal.timeout(10000) });
      const r = await post(s, "/v1/chat/completions", chat(null), 30000);
      eq([h.status, r.status, r.json?.choices?.[0]?.finish_reason], [200, 200, "length"], `${what}: /health 200, a plain chat request 200`);
    };
    const cpuSeconds = (pid) => {
      const f = fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(")").pop().trim().split(" ");
      return (Number(f[11]) + Number(f[12])) / 100;  // utime + stime in clock ticks (USER_HZ 100)
    };
    // The step and output limits are checked under a deadline no render reaches (a sanitizer build on a loaded
    // machine takes several seconds for 1,000,000 steps); the slow render under --request-timeout 3.
    let s = await startServer(["--request-timeout", "120"], dir);
    await healthy("at start");
    let t0 = Date.now();
    let r = await post(s, "/v1/chat/completions", chat("loop"), 60000);
    eq([r.status, r.json?.error?.param, r.json?.error?.message],
       [400, "messages", "The chat template failed: chat template line 1: the render takes more than 1000000 steps " +
                         "(max_steps: statements, expressions, loop iterations and items walked)"],
       "nested range(1000000) loops: 400 naming max_steps");
    console.log(`  (the 1,000,000 steps took ${Date.now() - t0} ms)`);
    t0 = Date.now();
    r = await post(s, "/v1/chat/completions", chat("big"), 60000);
    eq([r.status, r.json?.error?.message],
       [400, "The chat template failed: chat template line 1: the rendered text would exceed 33554432 bytes (max_output_bytes)"],
       "a 1 MB string printed a million times: 400 naming max_output_bytes");
    check(Date.now() - t0 < 20000, "within seconds", Date.now() - t0);
    await stopServer(s);
    s = await startServer(["--request-timeout", "3"], dir);
    t0 = Date.now();
    r = await post(s, "/v1/chat/completions", chat("slow"), 60000);
    check(r.status === 504 && r.json?.error?.code === "timeout" &&
          /^The request did not finish within --request-timeout: chat template line 1: the render passed its deadline after \d+ steps$/
            .test(r.json?.error?.message ?? ""), "a slow render: 504 at --request-timeout 3", r.text);
    check(Date.now() - t0 < 15000, "soon after the deadline", Date.now() - t0);
    await healthy("after the limits");
    await stopServer(s);

    // A client that leaves: the render stops (no CPU time spent after it).
    s = await startServer([], dir);
    const gone = post(s, "/v1/chat/completions", chat("slow"), 1000).catch((e) => e.name);
    eq(await gone, "TimeoutError", "the client leaves after 1 s");
    await sleep(1500);
    const c0 = cpuSeconds(s.proc.pid);
    await sleep(2000);
    const spent = cpuSeconds(s.proc.pid) - c0;
    check(spent < 0.5, "the render stopped when its client left (CPU seconds in the next 2 s)", spent);
    await healthy("after the client left");
    // SIGTERM during a render: cancelled (503), exit 0 within seconds.
    const during = post(s, "/v1/chat/completions", chat("slow"), 60000);
    await sleep(1000);
    t0 = Date.now();
    terminate(s);
    const e = await Promise.race([s.exited, sleep(30000).then(() => ({ code: "timeout" }))]);
    const took = Date.now() - t0;
    eq(e.code, 0, "SIGTERM during a render: exit 0");
    check(took < 10000, "SIGTERM during a render: the server exits within seconds", took);
    const d = await during.catch((x) => ({ status: x.name }));
    check(d.status === 503 && /^The request was cancelled: chat template line 1: the render was cancelled after \d+ steps$/
            .test(d.json?.error?.message ?? ""), "the render in flight: 503 cancelled", d.text ?? d);
  },

  // SIGTERM: /health and new requests 503, the in-flight stream (--drain-tokens, 1,500: it outlasts the checks)
  // finishes, exit 0.
  // --streams N: N streams in flight (default 1; with --afd one per attention rank, as a request goes to the
  // rank with the fewest unfinished requests), each of which finishes.
  async sigterm_drains() {
    const DRAIN_TOKENS = Number(args["drain-tokens"] ?? 1500), STREAMS = Number(args.streams ?? 1);
    const s = await startServer(["--shutdown-timeout", "60"]);
    const open = async (i) => {
      const res = await fetch(s.base + "/v1/completions", {
        method: "POST", headers: { "content-type": "application/json" }, signal: AbortSignal.timeout(120000),
        body: JSON.stringify({ model: NAME, prompt: [1, 2, 3 + i], max_tokens: DRAIN_TOKENS, temperature: 0, stream: true,
                               ignore_eos: true, stream_options: { include_usage: true } }) });
      const reader = res.body.getReader();
      return { reader, text: new TextDecoder().decode((await reader.read()).value) };
    };
    const others = [];
    for (let i = 1; i < STREAMS; ++i) others.push(await open(i));
    const first = await open(0);
    const reader = first.reader;
    let text = first.text;
    terminate(s);
    const deadline = Date.now() + 10000;
    let h;
    while ((h = await fetch(s.base + "/health", { signal: AbortSignal.timeout(5000) })).status !== 503 && Date.now() < deadline) await sleep(5);
    eq(h.status, 503, "draining: /health 503");
    const r = await post(s, "/v1/completions", { model: NAME, prompt: [1], max_tokens: 2 });
    eq([r.status, r.json?.error?.message], [503, "The server is shutting down and accepts no new requests."], "draining: a new request gets 503");
    for (let i = 0; i < 100000; ++i) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    const sse = parseSse(text);
    const j = joinChunks(sse.chunks, false);
    eq([sse.wellFormed, sse.done, j.finish, j.usage?.completion_tokens], [true, true, "length", DRAIN_TOKENS], "the in-flight stream finished");
    for (const [i, o] of others.entries()) {
      for (let k = 0; k < 100000; ++k) {
        const { value, done } = await o.reader.read();
        if (done) break;
        o.text += new TextDecoder().decode(value);
      }
      const so = parseSse(o.text), jo = joinChunks(so.chunks, false);
      eq([so.wellFormed, so.done, jo.finish, jo.usage?.completion_tokens], [true, true, "length", DRAIN_TOKENS],
         `in-flight stream ${i + 1} finished`);
    }
    const e = await Promise.race([s.exited, sleep(30000).then(() => ({ code: "timeout" }))]);
    eq(e.code, 0, "exit 0 after draining");
  },

  // SIGTERM with --shutdown-timeout 0: the in-flight request (4,000 tokens) is cancelled (an error event), exit 0.
  async sigterm_deadline() {
    const s = await startServer(["--shutdown-timeout", "0"]);
    const res = await fetch(s.base + "/v1/completions", {
      method: "POST", headers: { "content-type": "application/json" }, signal: AbortSignal.timeout(60000),
      body: JSON.stringify({ model: NAME, prompt: [1, 2, 3], max_tokens: 4000, temperature: 0, stream: true, ignore_eos: true }) });
    const reader = res.body.getReader();
    let text = new TextDecoder().decode((await reader.read()).value);
    const t0 = Date.now();
    terminate(s);
    for (let i = 0; i < 100000; ++i) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    const sse = parseSse(text);
    const last = sse.chunks[sse.chunks.length - 1];
    eq([sse.wellFormed, sse.done, last?.error?.message], [true, true, "The request was cancelled: the server is shutting down."],
       "the stream ends with an error event and [DONE]");
    const e = await Promise.race([s.exited, sleep(30000).then(() => ({ code: "timeout" }))]);
    eq(e.code, 0, "exit 0");
    // Generous: a sanitizer build on a loaded 2-core machine; a server that ignores the deadline runs 4,000 tokens.
    check(Date.now() - t0 < 25000, "within the deadline (plus the listener's close)", Date.now() - t0);
  },

  // The official OpenAI Node client, on a synthetic model of Qwen3's vocabulary with the real Qwen3 tokenizer.
  async openai_client() {
    const { default: OpenAI } = await import(path.join(args["client-dir"], "node_modules/openai/index.mjs"));
    // genbridge run first: execFileSync blocks this event loop, and a pooled keep-alive connection whose
    // server closed it meanwhile would be reused before its close is seen.
    const prompt = "The capital of France is 巴黎, and the emoji is 🙂.";
    const want = runCli([bosText() + prompt], 12)[0];
    const messages = [{ role: "system", content: "You are terse." }, { role: "user", content: "Say hello in 中文." }];
    const tools = [{ type: "function", function: { name: "get_weather", description: "The weather in a city",
                                                   parameters: { type: "object", properties: { city: { type: "string" } } } } }];
    // With --oracle-dir: chats whose prompts are the references' exactly (the system prompt, tools declared, an
    // assistant turn of tool calls (content null, string arguments) and the tool's result, template keywords), and
    // whose greedy tokens are genbridge run's on those prompt ids.
    const call = { id: "call_0", type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\"}" } };
    const chats = [
      { name: "system prompt", messages },
      { name: "tools declared", messages, tools },
      { name: "tool call and its result", tools,
        messages: [...messages, { role: "assistant", content: null, tool_calls: [call] },
                   { role: "tool", tool_call_id: "call_0", content: "{\"temp\": 18}" },
                   { role: "assistant", content: "18 degrees." }, { role: "user", content: "And in 東京?" }] },
      { name: "chat_template_kwargs", messages, chat_template_kwargs: { enable_thinking: false } },
    ];
    const reference = args["oracle-dir"] ? await referenceChatPrompts(chats) : null;
    const referenceRun = reference ? runCli(reference.map((r) => r.ids), 6) : null;
    const s = await startServer([]);
    const client = new OpenAI({ baseURL: s.base + "/v1", apiKey: "unused", timeout: 60000, maxRetries: 0 });
    const models = await client.models.list();
    eq(models.data.map((m) => m.id), [NAME], "models.list");
    // genbridge run's text keeps special tokens (a DeepSeek placeholder token may come up): so does skip_special_tokens
    // false here (the server's default, as vLLM's, leaves them out).
    const keep = { skip_special_tokens: false };
    const c = await client.completions.create({ model: NAME, prompt, max_tokens: 12, temperature: 0, ignore_eos: true, ...keep });
    eq([c.choices[0].text, c.choices[0].finish_reason, c.usage.completion_tokens], [want.text, "length", 12],
       "completions.create: genbridge run's text");
    let text = "", finish = null, usage = null;
    for await (const ch of await client.completions.create({ model: NAME, prompt, max_tokens: 12, temperature: 0, ignore_eos: true, stream: true,
                                                             ...keep })) {
      text += ch.choices[0]?.text ?? "";
      finish = ch.choices[0]?.finish_reason ?? finish;
      usage = ch.usage ?? usage;
    }
    eq([text, finish, usage], [want.text, "length", null], "completions.create stream: the same text, no usage unless asked");
    text = "";
    for await (const ch of await client.completions.create({ model: NAME, prompt, max_tokens: 12, temperature: 0, ignore_eos: true,
                                                             stream: true, stream_options: { include_usage: true }, ...keep })) {
      text += ch.choices[0]?.text ?? "";
      usage = ch.usage ?? usage;
    }
    eq([text, usage?.completion_tokens], [want.text, 12], "completions.create stream with include_usage: the usage");
    const chat = await client.chat.completions.create({ model: NAME, messages, max_tokens: 10, temperature: 0 });
    eq([chat.choices[0].message.role, chat.choices[0].finish_reason, chat.usage.completion_tokens], ["assistant", "length", 10],
       "chat.completions.create");
    text = "";
    let role = null;
    for await (const ch of await client.chat.completions.create({ model: NAME, messages, max_tokens: 10, temperature: 0, stream: true })) {
      role = ch.choices[0]?.delta?.role ?? role;
      text += ch.choices[0]?.delta?.content ?? "";
      finish = ch.choices[0]?.finish_reason ?? finish;
    }
    eq([role, text, finish], ["assistant", chat.choices[0].message.content, "length"], "chat.completions.create stream: the same content");
    // Logprobs through the client, streamed and not: one entry per token, the same values either way, the
    // tokens' bytes (chat) spell the content; greedy: the chosen token is the most likely one.
    const lc = await client.completions.create({ model: NAME, prompt, max_tokens: 6, temperature: 0, ignore_eos: true, logprobs: 2 });
    const llp = lc.choices[0].logprobs;
    eq([llp?.tokens?.length, llp?.token_logprobs?.length, llp?.top_logprobs?.length, llp?.text_offset?.length], [6, 6, 6, 6],
       "completions.create logprobs: 2: one entry per token");
    check(llp.top_logprobs.every((t, i) => Object.keys(t).length >= 1 && Object.keys(t).length <= 3 &&
                                             Math.abs(Math.max(...Object.values(t)) - llp.token_logprobs[i]) < 1e-12 &&
                                             llp.token_logprobs[i] < 0),
          "completions logprobs: at most 2 + 1 alternatives, greedy picks the likeliest, logprobs < 0", llp);
    let slp = { text_offset: [], token_logprobs: [], tokens: [], top_logprobs: [] };
    for await (const ch of await client.completions.create({ model: NAME, prompt, max_tokens: 6, temperature: 0, ignore_eos: true,
                                                             logprobs: 2, stream: true })) {
      const l = ch.choices[0]?.logprobs;
      if (l) for (const k of Object.keys(slp)) slp[k] = slp[k].concat(l[k]);
    }
    eq(slp, llp, "completions.create stream logprobs: the same entries");
    const lchat = await client.chat.completions.create({ model: NAME, messages, max_tokens: 6, temperature: 0, ignore_eos: true,
                                                         logprobs: true, top_logprobs: 3 });
    const content = lchat.choices[0].logprobs?.content ?? [];
    eq([content.length, content.map((e) => e.top_logprobs.length)], [6, [3, 3, 3, 3, 3, 3]], "chat logprobs: 6 entries of 3 alternatives");
    eq(Buffer.from(content.flatMap((e) => e.bytes)).toString("utf8"), lchat.choices[0].message.content,
       "chat logprobs: the tokens' bytes spell the content (byte-level BPE tokens)");
    check(content.every((e) => e.logprob === e.top_logprobs[0].logprob && e.top_logprobs[0].token === e.token &&
                               e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob),
          "greedy chat: the chosen token is the most likely", content);
    let scontent = [];
    for await (const ch of await client.chat.completions.create({ model: NAME, messages, max_tokens: 6, temperature: 0,
                                                                  ignore_eos: true, logprobs: true, top_logprobs: 3, stream: true })) {
      scontent = scontent.concat(ch.choices[0]?.logprobs?.content ?? []);
    }
    eq(scontent, content, "chat stream logprobs: the same entries");
    try {
      await client.chat.completions.create({ model: NAME, messages, max_tokens: 1, logprobs: true, top_logprobs: 25 });
      check(false, "top_logprobs 25 throws");
    } catch (e) {
      eq([e.status, e.error?.message, e.error?.param], [400, "'top_logprobs' must be between 0 and 20, got 25.", "top_logprobs"],
         "top_logprobs 25: the client sees the 400 naming the field");
    }
    if (reference) {
      for (const [i, c] of chats.entries()) {
        const r = await client.chat.completions.create({
          model: NAME, messages: c.messages, ...(c.tools ? { tools: c.tools } : {}),
          ...(c.chat_template_kwargs ? { chat_template_kwargs: c.chat_template_kwargs } : {}),
          max_tokens: 6, temperature: 0, ignore_eos: true, return_token_ids: true });
        eq([r.usage.prompt_tokens, r.choices[0].token_ids], [reference[i].ids.length, referenceRun[i].ids],
           `chat '${c.name}': the prompt of the model's template (${reference[i].ids.length} tokens: ` +
           `${JSON.stringify(reference[i].text)}), genbridge run's tokens on it`);
      }
    } else {
      // chat_template_kwargs reach Qwen3's template: enable_thinking false appends an empty think block.
      const noThink = await client.chat.completions.create({ model: NAME, messages, max_tokens: 1, temperature: 0,
                                                             chat_template_kwargs: { enable_thinking: false } });
      check(noThink.usage.prompt_tokens > chat.usage.prompt_tokens,
            "chat_template_kwargs.enable_thinking false: a longer prompt (the empty think block)",
            [noThink.usage.prompt_tokens, chat.usage.prompt_tokens]);
      const withTools = await client.chat.completions.create({ model: NAME, messages, max_tokens: 1, temperature: 0, tools });
      check(withTools.usage.prompt_tokens > chat.usage.prompt_tokens + 20, "tools reach the template (a longer prompt)",
            [withTools.usage.prompt_tokens, chat.usage.prompt_tokens]);
    }
    try {
      await client.completions.create({ model: "nope", prompt: "x" });
      check(false, "an unknown model throws");
    } catch (e) {
      eq([e.constructor.name, e.status, e.error?.message, e.error?.code],
         ["NotFoundError", 404, `The model 'nope' does not exist; this server serves '${NAME}'.`, "model_not_found"],
         "an unknown model: the client's NotFoundError (404, model_not_found)");
    }
    await stopServer(s);
  },

  // docs/serving.md's field table, row by row (--docs FILE): each row's request merged into a minimal one of its
  // endpoint(s), without "model" (optional); honoured rows answer 200, "default only" rows 400 naming the field
  // (and 200 at their default), refused rows 400 naming the field. A field of neither API, and one of the other
  // endpoint, are refused by name.
  async field_table() {
    const rowRe = /^\| `([a-z_]+)` \| (both|completions|chat) \| (honoured|default only|refused) \| (.*?) \| (.*?) \|/;
    const rows = [];
    for (const line of fs.readFileSync(args.docs, "utf8").split("\n")) {
      const m = rowRe.exec(line);
      if (m) rows.push({ field: m[1], endpoints: m[2], status: m[3], request: m[4].trim(), dflt: m[5].trim() });
    }
    check(rows.length >= 70, `docs/serving.md: the field table has its rows (${rows.length})`);
    const s = await startServer(["--served-model-name", "served-a", "--served-model-name", "served-b"]);
    const base = { completions: { prompt: "Hello", max_tokens: 2, temperature: 0 },
                   chat: { messages: [{ role: "user", content: "Hi" }], max_tokens: 2, temperature: 0 } };
    const route = { completions: "/v1/completions", chat: "/v1/chat/completions" };
    const cell = (c) => JSON.parse(c.replace(/^`|`$/g, ""));
    let sent = 0;
    for (const row of rows) {
      for (const ep of row.endpoints === "both" ? ["completions", "chat"] : [row.endpoints]) {
        const body = { ...base[ep], ...cell(row.request) };
        const r = await post(s, route[ep], body);
        ++sent;
        if (row.status === "honoured") {
          check(r.status === 200 && (body.stream ? parseSse(r.text).done : r.json?.choices?.length > 0),
                `${row.field} (${ep}, honoured): 200 ${JSON.stringify(cell(row.request))}`, r.text.slice(0, 300));
        } else {
          eq([r.status, r.json?.error?.param], [400, row.field], `${row.field} (${ep}, ${row.status}): 400 naming it`);
          if (row.status === "default only") {
            const d = await post(s, route[ep], { ...base[ep], [row.field]: cell(row.dflt) });
            eq(d.status, 200, `${row.field} (${ep}) at its default ${row.dflt}: 200`);
          }
        }
      }
    }
    // What the rows claim beyond the status, for a few of them.
    let r = await post(s, "/v1/completions", { ...base.completions, model: "served-b" });
    eq(r.json?.model, "served-b", "model: the response names the model asked for");
    r = await post(s, "/v1/completions", base.completions);
    eq(r.json?.model, "served-a", "no model: the first served name");
    r = await post(s, "/v1/completions", { ...base.completions, request_id: "field-table-1" });
    eq(r.json?.id, "cmpl-field-table-1", "request_id: the response id");
    // The output constraints' rows: what each output is (the tiny model writes none of it by itself).
    const outputOf = (x) => x.json?.choices?.[0]?.text ?? x.json?.choices?.[0]?.message?.content;
    for (const ep of ["completions", "chat"]) {
      r = await post(s, route[ep], { ...base[ep], max_tokens: 4, temperature: 1, seed: 3, guided_choice: ["yes", "no"] });
      check(["yes", "no"].includes(outputOf(r)), `guided_choice (${ep}): one of the choices`, outputOf(r));
      r = await post(s, route[ep], { ...base[ep], max_tokens: 4, temperature: 1, seed: 4, structured_outputs: { choice: ["yes", "no"] } });
      check(["yes", "no"].includes(outputOf(r)), `structured_outputs.choice (${ep}): one of the choices`, outputOf(r));
      r = await post(s, route[ep], { ...base[ep], max_tokens: 4, temperature: 1, seed: 5, guided_regex: "[ab]{2}" });
      check(/^[ab]{2}$/.test(outputOf(r)), `guided_regex (${ep}): a full match`, outputOf(r));
      r = await post(s, route[ep], { ...base[ep], max_tokens: 8, temperature: 1, seed: 6, response_format: { type: "json_object" } });
      const obj = (() => { try { return JSON.parse(outputOf(r)); } catch { return null; } })();
      check(obj !== null && typeof obj === "object" && !Array.isArray(obj), `response_format json_object (${ep}): an object`, outputOf(r));
      // n choices, each under the grammar with a matcher of its own.
      r = await post(s, route[ep], { ...base[ep], max_tokens: 4, temperature: 1, seed: 7, n: 3, guided_choice: ["yes", "no"] });
      const outs = (r.json?.choices ?? []).map((c) => c.text ?? c.message?.content);
      check(outs.length === 3 && outs.every((o) => ["yes", "no"].includes(o)), `guided_choice with n 3 (${ep}): every choice`, outs);
    }
    // This model's template writes no tool calls: tool_choice "required" cannot be honoured and is refused.
    const weatherTool = { type: "function", function: { name: "get_weather", parameters: { type: "object" } } };
    r = await post(s, route.chat, { ...base.chat, tools: [weatherTool], tool_choice: "required" });
    eq([r.status, r.json?.error?.param], [400, "tool_choice"], "tool_choice required with a template of no known call format: 400");
    for (const [ep, body, param, message] of [
      ["completions", { ...base.completions, frobnicate: 1 }, "frobnicate", "Unrecognized request argument supplied: frobnicate"],
      ["completions", { ...base.completions, messages: [] }, "messages", "'messages' belongs to /v1/chat/completions, not /v1/completions."],
      ["chat", { ...base.chat, suffix: "x" }, "suffix", "'suffix' belongs to /v1/completions, not /v1/chat/completions."],
    ]) {
      r = await post(s, route[ep], body);
      eq([r.status, r.json?.error?.param, r.json?.error?.message], [400, param, message], `${ep}: ${param} refused by name`);
    }
    console.log(`sent ${sent} requests for ${rows.length} rows`);
    await stopServer(s);
  },

  // The sampling controls through the official OpenAI Node client, each checked for what vLLM documents:
  // penalties, logit_bias and allowed_token_ids exactly against an oracle (the raw logits genbridge run dumps
  // after each prefix of the server's own output, processed in float32 as vLLM does, then the argmax),
  // min_p, stop_token_ids, include_stop_str_in_output, min_tokens, n, best_of, a prompt list and echo with
  // the prompt's logprobs (against the dumped logits).
  async sampling_controls() {
    const { default: OpenAI } = await import(path.join(args["client-dir"], "node_modules/openai/index.mjs"));
    const P = [9707, 11, 1879, 0, 5209, 3256];  // token ids of the Qwen3 vocabulary
    const N = 8;
    // genbridge run first (execFileSync blocks the event loop): the greedy tokens and, for the oracles below, the
    // raw logits after each prefix they need.
    const greedy = runCli([P], N)[0].ids;
    const s = await startServer([]);
    const client = new OpenAI({ baseURL: s.base + "/v1", apiKey: "unused", timeout: 60000, maxRetries: 0 });
    const complete = (extra) => client.completions.create({ model: NAME, prompt: P, max_tokens: N, temperature: 0,
                                                            ignore_eos: true, return_token_ids: true, ...extra });
    const ids = (c, i = 0) => c.choices[i].token_ids;
    let c = await complete({});
    eq(ids(c), greedy, "greedy: genbridge run's tokens");
    // logit_bias +100 on one token: greedy picks it every step; allowed_token_ids: nothing else is drawn.
    c = await complete({ logit_bias: { "1000": 100 } });
    eq(ids(c), Array(N).fill(1000), "logit_bias {1000: 100}: every token is 1000");
    c = await complete({ allowed_token_ids: [500, 600, 700], temperature: 1, seed: 3 });
    check(ids(c).every((t) => [500, 600, 700].includes(t)), "allowed_token_ids: only those are drawn", ids(c));
    // Penalties, bias and allowed tokens together, greedy: each token is the argmax of the processed raw logits.
    const controls = { allowed_token_ids: [100, 200, 300, 400], logit_bias: { "100": 3, "200": 2.5, "300": 2, "400": 1.5 },
                       presence_penalty: 1.5, frequency_penalty: 0.7, repetition_penalty: 1.3 };
    c = await complete({ ...controls, max_tokens: 10 });
    const S = ids(c);
    const prefixes = S.map((_, k) => [...P, ...S.slice(0, k)]);
    await stopServer(s);  // genbridge run blocks the event loop: no server meanwhile
    const npyFile = path.join(WORK, "prefixes.npy");
    runCli(prefixes, 1, MODEL, ["--dump-logits", npyFile]);
    const npy = readNpyF32(npyFile);
    const f = Math.fround;
    const oracle = [];
    for (let k = 0; k < S.length; ++k) {
      const row = npy.data.subarray(k * npy.cols, (k + 1) * npy.cols);
      const out = S.slice(0, k), seen = new Set([...P, ...out]);
      let best = -1, bestV = -Infinity;
      for (const t of controls.allowed_token_ids) {
        let x = f(row[t] + f(controls.logit_bias[String(t)]));
        if (seen.has(t)) x = x > 0 ? f(x / f(controls.repetition_penalty)) : f(x * f(controls.repetition_penalty));
        const count = out.filter((o) => o === t).length;
        x = f(x - f(f(controls.frequency_penalty) * count));
        if (count > 0) x = f(x - f(controls.presence_penalty));
        if (x > bestV || (x === bestV && t < best)) { best = t; bestV = x; }
      }
      oracle.push(best);
    }
    eq(S, oracle, "presence, frequency and repetition penalties with logit_bias over allowed tokens: vLLM's processing of the raw logits, greedy");
    check(new Set(S).size > 1, "the penalties moved greedy decoding off its first token", S);
    // The rest on a fresh server.
    const s2 = await startServer([]);
    const client2 = new OpenAI({ baseURL: s2.base + "/v1", apiKey: "unused", timeout: 60000, maxRetries: 0 });
    const complete2 = (extra) => client2.completions.create({ model: NAME, prompt: P, max_tokens: N, temperature: 0,
                                                              ignore_eos: true, return_token_ids: true, ...extra });
    // repetition_penalty after logit_bias: biases 100 / 75 / 50 walk a, b, c and back to a.
    c = await complete2({ allowed_token_ids: [30, 40, 50], logit_bias: { "40": 100, "30": 75, "50": 50 }, repetition_penalty: 1000,
                          max_tokens: 4 });
    eq(ids(c), [40, 30, 50, 40], "repetition_penalty 1000 after logit_bias: 40, 30, 50, then 40 again");
    // min_p 1 at temperature 1 keeps only the likeliest token: greedy.
    c = await complete2({ temperature: 1, min_p: 1, seed: 11 });
    eq(ids(c), greedy, "min_p 1 at temperature 1: the greedy tokens");
    // stop_token_ids: the choice ends at the token; its text is left out unless include_stop_str_in_output.
    const k = greedy.findIndex((t, i) => i >= 2 && !greedy.slice(0, i).includes(t));
    const text = async (toks) => (await post(s2, "/detokenize", { tokens: toks })).json.prompt;
    c = await complete2({ stop_token_ids: [greedy[k]] });
    eq([ids(c), c.choices[0].finish_reason, c.choices[0].stop_reason, c.choices[0].text],
       [greedy.slice(0, k + 1), "stop", greedy[k], await text(greedy.slice(0, k))],
       `stop_token_ids [${greedy[k]}]: ends there, stop_reason the id, its text left out`);
    c = await complete2({ stop_token_ids: [greedy[k]], include_stop_str_in_output: true });
    eq(c.choices[0].text, await text(greedy.slice(0, k + 1)), "include_stop_str_in_output: the stop token's text is in");
    // min_tokens: the stop token cannot come first.
    c = await complete2({ stop_token_ids: [greedy[0]], min_tokens: 3, max_tokens: 6 });
    check(ids(c).length >= 3 && !ids(c).slice(0, 3).includes(greedy[0]),
          `min_tokens 3: stop token ${greedy[0]} not among the first 3 tokens`, ids(c));
    // A stop string with include_stop_str_in_output: the text ends with it.
    const full = (await complete2({})).choices[0].text;
    const stop = [...full].slice(1, 3).join("");
    c = await complete2({ stop: [stop], include_stop_str_in_output: true });
    eq([c.choices[0].text, c.choices[0].finish_reason, c.choices[0].stop_reason],
       [full.slice(0, full.indexOf(stop) + stop.length), "stop", stop], `stop ${JSON.stringify(stop)} included in the output`);
    // n: choice i samples with seed + i; best_of keeps the highest summed logprob.
    const sampled = (extra) => complete2({ temperature: 1, seed: 7, ...extra });
    const three = await sampled({ n: 3, logprobs: 0 });
    eq(three.choices.map((x) => x.index), [0, 1, 2], "n 3: three choices");
    for (let i = 0; i < 3; ++i) {
      eq(ids(three, i), ids(await sampled({ seed: 7 + i })), `n 3: choice ${i} is the request with seed ${7 + i}`);
    }
    const sums = three.choices.map((x) => x.logprobs.token_logprobs.reduce((a, b) => a + b, 0));
    const best = await sampled({ best_of: 3, logprobs: 0 });
    eq([best.choices.length, ids(best)], [1, ids(three, sums.indexOf(Math.max(...sums)))],
       "best_of 3: the choice with the highest summed logprob");
    eq(best.usage.completion_tokens, 3 * N, "best_of 3: usage counts every sequence");
    // A prompt list: choice p * n + c is prompt p's choice c.
    const Q = [P, [1, 2, 3]];
    const list = await client2.completions.create({ model: NAME, prompt: Q, n: 2, max_tokens: 4, temperature: 1, seed: 9,
                                                    ignore_eos: true, return_token_ids: true });
    for (let p = 0; p < 2; ++p) {
      for (let i = 0; i < 2; ++i) {
        const alone = await client2.completions.create({ model: NAME, prompt: Q[p], max_tokens: 4, temperature: 1, seed: 9 + i,
                                                         ignore_eos: true, return_token_ids: true });
        eq(ids(list, p * 2 + i), ids(alone), `prompt list: choice ${p * 2 + i} is prompt ${p}'s choice ${i}`);
      }
    }
    eq(list.usage.prompt_tokens, P.length + 3, "prompt list: usage counts each prompt once");
    // Streamed n 2: each index carries its choice.
    const streamed = await client2.completions.create({ model: NAME, prompt: P, n: 2, max_tokens: N, temperature: 1, seed: 7,
                                                        ignore_eos: true, stream: true });
    const texts = ["", ""];
    for await (const ch of streamed) for (const x of ch.choices) texts[x.index] += x.text;
    eq(texts, three.choices.slice(0, 2).map((x) => x.text), "streamed n 2: each index's text is its choice's");
    // echo with logprobs: the prompt's text and its tokens' logprobs (the first null) before the generation.
    const promptText = await text(P);
    const echo = await complete2({ echo: true, logprobs: 1, max_tokens: 3 });
    const elp = echo.choices[0].logprobs;
    eq([echo.choices[0].text.startsWith(promptText), elp.tokens.length, elp.token_logprobs[0], elp.top_logprobs[0], elp.text_offset[0]],
       [true, P.length + 3, null, null, 0], "echo with logprobs: the prompt's text, one entry per prompt and generated token, the first null");
    // Streamed with n 2: every choice's first chunk is the prompt with its logprobs (the first choice fed it).
    const echoed = [[], []];
    for await (const ch of await client2.completions.create({ model: NAME, prompt: P, n: 2, max_tokens: 3, temperature: 1, seed: 4,
                                                              ignore_eos: true, echo: true, logprobs: 1, stream: true })) {
      for (const x of ch.choices) echoed[x.index] = echoed[x.index].concat(x.logprobs?.token_logprobs ?? []);
    }
    eq(echoed.map((e) => [e.length, JSON.stringify(e.slice(0, P.length))]),
       [0, 1].map(() => [P.length + 3, JSON.stringify(elp.token_logprobs.slice(0, P.length))]),
       "streamed echo with logprobs, n 2: each choice carries the prompt's logprobs, then its own");
    const only = await complete2({ echo: true, logprobs: 1, max_tokens: 0 });
    eq([only.choices[0].text, only.choices[0].logprobs.token_logprobs.length, only.usage.completion_tokens], [promptText, P.length, 0],
       "echo with max_tokens 0: the prompt alone");
    await stopServer(s2);
    const promptFile = path.join(WORK, "prompt_prefixes.npy");
    runCli(P.slice(1).map((_, i) => P.slice(0, i + 1)), 1, MODEL, ["--dump-logits", promptFile]);
    const pn = readNpyF32(promptFile);
    let worst = 0;
    for (let i = 1; i < P.length; ++i) worst = Math.max(worst, Math.abs(elp.token_logprobs[i] - logSoftmaxRow(pn, i - 1, P[i], 1).chosen));
    check(worst < 1e-9, `echo: each prompt token's logprob is the log-softmax of the logits after its prefix (worst ${worst})`);
    eq(elp.tokens.slice(P.length).length, 3, "echo: then the generated tokens");
  },

  // The checkpoint's generation_config.json (a copy of the model directory, its files linked, with one added):
  // any of its eos ids ends a choice (stop, stop_reason null; ignore_eos goes past), its temperature is the
  // default of a request without one, --override-generation-config goes over it.
  async generation_config() {
    const P = [9707, 11, 1879, 0, 5209, 3256];
    const greedy = runCli([P], 8)[0].ids;
    const dir = path.join(WORK, "with_generation_config");
    fs.rmSync(dir, { recursive: true, force: true });
    fs.mkdirSync(dir, { recursive: true });
    for (const f of fs.readdirSync(MODEL)) fs.symlinkSync(path.join(MODEL, f), path.join(dir, f));
    const k = greedy.findIndex((t, i) => i >= 2 && !greedy.slice(0, i).includes(t));
    fs.writeFileSync(path.join(dir, "generation_config.json"),
                     JSON.stringify({ eos_token_id: [151645, greedy[k]], temperature: 1.0, do_sample: true }));
    const name = path.basename(dir);
    let s = await startServer(["--override-generation-config", '{"temperature": 0}'], dir, /*quiet=*/false);
    const req = { model: name, prompt: P, max_tokens: 8, return_token_ids: true };
    let r = await post(s, "/v1/completions", req);
    eq([r.json?.choices?.[0]?.token_ids, r.json?.choices?.[0]?.finish_reason, r.json?.choices?.[0]?.stop_reason],
       [greedy.slice(0, k + 1), "stop", null], `generation_config.json eos_token_id [151645, ${greedy[k]}]: the second one stops (no temperature: the override's 0, greedy)`);
    r = await post(s, "/v1/completions", { ...req, ignore_eos: true });
    eq(r.json?.choices?.[0]?.token_ids, greedy, "ignore_eos: past every eos id");
    check(s.log().includes(`end-of-generation tokens [151645, ${greedy[k]}]; sampling defaults: temperature 0`),
          "start-up log: the eos tokens and the defaults in force", s.log());
    await stopServer(s);
    s = await startServer([], dir);
    r = await post(s, "/v1/completions", { ...req, ignore_eos: true, seed: 5 });
    check(JSON.stringify(r.json?.choices?.[0]?.token_ids) !== JSON.stringify(greedy),
          "no override: the file's temperature 1 samples (seeded, not the greedy tokens)", r.json);
    r = await post(s, "/v1/completions", { ...req, ignore_eos: true, temperature: 0 });
    eq(r.json?.choices?.[0]?.token_ids, greedy, "a request's own temperature wins over the file's");
    await stopServer(s);
  },

  // --reasoning-parser qwen3: a reply "<think>X</think>Y" (made with allowed_token_ids, logit_bias and a
  // repetition penalty) is split into reasoning_content X and content Y, non-streamed and streamed, through the
  // OpenAI client; include_reasoning false leaves the reasoning out.
  async reasoning() {
    const { default: OpenAI } = await import(path.join(args["client-dir"], "node_modules/openai/index.mjs"));
    const s = await startServer(["--reasoning-parser", "qwen3"]);
    const client = new OpenAI({ baseURL: s.base + "/v1", apiKey: "unused", timeout: 60000, maxRetries: 0 });
    const tok = async (t) => (await post(s, "/tokenize", { prompt: t })).json.tokens;
    const [X] = await tok("Hi"), [Y] = await tok(" there"), T = 151667, E = 151668;
    const walk = { allowed_token_ids: [T, X, E, Y], logit_bias: { [T]: 100, [X]: 75, [E]: 50, [Y]: 25 }, repetition_penalty: 1000,
                   max_tokens: 4, temperature: 0 };
    const messages = [{ role: "user", content: "Say hi" }];
    const r = await client.chat.completions.create({ model: NAME, messages, ...walk });
    eq([r.choices[0].message.reasoning_content, r.choices[0].message.content], ["Hi", " there"],
       "qwen3 parser: <think>Hi</think> there -> reasoning_content 'Hi', content ' there'");
    let reasoning = "", content = "";
    for await (const ch of await client.chat.completions.create({ model: NAME, messages, ...walk, stream: true })) {
      reasoning += ch.choices[0]?.delta?.reasoning_content ?? "";
      content += ch.choices[0]?.delta?.content ?? "";
    }
    eq([reasoning, content], ["Hi", " there"], "streamed: the same split in delta.reasoning_content and delta.content");
    const hidden = await client.chat.completions.create({ model: NAME, messages, ...walk, include_reasoning: false });
    eq(["reasoning_content" in hidden.choices[0].message, hidden.choices[0].message.content], [false, " there"],
       "include_reasoning false: no reasoning_content");
    await stopServer(s);
  },

  // Operations over raw HTTP (curl): --api-key (401, /health and /metrics open), CORS (--allowed-origins: the
  // preflight, a refused origin, the header on replies), /tokenize and /detokenize, GET /v1/models/{id},
  // --served-model-name repeated, --chat-template, the key order a template sees, vLLM's metric names, response
  // ids unique across processes, system_fingerprint.
  async operations() {
    const tmpl = path.join(WORK, "template.jinja");
    fs.writeFileSync(tmpl, "{% for m in messages %}[{{ m.role }}] {{ m | tojson }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}");
    const flags = ["--api-key", "k1", "--api-key", "k2", "--allowed-origins", "https://ok.example", "--served-model-name", "one",
                   "--served-model-name", "two", "--chat-template", tmpl];
    const s = await startServer(flags);
    const key = ["-H", "Authorization: Bearer k2"];
    const body = { prompt: "Hello", max_tokens: 2, temperature: 0 };
    let r = curl(s, "/v1/completions", body);
    eq([r.status, r.json?.error?.code], [401, "invalid_api_key"], "--api-key: no key, 401 invalid_api_key");
    r = curl(s, "/v1/completions", body, ["-H", "Authorization: Bearer nope"]);
    eq(r.status, 401, "--api-key: a wrong key, 401");
    r = curl(s, "/v1/models", undefined);
    eq(r.status, 401, "--api-key: GET /v1/models needs it too");
    r = curl(s, "/v1/completions", body, key);
    eq([r.status, r.json?.model], [200, "one"], "--api-key: the second key passes; no model: the first served name");
    eq([curl(s, "/health").status, curl(s, "/metrics").status], [200, 200], "/health and /metrics stay open");
    r = curl(s, "/v1/models", undefined, key);
    eq(r.json?.data?.map((d) => d.id), ["one", "two"], "--served-model-name twice: both listed");
    r = curl(s, "/v1/models/two", undefined, key);
    eq([r.status, r.json?.id], [200, "two"], "GET /v1/models/two");
    r = curl(s, "/v1/models/three", undefined, key);
    eq([r.status, r.json?.error?.code], [404, "model_not_found"], "GET /v1/models/three: 404");
    r = curl(s, "/v1/completions", { ...body, model: "three" }, key);
    eq([r.status, r.json?.error?.code], [404, "model_not_found"], "an unknown model: 404 model_not_found");
    // CORS.
    const pre = execFileSync("curl", ["-sS", "-i", "-X", "OPTIONS", "--max-time", "20", "-H", "Origin: https://ok.example",
                                      "-H", "Access-Control-Request-Method: POST", "-H", "Access-Control-Request-Headers: authorization, content-type",
                                      s.base + "/v1/chat/completions"], { encoding: "utf8", timeout: 30000 });
    check(/^HTTP\/1\.1 204/.test(pre) && /access-control-allow-origin: https:\/\/ok\.example/i.test(pre) &&
          /access-control-allow-headers: authorization, content-type/i.test(pre) && /access-control-allow-methods: GET, POST, OPTIONS/i.test(pre),
          "CORS preflight from an allowed origin: 204 with the Access-Control headers (no API key needed)", pre);
    const bad = execFileSync("curl", ["-sS", "-i", "-X", "OPTIONS", "--max-time", "20", "-H", "Origin: https://evil.example",
                                      "-H", "Access-Control-Request-Method: POST", s.base + "/v1/completions"], { encoding: "utf8", timeout: 30000 });
    check(/^HTTP\/1\.1 403/.test(bad) && /origin_not_allowed/.test(bad) && !/access-control-allow-origin/i.test(bad),
          "CORS preflight from another origin: 403", bad);
    const withOrigin = execFileSync("curl", ["-sS", "-i", "--max-time", "20", "-H", "Origin: https://ok.example", ...key,
                                             s.base + "/v1/models"], { encoding: "utf8", timeout: 30000 });
    check(/access-control-allow-origin: https:\/\/ok\.example/i.test(withOrigin), "a reply to an allowed Origin carries the header", withOrigin);
    // /tokenize and /detokenize; --chat-template; the request's key order reaches tojson.
    r = curl(s, "/tokenize", { prompt: "Hello", return_token_strs: true }, key);
    eq([r.status, r.json?.count, r.json?.tokens?.length, r.json?.token_strs?.length], [200, r.json?.tokens?.length, r.json?.count, r.json?.count],
       "/tokenize prompt: count, tokens, token_strs");
    const back = curl(s, "/detokenize", { tokens: r.json.tokens }, key);
    eq([back.status, back.json?.prompt], [200, "Hello"], "/detokenize: the text back");
    const render = async (m) => curl(s, "/detokenize", { tokens: curl(s, "/tokenize", { messages: m }, key).json.tokens }, key).json.prompt;
    eq(await render([{ role: "user", content: "hi" }]), '[user] {"role": "user", "content": "hi"}\n>',
       "--chat-template FILE renders the messages (with the generation prompt)");
    eq(await render([{ content: "hi", role: "user" }]), '[user] {"content": "hi", "role": "user"}\n>',
       "the template's tojson keeps the request's key order (another order, another prompt)");
    r = curl(s, "/v1/chat/completions", { messages: [{ role: "user", content: "hi" }], max_tokens: 2, temperature: 0,
                                          add_generation_prompt: false }, key);
    eq([r.status, r.json?.choices?.[0]?.message?.role], [200, "user"], "add_generation_prompt false: the reply's role is the last message's");
    // Ids and fingerprint.
    const a = curl(s, "/v1/completions", body, key).json, b = curl(s, "/v1/completions", body, key).json;
    check(/^cmpl-[0-9a-f]{32}$/.test(a.id) && a.id !== b.id, "response ids: 32 hex digits, one per response", [a.id, b.id]);
    check(/^fp_[0-9a-f]{10}$/.test(a.system_fingerprint) && a.system_fingerprint === b.system_fingerprint, "system_fingerprint", a.system_fingerprint);
    // vLLM's metric names with model_name.
    const m = await (await fetch(s.base + "/metrics", { signal: AbortSignal.timeout(10000) })).text();
    for (const want of ['vllm:num_requests_running{model_name="one"} 0', 'vllm:num_requests_waiting{model_name="one"} 0',
                        'vllm:kv_cache_usage_perc{model_name="one"} 0', '# TYPE vllm:time_to_first_token_seconds histogram',
                        'vllm:inter_token_latency_seconds_bucket{model_name="one",le="+Inf"}', 'vllm:e2e_request_latency_seconds_count{model_name="one"} ',
                        'vllm:prompt_tokens_total{model_name="one"} ', 'vllm:generation_tokens_total{model_name="one"} ',
                        'vllm:num_preemptions_total{model_name="one"} 0']) {
      check(m.includes(want), `metrics: ${want}`);
    }
    const prompts = Number(/vllm:prompt_tokens_total\{model_name="one"\} (\d+)/.exec(m)?.[1]);
    check(prompts > 0, "vllm:prompt_tokens_total counts the prompts", prompts);
    await stopServer(s);
    // A restarted server does not repeat the ids.
    const s2 = await startServer(flags);
    const c = curl(s2, "/v1/completions", body, key).json;
    check(c.id !== a.id && c.id !== b.id, "a new process: other response ids", [a.id, c.id]);
    await stopServer(s2);
  },

  // A model with per-sequence state (--state-of dsv4|qwen35: what its slots hold, as the DeviceOperator names it): the
  // start-up's KV pool line names the pages, one state slot per --max-batch sequence and `genbridge run`'s KV
  // representation; /metrics counts the slots beside the pages: one in use while a request runs, none after it.
  async kv_state_lines() {
    const ranks = Number(/--afd (\d+)A/.exec(SERVE_ARGS.join(" "))?.[1] ?? 1);
    const runOut = execFileSync(G, ["run", "--model", MODEL, "--prompt", "1,2,3", "--max-new-tokens", "2"],
                                { encoding: "utf8", timeout: 120000, stdio: ["ignore", "pipe", "ignore"] });
    const repr = /^KV representation +(.*)$/m.exec(runOut)?.[1];
    check(repr !== undefined, "genbridge run prints its KV representation", runOut);
    const s = await startServer(["--max-batch", "4"], MODEL, /*quiet=*/false);
    const m0 = await metrics(s);
    const line = s.log().split("\n").find((l) => l.startsWith("KV pool"));
    const head = `KV pool${SERVE_ARGS.includes("--afd") ? " per attention rank" : ""}: ${m0.genbridge_kv_pages_total / ranks} ` +
                 "pages of 128 tokens (";
    check(line !== undefined && line.startsWith(head) && line.includes(") + 4 state slots, one per running sequence (") &&
          line.endsWith(`; KV representation: ${repr}`),
          "start-up: the KV pool line names the pages, the state slots and genbridge run's KV representation", line);
    eq([m0.genbridge_kv_state_slots_total, m0.genbridge_kv_state_slots_used, m0.genbridge_kv_state_bytes_used],
       [4 * ranks, 0, 0], "metrics: --max-batch state slots per attention rank, none in use");
    const contents = { dsv4: "sliding-window rings and compressor state", qwen35: "linear-attention state" }[args["state-of"]];
    const help = `# HELP genbridge_kv_state_slots_used Per-sequence state slots in use (${contents}; one per ` +
                 "running sequence).";
    const text = await (await fetch(s.base + "/metrics", { signal: AbortSignal.timeout(10000) })).text();
    check(text.split("\n").includes(help), `metrics: ${help}`, text.split("\n").filter((l) => l.includes("state")));
    const res = await fetch(s.base + "/v1/completions", {
      method: "POST", headers: { "content-type": "application/json" }, signal: AbortSignal.timeout(60000),
      body: JSON.stringify({ model: NAME, prompt: [5, 6, 7], max_tokens: 3000, temperature: 0, stream: true, ignore_eos: true }) });
    const reader = res.body.getReader();
    await reader.read();
    await waitMetrics(s, (m) => m.genbridge_running_requests === 1 && m.genbridge_kv_state_slots_used === 1 &&
                                 m.genbridge_kv_state_bytes_used > 0 && m.genbridge_kv_pages_used >= 1,
                      "metrics: one state slot (and its pages) in use while one request runs");
    await reader.cancel();
    await waitMetrics(s, (m) => m.genbridge_running_requests === 0 && m.genbridge_kv_state_slots_used === 0 &&
                                 m.genbridge_kv_state_bytes_used === 0 && m.genbridge_kv_pages_used === 0,
                      "metrics: the client left; its state slot is free again with its pages");
    await stopServer(s);
  },

  // --afd: an idle server outlives --afd-timeout (its attention ranks send keep-alive steps): requests before
  // and after a pause of --idle-ms get genbridge run's tokens; /metrics shows the AFD counters.
  async afd_idle() {
    const idleMs = Number(args["idle-ms"] ?? 3000);
    const prompts = [[5, 6, 7, 8], [9, 10, 11]];
    const want = runCli(prompts, 8);
    const s = await startServer(["--max-batch", "4"]);
    const req = { model: NAME, prompt: prompts[0], max_tokens: 8, temperature: 0, return_token_ids: true, ignore_eos: true };
    let r = curl(s, "/v1/completions", req);
    eq([r.status, r.json?.choices?.[0]?.token_ids], [200, want[0].ids], "before the pause: genbridge run's tokens");
    const before = await metrics(s);
    await sleep(idleMs);
    eq(curl(s, "/health").status, 200, `healthy after ${idleMs} ms idle`);
    r = curl(s, "/v1/completions", { ...req, prompt: prompts[1], stream: true });
    const sse = parseSse(r.text);
    const j = joinChunks(sse.chunks, false);
    eq([r.status, sse.wellFormed, sse.done, j.ids, j.finish], [200, true, true, want[1].ids, "length"],
       "after the pause, streamed: genbridge run's tokens");
    r = curl(s, "/v1/completions", req);
    eq([r.status, r.json?.choices?.[0]?.token_ids], [200, want[0].ids], "after the pause: the same tokens again");
    const m = await metrics(s);
    const empty = 'genbridge_afd_steps_total{kind="empty"}';
    check(m[empty] > before[empty], "keep-alive: empty steps while idle", [before[empty], m[empty]]);
    check(m['genbridge_afd_steps_total{kind="prefill"}'] >= 3 && m['genbridge_afd_steps_total{kind="decode"}'] >= 3 * 7 &&
          m['genbridge_afd_transfer_bytes_total{direction="ffn_to_attention"}'] > 0 && m['genbridge_afd_ranks{role="ffn"}'] >= 1,
          "metrics: AFD prefill and decode steps, transfer bytes, ranks", m);
    // The expert load where the FFN ranks run in this process: one series per expert of the tiny model (8),
    // rows = tokens x top-2 x 3 MoE layers.
    if ("genbridge_afd_ffn_work_items_total" in m) {
      const experts = Object.keys(m).filter((k) => k.startsWith("genbridge_afd_expert_rows_total{"));
      const rows = experts.reduce((a, k) => a + m[k], 0);
      check(experts.length === 8 && rows > 0 && rows % 6 === 0, "metrics: rows per expert, a multiple of top_k x MoE layers",
            [experts.length, rows]);
    }
    await stopServer(s);
  },

  // Under mpirun: a killed rank (SIGKILL; --kill-rank, default the first FFN rank) ends the server. One stream
  // per attention rank up to the killed one is in flight (a request goes to the attention rank with the fewest
  // unfinished requests), so a killed relayed attention rank holds one. Each stream ends with an error event
  // naming the killed rank once --afd-timeout passes (or its connection closes, when mpirun kills world rank 0
  // first: it sends SIGTERM, then SIGKILL odls_base_sigkill_timeout seconds later; --want-error-event requires
  // the events), and mpirun exits non-zero, within --exit-within-ms (default 60 s). --error-names: what the
  // error events must name instead (a regex; e.g. for a killed attention rank, whichever rank attention rank 0
  // waited for when it gave up: the dead rank in the step agreement, or an FFN rank that waits for the dead
  // rank's transfer).
  async afd_killed_rank() {
    const rank = Number(args["kill-rank"] ?? MPI_A);
    const name = rank < MPI_A ? `attention rank ${rank} (world rank ${rank})` : `ffn rank ${rank - MPI_A} (world rank ${rank})`;
    const nameRe = name.replace(/[()]/g, "\\$&");
    const errorRe = args["error-names"] ?? nameRe;
    const s = await startServer([]);
    const streams = [];
    for (let i = 0; i < Math.min(rank, MPI_A - 1) + 1; ++i) {
      const res = await fetch(s.base + "/v1/completions", {
        method: "POST", headers: { "content-type": "application/json" }, signal: AbortSignal.timeout(90000),
        body: JSON.stringify({ model: NAME, prompt: [1, 2, 3 + i], max_tokens: 4000, temperature: 0, stream: true, ignore_eos: true }) });
      const reader = res.body.getReader();
      streams.push({ reader, text: new TextDecoder().decode((await reader.read()).value), closed: false });
    }
    const pid = mpiRankPid(s, rank);
    check(pid !== null, `found world rank ${rank} (${name})`);
    const t0 = Date.now();
    if (pid !== null) process.kill(pid, "SIGKILL");
    await Promise.all(streams.map(async (st) => {
      try {
        for (let i = 0; i < 100000; ++i) {
          const { value, done } = await st.reader.read();
          if (done) break;
          st.text += new TextDecoder().decode(value);
        }
      } catch { st.closed = true; }
    }));
    streams.forEach((st, i) => {
      const sse = parseSse(st.text);
      const last = sse.chunks[sse.chunks.length - 1];
      const errorEvent = last?.error?.code === "generation_error" && new RegExp(errorRe).test(last?.error?.message ?? "");
      if (args["want-error-event"]) {
        check(errorEvent && sse.done, `stream ${i} ends with an error event naming /${errorRe}/, then [DONE]`, st.text.slice(-600));
      } else {
        check(errorEvent || st.closed || !sse.done, `stream ${i} ends with an error event naming /${errorRe}/, or is cut off`,
              st.text.slice(-600));
      }
      console.log(errorEvent ? `stream ${i}: error event: ${last.error.message}` : `stream ${i}: the connection was closed`);
      check(joinChunks(sse.chunks, false).finish !== "length", `stream ${i} did not complete`);
    });
    const e = await Promise.race([s.exited, sleep(60000).then(() => ({ code: "timeout" }))]);
    check(e.code !== 0 && e.code !== "timeout", "mpirun exits non-zero", e);
    const took = Date.now() - t0, bound = Number(args["exit-within-ms"] ?? 60000);
    console.log(`mpirun exited (${JSON.stringify(e)}) ${took} ms after the kill`);
    check(took <= bound, `mpirun exited within ${bound} ms of the kill (--exit-within-ms)`, took);
    check(new RegExp(`rank ${rank}[^\\n]*(signal 9|Killed)|${nameRe}`).test(s.log()), "the log names the killed rank", s.log());
  },

  // Under mpirun, the FFN rank started --ffn-delay-ms late (so the job cannot be up before) with --ffn-args
  // more flags (and --ffn-model instead of --model): /health is polled every 50 ms from the start. With
  // --want-error (the job's ranks disagree) mpirun exits non-zero, the log has the error, and no poll ever
  // got an answer (world rank 0 listens only once the job is up); without it the first answer is 200 and
  // comes after the FFN rank started.
  async afd_mpi_health_during_start() {
    const delayMs = Number(args["ffn-delay-ms"] ?? 3000);
    const ffnArgs = (args["ffn-args"] ?? "").split(" ").filter((a) => a.length > 0);
    const wantError = args["want-error"];
    const net = await import("node:net");
    // A fixed --port (the test polls it before world rank 0 could write a port file), free when chosen and
    // below the ephemeral range, so that no client connection of a test running beside this one holds it;
    // should it still be taken when world rank 0 binds, the attempt is repeated on another port.
    const freePort = async () => {
      for (;;) {
        const p = 20000 + Math.floor(Math.random() * 12000);
        const free = await new Promise((resolve) => {
          const srv = net.createServer();
          srv.once("error", () => resolve(false));
          srv.listen(p, "127.0.0.1", () => srv.close(() => resolve(true)));
        });
        if (free) return p;
      }
    };
    const portFile = path.join(WORK, `port.${process.pid}.health`);
    let port, proc, log, s, t0, answers, polls;
    for (let attempt = 0; attempt < 3; ++attempt) {
      port = await freePort();
      fs.rmSync(portFile, { force: true });
      const flags = ["serve", "--model", MODEL, "--port", String(port), "--port-file", portFile, ...SERVE_ARGS];
      const ffnFlags = args["ffn-model"] ? flags.map((f) => (f === MODEL ? args["ffn-model"] : f)) : flags;
      const ffn = [G, ...ffnFlags, "--role", "ffn", ...ffnArgs].map((a) => `'${a}'`).join(" ");
      proc = spawn(MPIRUN, ["--bind-to", "none", "-np", "1", G, ...flags, "--role", "attention", ":", "-np", "1",
                            "sh", "-c", `sleep ${delayMs / 1000}; exec ${ffn}`], { stdio: ["ignore", "pipe", "pipe"] });
      log = "";
      proc.stdout.on("data", (d) => (log += d));
      proc.stderr.on("data", (d) => (log += d));
      s = { proc, exited: new Promise((r) => proc.on("exit", (code, sig) => r({ code, sig }))), log: () => log, portFile };
      servers.push(s);
      t0 = Date.now();
      answers = [];
      polls = 0;
      while (proc.exitCode === null && Date.now() - t0 < 60000) {
        const before = Date.now();
        ++polls;
        // A bare socket with its own 300 ms bound: refused (not bound yet), no answer, or the status line.
        const status = await new Promise((resolve) => {
          const sock = net.connect(port, "127.0.0.1");
          let got = "";
          const done = (v) => { clearTimeout(timer); sock.destroy(); resolve(v); };
          const timer = setTimeout(() => done(got ? Number(got.split(" ")[1]) : null), 300);
          sock.on("connect", () => sock.write("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"));
          sock.on("data", (d) => { got += d; if (got.includes("\r\n")) done(Number(got.split(" ")[1])); });
          sock.on("error", () => done(null));
          sock.on("close", () => done(got ? Number(got.split(" ")[1]) : null));
        });
        if (status !== null) answers.push({ status, ms: Date.now() - t0 });
        if (!wantError && status === 200) break;
        await sleep(Math.max(0, 50 - (Date.now() - before)));
      }
      if (!/cannot listen on .*the address is in use/.test(log)) break;
      await s.exited;
      console.log(`port ${port} was taken when world rank 0 bound it; again on another port`);
    }
    console.log(`${polls} polls of /health over ${Date.now() - t0} ms; answers: ${JSON.stringify(answers.slice(0, 5))}`);
    check(polls >= delayMs / 400, `/health polled throughout the start-up (${polls} polls)`);
    if (wantError) {
      const e = await Promise.race([s.exited, sleep(60000).then(() => ({ code: "timeout" }))]);
      check(e.code !== 0 && e.code !== "timeout", "mpirun exits non-zero", e);
      check(new RegExp(wantError).test(log), `the log: ${wantError}`, log);
      eq(answers, [], "no /health answer at all (none 200) before the job was refused");
      check(!/listening on/.test(log), "world rank 0 never said it was listening", log);
    } else {
      eq(answers.map((a) => [a.status, a.ms >= delayMs]), [[200, true]],
         `the first /health answer is 200 and comes once the job is up (after the FFN rank started ${delayMs} ms late)`);
      check(/waiting for the AFD job to start before listening/.test(log), "the log says it waits for the job", log);
      s.base = `http://127.0.0.1:${port}`;
      await stopServer(s);
    }
  },

  // In-process --afd: the whole process paused (SIGSTOP) for --pause-ms, longer than --afd-timeout, while a
  // greedy stream decodes, then resumed (SIGCONT): a pause is not a dead rank (afd/progress_clock.h), so the
  // stream completes with genbridge run's tokens and the server goes on serving. The stream must not have
  // ended by the time the pause ends (so the pause fell inside the decode).
  async afd_paused_process() {
    const pauseMs = Number(args["pause-ms"] ?? 2500);
    const N = Number(args["max-tokens"] ?? 1500);
    const prompt = [3, 1, 4, 1, 5, 9, 2, 6];
    const want = runCli([prompt], N)[0];
    const s = await startServer(["--max-batch", "4"]);
    const res = await fetch(s.base + "/v1/completions", {
      method: "POST", headers: { "content-type": "application/json" }, signal: AbortSignal.timeout(120000),
      body: JSON.stringify({ model: NAME, prompt, max_tokens: N, temperature: 0, stream: true, return_token_ids: true,
                            ignore_eos: true }) });
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let text = "", ended = false;
    const reading = (async () => {
      for (let i = 0; i < 1000000; ++i) {
        const { value, done } = await reader.read();
        if (done) break;
        text += dec.decode(value);
      }
      ended = true;
    })();
    while (!text.includes('"token_ids":[') && !ended) await sleep(1);
    s.proc.kill("SIGSTOP");
    await sleep(pauseMs);
    const tokensAtResume = joinChunks(parseSse(text.slice(0, text.lastIndexOf("\n\n") + 2)).chunks, false).ids.length;
    const endedAtResume = ended || text.includes("data: [DONE]");
    s.proc.kill("SIGCONT");
    check(!endedAtResume && tokensAtResume < N, `the pause of ${pauseMs} ms fell inside the decode ` +
          `(${tokensAtResume} of ${N} tokens had arrived when it ended)`);
    await Promise.race([reading, sleep(110000)]);
    const sse = parseSse(text);
    const j = joinChunks(sse.chunks, false);
    eq([res.status, sse.wellFormed, sse.done, j.finish, j.ids.length], [200, true, true, "length", N],
       "after the pause the stream completes");
    eq(j.ids, want.ids, "the tokens of genbridge run (as without the pause)");
    if (!sse.done) console.log(text.slice(-600));
    eq(curl(s, "/health").status, 200, "healthy after the pause");
    const r = curl(s, "/v1/completions", { model: NAME, prompt, max_tokens: 8, temperature: 0, return_token_ids: true,
                                           ignore_eos: true });
    eq([r.status, r.json?.choices?.[0]?.token_ids], [200, want.ids.slice(0, 8)], "and serves the next request");
    check(!/timed out/.test(s.log()), "no rank timed out", s.log());
    await stopServer(s);
  },

  // Load: C concurrent streaming clients x R requests, greedy; every response complete and well-formed,
  // tokens identical to genbridge run's and to the same prompt served alone; KV usage back to zero.
  // --prompt-len L: every prompt L tokens (default 4-16); the server's other flags come from --serve-args (e.g.
  // "--max-num-batched-tokens 64"). --min-preemptions N: /metrics must count at least N preemptions (under both
  // names), e.g. with "--preemption recompute" and a small --kv-memory-mb. --request-timeout-s S: each request's
  // bound (default 90).
  async load() {
    const C = Number(args.clients ?? 64), R = Number(args.rounds ?? 3), N = Number(args["max-tokens"] ?? 16);
    const L = args["prompt-len"] === undefined ? 0 : Number(args["prompt-len"]);
    const s = await startServer(["--max-batch", String(C), "--max-queued-requests", String(C)]);
    const prompts = [];
    for (let i = 0; i < C * R; ++i) prompts.push(Array.from({ length: L || 4 + (i % 13) }, (_, k) => (i * 31 + k * 7 + 1) % 500));
    const want = runCli(prompts, N);
    const one = async (p) => {
      const t0 = performance.now();
      const res = await fetch(s.base + "/v1/completions", {
        method: "POST", headers: { "content-type": "application/json" },
        signal: AbortSignal.timeout(1000 * Number(args["request-timeout-s"] ?? 90)),
        body: JSON.stringify({ model: NAME, prompt: p, max_tokens: N, temperature: 0, stream: true, return_token_ids: true,
                              ignore_eos: true, stream_options: { include_usage: true } }) });
      const reader = res.body.getReader();
      let text = "", first = 0;
      const dec = new TextDecoder();
      for (let i = 0; i < 100000; ++i) {
        const { value, done } = await reader.read();
        if (done) break;
        if (!first && dec.decode(value, { stream: false }).includes('"token_ids":[')) first = performance.now();
        text += dec.decode(value);
      }
      const end = performance.now();
      return { status: res.status, sse: parseSse(text), ttft: (first - t0) / 1000, tpot: (end - first) / 1000 / Math.max(N - 1, 1), t0, end };
    };
    const alone = await one(prompts[0]);
    const t0 = performance.now();
    const results = new Array(C * R);
    await Promise.all(Array.from({ length: C }, async (_, c) => {
      for (let r = 0; r < R; ++r) results[r * C + c] = await one(prompts[r * C + c]);
    }));
    const wall = (performance.now() - t0) / 1000;
    let bad = 0, mismatched = 0;
    for (let i = 0; i < results.length; ++i) {
      const x = results[i];
      const j = joinChunks(x.sse.chunks, false);
      const ok = x.status === 200 && x.sse.wellFormed && x.sse.done && j.finish === "length" && j.usage?.completion_tokens === N &&
                 new Set(x.sse.chunks.map((ch) => ch.id)).size === 1;
      if (!ok) { if (bad++ < 3) console.log("malformed:", i, JSON.stringify(x.sse).slice(0, 400)); }
      if (JSON.stringify(j.ids) !== JSON.stringify(want[i].ids)) { if (mismatched++ < 3) console.log("mismatch:", i, j.ids, want[i].ids); }
    }
    eq(bad, 0, `${results.length} responses complete and well-formed`);
    eq(mismatched, 0, `${results.length} token sequences identical to genbridge run's`);
    eq(joinChunks(alone.sse.chunks, false).ids, joinChunks(results[0].sse.chunks, false).ids,
       `prompt 0 alone and among ${C - 1} others: identical tokens`);
    await waitMetrics(s, (m) => m.genbridge_kv_pages_used === 0 && m.genbridge_running_requests === 0 && m.genbridge_queue_depth === 0 &&
                                m['genbridge_requests_finished_total{reason="length"}'] === C * R + 1, "KV usage back to zero, every request finished");
    // Server-side quantiles from the /metrics histograms (the upper bound of the bucket holding the quantile).
    const mq = await metrics(s);
    const preempted = mq.genbridge_preemptions_total;
    eq(mq[`vllm:num_preemptions_total{model_name="${NAME}"}`], preempted, "vllm:num_preemptions_total counts what genbridge_preemptions_total does");
    if (args["min-preemptions"] !== undefined) {
      check(preempted >= Number(args["min-preemptions"]), `at least ${args["min-preemptions"]} preemptions`, preempted);
    }
    const hq = (name, q) => {
      const buckets = Object.entries(mq).filter(([k]) => k.startsWith(name + "_bucket"))
        .map(([k, v]) => [k.includes('"+Inf"') ? Infinity : Number(/le="([^"]+)"/.exec(k)[1]), v]).sort((x, y) => x[0] - y[0]);
      const total = buckets[buckets.length - 1][1];
      return buckets.find(([, v]) => v >= q * total)[0] * 1000;
    };
    console.log(`server side (bucket bounds): TTFT p50 <= ${hq("genbridge_time_to_first_token_seconds", 0.5)} ms ` +
                `p99 <= ${hq("genbridge_time_to_first_token_seconds", 0.99)} ms; TPOT p50 <= ` +
                `${hq("genbridge_time_per_output_token_seconds", 0.5)} ms p99 <= ${hq("genbridge_time_per_output_token_seconds", 0.99)} ms`);
    const pct = (a, p) => { const v = [...a].sort((x, y) => x - y); return v[Math.min(v.length - 1, Math.ceil((p / 100) * v.length) - 1)]; };
    const ttft = results.map((x) => x.ttft), tpot = results.map((x) => x.tpot);
    console.log(`load: ${C} clients x ${R} requests x ${N} tokens: ${results.length} requests in ${wall.toFixed(2)} s = ` +
                `${(results.length / wall).toFixed(1)} requests/s, ${(results.length * N / wall).toFixed(0)} tokens/s; ` +
                `TTFT p50 ${(pct(ttft, 50) * 1000).toFixed(1)} ms p99 ${(pct(ttft, 99) * 1000).toFixed(1)} ms; ` +
                `TPOT p50 ${(pct(tpot, 50) * 1000).toFixed(2)} ms p99 ${(pct(tpot, 99) * 1000).toFixed(2)} ms (client side); ` +
                `${preempted} preemptions`);
    await stopServer(s);
  },
  // Multi-turn chats: C clients (--clients, default 4) each hold a conversation of T turns (--turns, default 8);
  // every turn sends the whole history (the previous prompt and its reply) plus U new tokens (--user-tokens, default
  // 160) and streams N tokens (--max-tokens, default 32), greedy. Prints each turn's TTFT (median over the clients),
  // the wall time and the prefix cache's counters; the last turn's tokens must equal `genbridge run`'s on the same
  // prompts. --min-hit-rate F: /metrics must count at least that fraction of the prompt tokens as cache hits.
  async multiturn() {
    const C = Number(args.clients ?? 4), T = Number(args.turns ?? 8), U = Number(args["user-tokens"] ?? 160);
    const N = Number(args["max-tokens"] ?? 32);
    const s = await startServer(["--max-batch", String(C), "--max-queued-requests", String(C)]);
    const ttft = Array.from({ length: T }, () => []);
    const last = [];
    const t0 = performance.now();
    await Promise.all(Array.from({ length: C }, async (_, c) => {
      let history = [];
      for (let t = 0; t < T; ++t) {
        const prompt = [...history, ...Array.from({ length: U }, (_, k) => (c * 997 + t * 131 + k * 7 + 3) % 500)];
        const start = performance.now();
        const res = await fetch(s.base + "/v1/completions", {
          method: "POST", headers: { "content-type": "application/json" }, signal: AbortSignal.timeout(300000),
          body: JSON.stringify({ model: NAME, prompt, max_tokens: N, temperature: 0, stream: true, return_token_ids: true,
                                ignore_eos: true }) });
        const reader = res.body.getReader(), dec = new TextDecoder();
        let text = "", first = 0;
        for (let i = 0; i < 100000; ++i) {
          const { value, done } = await reader.read();
          if (done) break;
          const chunk = dec.decode(value, { stream: true });
          if (!first && chunk.includes('"token_ids":[')) first = performance.now();
          text += chunk;
        }
        const sse = parseSse(text), j = joinChunks(sse.chunks, false);
        check(res.status === 200 && sse.done && j.ids.length === N, `client ${c} turn ${t}: ${N} tokens`, text.slice(0, 300));
        ttft[t].push(first - start);
        if (t === T - 1) last[c] = { prompt, ids: j.ids };
        history = [...prompt, ...j.ids];
      }
    }));
    const wall = (performance.now() - t0) / 1000;
    const m = await metrics(s);  // before the reference run: an idle keep-alive connection may be closed meanwhile
    const want = runCli(last.map((x) => x.prompt), N);
    for (let c = 0; c < C; ++c) eq(last[c].ids, want[c].ids, `client ${c}: the last turn's tokens are genbridge run's`);
    const q = m.genbridge_prefix_cache_queries_total, h = m.genbridge_prefix_cache_hits_total;
    eq([m[`vllm:prefix_cache_queries_total{model_name="${NAME}"}`], m[`vllm:prefix_cache_hits_total{model_name="${NAME}"}`]], [q, h],
       "vLLM's prefix cache counters count what genbridge's do");
    if (args["min-hit-rate"] !== undefined) check(h >= Number(args["min-hit-rate"]) * q, `prefix cache hits >= ${args["min-hit-rate"]} of the queried tokens`, [h, q]);
    const med = (a) => { const v = [...a].sort((x, y) => x - y); return v[Math.floor((v.length - 1) / 2)]; };
    console.log(`multiturn: ${C} clients x ${T} turns (+${U} tokens a turn, ${N} new): ${wall.toFixed(2)} s, ` +
                `${(C * T * N / wall).toFixed(1)} tokens/s; TTFT p50 per turn (ms): ${ttft.map((a) => med(a).toFixed(0)).join(" ")}; ` +
                `prompt of the last turn ${last[0].prompt.length} tokens; prefix cache hits ${h} of ${q} tokens, ` +
                `${m.genbridge_prefix_cache_evictions_total} pages evicted, ${m.genbridge_prefix_cache_pages} cached`);
    await stopServer(s);
  },
  // JSON nested ~60,000 levels deep (the whole body, the prompt, a message field, tools, chat_template_kwargs)
  // is refused with 400 naming the limit before it is parsed (it used to overflow the stack: SIGSEGV); 128
  // levels pass, 129 do not, and brackets inside strings are not nesting.
  async json_nesting() {
    const s = await startServer();
    const D = nested(60000);
    const msgs = (extra) => `"messages":[{"role":"user","content":"hi"${extra}}]`;
    // [route, body, the levels open before the deep value, the bytes one level takes, what]
    const bodies = [
      ["/v1/completions", D, 0, 1, "the whole body"],
      ["/v1/completions", `{"model":"${NAME}","prompt":${D},"max_tokens":1}`, 1, 1, "prompt"],
      ["/v1/chat/completions", `{"model":"${NAME}",${msgs(`,"extra":${D}`)},"max_tokens":1}`, 3, 1, "a message field"],
      ["/v1/chat/completions", `{"model":"${NAME}",${msgs("")},"tools":${D},"max_tokens":1}`, 1, 1, "tools"],
      ["/v1/chat/completions", `{"model":"${NAME}",${msgs("")},"chat_template_kwargs":{"x":${D}},"max_tokens":1}`, 2, 1,
       "chat_template_kwargs"],
      ["/v1/chat/completions", `{"model":"${NAME}",${msgs("")},"chat_template_kwargs":{"x":${'{"a":'.repeat(30000)}1${"}".repeat(30000)}},"max_tokens":1}`,
       2, 5, "nested objects in chat_template_kwargs"],
    ];
    for (const [route, body, outer, step, what] of bodies) {
      const r = await post(s, route, body);
      const start = what.startsWith("nested objects") ? body.indexOf('{"a":') : body.indexOf("[[[");
      eq([r.status, r.json?.error?.message, r.json?.error?.type],
         [400, depthMessage(start + (128 - outer) * step), "invalid_request_error"], `${what} nested ~60,000 levels: 400 naming the limit`);
    }
    const ok = { model: NAME, prompt: [1, 2, 3], max_tokens: 1, temperature: 0 };
    // A chat template keyword takes any JSON value: the body, chat_template_kwargs and n arrays.
    const chat = { model: NAME, messages: [{ role: "user", content: "hi" }], max_tokens: 1, temperature: 0 };
    const at = (n) => JSON.stringify(chat).slice(0, -1) + `,"chat_template_kwargs":{"x":${nested(n)}}}`;
    let r = await post(s, "/v1/chat/completions", at(126));
    eq(r.status, 200, "128 levels (an object holding an object holding 126 nested arrays): accepted");
    r = await post(s, "/v1/chat/completions", at(127));
    eq([r.status, r.json?.error?.message], [400, depthMessage(at(127).indexOf('"x":') + 4 + 126)], "129 levels: refused");
    r = await post(s, "/v1/completions", { ...ok, prompt: "[".repeat(300) + "\\\"{", user: "{".repeat(300) });
    eq([r.status, r.json?.error?.message], [200, undefined], "300 brackets inside strings (an escaped quote among them) are not nesting");
    eq((await post(s, "/v1/completions", ok)).status, 200, "the server still answers");
    await stopServer(s);
  },

  // One body limit however the body is framed (--max-body-mb 1 here), enforced while the body is read: a
  // chunked body is refused (413) once it passes the limit, before its last chunk is sent; Content-Length
  // over the limit is refused before the body is sent (also after "Expect: 100-continue"); framing this
  // server does not take is refused; a body for a route that reads none is never read.
  async body_limit_framing() {
    const s = await startServer(["--max-body-mb", "1"]);
    const MiB = 1 << 20;
    const prompt = (n) => JSON.stringify({ model: NAME, prompt: "a".repeat(n), max_tokens: 1 });
    const closed = (x) => x.why === "closed";
    // Chunked, 1.25 MiB in 64 KiB chunks and never terminated: refused while it is read.
    let x = await rawExchange(s, async (sock) => {
      await sockWrite(sock, chunkedHead("/v1/completions"));
      const body = prompt(MiB + (MiB >> 2));
      for (let i = 0; i < body.length; i += 65536) await sockWrite(sock, chunk(body.slice(i, i + 65536)));
    }, { ms: 10000 });
    let rs = parseResponses(x.text);
    eq([rs.length, rs[0]?.status, rs[0]?.json?.error?.message, rs[0]?.headers.connection, closed(x)],
       [1, 413, "The request body exceeds 1 MiB, this server's limit (--max-body-mb); it was refused while being read.",
        "close", true], "chunked 1.25 MiB, never terminated: 413 while it is read, then the connection closes");
    // Content-Length over the limit: refused on the headers alone.
    x = await rawExchange(s, (sock) => sockWrite(sock, `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${2 * MiB}\r\n\r\n`), { ms: 10000 });
    rs = parseResponses(x.text);
    eq([rs.length, rs[0]?.status, rs[0]?.json?.error?.message, closed(x)],
       [1, 413, `The request body is ${2 * MiB} bytes; this server takes at most 1 MiB (--max-body-mb).`, true],
       "Content-Length 2 MiB, body not sent: 413 at once");
    x = await rawExchange(s, (sock) => sockWrite(sock, `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${2 * MiB}\r\nExpect: 100-continue\r\n\r\n`), { ms: 10000 });
    rs = parseResponses(x.text);
    eq([rs.map((r) => r.status), closed(x)], [[413], true], "Expect: 100-continue with Content-Length 2 MiB: 413, no 100 Continue");
    // Tiny chunks: the framing (6 bytes per byte of data) is bounded too.
    x = await rawExchange(s, async (sock) => {
      await sockWrite(sock, chunkedHead("/v1/completions") + "1\r\na\r\n".repeat(450000));
    }, { ms: 10000 });
    rs = parseResponses(x.text);
    eq([rs[0]?.status, rs[0]?.json?.error?.message, closed(x)],
       [413, "The request's chunked framing exceeds 2112 KiB in all (the body's limit, --max-body-mb, plus as much framing); send larger chunks.".replace("2112 KiB", `${2 * MiB + 65536} bytes`), true],
       "450,000 one-byte chunks: 413 naming the framing");
    // A chunked body within the limit is read whole and served.
    x = await rawExchange(s, async (sock) => {
      const body = JSON.stringify({ model: NAME, prompt: [1, 2, 3], max_tokens: 2, temperature: 0 });
      await sockWrite(sock, chunkedHead("/v1/completions", "Connection: close\r\n") + chunk(body.slice(0, 10)) + chunk(body.slice(10)) + "0\r\n\r\n");
    });
    rs = parseResponses(x.text);
    eq([rs[0]?.status, rs[0]?.json?.usage?.completion_tokens], [200, 2], "a chunked body within the limit: served");
    // gzip Content-Encoding: the limit applies to the decoded bytes (2 MiB of prompt in a 2 KiB body).
    const gz = (obj) => zlib.gzipSync(Buffer.from(JSON.stringify(obj)));
    const gzPost = (b) => Buffer.concat([Buffer.from(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: ${b.length}\r\n\r\n`), b]);
    x = await rawExchange(s, (sock) => sockWrite(sock, gzPost(gz({ model: NAME, prompt: "a".repeat(2 * MiB) }))), { ms: 10000 });
    rs = parseResponses(x.text);
    eq([rs[0]?.status, rs[0]?.json?.error?.message, closed(x)],
       [413, "The request body exceeds 1 MiB, this server's limit (--max-body-mb); it was refused while being read.", true],
       "a gzip body that decodes to 2 MiB: 413");
    x = await rawExchange(s, (sock) => sockWrite(sock, gzPost(gz({ model: NAME, prompt: [1, 2, 3], max_tokens: 2 }))), { ms: 10000 });
    eq(parseResponses(x.text)[0]?.json?.usage?.completion_tokens, 2, "a small gzip body: served");
    // Framing this server does not take.
    const refusals = [
      [`POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n`, 501,
       "Transfer-Encoding 'gzip' is not supported; this server reads 'chunked' bodies only."],
      [`POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n`, 400,
       "The request has both Content-Length and Transfer-Encoding; send one of them."],
      [`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n`, 400, "Content-Length '12abc' is not a byte count."],
      [`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\n{}{}`, 400,
       "The request repeats Content-Length or Transfer-Encoding."],
    ];
    for (const [req, status, message] of refusals) {
      x = await rawExchange(s, (sock) => sockWrite(sock, req), { ms: 10000 });
      rs = parseResponses(x.text);
      eq([rs.length, rs[0]?.status, rs[0]?.json?.error?.message, closed(x)], [1, status, message, true], `${JSON.stringify(req.split("\r\n")[2])}: ${status}`);
    }
    // A chunked body to an unknown route is never read: 404, and the connection closes.
    x = await rawExchange(s, (sock) => sockWrite(sock, chunkedHead("/v1/nothing") + chunk("x".repeat(1000))), { ms: 10000 });
    rs = parseResponses(x.text);
    eq([rs.length, rs[0]?.status, rs[0]?.json?.error?.message, closed(x)], [1, 404, "No route POST /v1/nothing.", true],
       "a body for an unknown route: 404 without reading it, the connection closed");
    // Heads: 100 KiB of headers, or a 100 KiB request line: 431.
    x = await rawExchange(s, (sock) => sockWrite(sock, `GET /health HTTP/1.1\r\nHost: x\r\n${"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(3000)}\r\n`), { ms: 10000 });
    rs = parseResponses(x.text);
    eq([rs[0]?.status, rs[0]?.json?.error?.message, closed(x)],
       [431, "The request's head (request line and headers) exceeds 65536 bytes, this server's limit.", true], "100 KiB of headers: 431");
    x = await rawExchange(s, (sock) => sockWrite(sock, `GET /${"a".repeat(100000)} HTTP/1.1\r\n\r\n`), { ms: 10000 });
    rs = parseResponses(x.text);
    eq([rs[0]?.status, rs[0]?.json?.error?.message, closed(x)],
       [431, "The request line exceeds 65536 bytes, this server's limit for a request's head.", true], "a 100 KiB request line: 431");
    x = await rawExchange(s, (sock) => sockWrite(sock, `GET /${"a".repeat(9000)} HTTP/1.1\r\n\r\n`), { ms: 10000 });
    rs = parseResponses(x.text);
    eq([rs[0]?.status, rs[0]?.json?.error?.message, closed(x)], [414, "The request line exceeds 8192 bytes, this server's limit.", true],
       "a 9,000-byte request line: 414");
    const r = curl(s, "/health");
    eq([r.status, r.json], [200, { status: "ok" }], "the server still answers");
    await stopServer(s);
  },

  // A client that trickles its request's head (a header line a second; the request line a byte a second)
  // holds an HTTP thread only until the head's deadline (10 s from its first byte): 408, then the connection
  // closes; other clients are served meanwhile.
  async slow_head() {
    const s = await startServer(["--http-threads", "3"]);
    const trickle = (first, piece, n) => rawExchange(s, async (sock) => {
      await sockWrite(sock, first);
      for (let i = 0; i < n; ++i) { await sleep(1000); await sockWrite(sock, piece); }
    }, { ms: 20000 });
    const [a, b] = await Promise.all([trickle("GET /health HTTP/1.1\r\n", "X-Slow: 1\r\n", 14), trickle("G", "E", 14),
                                      (async () => { await sleep(2000); eq(curl(s, "/health").status, 200, "another client is served meanwhile"); })()]);
    const head = "The request's head did not arrive within 10 s, this server's limit.";
    for (const [x, what] of [[a, "headers a line a second"], [b, "the request line a byte a second"]]) {
      const rs = parseResponses(x.text);
      eq([rs.length, rs[0]?.status, rs[0]?.json?.error?.message, x.why], [1, 408, head, "closed"], `${what}: 408`);
      check(x.ms > 9000 && x.ms < 14000, `${what}: answered at the deadline (${x.ms} ms)`);
    }
    await stopServer(s);
  },

  // HTTP/1.1 on one connection: pipelined requests (sent in one write) are answered in order; a client that
  // half-closes right after its request (shutdown(SHUT_WR)) still gets the response, streamed or not; one
  // that half-closes while its request runs has it cancelled and is told why.
  async pipelining_half_close() {
    const s = await startServer(["--max-batch", "4"]);
    const want = runCli([[1, 2, 3]], 4)[0];
    const body = JSON.stringify({ model: NAME, prompt: [1, 2, 3], max_tokens: 4, temperature: 0, ignore_eos: true, return_token_ids: true });
    let x = await rawExchange(s, (sock) => sockWrite(sock, httpGet("/health") + httpPost("/v1/completions", body) + httpGet("/v1/models") +
                                                           httpPost("/v1/completions", body) + httpGet("/health", "Connection: close\r\n")));
    let rs = parseResponses(x.text);
    eq([rs.map((r) => r.status), rs[0]?.json, rs[1]?.json?.choices?.[0]?.token_ids, rs[2]?.json?.object,
        rs[3]?.json?.choices?.[0]?.token_ids, x.why],
       [[200, 200, 200, 200, 200], { status: "ok" }, want.ids, "list", want.ids, "closed"],
       "five pipelined requests in one write: five responses in order");
    x = await rawExchange(s, httpGet("/health"), { halfClose: true });
    rs = parseResponses(x.text);
    eq([rs.length, rs[0]?.status, rs[0]?.json, x.why], [1, 200, { status: "ok" }, "closed"], "GET /health, then half-close: answered");
    x = await rawExchange(s, httpGet("/health") + httpGet("/metrics"), { halfClose: true });
    rs = parseResponses(x.text);
    eq([rs.map((r) => r.status), x.why], [[200, 200], "closed"], "two pipelined requests, then half-close: both answered");
    // The client's FIN follows its request at once; a FIN that arrives only after the server parsed the
    // request counts as leaving (below), so on a loaded machine an attempt may lose that race: up to 3.
    const halfClosed = async (request, done) => {
      let x;
      for (let i = 0; i < 3; ++i) {
        x = await rawExchange(s, request, { halfClose: true });
        if (done(parseResponses(x.text))) break;
      }
      return parseResponses(x.text);
    };
    rs = await halfClosed(httpPost("/v1/completions", body), (r) => r[0]?.json?.error?.code !== "client_closed_request");
    eq([rs[0]?.status, rs[0]?.json?.choices?.[0]?.token_ids], [200, want.ids], "a completion, then half-close: answered");
    const streamed = JSON.stringify({ ...JSON.parse(body), stream: true });
    // A stream's headers go out before its first event, so a FIN never counts as leaving for it (a closed
    // client answers the headers with a reset): one attempt, however late the FIN comes.
    x = await rawExchange(s, httpPost("/v1/completions", streamed), { halfClose: true });
    rs = parseResponses(x.text);
    let sse = parseSse(rs[0]?.body ?? "");
    eq([rs[0]?.status, sse.done, joinChunks(sse.chunks, false).ids], [200, true, want.ids], "a stream, then half-close: every event");
    {
      const n = 300, wantLong = runCli([[1, 2, 3]], n)[0];
      const longStream = JSON.stringify({ ...JSON.parse(streamed), max_tokens: n });
      const before = (await metrics(s)).genbridge_generation_tokens_total;
      x = await rawExchange(s, async (sock) => {
        await sockWrite(sock, httpPost("/v1/completions", longStream));
        await waitMetrics(s, (m) => m.genbridge_running_requests === 1 && m.genbridge_generation_tokens_total > before + 20, "the long stream runs");
      }, { halfClose: true, ms: 60000 });
      rs = parseResponses(x.text);
      sse = parseSse(rs[0]?.body ?? "");
      eq([rs[0]?.status, sse.done, joinChunks(sse.chunks, false).ids.length, joinChunks(sse.chunks, false).ids.join() === wantLong.ids.join()],
         [200, true, n, true], "half-closed while its stream runs: still every event");
    }
    // Half-closing while a long request runs: cancelled, answered with the reason.
    const cancelledBefore = (await metrics(s))['genbridge_requests_finished_total{reason="cancelled"}'];
    const long = JSON.stringify({ model: NAME, prompt: [1, 2, 3], max_tokens: 4000, temperature: 0, ignore_eos: true });
    const pending = rawExchange(s, async (sock) => {
      await sockWrite(sock, httpPost("/v1/completions", long));
      await waitMetrics(s, (m) => m.genbridge_running_requests === 1 && m.genbridge_generation_tokens_total > 40, "the long request runs");
    }, { halfClose: true, ms: 30000 });
    x = await pending;
    rs = parseResponses(x.text);
    eq([rs[0]?.status, rs[0]?.json?.error?.code, rs[0]?.json?.error?.message, rs[0]?.headers.connection],
       [400, "client_closed_request", "The client shut its side of the connection while the request ran; the request was " +
        "cancelled. A client may half-close only together with its request.", "close"],
       "half-closed while its request runs: cancelled and told why");
    await waitMetrics(s, (m) => m['genbridge_requests_finished_total{reason="cancelled"}'] === cancelledBefore + 1 &&
                                 m.genbridge_kv_pages_used === 0 && m.genbridge_running_requests === 0,
                      "the half-closed request was cancelled, its KV pages freed");
    await stopServer(s);
  },

  // A second server on a port in use refuses to start, naming the port (exit 1, as for every listener
  // failure); before, SO_REUSEPORT let it bind and the kernel split the clients between the two.
  async port_in_use() {
    const a = await startServer();
    const r = spawnSync(G, ["serve", "--model", MODEL, "--quiet", "--port", String(a.port)], { encoding: "utf8", timeout: 30000 });
    eq([r.status, r.stderr.trim()],
       [1, `genbridge serve: Unavailable: cannot listen on 127.0.0.1:${a.port} (--host, --port): port ${a.port} is in use (another server listens on it)`],
       "the second server exits 1 naming the port");
    const statuses = [];
    for (let i = 0; i < 20; ++i) statuses.push(curl(a, "/health").status);
    eq(statuses, new Array(20).fill(200), "every client reaches the first server");
    await stopServer(a);
  },

  // Soak: bounded bursts of large, nested, chunked, refused and pipelined requests on loopback; then the
  // server still answers with the same tokens, and its resident memory (/proc/PID/status) is back within
  // --rss-margin-mb (default 16; "none": not checked) of its baseline, taken after a first burst.
  async soak() {
    const s = await startServer(["--max-batch", "4"]);
    const margin = Number(args["rss-margin-mb"] ?? 16), rounds = Number(args.rounds ?? 3);
    const MiB = 1 << 20;
    const small = { model: NAME, prompt: [1, 2, 3], max_tokens: 4, temperature: 0, ignore_eos: true, return_token_ids: true };
    // 15 MiB bodies refused after tokenizing (longer than the context), after parsing 7.8M token ids, or
    // at once (an unknown model: 404).
    const large = [JSON.stringify({ model: NAME, prompt: "ab c".repeat((15 * MiB) / 4), max_tokens: 1 }),
                   JSON.stringify({ model: NAME, prompt: new Array((15 * MiB) / 2).fill(1), max_tokens: 1 }),
                   ...new Array(4).fill(JSON.stringify({ model: "none", prompt: "ab c".repeat((15 * MiB) / 4) }))];
    const nest = `{"model":"${NAME}","prompt":${nested(60000)}}`;
    const chunked = async () => {
      const x = await rawExchange(s, async (sock) => {
        await sockWrite(sock, chunkedHead("/v1/completions"));
        const body = "x".repeat(17 * MiB);
        for (let i = 0; i < body.length; i += MiB) await sockWrite(sock, chunk(body.slice(i, i + MiB)));
      }, { ms: 20000 });
      return parseResponses(x.text)[0]?.status;
    };
    const pipelined = async () => {
      const b = JSON.stringify(small);
      const x = await rawExchange(s, (sock) => sockWrite(sock, httpPost("/v1/completions", b) + httpGet("/health") +
                                                               httpPost("/v1/completions", b, "Connection: close\r\n")));
      return parseResponses(x.text).map((r) => r.status).join(",");
    };
    const burst = async () => {
      const got = await Promise.all([
        ...large.map((body) => post(s, "/v1/completions", body).then((r) => r.status)),
        ...Array.from({ length: 4 }, () => post(s, "/v1/completions", nest).then((r) => r.status)),
        ...Array.from({ length: 2 }, () => chunked()),
        ...Array.from({ length: 4 }, () => pipelined()),
        ...Array.from({ length: 40 }, () => post(s, "/v1/completions", small).then((r) => r.status)),
      ]);
      return got;
    };
    const wantStatuses = [400, 400, ...new Array(4).fill(404), ...new Array(4).fill(400), 413, 413, ...new Array(4).fill("200,200,200"),
                          ...new Array(40).fill(200)];
    const first = await post(s, "/v1/completions", small);
    eq(first.status, 200, "a first completion");
    eq(await burst(), wantStatuses, "warm-up burst: every request answered as it should be");
    await sleep(500);
    const base = rssMiB(s.proc.pid);
    let peak = base;
    for (let i = 0; i < rounds; ++i) {
      const t0 = Date.now();
      const got = await burst();
      peak = Math.max(peak, rssMiB(s.proc.pid));
      eq(got, wantStatuses, `burst ${i + 1} (${Date.now() - t0} ms): every request answered as it should be`);
    }
    let after = rssMiB(s.proc.pid);
    for (let i = 0; i < 30 && !(after <= base + margin); ++i) { await sleep(100); after = rssMiB(s.proc.pid); }
    console.log(`soak: RSS baseline ${base.toFixed(1)} MiB, peak seen ${peak.toFixed(1)} MiB, after ${rounds} bursts ${after.toFixed(1)} MiB`);
    if (!Number.isNaN(margin)) {
      check(after <= base + margin, `RSS after the bursts (${after.toFixed(1)} MiB) within ${margin} MiB of the baseline (${base.toFixed(1)} MiB)`);
    }
    const r = await post(s, "/v1/completions", small);
    eq([r.status, r.json?.choices?.[0]?.token_ids], [200, first.json?.choices?.[0]?.token_ids], "the server still answers, with the same tokens");
    await stopServer(s);
  },

};
Object.assign(cases, toolCases({ args, NAME, startServer, stopServer, check, eq, post, parseSse }));

try {
  const fn = cases[args.case];
  if (!fn) throw new Error(`unknown case ${args.case}; cases: ${Object.keys(cases).join(", ")}`);
  await fn();
} catch (e) {
  failures++;
  console.log(`FAIL: ${e.stack ?? e}${e.cause ? `\n  cause: ${e.cause.stack ?? e.cause}${e.cause.cause ? `\n  cause: ${e.cause.cause.stack ?? e.cause.cause}` : ""}` : ""}`);
  for (const s of servers) console.log(`-- server log:\n${s.log()}`);
}
clearTimeout(watchdog);
cleanup();
console.log(failures ? `${failures} check(s) failed` : "PASS");
process.exit(failures ? 1 : 0);
