// The Vercel AI SDK (`ai`, `@ai-sdk/openai`, `@ai-sdk/anthropic`) through ctxgate, in front of the mock upstream,
// on each of its three wire APIs: `openai(model)` (the Responses API, the provider's default), `openai.chat(model)`
// (chat completions) and `anthropic(model)` (Messages). For each: generateText, streamText, a tool loop the SDK runs
// itself (`stopWhen`), and a long agent run that outgrows the gateway's window (8,000 tokens here), which ctxgate
// rewrites while the admin API keeps the whole history. What the Responses provider sends of an earlier answer
// (an `item_reference` unless `store: false`). Then the base URLs docs/clients.md gives, exactly as given:
// the `baseURL` option and the environment variables the providers read (OPENAI_BASE_URL, ANTHROPIC_BASE_URL), and
// the trap: Claude Code's `ANTHROPIC_BASE_URL` value (no `/v1`) is a 404 for this SDK, which appends only `/messages`.
import { after, afterEach, before, beforeEach, describe, test } from "node:test";
import assert from "node:assert/strict";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { z } from "zod";
import { MODEL, checkExchanges, completion, sseText, sseToolCall, startStack, tapFetch } from "./harness.mjs";

globalThis.AI_SDK_LOG_WARNINGS = false;

const KEY = "sk-ai-sdk-test";
// Not a `claude-*` name: the gateway's default window (8,000 here) applies, as for MODEL.
const ANTHROPIC_MODEL = "mock-anthropic-small";

let stack;
let tap;
let rewritten;

before(async () => {
  stack = await startStack("[context]\ndefault_context_window = 8000\n");
});
after(async () => {
  await stack?.stop();
});
beforeEach(async () => {
  await stack.mock.reset();
  tap = tapFetch();
  rewritten = false;
});
afterEach(async () => {
  const ups = await stack.mock.requests();
  await checkExchanges(tap.exchanges, ups, { rewritten });
  for (const up of ups) assert.equal(up.headers["content-encoding"], undefined, "the AI SDK sends plain JSON");
});

// --- the three wire APIs, each as the mock scripts it and as the SDK sends it --------------------------------------

const chatCall = (id, name, args) => ({ id, type: "function", function: { name, arguments: JSON.stringify(args) } });

const DIALECTS = [
  {
    name: "openai (Responses)",
    path: "/v1/responses",
    dialect: "responses",
    model: (o) => createOpenAI({ baseURL: stack.baseURL, apiKey: KEY, fetch: tap.fetch, ...o })(MODEL),
    text: (t) => ({ responses: { output: [{ type: "message", text: t }], usage: { input_tokens: 40, output_tokens: 6 } } }),
    call: (id, name, args) => ({ responses: { output: [{ type: "function_call", call_id: id, name, arguments: args }] } }),
    /** The conversation array of an upstream request body. */
    items: (body) => body.input,
    /** The tool outputs in an upstream request body, in order. */
    outputs: (body) => body.input.filter((i) => i.type === "function_call_output").map((i) => i.output),
    credential: (headers) => headers.authorization,
  },
  {
    name: "openai.chat (chat completions)",
    path: "/v1/chat/completions",
    dialect: "chat",
    model: (o) => createOpenAI({ baseURL: stack.baseURL, apiKey: KEY, fetch: tap.fetch, ...o }).chat(MODEL),
    // chat replies are JSON or SSE as scripted, so each says which
    text: (t, stream) => (stream ? sseText(t.match(/.{1,6}/gs)) : completion(t)),
    call: (id, name, args, stream) => (stream ? sseToolCall(id, name, args) : completion(null, [chatCall(id, name, args)])),
    items: (body) => body.messages,
    outputs: (body) => body.messages.filter((m) => m.role === "tool").map((m) => m.content),
    credential: (headers) => headers.authorization,
  },
  {
    name: "anthropic (Messages)",
    path: "/v1/messages",
    dialect: "anthropic",
    model: (o) => createAnthropic({ baseURL: `${stack.root}/v1`, apiKey: KEY, fetch: tap.fetch, ...o })(ANTHROPIC_MODEL),
    text: (t) => ({ anthropic: { content: [{ type: "text", text: t }], usage: { input_tokens: 40, output_tokens: 6 } } }),
    call: (id, name, input) => ({ anthropic: { content: [{ type: "tool_use", id, name, input }] } }),
    items: (body) => body.messages,
    outputs: (body) =>
      body.messages
        .flatMap((m) => (Array.isArray(m.content) ? m.content : []))
        .filter((b) => b.type === "tool_result")
        .map((b) => (typeof b.content === "string" ? b.content : b.content.map((c) => c.text).join(""))),
    credential: (headers) => headers["x-api-key"],
  },
];

