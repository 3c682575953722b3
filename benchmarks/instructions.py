"""Instructions a loop step executes, counted by valgrind's callgrind: deterministic, unlike wall time.

The scenario of `overhead.py`'s concurrency benchmark, smaller: N concurrent 10-step runs of the scripted
model (20 ms latency) calling an async `add` tool, on thinkloop's entry-point loop (`_aio.run`: uvloop when
installed, the entry points' collector threshold). The count is the whole process — asyncio, the garbage
collector, the test double and its 20 ms sleep included — minus the same process with no runs, divided by
the steps. With `PYTHONHASHSEED=0` two counts of one tree agree to within a few instructions a step;
different trees (or the same code at another path) differ by up to ~1,000 from memory layout alone, so
compare trees at the same path (copy each over one directory in turn, `--src DIR`).

On this kind of machine the 1,000-run wall time is CPU-bound (process CPU time equals wall time), so it
follows the instruction count times the machine's speed of the moment.

Run: .venv/bin/python benchmarks/instructions.py [--runs 200] [--src DIR]   (needs valgrind)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

STEPS = 10


def _child(runs: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import overhead

    from thinkloop import Agent, Budget, _aio

    async def main() -> None:
        agent = Agent(
            overhead._scripted(STEPS, 0.02), tools=[overhead.add], budget=Budget(max_steps=STEPS + 1)
        )
        await agent.run("go")  # warm: imports, caches, the first run's one-off work
        if runs:
            results = await asyncio.gather(*(agent.run("go") for _ in range(runs)))
            assert all(r.output == "done" and r.steps == STEPS for r in results)

    _aio.run(main())


def _count(runs: int, src: str | None) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if src:
        env["PYTHONPATH"] = src
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += [sys.executable, __file__, "--child", str(runs)]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200, help="concurrent 10-step runs (default 200)")
    parser.add_argument("--src", help="a source tree to measure instead of the installed thinkloop")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child)
        return
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind): no instruction count")
        return
    full, empty = _count(args.runs, args.src), _count(0, args.src)
    per_step = (full - empty) / (args.runs * STEPS)
    print(f"{args.runs} concurrent {STEPS}-step runs: {per_step:,.0f} instructions a step (callgrind)")


if __name__ == "__main__":
    main()
