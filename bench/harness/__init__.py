"""The harness's main: build, start the fake upstream and the contenders, run the four scenarios with contenders
alternated round by round, measure CPU and instructions per request, write bench/results/<timestamp>.{json,md}."""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from . import agents as ag
from . import contenders as ct
from . import load, procs, report, soak, traffic
from .measure import callgrind_per_request, cpu_per_request

ROOT = Path(__file__).resolve().parents[2]
LITELLM_REQ = ROOT / "bench/litellm-requirements.txt"


class Mode:
    def __init__(self, smoke: bool):
        self.smoke = smoke
        self.rounds = 1 if smoke else 3
        self.seconds = None if smoke else 5.0  # hey: a duration per run (full), else a request count
        self.requests = 200  # per hey run in smoke mode
        self.concurrency = [1, 8] if smoke else [1, 32, 128]
        self.passthrough_c = 8 if smoke else 32
        self.stream_requests = 20 if smoke else 500  # per contender per round
        self.cpu_requests = 300 if smoke else 20000
        self.agent_sessions, self.agent_tokens, self.agent_step = (4, 20000, 2000) if smoke else (200, 100000, 5000)
        self.agent_window = 16000 if smoke else ag.AGENT_WINDOW
        self.agent_think = 0.05 if smoke else 2.0  # seconds between an answer and the agent's next request (±50 %)
        self.fill = 200 if smoke else 10000
        self.spike_seconds = 1.0 if smoke else 5.0


def log(msg: str) -> None:
    print(f"[bench {datetime.now(timezone.utc):%H:%M:%S}] {msg}", flush=True)


def build(smoke: bool) -> Path:
    if smoke:  # the debug build `cargo test` has just made (a no-op then), never a stale release binary
        subprocess.run(["cargo", "build", "-q", "--bin", "ctxgate"], cwd=ROOT, check=True)
        return ROOT / "target/debug/ctxgate"
    log("cargo build --release --bin ctxgate")
    subprocess.run(["cargo", "build", "--release", "--bin", "ctxgate"], cwd=ROOT, check=True)
    return ROOT / "target/release/ctxgate"


def litellm_venv() -> Path:
    venv = ROOT / "target/bench-venv"
    if not (venv / "bin/litellm").exists():
        log("creating target/bench-venv with " + LITELLM_REQ.read_text().strip().splitlines()[-1])
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin/pip"), "install", "-q", "-r", str(LITELLM_REQ)], check=True)
    return venv


def validator_self_check() -> None:
    """Scenario 3's "0 invalid" means something only if the upstream's check rejects broken sequences."""
    openings, rounds = ag.load_pool()
    ok = openings[0] + ag.round_for(rounds, 0, 0) + ag.round_for(rounds, 0, 1)
    n = len(openings[0])
    broken = [ok[:-1], ok[:n] + ok[n + 1 :], ok[:n] + ok[n:][::-1], ok + [{"role": "assistant", "content": "x"}]]
    if ag.check_messages(ok) is not None or any(ag.check_messages(b) is None for b in broken):
        raise SystemExit("bench/run: the request validator of scenario 3 is broken")


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def scenario1(mode: Mode, cs: list[ct.Contender], work: Path) -> dict:
    """Small chat at each concurrency, contenders alternated round by round; medians of the rounds."""
    body = work / "chat.json"
    body.write_text(json.dumps(ct.CHAT_BODY))
    out = {}
    for c in mode.concurrency:
        runs: dict[str, list[dict]] = {x.name: [] for x in cs}
        for r in range(mode.rounds):
            for x in cs:
                gen = load.sequential if c == 1 else functools.partial(load.hey, concurrency=c, tolerate=x.name == "litellm")
                res = gen(x.base + "/chat/completions", body, seconds=mode.seconds, requests=None if mode.seconds else mode.requests)
                runs[x.name].append(res)
                log(f"s1 c={c} round {r + 1} {x.name}: {res['rps']:.0f} req/s p50 {res['p50_ms']:.2f} p99 {res['p99_ms']:.2f} ms")
        out[str(c)] = {
            name: {"rps": median_of(rs, "rps"), "p50_ms": median_of(rs, "p50_ms"), "p99_ms": median_of(rs, "p99_ms"),
                   "errors": sum(x.get("errors", 0) for x in rs), "rounds": rs}
            for name, rs in runs.items()
        }
        direct = out[str(c)].get("direct")
        for name, v in out[str(c)].items():
            v["added_p99_ms"] = v["p99_ms"] - direct["p99_ms"] if direct else None
    return out


