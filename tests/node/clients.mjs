// krun serve through the client libraries people build on (package.json pins them; `npm ci` here):
// structured output (LangChain withStructuredOutput, both methods; the AI SDK's generateObject; the
// openai client's response_format and named tool_choice), logprobs, penalties, n, and the Anthropic
// SDK's messages.create (plain, streamed, tool use).  Every structured output is checked with ajv
// against the schema the client sent.
// Usage: node clients.mjs BASE_URL API_KEY MODEL SEEDS   (prints TAP-like lines; run by
// tests/cli/test_krun_serve_clients.sh against a tiny model with the real tokenizer)
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { ChatOpenAI } from "@langchain/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, jsonSchema } from "ai";
import Ajv from "ajv/dist/2020.js";
import { z } from "zod";

const [baseURL, apiKey, model, seedsArg] = process.argv.slice(2);
const SEEDS = Number(seedsArg || 8);
const root = baseURL.replace(/\/v1$/, "");
const openai = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 300000 });
const ajv = new Ajv({ strict: false });
let failures = 0;
const ok = (cond, what, detail) => {
  console.log(`${cond ? "ok" : "not ok"} - ${what}${cond || detail === undefined ? "" : ": " + JSON.stringify(detail).slice(0, 400)}`);
  if (!cond) failures++;
};
const user = (text) => [{ role: "user", content: text }];
// the tiny model never closes its reasoning: structured-output tests run with thinking off (the
// reasoning stays unconstrained when on: docs/SERVE.md)
const noThink = { chat_template_kwargs: { thinking: false } };
const valid = (schema, text) => {
  try { const v = JSON.parse(text); return ajv.validate(schema, v) ? null : ajv.errorsText(); } catch (e) { return String(e); }
};

const person = {
  type: "object",
  properties: {
    name: { type: "string", minLength: 1, maxLength: 12 },
    age: { type: "integer" },
    tags: { type: "array", items: { type: "string", enum: ["a", "b", "c"] }, maxItems: 3 },
    kind: { anyOf: [{ const: "x" }, { type: "boolean" }] },
  },
  required: ["name", "age", "tags", "kind"],
  additionalProperties: false,
};

