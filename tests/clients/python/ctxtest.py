"""Helpers for the client-library suites: scripting the mock upstream over its control API (`/_mock/*`, see
src/mock.rs), recording what clients receive (an httpx or httpx2 transport that tees every response), and checking
every response strictly against the SDK's types (`openai` for chat completions and the Responses API, `anthropic`
for Messages)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anthropic.types
import httpx
import pydantic
from anthropic import BaseModel as AnthropicModel
from openai import BaseModel as OpenAIModel
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

MODEL = "mock-model"


# --- scripting the mock -----------------------------------------------------------------------------------------


class Mock:
    """The standalone mock upstream's control API."""

    def __init__(self, root: str):
        self.root = root
        self.http = httpx.Client(base_url=root, timeout=10, trust_env=False)  # loopback: never via a proxy

    def script(self, *replies: dict) -> None:
        """Queues replies (specs as `MockReply::from_spec` takes them), answered in order."""
        r = self.http.post("/_mock/script", json=list(replies))
        assert r.status_code == 200, r.text

    def requests(self) -> list[dict]:
        """Every request the mock received since the last reset, with the reply it gave."""
        return self.http.get("/_mock/requests").json()

    def reset(self) -> None:
        self.http.post("/_mock/reset").raise_for_status()


def completion(content: str | None = None, tool_calls: list | None = None, *, id: str = "chatcmpl-mock") -> dict:
    """A `{"json": chat.completion}` reply spec."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "json": {
            "id": id,
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if tool_calls else "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        }
    }


def tool_call(id: str, name: str, arguments: dict) -> dict:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def chunk(delta: dict, finish: str | None = None, *, id: str = "chatcmpl-mock") -> dict:
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def sse_text(pieces: list[str], *, usage: bool = True, id: str = "chatcmpl-mock") -> dict:
    """A `{"sse": …}` reply spec saying `pieces` one delta at a time."""
    chunks = [chunk({"role": "assistant", "content": ""}, id=id)]
    chunks += [chunk({"content": p}, id=id) for p in pieces]
    chunks.append(chunk({}, "stop", id=id))
    spec: dict[str, Any] = {"sse": chunks}
    if usage:
        spec["usage"] = {"prompt_tokens": 12, "completion_tokens": len(pieces), "total_tokens": 12 + len(pieces)}
    return spec


def sse_tool_call(id: str, name: str, arguments: dict, *, usage: bool = True) -> dict:
    """A `{"sse": …}` reply spec calling one tool, its arguments split over two deltas."""
    args = json.dumps(arguments)
    half = len(args) // 2
    chunks = [
        chunk(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}],
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[:half]}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[half:]}}]}),
        chunk({}, "tool_calls"),
    ]
    spec: dict[str, Any] = {"sse": chunks}
    if usage:
        spec["usage"] = {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}
    return spec


# --- Anthropic replies (rendered by the mock as JSON or as the event stream, as the request asks) ---------------


def a_text(text: str, **extra: Any) -> dict:
    """A `{"anthropic": …}` reply spec saying `text`; `extra` adds `model` (fits only that model), `usage`, …"""
    return a_blocks([{"type": "text", "text": text}], **extra)


def a_tool_use(id: str, name: str, input: dict, *, text: str | None = None, **extra: Any) -> dict:
    """A reply spec calling one tool (after a text block when `text` is given)."""
    blocks = [{"type": "text", "text": text}] if text else []
    return a_blocks(blocks + [{"type": "tool_use", "id": id, "name": name, "input": input}], **extra)


def a_blocks(content: list[dict], *, model: str | None = None, **fields: Any) -> dict:
    """A reply spec of any content blocks; `fields` go into the reply (`usage`, `stop_reason`, `stream_error`, …)."""
    spec: dict[str, Any] = {"anthropic": {"content": content, **fields}}
    if model:
        spec["model"] = model
    return spec


# --- OpenAI Responses replies (rendered by the mock as a `response` body or as the event stream) ----------------


def r_text(text: str, **extra: Any) -> dict:
    """A `{"responses": …}` reply spec saying `text`; `extra` adds `model` (fits only that model), `usage`, …"""
    return r_items([{"type": "message", "text": text}], **extra)


def r_call(call_id: str, name: str, arguments: dict, *, reasoning: str | None = None, **extra: Any) -> dict:
    """A reply spec calling one function tool (after a reasoning item with that summary and an encrypted content
    when `reasoning` is given)."""
    items = []
    if reasoning:
        items.append(
            {
                "type": "reasoning",
                "encrypted_content": f"gAAAA-mock-{call_id}",
                "summary": [{"type": "summary_text", "text": reasoning}],
            }
        )
    items.append({"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments})
    return r_items(items, **extra)


def r_items(output: list[dict], *, model: str | None = None, **fields: Any) -> dict:
    """A reply spec of any output items; `fields` go into the reply (`usage`, `error`, `failed`, `id`, …)."""
    spec: dict[str, Any] = {"responses": {"output": output, **fields}}
    if model:
        spec["model"] = model
    return spec


# --- recording what clients receive -----------------------------------------------------------------------------


@dataclass
class Exchange:
    """One HTTP exchange as the client saw it."""

    method: str
    url: str
    request: bytes
    status: int
    content_type: str
    session: str | None  # the x-ctxgate-session response header
    request_headers: dict[str, str] = field(default_factory=dict)  # as the client sent them (names lower-case)
    body: bytearray = field(default_factory=bytearray)


class Tap:
    """Hands out httpx transports that record every exchange (the body as it streams by, without buffering)."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    def _record(self, request: httpx.Request, response: httpx.Response) -> Exchange:
        ex = Exchange(
            request.method,
            str(request.url),
            bytes(request.content),
            response.status_code,
            response.headers.get("content-type", ""),
            response.headers.get("x-ctxgate-session"),
            {k.lower(): v for k, v in request.headers.items()},
        )
        self.exchanges.append(ex)
        return ex

    def transport(self, http: Any = httpx) -> httpx.BaseTransport:
        """A transport for `http`'s clients: the `httpx` module (the openai SDK) or `httpx2` (the anthropic SDK)."""
        tap, inner = self, http.HTTPTransport()

        class Tee(http.BaseTransport):
            def handle_request(self, request: httpx.Request) -> httpx.Response:
                resp = inner.handle_request(request)
                ex, stream = tap._record(request, resp), resp.stream

                class Body(http.SyncByteStream):
                    def __iter__(self):
                        for b in stream:
                            ex.body.extend(b)
                            yield b

                    def close(self):
                        stream.close()

                return http.Response(resp.status_code, headers=resp.headers, stream=Body(), extensions=resp.extensions)

            def close(self) -> None:
                inner.close()

        return Tee()

    def async_transport(self, http: Any = httpx) -> httpx.AsyncBaseTransport:
        tap, inner = self, http.AsyncHTTPTransport()

        class Tee(http.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                resp = await inner.handle_async_request(request)
                ex, stream = tap._record(request, resp), resp.stream

                class Body(http.AsyncByteStream):
                    async def __aiter__(self):
                        async for b in stream:
                            ex.body.extend(b)
                            yield b

                    async def aclose(self):
                        await stream.aclose()

                return http.Response(resp.status_code, headers=resp.headers, stream=Body(), extensions=resp.extensions)

            async def aclose(self) -> None:
                await inner.aclose()

        return Tee()


@dataclass
class Gateway:
    """ctxgate's base URL, the mock behind it, and this test's tap."""

    base_url: str  # with /v1 (the openai SDK's base URL); the anthropic SDK's is `root`
    mock: Mock
    tap: Tap = field(default_factory=Tap)
    # Set by tests whose requests ctxgate rewrites: their bodies are not forwarded byte for byte.
    rewritten: bool = False
    api_key: str = "sk-client-test"

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")


# --- strict checks ------------------------------------------------------------------------------------------------


def no_extras(obj: Any, where: str = "$") -> None:
    """Fails when any SDK model in `obj` holds a field its type does not declare."""
    if isinstance(obj, (OpenAIModel, AnthropicModel)):
        assert not obj.model_extra, f"{where}: fields unknown to {type(obj).__name__}: {sorted(obj.model_extra)}"
        for name in type(obj).model_fields:
            no_extras(getattr(obj, name), f"{where}.{name}")
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            no_extras(x, f"{where}[{i}]")
    elif isinstance(obj, dict):
        for k, x in obj.items():
            no_extras(x, f"{where}.{k}")


def validate_completion(raw: bytes | str) -> ChatCompletion:
    """Parses a `chat.completion` body with the SDK's type: declared fields only, each of its declared type, and
    nothing lost in the round trip."""
    data = json.loads(raw)
    obj = ChatCompletion.model_validate(data, strict=True)
    no_extras(obj)
    assert obj.model_dump(mode="json", exclude_unset=True) == data, "the SDK's type does not hold the body as sent"
    return obj


def sse_data(raw: bytes | str) -> list[str]:
    """The `data:` payloads of an SSE body, `[DONE]` included (one event per blank-line-separated block)."""
    text = raw.decode() if isinstance(raw, (bytes, bytearray)) else raw
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [ln[5:].lstrip(" ") for ln in block.split("\n") if ln.startswith("data:")]
        if lines:
            out.append("\n".join(lines))
    return out


def validate_stream(raw: bytes | str) -> list[ChatCompletionChunk]:
    """Parses every chunk of a stream with the SDK's type (strictly, as for completions); it must end with a
    single `[DONE]`."""
    data = sse_data(raw)
    assert data and data[-1] == "[DONE]" and data.count("[DONE]") == 1, f"stream must end with one [DONE]: {data[-3:]}"
    chunks = []
    for d in data[:-1]:
        c = ChatCompletionChunk.model_validate_json(d, strict=True)
        no_extras(c)
        assert c.model_dump(mode="json", exclude_unset=True) == json.loads(d), f"chunk not held as sent: {d}"
        chunks.append(c)
    return chunks


_EVENT = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)


