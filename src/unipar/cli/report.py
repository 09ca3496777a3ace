"""``unipar report RUN_DIR``: a picture of a run from its metrics."""

from __future__ import annotations

import argparse


def run_report(args: argparse.Namespace) -> int:
    # the pictures' modules read the planner's types, which load torch
    from unipar.viz.run_report import report_run  # noqa: PLC0415 (heavy: torch)

    print(f"report: {report_run(args.run_dir)}")
    return 0


def add_report_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "report",
        help="draw RUN_DIR/report.png: loss, tokens/s and learning rate over samples, "
        "restarts and resizes marked (needs pip install unipar[plot])",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with metrics.jsonl")
    parser.set_defaults(handler=run_report)
