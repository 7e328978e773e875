"""The environment variables docs/clients.md gives the official Python SDKs, exactly as given: `OPENAI_BASE_URL`
with `/v1` (the openai SDK appends `/chat/completions`, `/responses`) and `ANTHROPIC_BASE_URL` without it (the
anthropic SDK appends `/v1/messages`, as Claude Code does). Each client is built with no base URL of its own, and each
request must reach a path ctxgate manages (it names the session)."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from ctxtest import MODEL, Gateway, a_text, completion, r_text


def test_openai_base_url(gw: Gateway, http_client: httpx.Client, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_BASE_URL", gw.base_url)  # http://127.0.0.1:PORT/v1
    client = openai.OpenAI(api_key=gw.api_key, http_client=http_client, max_retries=0)
    gw.mock.script(completion("via chat completions"), r_text("via the Responses API"))
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content == "via chat completions"
    assert client.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"}]).output_text == (
        "via the Responses API"
    )
    assert [(httpx.URL(ex.url).path, bool(ex.session)) for ex in gw.tap.exchanges] == [
        ("/v1/chat/completions", True),
        ("/v1/responses", True),
    ]


def test_anthropic_base_url(gw: Gateway, http2_client, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", gw.root)  # http://127.0.0.1:PORT, no /v1
    client = anthropic.Anthropic(api_key=gw.api_key, http_client=http2_client, max_retries=0)
    gw.mock.script(a_text("via Messages"))
    msg = client.messages.create(model="claude-mock-4", max_tokens=50, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text == "via Messages"
    assert [(httpx.URL(ex.url).path, bool(ex.session)) for ex in gw.tap.exchanges] == [("/v1/messages", True)]
