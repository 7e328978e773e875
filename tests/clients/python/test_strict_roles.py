"""Strict role order, judged by `mistral-common` (the request validator vLLM uses for Mistral and Devstral models,
in `ValidationMode.serving`): whatever it accepts as the client sent it, it accepts as ctxgate sent it. Checked on
every request `ctxgate replay --requests` writes for the shared traces (`../shared/traces`, or `CTXGATE_TRACES`),
on a coding-agent run and a support chat made here (summaries and recall notes: several strategies and windows),
and on the requests a real gateway sent upstream in a recall round."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import _binary
from ctxtest import MODEL, Gateway, completion, tool_call
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.validator import ValidationMode, get_validator
from mistral_common.tokens.tokenizers.base import TokenizerVersion
from openai import OpenAI
from test_openai_sdk import READ_FILE, RECALL, agent_history

REPO = Path(__file__).resolve().parents[3]
TRACES = Path(os.environ.get("CTXGATE_TRACES") or REPO.parent / "shared/traces")
VERSIONS = list(TokenizerVersion)


def refusal(version: TokenizerVersion, body: dict) -> str | None:
    """Why the validator of `version` refuses a chat body (`None`: accepted)."""
    try:
        request = ChatCompletionRequest.from_openai(body["messages"], body.get("tools"), model="m")
        get_validator(version, ValidationMode.serving).validate_request(request)
    except Exception as e:  # every refusal is an exception of mistral-common's or pydantic's
        return f"{type(e).__name__}: {e}"
    return None


def judge(pairs: list[tuple[str, dict, dict]]) -> dict[str, int]:
    """For each rewritten (client, sent) pair and each validator version: a body accepted as the client sent it is
    accepted as ctxgate sent it. Returns the counts."""
    counts = {"rewritten": 0, "accepted_as_sent_by_client": 0}
    failures = []
    for name, client, sent in pairs:
        if sent is None or sent == client:
            continue
        counts["rewritten"] += 1
        for v in VERSIONS:
            if refusal(v, client) is None:
                counts["accepted_as_sent_by_client"] += 1
                why = refusal(v, sent)
                if why is not None:
                    failures.append(f"{name} ({v.value}): {why}")
    assert not failures, f"{len(failures)} refused:\n" + "\n".join(failures[:20])
    return counts


def replayed(binary: str, traces: list[Path], tmp: Path, *args: str) -> list[tuple[str, dict, dict]]:
    """Every request `ctxgate replay` plans for `traces` with `args`: (trace and step, client body, sent body)."""
    out = tmp / "requests.jsonl"
    subprocess.run(
        [binary, "replay", *map(str, traces), "--requests", str(out), *args],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows, "no requests replayed"
    return [(f"{r['trace']}#{r['index']}", r["client"], r["sent"]) for r in rows]


def chat_traces() -> list[Path]:
    if not TRACES.is_dir():
        if os.environ.get("CTXGATE_REQUIRE_EXTERNAL") == "1":
            pytest.fail(f"{TRACES} is missing")
        pytest.skip(f"{TRACES} not found")
    files = sorted(p for p in TRACES.glob("*.json") if "messages" in json.loads(p.read_text()))
    assert files, f"no chat traces in {TRACES}"
    return files


@pytest.fixture(scope="session")
def ctxgate_bin() -> str:
    return str(_binary())


STRATEGIES = [("prune",), ("hybrid", "--summaries"), ("summarize", "--summaries")]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=[s[0] for s in STRATEGIES])
def test_shared_traces_stay_acceptable(ctxgate_bin: str, tmp_path: Path, strategy: tuple[str, ...]):
    pairs = replayed(
        ctxgate_bin, chat_traces(), tmp_path, "--window", "16000", "--strategy", strategy[0], *strategy[1:]
    )
    counts = judge(pairs)
    assert counts["rewritten"] > 20 and counts["accepted_as_sent_by_client"] > 20, counts


def made_traces(tmp: Path) -> list[Path]:
    """A coding-agent run (one task, a nudge, long tool results) and a support chat (many short turns with calls)."""
    tools = [READ_FILE]
    agent = agent_history(40, 250)
    agent.insert(30, {"role": "user", "content": "Please continue working on the task."})
    chat: list[dict] = [{"role": "system", "content": "You help travellers."}]
    for t in range(30):
        cid = f"c{t}"
        chat.append({"role": "user", "content": f"question {t} " + "please " * 60})
        chat.append({"role": "assistant", "content": None, "tool_calls": [tool_call(cid, "read_file", {"path": f"{t}"})]})
        chat.append({"role": "tool", "tool_call_id": cid, "content": f"booking {t} " + "seat " * 200})
        chat.append({"role": "assistant", "content": f"answer {t} " + "indeed " * 60})
    paths = []
    for name, messages in [("agent", agent), ("chat", chat)]:
        p = tmp / f"{name}.json"
        p.write_text(json.dumps({"id": name, "model": "gpt-4o", "tools": tools, "messages": messages}))
        paths.append(p)
    return paths


@pytest.mark.parametrize("window", ["6000", "12000"])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=[s[0] for s in STRATEGIES])
def test_summaries_and_recall_notes_stay_acceptable(
    ctxgate_bin: str, tmp_path: Path, strategy: tuple[str, ...], window: str
):
    pairs = replayed(ctxgate_bin, made_traces(tmp_path), tmp_path, "--window", window, "--strategy", strategy[0], *strategy[1:])
    counts = judge(pairs)
    assert counts["rewritten"] > 5 and counts["accepted_as_sent_by_client"] > 5, counts
    sent = [s for _, c, s in pairs if s is not None and s != c]
    note = "[ctxgate] Some earlier tool results"
    assert any(note in json.dumps(s) for s in sent), "a recall note was sent"
    if strategy[0] != "prune":
        summary = "Summary of the earlier conversation"
        assert any(summary in json.dumps(s) for s in sent), "a summary was sent"
    for s in sent:
        roles = [m["role"] for m in s["messages"]]
        first = next(i for i, r in enumerate(roles) if r != "system")
        assert "system" not in roles[first:], roles


def test_a_recall_round_stays_acceptable(gw: Gateway, http_client: httpx.Client):
    client = OpenAI(base_url=gw.base_url, api_key=gw.api_key, http_client=http_client, max_retries=0)
    gw.rewritten = True
    gw.mock.script(
        completion(None, [tool_call("r1", RECALL, {"call_id": "call_0"})], id="chatcmpl-round1"),
        completion("done", id="chatcmpl-final"),
    )
    history = agent_history()
    client.chat.completions.create(model=MODEL, messages=history, tools=[READ_FILE])
    sent = [r["body"] for r in gw.mock.requests()]
    assert len(sent) == 2, "the rewrite and its recall round"
    body = {"model": MODEL, "messages": history, "tools": [READ_FILE]}
    counts = judge([(f"round {i}", body, s) for i, s in enumerate(sent)])
    assert counts["accepted_as_sent_by_client"] > 0, counts
