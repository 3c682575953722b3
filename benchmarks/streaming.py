"""Streaming a long reply: the cost of `answer_delta` handling as the reply grows.

A scripted model streams one reply of N characters in 4-character chunks (a long `Thought:`, then
`Final Answer: 5`), in text ReAct and in native mode. The baseline, measured in the same run, is the
same reply with streaming off (the loop parses the whole text once). The ratio streamed / unstreamed
at two sizes shows whether the per-chunk work grows with the text already received: a linear scan
keeps the streamed cost per character flat, so the ratio stays about the same when N doubles.

Run: .venv/bin/python benchmarks/streaming.py [--sizes 65000,130000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from thinkloop import Agent, Budget, tool
from thinkloop.testing import ScriptedModel


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def reply(size: int) -> str:
    return "Thought: " + "let me think about it " * (size // 22) + "\nFinal Answer: 5"


async def timed(size: int, *, mode: str, stream: bool) -> float:
    model = ScriptedModel(
        [reply(size)], tools=mode == "native", streaming=stream, stream_chunk=4, record=False
    )
    agent = Agent(model, tools=[add], mode=mode, budget=Budget(timeout=600))  # type: ignore[arg-type]
    started = time.perf_counter()
    if stream:
        async for event in agent.stream("What is 2+3?"):
            last = event
        assert last.type == "done" and last.result.output == "5", last
    else:
        result = await agent.run("What is 2+3?")
        assert result.output == "5", result.output
    return time.perf_counter() - started


async def main(sizes: list[int]) -> None:
    print("| reply | mode | unstreamed | streamed (4-char chunks) | streamed per 1,000 chars | ratio |")
    print("|---|---|---|---|---|---|")
    for size in sizes:
        for mode in ("react", "native"):
            base = min([await timed(size, mode=mode, stream=False) for _ in range(3)])
            streamed = min([await timed(size, mode=mode, stream=True) for _ in range(2)])
            per = streamed / size * 1000
            print(
                f"| {size:,} chars | {mode} | {base:.3f} s | {streamed:.3f} s | {per * 1000:.1f} ms | {streamed / base:.1f}x |"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="65000,130000")
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes.split(",")]))
