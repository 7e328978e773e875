// Test harness for the Node client suite (the openai and @anthropic-ai/sdk npm packages, the Vercel AI SDK): starts
// the built `ctxgate` (CTXGATE_BIN, else the newest of target/debug and target/release; run `cargo build` first) in
// front of `ctxgate mock-upstream`, both on OS-chosen loopback ports; scripts the mock through its control API
// (/_mock/*, see src/mock.rs); records what the client receives through a teeing fetch; and checks every exchange
// against what the mock sent.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, statSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";

export const MODEL = "mock-model";
const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

function binary() {
  if (process.env.CTXGATE_BIN) return process.env.CTXGATE_BIN;
  const found = ["target/debug/ctxgate", "target/release/ctxgate"].map((p) => join(REPO, p)).filter(existsSync);
  if (found.length === 0) throw new Error("no ctxgate binary: run `cargo build` first (or set CTXGATE_BIN)");
  return found.sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)[0];
}

/** Starts a process and resolves with the first match of `pattern` in its stderr (group 1). */
function start(args, pattern) {
  const proc = spawn(binary(), args, { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, NO_COLOR: "1" } });
  let log = "";
  return new Promise((resolvePromise, reject) => {
    const timer = setTimeout(() => reject(new Error(`${args[0]} did not start:\n${log}`)), 20_000);
    proc.stderr.on("data", (d) => {
      log += d;
      const m = log.match(pattern);
      if (m && timer) {
        clearTimeout(timer);
        resolvePromise({ proc, value: m[1] });
      }
    });
    proc.on("exit", (code) => reject(new Error(`${args[0]} exited with ${code}:\n${log}`)));
  });
}

/** The mock upstream and ctxgate in front of it (both OpenAI APIs, Anthropic Messages and the Gemini API go to the mock); `extra`
 * is TOML appended to the gateway's config. */
