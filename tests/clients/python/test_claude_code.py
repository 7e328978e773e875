"""Claude Code itself (the native binary of `@anthropic-ai/claude-code-linux-x64`, installed by tests/clients/run
into target/clients-claude) run headless through ctxgate against the mock upstream: a Bash tool loop, and a long
session that crosses the context threshold, so ctxgate rewrites its history, and goes on working.

Claude Code runs with a temporary HOME, `ANTHROPIC_BASE_URL` pointing at ctxgate, a dummy key and
`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`. Its main loop uses `--model claude-ctxgate-main`; the mock's scripted
replies are kept for that model, so any side request (to a small model) gets the mock's default answer instead."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, Upstream, _stop
from ctxtest import Gateway, Mock, a_text, a_tool_use

MAIN = "claude-ctxgate-main"
PLACEHOLDER = "[ctxgate] Tool result cleared"
CLAUDE = REPO / "target/clients-claude/node_modules/@anthropic-ai/claude-code-linux-x64/claude"


@pytest.fixture(scope="module")
def claude() -> Path:
    path = Path(os.environ.get("CLAUDE_BIN", CLAUDE))
    if not path.is_file():
        message = f"no Claude Code binary at {path}: run tests/clients/run (or set CLAUDE_BIN)"
        if os.environ.get("CTXGATE_REQUIRE_EXTERNAL"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def cc_stack(upstream: Upstream):
    """A ctxgate for Claude Code: the main model's window is small (60,000 tokens; rewrite above 60 %, aim for
    40 %), so a few big tool results cross the threshold while Claude Code's system prompt and tools fit easily."""
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
    proc, listen = upstream.gateway(config, name="claude")
    try:
        yield Gateway(base_url=f"http://{listen}/v1", mock=Mock(upstream.mock_url.removesuffix("/v1")))
    finally:
        _stop(proc)


@pytest.fixture
def cc(cc_stack: Gateway) -> Gateway:
    cc_stack.mock.reset()
    return cc_stack


