"""`langchain-openai`'s ChatOpenAI through ctxgate: invoke, stream, bind_tools."""

from __future__ import annotations

import httpx
import pytest
from ctxtest import MODEL, Gateway, completion, sse_text, tool_call
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@pytest.fixture
def llm(gw: Gateway, http_client: httpx.Client) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=gw.base_url, api_key=gw.api_key, http_client=http_client, max_retries=0)


def test_invoke(gw: Gateway, llm: ChatOpenAI):
    gw.mock.script(completion("Bonjour."))
    msg = llm.invoke("Say hello in French.")
    assert isinstance(msg, AIMessage) and msg.content == "Bonjour."
    assert msg.usage_metadata and msg.usage_metadata["total_tokens"] == 17
    (up,) = gw.mock.requests()
    assert up["uri"] == "/v1/chat/completions"
    assert up["body"]["messages"] == [{"role": "user", "content": "Say hello in French."}]


def test_stream(gw: Gateway, llm: ChatOpenAI):
    gw.mock.script(sse_text(["Un, ", "deux, ", "trois."]))
    parts = list(llm.stream("Count to three in French."))
    assert "".join(p.content for p in parts) == "Un, deux, trois."
    (up,) = gw.mock.requests()
    assert up["body"]["stream"] is True


@tool
def get_weather(city: str) -> str:
    """Today's weather in a city."""
    return "sunny"


def test_bind_tools(gw: Gateway, llm: ChatOpenAI):
    gw.mock.script(completion(None, [tool_call("call_lc", "get_weather", {"city": "Lyon"})]))
    msg = llm.bind_tools([get_weather]).invoke("Weather in Lyon?")
    assert msg.tool_calls == [{"name": "get_weather", "args": {"city": "Lyon"}, "id": "call_lc", "type": "tool_call"}]
    (up,) = gw.mock.requests()
    assert up["body"]["tools"][0]["function"]["name"] == "get_weather"
