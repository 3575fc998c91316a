// krun serve through the official `openai` npm client (package.json pins it; `npm ci` here).
// Usage: node openai_client.mjs BASE_URL API_KEY MODEL   (prints TAP-like lines; run by
// tests/cli/test_krun_serve.sh against a tiny model with the real tokenizer)
import OpenAI from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
let failures = 0;
const ok = (cond, what, detail) => {
  console.log(`${cond ? "ok" : "not ok"} - openai npm client: ${what}${cond || detail === undefined ? "" : ": " + JSON.stringify(detail).slice(0, 400)}`);
  if (!cond) failures++;
};
const user = (text) => [{ role: "user", content: text }];

async function chatWhole(params) {
  const r = await client.chat.completions.create(params);
  const c = r.choices[0];
  return { content: c.message.content, reasoning: c.message.reasoning_content ?? "", finish: c.finish_reason, tokens: r.usage.completion_tokens };
}

async function chatStream(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let content = "", reasoning = "", finish = null, tokens = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) tokens = chunk.usage.completion_tokens;
    for (const c of chunk.choices) {
      content += c.delta.content ?? "";
      reasoning += c.delta.reasoning_content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { content, reasoning, finish, tokens, chunks };
}

async function completion(params) {
  const r = await client.completions.create(params);
  return { text: r.choices[0].text, finish: r.choices[0].finish_reason, tokens: r.usage.completion_tokens };
}

async function status(promise) {
  try { await promise; return { status: 200 }; } catch (e) { return { status: e.status, name: e.constructor.name, error: e.error }; }
}

try {
  const models = await client.models.list();
  ok(models.data.some((m) => m.id === model), `models.list() has "${model}"`, models.data);

  // mostly greedy: sampling at a temperature sorts the whole 163,840-id vocabulary per token
  const base = { model, messages: user("Hello, who are you?"), max_tokens: 16, temperature: 0.7, seed: 3 };
  const whole = await chatWhole(base);
  ok(typeof whole.content === "string" && whole.reasoning.length > 0 && ["stop", "length"].includes(whole.finish) && whole.tokens > 0,
    "chat.completions.create: content, reasoning_content, finish_reason, usage", whole);
  const streamed = await chatStream(base);
  ok(streamed.content === whole.content && streamed.reasoning === whole.reasoning && streamed.finish === whole.finish && streamed.tokens === whole.tokens &&
    streamed.chunks > 5, `streamed chat (${streamed.chunks} chunks) says exactly what the whole response says`, { whole, streamed });

  const plain = await chatWhole({ ...base, temperature: 0, reasoning_effort: "none" });
  ok(plain.reasoning === "", "reasoning_effort none: no reasoning_content", plain);

  const cbase = { model, prompt: "The quick brown fox", max_tokens: 16, temperature: 0 };
  const c1 = await completion(cbase);
  let ctext = "";
  for await (const chunk of await client.completions.create({ ...cbase, stream: true })) ctext += chunk.choices[0]?.text ?? "";
  ok(c1.text.length > 0 && c1.text === ctext && c1.tokens <= 16, "completions.create, whole and streamed, agree", { c1, ctext });

  // four at once (two streamed) == each alone
  const reqs = [
    () => chatWhole({ model, messages: user("One"), max_tokens: 8, temperature: 0.9, seed: 11 }),
    () => chatStream({ model, messages: user("Two, a longer question about the weather in Paris in spring?"), max_tokens: 28, temperature: 0 }),
    () => completion({ model, prompt: "Three", max_tokens: 18, temperature: 0 }),
    () => chatStream({ model, messages: user("Four"), max_tokens: 12, temperature: 0, reasoning_effort: "low" }),
    () => chatWhole({ model, messages: user("Five"), max_tokens: 15, temperature: 0 }),
  ];
  const alone = [];
  for (const r of reqs) alone.push(await r());
  const together = await Promise.all(reqs.map((r) => r()));
  const strip = (x) => { const { chunks, ...rest } = x; return JSON.stringify(rest); };
  ok(alone.every((a, i) => strip(a) === strip(together[i])), `${reqs.length} concurrent requests == each alone`, { alone, together });

  const bad = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
  const a = await status(bad.chat.completions.create(base));
  ok(a.status === 401 && a.name === "AuthenticationError", "a wrong API key: AuthenticationError (401)", a);
  const b = await status(client.chat.completions.create({ ...base, temperature: 9 }));
  ok(b.status === 400 && b.name === "BadRequestError" && /temperature/.test(b.error?.message ?? ""), "temperature 9: BadRequestError (400) naming it", b);
  const n = await status(client.chat.completions.create({ ...base, model: "gpt-4o" }));
  ok(n.status === 404 && n.name === "NotFoundError", "an unknown model: NotFoundError (404)", n);
  const l = await status(client.completions.create({ model, prompt: "x ".repeat(3000), max_tokens: 1 }));
  ok(l.status === 400 && /context/.test(l.error?.message ?? ""), "a prompt longer than the context: 400", l);
} catch (e) {
  ok(false, "unexpected exception", String(e?.stack ?? e));
}
process.exit(failures ? 1 : 0);
