"""The command line's last line of defence: an error no command expected still ends in one paragraph.

Each command maps thinkloop's own errors to exit codes (`print_error`); what is left — an operating
system error from a path the user gave (a store URL naming a file where a directory belongs, a script
that is a directory) or a bug — is caught here, at the entry point, so the user never sees a traceback.
`THINKLOOP_DEBUG=1` shows it, for a bug report.
"""

from __future__ import annotations

import os
import sys
import traceback

from ._console import printable

DEBUG_VARIABLE = "THINKLOOP_DEBUG"


def describe_os_error(exc: OSError) -> str:
    """`No such file or directory: '/x/y'` — the system's reason and the path, without `[Errno N]`."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    return f"{reason}: {' -> '.join(repr(n) for n in names)}" if names else reason


def report_unexpected(exc: BaseException) -> int:
    """Print one paragraph about `exc` on stderr and return the exit code (1)."""
    if os.environ.get(DEBUG_VARIABLE):
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, OSError):
        message = f"error: {describe_os_error(exc)}; check the path, that it is the right kind (file or directory) and its permissions"
    else:
        message = (
            f"error: unexpected {type(exc).__name__}: {exc} — this is a bug in thinkloop: please report "
            f"it with the traceback that {DEBUG_VARIABLE}=1 prints"
        )
    try:
        sys.stderr.write(printable(message) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr itself is gone: the exit code is all that is left
        pass
    return 1