def passthrough(mode: Mode, cs: list[ct.Contender], work: Path) -> dict:
    body = work / "embeddings.json"
    body.write_text(json.dumps(ct.EMBEDDINGS_BODY))
    runs: dict[str, list[dict]] = {x.name: [] for x in cs}
    c = mode.passthrough_c
    for r in range(mode.rounds):
        for x in cs:
            res = load.hey(x.base + "/embeddings", body, c, seconds=mode.seconds, requests=None if mode.seconds else mode.requests)
            runs[x.name].append(res)
            log(f"passthrough c={c} round {r + 1} {x.name}: {res['rps']:.0f} req/s p99 {res['p99_ms']:.2f} ms")
    return {"concurrency": c, **{n: {"rps": median_of(rs, "rps"), "p99_ms": median_of(rs, "p99_ms"), "rounds": rs} for n, rs in runs.items()}}


def scenario2(mode: Mode, cs: list[ct.Contender]) -> dict:
    samples: dict[str, dict] = {x.name: {"ttfb": [], "gaps": [], "events": None} for x in cs}
    for r in range(mode.rounds):
        for x in cs:
            body = {**ct.CHAT_BODY, "model": x.model_for_stream, "stream": True, "stream_options": {"include_usage": True}}
            res = load.stream(x.sse_base + "/chat/completions", body, mode.stream_requests)
            s = samples[x.name]
            s["ttfb"] += res["_ttfb"]
            s["gaps"] += res["_gaps"]
            s["events"] = res["events_per_stream"]
            log(f"s2 round {r + 1} {x.name}: ttfb p50 {res['ttfb_p50_ms']:.3f} p99 {res['ttfb_p99_ms']:.3f} ms, gap p99 {res['gap_p99_ms']:.3f} ms")
    out = {}
    for name, s in samples.items():
        out[name] = {
            "requests": len(s["ttfb"]),
            "events_per_stream": s["events"],
            "ttfb_p50_ms": load.percentile(s["ttfb"], 50),
            "ttfb_p99_ms": load.percentile(s["ttfb"], 99),
            "gap_p50_ms": load.percentile(s["gaps"], 50),
            "gap_p99_ms": load.percentile(s["gaps"], 99),
        }
    d = out.get("direct")
    for v in out.values():
        v["added_ttfb_p50_ms"] = v["ttfb_p50_ms"] - d["ttfb_p50_ms"]
        v["added_ttfb_p99_ms"] = v["ttfb_p99_ms"] - d["ttfb_p99_ms"]
        v["added_gap_p99_ms"] = v["gap_p99_ms"] - d["gap_p99_ms"]
    return out


def agent_config(window: int) -> str:
    return f'\n[models."{ag.AGENT_MODEL}"]\ncontext_window = {window}\n'


def _agents_run(mode: Mode, up: ag.AgentUpstream, contender: str, url: str, think: float, tag: str, port: int | None, pid: int | None) -> dict:
    before = up.stats()
    res = ag.agents(url, mode.agent_sessions, mode.agent_tokens, mode.agent_step, tag, think)
    after = up.stats()
    res.update(contender=contender, think_s=think, upstream_requests=after["requests"] - before["requests"],
               invalid=after["invalid"] - before["invalid"], invalid_examples=after["examples"])
    if port:
        m = procs.metrics(f"http://127.0.0.1:{port}/metrics")
        res.update(
            rewrites=procs.metric_sum(m, "ctxgate_rewrites_total"),
            saved_tokens=procs.metric_sum(m, "ctxgate_saved_tokens_total"),
            store_errors=procs.metric_sum(m, "ctxgate_store_errors_total"),
            upstream_errors=procs.metric_sum(m, "ctxgate_upstream_errors_total"),
            token_estimate_ratio=procs.metric_sum(m, "ctxgate_token_estimate_ratio"),
            rss_mb=procs.status_kb(pid, "VmRSS") / 1024,
        )
    mode_s = f"think {think:.1f} s" if think else "closed loop"
    log(f"s3 {contender} ({mode_s}): {res['rps']:.1f} req/s p50 {res['p50_ms']:.1f} p99 {res['p99_ms']:.1f} ms, "
        f"rewrites {res.get('rewrites', '-')}, invalid {res['invalid']}")
    return res


