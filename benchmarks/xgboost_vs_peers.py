"""unipar.xgboost against Ray Train's XGBoostTrainer (2 workers) and single-process xgboost
(all CPUs), in one invocation, each side in a fresh process, end to end, and the trained
models compared:
(a) 569 rows x 30 features x 20 rounds, everything started cold (Ray included);
(b) ``--rows`` (default 1,000,000) x 30 features x 50 rounds, unipar with its default actors
(one per node, all its CPUs) and with 2 actors, each both cold (Ray started by the run) and
attached (a Ray cluster already running, as on a cluster: joining it is timed).
Sides alternate (the order rotated each repeat); figures are medians over ``--repeats``
(default 3) with their range. Correctness: every unipar booster predicts held-out rows as
its reference does, trained with the same parameters on the same data: single-process
xgboost for one actor, xgboost's own 2-process collective on the same row shards for 2
actors (distributed ``hist`` merges per-worker quantile sketches, so 2 workers grow other
trees than one process; Ray Train's 2 workers differ from one process as much): equal
within ``PREDICTION_ATOL``, or the same held-out log loss within ``LOGLOSS_ATOL``.
Targets: (a) unipar <= 0.1 x XGBoostTrainer; (b) attached, default actors <= 1.1 x
single-process. Needs the bench extra: pip install -e ".[bench]".

RESULT: toy_vs_raytrain, default_vs_single (target <= 1.1), two_actors_vs_single,
default_vs_single_cold, two_actors_vs_single_cold, each with _min/_max over the repeats;
max_pred_diff (the largest |prediction - single's| of any unipar run).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from measure import Spread, Verdict, add_common_arguments, alternate, paired_ratios, repeats_of
from xgboost_runner import SMALL, held_out

RUNNER = Path(__file__).with_name("xgboost_runner.py")
PREDICTION_ATOL = 1e-5
LOGLOSS_ATOL = 1e-6


@dataclass(frozen=True)
class SideRun:
    seconds: float
    predictions: np.ndarray


# -- the arithmetic (pure) ---------------------------------------------------------------


def logloss(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Binary log loss (xgboost's ``logloss``: probabilities clipped at 1e-15)."""
    p = np.clip(predictions.astype(np.float64), 1e-15, 1 - 1e-15)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


@dataclass(frozen=True)
class ModelMatch:
    max_diff: float  # the largest |prediction - reference|, inf if shapes differ
    logloss_diff: float
    ok: bool


def model_match(predictions: np.ndarray | None, reference: np.ndarray, labels: np.ndarray
                ) -> ModelMatch:
    """Whether a booster's held-out predictions are the reference booster's: equal within
    PREDICTION_ATOL, or the same log loss within LOGLOSS_ATOL. A missing run never is."""
    if predictions is None or predictions.shape != reference.shape:
        return ModelMatch(math.inf, math.inf, False)
    diff = float(np.max(np.abs(predictions.astype(np.float64) - reference)))
    metric = abs(logloss(labels, predictions) - logloss(labels, reference))
    return ModelMatch(diff, metric, diff <= PREDICTION_ATOL or metric <= LOGLOSS_ATOL)


def seconds_of(runs: Sequence[SideRun | None]) -> list[float | None]:
    return [None if r is None else r.seconds for r in runs]


# -- the runs ----------------------------------------------------------------------------


def timed(side: str, rows: int, rounds: int, address: str) -> SideRun:
    env = {**os.environ, "RAY_ADDRESS": address}  # "local": start a fresh Ray
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "predictions.npy"
        done = subprocess.run(
            [sys.executable, str(RUNNER), side, str(rows), str(rounds), str(out)],
            capture_output=True, text=True, check=False, env=env,
        )
        if done.returncode:
            raise RuntimeError(f"{side} {rows} rows failed:\n{done.stderr[-3000:]}")
        result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if not result:
            raise RuntimeError(f"{side} printed no RESULT line:\n{done.stdout[-3000:]}")
        _, seconds, boosted = result[-1].split()
        if int(boosted) != rounds:
            raise RuntimeError(f"{side} trained {boosted} rounds, not {rounds}")
        return SideRun(float(seconds), np.load(out))


def running_cluster() -> str:
    """Start a Ray cluster in this process (all CPUs) for the attached runs; its address."""
    import ray

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
             logging_level=logging.WARNING, _system_config={"worker_niceness": 0})
    return ray.get_runtime_context().gcs_address