def validate_message(raw: bytes | str) -> anthropic.types.Message:
    """Parses a Messages API `message` body with the anthropic SDK's type, as strictly as `validate_completion`."""
    data = json.loads(raw)
    obj = anthropic.types.Message.model_validate(data, strict=True)
    no_extras(obj)
    assert obj.model_dump(mode="json", exclude_unset=True) == data, "the SDK's type does not hold the body as sent"
    return obj


def sse_events(raw: bytes | str) -> list[tuple[str, dict]]:
    """The `(event, data)` pairs of an Anthropic event stream."""
    text = raw.decode() if isinstance(raw, (bytes, bytearray)) else raw
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = block.split("\n")
        names = [ln[6:].strip() for ln in lines if ln.startswith("event:")]
        data = [ln[5:].lstrip(" ") for ln in lines if ln.startswith("data:")]
        if data:
            out.append((names[0] if names else "", json.loads("\n".join(data))))
    return out


def validate_event_stream(raw: bytes | str) -> list[Any]:
    """Checks an Anthropic event stream: each event named as its data's `type`, each of the SDK's event types (ping
    and error aside), one `message_start` first, then either one `message_stop` last (after the `message_delta`)
    or an `error` event last; block indexes start and stop in order."""
    events = sse_events(raw)
    assert events, "an empty stream"
    names = [n for n, _ in events]
    for name, data in events:
        assert name == data.get("type"), f"event {name!r} carries a {data.get('type')!r}"
    assert names[0] == "message_start" and names.count("message_start") == 1, names
    if names[-1] == "error":
        assert isinstance(events[-1][1].get("error"), dict)
    else:
        assert names[-1] == "message_stop" and names.count("message_stop") == 1, names
        assert names[-2] == "message_delta" and names.count("message_delta") == 1, names
    parsed, open_index, next_index = [], None, 0
    for name, data in events:
        if name in ("ping", "error"):
            continue
        ev = _EVENT.validate_python(data)
        no_extras(ev)
        parsed.append(ev)
        if name == "content_block_start":
            assert open_index is None and data["index"] == next_index, f"block {data['index']} starts out of order"
            open_index = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == open_index, "a delta outside its block"
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index, next_index = None, next_index + 1
    return parsed