def scenario3(mode: Mode, binary: Path, work: Path) -> dict:
    """Agents with a think time between turns (latency: what ctxgate adds per request), alternated direct/ctxgate;
    then once each without think time (capacity: req/s when the agents wait on nothing but the answers)."""
    up = ag.AgentUpstream(work)
    out: dict = {"sessions": mode.agent_sessions, "target_tokens": mode.agent_tokens, "step_tokens": mode.agent_step,
                 "context_window": mode.agent_window, "think_s": mode.agent_think, "runs": []}
    try:
        for r, think in [(r, mode.agent_think) for r in range(mode.rounds if mode.smoke else 2)] + [(9, 0.0)]:
            out["runs"].append(_agents_run(mode, up, "direct", up.base, think, f"d{r}", None, None))
            g = ct.start_ctxgate(binary, up.base, work, f"ctxgate-agents-{r}", extra=agent_config(mode.agent_window))
            try:
                out["runs"].append(_agents_run(mode, up, "ctxgate", g.base, think, f"g{r}", g.extra["port"], g.proc.pid))
            finally:
                g.stop()
    finally:
        up.stop()
    paced = [x for x in out["runs"] if x["think_s"]]
    d = [x for x in paced if x["contender"] == "direct"]
    g = [x for x in paced if x["contender"] == "ctxgate"]
    out["direct"] = {"rps": median_of(d, "rps"), "p50_ms": median_of(d, "p50_ms"), "p99_ms": median_of(d, "p99_ms")}
    out["ctxgate"] = {"rps": median_of(g, "rps"), "p50_ms": median_of(g, "p50_ms"), "p99_ms": median_of(g, "p99_ms"),
                      "rewrites": sum(x["rewrites"] for x in g)}
    out["ctxgate"]["added_p99_ms"] = out["ctxgate"]["p99_ms"] - out["direct"]["p99_ms"]
    out["ctxgate"]["added_p50_ms"] = out["ctxgate"]["p50_ms"] - out["direct"]["p50_ms"]
    out["ctxgate"]["invalid"] = sum(x["invalid"] for x in out["runs"] if x["contender"] == "ctxgate")
    out["capacity_rps"] = {x["contender"]: x["rps"] for x in out["runs"] if not x["think_s"]}
    if any(x["invalid"] for x in out["runs"]):
        bad = [x["invalid_examples"] for x in out["runs"] if x["invalid"]]
        raise procs.HarnessError(f"scenario 3: invalid requests reached the upstream: {bad[:1]}")
    return out


