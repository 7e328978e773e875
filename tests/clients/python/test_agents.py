"""`openai-agents` with `OpenAIChatCompletionsModel` through ctxgate: a multi-turn, tool-using agent run. Each
model turn is scripted on the mock; the SDK runs the tools and sends their results back."""

from __future__ import annotations

import httpx
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from ctxtest import MODEL, Gateway, completion, tool_call
from openai import AsyncOpenAI

set_tracing_disabled(True)

CALLS: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Today's weather in a city."""
    CALLS.append(city)
    return {"Paris": "sunny, 21C", "Berlin": "rain, 14C"}.get(city, "unknown")


def test_multi_turn_tool_using_agent(gw: Gateway, async_http_client: httpx.AsyncClient):
    CALLS.clear()
    client = AsyncOpenAI(base_url=gw.base_url, api_key=gw.api_key, http_client=async_http_client, max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
    )
    gw.mock.script(
        completion(None, [tool_call("call_p", "get_weather", {"city": "Paris"})], id="chatcmpl-1"),
        completion(None, [tool_call("call_b", "get_weather", {"city": "Berlin"})], id="chatcmpl-2"),
        completion("Paris is sunny (21C); Berlin has rain (14C).", id="chatcmpl-3"),
        completion(None, [tool_call("call_p2", "get_weather", {"city": "Paris"})], id="chatcmpl-4"),
        completion("Still sunny in Paris.", id="chatcmpl-5"),
    )
    first = Runner.run_sync(agent, "Compare the weather in Paris and Berlin.")
    assert first.final_output == "Paris is sunny (21C); Berlin has rain (14C)."
    second = Runner.run_sync(agent, first.to_input_list() + [{"role": "user", "content": "And Paris again?"}])
    assert second.final_output == "Still sunny in Paris."
    assert CALLS == ["Paris", "Berlin", "Paris"]

    ups = gw.mock.requests()
    assert [u["uri"] for u in ups] == ["/v1/chat/completions"] * 5
    # each turn carries the previous turns' tool results, in order
    tool_results = [[m["content"] for m in u["body"]["messages"] if m["role"] == "tool"] for u in ups]
    assert tool_results[1] == ["sunny, 21C"]
    assert tool_results[2] == ["sunny, 21C", "rain, 14C"]
    assert tool_results[4] == ["sunny, 21C", "rain, 14C", "sunny, 21C"]
    assert ups[0]["body"]["tools"][0]["function"]["name"] == "get_weather"
    # both runs are one conversation to ctxgate (same system prompt and first user message)
    sessions = {ex.session for ex in gw.tap.exchanges}
    assert len(gw.tap.exchanges) == 5 and len(sessions) == 1 and None not in sessions
