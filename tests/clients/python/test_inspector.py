"""The session inspector (`/ui/`) in a real browser: Debian's chromium, headless, driven by Playwright (its own
browsers are never downloaded: `executable_path`). Logs in with the admin token, opens a rewritten session, checks
that what each turn sent is shown beside the history (placeholders and the summary marked), opens the timeline,
saves a screenshot (target/ui-inspector.png), and measures how long a 2,000-message session takes to show."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from conftest import REPO, Upstream, _stop

import playwright.sync_api as playwright_api
from playwright.sync_api import expect

TOKEN = "ui-admin-token"
CHROMIUM = os.environ.get("CTXGATE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def history(turns: int, words: int) -> list[dict]:
    m = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing build."},
    ]
    for i in range(turns):
        m.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"call_{i}", "type": "function", "function": {"name": "shell", "arguments": json.dumps({"cmd": f"make step{i}"})}}
                ],
            }
        )
        m.append({"role": "tool", "tool_call_id": f"call_{i}", "content": " ".join(f"line{i}-{w}" for w in range(200))})
    return m


@pytest.fixture(scope="module")
def inspector(upstream: Upstream):
    if CHROMIUM is None:
        if os.environ.get("CTXGATE_REQUIRE_EXTERNAL"):
            pytest.fail("no chromium: apt-get install chromium")
        pytest.skip("no chromium (apt-get install chromium)")
    """A gateway with an admin token, a small window and a summary model (the mock answers it)."""
    proc, listen = upstream.gateway(
        f'[admin]\ntoken = "{TOKEN}"\n[context]\ndefault_context_window = 6000\n'
        '[summary]\nmodel = "summarizer-model"\nwait_ms = 5000\n',
        name="inspector",
    )
    try:
        yield f"http://{listen}"
    finally:
        _stop(proc)


def chat(base: str, session: str, messages: list[dict], strategy: str | None = None) -> str:
    headers = {"authorization": "Bearer sk-ui", "x-session-id": session}
    if strategy:
        headers["x-ctxgate-strategy"] = strategy
    with httpx.Client(trust_env=False, timeout=30) as c:
        r = c.post(f"{base}/v1/chat/completions", json={"model": "mock-model", "messages": messages}, headers=headers)
    assert r.status_code == 200, r.text
    return r.headers["x-ctxgate-session"]


def admin(base: str, path: str) -> dict:
    with httpx.Client(trust_env=False, timeout=30) as c:
        r = c.get(f"{base}{path}", headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_inspector_shows_what_each_turn_sent(inspector: str):
    base = inspector
    m = history(1, 20)
    sid = chat(base, "ui-agent", m)  # turn 0: under the threshold
    m = history(8, 200)
    chat(base, "ui-agent", m)  # turn 1: old results cleared
    m += [{"role": "assistant", "content": "mock reply"}, {"role": "user", "content": "Go on."}]
    chat(base, "ui-agent", m, strategy="summarize")  # turn 2: a summary
    turns = admin(base, f"/admin/sessions/{sid}/turns?messages=false")
    assert turns["total"] == 3
    assert [t["rewritten"] for t in turns["turns"]] == [False, True, True]

    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{base}/ui/")
        # The page asks for the token; a wrong one is refused with a message.
        page.fill("#token", "wrong")
        page.click("#login-btn")
        page.wait_for_selector("#login-error:has-text('refused')")
        assert page.is_visible("#login")
        page.fill("#token", TOKEN)
        page.click("#login-btn")
        page.wait_for_selector(f"tr.session[data-id='{sid}']")
        # Search by id.
        chat(base, "ui-other", history(1, 5))
        page.click("#logout")
        page.fill("#token", TOKEN)
        page.click("#login-btn")
        expect(page.locator("tr.session")).to_have_count(2)
        page.fill("#search", "ui-agent")
        expect(page.locator("tr.session")).to_have_count(1)
        page.click(f"tr.session[data-id='{sid}']")
        page.wait_for_selector("tr.turn[data-turn='2']")
        assert page.text_content("#session-id") == sid

        # Turn 1: the cleared results are marked, on both sides.
        page.click("tr.turn[data-turn='1']")
        page.wait_for_selector("#turn-sent .msg.kind-cleared")
        cleared = page.locator("#turn-sent .msg.kind-cleared")
        assert cleared.count() >= 1
        assert "Tool result cleared" in cleared.first.text_content()
        t1 = admin(base, f"/admin/sessions/{sid}/turns?offset=1&limit=1")["turns"][0]
        replaced = sum(len(f.get("replaces", [])) for f in t1["sent_from"])
        assert page.locator("#turn-history .msg.state-replaced").count() == replaced
        kinds = [f["kind"] for f in t1["sent_from"] if "kind" in f]
        assert page.locator("#turn-sent .msg.kind-cleared").count() == kinds.count("cleared")
        assert page.locator("#turn-sent .msg.kind-note").count() == 1

        # Turn 2: the summary, its text shown, standing for the history it replaced.
        page.click("tr.turn[data-turn='2']")
        page.wait_for_selector("#turn-sent .msg.kind-summary")
        summary = page.locator("#turn-sent .msg.kind-summary").first.text_content()
        assert "Summary of the earlier conversation" in summary
        assert "mock reply" in summary
        assert page.locator("#turn-history .msg.state-replaced").count() > 2
        page.screenshot(path=str(REPO / "target/ui-inspector.png"), full_page=False)

        # The timeline: one point per turn for what the client sent and for what went upstream.
        page.click("#tab-timeline")
        page.wait_for_selector("#timeline")
        assert page.locator("#timeline circle.pt-sent").count() == 3
        assert page.locator("#timeline circle.pt-client").count() == 3
        page.screenshot(path=str(REPO / "target/ui-timeline.png"))

        # The history tab, and the strategy pin from the page.
        page.click("#tab-history")
        assert page.locator("#history .msg").count() > 10
        page.select_option("#strategy", "off")
        page.wait_for_selector("#strategy-said:has-text('pinned: off')")
        assert admin(base, f"/admin/sessions/{sid}")["strategy"] == "off"
        assert errors == [], errors
        browser.close()


def test_a_2000_message_session_opens_without_freezing(inspector: str):
    base = inspector
    m = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: " + "words " * 20} for i in range(1999)]
    sid = chat(base, "ui-long", m, strategy="off")
    assert admin(base, f"/admin/sessions/{sid}?")["message_count"] == 2000
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/ui/")
        page.fill("#token", TOKEN)
        page.click("#login-btn")
        page.wait_for_selector("tr.session")
        started = time.monotonic()
        page.goto(f"{base}/ui/#/s/{sid}")
        page.wait_for_selector("tr.turn[data-turn='0']")
        page.click("#tab-history")
        page.wait_for_selector("#history .msg")
        loaded = time.monotonic() - started
        # A window of it is rendered, the rest on demand.
        shown = page.locator("#history .msg").count()
        assert shown == 100
        page.click("#more")
        expect(page.locator("#history .msg")).to_have_count(200)
        # The turn of 2,000 messages side by side.
        started_turn = time.monotonic()
        page.click("#tab-turns")
        page.click("tr.turn[data-turn='0']")
        page.wait_for_selector("#turn-sent .msg")
        turn = time.monotonic() - started_turn
        assert page.locator("#turn-sent .msg").count() == 1999
        browser.close()
    (REPO / "target/ui-load.txt").write_text(
        f"2000-message session: opened in {loaded * 1000:.0f} ms; its one turn side by side in {turn * 1000:.0f} ms\n"
    )
    print(f"\n2000-message session: opened in {loaded * 1000:.0f} ms, turn view {turn * 1000:.0f} ms")
