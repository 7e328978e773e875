"""Processes under test: starting and stopping them, waiting until they answer, their CPU time and memory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


class HarnessError(RuntimeError):
    """A contender or a tool failed: the run stops and says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A started process (its own process group), its log file, stopped by `stop`."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict | None = None, cwd: Path | None = None):
        self.name = name
        self.log = log
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("CTXGATE_")}
        full_env.update(env or {})
        self._log = open(log, "wb")
        self.popen = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=cwd, start_new_session=True
        )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.alive():
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait()
        self._log.close()


def wait_http(proc: Proc, url: str, timeout: float = 60.0, method: str = "GET") -> None:
    """Until `url` answers any HTTP status; fails when the process exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise HarnessError(f"{proc.name} exited during start-up:\n{proc.tail()}")
        try:
            req = urllib.request.Request(url, method=method)
            with urllib.request.urlopen(req, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise HarnessError(f"{proc.name} did not answer {url} within {timeout:.0f} s:\n{proc.tail()}")


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            kids.append(int(entry))
    return kids


def tree(pid: int) -> list[int]:
    """`pid` and all its descendants (nginx's workers, LiteLLM's uvicorn)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes (all their threads), in seconds, from /proc/<pid>/stat."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat(5))
    return ticks / CLK_TCK


def status_kb(pid: int, key: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise HarnessError(f"no {key} for pid {pid}")


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def metrics(url: str) -> dict[str, float]:
    """A Prometheus exposition as {series: value} (series with their labels, as printed)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def metric_sum(m: dict[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s series whose labels include `labels`."""
    total = 0.0
    for series, value in m.items():
        base = series.split("{", 1)[0]
        if base != name:
            continue
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += value
    return total