// Anthropic's provider asks for the model's whole output budget unless told: a small one, as agents set.
const CALL = { maxRetries: 0, maxOutputTokens: 500 };

for (const d of DIALECTS) {
  describe(d.name, () => {
    test("generateText", async () => {
      await stack.mock.script(d.text("Hello from the mock."));
      const r = await generateText({ ...CALL, model: d.model(), prompt: "hello" });
      assert.equal(r.text, "Hello from the mock.");
      assert.equal(r.finishReason, "stop");
      const [up] = await stack.mock.requests();
      assert.equal(up.uri, d.path);
      assert.ok(d.credential(up.headers)?.includes(KEY), "the key reaches the upstream");
      assert.equal(tap.exchanges.length, 1);
      // needs the managed pipeline (a passthrough does not name sessions)
      assert.ok(tap.exchanges[0].headers.get("x-ctxgate-session"), "x-ctxgate-session");
      assert.equal(tap.exchanges[0].headers.get("x-ctxgate-rewrite"), null, "a short request is sent as it came");
    });

    test("streamText", async () => {
      await stack.mock.script(d.text("Streaming through ctxgate works.", true));
      const r = streamText({ ...CALL, model: d.model(), prompt: "stream please" });
      const pieces = [];
      for await (const p of r.textStream) pieces.push(p);
      assert.equal(pieces.join(""), "Streaming through ctxgate works.");
      assert.ok(pieces.length > 1, "it arrives in pieces");
      assert.equal(await r.finishReason, "stop");
      const [up] = await stack.mock.requests();
      assert.equal(up.body.stream, true);
      assert.ok(tap.exchanges[0].headers.get("x-ctxgate-session"), "x-ctxgate-session on a stream");
      assert.match(tap.exchanges[0].contentType, /^text\/event-stream/);
    });

    test("a tool loop the SDK runs (stopWhen)", async () => {
      await stack.mock.script(d.call("call_w1", "get_weather", { city: "Oslo" }), d.text("Oslo is sunny, 21C."));
      const asked = [];
      const r = await generateText({
        ...CALL,
        model: d.model(),
        prompt: "Weather in Oslo?",
        tools: {
          get_weather: tool({
            description: "Today's weather in a city.",
            inputSchema: z.object({ city: z.string() }),
            execute: async ({ city }) => {
              asked.push(city);
              return "sunny, 21C";
            },
          }),
        },
        stopWhen: stepCountIs(5),
      });
      assert.equal(r.text, "Oslo is sunny, 21C.");
      assert.deepEqual(asked, ["Oslo"]);
      assert.equal(r.steps.length, 2);
      const ups = await stack.mock.requests();
      assert.deepEqual(
        ups.map((u) => u.uri),
        [d.path, d.path],
      );
      assert.deepEqual(d.outputs(ups[0].body), []);
      assert.deepEqual(d.outputs(ups[1].body), ["sunny, 21C"], "the SDK sent the tool's output back");
      assert.ok(JSON.stringify(ups[1].body).includes("call_w1"), "with the call it answers");
      // both steps are one ctxgate session
      const sessions = tap.exchanges.map((e) => e.headers.get("x-ctxgate-session"));
      assert.ok(sessions[0] && sessions[0] === sessions[1], String(sessions));
    });

    test("a long agent run (streamed) is rewritten, its history kept whole", async () => {
      rewritten = true;
      const STEPS = 10;
      const calls = Array.from({ length: STEPS }, (_, i) => d.call(`call_${i}`, "read_file", { path: `src/f${i}.rs` }, true));
      await stack.mock.script(...calls, d.text("All ten files read; the bug is in f3.", true));
      const filler = Array.from({ length: 450 }, (_, w) => `line${w}`).join(" ");
      const read = [];
      const r = streamText({
        ...CALL,
        model: d.model(),
        system: "You are a coding agent.",
        prompt: "Read src/f0.rs to src/f9.rs, then find the bug.",
        tools: {
          read_file: tool({
            description: "Read a file.",
            inputSchema: z.object({ path: z.string() }),
            execute: async ({ path }) => {
              read.push(path);
              return `MARKER-${read.length - 1} ${filler}`;
            },
          }),
        },
        stopWhen: stepCountIs(STEPS + 1),
      });
      assert.equal(await r.text, "All ten files read; the bug is in f3.");
      assert.equal(read.length, STEPS);
      assert.equal(tap.exchanges.length, STEPS + 1);

      // The early steps fit and go as they came; the late ones carry the rewrite header, and the mock got less
      // than the client sent.
      const headers = tap.exchanges.map((e) => e.headers.get("x-ctxgate-rewrite"));
      assert.equal(headers[0], null);
      const last = tap.exchanges.at(-1);
      assert.match(headers.at(-1) ?? "", /; tokens=\d+->\d+$/, `rewrite headers: ${JSON.stringify(headers)}`);
      const [client, sent] = headers.at(-1).match(/tokens=(\d+)->(\d+)/).slice(1).map(Number);
      assert.ok(client > 8000 && sent < client, headers.at(-1));
      const ups = await stack.mock.requests();
      assert.equal(ups.length, STEPS + 1, "no request added: the model never asked to recall");
      assert.ok(ups.at(-1).raw.length < last.request.length, "the history was shortened");
      assert.deepEqual(
        d.outputs(JSON.parse(last.request)).map((o) => o.split(" ")[0]),
        read.map((_, i) => `MARKER-${i}`),
        "the client itself sent every output",
      );
      const names = JSON.stringify(ups.at(-1).body.tools);
      assert.ok(names.includes("read_file") && names.includes("recall_tool_call"), "the recall tool is offered");
      for (const ex of await Promise.all(tap.exchanges.map((e) => e.body))) {
        assert.ok(!ex.includes("recall_tool_call"), "the client never sees ctxgate's tools");
      }

      // The admin API: one session of this dialect, all of it as the client sent it, and the turns that were
      // rewritten.
      const id = last.headers.get("x-ctxgate-session");
      assert.ok(tap.exchanges.every((e) => e.headers.get("x-ctxgate-session") === id), "one session for the run");
      const session = await stack.admin(`/sessions/${encodeURIComponent(id)}`);
      assert.equal(session.dialect, d.dialect);
      const kept = JSON.stringify(session.messages);
      for (let i = 0; i < STEPS; i++) assert.ok(kept.includes(`MARKER-${i} line0`), `MARKER-${i} kept`);
      assert.ok(session.total >= d.items(JSON.parse(last.request)).length, "the whole history");
      assert.deepEqual(session.partial, [], "every reply kept whole");
      const turns = await stack.admin(`/sessions/${encodeURIComponent(id)}/turns?messages=false&limit=50`);
      assert.equal(turns.total, STEPS + 1);
      assert.equal(turns.turns[0].rewritten, false);
      const late = turns.turns.at(-1);
      assert.equal(late.rewritten, true);
      assert.ok(late.tokens.sent < late.tokens.client, JSON.stringify(late.tokens));
    });
  });
}

