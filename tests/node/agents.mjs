// krun serve for the clients agents are built on (issue 31), against a tiny model with the real tokenizer
// whose replies end (k3synth --end-weight), served with --reasoning-effort none: the openai client's
// Responses API (plain, streamed, function tools, stored responses, zodTextFormat) and chat.completions.parse
// with every zod helper agents use, the AI SDK's default OpenAI provider (Responses: generateText,
// streamText, tools with stopWhen, generateObject), the OpenAI Agents SDK (a strict tool), LangChain
// (useResponsesApi, withStructuredOutput with .email() and .regex(), tool_choice "any" on OpenAI and
// Anthropic), the AI SDK's Anthropic provider (generateObject), the Anthropic SDK (messages.parse with
// zodOutputFormat, adaptive thinking, a prefill, cache usage), and the ollama client.  Every structured
// reply is checked with ajv and ajv-formats against the schema the client sent, and by the client's own
// zod parse.  Usage: node agents.mjs BASE_URL API_KEY MODEL   (TAP-like lines; tests/cli/test_krun_serve_agents.sh)
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { zodOutputFormat } from "@anthropic-ai/sdk/helpers/zod";
import { zodResponseFormat, zodTextFormat } from "openai/helpers/zod";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { generateObject, generateText, stepCountIs, streamText, tool as aiTool } from "ai";
import { Agent, run, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled, tool as agentTool } from "@openai/agents";
import { ChatOpenAI } from "@langchain/openai";
import { ChatAnthropic } from "@langchain/anthropic";
import { Ollama } from "ollama";
import Ajv from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { z } from "zod";

const [baseURL, apiKey, model] = process.argv.slice(2);
const root = baseURL.replace(/\/v1$/, "");
const ajv = new Ajv({ strict: false, logger: false });
addFormats(ajv);
let failures = 0;
const ok = (cond, what, detail) => {
  console.log(`${cond ? "ok" : "not ok"} - ${what}${cond || detail === undefined ? "" : ": " + JSON.stringify(detail).slice(0, 500)}`);
  if (!cond) failures++;
};
const check = async (what, f) => {
  try { await f(); } catch (e) { ok(false, what, String(e.stack || e).slice(0, 600)); }
};
// ($schema dropped: the clients write draft-07's or 2020-12's, the keywords used mean the same in both)
const valid = (schema, value) => { const { $schema, ...s } = schema; return ajv.validate(s, value) ? null : ajv.errorsText(); };
const openai = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 300000 });

// every zod helper the issue names, bounded so that a random model's strings end
const helpers = z.object({
  email: z.string().email().max(30),
  url: z.string().url().max(30),
  uuid: z.string().uuid(),
  date: z.string().date(),
  datetime: z.string().datetime().max(30),
  regex: z.string().regex(/^[a-z]{2,5}-\d{3}$/),
  prefix: z.string().startsWith("ab").max(8),
  positive: z.number().positive().max(1000),
  above: z.number().int().min(5).max(50),
  third: z.number().int().multipleOf(3).min(0).max(99),
  tags: z.array(z.enum(["x", "y"])).max(3),
});

