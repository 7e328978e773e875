"""The README's tour, followed literally, so that the README cannot drift from what the gateway does.

The tour's commands are the README's fenced blocks marked `tour=<step>` (```` ```sh tour=start ````; GitHub shows
them as ordinary `sh`, `python`, `toml` blocks). They are run as a user runs them, one terminal session in a fresh
checkout, with three differences only:

- the checkout is a temporary folder holding the repository's `examples/`, and `target/release/ctxgate` there is
  the binary under test (`cargo build` in CI builds the debug one); the `cargo` the build step calls is a stand-in
  that accepts exactly the tour's build commands and does nothing else;
- the tour's ports (8787, 8788) are replaced by free ones, in the commands and in the examples' text alike; the
  gateway, which the tour leaves on its default 127.0.0.1:8787, is moved with `CTXGATE_SERVER__LISTEN`;
- `python3` is this suite's virtualenv, which has the `openai` package the tour asks to install.

Then the rewritten request is reached and checked where the tour says to look: the header the example script
prints, the gateway's log line, the turn's record in the admin API and the metrics. Every relative link of the
README and of docs/ is checked too, since the tour moved most of the README into docs/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx

from conftest import REPO, _binary

README = REPO / "README.md"
FENCE = re.compile(r"^```(\w+)((?: [\w=./-]+)*)\n(.*?)^```[ \t]*$", re.M | re.S)
STEPS = ["build", "start", "snippet", "config", "run", "output", "look"]
PORTS = {"8787": "gateway", "8788": "mock"}


def fenced_blocks(text: str) -> list[tuple[str, dict[str, str], str]]:
    """Every fenced block: its language, its `key=value` attributes, its text."""
    blocks = []
    for lang, attrs, body in FENCE.findall(text):
        pairs = dict(a.split("=", 1) for a in attrs.split() if "=" in a)
        blocks.append((lang, pairs, body))
    return blocks


def tour() -> dict[str, str]:
    """The README's tour blocks by step, checked to be all there, once each, in the tour's order."""
    found = [(attrs["tour"], body) for _, attrs, body in fenced_blocks(README.read_text()) if "tour" in attrs]
    names = [name for name, _ in found]
    assert names == STEPS, f"the README's tour blocks are {names}, expected {STEPS}"
    return dict(found)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(port: int, logs: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port} after the tour's start step:\n{logs.read_text(errors='replace')}")


def normalised(line: str) -> str:
    """A line with its numbers masked: the README shows the output's shape and stages, not exact token counts."""
    return re.sub(r"\d+", "N", line.rstrip())


