"""The fake upstream (nginx with fixed bodies) and the contenders in front of it: direct, nginx as a reverse proxy,
ctxgate (default config, its own SQLite store) and LiteLLM's proxy."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .procs import HarnessError, Proc, free_port, tree, wait_http

MODEL = "gpt-4o-mini"
STREAM_MODEL = "gpt-4o-mini-stream"  # LiteLLM's name for the model served by the SSE upstream
SSE_CHUNKS = 20

# The small chat of scenario 1, the body every contender is sent.
CHAT_BODY = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Say hello in one short sentence."},
    ],
    "max_tokens": 32,
}
EMBEDDINGS_BODY = {"model": "text-embedding-3-small", "input": "Say hello in one short sentence."}

CHAT_REPLY = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": MODEL,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello! How can I help you today?"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 24, "completion_tokens": 9, "total_tokens": 33},
}
EMBEDDINGS_REPLY = {
    "object": "list",
    "data": [{"object": "embedding", "index": 0, "embedding": [0.0125, -0.0042, 0.0311, 0.0007]}],
    "model": "text-embedding-3-small",
    "usage": {"prompt_tokens": 8, "total_tokens": 8},
}


def sse_body() -> str:
    """20 chat.completion.chunk events (a role, 18 content pieces, a finish), a usage chunk, then [DONE]."""
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000, "model": MODEL}
    events = []
    for i in range(SSE_CHUNKS):
        if i == 0:
            delta, finish = {"role": "assistant", "content": ""}, None
        elif i == SSE_CHUNKS - 1:
            delta, finish = {}, "stop"
        else:
            delta, finish = {"content": f"word{i} "}, None
        events.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    events.append({**base, "choices": [], "usage": {"prompt_tokens": 24, "completion_tokens": 18, "total_tokens": 42}})
    return "".join(f"data: {json.dumps(e, separators=(',', ':'))}\n\n" for e in events) + "data: [DONE]\n\n"


def _nginx_string(s: str) -> str:
    if "$" in s or "'" in s:
        raise HarnessError("a fixed body may not contain $ or '")
    return "'" + s.replace("\\", "\\\\").replace("\n", "\\n") + "'"


def nginx_binary() -> str:
    path = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(path).exists():
        raise HarnessError("nginx is missing: apt-get install -y nginx-light")
    return path


def _start_nginx(name: str, conf: str, work: Path) -> Proc:
    prefix = work / name
    (prefix / "logs").mkdir(parents=True, exist_ok=True)
    (prefix / "nginx.conf").write_text(conf)
    return Proc(name, [nginx_binary(), "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", str(prefix / "logs/error.log")], work / f"{name}.out")


_NGINX_HEAD = """daemon off;
master_process on;
worker_processes {workers};
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 8192; }}
http {{
  client_body_temp_path {prefix}/tmp_body;
  proxy_temp_path {prefix}/tmp_proxy;
  fastcgi_temp_path {prefix}/tmp_fcgi;
  uwsgi_temp_path {prefix}/tmp_uwsgi;
  scgi_temp_path {prefix}/tmp_scgi;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  client_max_body_size 64m;
  client_body_buffer_size 1m;  # trace bodies (scenario 5) stay in memory, never in a temp file
"""


@dataclass
class Upstream:
    """nginx answering every POST with fixed bytes: chat JSON on `json_port` (embeddings JSON under
    /v1/embeddings), the SSE body on `sse_port`."""

    proc: Proc
    json_port: int
    sse_port: int

    @property
    def json_base(self) -> str:
        return f"http://127.0.0.1:{self.json_port}/v1"

    @property
    def sse_base(self) -> str:
        return f"http://127.0.0.1:{self.sse_port}/v1"


def start_upstream(work: Path) -> Upstream:
    jp, sp = free_port(), free_port()
    prefix = work / "upstream"
    conf = _NGINX_HEAD.format(workers=1, prefix=prefix) + f"""  access_log off;
  server {{
    listen 127.0.0.1:{jp} backlog=4096;
    location /v1/embeddings {{ default_type application/json; return 200 {_nginx_string(json.dumps(EMBEDDINGS_REPLY))}; }}
    location / {{ default_type application/json; return 200 {_nginx_string(json.dumps(CHAT_REPLY))}; }}
  }}
  server {{
    listen 127.0.0.1:{sp} backlog=4096;
    location / {{ default_type text/event-stream; return 200 {_nginx_string(sse_body())}; }}
  }}
}}
"""
    proc = _start_nginx("upstream", conf, work)
    wait_http(proc, f"http://127.0.0.1:{jp}/v1/models")
    return Upstream(proc, jp, sp)


@dataclass
class Contender:
    """One way to reach the upstream: `base` replaces the upstream's `/v1` base for JSON, `sse_base` for streams."""

    name: str
    base: str
    sse_base: str
    proc: Proc | None = None
    model_for_stream: str = MODEL
    extra: dict = field(default_factory=dict)

    def pids(self) -> list[int]:
        return tree(self.proc.pid) if self.proc else []

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc:
            self.proc.stop(timeout)


