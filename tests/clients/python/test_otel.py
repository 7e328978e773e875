"""OpenTelemetry traces against a real OTLP/HTTP receiver: a stdlib HTTP server decoding the collector protocol's
protobuf (`opentelemetry-proto`). ctxgate (with `[otel] endpoint` set) in front of the mock: the span tree of a
request and of one with recall rounds, their names and attributes, the client's trace continued, the upstream's
`traceparent`, no message content by default, and a collector outage that neither slows nor fails a request and
loses nothing once the collector is back. With `[otel]` off, the upstream's headers are the client's."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from conftest import _stop
from ctxtest import MODEL, Gateway, Mock, completion, sse_text, tool_call
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from test_openai_sdk import READ_FILE, RECALL, agent_history

SERVER, CLIENT, INTERNAL = 2, 3, 1  # Span.SpanKind


class Receiver:
    """An OTLP/HTTP trace receiver on a fixed loopback port that can be taken down and brought back."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.posts: list[dict] = []  # each export: its path and headers
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.port = 0
        self.up()
        assert self.server is not None
        self.port = self.server.server_address[1]

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                with receiver.lock:
                    receiver.posts.append({"path": self.path, "headers": dict(self.headers)})
                    receiver.spans.extend(flatten(req))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None

    def wait_for(self, pred, timeout: float = 10.0) -> list[dict]:
        """The spans received once `pred(spans)` holds (fails after `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                spans = list(self.spans)
            if pred(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"spans not received in time; got {[s['name'] for s in spans]}")


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def flatten(req: ExportTraceServiceRequest) -> list[dict]:
    out = []
    for rs in req.resource_spans:
        resource = {a.key: value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    {
                        "name": s.name,
                        "kind": s.kind,
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent": s.parent_span_id.hex(),
                        "attrs": {a.key: value(a.value) for a in s.attributes},
                        "links": [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        "status": s.status.code,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "resource": resource,
                        "scope": ss.scope.name,
                    }
                )
    return out


def of_trace(spans: list[dict], trace_id: str) -> list[dict]:
    return [s for s in spans if s["trace_id"] == trace_id]


def render(spans: list[dict], root: dict, depth: int = 0) -> list[str]:
    """The span tree under `root` as indented lines (for the failure messages and the docs' example)."""
    lines = ["  " * depth + root["name"]]
    for child in sorted((s for s in spans if s["parent"] == root["span_id"]), key=lambda s: s["start"]):
        lines += render(spans, child, depth + 1)
    return lines


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    if r.server:
        r.down()


@pytest.fixture(scope="module")
def traced(upstream, receiver: Receiver):
    """ctxgate with `[otel]` on (an export every 100 ms), in front of the mock, with a small window."""
    saved = dict(os.environ)
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"
    try:
        proc, listen = upstream.gateway(
            "[context]\ndefault_context_window = 8000\n"
            f'[otel]\nendpoint = "http://127.0.0.1:{receiver.port}"\nservice_name = "ctxgate-test"\n'
            '[otel.headers]\nx-collector-key = "collector-secret"\n',
            name="otel",
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    mock = Mock(upstream.mock_url.removesuffix("/v1"))
    try:
        yield Gateway(base_url=f"http://{listen}/v1", mock=mock), upstream.tmp / "otel.toml", upstream.binary
    finally:
        _stop(proc)


@pytest.fixture
def tgw(traced) -> Gateway:
    gw = traced[0]
    gw.mock.reset()
    return gw


def chat(gw: Gateway, body: dict, headers: dict | None = None) -> httpx.Response:
    h = {"authorization": f"Bearer {gw.api_key}", **(headers or {})}
    return httpx.post(f"{gw.base_url}/chat/completions", json=body, headers=h, timeout=30, trust_env=False)


def test_span_tree_names_attributes_and_trace_context(tgw: Gateway, receiver: Receiver, traced):
    tgw.mock.script(completion("Traced hello.", id="chatcmpl-traced"))
    trace_id, client_span, header = traceparent()
    r = chat(
        tgw,
        {"model": MODEL, "messages": [{"role": "user", "content": "secret question 42"}]},
        {"traceparent": header, "tracestate": "vendor=client", "x-session-id": "otel-s1"},
    )
    assert r.status_code == 200
    spans = receiver.wait_for(lambda s: {"POST /v1/chat/completions", f"chat {MODEL}", "ctxgate.plan"}
                              <= {x["name"] for x in of_trace(s, trace_id)})
    mine = of_trace(spans, trace_id)
    server = next(s for s in mine if s["name"] == "POST /v1/chat/completions")
    plan = next(s for s in mine if s["name"] == "ctxgate.plan")
    up = next(s for s in mine if s["name"] == f"chat {MODEL}")
    tree = "\n".join(render(mine, server))
    # The client's trace continues: the server span is the child of the client's span.
    assert server["parent"] == client_span and server["kind"] == SERVER, tree
    assert plan["parent"] == server["span_id"] and plan["kind"] == INTERNAL, tree
    assert up["parent"] == server["span_id"] and up["kind"] == CLIENT, tree
    assert server["attrs"]["http.request.method"] == "POST"
    assert server["attrs"]["http.route"] == "/v1/chat/completions"
    assert server["attrs"]["url.path"] == "/v1/chat/completions"
    assert server["attrs"]["http.response.status_code"] == 200
    assert server["resource"]["service.name"] == "ctxgate-test" and server["scope"] == "ctxgate"
    a = up["attrs"]
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == MODEL and a["gen_ai.response.model"] == MODEL
    assert a["gen_ai.response.id"] == "chatcmpl-traced"
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (12, 5)
    assert a["gen_ai.conversation.id"] == r.headers["x-ctxgate-session"]
    assert a["ctxgate.strategy"] == "hybrid" and a["ctxgate.rewritten"] is False
    assert a["server.address"] == "127.0.0.1"
    assert plan["attrs"]["ctxgate.rewritten"] is False
    # The upstream request names ctxgate's upstream span in the client's trace, with the client's trace state.
    (sent,) = tgw.mock.requests()
    assert sent["headers"]["traceparent"] == f"00-{trace_id}-{up['span_id']}-01"
    assert sent["headers"]["tracestate"] == "vendor=client"
    # The spans end in order: the upstream's inside the server's.
    assert server["start"] <= up["start"] <= up["end"] <= server["end"]
    # No message content in any span unless otel.capture_content is on.
    dumped = json.dumps(mine)
    assert "secret question" not in dumped and "Traced hello" not in dumped
    # Exports go to <endpoint>/v1/traces with the configured headers, whose values the printed config masks.
    assert receiver.posts[-1]["path"] == "/v1/traces"
    assert receiver.posts[-1]["headers"]["x-collector-key"] == "collector-secret"
    binary, config = traced[2], traced[1]
    shown = subprocess.run([binary, "check-config", str(config)], capture_output=True, text=True, check=True).stdout
    assert "collector-secret" not in shown and 'x-collector-key = "***"' in shown, shown


def test_a_new_trace_without_traceparent_and_a_streamed_reply(tgw: Gateway, receiver: Receiver):
    tgw.mock.script(sse_text(["one ", "two"]))
    body = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "stream please"}]}
    r = chat(tgw, body)
    assert r.status_code == 200 and "[DONE]" in r.text
    (sent,) = tgw.mock.requests()
    version, trace_id, span_id, flags = sent["headers"]["traceparent"].split("-")
    assert (version, flags) == ("00", "01")
    spans = receiver.wait_for(lambda s: any(x["span_id"] == span_id for x in s))
    mine = of_trace(spans, trace_id)
    up = next(s for s in mine if s["span_id"] == span_id)
    server = next(s for s in mine if s["kind"] == SERVER)
    assert server["parent"] == "", "a new trace starts at the server span"
    assert up["name"] == f"chat {MODEL}" and up["parent"] == server["span_id"]
    assert up["attrs"]["gen_ai.usage.output_tokens"] == 2
    assert up["attrs"]["gen_ai.response.finish_reasons"] == ["stop"]


