"""Runtime tool discovery: prompt size of a run showing all 300 tools vs the same task with discovery.

The task needs 2 of 300 tools (a weather forecast and a currency conversion). Both runs are scripted:
- all tools shown: the model calls the two tools, then answers (2 model calls);
- discovery (`ToolDiscovery(always=["calculator"])`): the model calls `discover_tools` twice, then the
  two tools, then answers (4 model calls).

Measured, each as a ratio of the two runs:
- prompt tokens of the whole run, as thinkloop estimates them (chars/3 + 1 per text; the same estimate
  for both runs) — the run's `usage.input_tokens`;
- bytes of the JSON request bodies the real `OpenAIModel` sends, captured by a loopback
  OpenAI-compatible server (what a provider would bill, in bytes);
and the cost of the search itself: building the BM25 index of 300 tools, and one query.

Run: .venv/bin/python benchmarks/discovery.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from thinkloop import Agent
from thinkloop._discovery import DISCOVER_TOOLS, ToolDiscovery, ToolIndex
from thinkloop.models import OpenAIModel
from thinkloop.testing import ScriptedModel
from thinkloop.testing_server import Completion, OpenAICompatibleServer, tool_call

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from discovery_catalogue import catalogue

GOAL = "What will the weather be in Paris tomorrow, and how much is 100 USD in EUR?"
CALLS = [
    ("get_weather_forecast", {"city": "Paris", "days": 1}),
    ("convert_currency", {"amount": 100, "from_currency": "USD", "to_currency": "EUR"}),
]
DISCOVERIES = ["weather forecast for a city", "convert money between currencies"]
ANSWER = "Paris: 18°C with light rain; 100 USD is 92.00 EUR."


def script(discover: bool) -> list[Any]:
    steps: list[Any] = []
    if discover:
        steps += [{"tool_calls": [{"name": DISCOVER_TOOLS, "args": {"query": q}}]} for q in DISCOVERIES]
    steps.append({"tool_calls": [{"name": n, "args": a} for n, a in CALLS]})
    return [*steps, ANSWER]


def wire_script(discover: bool) -> list[Any]:
    steps: list[Any] = []
    if discover:
        steps += [Completion(tool_calls=[tool_call(DISCOVER_TOOLS, {"query": q})]) for q in DISCOVERIES]
    steps.append(Completion(tool_calls=[tool_call(n, a) for n, a in CALLS]))
    return [*steps, Completion(text=ANSWER)]


def agent_for(model: Any, discover: bool) -> Agent:
    discovery = ToolDiscovery(always=["calculator"]) if discover else None
    return Agent(model, tools=catalogue(), discovery=discovery)


async def estimated(discover: bool) -> tuple[int, int, list[int]]:
    model = ScriptedModel(script(discover))
    result = await agent_for(model, discover).run(GOAL)
    assert result.output == ANSWER, result.output
    per_call = [len(r.tools) for r in model.requests]
    return result.usage.input_tokens, len(model.requests), per_call


async def wire_bytes(discover: bool) -> list[int]:
    async with OpenAICompatibleServer(wire_script(discover)) as server:
        model = OpenAIModel("fake-model", base_url=server.url, api_key="test")
        result = await agent_for(model, discover).run(GOAL)
        await model.aclose()
        await asyncio.sleep(0.05)  # let the server see the client's connection close before it stops
    assert result.output == ANSWER, result.output
    return [len(r.body) for r in server.requests if r.path.endswith("/chat/completions")]


def search_cost() -> tuple[float, float]:
    definitions = [t.definition for t in catalogue()]
    builds, queries = [], []
    for _ in range(20):
        start = time.perf_counter()
        index = ToolIndex(definitions)
        builds.append(time.perf_counter() - start)
        start = time.perf_counter()
        for query in DISCOVERIES * 50:
            index.search(query, 5)
        queries.append((time.perf_counter() - start) / 100)
    return statistics.median(builds), statistics.median(queries)


async def main() -> None:
    tokens_all, calls_all, tools_all = await estimated(False)
    tokens_disc, calls_disc, tools_disc = await estimated(True)
    bytes_all = await wire_bytes(False)
    bytes_disc = await wire_bytes(True)
    build, query = search_cost()
    print(f"task needs 2 of {len(catalogue())} tools")
    print(f"tools per model call: all shown {tools_all}, with discovery {tools_disc}")
    print(
        f"estimated prompt tokens of the run: all shown {tokens_all:,} ({calls_all} calls), "
        f"with discovery {tokens_disc:,} ({calls_disc} calls) -> {tokens_all / tokens_disc:.1f}x fewer"
    )
    print(
        f"per model call on average: all shown {tokens_all // calls_all:,} tokens, "
        f"with discovery {tokens_disc // calls_disc:,}"
    )
    print(
        f"OpenAI request bodies (loopback): all shown {sum(bytes_all):,} B {bytes_all}, "
        f"with discovery {sum(bytes_disc):,} B {bytes_disc} -> {sum(bytes_all) / sum(bytes_disc):.1f}x fewer"
    )
    print(f"BM25 index of 300 tools: built in {build * 1e3:.2f} ms; one query {query * 1e6:.0f} µs")


if __name__ == "__main__":
    asyncio.run(main())