async function main() {
  // ---- the openai client: the Responses API ----
  await check("openai responses", async () => {
    const r = await openai.responses.create({ model, input: "Hello!", max_output_tokens: 60 });
    ok(r.object === "response" && ["completed", "incomplete"].includes(r.status) && typeof r.output_text === "string" &&
       r.usage.input_tokens > 0 && r.usage.output_tokens > 0 && r.usage.input_tokens_details.cached_tokens >= 0 &&
       r.usage.output_tokens_details.reasoning_tokens === 0 && r.output.every((i) => i.type !== "reasoning"),
       "openai responses.create: a response (output_text, usage with cached and reasoning tokens; --reasoning-effort none: no reasoning item)", r);
    const again = await openai.responses.create({ model, input: "Hello!", max_output_tokens: 60 });
    ok(again.usage.input_tokens_details.cached_tokens > 0, "openai responses.create twice: the second's prompt from the prefix cache (cached_tokens)", again.usage);
    const th = await openai.responses.create({ model, input: "Think.", max_output_tokens: 8, reasoning: { effort: "low" } });
    ok(th.output[0]?.type === "reasoning" && th.output[0].content?.[0]?.type === "reasoning_text" && th.usage.output_tokens_details.reasoning_tokens > 0,
       "openai responses.create with reasoning.effort low: a reasoning item (reasoning_text), reasoning_tokens counted", th.output[0]);
    // streamed: the client's own stream helper accumulates the same kind of response
    const st = openai.responses.stream({ model, input: "Tell me a story.", max_output_tokens: 60 });
    const types = [], seqs = [];
    let text = "";
    st.on("event", (ev) => { types.push(ev.type); seqs.push(ev.sequence_number); if (ev.type === "response.output_text.delta") text += ev.delta; });
    const fin = await st.finalResponse();
    ok(types[0] === "response.created" && types[1] === "response.in_progress" && ["response.completed", "response.incomplete"].includes(types.at(-1)) &&
       seqs.every((s, i) => s === i) && fin.output_text === text && types.includes("response.output_item.added") && types.includes("response.output_item.done"),
       "openai responses.stream: created, in_progress, items added/done, text deltas adding up to finalResponse().output_text, sequence numbers 0, 1, 2...", types);
    // function tools: a call, its output sent back with previous_response_id
    const tools = [{ type: "function", name: "weather", description: "the weather", parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 } },
      required: ["city"], additionalProperties: false }, strict: true }];
    const c = await openai.responses.create({ model, input: "Weather in Paris?", tools, tool_choice: "required", max_output_tokens: 200 });
    const call = c.output.find((i) => i.type === "function_call");
    ok(call && call.name === "weather" && !valid(tools[0].parameters, JSON.parse(call.arguments)) && /^call_/.test(call.call_id),
       "openai responses with tool_choice required: a function_call item, arguments valid against the strict tool", c.output);
    const next = await openai.responses.create({ model, previous_response_id: c.id, tools, max_output_tokens: 40,
      input: [{ type: "function_call_output", call_id: call?.call_id ?? "x", output: "sunny" }] });
    ok(next.previous_response_id === c.id && next.usage.input_tokens > c.usage.input_tokens && next.usage.input_tokens_details.cached_tokens > 0,
       "openai responses with previous_response_id and a function_call_output: the conversation continues (its prompt from the prefix cache)", next.usage);
    const got = await openai.responses.retrieve(c.id);
    ok(got.id === c.id && JSON.stringify(got.output) === JSON.stringify(c.output), "openai responses.retrieve: the stored response");
    const del = await openai.responses.delete(c.id).then(() => true, (e) => e);
    let gone = false;
    try { await openai.responses.retrieve(c.id); } catch (e) { gone = e.status === 404; }
    ok(del === true && gone, "openai responses.delete: gone, then 404", del);
    let notFound = false;
    try { await openai.responses.create({ model, input: "x", previous_response_id: "resp_nonexistent" }); } catch (e) { notFound = e.status === 404 && e.code === "previous_response_not_found"; }
    ok(notFound, "openai responses with an unknown previous_response_id: 404 previous_response_not_found");
    // text.format with zodTextFormat: parsed by the client, valid for ajv
    const schema = z.object({ name: z.string().max(12), email: z.string().email().max(30), n: z.number().int().positive().max(9) });
    const p = await openai.responses.parse({ model, input: "A person.", max_output_tokens: 400, text: { format: zodTextFormat(schema, "person") } });
    ok(p.status === "completed" && p.output_parsed && !valid(z.toJSONSchema(schema), p.output_parsed), "openai responses.parse with zodTextFormat: output_parsed, valid", p.output_text);
    const m = await openai.models.retrieve(model);
    ok(m.id === model && m.object === "model", "openai models.retrieve: GET /v1/models/ID", m);
  });

  // ---- the openai client: chat.completions.parse with every zod helper ----
  await check("openai chat parse", async () => {
    const rf = zodResponseFormat(helpers, "helpers");
    const bad = [];
    for (let seed = 1; seed <= 3; seed++) {
      const r = await openai.chat.completions.parse({ model, messages: [{ role: "user", content: "Fill it in." }], max_tokens: 1500, seed, response_format: rf });
      const c = r.choices[0];
      const why = c.finish_reason !== "stop" ? "finish " + c.finish_reason : !c.message.parsed ? "not parsed" : valid(rf.json_schema.schema, c.message.parsed);
      if (why) bad.push({ seed, why, content: c.message.content });
    }
    ok(!bad.length, "openai chat.completions.parse with .email .url .uuid .date .datetime .regex .startsWith .positive .min(5) .multipleOf(3): parsed by zod, valid for ajv + ajv-formats (3 seeds)", bad[0]);
    const forced = await openai.chat.completions.create({ model, messages: [{ role: "user", content: "x" }], max_tokens: 300, tool_choice: "required", parallel_tool_calls: false,
      tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { a: { type: "integer", minimum: 1, maximum: 9 } }, required: ["a"] } } }] });
    const calls = forced.choices[0].message.tool_calls || [];
    ok(forced.choices[0].finish_reason === "tool_calls" && calls.length === 1 && JSON.parse(calls[0].function.arguments).a >= 1,
       "openai chat with tool_choice required and parallel_tool_calls false: exactly one call, its arguments valid (not a strict tool)", forced.choices[0]);
    const long = await openai.chat.completions.create({ model, messages: [{ role: "user", content: "x" }], max_tokens: 1000000, seed: 1 });
    ok(long.choices[0].finish_reason && long.usage.completion_tokens > 0, "openai chat with max_tokens 1000000 (far beyond --ctx): served (up to the context)", long.usage);
  });

  // ---- the AI SDK's default OpenAI provider: the Responses API ----
  await check("AI SDK openai", async () => {
    const provider = createOpenAI({ baseURL, apiKey });
    const t = await generateText({ model: provider(model), prompt: "Hello", maxOutputTokens: 60, maxRetries: 0 });
    ok(typeof t.text === "string" && ["stop", "length"].includes(t.finishReason), "AI SDK openai(): generateText", { finish: t.finishReason });
    const s = streamText({ model: provider(model), prompt: "Hello", maxOutputTokens: 60, maxRetries: 0 });
    let text = "";
    for await (const d of s.textStream) text += d;
    ok(text === (await s.text), "AI SDK openai(): streamText, the deltas add up", text);
    let ran = 0;
    const tt = await generateText({ model: provider(model), prompt: "Weather in Paris?", maxOutputTokens: 300, maxRetries: 0, toolChoice: "required",
      tools: { weather: aiTool({ description: "the weather", inputSchema: z.object({ city: z.string().max(12) }), execute: async ({ city }) => { ran++; return { city, celsius: 21 }; } }) },
      stopWhen: stepCountIs(2) });
    ok(ran >= 1 && tt.steps.length === 2 && tt.steps[0].toolCalls.every((c) => typeof c.input.city === "string"),
       "AI SDK openai(): tools with stopWhen: the tool ran, its result sent back, two steps", { ran, steps: tt.steps.length });
    const schema = z.object({ title: z.string().max(16), score: z.number().min(0).max(10), tags: z.array(z.string().max(6)).max(3) });
    const o = await generateObject({ model: provider(model), schema, prompt: "An object.", maxOutputTokens: 500, maxRetries: 0 });
    ok(!valid(z.toJSONSchema(schema), o.object), "AI SDK openai(): generateObject (text.format json_schema): a valid object", o.object);
  });

  // ---- the OpenAI Agents SDK: an agent with a strict tool, on the Responses API ----
  await check("OpenAI Agents", async () => {
    setDefaultOpenAIClient(openai);
    setOpenAIAPI("responses");
    setTracingDisabled(true);
    let got = null;
    const weather = agentTool({ name: "weather", description: "the weather", parameters: z.object({ city: z.string().max(12), days: z.number().int().min(1).max(7) }),
      execute: async (args) => { got = args; return `sunny in ${args.city} for ${args.days} days`; } });
    const agent = new Agent({ name: "forecaster", instructions: "Answer briefly.", model, tools: [weather],
      modelSettings: { toolChoice: "required", maxTokens: 300 }, toolUseBehavior: "stop_on_first_tool" });
    const res = await run(agent, "Weather in Paris?", { maxTurns: 3 });
    ok(got && got.days >= 1 && got.days <= 7 && typeof res.finalOutput === "string" && res.finalOutput.startsWith("sunny in"),
       "OpenAI Agents SDK: run() with a strict tool (zod): the tool called with valid arguments, its result the final output", { got, out: res.finalOutput });
  });

  // ---- LangChain ----
  await check("LangChain", async () => {
    const lc = new ChatOpenAI({ model, apiKey, configuration: { baseURL }, useResponsesApi: true, maxRetries: 0, maxTokens: 400 });
    const m = await lc.invoke("Hello");
    ok(Array.isArray(m.content) || typeof m.content === "string", "LangChain ChatOpenAI useResponsesApi: invoke", m.content);
    const schema = z.object({ email: z.string().email().max(30), code: z.string().regex(/^[A-Z]{3}-\d{2}$/) });
    const so = await lc.withStructuredOutput(schema).invoke("A contact.");
    ok(!valid(z.toJSONSchema(schema), so), "LangChain withStructuredOutput with .email() and .regex() (Responses API): parsed, valid", so);
    const chat = new ChatOpenAI({ model, apiKey, configuration: { baseURL }, maxRetries: 0, maxTokens: 300 });
    const fn = { type: "function", function: { name: "lookup", description: "look it up", parameters: { type: "object", properties: { id: { type: "integer" } }, required: ["id"] } } };
    const t = await chat.bindTools([fn], { tool_choice: "any" }).invoke("Look it up.");
    ok(t.tool_calls?.length >= 1 && t.tool_calls.every((c) => c.name === "lookup" && Number.isInteger(c.args.id)), "LangChain ChatOpenAI tool_choice \"any\": calls, arguments valid", t.tool_calls);
    const la = new ChatAnthropic({ model, apiKey, anthropicApiUrl: root, maxRetries: 0, maxTokens: 300 });
    const ta = await la.bindTools([{ name: "lookup", description: "look it up", input_schema: fn.function.parameters }], { tool_choice: "any" }).invoke("Look it up.");
    ok(ta.tool_calls?.length >= 1 && ta.tool_calls.every((c) => c.name === "lookup" && Number.isInteger(c.args.id)), "LangChain ChatAnthropic tool_choice \"any\": tool_use, input valid", ta.tool_calls);
  });

  // ---- the AI SDK's Anthropic provider ----
  await check("AI SDK anthropic", async () => {
    const provider = createAnthropic({ baseURL, apiKey });
    const schema = z.object({ name: z.string().max(10), ok: z.boolean(), n: z.number().int().min(1).max(99) });
    const o = await generateObject({ model: provider(model), schema, prompt: "An object.", maxOutputTokens: 400, maxRetries: 0 });
    ok(!valid(z.toJSONSchema(schema), o.object), "AI SDK anthropic(): generateObject: a valid object", o.object);
  });

  // ---- the Anthropic SDK ----
  await check("Anthropic SDK", async () => {
    const anthropic = new Anthropic({ baseURL: root, apiKey, maxRetries: 0, timeout: 300000 });
    // the SDK moves constraints it thinks Anthropic lacks into descriptions and checks them itself: enums, booleans, integers
    const fmt = zodOutputFormat(z.object({ n: z.number().int(), ok: z.boolean(), kind: z.enum(["a", "b"]) }));
    const pm = await anthropic.messages.parse({ model, max_tokens: 400, messages: [{ role: "user", content: "x" }], output_config: { format: fmt } });
    ok(pm.parsed_output && typeof pm.parsed_output.ok === "boolean" && !valid(fmt.schema, pm.parsed_output), "Anthropic SDK messages.parse with zodOutputFormat (output_config.format): parsed_output, valid", pm.content);
    const ad = await anthropic.messages.create({ model, max_tokens: 16, thinking: { type: "adaptive" }, output_config: { effort: "low" }, messages: [{ role: "user", content: "x" }] });
    ok(ad.content[0]?.type === "thinking", "Anthropic SDK thinking {type: adaptive} with output_config.effort: accepted, a thinking block", ad.content.map((b) => b.type));
    const pf = await anthropic.messages.create({ model, max_tokens: 8, messages: [{ role: "user", content: "Say it." }, { role: "assistant", content: "The answer is" }] });
    ok(pf.content[0]?.type === "text" && ["end_turn", "max_tokens"].includes(pf.stop_reason), "Anthropic SDK: a final assistant message (prefill) continued", pf.content);
    const req = { model, max_tokens: 8, system: "You are terse.", messages: [{ role: "user", content: "Same question again." }] };
    await anthropic.messages.create(req);
    const cached = await anthropic.messages.create(req);
    ok(cached.usage.cache_read_input_tokens > 0 && cached.usage.cache_creation_input_tokens === 0 && cached.usage.input_tokens >= 0,
       "Anthropic SDK: the same request again: usage.cache_read_input_tokens > 0 (the prefix cache), input_tokens the rest", cached.usage);
    let named = null;
    try {
      await anthropic.messages.create({ model, max_tokens: 8, messages: [{ role: "user", content: "x" }], tool_choice: { type: "tool", name: "t" },
        tools: [{ name: "t", input_schema: { type: "object", properties: { x: { not: { type: "string" } } } } }] });
    } catch (e) { named = e; }
    ok(named?.status === 400 && /tools\.0\.input_schema\.properties\.x\.not/.test(named.message) && !/function\.parameters/.test(named.message),
       "Anthropic SDK: a tool schema krun cannot enforce: 400 naming tools.0.input_schema... (Anthropic's path)", named?.message);
  });

  // ---- the ollama client ----
  await check("ollama", async () => {
    const ollama = new Ollama({ host: root, headers: { Authorization: `Bearer ${apiKey}` } });
    const c = await ollama.chat({ model, messages: [{ role: "user", content: "Hello" }], stream: false, options: { num_predict: 20, seed: 3 } });
    ok(c.message?.role === "assistant" && typeof c.message.content === "string" && c.done && c.eval_count > 0 && c.prompt_eval_count > 0,
       "ollama chat: message, done, counts", c);
    let parts = 0, text = "", last = null;
    for await (const p of await ollama.chat({ model, messages: [{ role: "user", content: "Hello" }], stream: true, options: { num_predict: 20, seed: 3 } })) {
      parts++;
      text += p.message?.content || "";
      last = p;
    }
    ok(parts >= 2 && last.done && text === c.message.content, "ollama chat streamed (NDJSON): the pieces add up to the same reply, the last one done", { parts, text });
    const j = await ollama.chat({ model, messages: [{ role: "user", content: "JSON" }], stream: false, format: { type: "object", properties: { a: { type: "integer" } }, required: ["a"] },
      options: { num_predict: 60 } });
    ok(Number.isInteger(JSON.parse(j.message.content).a), "ollama chat with format (a JSON Schema): the reply is valid JSON", j.message.content);
    const g = await ollama.generate({ model, prompt: "Once upon a time", stream: false, options: { num_predict: 8 } });
    ok(typeof g.response === "string" && g.done, "ollama generate", g);
    const list = await ollama.list();
    ok(list.models.some((m) => m.name === model), "ollama list (/api/tags): the model", list);
    const show = await ollama.show({ model });
    ok(show.capabilities?.includes("tools"), "ollama show: capabilities", show);
    const v = await ollama.version();
    ok(/^\d+\.\d+\.\d+$/.test(v.version), "ollama version", v);
  });
}

main().then(() => process.exit(failures ? 1 : 0), (e) => { console.log(`not ok - unexpected error: ${e.stack || e}`); process.exit(1); });
