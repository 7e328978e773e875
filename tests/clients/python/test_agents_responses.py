"""`openai-agents` on its DEFAULT model (the Responses API, `OpenAIResponsesModel`, chosen by the SDK itself: the
agent names no model and the run no provider) through ctxgate: a tool-using agent loop. Each model turn is scripted
on the mock; the SDK runs the function tool and sends its output back as a `function_call_output` item."""

from __future__ import annotations

import json

import httpx
import pytest
from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
from agents.models import _openai_shared
from ctxtest import Gateway, r_call, r_text
from openai import AsyncOpenAI

set_tracing_disabled(True)

CALLS: list[str] = []


@function_tool
def get_stock(item: str) -> str:
    """How many of an item are in stock."""
    CALLS.append(item)
    return {"apples": "12 in stock", "pears": "none left"}.get(item, "unknown item")


@pytest.fixture
def default_client(gw: Gateway, async_http_client: httpx.AsyncClient):
    """The SDK's default OpenAI client pointed at ctxgate (as `OPENAI_BASE_URL` would), restored afterwards."""
    client = AsyncOpenAI(base_url=gw.base_url, api_key=gw.api_key, http_client=async_http_client, max_retries=0)
    set_default_openai_client(client, use_for_tracing=False)
    yield client
    _openai_shared.set_default_openai_client(None)  # type: ignore[arg-type]


def test_agent_loop_on_the_default_responses_model(gw: Gateway, default_client: AsyncOpenAI):
    CALLS.clear()
    agent = Agent(name="stock", instructions="Answer stock questions with the get_stock tool.", tools=[get_stock])
    gw.mock.script(
        r_call("call_a", "get_stock", {"item": "apples"}, reasoning="Check apples first."),
        r_call("call_p", "get_stock", {"item": "pears"}),
        r_text("12 apples; pears are sold out."),
    )
    result = Runner.run_sync(agent, "Do you have apples and pears?")
    assert result.final_output == "12 apples; pears are sold out."
    assert CALLS == ["apples", "pears"]

    ups = gw.mock.requests()
    assert [u["uri"] for u in ups] == ["/v1/responses"] * 3, "the default model speaks the Responses API"
    first = ups[0]["body"]
    assert first["instructions"] == "Answer stock questions with the get_stock tool."
    assert first["tools"][0]["type"] == "function" and first["tools"][0]["name"] == "get_stock"
    # each turn carries the previous turns' calls and outputs, in order, the reasoning item replayed as sent
    outputs = [[i["output"] for i in u["body"]["input"] if i.get("type") == "function_call_output"] for u in ups]
    assert outputs == [[], ["12 in stock"], ["12 in stock", "none left"]]
    replayed = [i for i in ups[1]["body"]["input"] if i.get("type") == "reasoning"]
    assert replayed and replayed[0]["encrypted_content"] == "gAAAA-mock-call_a"
    calls = [json.loads(i["arguments"]) for i in ups[2]["body"]["input"] if i.get("type") == "function_call"]
    assert calls == [{"item": "apples"}, {"item": "pears"}]
    # needs the Responses pipeline: the loop is one ctxgate session
    sessions = {ex.session for ex in gw.tap.exchanges}
    assert len(gw.tap.exchanges) == 3 and len(sessions) == 1 and None not in sessions, sessions
