"""The ``unipar`` console command (and ``python -m unipar``): loads the commands with
Python's cyclic garbage collector paused, then runs the one asked for.

Loading the commands imports PyTorch and the planner: about a million long-lived
objects, over which the collector's full passes are pure overhead. ``unipar plan`` is
promised within 3 s from a cold process (``benchmarks/plan_cold.py``); on 2 quiet cores
the Llama 3 405B case took 2.80-3.23 s with the collector on and 2.48-2.80 s with it off
(4 alternated runs each). Every other command gets it back once loaded
(``gc.freeze()`` first: what loading made is never scanned again); ``plan``, a short
computation of bounded memory, runs to its end without it."""

from __future__ import annotations

import gc
import sys

SHORT_COMMANDS = frozenset({"plan"})  # run to the end without the cyclic collector


def main() -> int:
    gc.disable()
    # deferred so that it loads with collection paused (torch, the planner)
    from unipar.cli.main import command_named  # noqa: PLC0415 (heavy: collection paused)
    from unipar.cli.main import main as run_command  # noqa: PLC0415 (heavy: collection paused)

    if command_named(sys.argv[1:]) not in SHORT_COMMANDS:
        gc.freeze()
        gc.enable()
    return run_command()
