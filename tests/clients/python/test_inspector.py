"""The session inspector (`/ui/`) in a real browser: Debian's chromium, headless, driven by Playwright (its own
browsers are never downloaded: `executable_path`). Logs in with the admin token, opens a rewritten session, checks
that what each turn sent is shown beside the history (placeholders and the summary marked), opens the timeline,
saves a screenshot (target/ui-inspector.png), and measures how long a 2,000-message session takes to show. Without
a token (the default loopback install) the page opens on the sessions, each with its own address; and a page of
another origin, or one whose name was rebound to 127.0.0.1, cannot drive the admin API from the same browser."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import quote

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
    sid = chat(base, "ui-agent", m)  # turn 1: under the threshold
    m = history(8, 200)
    chat(base, "ui-agent", m)  # turn 2: old results cleared
    m += [{"role": "assistant", "content": "mock reply"}, {"role": "user", "content": "Go on."}]
    chat(base, "ui-agent", m, strategy="summarize")  # turn 3: a summary
    turns = admin(base, f"/admin/sessions/{sid}/turns?messages=false")
    assert turns["total"] == 3
    assert [t["rewritten"] for t in turns["turns"]] == [False, True, True]
    # Turns are numbered from 1, in the admin API as on the page (and in the README's tour).
    assert [t["turn"] for t in turns["turns"]] == [1, 2, 3]

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
        # The session's token figure says what it is: an estimate, explained beside the list and in its title.
        assert "(est.)" in page.text_content("#th-tokens")
        assert "Estimated from the size of the stored history" in page.get_attribute("#th-tokens", "title")
        assert "divided by 4 bytes" in page.text_content("#list-legend")
        page.click(f"tr.session[data-id='{sid}']")
        page.wait_for_selector("tr.turn[data-turn='3']")
        assert page.text_content("#session-id") == sid
        assert "(estimated from the history's size)" in page.text_content("#session-meta")
        # Its money, summed by the admin API from its turns (the mock model is unpriced: nothing spent).
        assert "spent $0.00 · saved $0.00" in page.text_content("#session-meta")
        expect(page.locator("tr.turn[data-turn='0']")).to_have_count(0)
        # Each turn's prompt cache against the previous turn, as its record says: the first has none to compare
        # with; ctxgate's rewrites changed the prefix of turns 2 and 3 (a re-cut, named by its stage).
        for t in turns["turns"]:
            cell = page.text_content(f"tr.turn[data-turn='{t['turn']}'] td.cache")
            cause = t["cache"].get("cause")
            assert (cause or ("first" if t["turn"] == 1 else "hit")) in cell, (t["cache"], cell)
            if cause:
                assert f"{t['cache'].get('missed_tokens', 0)} missed" in cell, cell
        assert "recut" in [t["cache"].get("cause") for t in turns["turns"]], turns

        # Turn 2 (offset 1 in the admin API): the cleared results are marked, on both sides.
        page.click("tr.turn[data-turn='2']")
        page.wait_for_selector("#turn-title:has-text('Turn 2 ·')")
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

        # Turn 3: the summary, its text shown, standing for the history it replaced.
        page.click("tr.turn[data-turn='3']")
        page.wait_for_selector("#turn-title:has-text('Turn 3 ·')")
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
        page.wait_for_selector("tr.turn[data-turn='1']")
        page.click("#tab-history")
        page.wait_for_selector("#history .msg")
        loaded = time.monotonic() - started
        # A window of it is rendered, the rest on demand.
        shown = page.locator("#history .msg").count()
        assert shown == 100
        page.click("#more")
        expect(page.locator("#history .msg")).to_have_count(200)
        # The history comes a page (500 messages) at a time: past the first page the next one is fetched.
        assert admin(base, f"/admin/sessions/{sid}")["total"] == 2000
        assert len(admin(base, f"/admin/sessions/{sid}")["messages"]) == 500
        for shown in range(300, 701, 100):
            page.click("#more")
            expect(page.locator("#history .msg")).to_have_count(shown)
        assert "message 650:" in page.locator("#history .msg").nth(650).text_content()
        expect(page.locator("#more")).to_have_text("show more (1300 left)")
        # The turn of 2,000 messages side by side.
        started_turn = time.monotonic()
        page.click("#tab-turns")
        page.click("tr.turn[data-turn='1']")
        page.wait_for_selector("#turn-sent .msg")
        turn = time.monotonic() - started_turn
        assert page.locator("#turn-sent .msg").count() == 1999
        # Its history as far as its head: every page of it fetched, each message marked as sent.
        expect(page.locator("#turn-history .msg")).to_have_count(1999)
        assert page.locator("#turn-history .msg.state-sent").count() == 1999
        browser.close()
    (REPO / "target/ui-load.txt").write_text(
        f"2000-message session: opened in {loaded * 1000:.0f} ms; its one turn side by side in {turn * 1000:.0f} ms\n"
    )
    print(f"\n2000-message session: opened in {loaded * 1000:.0f} ms, turn view {turn * 1000:.0f} ms")


# --- without a token: the default loopback install ------------------------------------------------------------


@pytest.fixture(scope="module")
def open_inspector(upstream: Upstream):
    """A gateway without an admin token (loopback: the admin API serves loopback callers) and a small window;
    with the path of its log."""
    if CHROMIUM is None:
        if os.environ.get("CTXGATE_REQUIRE_EXTERNAL"):
            pytest.fail("no chromium: apt-get install chromium")
        pytest.skip("no chromium (apt-get install chromium)")
    proc, listen = upstream.gateway("[context]\ndefault_context_window = 6000\n", name="inspector-open")
    try:
        yield f"http://{listen}", upstream.tmp / "inspector-open.log"
    finally:
        _stop(proc)


def open_admin(base: str, path: str) -> dict:
    with httpx.Client(trust_env=False, timeout=30) as c:
        r = c.get(f"{base}{path}")
    assert r.status_code == 200, r.text
    return r.json()


def launch(p, *args: str):
    return p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", *args])


def test_without_a_token_the_inspector_opens_on_the_sessions_and_each_has_an_address(open_inspector):
    base, _ = open_inspector
    sid = chat(base, "ui-open-agent", history(1, 20))  # turn 1: as sent
    chat(base, "ui-open-agent", history(8, 200))  # turn 2: rewritten
    m = history(8, 200) + [{"role": "assistant", "content": "mock reply"}, {"role": "user", "content": "Go on."}]
    chat(base, "ui-open-agent", m, strategy="off")  # turn 3: as sent
    quoted = quote(sid, safe="")
    turns = open_admin(base, f"/admin/sessions/{quoted}/turns?messages=false")["turns"]
    assert [t["rewritten"] for t in turns] == [False, True, False]
    href = "#/s/" + quoted

    with playwright_api.sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{base}/ui/")
        # Straight to the sessions: no token form, no token to forget.
        link = page.locator(f"tr.session[data-id='{sid}'] td.id a")
        expect(link).to_have_attribute("href", href)
        assert link.text_content() == sid
        assert not page.is_visible("#login")
        assert not page.is_visible("#logout")
        # A real link: its address opens the session in a new tab, with the newest rewritten turn side by side.
        second = browser.new_page(viewport={"width": 1400, "height": 1000})
        second.on("pageerror", lambda e: errors.append(str(e)))
        second.goto(f"{base}/ui/{link.get_attribute('href')}")
        second.wait_for_selector("#turn-view:not([hidden])")
        assert second.text_content("#session-id") == sid
        assert second.text_content("#turn-title").startswith("Turn 2 ·")
        expect(second.locator("tr.turn.selected")).to_have_attribute("data-turn", "2")
        t1 = open_admin(base, f"/admin/sessions/{quoted}/turns?offset=1&limit=1")["turns"][0]
        expect(second.locator("#turn-sent .msg")).to_have_count(len(t1["messages_sent"]))
        # The rewrite shows on the history's side: what it replaced (cleared, summarised) or left out (folded, cut).
        replaced = sum(len(f.get("replaces", [])) for f in t1["sent_from"])
        assert second.locator("#turn-history .msg.state-replaced").count() == replaced
        changed = second.locator("#turn-history .msg.state-replaced, #turn-history .msg.state-dropped").count()
        assert changed >= 1
        assert not second.is_visible("#login")
        # Following the link in the first tab does the same.
        link.click()
        page.wait_for_selector("#turn-title:has-text('Turn 2 ·')")
        assert page.url.endswith(href)
        assert errors == [], errors
        browser.close()


def test_a_turn_ctxgate_did_not_count_says_so(open_inspector):
    base, _ = open_inspector
    # A short streamed request that asks for no usage: clearly under the window, so sent as it came without being
    # counted, and the upstream reports no usage for it either.
    with httpx.Client(trust_env=False, timeout=30) as c:
        r = c.post(
            f"{base}/v1/chat/completions",
            json={"model": "mock-model", "stream": True, "messages": [{"role": "user", "content": "hi, uncounted"}]},
            headers={"authorization": "Bearer sk-ui", "x-session-id": "ui-uncounted"},
        )
    assert r.status_code == 200, r.text
    quoted = quote(r.headers["x-ctxgate-session"], safe="")
    (turn,) = open_admin(base, f"/admin/sessions/{quoted}/turns?messages=false")["turns"]
    assert turn["turn"] == 1
    assert turn["tokens"]["client"] is None and turn["tokens"]["sent"] is None, turn

    with playwright_api.sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{base}/ui/#/s/{quoted}")
        cell = page.locator("tr.turn[data-turn='1'] td.not-counted")
        expect(cell).to_have_text("not counted: sent as it came / 6000")
        assert "sent this request as it came without counting" in cell.get_attribute("title")
        assert "?" not in page.text_content("tr.turn[data-turn='1']")
        assert errors == [], errors
        browser.close()


def gemini_history(turns: int, words: int) -> list[dict]:
    c = [{"role": "user", "parts": [{"text": "<session_context>linux</session_context>"}, {"text": "Fix the build."}]}]
    for i in range(turns):
        c.append({"role": "model", "parts": [
            {"text": "thinking it over", "thought": True},
            {"functionCall": {"id": f"fc_{i}", "name": "run_shell_command", "args": {"command": f"make step{i}"}},
             "thoughtSignature": f"CiQBsig{i}=="},
        ]})
        output = " ".join(f"line{i}-{w}" for w in range(words))
        c.append({"role": "user", "parts": [
            {"functionResponse": {"id": f"fc_{i}", "name": "run_shell_command", "response": {"output": output}}}]})
    return c


def test_a_gemini_session_is_shown_in_its_own_shape(open_inspector):
    base, _ = open_inspector
    with httpx.Client(trust_env=False, timeout=30) as c:
        for contents in (gemini_history(1, 20), gemini_history(8, 200)):
            r = c.post(
                f"{base}/v1beta/models/mock-model:generateContent",
                json={"contents": contents, "systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]}},
                headers={"x-goog-api-key": "AIza-ui"},
            )
            assert r.status_code == 200, r.text
    sid = r.headers["x-ctxgate-session"]
    quoted = quote(sid, safe="")
    session = open_admin(base, f"/admin/sessions/{quoted}")
    assert session["dialect"] == "gemini"
    turns = open_admin(base, f"/admin/sessions/{quoted}/turns?messages=false")["turns"]
    assert [t["rewritten"] for t in turns] == [False, True]

    with playwright_api.sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{base}/ui/#/s/{quoted}")
        page.wait_for_selector("#turn-view:not([hidden])")
        history = page.text_content("#turn-history")
        # parts read as what they are, not as raw JSON
        assert "→ run_shell_command(" in history and "[fc_0]" in history, history[:500]
        assert "← response of run_shell_command  [fc_0]: line0-0" in history, history[:500]
        assert "[thought] thinking it over" in history
        assert '"functionCall"' not in history
        sent = page.text_content("#turn-sent")
        assert "← response of run_shell_command" in sent
        assert errors == [], errors
        browser.close()


class _AttackerSite(http.server.BaseHTTPRequestHandler):
    """Serves `page` (set on the class) at every path: the attacker's site, on another loopback origin."""

    page = b""

    def do_GET(self):  # noqa: N802 (the standard library's name)
        self.send_response(200)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("content-length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args):
        pass


REFUSED = "refused a request that a web page may have sent"


def test_a_page_of_another_origin_cannot_drive_the_admin_api(open_inspector):
    base, log = open_inspector
    sid = chat(base, "ui-open-victim", [{"role": "user", "content": "the real history"}])
    quoted = quote(sid, safe="")
    with httpx.Client(trust_env=False, timeout=30) as c:
        export = c.get(f"{base}/admin/sessions/{quoted}/export").text
    forged = export.replace("the real history", "FORGED BY A WEB PAGE")
    assert forged != export
    # The attacker's page: a no-cors text/plain import over the victim (the request is sent, only the answer is
    # opaque) and a body-less compress; then it says it is done.
    _AttackerSite.page = f"""<!doctype html><title>attack</title><script>
      const gw = {json.dumps(base)};
      (async () => {{
        let sent = 0;
        for (const [path, init] of [
          ["/admin/sessions/import?replace=true", {{method: "POST", mode: "no-cors", body: {json.dumps(forged)},
                                                   headers: {{"content-type": "text/plain"}}}}],
          ["/admin/sessions/{quoted}/compress", {{method: "POST", mode: "no-cors"}}],
        ]) {{
          try {{ await fetch(gw + path, init); sent += 1; }} catch (e) {{ document.body.append(String(e)); }}
        }}
        document.title = "done " + sent;
      }})();
    </script>""".encode()
    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AttackerSite)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    port = attacker.server_address[1]
    refused_before = log.read_text(errors="replace").count(REFUSED)
    try:
        with playwright_api.sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page()
            # Another site (localhost, not 127.0.0.1), and the same site on another port: both other origins.
            for origin in (f"http://localhost:{port}", f"http://127.0.0.1:{port}"):
                page.goto(f"{origin}/attack.html")
                page.wait_for_function("document.title === 'done 2'")
            browser.close()
    finally:
        attacker.shutdown()
    text = json.dumps(open_admin(base, f"/admin/sessions/{quoted}")["messages"])
    assert "the real history" in text and "FORGED" not in text, text
    # The four requests reached the gateway, and each was refused with a warning.
    deadline = time.monotonic() + 5
    refused = 0
    while time.monotonic() < deadline:
        refused = log.read_text(errors="replace").count(REFUSED) - refused_before
        if refused >= 4:
            break
        time.sleep(0.1)
    assert refused == 4, log.read_text(errors="replace")[-3000:]


def test_a_page_whose_name_was_rebound_to_loopback_cannot_read_the_sessions(open_inspector):
    base, _ = open_inspector
    sid = chat(base, "ui-open-rebound", [{"role": "user", "content": "secret history"}])
    port = base.rsplit(":", 1)[1]
    with playwright_api.sync_playwright() as p:
        # DNS rebinding: the attacker's name now resolves to 127.0.0.1, so its page and the gateway share an origin
        # and the browser sends the attacker's name as the Host.
        browser = launch(p, "--host-resolver-rules=MAP rebound.test 127.0.0.1")
        page = browser.new_page()
        page.goto(f"http://rebound.test:{port}/ui/")
        page.wait_for_selector("#error:has-text('not open to this page')")
        assert not page.is_visible("#login")
        status, body = page.evaluate(
            "async () => { const r = await fetch('/admin/sessions'); return [r.status, await r.text()]; }"
        )
        assert status == 403, body
        assert sid not in body and "rebound.test" in body, body
        # The same browser on the gateway's own loopback name is served.
        page.goto(f"{base}/ui/")
        page.wait_for_selector(f"tr.session[data-id='{sid}']")
        browser.close()