def test_recall_rounds_are_spans_of_their_own(tgw: Gateway, receiver: Receiver):
    tgw.mock.script(
        completion(None, [tool_call("r1", RECALL, {"call_id": "call_0"})], id="chatcmpl-round1"),
        completion("The first file starts with MARKER-0.", id="chatcmpl-final"),
    )
    trace_id, _, header = traceparent()
    r = chat(tgw, {"model": MODEL, "messages": agent_history(), "tools": [READ_FILE]}, {"traceparent": header})
    assert r.status_code == 200
    spans = receiver.wait_for(
        lambda s: sum(x["name"] == f"chat {MODEL}" for x in of_trace(s, trace_id)) == 2
        and any(x["name"].startswith("execute_tool") for x in of_trace(s, trace_id))
    )
    mine = of_trace(spans, trace_id)
    server = next(s for s in mine if s["kind"] == SERVER)
    tree = render(mine, server)
    print("\n" + "\n".join(tree))
    assert tree == [
        "POST /v1/chat/completions",
        "  ctxgate.plan",
        f"  chat {MODEL}",
        f"  execute_tool {RECALL}",
        f"  chat {MODEL}",
    ], "\n".join(tree)
    plan = next(s for s in mine if s["name"] == "ctxgate.plan")
    assert plan["attrs"]["ctxgate.rewritten"] is True
    assert plan["attrs"]["ctxgate.tokens.before"] > plan["attrs"]["ctxgate.tokens.after"] > 0
    assert plan["attrs"]["ctxgate.stages"] and all(isinstance(x, str) for x in plan["attrs"]["ctxgate.stages"])
    first, second = sorted((s for s in mine if s["name"] == f"chat {MODEL}"), key=lambda s: s["start"])
    assert (first["attrs"]["ctxgate.round"], second["attrs"]["ctxgate.round"]) == (0, 1)
    assert first["attrs"]["gen_ai.response.id"] == "chatcmpl-round1"
    assert first["attrs"]["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert second["attrs"]["gen_ai.response.id"] == "chatcmpl-final"
    assert first["attrs"]["ctxgate.rewritten"] is True
    tool = next(s for s in mine if s["name"] == f"execute_tool {RECALL}")
    assert tool["attrs"]["gen_ai.tool.name"] == RECALL and tool["attrs"]["gen_ai.tool.call.id"] == "r1"
    assert tool["attrs"]["ctxgate.recall.outcome"] == "found"
    # Each upstream round names its own span.
    one, two = tgw.mock.requests()
    assert one["headers"]["traceparent"] == f"00-{trace_id}-{first['span_id']}-01"
    assert two["headers"]["traceparent"] == f"00-{trace_id}-{second['span_id']}-01"
    assert "MARKER-0" not in json.dumps(mine), "no content in spans"


def test_a_collector_outage_neither_slows_nor_fails_requests(tgw: Gateway, receiver: Receiver):
    def send(n: int) -> tuple[list[str], float]:
        ids, slowest = [], 0.0
        for i in range(n):
            tgw.mock.script(completion(f"reply {i}"))
            trace_id, _, header = traceparent()
            started = time.monotonic()
            r = chat(tgw, {"model": MODEL, "messages": [{"role": "user", "content": f"q{i}"}]}, {"traceparent": header})
            slowest = max(slowest, time.monotonic() - started)
            assert r.status_code == 200
            ids.append(trace_id)
        return ids, slowest

    _, normal = send(5)
    receiver.down()
    try:
        during, slowest = send(10)
        time.sleep(3)  # longer than the exporter's retries (3, from 100 ms, doubling): some batches are dropped
    finally:
        receiver.up()
    assert slowest < max(0.5, 5 * normal), f"a request took {slowest:.3f}s while the collector was down"
    after, _ = send(10)
    # Every request after the outage is traced whole (server, plan and upstream spans): only what was exported
    # while the collector was down can be lost.
    spans = receiver.wait_for(lambda s: all(sum(x["trace_id"] == t for x in s) == 3 for t in after), timeout=15)
    lost = [t for t in during if not any(x["trace_id"] == t for x in spans)]
    print(f"collector outage: {len(lost)} of {len(during)} traces made while it was down were lost")


def test_passthrough_requests_are_traced_too(tgw: Gateway, receiver: Receiver):
    trace_id, client_span, header = traceparent()
    r = httpx.get(f"{tgw.base_url}/models", headers={"traceparent": header, "authorization": "Bearer k"}, trust_env=False)
    spans = receiver.wait_for(lambda s: any(x["trace_id"] == trace_id for x in s))
    (server,) = of_trace(spans, trace_id)
    assert server["name"] == "GET /v1/{*rest}" and server["parent"] == client_span
    assert server["attrs"]["url.path"] == "/v1/models"
    assert server["attrs"]["http.response.status_code"] == r.status_code
    (sent,) = tgw.mock.requests()
    assert sent["headers"]["traceparent"] == f"00-{trace_id}-{server['span_id']}-01"


def test_spans_still_queued_are_exported_at_shutdown(upstream, receiver: Receiver):
    """With the SDK's default pace (an export every 5 s), a request answered just before SIGTERM still has its spans
    exported: the shutdown flushes them after the drain."""
    proc, listen = upstream.gateway(f'[otel]\nendpoint = "http://127.0.0.1:{receiver.port}"\n', name="otel-flush")
    try:
        mock = Mock(upstream.mock_url.removesuffix("/v1"))
        mock.reset()
        mock.script(completion("bye"))
        trace_id, _, header = traceparent()
        gw = Gateway(base_url=f"http://{listen}/v1", mock=mock)
        assert chat(gw, {"model": MODEL, "messages": [{"role": "user", "content": "last"}]},
                    {"traceparent": header}).status_code == 200
        started = time.monotonic()
    finally:
        _stop(proc)
    assert time.monotonic() - started < 5, "exited before the first scheduled export"
    with receiver.lock:
        names = sorted(x["name"] for x in receiver.spans if x["trace_id"] == trace_id)
    assert names == ["POST /v1/chat/completions", f"chat {MODEL}", "ctxgate.plan"], names


def test_otel_off_adds_no_header(gw: Gateway):
    """The plain gateway (`[otel]` unset): the client's traceparent reaches the upstream as it was, and none is
    added when the client sent none."""
    _, _, header = traceparent()
    gw.mock.script(completion("a"), completion("b"))
    h = {"authorization": f"Bearer {gw.api_key}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "no tracing"}]}
    with httpx.Client(transport=gw.tap.transport(), trust_env=False) as c:
        assert c.post(f"{gw.base_url}/chat/completions", json=body, headers={**h, "traceparent": header}).status_code == 200
        assert c.post(f"{gw.base_url}/chat/completions", json=body, headers=h).status_code == 200
    one, two = gw.mock.requests()
    assert one["headers"]["traceparent"] == header
    assert "traceparent" not in two["headers"] and "tracestate" not in two["headers"]
