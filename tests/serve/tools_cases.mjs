// Tool calls and structured outputs against `genbridge serve` (docs/serving.md, "Tool calls and structured
// outputs"), the cases serve_test.mjs runs with --case tool_calls / structured_outputs / frameworks. A tiny random
// model never writes a tool call or JSON by itself: constrained decoding (tool_choice "required" or a named
// function, response_format, vLLM's guided_*) is what makes every output here valid, and each one is checked:
// tool arguments and structured outputs against their JSON Schemas with ajv (+ ajv-formats), regexes with
// JavaScript's RegExp. The clients are npm packages (tests/serve/client): the official OpenAI client, the Vercel
// AI SDK (generateText with tools, generateObject) and LangChain's ChatOpenAI (bindTools, withStructuredOutput).
import path from "node:path";

export function toolCases(h) {
  const { args, NAME, startServer, stopServer, check, eq, post, parseSse } = h;
  const clients = () => import(path.join(args["client-dir"], "clients.mjs"));

  async function validator() {
    const { Ajv2020, addFormats } = await clients();
    const ajv = new Ajv2020({ strict: false, allErrors: true });  // JSON Schema 2020-12 (prefixItems, $defs)
    addFormats(ajv);
    return ajv;
  }
  function validates(ajv, schema, value, what) {
    const v = ajv.compile(schema);
    const ok = v(value);
    check(ok, `${what}: ajv validates ${JSON.stringify(value).slice(0, 160)}`, ok ? undefined : v.errors);
  }
  async function openai(s) {
    const { OpenAI } = await clients();
    return new OpenAI({ baseURL: s.base + "/v1", apiKey: "unused", timeout: 120000, maxRetries: 0 });
  }

  const weather = {
    type: "function",
    function: {
      name: "get_weather", description: "The weather in a city",
      parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Tokyo", "Lima"] },
                                                  days: { type: "integer", minimum: 1, maximum: 7 } },
                    required: ["city"], additionalProperties: false },
    },
  };
  const clock = {
    type: "function",
    function: { name: "get_time", description: "The time in a timezone",
                parameters: { type: "object", properties: { tz: { type: "string", maxLength: 12 } }, required: ["tz"] } },
  };
  const tools = [weather, clock];
  const schemaOf = (name) => tools.find((t) => t.function.name === name).function.parameters;
  const user = [{ role: "user", content: "What is the weather in Paris?" }];
  // A streamed chat's calls, content and finish per choice index, rebuilt from its deltas.
  async function streamed(client, body) {
    const calls = [], content = [], finish = [];
    let firstIds = true;
    for await (const ch of await client.chat.completions.create({ ...body, stream: true })) {
      for (const c of ch.choices ?? []) {
        const i = c.index;
        calls[i] ??= [];
        content[i] = (content[i] ?? "") + (c.delta?.content ?? "");
        for (const t of c.delta?.tool_calls ?? []) {
          if (!calls[i][t.index]) {
            firstIds &&= typeof t.id === "string" && t.type === "function" && typeof t.function?.name === "string";
            calls[i][t.index] = { name: t.function.name, arguments: t.function.arguments ?? "" };
          } else {
            firstIds &&= t.id === undefined && t.function?.name === undefined;
            calls[i][t.index].arguments += t.function?.arguments ?? "";
          }
        }
        finish[i] = c.finish_reason ?? finish[i] ?? null;
      }
    }
    return { calls, content, finish, firstIds };
  }
  const callsOf = (m) => (m.tool_calls ?? []).map((c) => ({ name: c.function.name, arguments: c.function.arguments }));

  return {
    // The OpenAI client: forced tool calls (required, named, parallel_tool_calls false), streamed as deltas, sent
    // back (content null) with the tool's result; null content and text parts; the errors of the tool fields.
    async tool_calls() {
      const ajv = await validator();
      const s = await startServer([]);
      const client = await openai(s);
      const forced = { model: NAME, messages: user, tools, max_tokens: 120, temperature: 0 };
      for (const seed of [1, 2, 3]) {
        const r = await client.chat.completions.create({ ...forced, tool_choice: "required", temperature: 1, seed });
        const m = r.choices[0].message;
        eq([r.choices[0].finish_reason, m.content, m.tool_calls?.length > 0], ["tool_calls", null, true],
           `required (seed ${seed}): finish_reason tool_calls, content null, tool calls`);
        for (const c of m.tool_calls ?? []) {
          check(/^call_[0-9a-f]{24}$/.test(c.id) && c.type === "function", `tool call id ${c.id} and type`);
          validates(ajv, schemaOf(c.function.name), JSON.parse(c.function.arguments), `required: ${c.function.name} arguments`);
        }
      }
      const named = await client.chat.completions.create({ ...forced,
                                                           tool_choice: { type: "function", function: { name: "get_time" } } });
      const nc = named.choices[0].message.tool_calls ?? [];
      eq([named.choices[0].finish_reason, nc.length, nc[0]?.function.name], ["tool_calls", 1, "get_time"],
         "named function: one call of it");
      validates(ajv, clock.function.parameters, JSON.parse(nc[0].function.arguments), "named: get_time arguments");
      const single = await client.chat.completions.create({ ...forced, tool_choice: "required", parallel_tool_calls: false,
                                                            temperature: 1, seed: 9 });
      eq(single.choices[0].message.tool_calls?.length, 1, "parallel_tool_calls false: exactly one call");

      // Streamed: deltas rebuild the same calls as the non-streamed request (greedy; ids differ per request).
      const whole = await client.chat.completions.create({ ...forced, tool_choice: "required" });
      const calls = [];
      let finish = null, role = null, content = "", firstIds = true;
      for await (const ch of await client.chat.completions.create({ ...forced, tool_choice: "required", stream: true })) {
        const d = ch.choices[0]?.delta ?? {};
        role = d.role ?? role;
        content += d.content ?? "";
        for (const t of d.tool_calls ?? []) {
          if (!calls[t.index]) {
            firstIds &&= typeof t.id === "string" && t.type === "function" && typeof t.function?.name === "string";
            calls[t.index] = { name: t.function.name, arguments: t.function.arguments ?? "" };
          } else {
            firstIds &&= t.id === undefined && t.function?.name === undefined;
            calls[t.index].arguments += t.function?.arguments ?? "";
          }
        }
        finish = ch.choices[0]?.finish_reason ?? finish;
      }
      eq([role, content, finish], ["assistant", "", "tool_calls"], "stream: role, no content, finish_reason tool_calls");
      check(firstIds, "stream: each call's first delta has id, type and name; later ones arguments only");
      eq(calls, whole.choices[0].message.tool_calls.map((c) => ({ name: c.function.name, arguments: c.function.arguments })),
         "stream: the deltas give the non-streamed calls");

      // The round trip: the assistant message as the client got it (content null) and the tool's result.
      const back = await client.chat.completions.create({
        model: NAME, tools, max_tokens: 4, temperature: 0,
        messages: [...user, whole.choices[0].message,
                   { role: "tool", tool_call_id: whole.choices[0].message.tool_calls[0].id, content: "{\"temp\": 18}" }] });
      eq(back.choices[0].finish_reason, "length", "round trip: the assistant turn with content null and its tool result are accepted");
      // Null or missing content on any role, and text parts (joined with \n, as vLLM and llama.cpp do).
      const nulls = await post(s, "/v1/chat/completions", { model: NAME, max_tokens: 1, messages: [
        { role: "system", content: null }, { role: "user" }, { role: "assistant", content: null },
        { role: "user", content: "hi" }] });
      eq(nulls.status, 200, "null or missing content on system, user and assistant turns: 200");
      const tokens = async (content) => (await post(s, "/v1/chat/completions", {
        model: NAME, max_tokens: 1, messages: [{ role: "user", content }] })).json?.usage?.prompt_tokens;
      const parts = await tokens([{ type: "text", text: "x" }, { type: "text", text: "y" }]);
      eq([parts, parts === await tokens("x\ny"), parts === await tokens("xy")], [parts, true, false],
         "text parts are joined with a newline");
      // tool_choice auto on a random model: whatever it writes, the response is well-formed.
      const auto = await client.chat.completions.create({ ...forced, max_tokens: 8 });
      check(["length", "stop", "tool_calls"].includes(auto.choices[0].finish_reason), "tool_choice auto: a well-formed answer");

      // Several choices: each one a sequence of its own under the grammar, with calls of its own (ids unique across
      // the choices); streamed, each index's deltas give that choice's calls.
      const two = { ...forced, tool_choice: "required", n: 2, temperature: 1, seed: 21 };
      const many = await client.chat.completions.create(two);
      eq(many.choices.map((c) => [c.index, c.finish_reason, c.message.content, callsOf(c.message).length > 0]),
         [[0, "tool_calls", null, true], [1, "tool_calls", null, true]], "n 2: every choice calls a tool");
      const ids = many.choices.flatMap((c) => (c.message.tool_calls ?? []).map((t) => t.id));
      eq(new Set(ids).size, ids.length, "n 2: the call ids are unique across the choices");
      for (const c of many.choices) {
        for (const t of c.message.tool_calls ?? []) {
          validates(ajv, schemaOf(t.function.name), JSON.parse(t.function.arguments), `n 2, choice ${c.index}: ${t.function.name} arguments`);
        }
      }
      const st2 = await streamed(client, two);
      eq([st2.calls, st2.finish, st2.content], [many.choices.map((c) => callsOf(c.message)), ["tool_calls", "tool_calls"], ["", ""]],
         "n 2 streamed: each index's deltas give that choice's calls");
      check(st2.firstIds, "n 2 streamed: each call's first delta has id, type and name");
      const best = await post(s, "/v1/chat/completions", { ...forced, tool_choice: "required", best_of: 3, temperature: 1, seed: 5 });
      const bc = best.json?.choices ?? [];
      eq([bc.length, bc[0]?.finish_reason, bc[0]?.message?.tool_calls?.length > 0], [1, "tool_calls", true],
         "best_of 3: the chosen choice's calls");
      // A stop string that never comes leaves the calls as they are.
      const stopped = await client.chat.completions.create({ ...forced, tool_choice: "required", stop: ["\u00a7\u00a7"] });
      eq(callsOf(stopped.choices[0].message), callsOf(whole.choices[0].message), "with a stop string: the same calls");

      const refused = async (body, status, param, message, what) => {
        const r = await post(s, "/v1/chat/completions", { model: NAME, messages: user, max_tokens: 50, ...body });
        eq([r.status, r.json?.error?.param, r.json?.error?.message], [status, param, message], what);
      };
      await refused({ tools, tool_choice: { type: "function", function: { name: "nope" } } }, 400, "tool_choice.function.name",
                    "'tool_choice.function.name' is 'nope', which is not among 'tools' (get_weather, get_time).",
                    "a named function that is not a tool");
      await refused({ tool_choice: "required" }, 400, "tool_choice", "'tool_choice' \"required\" needs 'tools' to call.",
                    "tool_choice required without tools");
      await refused({ tools: [{ type: "function", function: { name: "bad name" } }] }, 400, "tools[0].function.name",
                    "'tools[0].function.name' must be 1 to 64 letters, digits, '_', '.' or '-', got \"bad name\".",
                    "a tool name with a space");
      await refused({ tools: [{ type: "code_interpreter" }] }, 400, "tools[0].type",
                    "'tools[0].type' must be \"function\", got \"code_interpreter\".", "a tool that is not a function");
      await refused({ tools: [weather, weather] }, 400, "tools", "'tools' names the function 'get_weather' twice.", "a tool twice");
      await refused({ tools: [{ type: "function", function: { name: "f", parameters: { type: "object",
                                 properties: { x: { type: "string", format: "hostname" } } } } }], tool_choice: "required" },
                    400, "tool_choice",
                    "tools[0].function.parameters/properties/x/format: format 'hostname' is not supported (supported: " +
                    "date, date-time, email, ipv4, time, uuid).", "a forced call's schema outside the subset");
      const short = await post(s, "/v1/chat/completions", { model: NAME, messages: user, tools, tool_choice: "required", max_tokens: 5 });
      check(short.status === 400 && short.json?.error?.param === "max_tokens" &&
            /^max_tokens is 5, but the shortest output 'tool_choice' allows takes (\d+) tokens \(the stop token included\); raise max_tokens\.$/.test(short.json?.error?.message),
            "max_tokens below the shortest forced call", short.json);
      await refused({ tools, tool_choice: "required", response_format: { type: "json_object" } }, 400, "response_format",
                    "'response_format' and 'tool_choice' \"required\" both constrain the output; give one.",
                    "response_format with a forced tool call");
      const comp = await post(s, "/v1/completions", { model: NAME, prompt: "x", tools });
      eq([comp.status, comp.json?.error?.message], [400, "'tools' belongs to /v1/chat/completions, not /v1/completions."],
         "tools on /v1/completions");
      await stopServer(s);

      // A reasoning parser whose replies are reasoning from their start (deepseek_r1): a forced call is constrained
      // from its first token, holds no reasoning, and is parsed into tool_calls, whole and streamed.
      const rs = await startServer(["--reasoning-parser", "deepseek_r1"]);
      const rclient = await openai(rs);
      const rw = await rclient.chat.completions.create({ ...forced, tool_choice: "required" });
      const rm = rw.choices[0].message;
      eq([rw.choices[0].finish_reason, rm.content, rm.reasoning_content, callsOf(rm)], ["tool_calls", null, undefined, callsOf(whole.choices[0].message)],
         "deepseek_r1 reasoning parser: the forced calls, no reasoning");
      const rst = await streamed(rclient, { ...forced, tool_choice: "required" });
      eq([rst.calls[0], rst.finish[0]], [callsOf(rm), "tool_calls"], "deepseek_r1 reasoning parser, streamed: the same calls");
      await stopServer(rs);
    },

    // response_format (json_object, json_schema with strict), guided_json / guided_regex / guided_choice and
    // structured_outputs: every output parses and validates (sampled at temperature 1 with several seeds).
    async structured_outputs() {
      const ajv = await validator();
      const s = await startServer([]);
      const client = await openai(s);
      const messages = [{ role: "user", content: "Describe a person as JSON." }];
      const schemas = {
        person: { type: "object", properties: {
            name: { type: "string" }, age: { type: "integer", minimum: 0, maximum: 130 },
            email: { type: "string", format: "email" }, born: { type: "string", format: "date" },
            tags: { type: "array", items: { enum: ["a", "b", "c"] }, maxItems: 3 },
            score: { type: "number", exclusiveMinimum: 0, maximum: 1 },
            nick: { anyOf: [{ type: "string", maxLength: 8 }, { type: "null" }] } },
          required: ["name", "age", "email", "born", "tags", "score", "nick"], additionalProperties: false },
        tree: { $defs: { node: { type: "object", properties: { v: { type: "integer" },
                                                               kids: { type: "array", items: { $ref: "#/$defs/node" }, maxItems: 2 } },
                                 required: ["v", "kids"], additionalProperties: false } },
                $ref: "#/$defs/node" },
        tuple: { type: "array", prefixItems: [{ type: "string", pattern: "^[A-Z]{2}-\\d{3}$" }, { type: "boolean" }],
                 items: false, minItems: 2 },
      };
      for (const [name, schema] of Object.entries(schemas)) {
        for (const seed of [1, 2]) {
          const r = await client.chat.completions.create({ model: NAME, messages, max_tokens: 160, temperature: 1, seed,
            response_format: { type: "json_schema", json_schema: { name, schema, strict: true } } });
          let value;
          try { value = JSON.parse(r.choices[0].message.content); } catch (e) { value = e.message; }
          validates(ajv, schema, value, `json_schema '${name}' (seed ${seed}, finish ${r.choices[0].finish_reason})`);
        }
      }
      // A short budget: the output still completes (the matcher keeps it completable within max_tokens).
      const tight = await client.chat.completions.create({ model: NAME, messages, max_tokens: 30, temperature: 1, seed: 4,
                                                           response_format: { type: "json_object" } });
      const obj = (() => { try { return JSON.parse(tight.choices[0].message.content); } catch { return null; } })();
      check(obj !== null && typeof obj === "object" && !Array.isArray(obj) && tight.choices[0].finish_reason === "stop",
            "json_object in 30 tokens: a complete JSON object, finish_reason stop", tight.choices[0]);
      // Streamed equals non-streamed (greedy).
      const body = { model: NAME, messages, max_tokens: 100, temperature: 0,
                     response_format: { type: "json_schema", json_schema: { name: "person", schema: schemas.person } } };
      const whole = await client.chat.completions.create(body);
      let text = "";
      for await (const ch of await client.chat.completions.create({ ...body, stream: true })) text += ch.choices[0]?.delta?.content ?? "";
      eq(text, whole.choices[0].message.content, "json_schema streamed: the non-streamed content");
      // vLLM's fields, on both endpoints.
      const g = await post(s, "/v1/completions", { model: NAME, prompt: "x", max_tokens: 80, temperature: 1, seed: 3,
                                                   guided_json: schemas.tuple });
      validates(ajv, schemas.tuple, JSON.parse(g.json.choices[0].text), "guided_json on /v1/completions");
      const re = "[a-z]{3,6}@(ex|example)\\.(com|org)";
      for (const seed of [1, 2, 3]) {
        const r = await post(s, "/v1/chat/completions", { model: NAME, messages, max_tokens: 40, temperature: 1, seed, guided_regex: re });
        const out = r.json.choices[0].message.content;
        check(new RegExp(`^(?:${re})$`).test(out), `guided_regex (seed ${seed}): '${out}' matches`);
      }
      const choices = ["yes", "no", "maybe so"];
      const c = await post(s, "/v1/chat/completions", { model: NAME, messages, max_tokens: 10, temperature: 1, seed: 5, guided_choice: choices });
      check(choices.includes(c.json.choices[0].message.content), `guided_choice: '${c.json.choices[0].message.content}' is a choice`);
      const so = await post(s, "/v1/chat/completions", { model: NAME, messages, max_tokens: 10, temperature: 1, seed: 6,
                                                        structured_outputs: { choice: choices } });
      check(choices.includes(so.json.choices[0].message.content), "structured_outputs.choice");
      const gs = await post(s, "/v1/chat/completions", { model: NAME, messages, max_tokens: 60, temperature: 1, seed: 7,
                                                        guided_json: JSON.stringify(schemas.tree) });
      validates(ajv, schemas.tree, JSON.parse(gs.json.choices[0].message.content), "guided_json as a string");

      const refused = async (extra, param, message, what) => {
        const r = await post(s, "/v1/chat/completions", { model: NAME, messages, max_tokens: 50, ...extra });
        eq([r.status, r.json?.error?.param, r.json?.error?.message], [400, param, message], what);
      };
      // With the other fields: n (a matcher per choice), completions' echo with logprobs (the prompt fed as forced
      // tokens, which the grammar never sees), min_tokens holding back the stop token of a complete output (the
      // grammar wins), allowed_token_ids disjoint from the grammar's tokens (likewise), a stop string cutting it.
      const nj = await client.chat.completions.create({ model: NAME, messages, max_tokens: 100, temperature: 1, seed: 9, n: 2,
        response_format: { type: "json_schema", json_schema: { name: "tree", schema: schemas.tree } } });
      eq(nj.choices.length, 2, "json_schema with n 2: two choices");
      for (const c of nj.choices) {
        let value;
        try { value = JSON.parse(c.message.content); } catch (e) { value = e.message; }
        validates(ajv, schemas.tree, value, `json_schema with n 2, choice ${c.index}`);
      }
      const echoed = await post(s, "/v1/completions", { model: NAME, prompt: "Answer: yes or no?", echo: true, logprobs: 1,
                                                        max_tokens: 4, temperature: 1, seed: 8, guided_choice: choices });
      const et = echoed.json?.choices?.[0]?.text ?? "";
      check(et.startsWith("Answer: yes or no?") && choices.includes(et.slice("Answer: yes or no?".length)),
            "guided_choice with echo and logprobs: the prompt, then one of the choices", echoed.json);
      eq(echoed.json?.choices?.[0]?.logprobs?.token_logprobs?.[0], null, "echo with logprobs: the prompt's first token has no logprob");
      for (const [extra, what] of [[{ min_tokens: 8 }, "min_tokens past the choice's end"],
                                   [{ allowed_token_ids: [0] }, "allowed_token_ids disjoint from the choices"]]) {
        const r = await post(s, "/v1/chat/completions", { model: NAME, messages, max_tokens: 10, temperature: 1, seed: 5,
                                                          guided_choice: choices, ...extra });
        check(r.status === 200 && choices.includes(r.json?.choices?.[0]?.message?.content) &&
              r.json?.choices?.[0]?.finish_reason === "stop", `guided_choice with ${what}: one of the choices, stop`, r.json ?? r.text);
      }
      const cut = await post(s, "/v1/completions", { model: NAME, prompt: "x", max_tokens: 6, temperature: 1, seed: 2,
                                                     guided_choice: ["ab", "cd"], stop: ["b"] });
      check(["a", "cd"].includes(cut.json?.choices?.[0]?.text) && cut.json?.choices?.[0]?.finish_reason === "stop",
            "guided_choice with a stop string: the text before it", cut.json);

      await refused({ response_format: { type: "xml" } }, "response_format.type",
                    "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"xml\".", "an unknown response_format type");
      await refused({ response_format: { type: "json_schema" } }, "response_format.json_schema",
                    "'response_format.json_schema' must be an object {\"name\": ..., \"schema\": {...}} with type \"json_schema\".",
                    "json_schema without its object");
      await refused({ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", minProperties: 1 } } } },
                    "response_format.json_schema.schema",
                    "response_format.json_schema.schema/minProperties: 'minProperties' is not supported by constrained decoding " +
                    "(docs/text.md lists the JSON Schema subset).", "a keyword outside the subset");
      await refused({ guided_regex: "(a)\\1" }, "guided_regex",
                    "guided_regex: pattern \"(a)\\1\": a backreference is not supported at offset 5.", "a backreference");
      await refused({ guided_choice: [] }, "guided_choice", "'guided_choice' must be a non-empty list of strings, got [].",
                    "an empty guided_choice");
      await refused({ guided_grammar: "root ::= \"a\"" }, "guided_grammar",
                    "'guided_grammar' is not supported by this server (constrained decoding takes guided_json, guided_regex, " +
                    "guided_choice, structured_outputs and response_format).", "guided_grammar");
      await refused({ guided_json: { type: "object" }, guided_regex: "a" }, "guided_regex",
                    "'guided_json' and 'guided_regex' both constrain the output; give one.", "two constraints");
      await refused({ response_format: { type: "json_object" }, max_tokens: 1 }, "max_tokens",
                    "max_tokens is 1, but the shortest output 'response_format' allows takes 2 tokens (the stop token included); raise max_tokens.",
                    "max_tokens below the shortest JSON object");
      await stopServer(s);
    },

    // Not a test: the cost of constrained decoding per token as a client sees it (docs/bench/serve.md): greedy TPOT of one
    // streamed request at a time, --rounds times each, alternating: unconstrained (ignore_eos), and a JSON Schema of
    // at least 64 strings in an array (a random model keeps writing them until the budget closes the output), both
    // up to --max-tokens (default 256).
    async constraint_tpot() {
      const rounds = Number(args.rounds ?? 5), n = Number(args["max-tokens"] ?? 256);
      const s = await startServer([]);
      const one = async (extra) => {
        const t0 = performance.now();
        const res = await fetch(s.base + "/v1/chat/completions", {
          method: "POST", headers: { "content-type": "application/json" }, signal: AbortSignal.timeout(300000),
          body: JSON.stringify({ model: NAME, messages: [{ role: "user", content: "Write JSON." }], max_tokens: n,
                                 temperature: 0, stream: true, stream_options: { include_usage: true }, ...extra }) });
        const text = await res.text();
        const t1 = performance.now();
        const events = text.split("\n\n").filter((e) => e.startsWith("data: {")).map((e) => JSON.parse(e.slice(6)));
        const tokens = events.at(-1)?.usage?.completion_tokens ?? 0;
        return { tokens, ms: t1 - t0 };
      };
      const schema = { type: "object", properties: { items: { type: "array", items: { type: "string" }, minItems: 64 } },
                       required: ["items"], additionalProperties: false };
      const runs = { plain: [], json_schema: [] };
      for (let r = 0; r < rounds; ++r) {
        runs.plain.push(await one({ ignore_eos: true }));
        runs.json_schema.push(await one({ response_format: { type: "json_schema", json_schema: { name: "list", schema } } }));
      }
      for (const [k, v] of Object.entries(runs)) {
        const per = v.map((x) => x.ms / x.tokens).sort((a, b) => a - b);
        console.log(`constraint_tpot: ${k}: tokens ${v.map((x) => x.tokens).join(",")}; ms per token (request time / tokens) ` +
                    `median ${per[per.length >> 1].toFixed(3)}, min ${per[0].toFixed(3)}, max ${per.at(-1).toFixed(3)}`);
      }
      const m = await (await fetch(s.base + "/metrics")).text();
      console.log(m.split("\n").filter((l) => l.startsWith("genbridge_time_per_output_token_seconds_")).join("\n"));
      await stopServer(s);
    },

    // The Vercel AI SDK (generateText with a tool, generateObject with a zod schema) and LangChain's ChatOpenAI
    // (bindTools, withStructuredOutput by JSON schema and by function calling).
    async frameworks() {
      const ajv = await validator();
      const { z, generateText, generateObject, tool, createOpenAICompatible, ChatOpenAI } = await clients();
      const s = await startServer([]);
      const provider = createOpenAICompatible({ name: "genbridge", baseURL: s.base + "/v1", apiKey: "unused",
                                                supportsStructuredOutputs: true });
      const model = provider.chatModel(NAME);
      let executed = null;
      const t = await generateText({
        model, prompt: "What is the weather in Tokyo?", maxOutputTokens: 100, temperature: 0, toolChoice: "required",
        tools: { get_weather: tool({ description: "The weather in a city",
                                     inputSchema: z.object({ city: z.enum(["Paris", "Tokyo"]), days: z.number().int().min(1).max(7).optional() }),
                                     execute: async (input) => { executed = input; return { temp: 21 }; } }) } });
      eq([t.toolCalls.length > 0, t.toolCalls.every((c) => c.toolName === "get_weather"), t.finishReason], [true, true, "tool-calls"],
         "AI SDK generateText: get_weather calls, finishReason tool-calls");
      check(executed !== null && ["Paris", "Tokyo"].includes(executed.city), "AI SDK: the tool ran on the parsed input", executed);
      eq(t.toolResults.map((r) => r.output), t.toolCalls.map(() => ({ temp: 21 })), "AI SDK: the tool's results, one per call");
      const personSchema = z.object({ name: z.string(), age: z.number().int().min(0).max(120),
                                      role: z.enum(["admin", "user"]), tags: z.array(z.string()).max(2) });
      const o = await generateObject({ model, schema: personSchema, prompt: "A user.", maxOutputTokens: 120, temperature: 1, seed: 3 });
      check(personSchema.safeParse(o.object).success && ["admin", "user"].includes(o.object.role),
            "AI SDK generateObject: an object the zod schema accepts", o.object);
      validates(ajv, z.toJSONSchema(personSchema), o.object, "AI SDK generateObject");

      const chat = new ChatOpenAI({ model: NAME, apiKey: "unused", configuration: { baseURL: s.base + "/v1" }, maxTokens: 120,
                                    temperature: 0, maxRetries: 0 });
      const weatherTool = { type: "function", function: weather.function };
      const bound = chat.bindTools([weatherTool], { tool_choice: "required" });
      const ai = await bound.invoke("Weather in Lima?");
      eq([ai.tool_calls?.length, ai.tool_calls?.[0]?.name], [1, "get_weather"], "LangChain bindTools: one get_weather call");
      validates(ajv, weather.function.parameters, ai.tool_calls?.[0]?.args, "LangChain bindTools: the call's args");
      const lcSchema = z.object({ title: z.string(), year: z.number().int().min(1900).max(2100), genre: z.enum(["drama", "comedy"]) });
      for (const method of ["jsonSchema", "functionCalling"]) {
        const structured = chat.withStructuredOutput(lcSchema, { name: "movie", method });
        const movie = await structured.invoke("A movie.");
        check(lcSchema.safeParse(movie).success, `LangChain withStructuredOutput (${method}): an object the schema accepts`, movie);
      }
      await stopServer(s);
    },
  };
}
