"""litellm as a client of ctxgate: `litellm.completion` for an OpenAI model (`openai/…`: chat completions, through
the openai SDK with `api_base="…/v1"`) and an Anthropic one (`anthropic/…`: Messages, litellm's own HTTP client,
with `api_base` the gateway's root): plain, streamed, a tool round trip, and a long agent run that outgrows the
gateway's window (8,000 tokens), which ctxgate rewrites while the admin API keeps the whole history. Then the base
URLs docs/clients.md gives, exactly as given: the environment variables litellm reads (OPENAI_BASE_URL,
ANTHROPIC_BASE_URL — the same value as Claude Code's) and the trap: an Anthropic `api_base` ending in `/v1` makes
litellm post `/v1/v1/messages`, which ctxgate does not manage.

litellm's HTTP traffic goes through the suite's tap (`litellm.client_session` for the openai SDK, an `HTTPHandler`
around the same client for Anthropic), so the fixture checks every exchange against the SDK types and the mock's
replies as for the other clients."""

from __future__ import annotations

import json
import os
import re

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the cost map from the network

import httpx
import litellm
import pytest
from ctxtest import MODEL, Gateway, a_text, a_tool_use, completion, sse_events, sse_text, sse_tool_call, tool_call
from litellm.llms.custom_httpx.http_handler import HTTPHandler

litellm.suppress_debug_info = True

OPENAI_MODEL = f"openai/{MODEL}"
# Not a `claude-*` name: the gateway's default window (8,000 tokens here) applies.
ANTHROPIC_MODEL = "anthropic/mock-anthropic-small"


class ToCurrentTap(httpx.BaseTransport):
    """Sends each request through the tap of the test running now (litellm caches its clients across calls)."""

    def __init__(self, stack: Gateway):
        self.stack = stack

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.stack.tap.transport().handle_request(request)


@pytest.fixture(scope="module")
def http(stack: Gateway):
    with httpx.Client(transport=ToCurrentTap(stack), timeout=30) as c:
        litellm.client_session = c
        yield c
        litellm.client_session = None


@pytest.fixture
def lm(gw: Gateway, http: httpx.Client):
    """`litellm.completion` for one dialect, pointed at ctxgate as docs/clients.md says; afterwards, no request
    reached the upstream compressed (litellm sends plain JSON)."""

    def call(dialect: str, **kw):
        if dialect == "openai":
            kw.update(model=OPENAI_MODEL, api_base=gw.base_url)  # http://127.0.0.1:PORT/v1
        else:
            kw.update(model=ANTHROPIC_MODEL, api_base=gw.root, client=HTTPHandler(client=http))  # no /v1
            kw.setdefault("max_tokens", 500)
        return litellm.completion(api_key=gw.api_key, num_retries=0, **kw)

    yield call
    for up in gw.mock.requests():
        assert "content-encoding" not in up["headers"], up["headers"]
    # litellm stops reading an Anthropic stream at its `message_delta` (the stop reason) and closes it: it never
    # reads `message_stop`. The fixture's check wants whole streams, so the event it left unread goes back in.
    for ex in gw.tap.exchanges:
        if httpx.URL(ex.url).path == "/v1/messages" and ex.content_type.startswith("text/event-stream"):
            if [n for n, _ in sse_events(bytes(ex.body))][-1] == "message_delta":
                ex.body.extend(MESSAGE_STOP)


MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def answer(dialect: str, text: str, stream: bool = False) -> dict:
    if dialect == "anthropic":
        return a_text(text, usage={"input_tokens": 40, "output_tokens": 6})
    return sse_text(re.findall(r".{1,6}", text, re.S)) if stream else completion(text)


def call_tool(dialect: str, id: str, name: str, args: dict, stream: bool = False) -> dict:
    if dialect == "anthropic":
        return a_tool_use(id, name, args)
    return sse_tool_call(id, name, args) if stream else completion(None, [tool_call(id, name, args)])


PATH = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
DIALECTS = ["openai", "anthropic"]