async function main() {
  // ---- the openai client: response_format, named tool_choice, an unsupported keyword ----
  {
    let bad = [];
    for (let seed = 1; seed <= SEEDS; seed++) {
      const r = await openai.chat.completions.create({ model, messages: user("A person, please."), max_tokens: 600, seed, ...noThink,
        response_format: { type: "json_schema", json_schema: { name: "person", strict: true, schema: person } } });
      const c = r.choices[0];
      const why = c.finish_reason === "stop" ? valid(person, c.message.content) : "finish_reason " + c.finish_reason;
      if (why) bad.push({ seed, why, content: c.message.content });
    }
    ok(!bad.length, `openai: response_format json_schema (strict): schema-valid JSON on ${SEEDS} seeds`, bad[0]);
    // json_object: strings are unbounded, and the tiny random model seldom closes one (a token with a
    // quote is ~1 in 500): what finishes must be an object; at least half must finish
    bad = [];
    let stopped = 0;
    for (let seed = 1; seed <= SEEDS; seed++) {
      const r = await openai.chat.completions.create({ model, messages: user("JSON"), max_tokens: 300, seed, ...noThink,
        response_format: { type: "json_object" } });
      const c = r.choices[0];
      if (c.finish_reason !== "stop") continue;
      stopped++;
      const why = valid({ type: "object" }, c.message.content);
      if (why) bad.push({ seed, why, content: c.message.content });
    }
    ok(!bad.length && stopped * 2 >= SEEDS, `openai: response_format json_object: ${stopped} of ${SEEDS} seeds finished, each a JSON object`, bad[0]);
    bad = [];
    const tools = [{ type: "function", function: { name: "lookup", description: "find a person", parameters: person } },
                   { type: "function", function: { name: "other", parameters: { type: "object", properties: {} } } }];
    for (let seed = 1; seed <= SEEDS; seed++) {
      const r = await openai.chat.completions.create({ model, messages: user("Look it up."), max_tokens: 600, seed, ...noThink, tools,
        tool_choice: { type: "function", function: { name: "lookup" } } });
      const c = r.choices[0], calls = c.message.tool_calls || [];
      const why = c.finish_reason !== "tool_calls" ? "finish_reason " + c.finish_reason
        : calls.length !== 1 || calls[0].function.name !== "lookup" ? "calls " + JSON.stringify(calls)
        : valid(person, calls[0].function.arguments);
      if (why) bad.push({ seed, why });
    }
    ok(!bad.length, `openai: tool_choice naming a function: one call of it, arguments schema-valid, on ${SEEDS} seeds`, bad[0]);
    const req = { model, messages: user("A person, please."), max_tokens: 600, seed: 5, temperature: 0.9, ...noThink,
      response_format: { type: "json_schema", json_schema: { name: "person", strict: true, schema: person } } };
    const a = await openai.chat.completions.create(req), b = await openai.chat.completions.create(req);
    ok(a.choices[0].message.content === b.choices[0].message.content, "openai: the same constrained request twice: the same reply");
    try {
      await openai.chat.completions.create({ model, messages: user("x"), max_tokens: 5,
        response_format: { type: "json_schema", json_schema: { name: "p", schema: { type: "string", pattern: "^(?=a)a+$" } } } });
      ok(false, "openai: an unsupported pattern is refused");
    } catch (e) {
      ok(e.status === 400 && /lookahead/.test(e.message) && e.param === "response_format.json_schema.schema.pattern",
         "openai: a pattern with a lookahead: 400 naming pattern and what in it", { status: e.status, message: e.message, param: e.param });
    }
  }

  // ---- logprobs ----
  {
    const r = await openai.chat.completions.create({ model, messages: user("hi"), max_tokens: 5, seed: 2, temperature: 0,
      logprobs: true, top_logprobs: 5, ...noThink });
    const lp = r.choices[0].logprobs?.content || [];
    const shapes = lp.length === r.usage.completion_tokens && lp.every((t) => typeof t.token === "string" && t.logprob <= 0 &&
      Array.isArray(t.bytes) && t.top_logprobs.length === 5 && t.top_logprobs.every((x, i, a) => !i || a[i - 1].logprob >= x.logprob));
    ok(shapes, "openai: logprobs + top_logprobs 5: one entry per token, 5 alternatives, most likely first", lp[0]);
    // greedy: the token chosen is the most likely one
    ok(lp.length && lp.every((t) => t.logprob === t.top_logprobs[0].logprob && t.token === t.top_logprobs[0].token),
       "openai: at temperature 0 each token is its own top alternative, with the same logprob", lp[0]);
    const sum = lp.length ? lp[0].top_logprobs.reduce((s, x) => s + Math.exp(x.logprob), 0) : 2;
    ok(sum > 0 && sum <= 1 + 1e-9, "openai: the alternatives' probabilities sum to at most 1", sum);
    console.log(`# first token logprob ${lp[0]?.logprob} (${JSON.stringify(lp[0]?.token)})`);
    console.log(`LOGPROB0 ${lp[0]?.logprob}`);
    const c = await openai.completions.create({ model, prompt: "hello", max_tokens: 4, seed: 2, logprobs: 3 });
    const l = c.choices[0].logprobs;
    ok(l && l.tokens.length === 4 && l.token_logprobs.length === 4 && l.top_logprobs.every((o) => Object.keys(o).length <= 3) &&
       l.text_offset[0] === 0, "openai: completions logprobs 3: tokens, token_logprobs, top_logprobs, text_offset", l);
    // streamed: the client's chunks carry the logprobs of their tokens; together, the non-streamed list
    {
      const req = { model, messages: user("Tell me about the moon."), max_tokens: 24, seed: 5, temperature: 0.9, logprobs: true,
        top_logprobs: 4, ...noThink };
      const whole = await openai.chat.completions.create(req);
      const got = [];
      let text = "";
      for await (const ch of await openai.chat.completions.create({ ...req, stream: true })) {
        text += ch.choices[0]?.delta?.content || "";
        got.push(...(ch.choices[0]?.logprobs?.content || []));
      }
      ok(JSON.stringify(got) === JSON.stringify(whole.choices[0].logprobs.content) && text === whole.choices[0].message.content &&
         got.length === whole.usage.completion_tokens, "openai: chat streamed with logprobs + top_logprobs 4 == the non-streamed request's (same tokens, same logprobs)",
         { streamed: got.length, whole: whole.choices[0].logprobs.content.length });
      const run = openai.chat.completions.stream(req);      // the client's own accumulator
      const fin = await run.finalChatCompletion();
      ok(JSON.stringify(fin.choices[0].logprobs?.content) === JSON.stringify(whole.choices[0].logprobs.content),
         "openai: chat.completions.stream().finalChatCompletion() accumulates the same logprobs", fin.choices[0].logprobs);
      const creq = { model, prompt: "The moon is", max_tokens: 20, seed: 6, temperature: 0.9, logprobs: 3 };
      const cw = (await openai.completions.create(creq)).choices[0];
      const acc = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
      let ctext = "";
      for await (const ch of await openai.completions.create({ ...creq, stream: true })) {
        ctext += ch.choices[0]?.text || "";
        for (const k of Object.keys(acc)) acc[k].push(...(ch.choices[0]?.logprobs?.[k] || []));
      }
      ok(JSON.stringify(acc) === JSON.stringify(cw.logprobs) && ctext === cw.text,
         "openai: completions streamed with logprobs 3 == the non-streamed request's (tokens, token_logprobs, top_logprobs, text_offset)", acc.tokens);
    }
    // echo: lm-evaluation-harness's loglikelihood request (echo, max_tokens 0 and 1, logprobs 1, temperature 0)
    {
      const ctx = "The capital of France is", cont = " Paris";
      const r0 = (await openai.completions.create({ model, prompt: ctx + cont, echo: true, max_tokens: 0, logprobs: 1, temperature: 0 })).choices[0];
      const r1 = (await openai.completions.create({ model, prompt: ctx + cont, echo: true, max_tokens: 1, logprobs: 1, temperature: 0 })).choices[0];
      const nctx = (await (await fetch(root + "/tokenize", { method: "POST", headers: { Authorization: "Bearer " + apiKey },
        body: JSON.stringify({ content: ctx }) })).json()).tokens.length;
      const l0 = r0.logprobs, l1 = r1.logprobs;
      const ll0 = l0.token_logprobs.slice(nctx).reduce((a, b) => a + b, 0), ll1 = l1.token_logprobs.slice(nctx, -1).reduce((a, b) => a + b, 0);
      ok(r0.text === ctx + cont && l0.token_logprobs[0] === null && l0.top_logprobs[0] === null && l0.tokens.join("") === ctx + cont &&
         l0.token_logprobs.slice(1).every((x) => x < 0) && r1.text.startsWith(ctx + cont) && l1.tokens.length === l0.tokens.length + 1 &&
         ll0 === ll1 && ll0 < 0, "openai: echo + logprobs (lm-eval's loglikelihood shape, max_tokens 0 and 1): the prompt echoed and scored, first token null, the same scores", { ll0, ll1 });
    }
    try {
      await openai.chat.completions.create({ model, messages: user("x"), max_tokens: 2, logprobs: true, top_logprobs: 21 });
      ok(false, "openai: top_logprobs 21 is refused");
    } catch (e) {
      ok(e.status === 400 && e.param === "top_logprobs", "openai: top_logprobs 21: 400 naming top_logprobs", e.message);
    }
  }

  // ---- penalties ----
  // The tiny model seldom repeats a token, so negative penalties (which favour repeats) show the
  // effect; each greedy pick is checked against OpenAI's arithmetic on the reported logprobs (the
  // model's distribution, before penalties): among the top 20, the pick maximizes
  // lp - count * frequency_penalty - (count > 0) * presence_penalty.
  {
    const base = { model, prompt: "A story:", max_tokens: 30, temperature: 0, return_token_ids: true, logprobs: 20 };
    const run = async (extra) => (await openai.completions.create({ ...base, ...extra })).choices[0];
    const plain = await run({}), pen = await run({ frequency_penalty: -1.5, presence_penalty: -1 });
    const again = await run({ frequency_penalty: -1.5, presence_penalty: -1 }), rep = await run({ repetition_penalty: 0.2 });
    const distinct = (c) => new Set(c.token_ids).size;
    console.log(`# distinct tokens in 30 greedy: plain ${distinct(plain)}, frequency -1.5 presence -1: ${distinct(pen)}, repetition 0.2: ${distinct(rep)}`);
    ok(JSON.stringify(pen) === JSON.stringify(again), "openai: penalties are deterministic (the same request twice)");
    ok(pen.text !== plain.text, "openai: frequency/presence penalties change greedy output");
    ok(distinct(rep) < distinct(plain), "openai: repetition_penalty below 1 makes greedy output repeat", { plain: distinct(plain), rep: distinct(rep) });
    const ids = async (t) => (await (await fetch(root + "/tokenize", { method: "POST", headers: { Authorization: "Bearer " + apiKey },
      body: JSON.stringify({ content: t }) })).json()).tokens;
    let wrong = null, changed = 0;
    const counts = new Map();
    for (let i = 0; i < pen.token_ids.length && !wrong; i++) {
      const alts = pen.logprobs.top_logprobs[i];
      let best = null, bestScore = -Infinity;
      for (const [tok, lp] of Object.entries(alts)) {
        const tid = await ids(tok);
        if (tid.length !== 1) continue;     // a token whose text does not round-trip: skipped
        const c = counts.get(tid[0]) || 0, score = lp + 1.5 * c + (c > 0 ? 1 : 0);
        if (score > bestScore) { bestScore = score; best = tid[0]; }
      }
      const top = (await ids(Object.keys(alts)[0]))[0];
      if (best !== null && best !== pen.token_ids[i]) wrong = { i, best, chose: pen.token_ids[i] };
      if (pen.token_ids[i] !== top) changed++;
      counts.set(pen.token_ids[i], (counts.get(pen.token_ids[i]) || 0) + 1);
    }
    ok(!wrong && changed > 0, `openai: each penalized greedy pick follows OpenAI's penalty arithmetic on the logprobs (${changed} picks moved by it)`, wrong);
  }

  // ---- n ----
  {
    const req = { model, messages: user("Say something."), max_tokens: 12, temperature: 1, seed: 40, ...noThink };
    const r = await openai.chat.completions.create({ ...req, n: 3 });
    const one = [];
    for (let i = 0; i < 3; i++) one.push((await openai.chat.completions.create({ ...req, seed: 40 + i })).choices[0].message.content);
    ok(r.choices.length === 3 && r.choices.every((c, i) => c.index === i && c.message.content === one[i]),
       "openai: n 3 with seed 40: choice i is the same request with seed 40 + i", { n: r.choices.map((c) => c.message.content), one });
    ok(r.usage.completion_tokens === 36 && r.usage.prompt_tokens > 0, "openai: n 3: usage counts every choice's tokens", r.usage);
    const texts = ["", "", ""], fins = [null, null, null];
    let usage = null;
    for await (const ch of await openai.chat.completions.create({ ...req, n: 3, stream: true, stream_options: { include_usage: true } })) {
      if (ch.usage) usage = ch.usage;
      for (const c of ch.choices) { texts[c.index] += c.delta?.content || ""; if (c.finish_reason) fins[c.index] = c.finish_reason; }
    }
    ok(texts.every((t, i) => t === one[i]) && fins.every((f, i) => f === r.choices[i].finish_reason) &&
       ["prompt_tokens", "completion_tokens", "total_tokens"].every((k) => usage?.[k] === r.usage[k]), "openai: n 3 streamed: choices by index, each == seed 40 + i alone, its own finish_reason, usage once at the end",
       { texts, one, usage, whole: r.usage });
    const cr = { model, prompt: "Once", max_tokens: 10, temperature: 1, seed: 90 };
    const cn = await openai.completions.create({ ...cr, n: 2 });
    const c1 = (await openai.completions.create({ ...cr, seed: 91 })).choices[0].text;
    const ctexts = ["", ""];
    for await (const ch of await openai.completions.create({ ...cr, n: 2, stream: true })) for (const c of ch.choices) ctexts[c.index] += c.text;
    ok(cn.choices[1].text === c1 && ctexts[1] === c1 && ctexts[0] === cn.choices[0].text, "openai: completions n 2 (streamed and not): choice 1 == seed + 1 alone", { cn: cn.choices.map((c) => c.text), c1, ctexts });
  }

  // ---- LangChain ----
  {
    const schema = z.object({ city: z.string().max(10), population: z.number().int(), coastal: z.boolean() });
    const js = z.toJSONSchema(schema);
    const llm = new ChatOpenAI({ model, apiKey, configuration: { baseURL }, maxRetries: 0, maxTokens: 600, temperature: 1,
      modelKwargs: noThink });
    for (const method of ["functionCalling", "jsonMode", "jsonSchema"]) {
      const bad = [];
      for (let seed = 1; seed <= Math.min(SEEDS, 3); seed++) {
        const s = llm.withConfig({ seed }).withStructuredOutput(schema, { method, includeRaw: true });
        const r = await s.invoke("Describe a city.", { seed });
        // jsonMode promises JSON only (not the schema): the parsed object is checked when it parsed
        const raw = method === "functionCalling" ? r.raw.tool_calls?.[0]?.args : r.parsed;
        if (method === "jsonMode") { if (r.parsed === null && !r.raw.content.trim().startsWith("{")) bad.push({ seed, raw: r.raw.content }); }
        else if (!r.parsed || !ajv.validate(js, raw)) bad.push({ seed, parsed: r.parsed, raw: r.raw.content, err: ajv.errorsText() });
      }
      ok(!bad.length, `LangChain withStructuredOutput (${method}): ${method === "jsonMode" ? "JSON" : "schema-valid, parsed by zod"}`, bad[0]);
    }
  }

  // ---- the AI SDK ----
  {
    const provider = createOpenAICompatible({ name: "krun", baseURL, apiKey, supportsStructuredOutputs: true });
    const schema = { type: "object", properties: { title: { type: "string", maxLength: 20 }, score: { type: "number" },
      items: { type: "array", items: { type: "integer" }, maxItems: 4 } }, required: ["title", "score", "items"], additionalProperties: false };
    const bad = [];
    for (let seed = 1; seed <= Math.min(SEEDS, 3); seed++) {
      try {
        const r = await generateObject({ model: provider(model), schema: jsonSchema(schema), prompt: "An object.", seed, maxOutputTokens: 600,
          maxRetries: 0, providerOptions: { krun: noThink } });
        if (!ajv.validate(schema, r.object)) bad.push({ seed, object: r.object, err: ajv.errorsText() });
      } catch (e) { bad.push({ seed, error: String(e).slice(0, 300) }); }
    }
    ok(!bad.length, "AI SDK generateObject (openai-compatible, structured outputs): schema-valid objects", bad[0]);
  }

  // ---- the Anthropic SDK ----
  {
    const anthropic = new Anthropic({ baseURL: root, apiKey, maxRetries: 0, timeout: 300000 });
    const m = await anthropic.messages.create({ model, max_tokens: 16, messages: user("Hello"), temperature: 0.5, system: "Be brief." });
    ok(m.type === "message" && m.role === "assistant" && m.content[0]?.type === "text" && m.usage.output_tokens > 0 &&
       ["end_turn", "max_tokens"].includes(m.stop_reason), "Anthropic SDK: messages.create", m);
    const st = anthropic.messages.stream({ model, max_tokens: 16, messages: user("Hello"), temperature: 0.5, system: "Be brief." });
    let text = "";
    st.on("text", (t) => { text += t; });
    const fin = await st.finalMessage();
    ok(fin.content[0]?.type === "text" && fin.content[0].text === text && text.length > 0 && fin.usage.output_tokens > 0,
       "Anthropic SDK: messages.stream: text events add up to the final message", { text, fin });
    const tm = await anthropic.messages.create({ model, max_tokens: 600, messages: user("Weather in Paris?"),
      tools: [{ name: "weather", description: "the weather", input_schema: person }], tool_choice: { type: "tool", name: "weather" } });
    const tu = tm.content.find((b) => b.type === "tool_use");
    ok(tm.stop_reason === "tool_use" && tu && tu.name === "weather" && ajv.validate(person, tu.input),
       "Anthropic SDK: tool_choice {type: tool}: a tool_use block with schema-valid input", tm);
    ok(/^toolu_[A-Za-z0-9]+$/.test(tu?.id || ""), "Anthropic SDK: the tool_use id looks like Anthropic's (toolu_...)", tu?.id);
    const ts = anthropic.messages.stream({ model, max_tokens: 600, messages: user("Weather in Paris?"),
      tools: [{ name: "weather", description: "the weather", input_schema: person }], tool_choice: { type: "tool", name: "weather" } });
    const tsf = await ts.finalMessage();
    const tsu = tsf.content.find((b) => b.type === "tool_use");
    ok(/^toolu_[A-Za-z0-9]+$/.test(tsu?.id || "") && ajv.validate(person, tsu.input), "Anthropic SDK: streamed tool_use: toolu_ id, schema-valid input", tsu);
    const follow = await anthropic.messages.create({ model, max_tokens: 8, messages: [
      { role: "user", content: "Weather in Paris?" }, { role: "assistant", content: tm.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: tu?.id ?? "x", content: "sunny" }] }],
      tools: [{ name: "weather", description: "the weather", input_schema: person }] });
    ok(follow.type === "message" && follow.content.length > 0, "Anthropic SDK: a tool_result turn is answered", follow);
    try {
      await anthropic.messages.create({ model, max_tokens: 8, messages: [{ role: "user", content: [{ type: "image", source: {} }] }] });
      ok(false, "Anthropic SDK: an image block is refused");
    } catch (e) {
      ok(e.status === 400 && e.error?.type === "error" && /messages\.0\.content\.0/.test(e.message),
         "Anthropic SDK: a malformed body: 400 in Anthropic's error shape, naming the field", { status: e.status, message: e.message });
    }
  }
}

main().then(() => process.exit(failures ? 1 : 0), (e) => { console.log(`not ok - unexpected error: ${e.stack || e}`); process.exit(1); });
