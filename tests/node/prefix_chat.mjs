// A multi-turn conversation with krun serve through the official `openai` npm client, as a
// stateless client holds one: every request sends the whole conversation again, the previous
// replies as the server wrote them (their content; reasoning_content is dropped, as clients do).
// Usage: node prefix_chat.mjs BASE_URL MODEL STATE.json TURNS [--stream-last]
// STATE.json: {"system": "...", "users": ["...", ...], "params": {...}, "per_turn": [{...}, ...],
//              "messages": [...], "results": [...]}, read and written back: the next TURNS user
// messages are sent (so a conversation can go on against another server, e.g. after a restart).
// Each result: prompt_ids and token_ids (return_token_ids), content, reasoning, finish, usage, and
// seconds (the request's wall time); with KRUN_PID set (the server's pid, same machine), read_bytes:
// what the server read from storage during the request (/proc/PID/io).
// --stream-last: then the last request again, streamed with include_usage (a prompt the cache
// holds whole): its text and its usage chunk are recorded as "streamed_again".
import OpenAI from "openai";
import { readFileSync, writeFileSync } from "node:fs";

const pid = process.env.KRUN_PID;
const readBytes = () => (pid ? Number(/read_bytes: (\d+)/.exec(readFileSync(`/proc/${pid}/io`, "utf8"))[1]) : null);

const [baseURL, model, statePath, turnsArg, flag] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0, timeout: 1000 * Number(process.env.PREFIX_TIMEOUT_S ?? 120) });
const st = JSON.parse(readFileSync(statePath, "utf8"));
st.messages ??= st.system ? [{ role: "system", content: st.system }] : [];
st.results ??= [];
let last = null;
for (let k = 0; k < Number(turnsArg); k++) {
  const turn = st.results.length;
  st.messages.push({ role: "user", content: st.users[turn] });
  const body = { model, messages: [...st.messages], ...st.params, ...(st.per_turn?.[turn] ?? {}), return_token_ids: true };
  const b0 = readBytes(), t0 = process.hrtime.bigint();
  const r = await client.chat.completions.create(body);
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9, b1 = readBytes();
  const c = r.choices[0];
  st.results.push({
    prompt_ids: r.prompt_token_ids, token_ids: c.token_ids, content: c.message.content ?? "",
    reasoning: c.message.reasoning_content ?? "", finish: c.finish_reason, usage: r.usage,
    seconds, read_bytes: pid ? b1 - b0 : null,
  });
  st.messages.push({ role: "assistant", content: c.message.content ?? "" });
  last = body;
}
if (flag === "--stream-last" && last) {
  const { return_token_ids, ...plain } = last;
  let content = "", reasoning = "", usage = null;
  for await (const chunk of await client.chat.completions.create({ ...plain, stream: true, stream_options: { include_usage: true } })) {
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) { content += ch.delta.content ?? ""; reasoning += ch.delta.reasoning_content ?? ""; }
  }
  st.streamed_again = { content, reasoning, usage };
}
writeFileSync(statePath, JSON.stringify(st));