def run_claude(claude: Path, gw: Gateway, tmp: Path, prompt: str) -> dict:
    """`claude -p` with a clean environment (nothing of the caller's ANTHROPIC_* or proxies); its JSON result."""
    home, work = tmp / "home", tmp / "work"
    home.mkdir()
    work.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": gw.root,
        "ANTHROPIC_API_KEY": "sk-ant-dummy",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    args = [str(claude), "-p", prompt, "--model", MAIN, "--allowedTools", "Bash", "--output-format", "json"]
    done = subprocess.run(args, env=env, cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"claude exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return json.loads(done.stdout)


def main_requests(gw: Gateway) -> list[dict]:
    """The requests of Claude Code's main loop as the mock received them."""
    return [
        r
        for r in gw.mock.requests()
        if r["uri"].split("?")[0] == "/v1/messages" and (r["body"] or {}).get("model") == MAIN
    ]


def tool_results(message: dict) -> list[dict]:
    content = message["content"]
    return [b for b in content if b.get("type") == "tool_result"] if isinstance(content, list) else []


def result_text(block: dict) -> str:
    c = block.get("content")
    if isinstance(c, str):
        return c
    return "".join(b.get("text", "") for b in c or [])


def check_tool_pairs(messages: list[dict]) -> None:
    """Anthropic's rule: each assistant tool_use has its tool_result in the very next message, and vice versa."""
    for i, m in enumerate(messages):
        uses = [b["id"] for b in m["content"] if b.get("type") == "tool_use"] if isinstance(m["content"], list) else []
        following = messages[i + 1] if i + 1 < len(messages) else None
        answered = [b["tool_use_id"] for b in tool_results(following)] if following else []
        if m["role"] == "assistant":
            assert sorted(uses) == sorted(answered), f"messages.{i}: tool_use {uses} answered by {answered}"
        if m["role"] == "user" and tool_results(m):
            prev = messages[i - 1]
            assert prev["role"] == "assistant", f"messages.{i}: tool results after a {prev['role']} message"


def test_bash_tool_loop(claude: Path, cc: Gateway, tmp_path: Path):
    final = "Done: the command printed ctxgate-ok."
    cc.mock.script(
        a_tool_use(
            "toolu_cc_1", "Bash", {"command": "echo ctxgate-ok", "description": "Print a marker"}, text="Running it.",
            model=MAIN,
        ),
        a_text(final, model=MAIN),
    )
    out = run_claude(claude, cc, tmp_path, "Run `echo ctxgate-ok` with the Bash tool and report what it printed.")
    assert out["is_error"] is False and out["subtype"] == "success", out
    assert out["result"] == final
    assert out["num_turns"] == 2

    first, second = main_requests(cc)
    assert first["body"]["stream"] is True, "Claude Code streams"
    last = second["body"]["messages"][-1]
    (result,) = tool_results(last)
    assert result["tool_use_id"] == "toolu_cc_1"
    assert result_text(result).strip() == "ctxgate-ok", "the command's output reached the model"
    assert result.get("is_error") is not True
    check_tool_pairs(second["body"]["messages"])
    for up in (first, second):
        h = up["headers"]
        assert h["x-api-key"] == "sk-ant-dummy"
        assert h["anthropic-version"] and "claude-code-20250219" in h["anthropic-beta"].split(",")
        assert h["x-claude-code-session-id"] == first["headers"]["x-claude-code-session-id"]
    # every request Claude Code made was answered with a success
    assert all(r["reply"]["status"] == 200 for r in cc.mock.requests())


TURNS = 9


def big_output_command(i: int) -> str:
    """Prints about 22 KB (500 lines), each line tagged with the turn's marker."""
    return f"seq -f 'MARKER-{i} filler line %g of the ctxgate context test' 1 500"


def test_long_session_crosses_the_threshold_and_goes_on(claude: Path, cc: Gateway, tmp_path: Path):
    final = "All nine listings read; the session is still going."
    cc.mock.script(
        *[
            a_tool_use(f"toolu_long_{i}", "Bash", {"command": big_output_command(i), "description": f"Listing {i}"},
                       model=MAIN)
            for i in range(TURNS)
        ],
        a_text(final, model=MAIN),
    )
    out = run_claude(claude, cc, tmp_path, "Print the nine listings one by one with the Bash tool.")
    assert out["is_error"] is False and out["result"] == final, out
    assert out["num_turns"] == TURNS + 1

    ups = main_requests(cc)
    assert len(ups) == TURNS + 1, "one request per model turn, each answered by its scripted reply"
    assert all(r["reply"]["status"] == 200 for r in cc.mock.requests())
    for i, up in enumerate(ups[1:]):
        msgs = up["body"]["messages"]
        check_tool_pairs(msgs)
        (newest,) = tool_results(msgs[-1])
        assert newest["tool_use_id"] == f"toolu_long_{i}"
        assert result_text(newest).startswith(f"MARKER-{i} filler line 1 "), "the newest result reaches the model whole"

    # needs the Anthropic pipeline: once over the threshold, ctxgate cleared old results (the pairs stay) ...
    cleared = [
        i
        for i, up in enumerate(ups)
        if any(PLACEHOLDER in result_text(b) for m in up["body"]["messages"] for b in tool_results(m))
    ]
    assert cleared, "no request reached the mock with a cleared tool result"
    assert cleared[-1] == TURNS, "the last request is still rewritten"
    assert cleared[0] > 1, "the first requests were under the threshold, forwarded as they were"
    last = json.dumps(ups[-1]["body"]["messages"])
    assert "MARKER-0 filler line 1 " not in last, "the oldest output no longer goes upstream"
    # ... and the requests before the threshold went upstream as Claude Code sent them
    assert PLACEHOLDER not in ups[1]["raw"]
