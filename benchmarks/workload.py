"""The job both sides of ddp_vs_torchrun.py train: the demo's byte-level GPT.

``unipar train benchmarks/workload.py`` runs it; the torchrun baseline imports it.
"""

from __future__ import annotations

from unipar.job import Job
from unipar.recipes import gpt_stdlib


def job() -> Job:
    return gpt_stdlib(steps=60, global_batch_size=32)
