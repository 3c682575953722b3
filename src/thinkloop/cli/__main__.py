"""`python -m thinkloop.cli …`: the same as the `thinkloop` script."""

from . import main

main()
