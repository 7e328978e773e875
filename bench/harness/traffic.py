"""Scenario 5: real agent traffic. Every request of the shared traces (for each assistant message k of a trace, the
body an agent sends for it: `messages[:k]` with the trace's tools), sessions interleaved, replayed through each
contender in front of the fixed nginx upstream at c=1 and c=8: CPU per request and per MB of request body, added
p50/p99, and ctxgate's instructions per request under callgrind."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from . import contenders as ct
from . import procs
from .agents import TRACES
from .load import _body_pieces, _read_head, percentile
from .procs import HarnessError

MODEL = ct.MODEL  # gpt-4o-mini: its window (128k) is larger than any trace's, so no request is rewritten; LiteLLM serves it
SMOKE_STEPS = 4  # the smoke run sends each session's first steps only
CALLGRIND_ROUNDS = 1  # under callgrind: the whole replay once, at c=1 (441 requests with the shared traces)


def _synthetic_sessions() -> list[list[dict]]:
    """When there are no traces (a CI machine in smoke mode): four small tool-using conversations."""
    out = []
    for s in range(4):
        msgs = [{"role": "system", "content": f"You are agent {s}. " + "Follow the rules. " * 40},
                {"role": "user", "content": f"Fix issue {s} in the repository."}]
        for i in range(6):
            call = {"id": f"call_{s}_{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"cat file{i}.py"})}}
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": call["id"], "content": f"line {i}\n" * 200})
        msgs.append({"role": "assistant", "content": "Done."})
        out.append(msgs)
    return out


def load_sessions(traces: Path = TRACES) -> list[list[bytes]]:
    """Per trace, the bodies an agent sends, in order: for every assistant message k, `messages[:k]` (and the
    trace's tools), serialised as the OpenAI Python client does (compact separators are not what it sends:
    `json.dumps` defaults)."""
    files = sorted(traces.glob("*.json"))
    convs: list[tuple[list[dict], list | None]] = []
    if files:
        for f in files:
            d = json.loads(f.read_text())
            convs.append((d["messages"], d.get("tools") or None))
    elif os.environ.get("CTXGATE_BENCH_SMOKE") == "1":
        convs = [(m, None) for m in _synthetic_sessions()]
    else:
        raise HarnessError(f"no traces in {traces} (set CTXGATE_BENCH_TRACES)")
    sessions = []
    for msgs, tools in convs:
        bodies = []
        for k, m in enumerate(msgs):
            if m["role"] == "assistant" and k > 0:
                body: dict = {"model": MODEL, "messages": msgs[:k]}
                if tools:
                    body["tools"] = tools
                bodies.append(json.dumps(body).encode())
        if bodies:
            sessions.append(bodies)
    return sessions


def interleave(sessions: list[list[bytes]], lanes: int) -> list[list[tuple[int, bytes]]]:
    """The sessions dealt to `lanes` connections; each lane sends its sessions' steps round-robin (step 1 of each,
    then step 2 of each, …), so a session's next request goes only after its previous one was answered."""
    out: list[list[tuple[int, bytes]]] = [[] for _ in range(lanes)]
    for lane in range(lanes):
        mine = [(i, s) for i, s in enumerate(sessions) if i % lanes == lane]
        for step in range(max((len(s) for _, s in mine), default=0)):
            out[lane] += [(i, s[step]) for i, s in mine if step < len(s)]
    return out


async def _lane(url: str, auth: str, reqs: list[tuple[int, bytes]], lat: list[float]) -> None:
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    try:
        for _, raw in reqs:
            head = (f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                    f"Authorization: {auth}\r\nContent-Length: {len(raw)}\r\n\r\n").encode()
            t0 = time.perf_counter()
            writer.write(head + raw)
            status, headers = await _read_head(reader)
            async for _ in _body_pieces(reader, headers):
                pass
            lat.append(time.perf_counter() - t0)
            if status != 200:
                raise HarnessError(f"{url}: answered {status} to a trace request")
            if headers.get("connection", "").lower() == "close":
                writer.close()
                reader, writer = await asyncio.open_connection(u.hostname, u.port)
    finally:
        writer.close()