export async function startStack(extra = "") {
  const dir = mkdtempSync(join(tmpdir(), "ctxgate-node-"));
  const mock = await start(["mock-upstream", "--listen", "127.0.0.1:0"], /base_url\W+(http:\/\/127\.0\.0\.1:\d+\/v1)/);
  const config = join(dir, "ctxgate.toml");
  writeFileSync(
    config,
    `[server]\nlisten = "127.0.0.1:0"\n[upstream]\nbase_url = "${mock.value}"\ntimeout_secs = 30\n` +
      `[anthropic]\nbase_url = "${mock.value}"\n[gemini]\nbase_url = "${mock.value.replace(/\/v1$/, "")}"\n[store]\npath = "${join(dir, "ctxgate.db")}"\n${extra}\n`,
  );
  const gw = await start(["serve", "--config", config, "--log-format", "json"], /"listen":"(127\.0\.0\.1:\d+)"/);
  const mockRoot = mock.value.replace(/\/v1$/, "");
  const root = `http://${gw.value}`;
  return {
    /** ctxgate's address without a path (what Claude Code's ANTHROPIC_BASE_URL takes). */
    root,
    baseURL: `${root}/v1`,
    /** The mock's own `/v1` (for showing what a client gets without ctxgate in between). */
    mockURL: mock.value,
    /** The admin API (open to loopback peers without a token). */
    async admin(path) {
      const r = await fetch(`${root}/admin${path}`);
      assert.equal(r.status, 200, await r.clone().text());
      return r.json();
    },
    mock: {
      async script(...replies) {
        const r = await fetch(`${mockRoot}/_mock/script`, { method: "POST", body: JSON.stringify(replies) });
        assert.equal(r.status, 200, await r.text());
      },
      async requests() {
        return (await fetch(`${mockRoot}/_mock/requests`)).json();
      },
      async reset() {
        await fetch(`${mockRoot}/_mock/reset`, { method: "POST" });
      },
    },
    async stop() {
      for (const p of [gw.proc, mock.proc]) p.kill("SIGTERM");
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A fetch that records every exchange; the body is teed, so streams still reach the client as they arrive. */
export function tapFetch() {
  const exchanges = [];
  const tee = async (url, init) => {
    const resp = await fetch(url, init);
    const [mine, theirs] = resp.body ? resp.body.tee() : [null, null];
    const ex = {
      url: String(url),
      request: typeof init?.body === "string" ? init.body : null,
      requestHeaders: new Headers(init?.headers),
      headers: resp.headers,
      status: resp.status,
      contentType: resp.headers.get("content-type") ?? "",
      body: mine ? new Response(mine).text() : Promise.resolve(""),
    };
    exchanges.push(ex);
    return new Response(theirs, { status: resp.status, statusText: resp.statusText, headers: resp.headers });
  };
  return { fetch: tee, exchanges };
}

// --- reply specs (as MockReply::from_spec takes them) -------------------------------------------------------------

export function completion(content, toolCalls) {
  const message = { role: "assistant", content, refusal: null };
  if (toolCalls) message.tool_calls = toolCalls;
  return {
    json: {
      id: "chatcmpl-mock",
      object: "chat.completion",
      created: 1_700_000_000,
      model: MODEL,
      choices: [{ index: 0, message, logprobs: null, finish_reason: toolCalls ? "tool_calls" : "stop" }],
      usage: { prompt_tokens: 12, completion_tokens: 5, total_tokens: 17 },
    },
  };
}

export function chunk(delta, finish = null) {
  return {
    id: "chatcmpl-mock",
    object: "chat.completion.chunk",
    created: 1_700_000_000,
    model: MODEL,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
  };
}

export function sseText(pieces) {
  return {
    sse: [chunk({ role: "assistant", content: "" }), ...pieces.map((p) => chunk({ content: p })), chunk({}, "stop")],
    usage: { prompt_tokens: 12, completion_tokens: pieces.length, total_tokens: 12 + pieces.length },
  };
}

export function sseToolCall(id, name, args) {
  const a = JSON.stringify(args);
  const half = Math.floor(a.length / 2);
  return {
    sse: [
      chunk({ role: "assistant", content: null, tool_calls: [{ index: 0, id, type: "function", function: { name, arguments: "" } }] }),
      chunk({ tool_calls: [{ index: 0, function: { arguments: a.slice(0, half) } }] }),
      chunk({ tool_calls: [{ index: 0, function: { arguments: a.slice(half) } }] }),
      chunk({}, "tool_calls"),
    ],
    usage: { prompt_tokens: 20, completion_tokens: 7, total_tokens: 27 },
  };
}

// --- checks -----------------------------------------------------------------------------------------------------------

/** The `data:` payloads of an SSE body, `[DONE]` included. */
export function sseData(text) {
  return text
    .replace(/\r\n/g, "\n")
    .split("\n\n")
    .map((block) => block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n"))
    .filter((d) => d.length > 0);
}

const COMPLETION_KEYS = ["id", "object", "created", "model", "choices"];

const MANAGED = /\/v1\/(chat\/completions|responses|messages)(\?|$)/;

/** Every exchange on a managed path (chat completions, Responses, Messages): the request reached the mock byte for
 * byte and the client got exactly the mock's reply (nothing added: no field, no chunk, no event); chat completions
 * and chunks have the shape of their type. With `rewritten`, a request that reached the mock changed (ctxgate
 * rewrote it) is allowed: its answer is then left to the test. */
export async function checkExchanges(exchanges, upstream, { rewritten = false } = {}) {
  const unmatched = [...upstream];
  for (const ex of exchanges) {
    const path = new URL(ex.url).pathname;
    if (!MANAGED.test(path)) continue;
    const i = unmatched.findIndex((u) => u.raw === ex.request);
    if (i < 0) {
      assert.ok(rewritten, `ctxgate changed a request it had no reason to rewrite: ${ex.request?.slice(0, 300)}`);
      continue;
    }
    const { reply } = unmatched.splice(i, 1)[0];
    const body = await ex.body;
    assert.equal(ex.status, reply.status);
    const chat = path.endsWith("/chat/completions");
    if (reply.sse !== undefined) {
      assert.equal(body, reply.sse, "the stream differs from the upstream's");
      if (!chat) continue;
      const data = sseData(body);
      assert.equal(data.at(-1), "[DONE]");
      assert.equal(data.filter((d) => d === "[DONE]").length, 1);
      for (const d of data.slice(0, -1)) {
        const c = JSON.parse(d);
        for (const k of COMPLETION_KEYS) assert.ok(k in c, `chunk without ${k}: ${d}`);
        assert.equal(c.object, "chat.completion.chunk");
      }
    } else {
      assert.equal(body, reply.body, "the body differs from the upstream's");
      const v = JSON.parse(body);
      if (!chat) continue;
      if (ex.status === 200) {
        for (const k of COMPLETION_KEYS) assert.ok(k in v, `completion without ${k}`);
        assert.equal(v.object, "chat.completion");
      } else {
        assert.equal(typeof v.error, "object");
      }
    }
  }
}
