"""The noise-free figures of scenario 1: CPU time per request (utime + stime from /proc before and after a fixed
number of requests) and instructions per request (callgrind: `perf stat -e instructions` is used when the
machine exposes the counter, which a VM often does not)."""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import time
from pathlib import Path

from . import contenders as ct
from . import load, procs

CALLGRIND_REQUESTS = 500


def cpu_per_request(mode, cs: list[ct.Contender], up: ct.Upstream, work: Path) -> dict:
    """For each contender: `mode.cpu_requests` small chats at c=32; the contender's CPU microseconds per request
    (its whole process tree) and the upstream's, which is the same work for every contender."""
    body = work / "chat.json"
    out = {}
    for x in cs:
        n = mode.cpu_requests if x.name != "litellm" else max(200, mode.cpu_requests // 20)
        load.hey(x.base + "/chat/completions", body, 32, requests=min(n // 10, 1000))  # warm-up
        mine, theirs = x.pids(), up.proc and procs.tree(up.proc.pid)
        a, ua, t0 = procs.cpu_seconds(mine), procs.cpu_seconds(theirs), time.monotonic()
        load.hey(x.base + "/chat/completions", body, 32, requests=n)
        b, ub, wall = procs.cpu_seconds(mine), procs.cpu_seconds(theirs), time.monotonic() - t0
        out[x.name] = {
            "requests": n,
            "cpu_us_per_request": (b - a) / n * 1e6 if mine else None,
            "upstream_cpu_us_per_request": (ub - ua) / n * 1e6,
            "cores_busy": (b - a) / wall if mine else None,
        }
        cpu = out[x.name]["cpu_us_per_request"]
        procs_note = f"{cpu:.1f} µs/request" if cpu is not None else "no process of its own"
        print(f"[bench] cpu {x.name}: {procs_note} (upstream {out[x.name]['upstream_cpu_us_per_request']:.1f} µs)", flush=True)
    return out


def _perf_works() -> bool:
    if not shutil.which("perf"):
        return False
    r = subprocess.run(["perf", "stat", "-x,", "-e", "instructions", "--", "true"], capture_output=True, text=True)
    return r.returncode == 0 and "not supported" not in r.stderr and "<not" not in r.stderr


def _callgrind_window(pid: str, url: str, body: Path, work: Path, name: str) -> int | None:
    """Instructions of `CALLGRIND_REQUESTS` POSTs of `body` to `url` at c=4 (after an uninstrumented warm-up),
    from a dump named `name`; None when the dump has no totals."""
    load.hey(url, body, 4, requests=100)  # warm-up, uninstrumented
    subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
    load.hey(url, body, 4, requests=CALLGRIND_REQUESTS)
    subprocess.run(["callgrind_control", "-d", name, pid], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
    time.sleep(1)
    files = sorted(glob.glob(str(work / f"callgrind.out.{pid}.*")), key=lambda f: Path(f).stat().st_mtime)
    if not files:
        return None
    for line in Path(files[-1]).read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    return None


def callgrind_per_request(binary: Path, up: ct.Upstream, work: Path) -> dict:
    """Instructions ctxgate executes per small chat request (all threads), counted by callgrind over
    CALLGRIND_REQUESTS requests at c=4 after a warm-up, instrumentation on only around them; then the same for
    the passthrough route (`/v1/embeddings`, forwarded without session handling) in the same process."""
    if _perf_works():
        method = "perf stat -e instructions is available but not used: callgrind counts are exact and comparable"
    else:
        method = "perf stat -e instructions: not supported here; callgrind"
    if not shutil.which("valgrind"):
        return {"error": "valgrind missing (apt-get install -y valgrind)"}
    out_pat = work / "callgrind.out.%p"
    g = ct.start_ctxgate(
        binary, up.json_base, work, "ctxgate-callgrind",
        argv_prefix=["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_pat}"],
    )
    embeddings = work / "embeddings.json"
    embeddings.write_text(json.dumps(ct.EMBEDDINGS_BODY))
    try:
        from .traffic import wait_tokenizer

        wait_tokenizer(g.proc.pid)  # the token tables built at start are not the requests' work
        pid = str(g.proc.pid)
        total = _callgrind_window(pid, g.base + "/chat/completions", work / "chat.json", work, "chat")
        if total is None:
            return {"error": "no totals in the callgrind dump", "method": method}
        out = {"method": method, "requests": CALLGRIND_REQUESTS, "instructions_per_request": total / CALLGRIND_REQUESTS}
        pt = _callgrind_window(pid, g.base + "/embeddings", embeddings, work, "passthrough")
        if pt is not None:
            out["passthrough_instructions_per_request"] = pt / CALLGRIND_REQUESTS
        return out
    except subprocess.CalledProcessError as e:
        return {"error": f"callgrind_control failed: {e.stderr!r}", "method": method}
    finally:
        g.stop(timeout=60)