def scenario4(mode: Mode, binary: Path, up: ct.Upstream, work: Path) -> dict:
    g = ct.start_ctxgate(binary, up.json_base, work, "ctxgate-rss")
    try:
        time.sleep(2)
        pid = g.proc.pid
        idle = procs.status_kb(pid, "VmRSS")
        secs = ag.fill_sessions(g.base, mode.fill, 32, "rss")
        time.sleep(2)
        cold = procs.status_kb(pid, "VmRSS")
        openings, rounds = ag.load_pool()

        def conversation(opening: int, seed: int) -> list:
            msgs, i = list(openings[opening]), 0
            while len(json.dumps(msgs)) < 200_000:
                msgs += ag.round_for(rounds, seed, i)
                i += 1
            return msgs

        # The level a spike is judged against is that of a gateway that has already seen a large conversation:
        # the first one loads what stays for good (the tokenizer's tables, the pre-tokenizer's DFA), which is not
        # the spike's to give back. It is a different conversation from the spike's.
        warm = work / "warm.json"
        warm.write_text(json.dumps({"model": "gpt-4o", "messages": conversation(1, 88888)}))
        load.hey(g.base + "/chat/completions", warm, 1, requests=1)
        time.sleep(2)
        m = procs.metrics(f"http://127.0.0.1:{g.extra['port']}/metrics")
        filled = procs.status_kb(pid, "VmRSS")
        log(f"s4 idle {idle / 1024:.1f} MB, {mode.fill} sessions {cold / 1024:.1f} MB ({secs:.1f} s), "
            f"and one 200 kB conversation {filled / 1024:.1f} MB")
        chat = work / "chat.json"
        big = work / "big.json"
        big.write_text(json.dumps({"model": "gpt-4o", "messages": conversation(0, 99999)}))
        log("s4 spike: hey -c 256 small chats and -c 64 200 kB conversations at once")
        n = None if mode.seconds else mode.requests
        spike = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from harness import load; "
                                  "load.hey(sys.argv[2], __import__('pathlib').Path(sys.argv[3]), 64, seconds=float(sys.argv[4]) if sys.argv[4] != '0' else None, requests=int(sys.argv[5]))",
                                  str(ROOT / "bench"), g.base + "/chat/completions", str(big), str(mode.spike_seconds if mode.seconds else 0), str(n or 0)])
        load.hey(g.base + "/chat/completions", chat, 256, seconds=mode.spike_seconds if mode.seconds else None, requests=n and n * 2)
        if spike.wait(300) != 0:
            raise procs.HarnessError("scenario 4: the 200 kB spike failed")
        peak = procs.status_kb(pid, "VmHWM")
        time.sleep(5)
        after = procs.status_kb(pid, "VmRSS")
        log(f"s4 peak {peak / 1024:.1f} MB, 5 s after the spike {after / 1024:.1f} MB")
        return {"idle_mb": idle / 1024, "sessions": mode.fill, "sessions_cached": procs.metric_sum(m, "ctxgate_sessions_cached"),
                "cold_sessions_mb": cold / 1024, "with_sessions_mb": filled / 1024, "fill_seconds": secs, "peak_mb": peak / 1024, "after_spike_mb": after / 1024}
    finally:
        g.stop()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    p.add_argument("--smoke", action="store_true", help="seconds, tiny counts, no LiteLLM, no callgrind (CI)")
    p.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out")
    p.add_argument("--binary", type=Path, help="use this ctxgate binary instead of building one")
    p.add_argument("--only", default="1,2,3,4,5,6", help="scenarios to run, e.g. 1,4")
    p.add_argument("--baseline", type=Path, help="a results JSON to judge CPU per request against (default: the oldest in bench/results)")
    args = p.parse_args(argv)
    mode = Mode(args.smoke)
    if mode.smoke:
        # Without the shared traces (a CI machine may not have them) the smoke run uses a synthetic pool.
        os.environ["CTXGATE_BENCH_SMOKE"] = "1"
    log(f"traces: {ag.TRACES}" + ("" if any(ag.TRACES.glob("*.json")) else " (none: a synthetic pool, smoke only)"))
    validator_self_check()
    only = {int(x) for x in args.only.split(",")}
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    outdir = ROOT / ("target/bench-smoke" if mode.smoke else "bench/results")
    outdir.mkdir(parents=True, exist_ok=True)
    binary = args.binary.resolve() if args.binary else build(mode.smoke)
    venv = None if (mode.smoke or args.no_litellm) else litellm_venv()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    res: dict = {"meta": {"timestamp": stamp, "mode": "smoke" if mode.smoke else "full", "commit": commit, "binary": str(binary.relative_to(ROOT) if binary.is_relative_to(ROOT) else binary),
                          "nproc": os.cpu_count(), "load_average_start": procs.load_average(), "rounds": mode.rounds,
                          "litellm": LITELLM_REQ.read_text().strip().splitlines()[-1] if venv else None}}
    work = Path(tempfile.mkdtemp(prefix="ctxgate-bench-"))
    started: list[ct.Contender] = []
    up = None
    try:
        up = ct.start_upstream(work)
        cs = [ct.direct(up), ct.start_nginx_proxy(up, work)]
        started.append(cs[1])
        g, gs = ct.start_ctxgate_pair(binary, up, work, "main")
        started += [g, gs]
        cs.append(g)
        if venv:
            lit = ct.start_litellm(venv, up, work)
            started.append(lit)
            cs.append(lit)
        if 1 in only:
            res["s1"] = scenario1(mode, cs, work)
            res["passthrough"] = passthrough(mode, [c for c in cs if c.name != "litellm"], work)
            res["cpu"] = cpu_per_request(mode, cs, up, work)
            if not mode.smoke:
                res["instructions"] = callgrind_per_request(binary, up, work)
            res["meta"]["load_average_after_s1"] = procs.load_average()
        if 2 in only:
            sse_cs = [ct.direct(up), cs[1], gs] + [c for c in cs if c.name == "litellm"]
            res["s2"] = scenario2(mode, sse_cs)
            res["meta"]["load_average_after_s2"] = procs.load_average()
        if 5 in only:
            res["s5"] = traffic.scenario5(mode, cs, mode.rounds)
            if not mode.smoke:
                res["s5"]["instructions"] = traffic.callgrind(binary, up, work)
            res["meta"]["load_average_after_s5"] = procs.load_average()
        for c in started:
            c.stop()
        started = []
        if 3 in only:
            res["s3"] = scenario3(mode, binary, work)
            res["meta"]["load_average_after_s3"] = procs.load_average()
        if 4 in only:
            res["s4"] = scenario4(mode, binary, up, work)
        if 6 in only:
            res["s6"] = soak.scenario6(mode.smoke, binary, up, work)
        res["meta"]["load_average_end"] = procs.load_average()
    except procs.HarnessError as e:
        log(f"FAILED: {e}")
        return 1
    finally:
        for c in started:
            c.stop()
        if up:
            up.proc.stop()
        if os.environ.get("CTXGATE_BENCH_KEEP"):
            log(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    baseline = report.find_baseline(args.baseline, outdir if not mode.smoke else None, stamp)
    res["targets"] = report.targets(res, baseline)
    (outdir / f"{stamp}.json").write_text(json.dumps(res, indent=1))
    md = report.markdown(res) + (soak.markdown(res["s6"]) if "s6" in res else "")
    (outdir / f"{stamp}.md").write_text(md)
    print(md)
    log(f"results: {outdir / stamp}.json and .md")
    return 0
