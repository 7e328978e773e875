// The Anthropic TypeScript SDK (`@anthropic-ai/sdk`) through ctxgate, on the base URL docs/clients.md gives it —
// the gateway's root, the same value as Claude Code's ANTHROPIC_BASE_URL (the SDK appends `/v1/messages`) — as the
// `baseURL` option and as the environment variable: a message and a stream, both managed (ctxgate names the session).
import { after, afterEach, before, beforeEach, test } from "node:test";
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { checkExchanges, startStack, tapFetch } from "./harness.mjs";

const KEY = "sk-ant-node-test";
const MODEL = "claude-mock-4";

let stack;
let tap;

before(async () => {
  stack = await startStack();
});
after(async () => {
  await stack?.stop();
});
beforeEach(async () => {
  await stack.mock.reset();
  tap = tapFetch();
});
afterEach(async () => {
  const ups = await stack.mock.requests();
  await checkExchanges(tap.exchanges, ups);
  for (const up of ups) assert.equal(up.headers["content-encoding"], undefined, "the SDK sends plain JSON");
});

const text = (t) => ({ anthropic: { content: [{ type: "text", text: t }], usage: { input_tokens: 12, output_tokens: 5 } } });

test("baseURL: <ctxgate> (no /v1): messages.create", async () => {
  await stack.mock.script(text("Hello from the mock."));
  const client = new Anthropic({ baseURL: stack.root, apiKey: KEY, fetch: tap.fetch, maxRetries: 0 });
  const msg = await client.messages.create({ model: MODEL, max_tokens: 100, messages: [{ role: "user", content: "hello" }] });
  assert.equal(msg.content[0].text, "Hello from the mock.");
  const [up] = await stack.mock.requests();
  assert.equal(up.uri, "/v1/messages");
  assert.ok([up.headers["x-api-key"], up.headers.authorization].some((v) => v?.includes(KEY)), "the key reaches the upstream");
  assert.ok(tap.exchanges[0].headers.get("x-ctxgate-session"), "managed: ctxgate names the session");
});

test("ANTHROPIC_BASE_URL=<ctxgate> (no /v1): messages.stream", async () => {
  const saved = process.env.ANTHROPIC_BASE_URL;
  process.env.ANTHROPIC_BASE_URL = stack.root;
  try {
    await stack.mock.script(text("Streamed through ctxgate."));
    const client = new Anthropic({ apiKey: KEY, fetch: tap.fetch, maxRetries: 0 });
    const stream = client.messages.stream({ model: MODEL, max_tokens: 100, messages: [{ role: "user", content: "stream" }] });
    const final = await stream.finalMessage();
    assert.equal(final.content[0].text, "Streamed through ctxgate.");
    assert.equal(final.stop_reason, "end_turn");
    assert.equal(new URL(tap.exchanges[0].url).pathname, "/v1/messages");
    assert.ok(tap.exchanges[0].headers.get("x-ctxgate-session"), "managed: ctxgate names the session");
  } finally {
    if (saved === undefined) delete process.env.ANTHROPIC_BASE_URL;
    else process.env.ANTHROPIC_BASE_URL = saved;
  }
});
