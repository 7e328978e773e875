"""Gemini CLI itself (`@google/gemini-cli`, pinned in tests/clients/gemini and installed into target/clients-gemini)
run headless through ctxgate against the mock upstream: a `read_file` tool loop, and a long session of shell
commands that crosses the context threshold, so ctxgate rewrites its history, answers a recall call of the model
inside the stream, and the CLI goes on working without ever seeing ctxgate's tool.

The CLI runs with `GEMINI_CLI_HOME` in a temporary directory holding the settings docs/research/gemini.md gives
(API-key auth, no usage statistics, no auto-update), `GOOGLE_GEMINI_BASE_URL` pointing at ctxgate, a dummy key,
`--skip-trust`, `--yolo` and `-o stream-json`; `-m gemini-2.5-flash` removes its router's side call, and the
mock's scripted replies are kept for that model all the same."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from conftest import REPO, Upstream, _stop
from ctxtest import Gateway, Mock

MAIN = "gemini-2.5-flash"
KEY = "gemini-dummy-key"
PLACEHOLDER = "[ctxgate] Tool result cleared"
RECALL, SEARCH = "recall_tool_call", "search_history"
GEMINI = REPO / "target/clients-gemini/node_modules/@google/gemini-cli/bundle/gemini.js"
SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


@pytest.fixture(scope="module")
def gemini() -> Path:
    path = Path(os.environ.get("GEMINI_CLI_JS", GEMINI))
    if not path.is_file():
        message = f"no Gemini CLI at {path}: run tests/clients/run (or set GEMINI_CLI_JS)"
        if os.environ.get("CTXGATE_REQUIRE_EXTERNAL"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def gm_stack(upstream: Upstream):
    """A ctxgate for Gemini CLI: the main model's window is small (60,000 tokens; rewrite above 60 %, aim for
    40 %), so a few big command outputs cross the threshold while the CLI's system prompt and tools fit easily."""
    config = f"""
[context]
threshold = 0.6
target = 0.4
hard_limit = 0.95
[prune]
keep_tool_results = 2
[models."{MAIN}"]
context_window = 60000
"""
    proc, listen = upstream.gateway(config, name="gemini")
    try:
        yield Gateway(base_url=f"http://{listen}/v1", mock=Mock(upstream.mock_url.removesuffix("/v1")))
    finally:
        _stop(proc)


@pytest.fixture
def gm(gm_stack: Gateway) -> Gateway:
    gm_stack.mock.reset()
    return gm_stack


def g_text(text: str) -> dict:
    """A scripted Gemini answer saying `text`, kept for the main model."""
    return {"gemini": {"parts": text}, "model": MAIN}


def g_call(id: str, name: str, args: dict, *, text: str | None = None) -> dict:
    """A scripted Gemini answer calling `name` (the mock adds the step's thoughtSignature)."""
    parts = ([{"text": text}] if text else []) + [{"functionCall": {"id": id, "name": name, "args": args}}]
    return {"gemini": {"parts": parts}, "model": MAIN}


