"""The loop fuzzer of `tests/test_fuzz_loop.py`, run longer: N seeded runs of malformed, truncated, mixed
and adversarial model outputs (ReAct text and tool-call JSON, native and ReAct mode).

Every run must end with a stop reason, with no exception escaping and every request a valid history.

Run: .venv/bin/python benchmarks/fuzz.py [runs, default 5000] [first seed, default 100000]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_fuzz_loop import fuzz


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    start = time.perf_counter()
    counts = asyncio.run(fuzz(range(first, first + runs)))
    elapsed = time.perf_counter() - start
    print(f"{runs} fuzzed runs (seeds {first}..{first + runs - 1}) in {elapsed:.1f} s, no exception escaped")
    for reason, count in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {reason.value:>15}: {count}")


if __name__ == "__main__":
    main()