// --- what the Responses provider sends of a conversation ----------------------------------------------------------

test("openai (Responses): earlier answers go as item_reference unless store: false", async () => {
  // The provider's default is `store: true`: an answer it got earlier is sent back as a reference to the copy the
  // upstream stored, which ctxgate cannot read (it forwards it as it came). With `store: false` the answer itself
  // is sent, and ctxgate keeps and manages it like any other message.
  const model = DIALECTS[0].model();
  const sent = [];
  for (const providerOptions of [undefined, { openai: { store: false } }]) {
    await stack.mock.script(DIALECTS[0].text("The first answer."), DIALECTS[0].text("The second answer."));
    const messages = [{ role: "user", content: `first question (store: ${providerOptions ? "false" : "default"})` }];
    const first = await generateText({ model, messages, providerOptions, maxRetries: 0 });
    messages.push(...first.response.messages, { role: "user", content: "second question" });
    assert.equal((await generateText({ model, messages, providerOptions, maxRetries: 0 })).text, "The second answer.");
    sent.push((await stack.mock.requests()).at(-1).body.input[1]);
  }
  assert.equal(sent[0].type, "item_reference", JSON.stringify(sent[0]));
  assert.deepEqual(sent[1].content, [{ type: "output_text", text: "The first answer." }]);
  assert.equal(sent[1].role, "assistant");
  const ids = tap.exchanges.map((e) => e.headers.get("x-ctxgate-session"));
  assert.ok(ids.every(Boolean), "managed either way");
  const kept = await stack.admin(`/sessions/${encodeURIComponent(ids[3])}`);
  assert.ok(JSON.stringify(kept.messages).includes("The first answer."), "with store: false the history holds the text");
});

