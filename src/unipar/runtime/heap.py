"""Keep Python's cyclic garbage collector off the training path.

A worker holds several hundred thousand long-lived Python objects (torch, Ray, the
model and its optimizer); each full (generation 2) collection walks them all, which
took 130-300 ms in a worker here, longer than a whole step of a small model, at a
moment nobody chose. Moving the objects alive once the state is built into the
permanent generation (``gc.freeze``, CPython >= 3.7: "gc.freeze() ... to avoid ...
collections" of long-lived objects) leaves the collector only what the steps allocate;
training frameworks do the same for the same reason (Megatron-LM's ``--manual-gc``).
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect what a previous formation left behind, then freeze what is alive now
    (called once the model, optimizer and data are built, before the first step)."""
    gc.unfreeze()  # objects of an earlier formation may be garbage by now
    gc.collect()
    gc.freeze()
