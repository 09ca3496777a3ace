"""Drawing with matplotlib (the ``plot`` extra), imported only when a picture is asked for,
with the non-interactive Agg backend. Each function takes data from
:mod:`unipar.viz.timeline` / :mod:`unipar.viz.bars` and writes one PNG."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unipar.errors import ConfigError
from unipar.viz.bars import Bar
from unipar.viz.timeline import BlockKind, Timeline

COLORS = {
    BlockKind.FORWARD: "#4C72B0",
    BlockKind.BACKWARD: "#DD8452",
    BlockKind.RECOMPUTE: "#8172B3",
    BlockKind.TP_COMM: "#C44E52",
    BlockKind.P2P: "#8C8C8C",
    BlockKind.GRAD_SYNC: "#55A868",
    BlockKind.OPTIMIZER: "#937860",
}
PART_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3"]
DPI = 80


def require_plot_extra() -> None:
    """A clear error naming the extra when matplotlib is not installed (without
    importing it: a run that will draw at its end checks this before it starts)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            "pictures need matplotlib, which is not installed; install the extra with "
            "`pip install unipar[plot]` (or `pip install matplotlib`)"
        )


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or a clear error naming the extra."""
    require_plot_extra()
    import matplotlib  # noqa: PLC0415 (heavy: matplotlib, the plot extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (heavy: matplotlib, the plot extra)

    return plt


def draw_timelines(timelines: Sequence[Timeline], path: Path, *, unit: float = 1e-3) -> Path:
    """One panel per timeline, one row per pipeline stage (grouped by rank), blocks
    coloured by kind, idle stretches hatched and labelled with the rank's bubble share.
    Times in milliseconds (``unit`` seconds)."""
    plt = pyplot()
    heights = [max(1.6, 0.42 * t.stages + 0.9) for t in timelines]
    figure, axes = plt.subplots(
        len(timelines),
        1,
        figsize=(13, sum(heights)),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    span = max(t.step_s for t in timelines) / unit
    for axis, timeline in zip(axes[:, 0], timelines, strict=True):
        _draw_timeline(axis, timeline, unit)
        axis.set_xlim(0, span * 1.13)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", hatch="///", edgecolor="0.6"))
    names = [k.value for k in COLORS] + ["idle (bubble)"]
    figure.legend(handles, names, loc="lower center", ncol=len(names), fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    return _save(figure, path, plt)


def _rows(timeline: Timeline) -> dict[int, int]:
    """Row of each stage: rank by rank, each rank's stages in order."""
    order = sorted(range(timeline.stages), key=lambda s: (s % timeline.pp, s))
    return {stage: row for row, stage in enumerate(order)}


def _draw_timeline(axis: Any, timeline: Timeline, unit: float) -> None:
    rows, pp = _rows(timeline), timeline.pp
    origin = min(b.start_s for b in timeline.blocks)
    label_blocks = len(timeline.blocks) <= 300
    for block in timeline.blocks:
        targets = (
            [block.stage]
            if block.kind not in (BlockKind.GRAD_SYNC, BlockKind.OPTIMIZER)
            else [s for s in range(timeline.stages) if s % pp == block.rank]
        )
        start = (block.start_s - origin) / unit
        for stage in targets:
            axis.barh(
                rows[stage],
                block.seconds / unit,
                left=start,
                height=0.8,
                color=COLORS[block.kind],
                edgecolor="white",
                linewidth=0.3,
            )
        if (
            label_blocks
            and block.microbatch is not None
            and block.kind in (BlockKind.FORWARD, BlockKind.BACKWARD)
        ):
            axis.text(
                start + block.seconds / unit / 2,
                rows[block.stage],
                str(block.microbatch),
                ha="center",
                va="center",
                fontsize=6,
                color="white",
            )
    step = timeline.step_s / unit
    for rank in range(pp):
        mine = [rows[s] for s in range(timeline.stages) if s % pp == rank]
        for start, end in timeline.idle_gaps(rank):
            for row in mine:
                axis.barh(
                    row,
                    (end - start) / unit,
                    left=(start - origin) / unit,
                    height=0.8,
                    facecolor="none",
                    hatch="///",
                    edgecolor="0.75",
                    linewidth=0,
                )
        axis.text(
            step * 1.01,
            sum(mine) / len(mine),
            f"bubble {100 * timeline.bubble_share(rank):.1f}%",
            va="center",
            fontsize=8,
        )
    axis.set_yticks(list(rows.values()))
    axis.set_yticklabels([f"rank {s % pp} · stage {s}" for s in rows], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel("ms")
    title = f"{timeline.title}\nstep {step:.1f} ms, bubble {100 * timeline.bubble:.1f}%"
    if timeline.predicted_bubble_share is not None:
        title += f" (cost model: {100 * timeline.predicted_bubble_share:.1f}%)"
    axis.set_title(title, fontsize=9, loc="left")


def draw_bars(
    bars: Sequence[Bar],
    part_names: Sequence[str],
    path: Path,
    *,
    unit_label: str,
    title: str,
    capacity: float | None = None,
) -> Path:
    """Stacked bars, one per plan (rejected plans' labels marked), with an optional
    capacity line."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(max(7, 2.2 * len(bars)), 5.5))
    positions = range(len(bars))
    bottoms = [0.0] * len(bars)
    for index, name in enumerate(part_names):
        values = [bar.parts[index] for bar in bars]
        axis.bar(
            positions,
            values,
            bottom=bottoms,
            color=PART_COLORS[index % len(PART_COLORS)],
            label=name.replace("_", " "),
            width=0.6,
        )
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    for x, bar in zip(positions, bars, strict=True):
        axis.text(x, bar.total, f"{bar.total:.3g}", ha="center", va="bottom", fontsize=8)
    if capacity is not None:
        axis.axhline(capacity, color="black", linestyle="--", linewidth=1)
        axis.text(
            len(bars) - 0.5,
            capacity,
            f"capacity {capacity:.3g}",
            ha="right",
            va="bottom",
            fontsize=8,
        )
    labels = [_wrap(("REJECTED: " if not b.fits else "") + b.label) for b in bars]
    axis.set_xticks(list(positions))
    axis.set_xticklabels(labels, fontsize=7)
    axis.set_ylabel(unit_label)
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    return _save(figure, path, plt)


def _wrap(text: str, width: int = 22) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + len(word) > width:
            lines.append(line)
            line = ""
        line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


def _save(figure: Any, path: Path, plt: Any) -> Path:
    path = Path(path)
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path
