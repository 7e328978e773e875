"""The official `anthropic` Python SDK through ctxgate: create (plain and beta), a stream with thinking, a tool round
trip, count_tokens against the usage of the same request, an Anthropic-shaped rate limit and a mid-stream error.
Besides what the client saw, each test checks what the mock upstream received: the SDK's bytes and its credential
(`Authorization: Bearer`, as this SDK sends `api_key`; `x-api-key` when set), `anthropic-version` and
`anthropic-beta` headers, byte for byte."""

from __future__ import annotations

import anthropic
import pytest
from anthropic import Anthropic
from ctxtest import (
    Gateway,
    a_blocks,
    a_text,
    a_tool_use,
    no_extras,
    sse_events,
    validate_event_stream,
    validate_message,
)

MODEL = "claude-mock-4"
KEY = "sk-ant-client-test"
FORWARDED = ("authorization", "x-api-key", "anthropic-version", "anthropic-beta")


@pytest.fixture
def client(gw: Gateway, http2_client) -> Anthropic:
    return Anthropic(base_url=gw.root, api_key=KEY, http_client=http2_client, max_retries=0)


def upstream_saw_the_clients_request(gw: Gateway, up: dict, i: int = 0) -> None:
    """The mock got exchange `i`'s body byte for byte, and its credential and version headers unchanged."""
    ex = gw.tap.exchanges[i]
    assert up["raw"] == ex.request.decode()
    for name in FORWARDED:
        assert up["headers"].get(name) == ex.request_headers.get(name), name
    assert KEY in (up["headers"].get("x-api-key"), up["headers"].get("authorization", "").removeprefix("Bearer "))


def test_create(gw: Gateway, client: Anthropic):
    gw.mock.script(a_text("Hello from the mock.", usage={"input_tokens": 12, "output_tokens": 5}))
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hello"}]
    )
    msg = raw.parse()
    no_extras(msg)
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Hello from the mock."
    assert msg.stop_reason == "end_turn" and msg.model == MODEL
    assert msg.usage.input_tokens == 12 and msg.usage.output_tokens == 5
    (up,) = gw.mock.requests()
    assert up["uri"] == "/v1/messages"
    upstream_saw_the_clients_request(gw, up)
    # needs the Anthropic pipeline (passthrough does not name sessions)
    assert raw.headers.get("x-ctxgate-session"), "ctxgate names the session on every answer"


def test_beta_create_keeps_the_query_and_the_beta_header(gw: Gateway, client: Anthropic):
    betas = ["interleaved-thinking-2025-05-14", "context-management-2025-06-27"]
    msg = client.beta.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=[{"role": "user", "content": "hello"}],
        betas=betas,
        extra_query={"beta": "true"},  # as Claude Code sends its beta calls
        extra_headers={"x-custom-thing": "kept", "x-api-key": "sk-ant-api03-Key_With.Odd~Bytes"},
    )
    assert msg.content[0].text == "mock reply", "the mock's default answer"
    (up,) = gw.mock.requests()
    assert up["uri"] == "/v1/messages?beta=true"
    upstream_saw_the_clients_request(gw, up)
    assert up["headers"]["anthropic-beta"] == ",".join(betas)
    assert up["headers"]["x-custom-thing"] == "kept"
    assert up["headers"]["x-api-key"] == "sk-ant-api03-Key_With.Odd~Bytes"
    assert gw.tap.exchanges[0].session, "x-ctxgate-session (needs the Anthropic pipeline)"


