"""Per-step overhead of the thinkloop loop, concurrency at scale, and import time.

Each figure is a ratio against a baseline measured in the same run (these machines are noisy):
- per-step overhead of 10- and 50-step runs with a zero-latency model vs a raw asyncio loop doing the
  same work (model call, argument validation with pydantic, dispatch, append);
- 1,000 and 10,000 concurrent 10-step runs with 20 ms model latency: wall time vs the ideal 0.2 s, and
  the peak RSS added per run (each scenario in a fresh process);
- `import thinkloop` time vs `import json` (both in fresh processes).

Run: .venv/bin/python benchmarks/overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from pydantic import BaseModel

from thinkloop import Agent, Budget, ModelRequest, ModelResponse, ToolCall, Usage, _aio, tool
from thinkloop.testing import FunctionModel


@tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def add_sync(a: int, b: int) -> int:
    """Add two integers (a sync function: run in a worker thread)."""
    return a + b


def _scripted(steps: int, latency: float = 0.0) -> FunctionModel:
    """A model that calls `add` for `steps - 1` turns, then answers; it reports usage (no estimation)."""
    usage = Usage(input_tokens=10, output_tokens=5, requests=1)

    def reply(request: ModelRequest) -> ModelResponse:
        if request.turn < steps - 1:
            call = ToolCall(id=f"c{request.turn}", name="add", arguments={"a": request.turn, "b": 1})
            return ModelResponse(tool_calls=[call], usage=usage)
        return ModelResponse(text="done", usage=usage)

    return FunctionModel(
        reply, latency=latency, streaming=False, record=False
    )  # no request log: the engine is measured


# ------------------------------------------------------------------------------------ raw baseline


class _AddArgs(BaseModel):
    a: int
    b: int


async def _raw_loop(steps: int, latency: float = 0.0) -> list[dict[str, Any]]:
    """The same work without an engine: call, validate, dispatch, append."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]

    async def model(turn: int) -> dict[str, Any]:
        if latency:
            await asyncio.sleep(latency)
        if turn < steps - 1:
            return {"tool_calls": [{"id": f"c{turn}", "name": "add", "arguments": {"a": turn, "b": 1}}]}
        return {"text": "done"}

    for turn in range(steps):
        reply = await model(turn)
        messages.append({"role": "assistant", **reply})
        if "tool_calls" not in reply:
            break
        for call in reply["tool_calls"]:
            args = _AddArgs.model_validate(call["arguments"])
            result = await add.function(args.a, args.b)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(result)})
    return messages


# ---------------------------------------------------------------------------------------- scenarios


async def per_step(steps: int, repeats: int) -> tuple[float, float]:
    """Median µs per step of thinkloop and of the raw loop."""
    agent = Agent(_scripted(steps), tools=[add], budget=Budget(max_steps=steps + 1))
    ours, raw = [], []
    for _ in range(repeats):  # the model is stateless (it answers by `request.turn`): agent and model reused
        t0 = time.perf_counter()
        result = await agent.run("go")
        ours.append((time.perf_counter() - t0) / steps)
        assert result.output == "done" and result.steps == steps, result
        t0 = time.perf_counter()
        await _raw_loop(steps)
        raw.append((time.perf_counter() - t0) / steps)
    return statistics.median(ours) * 1e6, statistics.median(raw) * 1e6


async def concurrent(runs: int, latency: float) -> dict[str, float]:
    agent = Agent(_scripted(10, latency), tools=[add], budget=Budget(max_steps=11))
    gc.collect()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    results = await asyncio.gather(*(agent.run("go") for _ in range(runs)))
    wall = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert all(r.output == "done" for r in results)
    t0 = time.perf_counter()
    await asyncio.gather(*(_raw_loop(10, latency) for _ in range(runs)))
    raw_wall = time.perf_counter() - t0
    return {"wall": wall, "raw_wall": raw_wall, "kib_per_run": (rss1 - rss0) / runs}


def _fresh(code: str) -> float:
    # with bytecode caches, as a user's installed package has them (PYTHONDONTWRITEBYTECODE=1, set on some
    # machines, would compile every module at every import); the first import of each module writes them
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return float(out.stdout.strip())


def import_time(repeats: int) -> tuple[float, float]:
    timer = "import time; t=time.perf_counter(); import {m}; print(time.perf_counter()-t)"
    _fresh(timer.format(m="thinkloop"))  # writes the bytecode caches, if missing
    ours = statistics.median(_fresh(timer.format(m="thinkloop")) for _ in range(repeats))
    base = statistics.median(_fresh(timer.format(m="json")) for _ in range(repeats))
    return ours * 1000, base * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats and no 10,000-run scenario")
    parser.add_argument("--concurrent", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.concurrent:  # child process of one concurrency scenario, on the event loop asked for
        os.environ[_aio.ENV] = args.loop
        print(json.dumps(_aio.run(concurrent(args.concurrent, 0.02))))
        return
    repeats = 5 if args.quick else 20
    s10, r10 = asyncio.run(per_step(10, repeats))
    s50, r50 = asyncio.run(per_step(50, repeats))
    print(f"per step, 10-step run: {s10:.1f} µs (raw loop {r10:.1f} µs; ratio {s10 / r10:.1f}x)")
    print(f"per step, 50-step run: {s50:.1f} µs (raw loop {r50:.1f} µs; ratio {s50 / r50:.1f}x)")
    print(f"history growth: 50-step / 10-step per-step cost = {s50 / s10:.2f}x (target <= 1.1x)")
    loops = ["asyncio", "uvloop"] if importlib.util.find_spec("uvloop") else ["asyncio"]
    for runs in (1000,) if args.quick else (1000, 10000):
        # asyncio's loop and uvloop (the loop of thinkloop's entry points when installed), with the entry
        # points' collector threshold; and with Python's (THINKLOOP_GC=python: an application's own loop)
        for loop, collector in [(loop, "auto") for loop in loops] + [(loops[-1], "python")]:
            command = [sys.executable, __file__, "--concurrent", str(runs), "--loop", loop]
            env = {**os.environ, _aio.GC_ENV: collector}
            out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
            c = json.loads(out)
            print(
                f"{runs} concurrent 10-step runs, 20 ms latency, {loop}, collector {collector}: {c['wall']:.2f} s = "
                f"{c['wall'] / 0.2:.2f}x the ideal 0.2 s (raw loop {c['raw_wall']:.2f} s); "
                f"peak RSS +{c['kib_per_run']:.1f} KiB per run"
            )
    ours, base = import_time(5)
    print(f"import thinkloop: {ours:.0f} ms (import json {base:.1f} ms)")


if __name__ == "__main__":
    main()
