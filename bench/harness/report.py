"""The issue's targets judged on one run's results, and the Markdown summary (the tables of docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path


def find_baseline(given: Path | None, results_dir: Path | None, stamp: str) -> dict | None:
    """The results CPU per request is judged against: `given`, else the oldest full run in `results_dir`."""
    if given:
        return json.loads(given.read_text())
    if results_dir is None:
        return None
    for f in sorted(results_dir.glob("*.json")):
        if f.stem != stamp:
            data = json.loads(f.read_text())
            if data.get("meta", {}).get("mode") == "full" and "cpu" in data:
                return data
    return None


def _t(name: str, figure: str, target: str, met: bool | None, note: str = "") -> dict:
    return {"target": name, "figure": figure, "wanted": target, "met": met, "note": note}


def targets(r: dict, baseline: dict | None) -> list[dict]:
    out = []
    s1 = r.get("s1", {})
    ck = "32" if "32" in s1 else str(max((int(k) for k in s1), default=0))
    c32 = s1.get(ck)
    if c32 and "nginx" in c32:
        ratio = c32["ctxgate"]["rps"] / c32["nginx"]["rps"]
        out.append(_t(f"s1: ctxgate req/s ÷ nginx, c={ck}, default config", f"{ratio:.2f}×", "≥ 0.6×", ratio >= 0.6))
    pt = r.get("passthrough")
    if pt and "nginx" in pt:
        ratio = pt["ctxgate"]["rps"] / pt["nginx"]["rps"]
        out.append(_t(f"s1: passthrough (/v1/embeddings) req/s ÷ nginx, c={pt['concurrency']}", f"{ratio:.2f}×", "≥ 0.8×", ratio >= 0.8))
    if "1" in s1:
        added = s1["1"]["ctxgate"]["added_p99_ms"]
        out.append(_t("s1: added p99 at c=1", f"{added:.3f} ms", "≤ 0.5 ms", added <= 0.5))
    cpu = r.get("cpu", {}).get("ctxgate", {}).get("cpu_us_per_request")
    if cpu is not None:
        base = (baseline or {}).get("cpu", {}).get("ctxgate", {}).get("cpu_us_per_request")
        if base:
            cut = base / cpu
            out.append(_t("s1: CPU per small chat, cut from the baseline", f"{cpu:.1f} µs ({cut:.2f}× less than {base:.1f} µs, run {baseline['meta']['timestamp']})", "≥ 3× less", cut >= 3))
        else:
            out.append(_t("s1: CPU per small chat, cut from the baseline", f"{cpu:.1f} µs", "≥ 3× less than today's", None, "this run is the baseline"))
    lit = r.get("cpu", {}).get("litellm", {}).get("cpu_us_per_request")
    if cpu and lit:
        ratio = lit / cpu
        out.append(_t("LiteLLM: ctxgate throughput per core ÷ LiteLLM's (CPU per request)", f"{ratio:.0f}×", "≥ 20×", ratio >= 20))
    s2 = r.get("s2", {})
    if "ctxgate" in s2:
        added = s2["ctxgate"]["added_ttfb_p99_ms"]
        out.append(_t("s2: added TTFB p99 (20-chunk stream)", f"{added:.3f} ms", "≤ 0.3 ms", added <= 0.3))
    s3 = r.get("s3")
    if s3:
        g = s3["ctxgate"]
        out.append(_t(f"s3: added p99, agents with rewriting active (think {s3['think_s']} s)", f"{g['added_p99_ms']:.1f} ms ({g['rewrites']:.0f} rewrites)", "≤ 5 ms", g["added_p99_ms"] <= 5 and g["rewrites"] > 0))
        out.append(_t("s3: invalid requests reaching the upstream", str(g["invalid"]), "0", g["invalid"] == 0))
    s4 = r.get("s4")
    if s4:
        out.append(_t(f"s4: RSS with {s4['sessions']} cached sessions", f"{s4['with_sessions_mb']:.1f} MB", "≤ 150 MB", s4["with_sessions_mb"] <= 150))
        ratio = s4["after_spike_mb"] / s4["with_sessions_mb"]
        out.append(_t("s4: RSS 5 s after a spike ÷ before it", f"{ratio:.2f} ({s4['after_spike_mb']:.1f} MB)", "≤ 1.2", ratio <= 1.2))
    return out


def _f(x, nd=2) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def markdown(r: dict) -> str:
    m = r["meta"]
    lines = [f"# Benchmark run {m['timestamp']} ({m['mode']})", "",
             f"Commit `{m['commit']}`, binary `{m['binary']}`, {m['nproc']} cores, {m['rounds']} alternated round(s) per cell "
             f"(medians shown). Load average at start {m['load_average_start']}, at end {m.get('load_average_end')}."]
    if m["mode"] == "smoke":
        lines.append("Smoke run (tiny counts, one round): it proves every contender answers; its figures are not judged.")
    if m.get("litellm"):
        lines.append(f"LiteLLM: `{m['litellm']}`.")
    if "s1" in r:
        lines += ["", "## Scenario 1: small chat (`hey`, fixed-JSON nginx upstream)", "",
                  "| c | contender | req/s | ÷ nginx | p50 ms | p99 ms | added p99 ms |", "|---|---|---|---|---|---|---|"]
        for c, row in r["s1"].items():
            ng = row.get("nginx", {}).get("rps")
            for name, v in row.items():
                err = f" ({v['errors']} errors)" if v.get("errors") else ""
                lines.append(f"| {c} | {name} | {v['rps']:.0f}{err} | {_f(v['rps'] / ng if ng else None)} | {_f(v['p50_ms'])} | {_f(v['p99_ms'])} | {_f(v['added_p99_ms'])} |")
        pt = r["passthrough"]
        lines += ["", f"Passthrough route `/v1/embeddings`, c={pt['concurrency']}:", "", "| contender | req/s | ÷ nginx | p99 ms |", "|---|---|---|---|"]
        for name, v in pt.items():
            if isinstance(v, dict):
                lines.append(f"| {name} | {v['rps']:.0f} | {_f(v['rps'] / pt['nginx']['rps'])} | {_f(v['p99_ms'])} |")
        lines += ["", "CPU per request (c=32, whole process tree, from /proc/<pid>/stat):", "",
                  "| contender | requests | CPU µs/request | upstream CPU µs/request |", "|---|---|---|---|"]
        for name, v in r["cpu"].items():
            lines.append(f"| {name} | {v['requests']} | {_f(v['cpu_us_per_request'], 1)} | {_f(v['upstream_cpu_us_per_request'], 1)} |")
        ins = r.get("instructions")
        if ins:
            if "instructions_per_request" in ins:
                lines += ["", f"Instructions per small chat request (ctxgate, all threads, {ins['requests']} requests at c=4 under callgrind): "
                          f"**{ins['instructions_per_request']:,.0f}** ({ins['method']})."]
                if "passthrough_instructions_per_request" in ins:
                    lines += ["", f"Instructions per passthrough request (`/v1/embeddings`, the same way): "
                              f"**{ins['passthrough_instructions_per_request']:,.0f}**."]
            else:
                lines += ["", f"Instructions per request: not measured ({ins['error']})."]
    if "s2" in r:
        lines += ["", "## Scenario 2: streaming, 20 chunks (fixed SSE body, c=1, keep-alive)", "",
                  "| contender | streams | TTFB p50 ms | TTFB p99 ms | added TTFB p99 ms | gap p50 ms | gap p99 ms |", "|---|---|---|---|---|---|---|"]
        for name, v in r["s2"].items():
            lines.append(f"| {name} | {v['requests']} | {_f(v['ttfb_p50_ms'], 3)} | {_f(v['ttfb_p99_ms'], 3)} | {_f(v['added_ttfb_p99_ms'], 3)} | {_f(v['gap_p50_ms'], 3)} | {_f(v['gap_p99_ms'], 3)} |")
    if "s3" in r:
        s3 = r["s3"]
        lines += ["", f"## Scenario 3: {s3['sessions']} agent sessions growing to ~{s3['target_tokens'] // 1000}k tokens "
                  f"(~{s3['step_tokens'] // 1000}k per request, window {s3['context_window']})", "",
                  "| run | contender | think s | requests | req/s | p50 ms | p99 ms | rewrites | invalid | RSS MB |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for i, v in enumerate(s3["runs"]):
            run = "capacity" if not v["think_s"] else str(i // 2 + 1)
            lines.append(f"| {run} | {v['contender']} | {v['think_s']:g} | {v['requests']} | {v['rps']:.1f} | {_f(v['p50_ms'], 1)} | "
                         f"{_f(v['p99_ms'], 1)} | {v.get('rewrites', '–')} | {v['invalid']} | {_f(v.get('rss_mb'), 1)} |")
        g = s3["ctxgate"]
        cap = s3.get("capacity_rps", {})
        lines += ["", f"With think time (medians): added p50 {_f(g['added_p50_ms'], 1)} ms, added p99 {_f(g['added_p99_ms'], 1)} ms. "
                  f"Capacity (no think time): ctxgate {_f(cap.get('ctxgate'), 1)} req/s, direct {_f(cap.get('direct'), 1)} req/s "
                  "(direct is bounded by the single-process Python fake upstream)."]
    if "s4" in r:
        s4 = r["s4"]
        lines += ["", "## Scenario 4: memory (VmRSS of ctxgate)", "", "| state | MB |", "|---|---|",
                  f"| idle after start | {s4['idle_mb']:.1f} |"] + ([f"| {s4['sessions']} small sessions, before any large conversation | {s4['cold_sessions_mb']:.1f} |"] if "cold_sessions_mb" in s4 else []) + [
                  f"| {s4['sessions']} sessions cached ({s4['sessions_cached']:.0f} in the gauge), and one 200 kB conversation seen: the level before the spike | {s4['with_sessions_mb']:.1f} |",
                  f"| peak during the spike (VmHWM) | {s4['peak_mb']:.1f} |", f"| 5 s after the spike | {s4['after_spike_mb']:.1f} |"]
    if "s5" in r:
        from .traffic import markdown as s5_markdown
        lines += s5_markdown(r["s5"])
    lines += ["", "## Targets of issue 17", "", "| target | figure | wanted | met |", "|---|---|---|---|"]
    for t in r.get("targets", []):
        met = "–" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['target']} | {t['figure']} | {t['wanted']} | {met}{' (' + t['note'] + ')' if t['note'] else ''} |")
    return "\n".join(lines) + "\n"
