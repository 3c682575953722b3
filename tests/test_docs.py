"""Every ```python example in README.md and docs/*.md runs (unless marked `<!-- not run: reason -->`)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"(<!-- not run: [^>]*-->\s*)?```python\n(.*?)```", re.DOTALL)


def _examples() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, match in enumerate(_BLOCK.finditer(path.read_text(encoding="utf-8"))):
            if match.group(1) is None:
                found.append((f"{path.name}#{i + 1}", match.group(2)))
    return found


@pytest.mark.parametrize(("name", "code"), _examples(), ids=[n for n, _ in _examples()])
def test_example_runs(name: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("THINKLOOP_HOME", str(tmp_path / "home"))
    namespace: dict[str, object] = {"__name__": "__example__"}
    if "await " in code and "asyncio.run(" not in code:  # top-level await, as in a notebook
        body = "\n".join(f"    {line}" for line in code.splitlines())
        code = f"async def __example__():\n{body}\n    return locals()\n"
        exec(compile(code, name, "exec"), namespace)
        asyncio.run(namespace["__example__"]())  # type: ignore[operator]
    else:
        exec(compile(code, name, "exec"), namespace)
