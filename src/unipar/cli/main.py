"""The ``unipar`` command: one subcommand per module of this package."""

from __future__ import annotations

import argparse
import sys

from unipar.cli.calibrate import add_calibrate_parser
from unipar.cli.plan import add_plan_parser
from unipar.cli.report import add_report_parser
from unipar.cli.service import add_service_parsers
from unipar.cli.simulate import add_simulate_parser
from unipar.cli.train import add_train_parser
from unipar.cli.tune import add_tune_parser
from unipar.errors import UniparError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="unipar", description="Simple and automatic distributed machine learning on Ray."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add_train_parser(commands)
    add_plan_parser(commands)
    add_report_parser(commands)
    add_calibrate_parser(commands)
    add_simulate_parser(commands)
    add_tune_parser(commands)
    add_service_parsers(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except UniparError as error:
        print(f"unipar: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("unipar: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
