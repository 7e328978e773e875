"""A small agent loop to watch ctxgate rewrite a conversation (the README's tour), against the mock upstream.

The "model" is `ctxgate mock-upstream`, told in advance (over its control API, on its own port) to ask for sixteen
files one by one, then answer. The agent does what every agent does: runs each tool call, appends the call and its
result, and sends the whole conversation again. Each file is about 450 tokens, so after a few turns the
conversation passes 80% of the 8,000-token window that examples/tour.toml gives `gpt-4o-mini`, and ctxgate starts
rewriting what it sends upstream: old tool results become short placeholders the model can recall.

    python3 examples/agent.py      # needs `pip install openai`, and the tour's mock (:8788) and gateway (:8787)
"""

import json
import urllib.request

from openai import OpenAI

GATEWAY = "http://127.0.0.1:8787/v1"
MOCK = "http://127.0.0.1:8788"  # the mock's control API, reached directly (ctxgate forwards only /v1/*)
FILES = 16


def completion(message):
    """A reply for the mock to give: a chat completion carrying `message`."""
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {"json": {"id": "chatcmpl-tour", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini",
                     "choices": [{"index": 0, "message": message, "finish_reason": finish}]}}


def read_file(path):
    """The agent's tool: a made-up file of about 300 tokens."""
    return "\n".join(f"{path} line {n}: release 2.{n} fixes parser bug #{100 + n} in module m{n}." for n in range(20))


# The model's side of the conversation: one read_file call per turn, then a final answer.
script = [
    completion({"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{i}", "type": "function",
        "function": {"name": "read_file", "arguments": json.dumps({"path": f"notes/part-{i}.txt"})}}]})
    for i in range(1, FILES + 1)
] + [completion({"role": "assistant", "content": "Version 2.0 fixes the parser bugs listed in the notes."})]
urllib.request.urlopen(urllib.request.Request(
    MOCK + "/_mock/script", data=json.dumps(script).encode(), headers={"content-type": "application/json"}))

client = OpenAI(base_url=GATEWAY, api_key="anything")  # the mock needs no key; the SDK needs one
tools = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
messages = [
    {"role": "system", "content": "You are a careful coding agent."},
    {"role": "user", "content": "Read the release notes part by part and tell me what changed in 2.0."},
]
for turn in range(1, FILES + 2):
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=messages, tools=tools,
        extra_headers={"x-session-id": "tour"},  # name the conversation (else ctxgate fingerprints its opening)
    )
    rewrite = raw.headers.get("x-ctxgate-rewrite", "-")  # only on answers to rewritten requests
    print(f"turn {turn:2}: {len(messages):2} messages, rewrite: {rewrite}")
    reply = raw.parse().choices[0].message
    messages.append(reply.model_dump(exclude_none=True))
    for call in reply.tool_calls or []:
        path = json.loads(call.function.arguments)["path"]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": read_file(path)})
print("answer:", reply.content)