// --- the base URLs docs/clients.md gives --------------------------------------------------------------------------

describe("base URLs", () => {
  const env = {};
  const setEnv = (k, v) => {
    if (!(k in env)) env[k] = process.env[k];
    process.env[k] = v;
  };
  afterEach(() => {
    for (const [k, v] of Object.entries(env)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
      delete env[k];
    }
  });

  test("OPENAI_BASE_URL=<ctxgate>/v1 (Responses and chat)", async () => {
    setEnv("OPENAI_BASE_URL", stack.baseURL); // http://127.0.0.1:PORT/v1
    setEnv("OPENAI_API_KEY", KEY);
    const openai = createOpenAI({ fetch: tap.fetch });
    await stack.mock.script(DIALECTS[0].text("via the Responses API"), completion("via chat completions"));
    assert.equal((await generateText({ model: openai(MODEL), prompt: "hi", maxRetries: 0 })).text, "via the Responses API");
    assert.equal((await generateText({ model: openai.chat(MODEL), prompt: "hi", maxRetries: 0 })).text, "via chat completions");
    assert.deepEqual(
      tap.exchanges.map((e) => [new URL(e.url).pathname, e.status, !!e.headers.get("x-ctxgate-session")]),
      [
        ["/v1/responses", 200, true],
        ["/v1/chat/completions", 200, true],
      ],
    );
  });

  test("ANTHROPIC_BASE_URL=<ctxgate>/v1 (with /v1: the provider appends only /messages)", async () => {
    setEnv("ANTHROPIC_BASE_URL", `${stack.root}/v1`);
    setEnv("ANTHROPIC_API_KEY", KEY);
    const anthropic = createAnthropic({ fetch: tap.fetch });
    await stack.mock.script(DIALECTS[2].text("via Messages"));
    const r = await generateText({ ...CALL, model: anthropic(ANTHROPIC_MODEL), prompt: "hi" });
    assert.equal(r.text, "via Messages");
    assert.equal(new URL(tap.exchanges[0].url).pathname, "/v1/messages");
    assert.ok(tap.exchanges[0].headers.get("x-ctxgate-session"));
  });

  test("Claude Code's value (no /v1) is a 404 for this SDK: it posts /messages", async () => {
    setEnv("ANTHROPIC_BASE_URL", stack.root); // http://127.0.0.1:PORT, right for Claude Code and the Anthropic SDKs
    setEnv("ANTHROPIC_API_KEY", KEY);
    const anthropic = createAnthropic({ fetch: tap.fetch });
    await assert.rejects(generateText({ ...CALL, model: anthropic(ANTHROPIC_MODEL), prompt: "hi" }), (e) => e.statusCode === 404);
    assert.equal(new URL(tap.exchanges[0].url).pathname, "/messages");
    assert.deepEqual(await stack.mock.requests(), [], "nothing reached the upstream");
  });
});