_RESPONSE_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
_TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")


def validate_response(raw: bytes | str) -> Response:
    """Parses a Responses API `response` body with the openai SDK's type: declared fields only, nothing lost."""
    data = json.loads(raw)
    obj = Response.model_validate(data)
    no_extras(obj)
    dumped = obj.model_dump(mode="json", exclude_unset=True, by_alias=True)
    assert dumped == data, "the SDK's type does not hold the body as sent"
    return obj


def validate_response_stream(raw: bytes | str) -> list[Any]:
    """Checks a Responses event stream: each event named as its data's `type` and of the SDK's event types;
    `sequence_number` counts from 0; `response.created` first; one terminal event (`response.completed`,
    `response.failed`, `response.incomplete` or `error`) last; items added and done in order of `output_index`
    (0, 1, …); and a completed response's `output` is exactly the items the stream finished."""
    events = sse_events(raw)
    assert events, "an empty stream"
    names = [n for n, _ in events]
    for i, (name, data) in enumerate(events):
        assert name == data.get("type"), f"event {name!r} carries a {data.get('type')!r}"
        assert data.get("sequence_number") == i, f"event {i} ({name}): sequence_number {data.get('sequence_number')}"
    assert names[0] == "response.created" and names.count("response.created") == 1, names[:3]
    assert names[-1] in _TERMINAL and sum(names.count(t) for t in _TERMINAL) == 1, names[-3:]
    parsed, open_index, next_index, done = [], None, 0, []
    for name, data in events:
        if name == "error":  # the SDK raises on it (its `error` object) before any type is applied
            assert isinstance(data.get("error"), dict) and data["error"].get("message"), data
            continue
        ev = _RESPONSE_EVENT.validate_python(data)
        no_extras(ev)
        parsed.append(ev)
        if name == "response.output_item.added":
            assert open_index is None and data["output_index"] == next_index, f"item {data['output_index']} early"
            open_index = data["output_index"]
        elif name == "response.output_item.done":
            assert data["output_index"] == open_index
            open_index, next_index = None, next_index + 1
            done.append(data["item"])
        elif "output_index" in data and name not in _TERMINAL:
            assert data["output_index"] == open_index, f"{name} outside its item"
    if names[-1] == "response.completed":
        assert events[-1][1]["response"]["output"] == done, "response.completed's output is not what was streamed"
        assert open_index is None
    return parsed


