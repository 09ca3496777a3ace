"""Pictures of a simulated run (matplotlib, the ``plot`` extra, imported only here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from unipar.errors import ConfigError
from unipar.sched.results import SimResult


def _pyplot():
    try:
        import matplotlib  # noqa: PLC0415 (heavy: matplotlib, the plot extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 (heavy: matplotlib, the plot extra)
    except ImportError:
        raise ConfigError(
            "writing pictures needs matplotlib: pip install 'unipar[plot]' "
            "(or pass --no-plot)"
        ) from None
    return plt


def write_png(result: SimResult, path: Path) -> None:
    """JCT CDF (left) and GPUs per job over time, stacked (right)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    jct = np.sort(result.jcts) / 3600
    left.plot(jct, np.arange(1, len(jct) + 1) / len(jct))
    left.set_xscale("log")
    left.set_xlabel("job completion time (h)")
    left.set_ylabel("fraction of jobs")
    left.set_title(f"{result.policy}: JCT CDF (mean {result.avg_jct:.0f} s)")
    names = sorted({n for _, snap in result.timeline for n in snap})
    index = {n: i for i, n in enumerate(names)}
    times = np.array([t for t, _ in result.timeline]) / 3600
    gpus = np.zeros((len(names), len(times)))
    for c, (_, snap) in enumerate(result.timeline):
        for n, k in snap.items():
            gpus[index[n], c] = k
    right.stackplot(times, gpus, linewidth=0)
    right.set_xlabel("time (h)")
    right.set_ylabel("GPUs (one colour per job)")
    right.set_title("GPUs per job over time")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
