"""The ``unipar`` command: one subcommand per module of this package.

A command line loads only the module of the command it names (``unipar jobs`` does not
import PyTorch, which ``unipar plan`` needs); without one, or with a name that is no
command, every module is loaded, so that ``--help`` and the error list them all."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from unipar.errors import UniparError

Commands = argparse._SubParsersAction

# The imports below are deferred: each command's module loads its own dependencies
# (PyTorch and the planner for train/plan/tune, Ray Tune, the scheduler's policies), and
# a command line pays only for the command it runs.


def _train(commands: Commands) -> None:
    from unipar.cli.train import add_train_parser  # noqa: PLC0415 (heavy: its own modules)

    add_train_parser(commands)


def _plan(commands: Commands) -> None:
    from unipar.cli.plan import add_plan_parser  # noqa: PLC0415 (heavy: its own modules)

    add_plan_parser(commands)


def _report(commands: Commands) -> None:
    from unipar.cli.report import add_report_parser  # noqa: PLC0415 (heavy: its own modules)

    add_report_parser(commands)


def _calibrate(commands: Commands) -> None:
    from unipar.cli.calibrate import add_calibrate_parser  # noqa: PLC0415 (heavy: its own modules)

    add_calibrate_parser(commands)


def _simulate(commands: Commands) -> None:
    from unipar.cli.simulate import add_simulate_parser  # noqa: PLC0415 (heavy: its own modules)

    add_simulate_parser(commands)


def _tune(commands: Commands) -> None:
    from unipar.cli.tune import add_tune_parser  # noqa: PLC0415 (heavy: its own modules)

    add_tune_parser(commands)


def _service(commands: Commands) -> None:
    from unipar.cli.service import add_service_parsers  # noqa: PLC0415 (heavy: its own modules)

    add_service_parsers(commands)


# Each command's name and what registers it, in the order `unipar --help` lists them.
REGISTRARS: dict[str, Callable[[Commands], None]] = {
    "train": _train,
    "plan": _plan,
    "report": _report,
    "calibrate": _calibrate,
    "simulate": _simulate,
    "tune": _tune,
    **dict.fromkeys(("up", "submit", "jobs", "logs", "cancel", "down"), _service),
}


def command_named(words: Sequence[str]) -> str | None:
    """The command a command line names: its first word that is not an option."""
    return next((word for word in words if not word.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone where it names one."""
    parser = argparse.ArgumentParser(
        prog="unipar", description="Simple and automatic distributed machine learning on Ray."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    only = REGISTRARS.get(command or "")
    for registrar in dict.fromkeys(REGISTRARS.values()):
        if only in (None, registrar):
            registrar(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(command_named(words)).parse_args(words)
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