def test_the_readme_tour_reaches_a_rewritten_request(tmp_path: Path):
    steps = tour()
    port = {"8787": free_port(), "8788": free_port()}

    def local(text: str) -> str:
        for tour_port, ours in port.items():
            text = text.replace(f"127.0.0.1:{tour_port}", f"127.0.0.1:{ours}")
        return text

    # A fresh checkout as far as the tour goes: examples/, and the binary where the build step says it lands.
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "examples", checkout / "examples")
    for f in (checkout / "examples").iterdir():
        f.write_text(local(f.read_text()))
    (checkout / "target/release").mkdir(parents=True)
    (checkout / "target/release/ctxgate").symlink_to(_binary().resolve())
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "cargo").write_text(
        '#!/bin/sh\ncase "$*" in "build --release"|"install --path .") exit 0;; esac\n'
        'echo "the tour ran cargo $*, which this test does not stand in for" >&2\nexit 1\n'
    )
    (shims / "cargo").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CTXGATE_"))}
    env.update(
        NO_COLOR="1",
        PATH=f"{shims}:{Path(sys.executable).parent}:{env['PATH']}",
        CTXGATE_SERVER__LISTEN=f"127.0.0.1:{port['8787']}",
    )

    def shell(step: str, **kw) -> subprocess.CompletedProcess | subprocess.Popen:
        """Runs a step in bash after the build step, as in one terminal session; `background` returns at once."""
        script = "set -euo pipefail\n" + local(steps["build"]) + local(steps[step])
        out = (tmp_path / f"{step}.log").open("wb")
        if kw.get("background"):
            return subprocess.Popen(["bash", "-c", script], cwd=checkout, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        return subprocess.run(["bash", "-c", script], cwd=checkout, env=env, capture_output=True, timeout=120)

    # The README's config is the file the gateway runs on.
    assert steps["config"] == (REPO / "examples/tour.toml").read_text()
    window = tomllib.loads(steps["config"])["models"]["gpt-4o-mini"]["context_window"]
    assert "examples/tour.toml" in steps["start"]

    # 1, 2: build (the stand-in), then the mock and the gateway in the background.
    started = shell("start", background=True)
    try:
        started.wait(timeout=30)
        assert started.returncode == 0, (tmp_path / "start.log").read_text(errors="replace")
        wait_until_up(port["8788"], tmp_path / "start.log")
        wait_until_up(port["8787"], tmp_path / "start.log")

        # 3: the Python snippet, with the SDK and no key in the environment.
        snippet = tmp_path / "snippet.py"
        snippet.write_text(local(steps["snippet"]))
        said = subprocess.run([sys.executable, str(snippet)], cwd=checkout, env=env, capture_output=True, timeout=60)
        assert said.returncode == 0, said.stderr.decode()
        promised = re.findall(r'^print\(.*# "(.*)"$', steps["snippet"], re.M)
        assert said.stdout.decode().splitlines() == promised, f"the snippet says it prints {promised}: {said.stdout!r}"

        # 5: the example agent, whose conversation outgrows the window.
        ran = shell("run")
        assert ran.returncode == 0, ran.stderr.decode()
        output = ran.stdout.decode().splitlines()
        shown = [line for line in steps["output"].splitlines() if line.strip() != "…"]
        missing = [line for line in shown if normalised(line) not in map(normalised, output)]
        assert not missing, f"the README shows {missing}, the script printed:\n" + "\n".join(output)
        headers = {int(m[1]): m[2] for m in (re.match(r"turn +(\d+): .*rewrite: (.*)", line) for line in output) if m}
        rewritten = sorted(turn for turn, h in headers.items() if h != "-")
        assert rewritten, "no request of the tour was rewritten:\n" + "\n".join(output)

        # 6: where to look. The turn the README points at is the first rewritten one, and its record says what the
        # header said.
        looked = shell("look")
        assert looked.returncode == 0, looked.stderr.decode()
        text = looked.stdout.decode()
        record, end = json.JSONDecoder().raw_decode(text)
        metrics = text[end:].strip().splitlines()
        (turn,) = record["turns"]
        # Turns are numbered from 1 in the admin API as in the script's output (`offset` counts the turns before).
        assert turn["turn"] == rewritten[0], f"the README looks at turn {turn['turn']}, first rewritten: {rewritten[0]}"
        assert turn["rewritten"] is True and turn["stages"], turn
        tokens = turn["tokens"]
        assert tokens["window"] == window
        assert tokens["sent"] < tokens["client"]
        assert headers[rewritten[0]] == f"{','.join(turn['stages'])}; tokens={tokens['client']}->{tokens['sent']}"
        kinds = {s.get("kind") for s in turn["sent_from"]}
        assert "cleared" in kinds, turn["sent_from"]
        assert len(turn["messages_sent"]) == len(turn["sent_from"])
        values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics}
        assert any(k.startswith("ctxgate_rewrites_total") and v > 0 for k, v in values.items()), metrics
        assert any(k.startswith("ctxgate_saved_tokens_total") and v > 0 for k, v in values.items()), metrics

        # The gateway's log line says it too, and the inspector the tour names is there.
        log = (tmp_path / "start.log").read_text(errors="replace")
        assert re.search(r'rewritten=true stages="[a-z,]+" tokens_client=\d+ tokens_sent=\d+', log), log
        ui = httpx.get(f"http://127.0.0.1:{port['8787']}/ui/", timeout=10, trust_env=False)
        assert ui.status_code == 200 and "<html" in ui.text.lower()
    finally:
        try:
            os.killpg(started.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def test_the_first_screen_commands_hold(tmp_path: Path):
    """The first screen promises `cargo run --release -- serve` on embedded defaults and `cargo test`: the first
    fenced block has both, and `ctxgate serve` with no config starts in an empty folder and proxies to OpenAI
    (only its listen address is moved off 8787 through the environment, so that the test needs no fixed port)."""
    text = README.read_text()
    first_block = fenced_blocks(text)[0][2]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["cargo run --release -- serve", "cargo test"], commands
    assert text.index(first_block) < text.index("\n## "), "the two commands are no longer on the first screen"

    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXGATE_")}
    env.update(NO_COLOR="1", CTXGATE_SERVER__LISTEN="127.0.0.1:0")
    log = tmp_path / "serve.log"
    proc = subprocess.Popen([str(_binary()), "serve"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=log.open("wb"))
    try:
        deadline = time.monotonic() + 20
        while not (m := re.search(r"listening listen=(\S+) upstream=(\S+)", log.read_text(errors="replace"))):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        assert m[2] == "https://api.openai.com/v1"
        r = httpx.get(f"http://{m[1]}/healthz", timeout=10, trust_env=False)
        assert r.status_code == 200 and r.text.strip() == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_of_the_readme_and_docs_resolves():
    """Files linked exist, and a `#anchor` names a heading of the file it points into."""
    pages = [README, REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", re.sub(r"^```.*?^```", "", file.read_text(), flags=re.M | re.S), re.M)
                if anchor not in {slug(h) for h in headings}:
                    broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
