"""Scenario 6, the memory soak of issue 31: mixed traffic for minutes against ctxgate in front of the fixed-body
upstream, its resident memory sampled all along, at the default `store.cache_max_bytes` and at 64 MiB.

Six keep-alive clients; 70 % of the requests are small chats spread over 20,000 session ids, 30 % are real agent
requests: a step of a shared trace (its messages up to a user or tool message), resent with one step more each
time, up to 100 KB; a conversation that outgrows 100 KB starts again under a new session id, so new history keeps
arriving and the cache keeps evicting. Reported: idle RSS, a sample every `sample_s`, the plateau (the highest sample
of the second half), its excess over idle as a multiple of `cache_max_bytes`, the growth between the middle and the
end, and the RSS after an idle minute; judged against plateau <= idle + 1.25 x cache_max_bytes + 32 MB and a growth
of at most 3 %."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

from . import agents as ag
from . import contenders as ct
from . import procs

MIB = 1024 * 1024
DEFAULT_CACHE = 256 * MIB  # store.cache_max_bytes's default
SMALL_SESSIONS = 20_000
AGENT_SHARE = 0.30
AGENT_MAX_BYTES = 100_000
CLIENTS = 6
# Conversations in flight at once: each grows one step per request it gets; with ~1/3 of ~1,000 req/s they turn
# over every few minutes, a few hundred MB of new history over a run, more than either cache holds.
AGENT_CONVERSATIONS = 400
# Targets of issue 31.
SLACK_MB = 32
FACTOR = 1.25
GROWTH_MAX = 0.03


def log(msg: str) -> None:
    print(f"[bench {datetime.now(timezone.utc):%H:%M:%S}] {msg}", flush=True)


def load_steps(traces: Path = ag.TRACES, limit: int = AGENT_MAX_BYTES) -> list[list[bytes]]:
    """Every shared trace as the request bodies an agent sends: one per step (the messages up to each user or tool
    message that an assistant message follows, and the last), each at most `limit` bytes, in order. Without traces
    (a smoke run on a machine without them) the synthetic pool of scenario 3 makes one conversation."""
    convs: list[dict] = []
    for f in sorted(traces.glob("*.json")):
        t = json.loads(f.read_text())
        if t.get("messages"):
            convs.append({"messages": t["messages"], "tools": t.get("tools") or None})
    if not convs:
        openings, rounds = ag.load_pool()
        msgs = list(openings[0])
        for i in range(len(rounds)):
            msgs += ag.round_for(rounds, 0, i)
        convs = [{"messages": msgs, "tools": None}]
    out = []
    for c in convs:
        msgs, steps = c["messages"], []
        cuts = [i for i, m in enumerate(msgs) if m.get("role") in ("user", "tool")
                and (i + 1 == len(msgs) or msgs[i + 1].get("role") == "assistant")]
        for i in cuts:
            body = {"model": ct.MODEL, "messages": msgs[: i + 1]}
            if c["tools"]:
                body["tools"] = c["tools"]
            b = json.dumps(body).encode()
            if len(b) > limit:
                break
            steps.append(b)
        if steps:
            out.append(steps)
    if not out:
        raise procs.HarnessError("scenario 6: no trace step fits in 100 KB")
    return out


def small_body(i: int) -> bytes:
    return json.dumps({"model": ct.MODEL, "max_tokens": 32, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"Session {i}: what is {i} times {i + 7}? Answer in one short sentence."},
    ]}).encode()


class Traffic:
    """The mixed traffic: shared state of the six clients."""

    def __init__(self, steps: list[list[bytes]], seed: int, tag: str):
        self.steps, self.rng, self.tag = steps, random.Random(seed), tag
        # conversation -> (trace, step, generation)
        self.convs = [[c % len(steps), 0, 0] for c in range(AGENT_CONVERSATIONS)]
        self.busy: set[int] = set()
        self.small = self.agent = self.agent_bytes = 0
        self.errors: list[str] = []

    def next(self) -> tuple[bytes, str, int | None]:
        if self.rng.random() >= AGENT_SHARE:
            i = self.rng.randrange(SMALL_SESSIONS)
            self.small += 1
            return small_body(i), f"soak-{self.tag}-small-{i}", None
        c = self.rng.randrange(len(self.convs))
        while c in self.busy:  # one request in flight per conversation, as an agent does
            c = (c + 1) % len(self.convs)
        self.busy.add(c)
        trace, step, gen = self.convs[c]
        if step >= len(self.steps[trace]):
            trace, step, gen = (trace + 1) % len(self.steps), 0, gen + 1
        self.convs[c] = [trace, step + 1, gen]
        body = self.steps[trace][step]
        self.agent += 1
        self.agent_bytes += len(body)
        return body, f"soak-{self.tag}-agent-{c}-{gen}", c

    async def client(self, url: str, until: float) -> None:
        conn = ag.Conn(url + "/chat/completions")
        try:
            while time.monotonic() < until and not self.errors:
                body, session, conv = self.next()
                try:
                    status, data = await conn.post(body, {"x-session-id": session})
                finally:
                    self.busy.discard(conv)
                if status != 200:
                    self.errors.append(f"{session}: {status} {data[:200]!r}")
        finally:
            conn.close()


async def _drive(traffic: Traffic, url: str, seconds: float, sample_s: float, sample) -> None:
    until = time.monotonic() + seconds
    clients = [asyncio.create_task(traffic.client(url, until)) for _ in range(CLIENTS)]
    t0 = time.monotonic()
    k = 1
    while not all(c.done() for c in clients):
        await asyncio.sleep(min(0.5, max(0.0, t0 + k * sample_s - time.monotonic())))
        if time.monotonic() >= t0 + k * sample_s and k * sample_s <= seconds + 1e-6:
            sample(time.monotonic() - t0)
            k += 1
    await asyncio.gather(*clients)


def _near(samples: list[dict], t: float) -> float:
    """Median RSS of the three samples nearest `t` (one sample is one instant of a sawtooth)."""
    near = sorted(samples, key=lambda s: abs(s["t_s"] - t))[:3]
    return statistics.median(s["rss_mb"] for s in near)


def run_one(binary: Path, up: ct.Upstream, work: Path, steps: list[list[bytes]], cache_bytes: int, seconds: float,
            sample_s: float, idle_s: float) -> dict:
    extra = "" if cache_bytes == DEFAULT_CACHE else f"cache_max_bytes = {cache_bytes}\n"
    g = ct.start_ctxgate(binary, up.json_base, work, f"ctxgate-soak-{cache_bytes // MIB}", extra=extra)
    try:
        pid, port = g.proc.pid, g.extra["port"]
        # Start-up builds the tokenizer's tables and then hands its scratch memory back: idle is the level after.
        time.sleep(3)
        idle = min(procs.status_kb(pid, "VmRSS") / 1024 for _ in range(5) if time.sleep(1) is None)
        samples: list[dict] = []
        traffic = Traffic(steps, cache_bytes, f"{cache_bytes // MIB}")

        def sample(t: float) -> None:
            m = procs.metrics(f"http://127.0.0.1:{port}/metrics")
            s = {"t_s": round(t, 1), "rss_mb": procs.status_kb(pid, "VmRSS") / 1024,
                 "cache_mb": procs.metric_sum(m, "ctxgate_session_cache_bytes") / MIB,
                 "sessions_cached": procs.metric_sum(m, "ctxgate_sessions_cached"),
                 "requests": traffic.small + traffic.agent}
            samples.append(s)
            log(f"s6 {cache_bytes // MIB} MiB t={t:5.0f} s rss {s['rss_mb']:6.1f} MB, cache {s['cache_mb']:6.1f} MiB "
                f"({s['sessions_cached']:.0f} sessions), {s['requests']} requests")

        log(f"s6 cache_max_bytes {cache_bytes // MIB} MiB: idle {idle:.1f} MB; {seconds:.0f} s of mixed traffic")
        t0 = time.monotonic()
        asyncio.run(_drive(traffic, g.base, seconds, sample_s, sample))
        wall = time.monotonic() - t0
        if traffic.errors:
            raise procs.HarnessError(f"scenario 6: requests failed, e.g. {traffic.errors[:3]}")
        if not samples:
            raise procs.HarnessError("scenario 6: no RSS sample taken")
        time.sleep(idle_s)
        after_idle = procs.status_kb(pid, "VmRSS") / 1024
        peak = procs.status_kb(pid, "VmHWM") / 1024
    finally:
        g.stop()
    second_half = [s for s in samples if s["t_s"] >= seconds / 2] or samples[-1:]
    plateau = max(s["rss_mb"] for s in second_half)
    mid, end = _near(samples, seconds / 2), _near(samples, seconds)
    budget_mb = cache_bytes / MIB * 1.048576  # MiB -> MB
    limit = idle + FACTOR * budget_mb + SLACK_MB
    res = {
        "cache_max_bytes": cache_bytes, "seconds": seconds, "wall_s": wall, "requests": traffic.small + traffic.agent,
        "small_requests": traffic.small, "agent_requests": traffic.agent, "agent_mb_sent": traffic.agent_bytes / 1e6,
        "rps": (traffic.small + traffic.agent) / wall, "idle_mb": idle, "samples": samples, "plateau_mb": plateau,
        "peak_mb": peak, "above_idle_per_budget": (plateau - idle) / budget_mb, "limit_mb": limit,
        "mid_mb": mid, "end_mb": end, "growth": (end - mid) / mid, "after_idle_minute_mb": after_idle,
        "idle_after_s": idle_s,
    }
    res["plateau_ok"] = plateau <= limit
    res["growth_ok"] = res["growth"] <= GROWTH_MAX
    log(f"s6 {cache_bytes // MIB} MiB: {res['requests']} requests ({res['rps']:.0f}/s), plateau {plateau:.1f} MB "
        f"(limit {limit:.1f}), {res['above_idle_per_budget']:.2f}x the budget above idle, growth {res['growth'] * 100:+.1f} %, "
        f"after {idle_s:.0f} s idle {after_idle:.1f} MB")
    return res


def scenario6(smoke: bool, binary: Path, up: ct.Upstream, work: Path) -> dict:
    """The soak at 64 MiB and at the default (smoke: 64 MiB only, seconds, checked for errors only)."""
    steps = load_steps()
    if smoke:
        runs = [run_one(binary, up, work, steps, 64 * MIB, seconds=8.0, sample_s=2.0, idle_s=2.0)]
    else:
        runs = [run_one(binary, up, work, steps, c, seconds=600.0, sample_s=10.0, idle_s=60.0) for c in (DEFAULT_CACHE, 64 * MIB)]
    return {"traces": len(steps), "trace_steps": sum(len(s) for s in steps), "runs": runs}


def markdown(s6: dict) -> str:
    rows = ["", "## Scenario 6: memory soak (mixed traffic, RSS)", "",
            "| `cache_max_bytes` | requests | idle | RSS at half time | plateau | limit (idle + 1.25 × cache + 32 MB) | "
            "above idle / cache | growth half→end | after the idle wait |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in s6["runs"]:
        ok = lambda b: "" if b else " **(over)**"  # noqa: E731
        rows.append(f"| {r['cache_max_bytes'] // MIB} MiB | {r['requests']} | {r['idle_mb']:.0f} MB | {r['mid_mb']:.0f} MB | "
                    f"{r['plateau_mb']:.0f} MB{ok(r['plateau_ok'])} | {r['limit_mb']:.0f} MB | "
                    f"{r['above_idle_per_budget']:.2f}× | {r['growth'] * 100:+.1f} %{ok(r['growth_ok'])} | "
                    f"{r['after_idle_minute_mb']:.0f} MB |")
    return "\n".join(rows) + "\n"
