// The session inspector: reads the /admin API — without a token when the gateway lets it (the token form appears
// only when the API answers 401; a token is kept in sessionStorage for this tab) — and renders everything with
// textContent (message text is never parsed as HTML). Every session has an address (#/s/<id>); lists are paged,
// a session's history is fetched a page at a time as it is needed and rendered a window at a time.
"use strict";

const TOKEN_KEY = "ctxgate-admin-token";
const PAGE = 50;          // sessions per page
const WINDOW = 100;       // history messages rendered per step
const HISTORY_PAGE = 500; // history messages fetched per request (GET /admin/sessions/{id}?limit&offset)
const TURNS_PAGE = 200;   // turns listed per request
const CLIP = 4000;        // characters of a message shown before "show all"

const $ = (id) => document.getElementById(id);

// What a turn without token counts means (a request clearly under the window is sent as it came, uncounted).
const NOT_COUNTED = "not counted: sent as it came";
const NOT_COUNTED_WHY = "Well under the model's window, so ctxgate sent this request as it came without counting " +
  "its tokens, and the upstream reported no usage for it.";
// What a session's token figure is.
const ESTIMATED_WHY = "Estimated from the size of the stored history (about 4 bytes a token), not counted with " +
  "the model's tokenizer; each turn's counted tokens are in the session's Turns tab.";
