"""The official `openai` Python SDK's Responses API through ctxgate: `responses.create` (text; a function-tool
round trip with `function_call_output`), `responses.stream` (its events and final response), an upstream error in
OpenAI's shape and a mid-stream failure, `input_tokens` and `compact`. Each test checks what the client saw and
what the mock received; the fixture then checks every exchange against the SDK's types and the mock's replies."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from ctxtest import MODEL, Gateway, no_extras, r_call, r_items, r_text
from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Today's weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    }
]


@pytest.fixture
def client(gw: Gateway, http_client: httpx.Client) -> OpenAI:
    return OpenAI(base_url=gw.base_url, api_key=gw.api_key, http_client=http_client, max_retries=0)


def test_create_text(gw: Gateway, client: OpenAI):
    gw.mock.script(r_text("Hello from the mock.", usage={"input_tokens": 40, "output_tokens": 6}))
    raw = client.responses.with_raw_response.create(model=MODEL, instructions="Be brief.", input="hello")
    resp = raw.parse()
    no_extras(resp)
    assert resp.output_text == "Hello from the mock."
    assert resp.status == "completed"
    assert resp.usage and resp.usage.input_tokens == 40 and resp.usage.total_tokens == 46
    (up,) = gw.mock.requests()
    assert up["uri"] == "/v1/responses"
    assert up["body"]["input"] == "hello" and up["body"]["instructions"] == "Be brief."
    assert up["headers"]["authorization"] == f"Bearer {gw.api_key}"
    assert up["raw"] == gw.tap.exchanges[0].request.decode(), "forwarded byte for byte"
    # needs the Responses pipeline (passthrough does not name sessions)
    assert raw.headers.get("x-ctxgate-session"), "ctxgate names the session on every answer"


def test_function_tool_round_trip(gw: Gateway, client: OpenAI):
    gw.mock.script(
        r_call("call_w1", "get_weather", {"city": "Paris"}, reasoning="The user wants Paris."),
        r_text("Paris is sunny, 21C."),
    )
    history: list = [{"role": "user", "content": "Weather in Paris?"}]
    opts = {"model": MODEL, "tools": TOOLS, "store": False, "include": ["reasoning.encrypted_content"]}
    first = client.responses.create(input=history, **opts)
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content == "gAAAA-mock-call_w1"
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id == "call_w1"
    args = json.loads(call.arguments)
    assert args == {"city": "Paris"}
    # the client replays the reasoning item and the call, then the call's output
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"})
    second = client.responses.create(input=history, **opts)
    assert second.output_text == "Paris is sunny, 21C."

    ups = gw.mock.requests()
    assert [u["uri"] for u in ups] == ["/v1/responses"] * 2
    items = ups[1]["body"]["input"]
    kinds = [i.get("type", "message") for i in items]
    assert kinds == ["message", "reasoning", "function_call", "function_call_output"]
    assert items[1]["encrypted_content"] == "gAAAA-mock-call_w1", "opaque reasoning carried as it was"
    assert items[3] == {"type": "function_call_output", "call_id": "call_w1", "output": "sunny, 21C"}
    assert ups[0]["body"]["tools"][0]["name"] == "get_weather"
    # needs the Responses pipeline: both turns are one ctxgate session
    sessions = {ex.session for ex in gw.tap.exchanges}
    assert len(sessions) == 1 and None not in sessions, sessions


def test_stream_events_and_final_response(gw: Gateway, client: OpenAI):
    gw.mock.script(
        r_items(
            [
                {
                    "type": "reasoning",
                    "encrypted_content": "gAAAA-s",
                    "summary": [{"type": "summary_text", "text": "hm"}],
                },
                {"type": "message", "text": "Streaming works fine."},
                {"type": "function_call", "call_id": "call_s", "name": "get_weather", "arguments": {"city": "Oslo"}},
            ],
            usage={
                "input_tokens": 120,
                "input_tokens_details": {"cached_tokens": 64},
                "output_tokens": 30,
                "output_tokens_details": {"reasoning_tokens": 12},
            },
        )
    )
    deltas, arg_deltas, kinds = [], [], []
    with client.responses.stream(model=MODEL, input="stream please", tools=TOOLS) as stream:
        for event in stream:
            no_extras(event)
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type == "response.function_call_arguments.delta":
                arg_deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == "Streaming works fine." and len(deltas) > 1
    assert len(arg_deltas) > 1 and json.loads("".join(arg_deltas)) == {"city": "Oslo"}
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.reasoning_summary_text.delta" in kinds
    assert final.output_text == "Streaming works fine."
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.usage and final.usage.input_tokens_details.cached_tokens == 64
    assert final.usage.output_tokens_details.reasoning_tokens == 12
    (up,) = gw.mock.requests()
    assert up["body"]["stream"] is True
    # the stream the client read is the stream the mock sent (nothing to rewrite in a short request)
    assert bytes(gw.tap.exchanges[0].body).decode() == up["reply"]["sse"]
    # needs the Responses pipeline
    assert gw.tap.exchanges[0].session, "x-ctxgate-session on a streamed answer"


def test_upstream_errors_reach_the_client_in_openais_shape(gw: Gateway, client: OpenAI):
    gw.mock.script(
        {"responses_error": {"code": "rate_limit_exceeded", "message": "Slow down."}, "headers": {"retry-after": "1"}},
        r_items(
            [{"type": "message", "text": "cut"}],
            error={"after_items": 1, "code": "server_error", "message": "boom"},
        ),
    )
    with pytest.raises(openai.RateLimitError) as e:
        client.responses.create(model=MODEL, input="hi")
    assert e.value.status_code == 429 and e.value.code == "rate_limit_exceeded"
    with pytest.raises(openai.APIError) as e:
        with client.responses.stream(model=MODEL, input="hi again") as stream:
            for _ in stream:
                pass
    assert "boom" in str(e.value)
    assert [u["reply"]["status"] for u in gw.mock.requests()] == [429, 200]


def test_input_tokens_and_compact(gw: Gateway, client: OpenAI):
    long_input = [{"role": "user", "content": "count these words " * 200}]
    counted = client.responses.input_tokens.count(model=MODEL, input=long_input)
    assert counted.input_tokens > 700
    compacted = client.responses.compact(
        model=MODEL,
        input=long_input
        + [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}],
    )
    no_extras(compacted)
    assert [o.type for o in compacted.output] == ["message", "compaction"]
    assert compacted.output[-1].encrypted_content
    assert [u["uri"] for u in gw.mock.requests()] == ["/v1/responses/input_tokens", "/v1/responses/compact"]