def run_gemini(gemini: Path, gw: Gateway, tmp: Path, prompt: str, files: dict[str, str] | None = None) -> list[dict]:
    """`gemini -p` with a clean environment (nothing of the caller's GEMINI_* or proxies); its stream-json events,
    the last one a successful `result`."""
    home, work = tmp / "home", tmp / "work"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini/settings.json").write_text(json.dumps(SETTINGS))
    work.mkdir()
    for name, content in (files or {}).items():
        (work / name).write_text(content)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GEMINI_CLI_HOME": str(home),
        "LANG": "C.UTF-8",
        "GOOGLE_GEMINI_BASE_URL": gw.root,
        "GEMINI_API_KEY": KEY,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }
    args = ["node", str(gemini), "-p", prompt, "-m", MAIN, "--yolo", "--skip-trust", "-o", "stream-json"]
    done = subprocess.run(args, env=env, cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"gemini exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert events and events[-1]["type"] == "result", done.stdout[-2000:]
    assert events[-1]["status"] == "success", events[-1]
    return events


def said(events: list[dict]) -> str:
    """What the assistant said, its streamed deltas joined."""
    return "".join(e["content"] for e in events if e["type"] == "message" and e["role"] == "assistant")


def main_requests(gw: Gateway) -> list[dict]:
    """The requests of the CLI's main loop as the mock received them."""
    return [r for r in gw.mock.requests() if r["uri"].split("?")[0] == f"/v1beta/models/{MAIN}:streamGenerateContent"]


def responses_of(content: dict) -> list[dict]:
    return [p["functionResponse"] for p in content["parts"] if "functionResponse" in p]


def calls_of(content: dict) -> list[dict]:
    return [p["functionCall"] for p in content["parts"] if "functionCall" in p]


def output_of(response: dict) -> str:
    return json.dumps(response["response"])


def check_call_pairs(contents: list[dict]) -> None:
    """Gemini's rule: a model turn's function calls are answered, one response each, by the very next content."""
    for i, c in enumerate(contents):
        if c["role"] == "model" and calls_of(c):
            following = contents[i + 1] if i + 1 < len(contents) else None
            assert following and following["role"] == "user", f"contents.{i}: calls not followed by a user turn"
            assert sorted(x.get("id", "") for x in calls_of(c)) == sorted(
                r.get("id", "") for r in responses_of(following)
            ), f"contents.{i}: calls and responses differ"


def session_ids(gw: Gateway) -> set[str]:
    """The sessions ctxgate holds (its admin API, open to loopback peers without a token)."""
    r = httpx.get(f"{gw.root}/admin/sessions", params={"limit": 1000}, timeout=10, trust_env=False)
    r.raise_for_status()
    return {s["id"] for s in r.json()["sessions"]}


def session_view(gw: Gateway, id: str, holding: str) -> dict:
    """The admin view of session `id`, once its history holds `holding` (turns are recorded as their answer ends)."""
    deadline = time.monotonic() + 5
    while True:
        view = httpx.get(f"{gw.root}/admin/sessions/{id}", timeout=10, trust_env=False).json()
        if holding in json.dumps(view["messages"]) or time.monotonic() > deadline:
            return view
        time.sleep(0.05)


def test_read_file_tool_loop(gemini: Path, gm: Gateway, tmp_path: Path):
    final = "The notes say: the secret is 4242."
    gm.mock.script(
        g_call("call_read_1", "read_file", {"file_path": "notes.txt"}, text="Reading it."),
        g_text(final),
    )
    before = session_ids(gm)
    events = run_gemini(gemini, gm, tmp_path, "What does notes.txt say?", {"notes.txt": "the secret is 4242\n"})
    (use,) = [e for e in events if e["type"] == "tool_use"]
    assert use["tool_name"] == "read_file" and use["parameters"] == {"file_path": "notes.txt"}
    (result,) = [e for e in events if e["type"] == "tool_result"]
    assert result["status"] == "success"
    assert said(events) == "Reading it." + final
    assert events[-1]["stats"]["tool_calls"] == 1

    first, second = main_requests(gm)
    assert first["uri"].endswith("?alt=sse"), "the CLI streams over SSE"
    contents = second["body"]["contents"]
    call_turn, answer = contents[-2], contents[-1]
    (call,) = calls_of(call_turn)
    assert call["id"] == "call_read_1" and call["name"] == "read_file"
    (sig,) = [p["thoughtSignature"] for p in call_turn["parts"] if "functionCall" in p]
    assert sig, "the thought signature goes back to the model"
    (response,) = responses_of(answer)
    assert response["id"] == "call_read_1"
    assert "the secret is 4242" in output_of(response), "the file reached the model"
    check_call_pairs(contents)
    for up in (first, second):
        assert up["headers"]["x-goog-api-key"] == KEY, "the key reaches the upstream"
    assert all(r["reply"]["status"] == 200 for r in gm.mock.requests())

    # needs the Gemini pipeline: the run is one ctxgate session, kept in Gemini's shape
    (session,) = session_ids(gm) - before
    view = session_view(gm, session, final)
    assert view.get("dialect") == "gemini", {k: view[k] for k in view if k != "messages"}
    history = json.dumps(view["messages"])
    assert "call_read_1" in history and "4242" in history and final in history


TURNS = 9


def big_output_command(i: int) -> str:
    """Prints about 22 KB (500 lines), each line tagged with the turn's marker."""
    return f"seq -f 'MARKER-{i} filler line %g of the ctxgate context test' 1 500"


def test_long_session_is_rewritten_recalls_and_goes_on(gemini: Path, gm: Gateway, tmp_path: Path):
    final = "All nine listings read; the first began with MARKER-0."
    gm.mock.script(
        *[g_call(f"sh_{i}", "run_shell_command", {"command": big_output_command(i)}) for i in range(TURNS)],
        # the model asks ctxgate for the oldest output, which ctxgate cleared: ctxgate answers it in the stream
        g_call("r1", RECALL, {"call_id": "sh_0"}, text="Checking the first listing."),
        g_text(final),
    )
    events = run_gemini(gemini, gm, tmp_path, "Print the nine listings one by one with the shell tool.")
    uses = [e for e in events if e["type"] == "tool_use"]
    assert [u["tool_name"] for u in uses] == ["run_shell_command"] * TURNS, "the client never sees the recall call"
    assert all(e["status"] == "success" for e in events if e["type"] == "tool_result")
    assert said(events) == "Checking the first listing." + final
    assert RECALL not in json.dumps(events) and SEARCH not in json.dumps(events)

    ups = main_requests(gm)
    assert len(ups) == TURNS + 2, "one request per model turn, the recall round's included"
    assert all(r["reply"]["status"] == 200 for r in gm.mock.requests())
    for i, up in enumerate(ups[1 : TURNS + 1]):
        contents = up["body"]["contents"]
        check_call_pairs(contents)
        (newest,) = responses_of(contents[-1])
        assert newest["id"] == f"sh_{i}"
        assert f"MARKER-{i} filler line 1 " in output_of(newest), "the newest output arrives whole"

    # needs the Gemini pipeline: once over the threshold, ctxgate cleared old outputs (the pairs stay) ...
    cleared = [i for i, up in enumerate(ups) if PLACEHOLDER in json.dumps(up["body"]["contents"])]
    assert cleared, "no request reached the mock with a cleared tool output"
    assert cleared[0] > 1, "the first requests were under the threshold, forwarded as they were"
    assert PLACEHOLDER not in ups[1]["raw"]
    # ... offered its recall tool on the rewritten request, which the model called ...
    rewritten = ups[TURNS]
    assert TURNS in cleared and "MARKER-0 filler line 1 " not in rewritten["raw"], "the oldest output left"
    declared = [d["name"] for t in rewritten["body"].get("tools", []) for d in t.get("functionDeclarations", [])]
    assert RECALL in declared and "run_shell_command" in declared
    # ... and answered the call itself: the next request carries the call and ctxgate's answer (the cleared output)
    recall_round = ups[TURNS + 1]["body"]["contents"]
    (recall_call,) = [c for m in recall_round if m["role"] == "model" for c in calls_of(m) if c["name"] == RECALL]
    assert recall_call["id"] == "r1"
    (answer,) = [r for m in recall_round if m["role"] == "user" for r in responses_of(m) if r.get("id") == "r1"]
    assert "MARKER-0 filler line 1 " in output_of(answer)
    check_call_pairs(recall_round)