const state = { offset: 0, q: "", session: null, turns: [], turnsTotal: 0, shown: 0 };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "dataset") Object.assign(e.dataset, v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

/// The admin API wants a token (401): the only case that shows the token form.
class AuthError extends Error {}

async function api(path, init) {
  const headers = Object.assign({}, (init && init.headers) || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["authorization"] = "Bearer " + token;
  const r = await fetch(path, Object.assign({}, init, { headers }));
  const body = await r.json().catch(() => null);
  const said = (body && body.error && body.error.message) || "";
  if (r.status === 401) {
    throw new AuthError((token ? "The token was refused." : "The admin API needs its token.") + (said ? ` (${said})` : ""));
  }
  if (r.status === 403) throw new Error("The admin API is not open to this page." + (said ? ` (${said})` : ""));
  if (!r.ok) throw new Error(said || ("HTTP " + r.status));
  return body;
}

function show(section) {
  for (const id of ["login", "list", "session"]) $(id).hidden = id !== section;
  $("logout").hidden = section === "login" || !sessionStorage.getItem(TOKEN_KEY);
}

function fail(e) {
  if (e instanceof AuthError) {
    show("login");
    $("login-error").textContent = e.message;
  } else {
    $("error").textContent = String(e.message || e);
  }
}

const when = (secs) => (secs ? new Date(secs * 1000).toISOString().replace("T", " ").slice(0, 19) : "");

// --- sessions ------------------------------------------------------------------------------------------------

// US dollars, as the admin API sums them from the turns of priced models ([models] price).
function dollars(n) {
  return typeof n === "number" ? "$" + n.toFixed(n > 0 && n < 0.01 ? 4 : 2) : "";
}

async function loadList() {
  const q = state.q ? "&q=" + encodeURIComponent(state.q) : "";
  const v = await api(`/admin/sessions?limit=${PAGE}&offset=${state.offset}${q}`);
  const body = $("sessions");
  body.replaceChildren();
  for (const s of v.sessions) {
    // The id is a real link (open in a new tab, copy its address); a click elsewhere on the row follows it too.
    const href = "#/s/" + encodeURIComponent(s.id);
    const tr = el("tr", { class: "session", dataset: { id: s.id } },
      el("td", { class: "id" }, el("a", { href }, s.id)), el("td", {}, s.dialect), el("td", {}, s.message_count),
      el("td", { title: ESTIMATED_WHY }, s.token_estimate), el("td", { class: "spent" }, dollars(s.spent_dollars)),
      el("td", { class: "saved" }, dollars(s.saved_dollars)), el("td", {}, when(s.last_active)),
      el("td", {}, s.strategy || ""));
    tr.addEventListener("click", (ev) => {
      if (ev.target.closest("a") || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.button !== 0) return;
      location.hash = href;
    });
    body.append(tr);
  }
  const last = Math.min(v.total, state.offset + v.sessions.length);
  $("list-count").textContent = v.total ? `${state.offset + 1}–${last} of ${v.total}` : "no sessions";
  $("prev").disabled = state.offset === 0;
  $("next").disabled = last >= v.total;
  // A search answered after the operator opened a session leaves that session on screen.
  if (!location.hash.startsWith("#/s/")) show("list");
}

// --- messages, in any dialect --------------------------------------------------------------------------------

function blockText(b) {
  if (typeof b === "string") return b;
  if (!b || typeof b !== "object") return JSON.stringify(b);
  switch (b.type) {
    case "text": case "input_text": case "output_text": return b.text;
    case "thinking": return "[thinking] " + (b.thinking || "");
    case "redacted_thinking": return "[redacted thinking]";
    case "tool_use": return `→ ${b.name}(${JSON.stringify(b.input)})  [${b.id}]`;
    case "tool_result": return `← result of ${b.tool_use_id}: ` + contentText(b.content);
    case "function_call": return `→ ${b.name}(${b.arguments})  [${b.call_id}]`;
    case "function_call_output": return `← output of ${b.call_id}: ` + contentText(b.output);
    case "custom_tool_call": return `→ ${b.name}(${b.input})  [${b.call_id}]`;
    case "custom_tool_call_output": return `← output of ${b.call_id}: ` + contentText(b.output);
    case "reasoning": return "[reasoning] " + (b.summary || []).map((s) => s.text || "").join(" ");
    default: return JSON.stringify(b);
  }
}

function contentText(c) {
  if (c == null) return "";
  if (typeof c === "string") return c;
  if (Array.isArray(c)) return c.map(blockText).join("\n");
  return blockText(c);
}

// A part of a Gemini content (`{role: "user" | "model", parts: [...]}`).
function partText(p) {
  if (!p || typeof p !== "object") return JSON.stringify(p);
  const id = (c) => (c.id ? `  [${c.id}]` : "");
  if (typeof p.text === "string") return (p.thought ? "[thought] " : "") + p.text;
  if (p.functionCall) return `→ ${p.functionCall.name}(${JSON.stringify(p.functionCall.args || {})})${id(p.functionCall)}`;
  if (p.functionResponse) {
    const r = p.functionResponse;
    const out = r.response && typeof r.response.output === "string" ? r.response.output : JSON.stringify(r.response);
    return `← response of ${r.name}${id(r)}: ${out}`;
  }
  if (p.inlineData) return `[inline ${p.inlineData.mimeType || "data"}]`;
  if (p.fileData) return `[file ${p.fileData.fileUri || ""}]`;
  return JSON.stringify(p);
}

function messageText(m) {
  if (!m || typeof m !== "object") return JSON.stringify(m);
  if (Array.isArray(m.parts)) return m.parts.map(partText).join("\n"); // a Gemini content
  if (!m.role) return blockText(m); // a Responses item
  const parts = [contentText(m.content)];
  for (const c of m.tool_calls || []) {
    parts.push(`→ ${c.function && c.function.name}(${c.function && c.function.arguments})  [${c.id}]`);
  }
  if (m.tool_call_id) parts.unshift(`← result of ${m.tool_call_id}:`);
  return parts.filter((p) => p !== "").join("\n");
}

function messageBox(m, label, cls, badge) {
  const text = messageText(m);
  const body = el("div", { class: "body" + (text.length > CLIP ? " clip" : "") }, text.slice(0, CLIP));
  const head = el("div", { class: "head" }, el("span", {}, label), el("span", {}, (m && (m.role || m.type)) || ""));
  if (badge) head.append(el("span", { class: "badge" }, badge));
  const box = el("div", { class: "msg " + (cls || "") }, head, body);
  if (text.length > CLIP) {
    const all = el("button", {}, `show all ${text.length} characters`);
    all.addEventListener("click", () => { body.textContent = text; body.classList.remove("clip"); all.remove(); });
    box.append(all);
  }
  return box;
}

// --- one session ---------------------------------------------------------------------------------------------

/// The session's next page of history, appended to what `s` holds (false: there was none).
async function fetchHistory(s) {
  const v = await api(`/admin/sessions/${encodeURIComponent(s.id)}?limit=${HISTORY_PAGE}&offset=${s.messages.length}`);
  s.total = v.total;
  s.messages.push(...v.messages);
  s.ids.push(...v.ids);
  s.partial.push(...(v.partial || []));
  return v.messages.length > 0;
}

/// Fetches pages until `s` holds `n` messages of its history (or all of them).
async function historyUpTo(s, n) {
  while (s.messages.length < Math.min(n, s.total)) {
    if (!(await fetchHistory(s))) break;
  }
}

/// Fetches pages until node `id` is among those `s` holds (or the whole history is).
async function historyThrough(s, id) {
  while (!s.ids.includes(id) && s.messages.length < s.total) {
    if (!(await fetchHistory(s))) break;
  }
}

async function openSession(id) {
  const s = await api(`/admin/sessions/${encodeURIComponent(id)}?limit=${HISTORY_PAGE}`);
  s.partial = s.partial || [];
  state.session = s;
  state.shown = 0;
  $("session-id").textContent = s.id;
  $("session-meta").textContent = `${s.dialect} · ${s.message_count} messages stored · ` +
    `~${s.token_estimate} tokens (estimated from the history's size) · ` +
    `spent ${dollars(s.spent_dollars)} · saved ${dollars(s.saved_dollars)} · ` +
    `created ${when(s.created_at)} · last active ${when(s.last_active)}`;
  $("session-meta").title = ESTIMATED_WHY;
  $("strategy").value = s.strategy || "";
  $("strategy-said").textContent = "";
  $("history").replaceChildren();
  $("turn-view").hidden = true;
  await renderMore();
  renderBranches(s);
  renderRecords(s);
  show("session");
  const page = await api(`/admin/sessions/${encodeURIComponent(id)}/turns?messages=false&limit=${TURNS_PAGE}`);
  state.turns = page.turns;
  state.turnsTotal = page.total;
  renderTurns();
  tab("turns");
  // The newest rewritten turn, side by side with the history (the last page of turns when there are more).
  let newest = state.turns;
  if (page.total > page.turns.length) {
    const from = Math.max(0, page.total - TURNS_PAGE);
    newest = (await api(`/admin/sessions/${encodeURIComponent(id)}/turns?messages=false&limit=${TURNS_PAGE}&offset=${from}`)).turns;
  }
  const rewritten = newest.concat(state.turns).filter((t) => t.rewritten);
  if (rewritten.length && state.session === s) {
    await openTurn(Math.max(...rewritten.map((t) => t.turn)));
  }
}

/// The next window of the history, fetching the page it is on first when it is not here yet (one at a time: a
/// second click while a page is on its way does nothing).
async function renderMore() {
  const s = state.session;
  if (s.rendering) return;
  s.rendering = true;
  try {
    await historyUpTo(s, state.shown + WINDOW);
    if (state.session !== s) return;
    const box = $("history");
    const end = Math.min(s.messages.length, state.shown + WINDOW);
    for (let i = state.shown; i < end; i++) {
      const partial = s.partial.includes(i) ? " · partial" : "";
      box.append(messageBox(s.messages[i], `#${i}${partial}`, ""));
    }
    state.shown = end;
    $("more").hidden = end >= s.total;
    $("more").textContent = `show more (${s.total - end} left)`;
  } finally {
    s.rendering = false;
  }
}

function renderBranches(s) {
  const box = $("branches");
  box.replaceChildren();
  if (!s.branches || !s.branches.length) return;
  box.append(el("h3", {}, `Other branches (${s.branches.length})`));
  for (const b of s.branches) {
    const d = el("details", {}, el("summary", {}, `leaf ${b.leaf}: diverges at #${b.diverges_at}, ${b.length} messages`));
    b.messages.forEach((m, k) => d.append(messageBox(m, `#${b.diverges_at + k}`, "")));
    box.append(d);
  }
}

function renderRecords(s) {
  const box = $("records");
  box.replaceChildren();
  box.append(el("h3", {}, `Compression records (${s.compressions.length})`));
  for (const c of s.compressions) {
    const line = c.kind === "summary"
      ? `summary of messages ${c.covers.from}–${c.covers.upto - 1} by ${c.model}, ${c.tokens_before} → ${c.tokens_after} tokens`
      : `rewrite (${c.strategy}): ${(c.stages || []).join(", ")} · ${c.tokens_before} → ${c.tokens_after} tokens · ` +
        `${c.messages_before} → ${c.messages_after} messages`;
    const d = el("div", { class: "msg " + (c.kind === "summary" ? "kind-summary" : "") },
      el("div", { class: "head" }, el("span", {}, when(c.at)), el("span", { class: "badge" }, c.kind)),
      el("div", {}, line));
    if (c.kind === "summary") d.append(el("div", { class: "body" }, c.summary));
    box.append(d);
  }
  box.append(el("h3", {}, `Recall rounds (${s.internal.length})`));
  for (const r of s.internal) {
    const d = el("div", { class: "msg kind-note" },
      el("div", { class: "head" }, el("span", {}, `round ${r.round} · ${when(r.at)}`)));
    for (const m of r.messages || []) d.append(messageBox(m, "", ""));
    box.append(d);
  }
}

function renderTurns() {
  const body = $("turns");
  body.replaceChildren();
  for (const t of state.turns) {
    const tk = t.tokens || {};
    const tr = el("tr", { class: "turn", dataset: { turn: t.turn } },
      el("td", {}, t.turn), el("td", {}, when(t.at)), el("td", {}, t.status),
      el("td", {}, t.strategy + (t.rewritten ? " · rewritten" : "")), el("td", {}, (t.stages || []).join(", ")),
      tokensCell(tk), el("td", {}, t.recall_rounds || ""), cacheCell(t.cache));
    tr.addEventListener("click", () => openTurn(t.turn).catch(fail));
    body.append(tr);
  }
  $("turns-more").hidden = state.turns.length >= state.turnsTotal;
}

/// A turn's prompt cache against the session's previous turn: why it missed (the stage of a re-cut) and where the
/// request first differed — the tools, the system prompt, or message #index at its byte — with the missed tokens
/// (`~` when estimated); "hit" for an exact extension, empty for the first turn or one without the analysis.
function cacheCell(c) {
  if (!c) return el("td", { class: "cache muted" }, "");
  const title = `cached ${c.cached_tokens ?? "not reported"}` +
    (c.uncached_tokens != null ? ` · uncached ${c.uncached_tokens}` : "") +
    (c.dollars ? ` · missed ${dollars(c.dollars.missed)} more than a hit` : "") +
    (c.gap_ms != null ? ` · ${Math.round(c.gap_ms / 1000)} s after the previous turn` : "") +
    (c.cache_ttl_secs != null ? ` (cache_ttl ${c.cache_ttl_secs} s)` : "");
  if (!c.cause) {
    return el("td", { class: "cache muted", title }, c.gap_ms == null ? "first" : "hit");
  }
  const where = c.part === "messages" ? `#${c.index}` + (c.byte != null ? ` byte ${c.byte}` : "")
    : c.part || "";
  const text = c.cause + (c.stage ? ` (${c.stage})` : "") + (where ? ` @ ${where}` : "") +
    ` · ${c.estimated ? "~" : ""}${c.missed_tokens || 0} missed`;
  return el("td", { class: "cache miss", title }, text);
}

/// A turn's token figures: what the client sent → what went upstream / the window; "not counted" (explained in
/// its title) for a request sent as it came without being counted.
function tokensCell(tk) {
  if (tk.client == null && tk.sent == null) {
    return el("td", { class: "muted not-counted", title: NOT_COUNTED_WHY }, `${NOT_COUNTED} / ${tk.window}`);
  }
  const n = (v) => (v == null ? "not counted" : v);
  return el("td", {}, `${n(tk.client)} → ${n(tk.sent)} / ${tk.window}`);
}

async function moreTurns() {
  const id = encodeURIComponent(state.session.id);
  const page = await api(`/admin/sessions/${id}/turns?messages=false&limit=${TURNS_PAGE}&offset=${state.turns.length}`);
  state.turns = state.turns.concat(page.turns);
  renderTurns();
}

let turnAsked = 0;

/// Opens turn `n` (numbered from 1, as the admin API numbers them; `offset` counts the turns before it).
async function openTurn(n) {
  const s = state.session;
  const asked = ++turnAsked;
  const page = await api(`/admin/sessions/${encodeURIComponent(s.id)}/turns?offset=${n - 1}&limit=1`);
  // A turn asked for later (or another session) wins.
  if (asked !== turnAsked || state.session !== s) return;
  const t = page.turns[0];
  // The history as far as the turn's head (all of it for a turn of another branch).
  await historyThrough(s, t.head);
  if (asked !== turnAsked || state.session !== s) return;
  for (const tr of $("turns").children) tr.classList.toggle("selected", tr.dataset.turn === String(n));
  $("turn-title").textContent = `Turn ${t.turn} · ${t.model} · ${t.strategy}` +
    (t.rewritten ? ` · ${(t.stages || []).join(", ")}` : " · sent as the client sent it");
  // What became of each message of the history: sent as it was, replaced (by what kind), or not sent.
  const fate = new Map();
  for (const f of t.sent_from) {
    if (f.node) fate.set(f.node, { state: "sent" });
    for (const r of f.replaces || []) fate.set(r, { state: "replaced", kind: f.kind });
  }
  const upto = s.ids.indexOf(t.head);
  const hist = $("turn-history");
  hist.replaceChildren();
  const last = upto >= 0 ? upto : s.messages.length - 1;
  for (let i = 0; i <= last; i++) {
    const f = fate.get(s.ids[i]) || { state: "dropped" };
    const label = f.state === "sent" ? "sent as is" : f.state === "replaced" ? `replaced: ${f.kind}` : "not sent";
    hist.append(messageBox(s.messages[i], `#${i}`, "state-" + f.state, label));
  }
  const sent = $("turn-sent");
  sent.replaceChildren();
  t.messages_sent.forEach((m, k) => {
    const f = t.sent_from[k] || {};
    if (f.node) sent.append(messageBox(m, `sent #${k}`, "state-sent"));
    else sent.append(messageBox(m, `sent #${k}`, "kind-" + f.kind, f.kind));
  });
  const recall = $("turn-recall");
  recall.replaceChildren();
  if (t.recall_calls && t.recall_calls.length) {
    recall.append(el("h4", {}, `Recall calls answered by ctxgate (${t.recall_rounds} round(s))`));
    for (const c of t.recall_calls) {
      recall.append(el("div", { class: "msg kind-note" }, `${c.name}(${JSON.stringify(c.arguments)})`));
      const answer = findAnswer(s, c.id);
      if (answer) recall.append(messageBox(answer, "answer", "kind-note"));
    }
  }
  $("turn-view").hidden = false;
}

/// The answer ctxgate gave to recall call `id`, from the session's recall rounds.
function findAnswer(s, id) {
  for (const r of s.internal) {
    for (const m of r.messages || []) {
      const text = JSON.stringify(m);
      if (id && text.includes(id) && (m.role === "tool" || m.role === "user" || m.type === "function_call_output")) return m;
    }
  }
  return null;
}

function renderTimeline() {
  const turns = state.turns;
  const box = $("timeline-box");
  box.replaceChildren();
  if (!turns.length) { box.append(el("p", { class: "muted" }, "no turns recorded")); return; }
  const W = 900, H = 300, L = 60, B = 30;
  const max = Math.max(1, ...turns.map((t) => Math.max(t.tokens.window || 0, t.tokens.client || 0, t.tokens.sent || 0)));
  const x = (i) => L + (turns.length === 1 ? (W - L) / 2 : (i * (W - L - 10)) / (turns.length - 1));
  const y = (v) => H - B - ((H - B - 10) * v) / max;
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("id", "timeline");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", "100%");
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  add("line", { x1: L, y1: H - B, x2: W, y2: H - B, stroke: "#ccc" });
  for (const f of [0, 0.5, 1]) add("text", { x: 4, y: y(max * f) + 4 }, Math.round(max * f));
  const series = [["window", "#a02c2c"], ["client", "#8a8a8f"], ["sent", "#3451b2"]];
  for (const [key, color] of series) {
    const pts = turns.map((t, i) => [x(i), t.tokens[key]]).filter(([, v]) => v != null);
    add("polyline", { class: "line-" + key, fill: "none", stroke: color, "stroke-width": 2,
      points: pts.map(([px, v]) => `${px},${y(v)}`).join(" ") });
    if (key === "window") continue;
    turns.forEach((t, i) => {
      const v = t.tokens[key];
      if (v == null) return;
      const c = add("circle", { class: "pt-" + key, cx: x(i), cy: y(v), r: 3.5, fill: color });
      const title = document.createElementNS(NS, "title");
      title.textContent = `turn ${t.turn}: ${key} ${v} tokens`;
      c.append(title);
    });
  }
  add("text", { x: L, y: H - 8 }, `turn ${turns[0].turn}`);
  add("text", { x: W - 60, y: H - 8 }, `turn ${turns[turns.length - 1].turn}`);
  box.append(svg);
}

function tab(name) {
  for (const b of document.querySelectorAll(".tabs button")) b.classList.toggle("active", b.dataset.tab === name);
  for (const p of ["turns", "history", "records", "timeline"]) $("pane-" + p).hidden = p !== name;
  if (name === "timeline") renderTimeline();
}

async function pin() {
  const v = $("strategy").value || null;
  const id = encodeURIComponent(state.session.id);
  const meta = await api("/admin/sessions/" + id, {
    method: "PATCH", headers: { "content-type": "application/json" }, body: JSON.stringify({ strategy: v }),
  });
  $("strategy-said").textContent = meta.strategy ? `pinned: ${meta.strategy}` : "unpinned";
}

// --- routing -------------------------------------------------------------------------------------------------

async function route() {
  $("error").textContent = "";
  const m = location.hash.match(/^#\/s\/(.+)$/);
  try {
    if (m) await openSession(decodeURIComponent(m[1]));
    else await loadList();
  } catch (e) { fail(e); }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if ($("token").value) sessionStorage.setItem(TOKEN_KEY, $("token").value);
    else sessionStorage.removeItem(TOKEN_KEY);
    $("login-error").textContent = "";
    route();
  });
  $("logout").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); route(); });
  let typing;
  $("search").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.q = $("search").value.trim(); state.offset = 0; loadList().catch(fail); }, 250);
  });
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); loadList().catch(fail); });
  $("next").addEventListener("click", () => { state.offset += PAGE; loadList().catch(fail); });
  $("more").addEventListener("click", () => renderMore().catch(fail));
  $("turns-more").addEventListener("click", () => moreTurns().catch(fail));
  $("strategy").addEventListener("change", () => pin().catch(fail));
  for (const b of document.querySelectorAll(".tabs button")) b.addEventListener("click", () => tab(b.dataset.tab));
  window.addEventListener("hashchange", route);
  route();
});
