"""The official `openai` Python SDK through ctxgate: plain and streamed completions, the streaming helper with
tools, an upstream rate limit, and a request that ctxgate rewrites and answers a recall round for."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from ctxtest import (
    MODEL,
    Gateway,
    completion,
    no_extras,
    sse_text,
    sse_tool_call,
    tool_call,
    validate_completion,
    validate_stream,
)
from openai import OpenAI
from pydantic import BaseModel

RECALL, SEARCH = "recall_tool_call", "search_history"


@pytest.fixture
def client(gw: Gateway, http_client: httpx.Client) -> OpenAI:
    return OpenAI(base_url=gw.base_url, api_key=gw.api_key, http_client=http_client, max_retries=0)


def test_create(gw: Gateway, client: OpenAI):
    gw.mock.script(completion("Hello from the mock."))
    resp = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}])
    no_extras(resp)
    assert resp.choices[0].message.content == "Hello from the mock."
    assert resp.usage and resp.usage.total_tokens == 17
    # what ctxgate sent upstream is what the SDK sent, byte for byte, to the upstream's path
    (up,) = gw.mock.requests()
    assert up["uri"] == "/v1/chat/completions"
    assert up["raw"] == gw.tap.exchanges[0].request.decode()
    assert up["headers"]["authorization"] == f"Bearer {gw.api_key}"


def test_create_with_raw_response_keeps_upstream_headers(gw: Gateway, client: OpenAI):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "who answers?"}]
    )
    assert raw.headers["x-ctxgate-session"]
    resp = raw.parse()
    # the mock's default reply, relayed untouched
    assert resp.choices[0].message.content == "mock reply"
    validate_completion(gw.mock.requests()[0]["reply"]["body"])


def test_stream_with_usage(gw: Gateway, client: OpenAI):
    gw.mock.script(sse_text(["Hel", "lo ", "world"]))
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    for c in chunks:
        no_extras(c)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello world"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage and chunks[-1].usage.completion_tokens == 3
    (up,) = gw.mock.requests()
    assert up["body"]["stream_options"] == {"include_usage": True}


class GetWeather(BaseModel):
    city: str


def test_stream_helper_with_tools(gw: Gateway, client: OpenAI):
    gw.mock.script(sse_tool_call("call_w1", "GetWeather", {"city": "Paris"}))
    with client.chat.completions.stream(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        stream_options={"include_usage": True},
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in events
    msg = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    (call,) = msg.tool_calls
    assert call.id == "call_w1" and call.function.name == "GetWeather"
    assert call.function.parsed_arguments == GetWeather(city="Paris")
    assert final.usage and final.usage.total_tokens == 27
    (up,) = gw.mock.requests()
    assert up["body"]["tools"][0]["function"]["name"] == "GetWeather"


def test_rate_limit_surfaces_as_rate_limit_error(gw: Gateway, client: OpenAI):
    message = "Rate limit reached for mock-model: 3 RPM. Please try again in 20s."
    gw.mock.script(
        {
            "status": 429,
            "headers": {"retry-after": "20"},
            "body": {"error": {"message": message, "type": "requests", "param": None, "code": "rate_limit_exceeded"}},
        }
    )
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "again"}])
    assert err.value.status_code == 429
    assert message in err.value.message  # the SDK prefixes "Error code: 429 - "
    assert err.value.body["message"] == message
    assert err.value.code == "rate_limit_exceeded"
    assert err.value.response.headers["retry-after"] == "20"
    assert len(gw.mock.requests()) == 1


# --- a request ctxgate rewrites, with a recall round the client never sees -------------------------------------


def agent_history(n: int = 14, words: int = 300) -> list[dict]:
    """A coding agent's history whose tool results overflow an 8000-token window (as in tests/recall.rs)."""
    messages: list[dict] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i in range(n):
        cid = f"call_{i}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call(cid, "read_file", {"path": f"src/f{i}.rs"})],
            }
        )
        filler = " ".join(f"line{w}" for w in range(words))
        messages.append({"role": "tool", "tool_call_id": cid, "content": f"MARKER-{i} {filler}"})
    return messages


READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


def check_recall_rounds(gw: Gateway, n_client_messages: int) -> None:
    """Upstream saw: the rewritten request offering the recall tool, then the same plus the model's recall call
    and ctxgate's answer (the pruned result, MARKER-0)."""
    first, second = gw.mock.requests()
    names = [t["function"]["name"] for t in first["body"]["tools"]]
    assert names[0] == "read_file" and RECALL in names
    assert len(first["raw"]) < len(gw.tap.exchanges[0].request), "the history was shortened"
    sent = first["body"]["messages"]
    # The client's messages (some rewritten), ctxgate's note riding at the end of the last cleared result (strict
    # role order: no message of its own); the client's own system prompt is untouched.
    assert len(sent) == n_client_messages
    assert sent[0] == json.loads(gw.tap.exchanges[0].request)["messages"][0]
    assert all(m["role"] != "system" for m in sent[1:])
    (note,) = [m for m in sent if "[ctxgate] Some earlier tool results" in (m.get("content") or "")]
    assert note["role"] == "tool" and note["content"].startswith("[ctxgate] Tool result cleared")
    assert second["body"]["messages"][: len(sent)] == sent, "the follow-up extends the first request"
    added = second["body"]["messages"][len(sent):]
    assert added[0]["role"] == "assistant" and added[0]["tool_calls"][0]["function"]["name"] == RECALL
    assert added[1]["role"] == "tool" and added[1]["tool_call_id"] == "r1"
    assert "MARKER-0 line0" in added[1]["content"]


def test_rewritten_request_with_recall_round(gw: Gateway, client: OpenAI):
    gw.rewritten = True
    gw.mock.script(
        completion(None, [tool_call("r1", RECALL, {"call_id": "call_0"})], id="chatcmpl-round1"),
        completion("The first file starts with MARKER-0.", id="chatcmpl-final"),
    )
    history = agent_history()
    resp = client.chat.completions.create(model=MODEL, messages=history, tools=[READ_FILE])
    no_extras(resp)
    msg = resp.choices[0].message
    assert msg.content == "The first file starts with MARKER-0."
    assert msg.tool_calls is None
    assert resp.choices[0].finish_reason == "stop"
    assert RECALL not in gw.tap.exchanges[0].body.decode() and SEARCH not in gw.tap.exchanges[0].body.decode()
    check_recall_rounds(gw, len(history))


def test_rewritten_stream_with_recall_round(gw: Gateway, client: OpenAI):
    gw.rewritten = True
    gw.mock.script(
        sse_tool_call("r1", RECALL, {"call_id": "call_0"}),
        sse_text(["It says ", "MARKER-0."]),
    )
    history = agent_history()
    stream = client.chat.completions.create(
        model=MODEL, messages=history, tools=[READ_FILE], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    body = gw.tap.exchanges[0].body.decode()
    assert RECALL not in body and SEARCH not in body
    validate_stream(body)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "It says MARKER-0."
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and usage[0].total_tokens == 27 + 14, "usage summed over both rounds"
    check_recall_rounds(gw, len(history))
    assert json.loads(gw.mock.requests()[0]["raw"])["stream"] is True
