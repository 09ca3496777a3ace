"""``unipar calibrate``: what the planner measured of this machine and learned from runs
(``--show``), or forget what it learned (``--reset``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from unipar.cluster.learned_fit import fit_factors
from unipar.cluster.run_records import OVERLOAD, all_records, drop_records, records_dir


def run_calibrate(args: argparse.Namespace) -> int:
    directory = Path(args.cache_dir) if args.cache_dir else records_dir()
    if args.reset:
        dropped = drop_records(directory)
        print(
            f"dropped the records of runs on {dropped} cluster(s) from {directory}: plans "
            "use the clusters' rates as specified again. The CPU calibration is kept "
            f"(remove {directory}/cpu-calibration-*.json to measure this machine again)"
        )
        return 0
    print("\n".join(show(directory)))
    return 0


def show(directory: Path) -> list[str]:
    """The CPU calibrations and, per cluster, the learned factors and the run records."""
    return [*_calibrations(directory), "", *_learned(directory)]


def _calibrations(directory: Path) -> list[str]:
    lines = [f"CPU calibrations in {directory}:"]
    files = sorted(directory.glob("cpu-calibration-*.json"))
    for path in files:
        try:
            data = json.loads(path.read_text())
            about, device, link = data["machine"], data["device"], data["link"]
        except (OSError, ValueError, KeyError):
            lines.append(f"  {path.name}: unreadable (measured again when needed)")
            continue
        lines += [
            f"  {about.get('host')} ({about.get('cpu')}, {about.get('cpus')} cores, torch "
            f"{about.get('torch')}), measured {_when(data['measured_at'])}:",
            f"    matmul {device['peak_flops_32bit'] / 1e9:.1f} GFLOP/s per worker, "
            f"kernels {device['memory_bandwidth'] / 1e9:.2f} GB/s, per op "
            f"{device['kernel_overhead_s'] * 1e6:.0f} us, all-reduce "
            f"{link['bandwidth'] / 1e9:.2f} GB/s + {link['latency_s'] * 1e6:.0f} us per step",
        ]
    if not files:
        lines.append("  none yet (`unipar plan ... --cluster cpu` or a CPU run measures it)")
    return lines


def _learned(directory: Path) -> list[str]:
    found = all_records(directory)
    if not found:
        return ["learned from runs: nothing yet (every run long enough leaves a record)"]
    lines = ["learned from runs (rates against the spec, fitted from the runs below):"]
    for key, records in found.items():
        fitted = fit_factors(records)
        factors = ", ".join(f"{rate.value} x{value:.2f}" for rate, value in fitted.factors.items())
        lines += [
            "",
            f"cluster {records[-1].cluster_label} [{key}]",
            f"  factors  {factors}" if fitted.runs else "  factors  none (no usable run)",
            f"  from {fitted.runs} run(s); {fitted.kept_apart} kept apart (load average above "
            f"{OVERLOAD:g} x the cores); {fitted.odd} left out as odd (far off the others)",
            f"  {'finished':16s} {'job':14s} {'plan':50s} {'predicted':>9s} {'measured':>9s} "
            f"{'error':>7s}  load",
        ]
        for record in records:
            apart = "  overloaded: kept apart" if record.overloaded else ""
            lines.append(
                f"  {_when(record.finished_at):16s} {record.job[:14]:14s} {record.plan[:50]:50s} "
                f"{record.predicted_s:8.3f}s {record.measured_s:8.3f}s {record.error:+7.1%}  "
                f"{record.load_average:.1f}/{record.cpus}{apart}"
            )
    return lines


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def add_calibrate_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "calibrate",
        help="show what the planner measured of this machine and learned from runs "
        "(--show, the default), or forget what it learned (--reset)",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--show",
        action="store_true",
        help="list the CPU calibration, each cluster's run records and fitted factors",
    )
    what.add_argument(
        "--reset",
        action="store_true",
        help="drop every cluster's run records (the CPU calibration is kept)",
    )
    parser.add_argument(
        "--cache-dir", default=None, help="where unipar keeps them (default: ~/.cache/unipar)"
    )
    parser.set_defaults(handler=run_calibrate)