def key_paths(v: Any, prefix: str = "") -> set[str]:
    """Every object key path in a JSON value (array positions ignored)."""
    out: set[str] = set()
    if isinstance(v, dict):
        for k, x in v.items():
            p = f"{prefix}.{k}"
            out.add(p)
            out |= key_paths(x, p)
    elif isinstance(v, list):
        for x in v:
            out |= key_paths(x, prefix + "[]")
    return out


def _reply_values(reply: dict) -> list[Any]:
    if "sse" in reply:
        return [json.loads(d) for d in sse_data(reply["sse"]) if d != "[DONE]"]
    if not reply.get("body"):
        return []
    try:
        return [json.loads(reply["body"])]
    except ValueError:
        return []


def check_exchanges(exchanges: list[Exchange], upstream: list[dict], rewritten: bool) -> None:
    """Every chat completions, Messages or Responses exchange a client made: valid for the SDK's types; and when ctxgate
    forwarded the request as it was (byte for byte), the answer is exactly what the mock sent. When it was rewritten
    (recall rounds), the answer holds no field that none of the mock's replies had, and no more chunks (Anthropic
    pings aside) than they had."""
    unmatched = list(upstream)
    for ex in exchanges:
        path = ex.url.split("?")[0]
        anthropic_api = path.endswith("/v1/messages")
        responses_api = path.endswith("/v1/responses")
        if not path.endswith("/chat/completions") and not anthropic_api and not responses_api:
            continue
        sent = ex.request.decode()
        same = [u for u in unmatched if u["raw"] == sent]
        if same:
            up = same[0]
            unmatched.remove(up)
            reply = up["reply"]
            assert reply["status"] == ex.status
            if "sse" in reply:
                assert bytes(ex.body).decode() == reply["sse"], "the stream differs from the upstream's"
            else:
                assert bytes(ex.body).decode() == reply["body"], "the body differs from the upstream's"
        else:
            assert rewritten, f"ctxgate changed a request it had no reason to rewrite:\n{sent[:500]}"
            allowed = set().union(*(key_paths(v) for u in unmatched for v in _reply_values(u["reply"])))
            if ex.content_type.startswith("text/event-stream"):
                got = [json.loads(d) for d in sse_data(bytes(ex.body)) if d != "[DONE]"]
                if anthropic_api:  # pings are ctxgate's own keep-alives while it answers a recall round
                    got = [g for g in got if g.get("type") != "ping"]
                sent_chunks = sum(len(_reply_values(u["reply"])) for u in unmatched)
                assert len(got) <= sent_chunks, "ctxgate added chunks"
            else:
                got = [json.loads(bytes(ex.body))]
            for g in got:
                extra = key_paths(g) - allowed
                assert not extra, f"fields the upstream never sent: {sorted(extra)}"
        stream = ex.content_type.startswith("text/event-stream")
        if ex.status == 200 and responses_api and stream:
            validate_response_stream(bytes(ex.body))
        elif ex.status == 200 and responses_api:
            validate_response(bytes(ex.body))
        elif ex.status == 200 and anthropic_api and stream:
            validate_event_stream(bytes(ex.body))
        elif ex.status == 200 and anthropic_api:
            validate_message(bytes(ex.body))
        elif ex.status == 200 and stream:
            validate_stream(bytes(ex.body))
        elif ex.status == 200:
            validate_completion(bytes(ex.body))
        else:
            err = json.loads(bytes(ex.body))
            assert isinstance(err.get("error"), dict), err
            if anthropic_api:
                assert err["type"] == "error" and set(err["error"]) >= {"type", "message"}, err
