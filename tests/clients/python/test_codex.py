"""Codex CLI itself (npm `@openai/codex`, pinned in tests/clients/codex and installed by tests/clients/run into
target/clients-codex) run headless (`codex exec`) through ctxgate against the mock upstream: a shell tool loop, a
long session that crosses the context threshold, so ctxgate rewrites its history, and goes on working, and Codex's
built-in OpenAI provider (WebSocket attempts first, then HTTPS; remote compaction v2 with a `compaction_trigger`).
Codex's start-up time through ctxgate (launch to its first `POST …/responses` reaching the mock) is printed.

Codex runs with a temporary `CODEX_HOME` whose config.toml names a custom provider (`wire_api = "responses"`, its
base URL ctxgate's `/v1`, the key from `MOCK_API_KEY`) and the model `gpt-ctxgate-main`; the mock's scripted replies
are kept for that model. Codex's shell tool is the function `exec_command` (`{"cmd": "…"}`); it answers with a
`function_call_output` whose text ends with the command's output."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from conftest import REPO, Upstream, _stop
from ctxtest import Gateway, Mock, r_call, r_text, sse_data

MAIN = "gpt-ctxgate-main"
PLACEHOLDER = "[ctxgate] Tool result cleared"
CODEX = REPO / "target/clients-codex/node_modules/@openai/codex/bin/codex.js"


@pytest.fixture(scope="module")
def codex() -> Path:
    path = Path(os.environ.get("CODEX_JS", CODEX))
    if not path.is_file():
        message = f"no Codex CLI at {path}: run tests/clients/run (or set CODEX_JS)"
        if os.environ.get("CTXGATE_REQUIRE_EXTERNAL"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def cx_stack(upstream: Upstream):
    """A ctxgate for Codex: the main model's window is small (40,000 tokens; rewrite above 60 %, aim for 40 %), so
    a few big command outputs cross the threshold (Codex keeps about 2,700 tokens of each) while Codex's
    instructions and tools (about 10,000 tokens) fit in the target."""
    config = f"""
[context]
threshold = 0.6
target = 0.4
hard_limit = 0.95
[prune]
keep_tool_results = 2
[models."{MAIN}"]
context_window = 40000
"""
    proc, listen = upstream.gateway(config, name="codex")
    try:
        yield Gateway(base_url=f"http://{listen}/v1", mock=Mock(upstream.mock_url.removesuffix("/v1")))
    finally:
        _stop(proc)


@pytest.fixture
def cx(cx_stack: Gateway) -> Gateway:
    cx_stack.mock.reset()
    return cx_stack


def custom_provider(gw: Gateway) -> str:
    """config.toml for a custom provider speaking the Responses API over HTTP (Codex compacts locally)."""
    return f"""
model = "{MAIN}"
model_provider = "mock"
# Codex's own compaction stays out of the way: the test is about ctxgate's.
model_auto_compact_token_limit = 10000000