def measure(runs: dict[str, tuple[str, int, int, str]], repeats: int
            ) -> dict[str, list[SideRun | None]]:
    results = alternate({name: (lambda spec=spec: timed(*spec)) for name, spec in runs.items()},
                        repeats, log=lambda line: print(line, flush=True))
    for name, values in results.items():
        print(f"  {name:18s} {Spread.of(seconds_of(values))} s")
    return results


def first_of(runs: Sequence[SideRun | None]) -> SideRun | None:
    return next((r for r in runs if r is not None), None)


def compare(verdict: Verdict | None, what: str, runs: Sequence[SideRun | None],
            reference: SideRun | None, labels: np.ndarray) -> float:
    """Every run's held-out predictions against the reference's: a check (``verdict``)
    or, without one, a line printed; the largest difference."""
    if reference is None:
        if verdict is not None:
            verdict.check(False, f"{what}: the reference ran")
        return math.inf
    matches = [model_match(None if r is None else r.predictions, reference.predictions, labels)
               for r in runs]
    worst = max(m.max_diff for m in matches)
    text = (f"{what} (max |diff| {worst:.2e}, log loss diff "
            f"{max(m.logloss_diff for m in matches):.2e})")
    if verdict is None:
        print(f"{'same' if all(m.ok for m in matches) else 'not the same'}: {text}")
    else:
        verdict.check(all(m.ok for m in matches), text)
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=None, help="rows of case (b)")
    add_common_arguments(parser)
    args = parser.parse_args()
    repeats = repeats_of(args, quick=1)
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    verdict = Verdict(quick=args.quick)
    print("(a) 569 x 30, 20 rounds, cold")
    small = measure({"unipar": ("unipar", SMALL, 20, "local"),
                     "trainer": ("trainer", SMALL, 20, "local"),
                     "single": ("single", SMALL, 20, "local")}, repeats)
    labels = held_out(SMALL)[1]
    worst = compare(verdict, "(a) unipar's boosters predict as single-process xgboost's",
                    small["unipar"], first_of(small["single"]), labels)
    compare(None, "(a) Ray Train's boosters (2 workers) and single-process xgboost's",
            small["trainer"], first_of(small["single"]), labels)
    address = running_cluster()
    print(f"(b) {rows:,} x 30, 50 rounds ({os.cpu_count()} CPUs; attached to {address})")
    large = measure(
        {
            "single": ("single", rows, 50, "local"),
            "default attached": ("unipar", rows, 50, address),
            "2 actors attached": ("unipar2", rows, 50, address),
            "default cold": ("unipar", rows, 50, "local"),
            "2 actors cold": ("unipar2", rows, 50, "local"),
        },
        repeats,
    )
    # 2 workers grow other trees than one process (distributed hist merges per-worker
    # quantile sketches): their reference is plain xgboost's own 2-process collective
    reference = alternate({"collective2": lambda: timed("collective2", rows, 50, "local")}, 1,
                          log=lambda line: print(line, flush=True))["collective2"][0]
    labels = held_out(rows)[1]
    single = first_of(large["single"])
    for name in ("default attached", "default cold"):
        worst = max(worst, compare(verdict, f"(b) unipar {name} predicts as single-process "
                                   "xgboost", large[name], single, labels))
    for name in ("2 actors attached", "2 actors cold"):
        worst = max(worst, compare(verdict, f"(b) unipar {name} predicts as xgboost's own "
                                   "2-process collective", large[name], reference, labels))
        compare(None, f"(b) unipar {name} and single-process xgboost", large[name], single,
                labels)
    single_s = seconds_of(large["single"])

    def versus(name: str) -> Spread:
        return Spread.of(paired_ratios(seconds_of(large[name]), single_s))

    toy = Spread.of(paired_ratios(seconds_of(small["unipar"]), seconds_of(small["trainer"])))
    print(f"\n(a) unipar / XGBoostTrainer = {toy}")
    for name in large:
        if name != "single":
            print(f"(b) unipar {name} / single-process = {versus(name)}")
    verdict.target("toy_vs_raytrain", toy, 0.1)
    verdict.target("default_vs_single", versus("default attached"), 1.1)
    return verdict.finish({
        "toy_vs_raytrain": toy,
        "default_vs_single": versus("default attached"),
        "two_actors_vs_single": versus("2 actors attached"),
        "default_vs_single_cold": versus("default cold"),
        "two_actors_vs_single_cold": versus("2 actors cold"),
        "max_pred_diff": f"{worst:.2e}",
    })


if __name__ == "__main__":
    sys.exit(main())
