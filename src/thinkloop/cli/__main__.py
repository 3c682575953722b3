"""`python -m thinkloop.cli …`: the same as the `thinkloop` script (whose entry point, `_thinkloop_cli`,
also ends a Ctrl-C quietly with 130 — here only once `thinkloop.cli` is imported: `python -m` imports the
package before this module runs)."""

from _thinkloop_cli import main

main()