[model_providers.mock]
name = "mock"
base_url = "{gw.base_url}"
env_key = "MOCK_API_KEY"
wire_api = "responses"
"""


def run_codex(codex: Path, gw: Gateway, tmp: Path, prompt: str, config: str | None = None) -> tuple[str, float]:
    """`codex exec` with a clean environment (nothing of the caller's OPENAI_* or proxies) and `config` as its
    config.toml (default: [`custom_provider`]); its final message (its stdout) and its start-up time in seconds
    (launch to the first `POST …/responses` reaching the mock)."""
    home, work = tmp / "codex-home", tmp / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(config if config is not None else custom_provider(gw))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "LANG": "C.UTF-8",
        "CODEX_HOME": str(home),
        "MOCK_API_KEY": "sk-codex-dummy",
        "OPENAI_API_KEY": "sk-codex-dummy",
    }
    args = ["node", str(codex), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt]
    launched = time.time()
    done = subprocess.run(
        args, env=env, cwd=work, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, f"codex exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    first = min(r["received_ms"] for r in gw.mock.requests() if r["method"] == "POST")
    return done.stdout.strip(), first / 1000 - launched


def main_requests(gw: Gateway) -> list[dict]:
    """The requests of Codex's main loop as the mock received them."""
    return [
        r
        for r in gw.mock.requests()
        if r["uri"].split("?")[0] == "/v1/responses" and (r["body"] or {}).get("model") == MAIN
    ]


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


def outputs(items: list[dict]) -> list[dict]:
    return [i for i in items if i.get("type") == "function_call_output"]


def check_call_pairs(items: list[dict]) -> None:
    """The Responses API's rules: each `function_call_output` follows its `function_call`, each call is answered,
    and a `reasoning` item is followed by the item it produced."""
    calls: list[str] = []
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind == "function_call":
            calls.append(item["call_id"])
        elif kind == "function_call_output":
            assert item["call_id"] in calls, f"input.{i}: output for unknown call {item['call_id']}"
            calls.remove(item["call_id"])
        elif kind == "reasoning":
            assert i + 1 < len(items) and items[i + 1].get("type") != "reasoning", f"input.{i}: reasoning alone"
    assert not calls, f"calls without output: {calls}"


def test_shell_tool_loop(codex: Path, cx: Gateway, tmp_path: Path, capsys: pytest.CaptureFixture):
    final = "The command printed ctxgate-codex-42."
    cx.mock.script(
        r_call(
            "call_echo", "exec_command", {"cmd": "echo ctxgate-codex-$((6*7))"}, reasoning="Run the echo.", model=MAIN
        ),
        r_text(final, model=MAIN),
    )
    before = session_ids(cx)
    said, startup = run_codex(codex, cx, tmp_path, "Run the echo command and report what it printed.")
    with capsys.disabled():
        print(f"\nCodex start-up through ctxgate (launch to first POST at the mock): {startup * 1000:.0f} ms")
    assert said == final

    first, second = main_requests(cx)
    assert first["body"]["stream"] is True and first["body"]["store"] is False, "Codex streams, stateless"
    assert "previous_response_id" not in first["body"]
    assert any(t.get("name") == "exec_command" for t in first["body"]["tools"])
    items = second["body"]["input"]
    check_call_pairs(items)
    reasoning, call, output = items[-3:]
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"] == "gAAAA-mock-call_echo"
    assert call["type"] == "function_call" and call["call_id"] == "call_echo"
    assert output["call_id"] == "call_echo"
    assert output["output"].rstrip().endswith("\nctxgate-codex-42"), "the command's output reached the model"
    for up in (first, second):
        h = up["headers"]
        assert h["authorization"] == "Bearer sk-codex-dummy"
        assert h["session-id"] == first["headers"]["session-id"]
        assert up["body"]["prompt_cache_key"] == first["body"]["prompt_cache_key"]
    # every request Codex made was answered with a success
    assert all(r["reply"]["status"] == 200 for r in cx.mock.requests())

    # needs the Responses pipeline: the run is one ctxgate session, kept in the Responses shape
    (session,) = session_ids(cx) - before
    # named by Codex's own session id (under the caller's tenant prefix), not by a fingerprint
    assert session.endswith("-" + first["headers"]["session-id"]), session
    view = session_view(cx, session, final)
    assert view.get("dialect") == "responses", {k: view[k] for k in view if k != "messages"}
    history = json.dumps(view["messages"])
    assert "call_echo" in history and "ctxgate-codex-42" in history and final in history


TURNS = 9


def big_output_command(i: int) -> str:
    """Prints about 25 KB (500 lines), each line tagged with the turn's marker; Codex keeps about 10 KB of it (the
    head and the tail) in its history."""
    return f"seq -f 'MARKER-{i} filler line %g of the ctxgate context test' 1 500"


def test_long_session_crosses_the_threshold_and_goes_on(codex: Path, cx: Gateway, tmp_path: Path):
    final = "All nine listings read; the session is still going."
    cx.mock.script(
        *[r_call(f"call_long_{i}", "exec_command", {"cmd": big_output_command(i)}, model=MAIN) for i in range(TURNS)],
        r_text(final, model=MAIN),
    )
    said, _ = run_codex(codex, cx, tmp_path, "Print the nine listings one by one with the shell.")
    assert said == final

    ups = main_requests(cx)
    assert len(ups) == TURNS + 1, "one request per model turn, each answered by its scripted reply"
    assert all(r["reply"]["status"] == 200 for r in cx.mock.requests())
    for i, up in enumerate(ups[1:]):
        items = up["body"]["input"]
        check_call_pairs(items)
        newest = outputs(items)[-1]
        assert newest["call_id"] == f"call_long_{i}"
        assert f"MARKER-{i} filler line 1 of" in newest["output"], "the newest output arrives whole"
        assert f"MARKER-{i} filler line 500 of" in newest["output"]

    # needs the Responses pipeline: once over the threshold, ctxgate cleared old outputs (the pairs stay) ...
    cleared = [i for i, up in enumerate(ups) if any(PLACEHOLDER in o["output"] for o in outputs(up["body"]["input"]))]
    assert cleared, "no request reached the mock with a cleared tool output"
    assert cleared[-1] == TURNS, "the last request is still rewritten"
    assert cleared[0] > 1, "the first requests were under the threshold, forwarded as they were"
    last = json.dumps(ups[-1]["body"]["input"])
    assert "MARKER-0 filler line 1 of" not in last, "the oldest output no longer goes upstream"
    # ... and the requests before the threshold went upstream as Codex sent them
    assert PLACEHOLDER not in ups[1]["raw"]


def test_builtin_provider_websocket_fallback_and_remote_compaction(
    codex: Path, cx: Gateway, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """The built-in OpenAI provider (`openai_base_url`): Codex tries a WebSocket on `GET /v1/responses` first and
    falls back to HTTPS when it is refused. Its history grows past ctxgate's threshold; then a reply reports more
    input tokens than Codex's auto-compact limit, so Codex compacts remotely (v2): a normal request whose input ends
    with a `compaction_trigger` (it must reach the upstream unrewritten, whole history included), answered with
    exactly one `compaction` item (the mock's), which Codex then sends back in place of the history."""
    final = "Listings read, context compacted, still going."
    calls = [r_call(f"call_c{i}", "exec_command", {"cmd": big_output_command(i)}, model=MAIN) for i in range(TURNS)]
    # The history stays under Codex's limit (its last request is about 34,000 tokens); the last call's reply says
    # more: Codex compacts next.
    calls[-1]["responses"]["usage"] = {"input_tokens": 46_000}
    cx.mock.script(*calls, r_text(final, model=MAIN))
    config = f"""
model = "{MAIN}"
openai_base_url = "{cx.base_url}"
model_auto_compact_token_limit = 45000
"""
    said, startup = run_codex(codex, cx, tmp_path, "Print the listings with the shell.", config)
    with capsys.disabled():
        print(f"\nCodex (built-in provider, WebSocket refused) start-up through ctxgate: {startup * 1000:.0f} ms")
    assert said == final

    ups = cx.mock.requests()
    gets = [u for u in ups if u["method"] == "GET"]
    # whatever ctxgate does with the upgrade, an attempt that reaches the mock is refused at once
    assert all(u["uri"] == "/v1/responses" and u["reply"]["status"] == 404 for u in gets), gets
    posts = [u for u in ups if u["method"] == "POST"]
    assert all(u["uri"] == "/v1/responses" and u["reply"]["status"] == 200 for u in posts)
    assert "remote_compaction_v2" in posts[0]["headers"].get("x-codex-beta-features", "")
    triggers = [i for i, u in enumerate(posts) if u["body"]["input"][-1].get("type") == "compaction_trigger"]
    assert triggers == [TURNS], "Codex compacted once, right after the reply over its limit (and its call)"
    trigger = posts[TURNS]
    # the compaction request went upstream as Codex sent it: every output whole, nothing cleared
    assert PLACEHOLDER not in trigger["raw"]
    sent = outputs(trigger["body"]["input"])
    assert [o["call_id"] for o in sent] == [f"call_c{i}" for i in range(TURNS)]
    assert all(f"MARKER-{i} filler line 500 of" in o["output"] for i, o in enumerate(sent))
    answer = [json.loads(d) for d in sse_data(trigger["reply"]["sse"])][-1]["response"]["output"]
    assert [o["type"] for o in answer] == ["compaction"], "exactly one compaction item"
    after = posts[TURNS + 1]["body"]["input"]
    kept = [i for i in after if i.get("type") == "compaction"]
    assert len(kept) == 1 and kept[0]["encrypted_content"] == answer[0]["encrypted_content"], "carried as it was"
    assert "MARKER-0 filler line 1 of" not in json.dumps(after), "the compacted history is gone"
    assert len(posts) == TURNS + 2

    # needs the Responses pipeline: before the compaction the history crossed ctxgate's threshold and was rewritten
    cleared = [i for i, u in enumerate(posts) if any(PLACEHOLDER in o["output"] for o in outputs(u["body"]["input"]))]
    assert cleared and cleared[-1] == TURNS - 1, cleared
