"""Fixtures for the client-library suites: the built `ctxgate` binary in front of `ctxgate mock-upstream`, both on
loopback ports chosen by the OS, and checks that every response a client received is valid for the SDK's own
types and carries nothing beyond what the mock upstream sent.

No test here reaches a real provider: every client's base URL is the local ctxgate, whose upstream is the mock.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ctxtest import Gateway, Mock, Tap, check_exchanges

REPO = Path(__file__).resolve().parents[3]


def _binary() -> Path:
    """`CTXGATE_BIN`, else the newest of target/debug/ctxgate and target/release/ctxgate (build with `cargo build`)."""
    if os.environ.get("CTXGATE_BIN"):
        return Path(os.environ["CTXGATE_BIN"])
    found = [p for p in (REPO / "target/debug/ctxgate", REPO / "target/release/ctxgate") if p.exists()]
    if not found:
        pytest.exit("no ctxgate binary: run `cargo build` first (or set CTXGATE_BIN)", returncode=2)
    return max(found, key=lambda p: p.stat().st_mtime)


def _start(args: list[str], log: Path, pattern: str) -> tuple[subprocess.Popen, str]:
    """Starts a process logging to `log` and waits for the first line matching `pattern` (group 1 is returned)."""
    env = dict(os.environ, NO_COLOR="1", CTXGATE_LOG="info")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = re.search(pattern, log.read_text(errors="replace"))
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{args[0]} {args[1]} did not start:\n{log.read_text(errors='replace')}")


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def start_gateway(binary: str, tmp: Path, mock_url: str, extra: str = "", name: str = "ctxgate") -> tuple:
    """Starts `ctxgate serve` in front of the mock (OpenAI, Anthropic and Gemini APIs), with `extra` TOML appended to the config; returns
    the process and its listen address."""
    config = tmp / f"{name}.toml"
    config.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
[upstream]
base_url = "{mock_url}"
timeout_secs = 30
[anthropic]
base_url = "{mock_url}"
[gemini]
base_url = "{mock_url.removesuffix('/v1')}"
[store]
path = "{tmp / f'{name}.db'}"
{extra}
"""
    )
    return _start(
        [binary, "serve", "--config", str(config), "--log-format", "json"],
        tmp / f"{name}.log",
        r'"listen":"(127\.0\.0\.1:\d+)"',
    )


@dataclass
class Upstream:
    """The running mock upstream, and what it takes to start gateways in front of it."""

    binary: str
    tmp: Path
    mock_url: str  # with /v1

    def gateway(self, extra: str = "", name: str = "ctxgate") -> tuple[subprocess.Popen, str]:
        return start_gateway(self.binary, self.tmp, self.mock_url, extra, name)


@pytest.fixture(scope="session")
def upstream():
    """`ctxgate mock-upstream` on a loopback port, for the whole session."""
    binary = str(_binary())
    with tempfile.TemporaryDirectory(prefix="ctxgate-clients-") as tmp:
        tmp = Path(tmp)
        mock_proc, mock_url = _start(
            [binary, "mock-upstream", "--listen", "127.0.0.1:0"],
            tmp / "mock.log",
            r"base_url\W+(http://127\.0\.0\.1:\d+/v1)",
        )
        try:
            yield Upstream(binary, tmp, mock_url)
        finally:
            _stop(mock_proc)


@pytest.fixture(scope="session")
def stack(upstream: Upstream):
    """The mock upstream and ctxgate in front of it (small default window, so long histories get rewritten)."""
    gw_proc, listen = upstream.gateway("[context]\ndefault_context_window = 8000\n")
    try:
        yield Gateway(base_url=f"http://{listen}/v1", mock=Mock(upstream.mock_url.removesuffix("/v1")))
    finally:
        _stop(gw_proc)


@pytest.fixture
def gw(stack: Gateway):
    """Per test: a fresh mock (no script, no recorded requests) and a fresh tap; at the end, every exchange the
    clients made is checked against the SDK's types and against what the mock sent."""
    stack.mock.reset()
    stack.tap = Tap()
    stack.rewritten = False
    yield stack
    check_exchanges(stack.tap.exchanges, stack.mock.requests(), stack.rewritten)


@pytest.fixture
def http_client(gw: Gateway) -> httpx.Client:
    with httpx.Client(transport=gw.tap.transport()) as c:
        yield c


@pytest.fixture
def async_http_client(gw: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=gw.tap.async_transport())


@pytest.fixture
def http2_client(gw: Gateway):
    """An httpx2 client (what the anthropic SDK takes) whose exchanges the tap records."""
    import httpx2

    with httpx2.Client(transport=gw.tap.transport(httpx2)) as c:
        yield c