def direct(up: Upstream) -> Contender:
    return Contender("direct", up.json_base, up.sse_base)


def start_nginx_proxy(up: Upstream, work: Path) -> Contender:
    jp, sp = free_port(), free_port()
    prefix = work / "nginx-proxy"
    loc = "proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off;"
    conf = _NGINX_HEAD.format(workers="auto", prefix=prefix) + f"""  access_log {prefix}/logs/access.log;
  upstream json_up {{ server 127.0.0.1:{up.json_port}; keepalive 256; }}
  upstream sse_up {{ server 127.0.0.1:{up.sse_port}; keepalive 256; }}
  server {{ listen 127.0.0.1:{jp} backlog=4096; location / {{ proxy_pass http://json_up; {loc} }} }}
  server {{ listen 127.0.0.1:{sp} backlog=4096; location / {{ proxy_pass http://sse_up; {loc} }} }}
}}
"""
    proc = _start_nginx("nginx-proxy", conf, work)
    wait_http(proc, f"http://127.0.0.1:{jp}/v1/models")
    return Contender("nginx", f"http://127.0.0.1:{jp}/v1", f"http://127.0.0.1:{sp}/v1", proc)


def ctxgate_config(listen_port: int, upstream_base: str, store: Path, extra: str = "") -> str:
    """The default config but for where it listens, the upstream and the store's file."""
    return f"""[server]
listen = "127.0.0.1:{listen_port}"

[upstream]
base_url = "{upstream_base}"

[store]
path = "{store}"
{extra}"""


def start_ctxgate(
    binary: Path, upstream_base: str, work: Path, name: str = "ctxgate", extra: str = "", argv_prefix: list[str] | None = None
) -> Contender:
    """ctxgate with its own temp dir (SQLite store, log), `serve --config`; `argv_prefix` runs it under a tool."""
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (d / "ctxgate.toml").write_text(ctxgate_config(port, upstream_base, d / "ctxgate.db", extra))
    argv = (argv_prefix or []) + [str(binary), "serve", "--config", str(d / "ctxgate.toml")]
    proc = Proc(name, argv, work / f"{name}.out", cwd=d)
    wait_http(proc, f"http://127.0.0.1:{port}/healthz", timeout=180 if argv_prefix else 60)
    base = f"http://127.0.0.1:{port}/v1"
    return Contender(name, base, base, proc, extra={"port": port, "dir": str(d)})


def start_ctxgate_pair(binary: Path, up: Upstream, work: Path, tag: str) -> tuple[Contender, Contender]:
    """Two ctxgate processes of the same build: one in front of the JSON upstream, one in front of the SSE one."""
    a = start_ctxgate(binary, up.json_base, work, f"ctxgate-{tag}")
    b = start_ctxgate(binary, up.sse_base, work, f"ctxgate-sse-{tag}")
    a.name = b.name = "ctxgate"
    return a, b


def start_litellm(venv: Path, up: Upstream, work: Path) -> Contender:
    """LiteLLM's proxy, one worker, offline: the model cost map from the package, no telemetry."""
    port = free_port()
    d = work / "litellm"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model_list": [
            {"model_name": MODEL, "litellm_params": {"model": f"openai/{MODEL}", "api_base": up.json_base, "api_key": "sk-fake"}},
            {"model_name": STREAM_MODEL, "litellm_params": {"model": f"openai/{MODEL}", "api_base": up.sse_base, "api_key": "sk-fake"}},
        ],
        "litellm_settings": {"telemetry": False, "drop_params": True},
    }
    (d / "config.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        "DISABLE_ADMIN_UI": "True",
        "NO_PROXY": "*",
        "HOME": str(d),
    }
    argv = [str(venv / "bin/litellm"), "--config", str(d / "config.yaml"), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    proc = Proc("litellm", argv, work / "litellm.out", env=env, cwd=d)
    wait_http(proc, f"http://127.0.0.1:{port}/health/liveliness", timeout=180)
    base = f"http://127.0.0.1:{port}/v1"
    return Contender("litellm", base, base, proc, model_for_stream=STREAM_MODEL)
