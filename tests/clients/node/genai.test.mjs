// The Google Gen AI SDK (`@google/genai`, pinned in tests/clients/gemini and installed into target/clients-gemini by
// tests/clients/run; GENAI_MODULE=… to load it from elsewhere) through ctxgate, on the base URL Gemini CLI's
// GOOGLE_GEMINI_BASE_URL takes — the gateway's root (the SDK appends `/v1beta/models/{model}:{method}`): a function
// call round with generateContent and with generateContentStream, countTokens, an error in Google's shape, and a long
// history ctxgate rewrites, with a recall round it answers itself inside the stream.
import { after, before, beforeEach, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { startStack } from "./harness.mjs";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const MODULE = process.env.GENAI_MODULE ?? join(REPO, "target/clients-gemini/node_modules/@google/genai/dist/node/index.mjs");
const missing = !existsSync(MODULE);
if (missing && process.env.CTXGATE_REQUIRE_EXTERNAL) throw new Error(`no @google/genai at ${MODULE}: run tests/clients/run`);
const { GoogleGenAI, ApiError } = missing ? {} : await import(pathToFileURL(MODULE).href);
const skip = missing ? `no @google/genai at ${MODULE}: run tests/clients/run (or set GENAI_MODULE)` : false;

const KEY = "gemini-node-test";
const MODEL = "gemini-2.5-flash";
// Not a `gemini-*` name: the gateway's default 8,000-token window applies, so the long history below overflows it.
const SMALL = "mock-gemini-small";
const RECALL = "recall_tool_call";
const SEARCH = "search_history";
const READ_FILE = {
  name: "read_file",
  description: "Reads a file.",
  parametersJsonSchema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
};

let stack;
let ai;

before(async () => {
  if (skip) return;
  stack = await startStack("[context]\ndefault_context_window = 8000\n");
  ai = new GoogleGenAI({ apiKey: KEY, httpOptions: { baseUrl: stack.root } });
});
after(async () => {
  await stack?.stop();
});
beforeEach(async () => {
  await stack?.mock.reset();
});

const gText = (text, extra = {}) => ({ gemini: { parts: text, ...extra } });
const gCall = (id, name, args, text) => ({
  gemini: { parts: [...(text ? [{ text }] : []), { functionCall: { id, name, args } }] },
});

const user = (text) => ({ role: "user", parts: [{ text }] });
/** The text a chunk or response says (its non-thought text parts; `.text` warns about function call parts). */
const said = (c) =>
  (c.candidates?.[0]?.content?.parts ?? [])
    .filter((p) => typeof p.text === "string" && !p.thought)
    .map((p) => p.text)
    .join("");
const answered = (call, output) => ({
  role: "user",
  parts: [{ functionResponse: { id: call.id, name: call.name, response: { output } } }],
});

/** The sessions ctxgate holds, by id. */
async function sessionIds() {
  const { sessions } = await stack.admin("/sessions?limit=1000");
  return new Set(sessions.map((s) => s.id));
}

/** Checks the upstream requests of a round: the SDK's paths and key reached the mock, the model's turn (with its
 * thought signature) and the function response went back in the second. */
function checkRound(ups, method) {
  assert.equal(ups.length, 2);
  for (const up of ups) {
    assert.equal(up.uri, `/v1beta/models/${MODEL}:${method}`);
    assert.equal(up.headers["x-goog-api-key"], KEY, "the key reaches the upstream");
    assert.equal(up.reply.status, 200);
  }
  const contents = ups[1].body.contents;
  const modelTurn = contents.at(-2);
  assert.equal(modelTurn.role, "model");
  const callPart = modelTurn.parts.find((p) => p.functionCall);
  assert.equal(callPart.functionCall.id, "call_1");
  assert.ok(callPart.thoughtSignature, "the thought signature goes back");
  assert.deepEqual(contents.at(-1).parts[0].functionResponse, {
    id: "call_1",
    name: "read_file",
    response: { output: "fn main() {}" },
  });
}

/** Needs the Gemini pipeline: the round is one ctxgate session in Gemini's shape, holding `holding`. */
async function checkSession(beforeIds, holding) {
  const fresh = [...(await sessionIds())].filter((id) => !beforeIds.has(id));
  assert.equal(fresh.length, 1, `one new session, got ${fresh}`);
  let view;
  for (let i = 0; i < 100; i++) {
    view = await stack.admin(`/sessions/${encodeURIComponent(fresh[0])}`);
    if (JSON.stringify(view.messages).includes(holding)) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(view.dialect, "gemini");
  assert.ok(JSON.stringify(view.messages).includes(holding));
}

test("generateContent: a function call round", { skip }, async () => {
  await stack.mock.script(
    gCall("call_1", "read_file", { path: "src/main.rs" }),
    gText("main.rs is empty.", { usage: { promptTokenCount: 120, candidatesTokenCount: 5 } }),
  );
  const beforeIds = await sessionIds();
  const config = { tools: [{ functionDeclarations: [READ_FILE] }] };
  const history = [user("What is in src/main.rs?")];
  const first = await ai.models.generateContent({ model: MODEL, contents: history, config });
  const [call] = first.functionCalls;
  assert.deepEqual(call, { id: "call_1", name: "read_file", args: { path: "src/main.rs" } });
  history.push(first.candidates[0].content, answered(call, "fn main() {}"));
  const second = await ai.models.generateContent({ model: MODEL, contents: history, config });
  assert.equal(second.text, "main.rs is empty.");
  assert.equal(second.candidates[0].finishReason, "STOP");
  assert.equal(second.usageMetadata.promptTokenCount, 120);
  assert.equal(second.usageMetadata.totalTokenCount, 125);
  checkRound(await stack.mock.requests(), "generateContent");
  await checkSession(beforeIds, "main.rs is empty.");
});

test("generateContentStream: a function call round", { skip }, async () => {
  await stack.mock.script(
    gCall("call_1", "read_file", { path: "src/main.rs" }, "Reading it."),
    gText("It holds an empty main function."),
  );
  const beforeIds = await sessionIds();
  const config = { tools: [{ functionDeclarations: [READ_FILE] }] };
  // another opening than the test before (the same one would continue its session: the fingerprint)
  const history = [user("Streaming, please: what is in src/main.rs?")];
  const collect = async (stream) => {
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    return chunks;
  };
  const firstChunks = await collect(await ai.models.generateContentStream({ model: MODEL, contents: history, config }));
  assert.equal(firstChunks.map(said).join(""), "Reading it.");
  const calls = firstChunks.flatMap((c) => c.functionCalls ?? []);
  assert.deepEqual(calls, [{ id: "call_1", name: "read_file", args: { path: "src/main.rs" } }]);
  const last = firstChunks.at(-1);
  assert.equal(last.candidates[0].finishReason, "STOP");
  assert.ok(last.usageMetadata.promptTokenCount > 0, "the last chunk carries the usage");
  // the model's turn as Gemini CLI rebuilds it from the chunks: its parts in order, the signature kept
  const parts = firstChunks.flatMap((c) => c.candidates[0].content.parts);
  history.push({ role: "model", parts }, answered(calls[0], "fn main() {}"));
  const secondChunks = await collect(await ai.models.generateContentStream({ model: MODEL, contents: history, config }));
  assert.equal(secondChunks.map(said).join(""), "It holds an empty main function.");
  checkRound(await stack.mock.requests(), "streamGenerateContent?alt=sse");
  await checkSession(beforeIds, "It holds an empty main function.");
});

test("countTokens", { skip }, async () => {
  const contents = [user("Count these words, please.")];
  const r = await ai.models.countTokens({ model: MODEL, contents });
  assert.ok(Number.isInteger(r.totalTokens) && r.totalTokens > 0, JSON.stringify(r));
  const ups = await stack.mock.requests();
  // a count that needs no rewrite: the SDK's own body, byte for byte, and no session
  assert.equal(ups.length, 1);
  assert.equal(ups[0].uri, `/v1beta/models/${MODEL}:countTokens`);
  assert.deepEqual(ups[0].body, { contents });
});

test("countTokens of a long history counts what ctxgate would send", { skip }, async () => {
  const contents = agentHistory();
  const beforeIds = await sessionIds();
  const r = await ai.models.countTokens({ model: SMALL, contents });
  const [up, ...rest] = await stack.mock.requests();
  assert.equal(rest.length, 0);
  assert.equal(up.uri, `/v1beta/models/${SMALL}:countTokens`);
  // planned like a turn: the rewritten request, as a generateContentRequest (it carries ctxgate's tools)
  const inner = up.body.generateContentRequest;
  assert.ok(inner && Array.isArray(inner.contents), JSON.stringify(up.body).slice(0, 200));
  assert.ok(!up.raw.includes("MARKER-0 line0"), "the oldest output is cleared in what is counted");
  assert.ok(r.totalTokens < JSON.stringify(contents).length / 4, `counted ${r.totalTokens}`);
  assert.deepEqual(await sessionIds(), beforeIds, "a count records nothing");
});

test("an upstream error reaches the SDK in Google's shape", { skip }, async () => {
  await stack.mock.script({ gemini_error: { status: "RESOURCE_EXHAUSTED", message: "Quota exceeded for the mock." } });
  await assert.rejects(ai.models.generateContent({ model: MODEL, contents: [user("hi")] }), (e) => {
    assert.ok(e instanceof ApiError, String(e));
    assert.equal(e.status, 429);
    assert.match(e.message, /Quota exceeded for the mock\./);
    assert.match(e.message, /RESOURCE_EXHAUSTED/);
    return true;
  });
});

/** A coding agent's Gemini history whose function responses overflow an 8,000-token window. */
function agentHistory(n = 14, words = 300) {
  const contents = [user("Fix the failing test.")];
  for (let i = 0; i < n; i++) {
    const call = { id: `fc_${i}`, name: "read_file", args: { path: `src/f${i}.rs` } };
    const filler = Array.from({ length: words }, (_, w) => `line${w}`).join(" ");
    contents.push({ role: "model", parts: [{ functionCall: call }] }, answered(call, `MARKER-${i} ${filler}`));
  }
  contents.push(user("What does the first file start with?"));
  return contents;
}

test("a rewritten stream with a recall round the client never sees", { skip }, async () => {
  await stack.mock.script(
    gCall("r1", RECALL, { call_id: "fc_0" }, "Let me look."),
    gText("It says MARKER-0."),
  );
  const contents = agentHistory();
  const config = { tools: [{ functionDeclarations: [READ_FILE] }] };
  const chunks = [];
  for await (const c of await ai.models.generateContentStream({ model: SMALL, contents, config })) chunks.push(c);
  assert.equal(chunks.map(said).join(""), "Let me look.It says MARKER-0.");
  const seen = JSON.stringify(chunks);
  assert.ok(!seen.includes(RECALL) && !seen.includes(SEARCH), "the client never sees ctxgate's tool");
  assert.deepEqual(chunks.flatMap((c) => c.functionCalls ?? []), []);
  assert.equal(chunks.at(-1).candidates[0].finishReason, "STOP");
  const rewrite = chunks[0].sdkHttpResponse?.headers?.["x-ctxgate-rewrite"];
  assert.ok(rewrite, "ctxgate says it rewrote the request");

  // upstream saw the rewritten request offering the recall tool, then the same plus the model's call and the answer
  const [first, second, ...rest] = await stack.mock.requests();
  assert.equal(rest.length, 0);
  assert.equal(first.uri, `/v1beta/models/${SMALL}:streamGenerateContent?alt=sse`);
  const names = first.body.tools.flatMap((t) => t.functionDeclarations ?? []).map((d) => d.name);
  assert.equal(names[0], "read_file");
  assert.ok(names.includes(RECALL), `offered: ${names}`);
  assert.ok(first.raw.length < JSON.stringify({ contents, tools: config.tools }).length, "the history was shortened");
  assert.ok(!first.raw.includes("MARKER-0 line0"), "the oldest output left");
  const sent = second.body.contents;
  const call = sent.filter((c) => c.role === "model").flatMap((c) => c.parts).find((p) => p.functionCall?.id === "r1");
  assert.equal(call.functionCall.name, RECALL);
  const [answer] = sent
    .filter((c) => c.role === "user")
    .flatMap((c) => c.parts)
    .filter((p) => p.functionResponse?.id === "r1");
  assert.ok(JSON.stringify(answer).includes("MARKER-0 line0"), "ctxgate answered with the cleared output");
  for (const up of [first, second]) assert.equal(up.headers["x-goog-api-key"], KEY);
});