def replay(url: str, sessions: list[list[bytes]], concurrency: int, tag: str) -> dict:
    """Every request of every session once, over `concurrency` keep-alive connections. The credential is new for
    each replay (`tag`), so ctxgate sees new tenants and new sessions every time: nothing is a resend of an earlier
    replay."""
    lanes = interleave(sessions, concurrency)
    lat: list[float] = []
    auth = f"Bearer sk-bench-s5-{tag}"

    async def run():
        await asyncio.gather(*(_lane(url, auth, reqs, lat) for reqs in lanes if reqs))

    t0 = time.monotonic()
    asyncio.run(run())
    wall = time.monotonic() - t0
    n = len(lat)
    return {"requests": n, "rps": n / wall, "wall_s": wall, "p50_ms": percentile(lat, 50) * 1000,
            "p99_ms": percentile(lat, 99) * 1000, "mean_ms": sum(lat) / n * 1000}


def body_stats(sessions: list[list[bytes]]) -> dict:
    sizes = [len(b) for s in sessions for b in s]
    return {"sessions": len(sessions), "requests": len(sizes), "body_bytes": sum(sizes),
            "mean_body_kb": sum(sizes) / len(sizes) / 1000, "max_body_kb": max(sizes) / 1000}


def scenario5(mode, cs: list[ct.Contender], rounds: int) -> dict:
    """Each contender in turn, `rounds` times, at each concurrency; CPU of the contender's process tree over each
    replay. Medians of the rounds; added = the contender's percentile − direct's."""
    sessions = load_sessions()
    if mode.smoke:
        sessions = [s[:SMOKE_STEPS] for s in sessions]
    stats = body_stats(sessions)
    mb = stats["body_bytes"] / 1e6
    out: dict = {"traffic": stats, "model": MODEL}
    for c in (1, 8):
        runs: dict[str, list[dict]] = {x.name: [] for x in cs}
        for r in range(rounds):
            for x in cs:
                mine = x.pids()
                if x.name == "litellm" and c == 1 and r > 0:
                    continue  # ~10 ms a request: one round at c=1 is enough to place it
                a = procs.cpu_seconds(mine) if mine else 0.0
                res = replay(x.base + "/chat/completions", sessions, c, f"{x.name}-c{c}-r{r}-{time.time_ns()}")
                b = procs.cpu_seconds(mine) if mine else 0.0
                if mine:
                    res["cpu_us_per_request"] = (b - a) / res["requests"] * 1e6
                    res["cpu_us_per_mb"] = (b - a) / mb * 1e6
                runs[x.name].append(res)
                cpu = f", CPU {res['cpu_us_per_request']:.0f} µs/request" if mine else ""
                print(f"[bench] s5 c={c} round {r + 1} {x.name}: {res['rps']:.0f} req/s p50 {res['p50_ms']:.2f} "
                      f"p99 {res['p99_ms']:.2f} ms{cpu}", flush=True)
        cell = {}
        for name, rs in runs.items():
            med = {k: _median([x[k] for x in rs]) for k in ("rps", "p50_ms", "p99_ms", "mean_ms")}
            if "cpu_us_per_request" in rs[0]:
                med["cpu_us_per_request"] = _median([x["cpu_us_per_request"] for x in rs])
                med["cpu_us_per_mb"] = _median([x["cpu_us_per_mb"] for x in rs])
            cell[name] = {**med, "rounds": rs}
        d = cell.get("direct")
        for v in cell.values():
            v["added_p50_ms"] = v["p50_ms"] - d["p50_ms"] if d else None
            v["added_p99_ms"] = v["p99_ms"] - d["p99_ms"] if d else None
        out[str(c)] = cell
    return out


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def wait_tokenizer(pid: int, timeout: float = 600) -> None:
    """Until the `ctxgate-tokenizer` thread (the token tables, built at start: slow under valgrind) has ended, so
    that none of its work is counted as the requests'."""
    end = time.monotonic() + timeout
    time.sleep(1)
    while time.monotonic() < end:
        names = []
        for comm in glob.glob(f"/proc/{pid}/task/*/comm"):
            try:
                names.append(Path(comm).read_text().strip())
            except OSError:
                pass
        if not any(n.startswith("ctxgate-tokeni") for n in names):
            return
        time.sleep(0.5)
    raise HarnessError("the tokenizer's tables were not built in time under callgrind")


