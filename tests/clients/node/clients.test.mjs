// The openai npm package through ctxgate (in front of the mock upstream): create, streamed create, the
// chat.completions.stream() helper with tools, an upstream rate limit, and the base URL from OPENAI_BASE_URL.
import { after, before, beforeEach, afterEach, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { MODEL, checkExchanges, completion, sseText, sseToolCall, startStack, tapFetch } from "./harness.mjs";

let stack;
let tap;
let client;

before(async () => {
  stack = await startStack();
});
after(async () => {
  await stack?.stop();
});
beforeEach(async () => {
  await stack.mock.reset();
  tap = tapFetch();
  client = new OpenAI({ baseURL: stack.baseURL, apiKey: "sk-node-test", fetch: tap.fetch, maxRetries: 0 });
});
afterEach(async () => {
  await checkExchanges(tap.exchanges, await stack.mock.requests());
});

test("create", async () => {
  await stack.mock.script(completion("Hello from the mock."));
  const resp = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hello" }] });
  assert.equal(resp.choices[0].message.content, "Hello from the mock.");
  assert.equal(resp.usage.total_tokens, 17);
  const [up] = await stack.mock.requests();
  assert.equal(up.uri, "/v1/chat/completions");
  assert.equal(up.headers.authorization, "Bearer sk-node-test");
});

test("streamed create with usage", async () => {
  await stack.mock.script(sseText(["Hel", "lo ", "world"]));
  const stream = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: "stream please" }],
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let usage;
  for await (const c of stream) {
    text += c.choices[0]?.delta?.content ?? "";
    if (c.usage) usage = c.usage;
  }
  assert.equal(text, "Hello world");
  assert.equal(usage.completion_tokens, 3);
});

test("chat.completions.stream() with tools", async () => {
  await stack.mock.script(sseToolCall("call_n1", "get_weather", { city: "Oslo" }));
  const done = [];
  const stream = client.chat.completions
    .stream({
      model: MODEL,
      messages: [{ role: "user", content: "Weather in Oslo?" }],
      tools: [
        {
          type: "function",
          function: {
            name: "get_weather",
            parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
          },
        },
      ],
      stream_options: { include_usage: true },
    })
    .on("tool_calls.function.arguments.done", (e) => done.push(e.name));
  const final = await stream.finalChatCompletion();
  assert.deepEqual(done, ["get_weather"]);
  assert.equal(final.choices[0].finish_reason, "tool_calls");
  const [call] = final.choices[0].message.tool_calls;
  assert.equal(call.id, "call_n1");
  assert.deepEqual(JSON.parse(call.function.arguments), { city: "Oslo" });
  assert.equal(final.usage.total_tokens, 27);
});

test("an upstream 429 is a RateLimitError", async () => {
  const message = "Rate limit reached for mock-model.";
  await stack.mock.script({ status: 429, body: { error: { message, type: "requests", param: null, code: "rate_limit_exceeded" } } });
  await assert.rejects(
    client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "again" }] }),
    (e) => e instanceof OpenAI.RateLimitError && e.status === 429 && e.error.message === message,
  );
});

test("OPENAI_BASE_URL=<ctxgate>/v1, no baseURL of its own", async () => {
  const saved = process.env.OPENAI_BASE_URL;
  process.env.OPENAI_BASE_URL = stack.baseURL; // http://127.0.0.1:PORT/v1
  try {
    await stack.mock.script(completion("via the environment"));
    const fromEnv = new OpenAI({ apiKey: "sk-node-test", fetch: tap.fetch, maxRetries: 0 });
    const resp = await fromEnv.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }] });
    assert.equal(resp.choices[0].message.content, "via the environment");
    assert.equal(new URL(tap.exchanges[0].url).pathname, "/v1/chat/completions");
    assert.ok(tap.exchanges[0].headers.get("x-ctxgate-session"), "managed: ctxgate names the session");
  } finally {
    if (saved === undefined) delete process.env.OPENAI_BASE_URL;
    else process.env.OPENAI_BASE_URL = saved;
  }
});
