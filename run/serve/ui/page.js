// krun serve's page: a chat, and a view of the machine (docs/SERVE.md, "The page").
// Talks to this server only: /health and /machine (polled), /v1/models, /v1/chat/completions
// (streamed).  Text from the model or the user is only ever set as textContent: nothing it
// holds is read as HTML.  Kept in this browser (localStorage): the API key, the conversations,
// the sampling settings, the view.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const SVG = "http://www.w3.org/2000/svg";
  const svgEl = (tag, attrs) => {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  };
  const load = (k, d) => {
    try { const v = localStorage.getItem("krun." + k); return v === null ? d : JSON.parse(v); } catch (_) { return d; }
  };
  const save = (k, v) => {
    try { localStorage.setItem("krun." + k, JSON.stringify(v)); return true; } catch (_) {
      notice("This browser's storage is full: the conversations are not saved (delete some).");
      return false;
    }
  };
  const now = () => performance.now() / 1000;

  // ---- numbers -----------------------------------------------------------------------------------
  const fmtBytes = (b) => {
    if (b === null || b === undefined || !isFinite(b)) return "–";
    const u = ["B", "kB", "MB", "GB", "TB"];
    let i = 0;
    while (Math.abs(b) >= 1000 && i < u.length - 1) { b /= 1000; i++; }
    return (i && Math.abs(b) < 10 ? b.toFixed(2) : i && Math.abs(b) < 100 ? b.toFixed(1) : b.toFixed(0)) + " " + u[i];
  };
  const fmtRate = (b) => fmtBytes(b) + "/s";
  const fmtSec = (s) => {
    if (s === null || !isFinite(s)) return "–";
    if (s === 0) return "0";
    if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 2 : 0) + " ms";
    if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  };
  const pct = (x) => (x === null || !isFinite(x) ? "–" : (100 * x).toFixed(x < 0.1 ? 1 : 0) + "%");

  // ---- notices, the key --------------------------------------------------------------------------
  const notice = (text) => {
    const n = $("notice");
    n.textContent = text || "";
    n.hidden = !text;
  };
  let apiKey = load("key", "");
  let keyWanted = false;      // the server wants a key this page does not have (or refused the one it has)
  let keyDismissed = false;   // ... and the dialog was cancelled: not asked again until the Key button
  const keyDialog = $("key-dialog");
  const askKey = (refused) => {
    keyWanted = true;
    if (keyDismissed) return;
    $("key-why").textContent = refused ? "The server did not accept this key: enter the one krun serve was started with (--api-key)."
                                       : "This server needs an API key (krun serve --api-key).";
    $("key-why").classList.toggle("error", !!refused);
    if (!keyDialog.open) { $("key-input").value = ""; keyDialog.showModal(); }
  };
  $("key-save").addEventListener("click", () => {
    apiKey = $("key-input").value.trim();
    save("key", apiKey);
    keyDismissed = false;
    keyDialog.close();
    poll();
  });
  $("key-input").addEventListener("keydown", (ev) => { if (ev.key === "Enter") { ev.preventDefault(); $("key-save").click(); } });
  $("key-forget").addEventListener("click", () => { apiKey = ""; localStorage.removeItem("krun.key"); keyDialog.close(); poll(); });
  $("key-cancel").addEventListener("click", () => { keyDismissed = keyWanted; keyDialog.close(); });
  $("key-button").addEventListener("click", () => {
    keyDismissed = false;
    $("key-why").textContent = keyWanted ? "This server needs an API key (krun serve --api-key)." : "The key this page sends (none is needed now).";
    $("key-why").classList.remove("error");
    $("key-input").value = apiKey;
    keyDialog.showModal();
  });

  // Every request: the key as a bearer token; JSON in and out.  A 401 means the key is wrong.
  const api = async (path, opts = {}) => {
    const headers = {};
    if (apiKey) headers.Authorization = "Bearer " + apiKey;
    if (opts.body !== undefined) headers["Content-Type"] = "application/json";
    const r = await fetch(path, {
      method: opts.body !== undefined ? "POST" : "GET", headers, cache: "no-store", signal: opts.signal,
      body: opts.body !== undefined ? JSON.stringify(opts.body) : undefined,
    });
    if (r.status === 401) askKey(!!apiKey);
    return r;
  };
  const errorText = async (r) => {
    try { const j = await r.json(); return (j.error && j.error.message) || JSON.stringify(j); } catch (_) { return r.statusText; }
  };

  // ---- views -------------------------------------------------------------------------------------
  const showView = (v) => {
    $("chat-view").hidden = v !== "chat";
    $("machine-view").hidden = v !== "machine";
    $("tab-chat").setAttribute("aria-pressed", v === "chat");
    $("tab-machine").setAttribute("aria-pressed", v === "machine");
    save("view", v);
    if (v === "machine") drawMachine();
    else $("input").focus();
  };
  for (const b of document.querySelectorAll("#views button")) b.addEventListener("click", () => showView(b.dataset.view));

  // ---- settings ----------------------------------------------------------------------------------
  // Sampling fields left empty are not sent: the server's defaults apply (temperature 1, thinking on, effort max).
  const FIELDS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed"];
  const settings = Object.assign({thinking: "max"}, load("settings", {}));
  $("s-thinking").value = settings.thinking;
  for (const f of FIELDS) $("s-" + f).value = settings[f] ?? "";
  $("s-temperature").placeholder = "1";
  const readSettings = () => {
    settings.thinking = $("s-thinking").value;
    for (const f of FIELDS) {
      const v = $("s-" + f).value.trim();
      if (v === "") delete settings[f]; else settings[f] = Number(v);
    }
    save("settings", settings);
  };
  $("settings").addEventListener("change", readSettings);

  // ---- conversations -----------------------------------------------------------------------------
  // {id, title, system, messages: [{role, content, reasoning, meta}], updated}
  let convs = load("conversations", []);
  let current = convs.find((c) => c.id === load("current", null)) || null;
  const persist = () => { if (current) current.updated = Date.now(); save("conversations", convs); };
  const newConversation = () => {
    current = {id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "", system: "", messages: [], updated: Date.now()};
    convs.unshift(current);
    save("current", current.id);
    renderConversations();
    renderMessages();
    $("input").focus();
  };
  const renderConversations = () => {
    const ul = $("conversation-list");
    ul.textContent = "";
    convs.sort((a, b) => b.updated - a.updated);
    for (const c of convs) {
      const li = el("li", c === current ? "current" : "");
      const open = el("button", "open", c.title || "New chat");
      open.type = "button";
      open.title = c.title || "";
      open.addEventListener("click", () => { if (busy) return; current = c; save("current", c.id); renderConversations(); renderMessages(); });
      const del = el("button", "del", "×");
      del.type = "button";
      del.title = "Delete this conversation";
      del.addEventListener("click", () => {
        if (busy && c === current) return;
        convs = convs.filter((x) => x !== c);
        if (c === current) current = convs[0] || null;
        save("conversations", convs);
        if (!current) newConversation(); else { save("current", current.id); renderConversations(); renderMessages(); }
      });
      li.append(open, del);
      ul.append(li);
    }
  };
  $("new-chat").addEventListener("click", () => { if (!busy) newConversation(); });
  $("system").addEventListener("input", () => { if (current) { current.system = $("system").value; persist(); } });

  // ---- messages ----------------------------------------------------------------------------------
  const messages = $("messages");
  const nearBottom = () => messages.scrollHeight - messages.scrollTop - messages.clientHeight < 60;
  const words = (s) => (s.match(/\S+/g) || []).length;

  // One message's element; m.view keeps its parts for updates while it streams.
  const messageNode = (m, i) => {
    const last = i === current.messages.length - 1;
    const d = el("div", "msg " + m.role + (last ? " last" : ""));
    const who = el("div", "who");
    who.append(el("span", "", m.role === "user" ? "You" : "krun"));
    const actions = el("span", "actions");
    if (m.role === "user") {
      const b = el("button", "edit-btn", "Edit");
      b.type = "button";
      b.addEventListener("click", () => editMessage(i, d));
      actions.append(b);
    } else if (last) {
      const b = el("button", "regen-btn", "Regenerate");
      b.type = "button";
      b.addEventListener("click", () => { if (!busy) { current.messages.pop(); generate(); } });
      actions.append(b);
    }
    who.append(actions);
    d.append(who);
    const view = {};
    if (m.role === "assistant") {
      view.reasoning = el("details", "reasoning");
      view.summary = el("summary");
      view.reasoningText = el("div", "text");
      view.reasoning.append(view.summary, view.reasoningText);
      d.append(view.reasoning);
    }
    view.body = el("div", "body");
    view.meta = el("div", "meta");
    d.append(view.body, view.meta);
    m.view = view;
    updateMessage(m);
    return d;
  };
  const updateMessage = (m) => {
    const v = m.view;
    if (!v) return;
    v.body.textContent = m.content;
    v.body.classList.toggle("cursor", !!m.streaming && !m.reasoningOpen);
    if (v.reasoning) {
      v.reasoning.hidden = !m.reasoning;
      v.reasoningText.textContent = m.reasoning || "";
      v.summary.textContent = (m.streaming && m.reasoningOpen ? "Thinking… " : "Reasoning · ") + words(m.reasoning || "") + " words";
    }
    const meta = m.meta || {};
    v.meta.classList.toggle("error", !!meta.error);
    v.meta.textContent = meta.error ? meta.error : metaText(m);
  };
  const metaText = (m) => {
    const t = m.meta || {};
    if (m.streaming) return t.waiting ? t.waiting : "";
    const parts = [];
    if (t.usage) {
      const u = t.usage, c = (u.prompt_tokens_details || {}).cached_tokens || 0;
      parts.push(u.completion_tokens + " tokens");
      if (t.seconds) parts.push(fmtSec(t.seconds) + (t.first ? " (first token " + fmtSec(t.first) + ")" : ""));
      if (t.seconds && t.gen_seconds > 0 && u.completion_tokens > 1) parts.push(((u.completion_tokens - 1) / t.gen_seconds).toFixed(1) + " tokens/s");
      parts.push("prompt " + u.prompt_tokens + (c ? " (" + c + " from the prefix cache)" : ""));
    } else if (t.seconds) parts.push(fmtSec(t.seconds));
    if (t.stopped) parts.push("stopped");
    else if (t.finish && t.finish !== "stop") parts.push("finish: " + t.finish);
    return parts.join(" · ");
  };
  const renderMessages = () => {
    messages.textContent = "";
    $("system").value = current ? current.system : "";
    if (!current) return;
    current.messages.forEach((m, i) => messages.append(messageNode(m, i)));
    messages.scrollTop = messages.scrollHeight;
  };
  const editMessage = (i, node) => {
    if (busy) return;
    const m = current.messages[i];
    const ta = el("textarea", "edit");
    ta.value = m.content;
    ta.rows = Math.min(12, m.content.split("\n").length + 1);
    const go = el("button", "primary", "Send");
    const cancel = el("button", "", "Cancel");
    go.type = cancel.type = "button";
    const row = el("div", "buttons");
    row.append(go, cancel);
    m.view.body.replaceWith(ta);
    node.insertBefore(row, m.view.meta);
    ta.focus();
    cancel.addEventListener("click", renderMessages);
    go.addEventListener("click", () => {
      if (busy || !ta.value.trim()) return;
      current.messages = current.messages.slice(0, i);
      if (!current.messages.some((x) => x.role === "user")) current.title = "";    // named after its first message again
      current.messages.push({role: "user", content: ta.value});
      renderMessages();
      generate();
    });
  };

  // ---- sending, streaming ------------------------------------------------------------------------
  let busy = false, controller = null, modelId = null;
  const setBusy = (b) => {
    busy = b;
    $("send").hidden = b;
    $("stop").hidden = !b;
    $("new-chat").disabled = b;
  };
  const requestBody = () => {
    const msgs = [];
    if (current.system.trim()) msgs.push({role: "system", content: current.system});
    // earlier replies go back without their reasoning, as OpenAI's clients send them
    for (const m of current.messages) msgs.push({role: m.role, content: m.content});
    const body = {messages: msgs, stream: true, stream_options: {include_usage: true}};
    if (modelId) body.model = modelId;
    for (const f of FIELDS) if (settings[f] !== undefined) body[f] = settings[f];
    body.reasoning_effort = settings.thinking;
    return body;
  };

  // A long prompt's progress, from the server's SSE comments (": prefill 1234/5000 (a block of B
  // positions: layer l/L)", ": queued"); the ETA from the rate since the first one.
  const prefill = {first: null};
  const showPrefill = (comment) => {
    const box = $("prefill");
    let m;
    if (/^queued/.test(comment)) {
      box.hidden = false;
      $("prefill-bar").style.width = "0";
      $("prefill-text").textContent = "queued: waiting for a free sequence";
    } else if ((m = /^prefill (\d+)\/(\d+)(?: \(a block of (\d+) positions: layer (\d+)\/(\d+)\))?/.exec(comment))) {
      const done0 = +m[1], total = +m[2];
      const done = m[3] ? Math.min(total, done0 + Math.min(+m[3], total - done0) * (+m[4] / +m[5])) : done0;
      const t = now();
      if (!prefill.first) prefill.first = {t, done};
      let eta = "";
      if (t > prefill.first.t && done > prefill.first.done) {
        const rate = (done - prefill.first.done) / (t - prefill.first.t);
        eta = " · " + rate.toFixed(rate < 10 ? 2 : 0) + " positions/s · about " + fmtSec((total - done) / rate) + " left";
      }
      box.hidden = false;
      $("prefill-bar").style.width = (100 * done / total).toFixed(1) + "%";
      $("prefill-text").textContent = "reading the prompt: " + Math.floor(done) + " / " + total + " positions" +
        (m[3] ? " (layer " + m[4] + "/" + m[5] + " of a " + m[3] + "-position block)" : "") + eta;
    }
  };
  const hidePrefill = () => { $("prefill").hidden = true; prefill.first = null; };

  const generate = async () => {
    readSettings();
    const body = requestBody();
    const a = {role: "assistant", content: "", reasoning: "", meta: {waiting: "waiting for the first token…"}, streaming: true};
    current.messages.push(a);
    if (!current.title) {
      const u = current.messages.find((m) => m.role === "user");
      current.title = u ? u.content.replace(/\s+/g, " ").slice(0, 48) : "";
    }
    persist();
    renderConversations();
    renderMessages();
    setBusy(true);
    controller = new AbortController();
    const t0 = now();
    let tFirst = null, dirty = false;
    const paint = () => {
      if (!dirty) return;
      dirty = false;
      const stick = nearBottom();
      updateMessage(a);
      if (stick) messages.scrollTop = messages.scrollHeight;
    };
    const ticker = setInterval(() => {
      if (tFirst === null) { a.meta.waiting = "waiting for the first token… " + fmtSec(now() - t0); dirty = true; }
      paint();
    }, 250);
    const event = (data) => {
      if (data === "[DONE]") return;
      let j;
      try { j = JSON.parse(data); } catch (_) { return; }
      if (j.error) { a.meta.error = "error: " + (j.error.message || JSON.stringify(j.error)); return; }
      if (j.usage) a.meta.usage = j.usage;
      const ch = j.choices && j.choices[0];
      if (!ch) return;
      const d = ch.delta || {};
      if (d.reasoning_content) { a.reasoning += d.reasoning_content; a.reasoningOpen = true; }
      if (d.content) { a.content += d.content; a.reasoningOpen = false; }
      if (d.tool_calls) a.content += d.tool_calls.map((t) => t.function ? "[tool call " + (t.function.name || "") + " " + (t.function.arguments || "") + "]" : "").join("");
      if ((d.reasoning_content || d.content) && tFirst === null) { tFirst = now(); hidePrefill(); }
      if (ch.finish_reason) a.meta.finish = ch.finish_reason;
      dirty = true;
    };
    try {
      const r = await api("/v1/chat/completions", {body, signal: controller.signal});
      if (!r.ok) throw new Error(r.status + ": " + await errorText(r));
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "", data = [];
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += dec.decode(value, {stream: true});
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).replace(/\r$/, "");
          buf = buf.slice(nl + 1);
          if (line === "") { if (data.length) event(data.join("\n")); data = []; }
          else if (line[0] === ":") { if (tFirst === null) showPrefill(line.slice(1).trim()); }
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        }
      }
    } catch (e) {
      if (e.name === "AbortError") a.meta.stopped = true;
      else a.meta.error = String(e.message || e);
    } finally {
      clearInterval(ticker);
      hidePrefill();
      const t1 = now();
      a.streaming = false;
      a.meta.waiting = undefined;
      a.meta.seconds = t1 - t0;
      if (tFirst !== null) { a.meta.first = tFirst - t0; a.meta.gen_seconds = t1 - tFirst; }
      const {view, streaming, reasoningOpen, ...keep} = a;   // what is saved: not the DOM, not the stream's state
      current.messages[current.messages.indexOf(a)] = keep;
      controller = null;
      setBusy(false);
      persist();
      renderMessages();
      poll();                                     // the server's state now, not at the next tick
    }
  };
  const sendInput = () => {
    const text = $("input").value;
    if (busy || !text.trim()) return;
    if (!current) newConversation();
    current.messages.push({role: "user", content: text});
    $("input").value = "";
    generate();
  };
  $("send").addEventListener("click", sendInput);
  $("input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); sendInput(); }
  });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });

  // ---- the machine: samples ----------------------------------------------------------------------
  // A sample every `every` seconds: /health (with the key: requests, the sweep, the counters, the
  // plan) and /machine (member files, bytes by kind, the expert cache).  Rates are differences of
  // the counters between samples over the server's own clocks.
  let every = load("every", 2), windowS = load("window", 300);
  $("every").value = String(every);
  $("window").value = String(windowS);
  $("every").addEventListener("change", () => { every = +$("every").value; save("every", every); poll(); });
  $("window").addEventListener("change", () => { windowS = +$("window").value; save("window", windowS); drawMachine(); });
  let samples = [];            // [{t, h (health), m (machine)}], the last windowS seconds
  let pollTimer = null, polling = false, pollAgain = false, lastHealth = null, lastMachine = null;

  const poll = async () => {
    clearTimeout(pollTimer);
    if (polling) { pollAgain = true; return; }
    polling = true;
    try {
      const hr = await api("/health");
      const h = await hr.json();
      if (!h.model) {                            // without the key /health says only the status
        renderStatus(h);
        askKey(!!apiKey);
        return;
      }
      if (keyWanted && keyDialog.open) keyDialog.close();
      keyWanted = false;
      const mr = await api("/machine");
      if (!mr.ok) throw new Error("/machine: " + mr.status);
      const m = await mr.json();
      lastHealth = h;
      lastMachine = m;
      if (!modelId) loadModel();
      const t = now();
      samples.push({t, h, m});
      while (samples.length > 2 && samples[1].t < t - windowS - 2 * every) samples.shift();
      renderStatus(h);
      renderOpen(m);
      if (!$("machine-view").hidden) drawMachine();
      notice(h.status === "damaged" ? "The model file is damaged: " + h.damage : "");
    } catch (e) {
      renderStatus(null, String(e.message || e));
    } finally {
      polling = false;
      if (pollAgain) { pollAgain = false; poll(); } else pollTimer = setTimeout(poll, every * 1000);
    }
  };
  const loadModel = async () => {
    try {
      const r = await api("/v1/models");
      if (r.ok) { const j = await r.json(); modelId = j.data && j.data[0] && j.data[0].id; $("model-name").textContent = modelId || ""; }
    } catch (_) { /* the next poll tries again */ }
  };
  const renderStatus = (h, err) => {
    const s = $("server-status");
    s.textContent = "";
    const dot = el("span", "dot");
    if (!h) { dot.classList.add("bad"); s.append(dot, "unreachable" + (err ? ": " + err : "")); return; }
    if (h.status !== "ok") dot.classList.add("bad");
    else if (h.live_sequences) dot.classList.add("busy");
    let text = h.status;
    if (h.model) text += " · " + h.live_sequences + " running · " + h.queued + " queued";
    else text += " · API key needed";
    s.append(dot, text);
  };
  const renderOpen = (m) => {
    const b = $("open-banner");
    b.hidden = m.api_key || m.loopback;
    b.textContent = "This server is open: it has no API key and listens on an address other networks can reach, so anyone " +
                    "who can reach this port can use the model (krun serve --api-key KEY, or --host 127.0.0.1).";
  };

  // ---- the machine: plots ------------------------------------------------------------------------
  // series: [{name, color, points: [[t, v | null]...]} or {name, color, level: v} (a dashed line across)],
  // bands: [[t0, t1, color]] shaded behind
  const niceMax = (v) => {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v))), f = v / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
  };
  // floor: the smallest top of the scale (so that an idle plot reads 0 on a sensible scale); fixed: the top.
  const plot = (svg, series, fmt, {floor = 0, fixed = 0, bands = [], empty = ""} = {}) => {
    const w = Math.max(100, svg.clientWidth), h = Math.max(40, svg.clientHeight);
    const L = 52, R = 6, T = 6, B = 14, t1 = now(), t0 = t1 - windowS;
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.textContent = "";
    let max = 0, n = 0;
    for (const s of series) {
      if (s.level !== undefined) max = Math.max(max, s.level);
      else for (const [, v] of s.points) if (v !== null && isFinite(v)) { max = Math.max(max, v); n++; }
    }
    const top = fixed || niceMax(Math.max(floor, max * 1.05));
    const x = (t) => L + (w - L - R) * (t - t0) / (t1 - t0), y = (v) => T + (h - T - B) * (1 - v / top);
    for (const [a, b, color] of bands) {
      const xa = Math.max(L, x(a)), xb = Math.min(w - R, x(b));
      if (xb > xa) svg.append(svgEl("rect", {class: "band", x: xa, y: T, width: xb - xa, height: h - T - B, fill: color}));
    }
    for (const f of [0, 0.5, 1]) {
      svg.append(svgEl("line", {class: "grid", x1: L, x2: w - R, y1: y(top * f), y2: y(top * f)}));
      const lab = svgEl("text", {x: L - 4, y: y(top * f) + 3, "text-anchor": "end"});
      lab.textContent = fmt(top * f);
      svg.append(lab);
    }
    const ends = [[L, windowS >= 3600 ? "−" + windowS / 3600 + " h" : "−" + windowS / 60 + " min", "start"], [w - R, "now", "end"]];
    for (const [xx, label, anchor] of ends) {
      const e = svgEl("text", {x: xx, y: h - 2, "text-anchor": anchor});
      e.textContent = label;
      svg.append(e);
    }
    for (const s of series) {
      if (s.level !== undefined) {
        svg.append(svgEl("polyline", {class: "limit", points: L + "," + y(s.level) + " " + (w - R) + "," + y(s.level), stroke: s.color,
                                      "data-series": s.name}));
        continue;
      }
      let run = [];
      const flush = () => {
        if (run.length === 1) {                     // a point alone: a dot
          const [cx, cy] = run[0].split(",");
          svg.append(svgEl("circle", {cx, cy, r: 2, fill: s.color, "data-series": s.name}));
        } else if (run.length) {
          const p = svgEl("polyline", {points: run.join(" "), stroke: s.color, "data-series": s.name});
          svg.append(p);
        }
        run = [];
      };
      for (const [t, v] of s.points) {
        if (v === null || !isFinite(v) || t < t0) { flush(); continue; }
        run.push(x(t).toFixed(1) + "," + y(v).toFixed(1));
      }
      flush();
    }
    if (!n) {
      const e = svgEl("text", {x: (L + w - R) / 2, y: (T + h - B) / 2, "text-anchor": "middle"});
      e.textContent = empty || "nothing in this window yet";
      svg.append(e);
    }
    svg.dataset.points = n;
    svg.dataset.max = max;
  };
  const colors = () => {
    const cs = getComputedStyle(document.documentElement);
    return [0, 1, 2, 3, 4, 5, 6, 7].map((i) => cs.getPropertyValue("--c" + i).trim());
  };

  // Differences between samples: f(prev, cur) -> a value, at the later one's time.  f returns null
  // when nothing happened in between (no token, no sweep): then the next value spans both
  // intervals (a sweep longer than a point is averaged, not a gap), unless it is long idle (a gap).
  const diffs = (f) => {
    const out = [];
    let p = 0;
    for (let i = 1; i < samples.length; i++) {
      const v = f(samples[p], samples[i]);
      if (v === null && samples[i].t - samples[p].t < 10 * every + 1) continue;
      out.push([samples[i].t, v]);
      p = i;
    }
    return out;
  };
  const decode = (h) => {   // the decoding sweeps' share of the counters (/health stats)
    const s = h.stats;
    return {sec: s.sweep_seconds - s.prefill_seconds, bytes: s.bytes_read - s.prefill_bytes_read,
            tokens: s.generated_tokens - s.prefill_generated_tokens};
  };

  const drawMachine = () => {
    if ($("machine-view").hidden || !lastMachine) return;
    const c = colors(), m = lastMachine, h = lastHealth;
    const up = h.stats ? fmtSec(h.stats.uptime_seconds) : "–";
    $("machine-summary").textContent = (m.in_place ? "in place (the file fits in memory: nothing streams)" : "streaming within the memory plan") +
      " · " + m.simd + ", " + m.threads + " threads · RSS " + fmtBytes(m.rss_bytes) + " (peak " + fmtBytes(m.peak_rss_bytes) + ")" +
      (h.plan ? " of a " + fmtBytes(h.plan.budget_bytes) + " budget" : "") + " · up " + up;
    drawDrives(c);
    const dec = diffs((a, b) => {
      const x = decode(a.h), y = decode(b.h), n = y.tokens - x.tokens;
      return n > 0 ? [(y.sec - x.sec) / n, (y.bytes - x.bytes) / n] : null;
    });
    const none = "no decoding-only sweep in this window";
    plot($("plot-spt"), [{name: "seconds per token", color: c[0], points: dec.map(([t, v]) => [t, v && v[0]])}], fmtSec, {floor: 0.01, empty: none});
    plot($("plot-bpt"), [{name: "bytes per token", color: c[1], points: dec.map(([t, v]) => [t, v && v[1]])}], fmtBytes, {floor: 1e6, empty: none});
    plot($("plot-hits"), [{name: "hit rate", color: c[2], points: diffs((a, b) => {
      const hit = b.m.experts.hits - a.m.experts.hits, miss = b.m.experts.misses - a.m.experts.misses;
      return hit + miss > 0 ? hit / (hit + miss) : null;
    })}], (v) => (100 * v).toFixed(0) + "%", {fixed: 1});
    const x = m.experts, all = x.hits + x.misses;
    $("experts-text").textContent = all ? "since the start: " + x.hits + " of " + all + " experts asked for were in memory (" + pct(x.hits / all) +
      "); " + fmtBytes(m.bytes.experts) + " of experts read" + (x.predicted ? "; " + x.predicted_used + " of " + x.predicted +
      " predicted reads used" : "") : "no expert asked for yet";
    const bands = [];
    for (let i = 1; i < samples.length; i++) {
      const s = samples[i].h.sweep;
      if (s && s.layout === "prefill") bands.push([samples[i - 1].t, samples[i].t, c[6]]);
    }
    plot($("plot-batch"), [{name: "positions per sweep", color: c[3], points: diffs((a, b) => {
      const n = b.h.stats.sweeps - a.h.stats.sweeps;
      return n > 0 ? (b.h.stats.positions - a.h.stats.positions) / n : null;
    })}], (v) => v.toFixed(v < 10 ? 1 : 0), {floor: 1, bands});
    const s = h.sweep;
    $("sweep-now").textContent = (s ? "now: a sweep of " + s.positions + " positions in the " + s.layout + " layout, layer " + s.layers_done +
      " of " + s.layers : "now: no sweep running") + " · " + h.live_sequences + " of " + h.max_seqs + " sequences live · blocks of " +
      h.block + (h.block_prefill > h.block ? " (" + h.block_prefill + " in the prefill layout, shaded)" : "");
    drawRequests(h);
    drawPlan(h.plan, m);
  };

  const drawDrives = (c) => {
    const box = $("drives"), m = lastMachine;
    if (m.in_place) {
      box.textContent = "The model is used in place from a memory mapping: its reads are the kernel's page faults, not counted per drive.";
      return;
    }
    if (box.children.length !== m.members.length || !box.querySelector("svg")) {
      box.textContent = "";
      for (const mem of m.members) {
        const row = el("div", "drive");
        const name = el("div", "name");
        const role = mem.role === "stripe" ? "stripe " + mem.stripe : mem.role === "plain" ? "trunk (plain)" : mem.role;
        name.append(el("b", "", "member " + mem.member + " · " + role), el("br"), document.createTextNode(mem.path + " · " + fmtBytes(mem.size)),
                    el("br"), el("span", "now"));
        const svg = svgEl("svg", {class: "plot", "data-member": mem.member});
        row.append(name, svg);
        box.append(row);
      }
    }
    const rows = box.children;
    m.members.forEach((mem, k) => {
      const col = c[k % c.length];
      const rate = diffs((a, b) => (b.m.members[k].bytes - a.m.members[k].bytes) / (b.m.t - a.m.t));
      const util = diffs((a, b) => (b.m.members[k].busy_seconds - a.m.members[k].busy_seconds) / (b.m.t - a.m.t));
      // the speed it delivers while busy, over the plotted window (the whole run while the window saw too little)
      let q = 0, busy = 0;
      const first = samples.find((s) => s.t >= now() - windowS);
      if (first) { q = mem.queued_bytes - first.m.members[k].queued_bytes; busy = mem.busy_seconds - first.m.members[k].busy_seconds; }
      if (busy < 0.05) { q = mem.queued_bytes; busy = mem.busy_seconds; }
      const speed = busy >= 0.05 ? q / busy : null;
      const pts = rate.map(([t, v]) => [t, v]);
      const series = [{name: "read", color: col, points: pts}];
      if (speed) series.push({name: "speed", color: col, level: speed});
      plot(rows[k].querySelector("svg"), series, fmtRate, {floor: 1e6});
      const last = pts.length ? pts[pts.length - 1][1] : null, u = util.length ? util[util.length - 1][1] : null;
      rows[k].querySelector(".now").textContent = "now " + fmtRate(last) + " · busy " + pct(u) + " · " +
        (speed ? fmtRate(speed) + " while busy" : "not read yet") + " · " + fmtBytes(mem.bytes) + " read";
    });
  };

  const drawRequests = (h) => {
    const tb = $("requests").tBodies[0];
    tb.textContent = "";
    for (const r of h.requests || []) {
      const tr = el("tr");
      const prompt = r.state === "queued" ? String(r.prompt_tokens) : r.prefilled + " / " + r.prompt_tokens;
      for (const v of [r.id, r.state, prompt, r.cached_tokens ?? "", r.in_sweep ?? "", r.generated ?? "", (r.seconds || 0).toFixed(1)]) tr.append(el("td", "", String(v)));
      tr.firstChild.textContent = "…" + r.id.slice(-8);      // the request counter; the whole id as its title
      tr.firstChild.title = r.id;
      tb.append(tr);
    }
    $("requests-none").hidden = !!(h.requests && h.requests.length);
  };

  // The budget as a bar (RSS marked), the layers as cells: pinned, lent to a prefill block, streamed.
  const drawPlan = (p, m) => {
    const box = $("plan");
    box.textContent = "";
    if (!p) { box.append(el("div", "muted", "No plan: the model file is used in place from a mapping (it fits in memory).")); return; }
    const two = p.block_prefill > 0, cs = getComputedStyle(document.documentElement);
    const v = (n) => cs.getPropertyValue("--" + n).trim();
    const parts = [
      ["pinned trunk", two ? p.pinned_bytes_prefill : p.pinned_bytes, v("pinned")],
      ["trunk ring (streamed)", p.ring_slots * p.ring_slot_bytes, v("ring")],
      ["expert cache", (two ? p.expert_slots_prefill : p.expert_slots) * p.expert_slot_bytes, v("cache")],
      ["flex: lent layers and slots / a prefill block", two ? p.flex_bytes : 0, v("lent")],
      ["state (" + p.max_seqs + " sequences)", p.state_bytes, v("state")],
      [p.head_streamed ? "held globals" : "held globals and lm_head", p.globals_resident_bytes, v("c5")],
      ["scratch, vectors, I/O, prediction", p.scratch_bytes + p.vectors_bytes + p.io_bytes + p.predict_bytes, v("c4")],
      ["process base", p.base_bytes, v("other")],
    ].filter((x) => x[1] > 0);
    const sum = parts.reduce((s, x) => s + x[1], 0);
    if (p.total_bytes > sum) parts.push(["other", p.total_bytes - sum, v("other")]);
    const budget = Math.max(p.budget_bytes, p.total_bytes);
    const bar = el("div", "stack");
    for (const [name, bytes, color] of parts) {
      const d = el("div");
      d.style.width = (100 * bytes / budget) + "%";
      d.style.background = color;
      d.title = name + ": " + fmtBytes(bytes);
      bar.append(d);
    }
    if (m.rss_bytes) {
      const r = el("div", "rss");
      r.style.left = Math.min(100, 100 * m.rss_bytes / budget) + "%";
      r.title = "RSS now: " + fmtBytes(m.rss_bytes);
      bar.append(r);
    }
    const legend = el("div", "legend");
    for (const [name, bytes, color] of parts) {
      const s = el("span"), i = el("i");
      i.style.background = color;
      s.append(i, name + " " + fmtBytes(bytes));
      legend.append(s);
    }
    legend.append(el("span", "muted", "budget " + fmtBytes(p.budget_bytes) + " · planned " + fmtBytes(p.total_bytes) + " · RSS " + fmtBytes(m.rss_bytes) + " (the line)"));
    const grid = el("div", "plan-grid");
    const layers = el("div", "layers"), nl = m.model.layers, pinKept = two ? p.pinned_layers_prefill : p.pinned_layers;
    for (let i = 0; i < nl; i++) {
      const cell = el("span", i < pinKept ? "pinned" : i < p.pinned_layers ? "lent" : "streamed");
      cell.title = "layer " + i + ": " + (i < pinKept ? "pinned" : i < p.pinned_layers ? "pinned while decoding, lent to a prefill block" : "streamed through the ring");
      layers.append(cell);
    }
    const head = el("span", "head " + (p.head_streamed ? "streamed" : "pinned"));
    head.title = "lm_head: " + (p.head_streamed ? "streamed" : "held");
    layers.append(head);
    const cm = p.cost_model || {};
    const pool = cm.moe_layers * cm.n_experts;
    grid.append(el("span", "muted", "trunk layers, lm_head"), layers,
      el("span", "muted", "per decoding step"), el("span", "", "reads trunk " + fmtBytes(p.trunk_stream_bytes_per_token) +
        (p.head_streamed ? " + lm_head " + fmtBytes(p.head_stream_bytes_per_token) : "") + " + experts up to " +
        fmtBytes(p.expert_read_bytes_per_token_max) + " (less cache hits)"),
      el("span", "muted", "expert cache"), el("span", "", p.expert_slots + " slots of " + fmtBytes(p.expert_slot_bytes) +
        (pool ? " for a pool of " + pool + " experts (" + cm.moe_layers + " MoE layers × " + cm.n_experts + ", " + cm.topk + " per token each)" : "") +
        (two && p.expert_slots_prefill < p.expert_slots ? "; " + p.expert_slots_prefill + " kept during a prefill block" : "")),
      el("span", "muted", "prompt blocks"), el("span", "", two ? "decoding " + p.block_positions + " positions; prefill layout " + p.block_prefill +
        " positions (lends " + fmtBytes(p.lent_bytes) + ")" : p.block_positions + " positions"));
    const key = el("div", "legend");
    for (const [cls, name] of [["pinned", "pinned (held)"], ["lent", "lent to a prefill block"], ["streamed", "streamed every token"]]) {
      const s = el("span"), i = el("i", "");
      i.className = cls;
      i.style.background = cls === "streamed" ? v("ring") : v(cls);
      s.append(i, name);
      key.append(s);
    }
    box.append(bar, legend, grid, key);
  };

  // ---- start -------------------------------------------------------------------------------------
  if (!current) newConversation(); else { renderConversations(); renderMessages(); }
  setBusy(false);
  showView(load("view", "chat"));
  window.addEventListener("resize", drawMachine);
  poll();
})();