def header(resp, name: str) -> str | None:
    """A response header of ctxgate's answer, as litellm hands it on."""
    return (resp._hidden_params.get("additional_headers") or {}).get(f"llm_provider-{name}")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_completion(gw: Gateway, lm, dialect: str):
    gw.mock.script(answer(dialect, "Hello from the mock."))
    resp = lm(dialect, messages=[{"role": "user", "content": "hello"}])
    assert resp.choices[0].message.content == "Hello from the mock."
    assert resp.choices[0].finish_reason == "stop"
    (up,) = gw.mock.requests()
    assert up["uri"] == PATH[dialect]
    assert gw.api_key in json.dumps(up["headers"]), "the key reaches the upstream"
    # needs the managed pipeline (a passthrough does not name sessions)
    assert header(resp, "x-ctxgate-session") == gw.tap.exchanges[0].session and gw.tap.exchanges[0].session
    assert header(resp, "x-ctxgate-rewrite") is None, "a short request goes as it came"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stream(gw: Gateway, lm, dialect: str):
    gw.mock.script(answer(dialect, "Streaming through ctxgate works.", stream=True))
    chunks = list(lm(dialect, messages=[{"role": "user", "content": "stream please"}], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Streaming through ctxgate works."
    (up,) = gw.mock.requests()
    assert up["uri"] == PATH[dialect] and up["body"]["stream"] is True
    (ex,) = gw.tap.exchanges
    assert ex.content_type.startswith("text/event-stream") and ex.session, "a managed stream"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Today's weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_round_trip(gw: Gateway, lm, dialect: str):
    gw.mock.script(call_tool(dialect, "call_w1", "get_weather", {"city": "Oslo"}), answer(dialect, "Oslo is sunny."))
    messages: list = [{"role": "user", "content": "Weather in Oslo?"}]
    first = lm(dialect, messages=messages, tools=[WEATHER])
    (call,) = first.choices[0].message.tool_calls
    assert call.id == "call_w1" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert first.choices[0].finish_reason == "tool_calls"
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ]
    second = lm(dialect, messages=messages, tools=[WEATHER])
    assert second.choices[0].message.content == "Oslo is sunny."

    ups = gw.mock.requests()
    assert [u["uri"] for u in ups] == [PATH[dialect]] * 2
    sent = json.dumps(ups[1]["body"]["messages"])
    assert "call_w1" in sent and "sunny, 21C" in sent, "litellm sent the call and its result back"
    names = [t.get("name") or t["function"]["name"] for t in ups[0]["body"]["tools"]]
    assert names == ["get_weather"]
    sessions = [ex.session for ex in gw.tap.exchanges]
    assert sessions[0] and sessions[0] == sessions[1], sessions


@pytest.mark.parametrize("dialect", DIALECTS)
def test_long_run_is_rewritten_and_kept_whole(gw: Gateway, lm, dialect: str):
    """An agent loop over litellm (streamed, as agents run): ten file reads whose results outgrow the window."""
    gw.rewritten = True
    steps = 10
    gw.mock.script(
        *(call_tool(dialect, f"call_{i}", "read_file", {"path": f"src/f{i}.rs"}, stream=True) for i in range(steps)),
        answer(dialect, "All ten files read; the bug is in f3.", stream=True),
    )
    read_file = {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
    filler = " ".join(f"line{w}" for w in range(450))
    messages: list = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read src/f0.rs to src/f9.rs, then find the bug."},
    ]
    for i in range(steps + 1):
        stream = lm(dialect, messages=messages, tools=[read_file], stream=True)
        chunks = list(stream)
        reply = litellm.stream_chunk_builder(chunks, messages=messages)
        msg = reply.choices[0].message
        if i == steps:
            assert msg.content == "All ten files read; the bug is in f3."
            break
        (call,) = msg.tool_calls
        assert json.loads(call.function.arguments) == {"path": f"src/f{i}.rs"}
        messages += [
            msg.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": f"MARKER-{i} {filler}"},
        ]

    exchanges = gw.tap.exchanges
    assert len(exchanges) == steps + 1
    ups = gw.mock.requests()
    assert len(ups) == steps + 1, "no request added: the model never asked to recall"
    assert ups[0]["raw"] == exchanges[0].request.decode(), "the first step goes as it came"
    assert len(ups[-1]["raw"]) < len(exchanges[-1].request), "the last step was shortened"
    names = json.dumps(ups[-1]["body"]["tools"])
    assert "read_file" in names and "recall_tool_call" in names, "the recall tool is offered"
    for ex in exchanges:
        assert "recall_tool_call" not in ex.body.decode(), "the client never sees ctxgate's tools"

    # The admin API: one session, all of it as litellm sent it, and the turns that were rewritten.
    sid = exchanges[-1].session
    assert sid and all(ex.session == sid for ex in exchanges), "one session for the run"
    admin = httpx.Client(base_url=gw.root, trust_env=False)
    session = admin.get(f"/admin/sessions/{sid}").json()
    assert session["dialect"] == ("chat" if dialect == "openai" else "anthropic")
    kept = json.dumps(session["messages"])
    for i in range(steps):
        assert f"MARKER-{i} line0" in kept, f"MARKER-{i} kept"
    turns = admin.get(f"/admin/sessions/{sid}/turns", params={"messages": "false", "limit": 50}).json()
    assert turns["total"] == steps + 1
    assert session["partial"] == [], "every reply kept whole"
    assert turns["turns"][0]["rewritten"] is False
    last = turns["turns"][-1]
    assert last["rewritten"] is True and last["tokens"]["sent"] < last["tokens"]["client"], last
    assert last["tokens"]["client"] > 8000


def test_anthropic_stream_that_litellm_read_whole_is_not_kept_partial(gw: Gateway, lm):
    """litellm closes an Anthropic stream once it has read `message_delta`, while the upstream's `message_stop` is
    still to come: everything that carries content reached it, so the reply is kept whole (docs/gateway.md)."""
    spec = a_text("Every block of this answer reached the client.", usage={"input_tokens": 40, "output_tokens": 9})
    spec["delay_ms"] = 100  # between events, as a real upstream streams
    gw.mock.script(spec)
    chunks = list(lm("anthropic", messages=[{"role": "user", "content": "stream slowly"}], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Every block of this answer reached the client."
    assert chunks[-1].choices[0].finish_reason == "stop", "litellm saw the stop reason"
    sid = gw.tap.exchanges[0].session
    session = httpx.get(f"{gw.root}/admin/sessions/{sid}", trust_env=False).json()
    assert session["total"] == 2
    assert session["partial"] == [], "the reply is kept whole"


# --- the base URLs docs/clients.md gives ---------------------------------------------------------------------


def test_env_base_urls(gw: Gateway, http: httpx.Client, monkeypatch):
    """OPENAI_BASE_URL=<ctxgate>/v1 and ANTHROPIC_BASE_URL=<ctxgate> (Claude Code's value), no `api_base`."""
    monkeypatch.setenv("OPENAI_BASE_URL", gw.base_url)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", gw.root)
    monkeypatch.setenv("OPENAI_API_KEY", gw.api_key)
    monkeypatch.setenv("ANTHROPIC_API_KEY", gw.api_key)
    gw.mock.script(completion("via chat completions"), a_text("via Messages"))
    one = litellm.completion(model=OPENAI_MODEL, messages=[{"role": "user", "content": "hi"}], num_retries=0)
    two = litellm.completion(
        model=ANTHROPIC_MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=100,
        num_retries=0,
        client=HTTPHandler(client=http),
    )
    assert one.choices[0].message.content == "via chat completions"
    assert two.choices[0].message.content == "via Messages"
    assert [(httpx.URL(ex.url).path, bool(ex.session)) for ex in gw.tap.exchanges] == [
        ("/v1/chat/completions", True),
        ("/v1/messages", True),
    ]


def test_anthropic_api_base_with_v1_posts_v1_v1_messages(gw: Gateway, http: httpx.Client):
    """The trap: litellm appends `/v1/messages` to an Anthropic `api_base`, so `…/v1` gives `/v1/v1/messages` —
    not a path ctxgate manages (no session, no rewrite; a real upstream would answer 404)."""
    try:
        litellm.completion(
            model=ANTHROPIC_MODEL,
            api_base=gw.base_url,
            api_key=gw.api_key,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=100,
            num_retries=0,
            client=HTTPHandler(client=http),
        )
    except (litellm.exceptions.NotFoundError, litellm.exceptions.APIError):
        pass  # however the gateway answers it, the point is where litellm sent it
    (ex,) = gw.tap.exchanges
    assert httpx.URL(ex.url).path == "/v1/v1/messages"
    assert ex.session is None, "not managed: ctxgate names no session"