def test_stream_with_thinking(gw: Gateway, client: Anthropic):
    gw.mock.script(
        a_blocks(
            [
                {"type": "thinking", "thinking": "The user wants a greeting.", "signature": "c2lnbmF0dXJl"},
                {"type": "text", "text": "Hello, streamed world!"},
            ],
            usage={"input_tokens": 40, "output_tokens": 9},
        )
    )
    with client.messages.stream(
        model=MODEL,
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "greet me"}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello, streamed world!"
    no_extras(final)
    thinking, said = final.content
    assert thinking.type == "thinking" and thinking.thinking == "The user wants a greeting."
    assert thinking.signature == "c2lnbmF0dXJl", "the signature arrives whole"
    assert said.type == "text" and said.text == text
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens == 40 and final.usage.output_tokens == 9
    (up,) = gw.mock.requests()
    upstream_saw_the_clients_request(gw, up)
    assert up["body"]["stream"] is True and up["body"]["thinking"]["type"] == "enabled"
    names = [type(e).__name__ for e in validate_event_stream(bytes(gw.tap.exchanges[0].body))]
    assert names[0] == "RawMessageStartEvent" and names[-1] == "RawMessageStopEvent"
    assert gw.tap.exchanges[0].session, "x-ctxgate-session (needs the Anthropic pipeline)"


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_tool_round_trip(gw: Gateway, client: Anthropic):
    gw.mock.script(
        a_tool_use("toolu_w1", "get_weather", {"city": "Paris", "unit": "celsius"}, text="Let me check."),
        a_text("It is sunny in Paris."),
    )
    messages: list = [{"role": "user", "content": "Weather in Paris?"}]
    with client.messages.stream(model=MODEL, max_tokens=500, tools=[WEATHER], messages=messages) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    intro, call = first.content
    assert intro.text == "Let me check."
    assert call.type == "tool_use" and call.id == "toolu_w1" and call.name == "get_weather"
    assert call.input == {"city": "Paris", "unit": "celsius"}, "input_json_delta pieces joined"

    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 24°C"}]},
    ]
    second = client.messages.create(model=MODEL, max_tokens=500, tools=[WEATHER], messages=messages)
    assert second.content[0].text == "It is sunny in Paris." and second.stop_reason == "end_turn"

    first_up, second_up = gw.mock.requests()
    for i, up in enumerate((first_up, second_up)):
        upstream_saw_the_clients_request(gw, up, i)
    sent = second_up["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"][1] == {
        "type": "tool_use",
        "id": "toolu_w1",
        "name": "get_weather",
        "input": {"city": "Paris", "unit": "celsius"},
    }
    assert sent[2]["content"] == [{"type": "tool_result", "tool_use_id": "toolu_w1", "content": "sunny, 24°C"}]
    validate_message(bytes(gw.tap.exchanges[1].body))
    # needs the Anthropic pipeline: both requests are one conversation
    sessions = [ex.session for ex in gw.tap.exchanges]
    assert sessions[0] and sessions[0] == sessions[1], sessions


def test_count_tokens_agrees_with_the_usage_of_the_same_request(gw: Gateway, client: Anthropic):
    small = [{"role": "user", "content": "hi"}]
    big = [{"role": "user", "content": "tell me about context windows " * 200}]
    counts = [client.messages.count_tokens(model=MODEL, messages=m).input_tokens for m in (small, big)]
    usages = [client.messages.create(model=MODEL, max_tokens=50, messages=m).usage.input_tokens for m in (small, big)]
    assert counts == usages
    assert counts[1] > counts[0] + 1000, "the mock's usage reflects the request's size"
    assert [u["uri"] for u in gw.mock.requests()] == ["/v1/messages/count_tokens"] * 2 + ["/v1/messages"] * 2


def test_rate_limit_surfaces_as_rate_limit_error(gw: Gateway, client: Anthropic):
    gw.mock.script(
        {
            "anthropic_error": {"type": "rate_limit_error", "message": "Number of requests has exceeded your rate limit."},
            "headers": {"retry-after": "20"},
        }
    )
    with pytest.raises(anthropic.RateLimitError) as err:
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "again"}])
    assert err.value.status_code == 429
    assert err.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "Number of requests has exceeded your rate limit."},
        "request_id": "req_mock",
    }
    assert err.value.response.headers["retry-after"] == "20"
    assert len(gw.mock.requests()) == 1


def test_mid_stream_error_reaches_the_client(gw: Gateway, client: Anthropic):
    gw.mock.script(
        a_blocks(
            [{"type": "text", "text": "Partial answer"}, {"type": "text", "text": " never sent"}],
            stream_error={"after_blocks": 1, "type": "overloaded_error", "message": "Overloaded"},
        )
    )
    seen = []
    with pytest.raises(anthropic.APIStatusError) as err:
        with client.messages.stream(
            model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "go"}]
        ) as stream:
            for piece in stream.text_stream:
                seen.append(piece)
    assert "".join(seen) == "Partial answer"
    assert "Overloaded" in str(err.value)
    events = sse_events(bytes(gw.tap.exchanges[0].body))
    assert events[-1] == ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert "message_stop" not in [name for name, _ in events]
