"""The `thinkloop` script's entry point, outside the `thinkloop` package.

The script has to import `thinkloop.cli` — hence `thinkloop/__init__`, pydantic, typer, rich … (about
0.4 s) — before any of the CLI's own Ctrl-C handling exists: a Ctrl-C then ended the command with a
`KeyboardInterrupt` traceback. This module imports nothing of thinkloop's at its top, so `main` can catch
the interrupt around that import as well as around the command, and end it as the CLI ends any command
cancelled by Ctrl-C: `cancelled` on stderr, exit status 130. `import thinkloop` itself installs no
signal handler: a program using the library keeps Python's own Ctrl-C behaviour.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn

EXIT_CODE = 130  # 128 + SIGINT, as `thinkloop.cli._interrupt.EXIT_CODE` (not imported: see above)


def main() -> None:
    """Run the `thinkloop` command (`thinkloop.cli.main`); a Ctrl-C anywhere, the imports included, ends
    it quietly with 130."""
    try:
        from thinkloop.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        _cancelled()


def _cancelled() -> NoReturn:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # another Ctrl-C must not raise in the last lines
    try:
        sys.stderr.write("cancelled\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed, or the terminal gone
        pass
    sys.exit(EXIT_CODE)