def callgrind(binary: Path, up: ct.Upstream, work: Path) -> dict:
    """ctxgate's instructions per trace request (all threads) under callgrind: the replay at c=1 with
    instrumentation on only around it (start-up and the tokenizer's tables not counted)."""
    if not shutil.which("valgrind"):
        return {"error": "valgrind missing (apt-get install -y valgrind)"}
    sessions = load_sessions()
    out_pat = work / "callgrind-s5.out.%p"
    g = ct.start_ctxgate(binary, up.json_base, work, "ctxgate-callgrind-s5",
                         argv_prefix=["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_pat}"])
    try:
        pid = str(g.proc.pid)
        wait_tokenizer(g.proc.pid)
        url = g.base + "/chat/completions"
        replay(url, [s[:1] for s in sessions], 1, f"warm-{time.time_ns()}")  # warm-up, uninstrumented
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
        n = 0
        for r in range(CALLGRIND_ROUNDS):
            n += replay(url, sessions, 1, f"cg-{r}-{time.time_ns()}")["requests"]
        time.sleep(1)  # the turn's store batches, written after the answer
        subprocess.run(["callgrind_control", "-d", "s5", pid], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
        time.sleep(1)
        files = sorted(glob.glob(str(work / f"callgrind-s5.out.{pid}.*")), key=lambda f: Path(f).stat().st_mtime)
        if not files:
            return {"error": "callgrind wrote no dump"}
        total = None
        for line in Path(files[-1]).read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
        if total is None:
            return {"error": "no totals in the callgrind dump"}
        mb = body_stats(sessions)["body_bytes"] * CALLGRIND_ROUNDS / 1e6
        if os.environ.get("CTXGATE_BENCH_KEEP"):
            shutil.copy(files[-1], work / "callgrind-s5.out")
        return {"requests": n, "instructions_per_request": total / n, "instructions_per_mb": total / mb,
                "dump": files[-1]}
    except subprocess.CalledProcessError as e:
        return {"error": f"callgrind_control failed: {e.stderr!r}"}
    finally:
        g.stop(timeout=120)


def _f(x, nd=2) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def markdown(s5: dict) -> list[str]:
    t = s5["traffic"]
    lines = ["", f"## Scenario 5: real agent traffic ({t['sessions']} trace sessions, {t['requests']} requests, "
             f"{t['body_bytes'] / 1e6:.1f} MB of bodies: mean {t['mean_body_kb']:.1f} kB, max {t['max_body_kb']:.1f} kB)", "",
             "| c | contender | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | CPU µs/request | CPU µs/MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in ("1", "8"):
        for name, v in s5.get(c, {}).items():
            lines.append(f"| {c} | {name} | {v['rps']:.0f} | {_f(v['p50_ms'])} | {_f(v['p99_ms'])} | {_f(v['added_p50_ms'])} | "
                         f"{_f(v['added_p99_ms'])} | {_f(v.get('cpu_us_per_request'), 1)} | {_f(v.get('cpu_us_per_mb'), 0)} |")
    ins = s5.get("instructions")
    if ins and "instructions_per_request" in ins:
        lines += ["", f"Instructions per trace request (ctxgate, all threads, {ins['requests']} requests at c=1 under callgrind): "
                  f"**{ins['instructions_per_request']:,.0f}** ({ins['instructions_per_mb'] / 1e6:,.1f}M per MB of request body)."]
    elif ins:
        lines += ["", f"Instructions per trace request: not measured ({ins['error']})."]
    return lines
