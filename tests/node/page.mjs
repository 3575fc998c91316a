// The page krun serve answers GET / with, in a real browser: headless Chromium (the system's, never
// a downloaded one) driven by puppeteer-core.  Run by tests/cli/test_krun_serve_page.sh against a
// tiny model with the real tokenizer, streamed (--mem below the file) from a stripe set with a trunk
// member, served with --api-key on loopback; and a second server, open (no key) on 0.0.0.0.
// Usage: node page.mjs CHROMIUM URL KEY OPEN_URL OUTDIR [SLOW]   (prints TAP-like lines; screenshots
// of both views into OUTDIR)
import puppeteer from "puppeteer-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [chromium, url, key, openUrl, outDir, slowArg] = process.argv.slice(2);
const SLOW = Number(slowArg || 1);
const T = (ms) => ms * SLOW;
let failures = 0;
const ok = (cond, what, detail) => {
  console.log(`${cond ? "ok" : "not ok"} - page: ${what}${cond || detail === undefined ? "" : ": " + JSON.stringify(detail).slice(0, 500)}`);
  if (!cond) failures++;
  return cond;
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const auth = { Authorization: "Bearer " + key, "Content-Type": "application/json" };
const health = async () => (await fetch(url + "/health", { headers: auth })).json();

const profile = mkdtempSync(join(tmpdir(), "krun-page-"));
const browser = await puppeteer.launch({
  executablePath: chromium, headless: true, userDataDir: profile,
  // as root Chromium needs --no-sandbox; the rest keep it off the network (it would try Google's hosts) and quick
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions", "--mute-audio"],
});
const errors = [];
const watch = (page, name) => {
  page.on("console", (m) => { if (m.type() === "error") errors.push(`${name}: console: ${m.text()}`); });
  page.on("pageerror", (e) => errors.push(`${name}: uncaught: ${e.message}`));
  page.on("requestfailed", (r) => {
    // Stop aborts the chat request on purpose; nothing else may fail
    if (!(r.url().endsWith("/v1/chat/completions") && /ABORTED/.test(r.failure()?.errorText || ""))) errors.push(`${name}: request failed: ${r.url()} ${r.failure()?.errorText}`);
  });
  page.on("response", (r) => { if (r.status() >= 400) errors.push(`${name}: HTTP ${r.status()} for ${r.url()}`); });
};

try {
  const page = await browser.newPage();
  watch(page, "page");
  await page.setViewport({ width: 1280, height: 860 });

  // ---- the key: asked once, refused when wrong, kept in the browser --------------------------------
  await page.goto(url + "/");
  await page.waitForSelector("#key-dialog[open]", { timeout: T(10000) });
  ok(true, "without a key the page asks for one (/health says only the status, no request refused)");
  await page.type("#key-input", "not-the-key");
  await page.click("#key-save");
  await page.waitForFunction(() => document.getElementById("key-dialog").open && document.getElementById("key-why").classList.contains("error"),
    { timeout: T(10000) });
  ok(true, "a wrong key: the page says it was not accepted and asks again");
  await page.click("#key-input", { clickCount: 3 });
  await page.type("#key-input", key);
  await page.click("#key-save");
  await page.waitForFunction(() => !document.getElementById("key-dialog").open && document.getElementById("model-name").textContent !== "",
    { timeout: T(10000) });
  const stored = await page.evaluate(() => JSON.parse(localStorage.getItem("krun.key")));
  ok(stored === key, "the right key: the page works, the key kept in localStorage", stored);
  ok(await page.$eval("#open-banner", (e) => e.hidden), "with a key on loopback the page does not say the server is open");

  // ---- chat: a typed message streams the API's reply ------------------------------------------------
  const setting = async (id, value) => {
    await page.$eval("#settings", (d) => { d.open = true; });
    if (id === "s-thinking") await page.select("#" + id, value);
    else { await page.click("#" + id, { clickCount: 3 }); await page.keyboard.press("Backspace"); if (value !== "") await page.type("#" + id, value); }
  };
  await setting("s-temperature", "0");
  await setting("s-thinking", "none");
  await setting("s-max_tokens", "24");
  // Type (or, long, paste) a message and send it (Enter, or the edit's Send button); wait for the reply.
  const chat = async (text, how = "enter") => {
    const req = page.waitForRequest((r) => r.url().endsWith("/v1/chat/completions") && r.method() === "POST", { timeout: T(10000) });
    if (how === "enter") {
      if (text.length > 200) await page.$eval("#input", (e, t) => { e.value = t; }, text);
      else await page.type("#input", text);
      await page.focus("#input");
      await page.keyboard.press("Enter");
    } else {
      await how();
    }
    const body = JSON.parse((await req).postData());
    await page.waitForFunction(() => document.getElementById("stop").hidden, { timeout: T(60000) });
    return { body, ...(await last()) };
  };
  // The last reply as shown and as kept.
  const last = () => page.evaluate(() => {
    const ms = document.querySelectorAll("#messages .msg.assistant"), m = ms[ms.length - 1];
    const conv = JSON.parse(localStorage.getItem("krun.conversations")).find((c) => c.id === JSON.parse(localStorage.getItem("krun.current")));
    const kept = conv.messages[conv.messages.length - 1];
    return {
      shown: m.querySelector(".body").textContent, reasoning: m.querySelector("details.reasoning .text").textContent,
      folded: !m.querySelector("details.reasoning").open, reasoningHidden: m.querySelector("details.reasoning").hidden,
      meta: m.querySelector(".meta").textContent, kept, n: conv.messages.length, title: conv.title,
    };
  });
  // The same request through the API, not streamed.
  const api = async (body) => {
    const b = { ...body, stream: false };
    delete b.stream_options;
    const r = await fetch(url + "/v1/chat/completions", { method: "POST", headers: auth, body: JSON.stringify(b) });
    return (await r.json()).choices[0].message;
  };
  const same = async (what, r) => {
    const a = await api(r.body);
    ok(r.shown === a.content && r.kept.content === a.content && r.reasoning === (a.reasoning_content || "") &&
       (r.kept.reasoning || "") === (a.reasoning_content || ""), what,
       { shown: r.shown.slice(0, 80), api: (a.content || "").slice(0, 80), reasoning: r.reasoning.slice(0, 60), api_reasoning: (a.reasoning_content || "").slice(0, 60) });
    return a;
  };

  const r1 = await chat("Hello! Which disks do you read?");
  ok(r1.body.temperature === 0 && r1.body.reasoning_effort === "none" && r1.body.max_tokens === 24 && r1.body.stream === true &&
     JSON.stringify(r1.body.messages) === JSON.stringify([{ role: "user", content: "Hello! Which disks do you read?" }]),
     "the request: the typed message, the settings (temperature 0, thinking off, max_tokens 24), streamed", r1.body);
  await same("a typed message streams a reply equal to the API's for the same request (greedy): text shown == kept == API's", r1);
  ok(r1.shown.length > 0 && r1.kept.meta.usage && r1.kept.meta.usage.completion_tokens > 0 && /tokens/.test(r1.meta),
     "the reply's usage shown (tokens, seconds, prompt)", r1.meta);

  const r2 = await chat("And then?");
  const cached = (r2.kept.meta.usage.prompt_tokens_details || {}).cached_tokens;
  ok(r2.body.messages.length === 3 && r2.body.messages[1].role === "assistant" && r2.body.messages[1].content === r1.kept.content,
     "turn 2 sends the conversation back", r2.body.messages);
  await same("turn 2 == the API's", r2);
  ok(cached > 0 && r2.meta.includes(`(${cached} from the prefix cache)`), "turn 2: the prefix cache's hit shown (cached tokens)", r2.meta);

  const g = await chat(null, () => page.click("#messages .msg.last .regen-btn"));
  ok(g.n === 4 && g.kept.content === r2.kept.content && JSON.stringify(g.body.messages) === JSON.stringify(r2.body.messages),
     "regenerate: the last reply asked again with the same messages (greedy: the same reply)", { n: g.n });

  const e = await chat(null, async () => {
    await page.hover("#messages .msg.user");
    await page.click("#messages .msg.user .edit-btn");
    await page.waitForSelector("#messages textarea.edit");
    await page.$eval("#messages textarea.edit", (t) => { t.value = "An edited question."; });
    await page.click("#messages .msg .buttons .primary");
  });
  ok(e.n === 2 && JSON.stringify(e.body.messages) === JSON.stringify([{ role: "user", content: "An edited question." }]),
     "edit and resend: the conversation cut at the edited message, sent again", { n: e.n, messages: e.body.messages });
  await same("the edited message's reply == the API's", e);

  // thinking on, a system prompt, a new conversation: reasoning shown apart, folded
  await page.click("#new-chat");
  await page.$eval("#settings", (d) => { d.open = true; });
  await page.type("#system", "You are brief.");
  await setting("s-thinking", "max");
  await setting("s-max_tokens", "30");
  const t = await chat("Think about striping.");
  ok(t.body.reasoning_effort === "max" && t.body.messages[0].role === "system" && t.body.messages[0].content === "You are brief.",
     "a system prompt and thinking on (effort max) are sent", t.body);
  const ta = await same("thinking on: reasoning and text == the API's reasoning_content and content", t);
  ok(t.reasoning.length > 0 && !t.reasoningHidden && t.folded, "the reasoning shown apart, folded", t);
  ok(!!ta.reasoning_content, "(the tiny model reasons here)");
  await setting("s-thinking", "none");
  const t2 = await chat("Now answer in a line.");
  ok(t2.shown.length > 0 && t2.reasoningHidden, "thinking off in the same conversation: a reply without reasoning", t2);
  const nConv = await page.$$eval("#conversation-list li", (l) => l.length);
  ok(nConv === 2, "two conversations listed", nConv);

  // ---- a long prompt: its prefill progress from the SSE comments ------------------------------------
  await page.click("#new-chat");
  await setting("s-thinking", "none");
  await setting("s-max_tokens", "2");
  await page.evaluate(() => {
    window.__prefill = [];
    new MutationObserver(() => { const p = document.getElementById("prefill"); if (!p.hidden) window.__prefill.push(document.getElementById("prefill-text").textContent); })
      .observe(document.getElementById("prefill"), { subtree: true, childList: true, characterData: true, attributes: true });
  });
  const long = Array.from({ length: 120 }, (_, i) => `Line ${i}: the quick brown fox reads stripe ${i % 7} of the drive.`).join("\n");
  const p = await chat(long);
  const seen = await page.evaluate(() => window.__prefill);
  const P = p.kept.meta.usage.prompt_tokens;
  const nums = seen.map((s) => /reading the prompt: (\d+) \/ (\d+) positions/.exec(s)).filter(Boolean);
  ok(nums.length >= 2 && nums.every((m) => +m[2] === P) && +nums[nums.length - 1][1] > +nums[0][1] && seen.some((s) => /left$/.test(s)),
     `a ${P}-token prompt: its progress shown from the server's SSE comments (positions done / total rising, the rate and the time left)`, seen.slice(0, 4));
  ok(await page.$eval("#prefill", (e) => e.hidden), "the progress bar gone once the reply came");

  // ---- the machine view: live plots while a request runs on the streamed model; then stop ----------
  await page.click("#new-chat");
  await setting("s-max_tokens", "1500");
  const before = await health();
  ok(before.plan && before.plan.head_streamed, "the model streams (lm_head read every token within --mem)", before.plan && before.plan.head_streamed);
  await page.type("#input", "Tell me a long story about drives.");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector("#messages .msg.assistant .body").textContent.length > 0, { timeout: T(30000) });
  await page.setViewport({ width: 1280, height: 1400 });
  await page.click("#tab-machine");
  await page.select("#every", "1");
  await page.select("#window", "60");
  await page.waitForFunction(() => +document.querySelector("#drives svg[data-member='1']")?.dataset.points >= 4 &&
    +document.getElementById("plot-spt").dataset.points >= 3, { timeout: T(30000) });
  // the table is redrawn at every sample: wait for one that lists the request generating (the
  // request runs until stopped below; a sample taken between its tokens may list it as it was)
  const running = await page.waitForFunction(() => [...document.querySelectorAll("#requests tbody tr")].some((tr) => tr.children[1]?.textContent === "generating"),
    { timeout: T(10000) }).then(() => true, () => false);
  const plots = await page.evaluate(() => {
    const d = (s) => ({ points: +s.dataset.points, max: +s.dataset.max, lines: s.querySelectorAll("polyline:not(.limit)").length,
                        level: s.querySelectorAll("polyline.limit").length });
    return {
      drives: [...document.querySelectorAll("#drives svg")].map(d), spt: d(document.getElementById("plot-spt")),
      bpt: d(document.getElementById("plot-bpt")), hits: d(document.getElementById("plot-hits")), batch: d(document.getElementById("plot-batch")),
      rows: [...document.querySelectorAll("#requests tbody tr")].map((tr) => [...tr.children].map((td) => td.textContent)),
      plan: document.querySelectorAll("#plan .stack > div:not(.rss)").length, layers: [...document.querySelectorAll("#plan .layers > span")].map((s) => s.className),
      names: [...document.querySelectorAll("#drives .name b")].map((b) => b.textContent),
    };
  });
  const during = await health();
  const dec = (s) => ({ bytes: s.bytes_read - s.prefill_bytes_read, tokens: s.generated_tokens - s.prefill_generated_tokens });
  const bpt = dec(during.stats).bytes / dec(during.stats).tokens;
  ok(plots.drives.length === 4 && plots.names.join("|") === "member 0 · entry|member 1 · trunk (plain)|member 2 · stripe 0|member 3 · stripe 1",
     "a plot per member file of the set, named by role", plots.names);
  ok(plots.drives[1].points >= 4 && plots.drives[1].max > 1e6 && plots.drives[1].lines >= 1 && plots.drives[1].level === 1,
     "the trunk member's bytes per second plotted from live data, against the speed it delivers while busy", plots.drives[1]);
  ok(plots.bpt.points >= 3 && plots.bpt.max > 0.5 * bpt && plots.bpt.max < 2 * bpt,
     `bytes per generated token plotted (max ${(plots.bpt.max / 1e6).toFixed(1)} MB; the server's decoding sweeps: ${(bpt / 1e6).toFixed(1)} MB)`, plots.bpt);
  ok(plots.spt.points >= 3 && plots.spt.max > 0, "seconds per generated token plotted", plots.spt);
  ok(plots.hits.points >= 3 && plots.batch.points >= 3 && plots.batch.max >= 1, "expert cache hit rate and positions per sweep plotted", [plots.hits, plots.batch]);
  ok(running, "the running request listed with its state", { rows: plots.rows, health: during.requests });
  ok(plots.plan >= 4 && plots.layers.join(" ") === "pinned pinned pinned head streamed",
     "the memory plan drawn: the budget's parts, 3 pinned layers and lm_head streamed", plots);
  await page.screenshot({ path: join(outDir, "machine.png") });
  await page.setViewport({ width: 1280, height: 860 });
  await page.click("#tab-chat");
  const cancelled0 = (await health()).stats.cancelled;
  await page.click("#stop");
  await page.waitForFunction(() => document.getElementById("stop").hidden, { timeout: T(10000) });
  let h = await health();
  for (let i = 0; i < 50 * SLOW && h.live_sequences; i++) { await sleep(100); h = await health(); }
  const s = await last();
  ok(h.live_sequences === 0 && h.stats.cancelled === cancelled0 + 1 && s.kept.meta.stopped && /stopped/.test(s.meta) && s.kept.content.length > 0,
     "stop: the request is cancelled on the server (its sequence freed), the partial reply kept and marked stopped",
     { live: h.live_sequences, cancelled: [cancelled0, h.stats.cancelled], meta: s.meta });

  // ---- kept in the browser: a reload has the key, the conversations and the view -----------------
  const listed = await page.$$eval("#conversation-list li", (l) => l.map((x) => x.textContent));
  await page.$eval("#conversation-list li:nth-child(3) button.open", (b) => b.click());     // the one that reasoned
  await page.waitForFunction(() => document.querySelectorAll("#messages .msg").length === 4);
  await page.$eval("#settings", (d) => { d.open = false; });
  await page.waitForFunction(() => / 0 running/.test(document.getElementById("server-status").textContent), { timeout: T(10000) });
  await page.screenshot({ path: join(outDir, "chat.png") });
  await page.reload();
  await page.waitForFunction(() => document.getElementById("model-name").textContent !== "", { timeout: T(10000) });
  const after = await page.evaluate(() => ({
    dialog: document.getElementById("key-dialog").open, list: [...document.querySelectorAll("#conversation-list li")].map((x) => x.textContent),
    shown: [...document.querySelectorAll("#messages .msg .body")].map((b) => b.textContent),
  }));
  ok(!after.dialog && after.list.join("|") === listed.join("|") && after.shown.length === 4 && after.shown[0] === "Think about striping.",
     "after a reload: no key asked, the conversations and the current one back from localStorage", after);

  // ---- an open server: no key, not on loopback --------------------------------------------------------
  const open = await browser.newPage();
  watch(open, "open page");
  await open.goto(openUrl + "/");
  await open.waitForFunction(() => !document.getElementById("open-banner").hidden, { timeout: T(10000) });
  const banner = await open.evaluate(() => ({ text: document.getElementById("open-banner").textContent, dialog: document.getElementById("key-dialog").open }));
  ok(/server is open/.test(banner.text) && !banner.dialog, "without --api-key on 0.0.0.0 the page says the server is open (and asks no key)", banner);
  await open.close();

  ok(errors.length === 0, "no console error, uncaught exception, failed request or HTTP error in the whole session", errors);
} catch (e) {
  ok(false, "the browser session ran through", String(e && e.stack || e));
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
process.exit(failures ? 1 : 0);
