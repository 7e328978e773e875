"""Scenario 3 (concurrent agent sessions growing to ~100k tokens, tool outputs from the shared traces) and the
session filler of scenario 4, with the fake upstream they need: it answers each turn with the assistant message
the agent sends next (so the history ctxgate records is the one the client continues), reports a plausible
`usage.prompt_tokens` (so calibration works), and checks every request it receives for validity."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import time
from pathlib import Path
from urllib.parse import urlsplit

from .load import AUTH, percentile
from .procs import HarnessError, free_port

# The shared chat traces: CTXGATE_BENCH_TRACES, else ../shared/traces beside the repository, else /work/shared/traces.
_REPO = Path(__file__).resolve().parents[2]
TRACES = Path(
    os.environ.get("CTXGATE_BENCH_TRACES")
    or next(
        (str(p) for p in (_REPO.parent / "shared/traces", Path("/work/shared/traces")) if any(p.glob("*.json"))),
        str(_REPO.parent / "shared/traces"),
    )
)
AGENT_MODEL = "bench-agent-64k"  # its window is set in ctxgate's config, so rewriting starts near 51k tokens
AGENT_WINDOW = 64000


def load_pool(traces: Path = TRACES) -> tuple[list[list[dict]], list[list[dict]]]:
    """(openings, rounds) from every chat trace: an opening is the system + first user message, a round is an
    assistant message with tool calls followed by their tool results."""
    openings, rounds = [], []
    files = sorted(traces.glob("*.json"))
    if not files:
        if os.environ.get("CTXGATE_BENCH_SMOKE") == "1":
            return synthetic_pool()
        raise HarnessError(f"no traces in {traces} (set CTXGATE_BENCH_TRACES)")
    for f in files:
        msgs = json.loads(f.read_text())["messages"]
        first_user = next(i for i, m in enumerate(msgs) if m["role"] == "user")
        openings.append(msgs[: first_user + 1])
        i = first_user + 1
        while i < len(msgs):
            m = msgs[i]
            if m["role"] == "assistant" and m.get("tool_calls"):
                n = len(m["tool_calls"])
                results = msgs[i + 1 : i + 1 + n]
                if len(results) == n and all(r["role"] == "tool" for r in results):
                    rounds.append([m] + results)
                i += 1 + n
            else:
                i += 1
    return openings, rounds


def synthetic_pool() -> tuple[list[list[dict]], list[list[dict]]]:
    """A small agent-like pool for the smoke run on a machine without the shared traces: one opening, rounds of
    one or two tool calls with outputs of a few hundred to a few thousand characters."""
    opening = [
        {"role": "system", "content": "You are a coding agent. Use the tools to inspect and fix the repository."},
        {"role": "user", "content": "Fix the failing test in src/parser.rs and explain the cause."},
    ]
    rounds = []
    for k in range(12):
        calls = [
            {"id": f"t{k}_{j}", "type": "function",
             "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/mod{k}_{j}.rs"})}}
            for j in range(1 + k % 2)
        ]
        results = [
            {"role": "tool", "tool_call_id": c["id"], "content": f"// {c['id']}\n" + "fn item() -> u32 { 42 }\n" * (20 + 60 * k)}
            for c in calls
        ]
        rounds.append([{"role": "assistant", "content": None, "tool_calls": calls}] + results)
    return [opening], rounds


def round_for(rounds: list[list[dict]], session: int, index: int) -> list[dict]:
    """Round `index` of `session`: a pool round (rotating, per-session offset) with ids unique to the session."""
    src = rounds[(session * 7 + index) % len(rounds)]
    calls = []
    for j, c in enumerate(src[0]["tool_calls"]):
        calls.append({**c, "id": f"call_{session}_{index}_{j}"})
    out = [{**src[0], "tool_calls": calls}]
    for j, r in enumerate(src[1:]):
        out.append({"role": "tool", "tool_call_id": f"call_{session}_{index}_{j}", "content": r.get("content") or ""})
    return out


def check_messages(msgs) -> str | None:
    """Why a chat request's messages are invalid for the API, or None: known roles; every tool message answers
    a call of the assistant message just before its run of results; every call gets its result; it ends with a
    user or tool message."""
    if not isinstance(msgs, list) or not msgs:
        return "no messages"
    pending: set[str] = set()
    for i, m in enumerate(msgs):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "tool":
            cid = m.get("tool_call_id")
            if cid not in pending:
                return f"message {i}: tool result {cid!r} answers no open call"
            pending.discard(cid)
            continue
        if pending:
            return f"message {i}: calls {sorted(pending)} got no result"
        if role == "assistant":
            pending = {c.get("id") for c in m.get("tool_calls") or []}
        elif role not in ("system", "developer", "user"):
            return f"message {i}: role {role!r}"
    if pending:
        return f"calls {sorted(pending)} got no result"
    if msgs[-1].get("role") not in ("user", "tool"):
        return f"ends with {msgs[-1].get('role')!r}"
    return None


def _prompt_tokens(msgs: list[dict], tools) -> int:
    chars = len(json.dumps(tools)) if tools else 0
    for m in msgs:
        c = m.get("content")
        chars += len(c) if isinstance(c, str) else len(json.dumps(c)) if c else 0
        chars += sum(len(tc["function"]["name"]) + len(tc["function"]["arguments"]) for tc in m.get("tool_calls") or [])
    return chars // 4 + 4 * len(msgs)


# --- the fake upstream (its own process) -------------------------------------------------------------------------


async def _upstream_conn(reader, writer, rounds, stats):
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            stats["requests"] += 1
            try:
                req = json.loads(body)
                msgs = req.get("messages")
                err = check_messages(msgs)
            except ValueError:
                req, msgs, err = {}, [], "not JSON"
            if err:
                stats["invalid"] += 1
                if len(stats["examples"]) < 5:
                    stats["examples"].append(err)
            nxt = headers.get("x-bench-next")
            if nxt:
                s, i = (int(x) for x in nxt.split(":"))
                message = round_for(rounds, s, i)[0]
                finish = "tool_calls"
            else:
                message, finish = {"role": "assistant", "content": "A short summary of the work so far."}, "stop"
            pt = _prompt_tokens(msgs or [], req.get("tools"))
            reply = json.dumps({
                "id": "chatcmpl-agent", "object": "chat.completion", "created": 1700000000,
                "model": req.get("model", AGENT_MODEL),
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": pt, "completion_tokens": 50, "total_tokens": pt + 50},
            }).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(reply) + reply)
            await writer.drain()
    finally:
        writer.close()


def _upstream_main(port: int, stats_path: str, ready) -> None:
    _, rounds = load_pool()
    stats = {"requests": 0, "invalid": 0, "examples": []}

    async def main():
        server = await asyncio.start_server(lambda r, w: _upstream_conn(r, w, rounds, stats), "127.0.0.1", port, backlog=4096)
        ready.set()
        while True:
            await asyncio.sleep(0.2)
            # whole or not at all: a reader must never see the file truncated mid-write (a busy machine does)
            Path(stats_path + ".tmp").write_text(json.dumps(stats))
            os.replace(stats_path + ".tmp", stats_path)

    asyncio.run(main())


class AgentUpstream:
    """The fake agent upstream in a process of its own; `stats()` reads what it counted."""

    def __init__(self, work: Path):
        self.port = free_port()
        self.stats_path = work / f"agent-upstream-{self.port}.json"
        ready = multiprocessing.get_context("fork").Event()
        self.proc = multiprocessing.get_context("fork").Process(target=_upstream_main, args=(self.port, str(self.stats_path), ready), daemon=True)
        self.proc.start()
        if not ready.wait(30):
            raise HarnessError("the agent upstream did not start")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict:
        time.sleep(0.5)
        return json.loads(self.stats_path.read_text())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.join(5)


# --- the agents --------------------------------------------------------------------------------------------------


class Conn:
    """One keep-alive HTTP/1.1 connection posting JSON."""

    def __init__(self, url: str):
        u = urlsplit(url)
        self.host, self.port, self.path, self.netloc = u.hostname, u.port, u.path, u.netloc
        self.reader = self.writer = None

    async def post(self, body: bytes, headers: dict) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.writer.write((f"POST {self.path} HTTP/1.1\r\nHost: {self.netloc}\r\nContent-Type: application/json\r\n"
                           f"Authorization: {AUTH}\r\n{extra}Content-Length: {len(body)}\r\n\r\n").encode() + body)
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        h = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
        if h.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                data += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
        else:
            data = await self.reader.readexactly(int(h.get("content-length", "0")))
        if h.get("connection", "").lower() == "close":
            self.close()
        return status, data

    def close(self) -> None:
        if self.writer:
            self.writer.close()
            self.writer = None


async def _agent(url, session, run_tag, openings, rounds, target_chars, step_chars, tools, think, lat, errors):
    conn = Conn(url + "/chat/completions")
    rng = random.Random(session)
    await asyncio.sleep(rng.uniform(0, think))  # agents start spread over one think time
    msgs = [json.dumps(m) for m in openings[session % len(openings)]]
    chars, index = sum(len(m) for m in msgs), 0
    head = json.dumps({"model": AGENT_MODEL, "tools": tools})[:-1] + ', "messages": ['
    try:
        while chars < target_chars:
            added = 0
            while added < step_chars:
                for m in round_for(rounds, session, index):
                    s = json.dumps(m)
                    msgs.append(s)
                    added += len(s)
                index += 1
            chars += added
            # The reply is the assistant message that opens the next round: the history stays the agent's own.
            body = (head + ",".join(msgs) + "]}").encode()
            t0 = time.perf_counter()
            status, data = await conn.post(body, {"x-session-id": f"bench-{run_tag}-{session}", "x-bench-next": f"{session}:{index}"})
            lat.append(time.perf_counter() - t0)
            if status != 200:
                errors.append(f"session {session}: {status} {data[:200]!r}")
                return
            # The next request starts with that reply (round `index`'s assistant message); its results follow,
            # after the agent's think time (its tools running, in a real agent).
            if think:
                await asyncio.sleep(think * rng.uniform(0.5, 1.5))
    finally:
        conn.close()


def agents(url: str, sessions: int, target_tokens: int, step_tokens: int, run_tag: str, think: float = 0.0) -> dict:
    """`sessions` agents at once, each growing its conversation by ~`step_tokens` of tool rounds per request up to
    ~`target_tokens` (characters / 4), one request in flight per agent, waiting `think` seconds (±50 %, seeded per
    session) between an answer and its next request; req/s is over the whole run, think times included."""
    openings, rounds = load_pool()
    tools = [{"type": "function", "function": {"name": "execute_bash", "description": "Run a shell command.",
              "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
    lat: list[float] = []
    errors: list[str] = []

    async def run():
        await asyncio.gather(*(
            _agent(url, s, run_tag, openings, rounds, target_tokens * 4, step_tokens * 4, tools, think, lat, errors)
            for s in range(sessions)
        ))

    t0 = time.monotonic()
    asyncio.run(run())
    wall = time.monotonic() - t0
    if errors:
        raise HarnessError(f"{url}: {len(errors)} agent requests failed, e.g. {errors[:3]}")
    return {
        "requests": len(lat),
        "rps": len(lat) / wall,
        "p50_ms": percentile(lat, 50) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "wall_s": wall,
    }


def fill_sessions(url: str, count: int, concurrency: int, run_tag: str) -> float:
    """`count` distinct small sessions (a system prompt, a question, an answer, a follow-up), `concurrency` at a
    time; returns the seconds it took."""
    lock_free: list[int] = list(range(count))
    errors: list[str] = []

    async def worker():
        conn = Conn(url + "/chat/completions")
        try:
            while lock_free:
                i = lock_free.pop()
                body = json.dumps({"model": "gpt-4o-mini", "messages": [
                    {"role": "system", "content": f"You are assistant number {i} of the benchmark."},
                    {"role": "user", "content": f"Session {i}: what is {i} times {i + 7}? Explain the steps."},
                    {"role": "assistant", "content": f"{i} times {i + 7} is {i * (i + 7)}: multiply, then add."},
                    {"role": "user", "content": "Thanks. And the same for the next number, please."}]}).encode()
                status, data = await conn.post(body, {"x-session-id": f"fill-{run_tag}-{i}"})
                if status != 200:
                    errors.append(f"{status} {data[:200]!r}")
                    return
        finally:
            conn.close()

    async def run():
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), 900)

    t0 = time.monotonic()
    asyncio.run(run())
    if errors:
        raise HarnessError(f"{url}: filling sessions failed: {errors[:3]}")
    return time.monotonic() - t0
