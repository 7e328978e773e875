"""Load generators: `hey` for fixed bodies (scenario 1, the spike of scenario 4) and a streaming client that
times the first byte and the gaps between SSE events (scenario 2)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from .procs import HarnessError

AUTH = "Bearer sk-bench-0000000000000000"


def sequential(url: str, body: Path, *, seconds: float | None = None, requests: int | None = None) -> dict:
    """Requests one after another over one keep-alive connection (c=1), timed with perf_counter (µs resolution,
    where hey's CSV has 0.1 ms): the same figures as `hey`."""
    raw = body.read_bytes()
    lat: list[float] = []

    async def run():
        u = urlsplit(url)
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        head = (f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                f"Authorization: {AUTH}\r\nContent-Length: {len(raw)}\r\n\r\n").encode() + raw
        end = time.monotonic() + (seconds or 1e9)
        try:
            while time.monotonic() < end and (requests is None or len(lat) < requests):
                t0 = time.perf_counter()
                writer.write(head)
                status, headers = await _read_head(reader)
                async for _ in _body_pieces(reader, headers):
                    pass
                lat.append(time.perf_counter() - t0)
                if status != 200:
                    raise HarnessError(f"{url}: answered {status}")
        finally:
            writer.close()

    t0 = time.monotonic()
    asyncio.run(run())
    wall = time.monotonic() - t0
    n = len(lat)
    return {"requests": n, "rps": n / wall, "p50_ms": percentile(lat, 50) * 1000, "p99_ms": percentile(lat, 99) * 1000,
            "mean_ms": sum(lat) / n * 1000}


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile (`p` in 0..100) of `values`."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


def hey(url: str, body: Path, concurrency: int, *, seconds: float | None = None, requests: int | None = None,
        tolerate: bool = False) -> dict:
    """One `hey` run posting `body` for `seconds` or `requests` (rounded up to a multiple of `concurrency`);
    per-request latencies from its CSV output (0.1 ms resolution). Fails on any non-200 or missing answer, unless
    `tolerate` (a reference contender): then they are counted in `errors`."""
    exe = shutil.which("hey")
    if not exe:
        raise HarnessError("hey is missing: apt-get install -y hey")
    argv = [exe, "-c", str(concurrency), "-m", "POST", "-T", "application/json", "-H", f"Authorization: {AUTH}",
            "-D", str(body), "-o", "csv", "-t", "30"]
    if not seconds:  # hey sends n // c requests per worker: round up to a multiple of c
        requests = -(-requests // concurrency) * concurrency
    argv += ["-z", f"{seconds}s"] if seconds else ["-n", str(requests)]
    t0 = time.monotonic()
    out = subprocess.run(argv + [url], capture_output=True, text=True, timeout=(seconds or 60) + 120)
    wall = time.monotonic() - t0
    if out.returncode != 0:
        raise HarnessError(f"hey failed on {url}: {out.stderr[-2000:]}")
    lat, statuses, offsets = [], {}, []
    for row in csv.DictReader(io.StringIO(out.stdout)):
        lat.append(float(row["response-time"]))
        offsets.append(float(row["offset"]) + float(row["response-time"]))
        statuses[row["status-code"]] = statuses.get(row["status-code"], 0) + 1
    n = len(lat)
    if n == 0:
        raise HarnessError(f"no answer from {url} ({out.stderr[-500:]})")
    bad = n - statuses.get("200", 0)
    if bad and not tolerate:
        raise HarnessError(f"{url}: {bad} of {n} requests did not get 200 (statuses {statuses})")
    expected = requests or 0
    if requests and n < expected and not tolerate:
        raise HarnessError(f"{url}: {expected - n} of {expected} requests got no answer")
    span = max(offsets) if offsets else wall
    return {
        "requests": n,
        "rps": n / span if span > 0 else float("nan"),
        "p50_ms": percentile(lat, 50) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "mean_ms": sum(lat) / n * 1000,
        "errors": bad + max(0, expected - n),
    }


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def _body_pieces(reader: asyncio.StreamReader, headers: dict):
    """The body as it arrives: (monotonic ns, bytes) per read, de-chunked."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return
            left = size
            while left:
                data = await reader.read(left)
                if not data:
                    raise HarnessError("connection closed mid-chunk")
                yield time.perf_counter_ns(), data
                left -= len(data)
            await reader.readexactly(2)
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left:
            data = await reader.read(left)
            if not data:
                raise HarnessError("connection closed mid-body")
            yield time.perf_counter_ns(), data
            left -= len(data)
    else:
        while data := await reader.read(65536):
            yield time.perf_counter_ns(), data


async def _stream_worker(url: str, body: bytes, count: int, out: dict) -> None:
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    head = (f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
            f"Authorization: {AUTH}\r\nAccept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    try:
        for _ in range(count):
            t0 = time.perf_counter_ns()
            writer.write(head + body)
            await writer.drain()
            status, headers = await _read_head(reader)
            if status != 200:
                raise HarnessError(f"{url}: stream answered {status}")
            buf, events, first, last = b"", 0, None, None
            async for t, data in _body_pieces(reader, headers):
                buf += data
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    if not ev.strip().startswith(b"data:"):
                        continue
                    events += 1
                    if first is None:
                        first = t
                        out["ttfb"].append((t - t0) / 1e6)
                    else:
                        out["gaps"].append((t - last) / 1e6)
                    last = t
            if events < 2:
                raise HarnessError(f"{url}: stream had {events} events")
            out["events"].append(events)
            out["total"].append((last - t0) / 1e6)
            if headers.get("connection", "").lower() == "close":
                writer.close()
                reader, writer = await asyncio.open_connection(u.hostname, u.port)
    finally:
        writer.close()


def stream(url: str, body: dict, requests: int, concurrency: int = 1) -> dict:
    """`requests` streamed requests over `concurrency` keep-alive connections: TTFB (request sent → first SSE
    event) and the gaps between consecutive events, in ms."""
    raw = json.dumps(body).encode()
    out = {"ttfb": [], "gaps": [], "events": [], "total": []}

    async def run():
        per = [requests // concurrency + (1 if i < requests % concurrency else 0) for i in range(concurrency)]
        await asyncio.gather(*(_stream_worker(url, raw, n, out) for n in per if n))

    asyncio.run(run())
    return {
        "requests": len(out["ttfb"]),
        "events_per_stream": min(out["events"]),
        "ttfb_p50_ms": percentile(out["ttfb"], 50),
        "ttfb_p99_ms": percentile(out["ttfb"], 99),
        "gap_p50_ms": percentile(out["gaps"], 50),
        "gap_p99_ms": percentile(out["gaps"], 99),
        "stream_p99_ms": percentile(out["total"], 99),
        "_ttfb": out["ttfb"],
        "_gaps": out["gaps"],
    }
