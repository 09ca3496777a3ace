"""unipar.xgboost against Ray Train's XGBoostTrainer (2 workers) and single-process
xgboost (all CPUs), in one invocation, each side in a fresh process, end to end:
(a) 569 rows x 30 features x 20 rounds, everything started cold (Ray included);
(b) 1,000,000 rows x 30 features x 50 rounds, unipar with its default actors (one per
node, all its CPUs) and with 2 actors, each both cold (Ray started by the run) and
attached (a Ray cluster already running, as on a cluster: joining it is timed).
Sides alternate within each repeat; figures are medians over ``--repeats`` (default 3).
Targets: (a) unipar <= 0.1 x XGBoostTrainer; (b) attached, default actors <= 1.1 x
single-process, 2 actors <= 1.5 x. Needs the bench extra: pip install -e ".[bench]"."""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).with_name("xgboost_runner.py")


def timed(side: str, case: str, address: str) -> float:
    env = {**os.environ, "RAY_ADDRESS": address}  # "local": start a fresh Ray
    done = subprocess.run(
        [sys.executable, str(RUNNER), side, case],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if done.returncode:
        raise SystemExit(f"{side} {case} failed:\n{done.stderr[-3000:]}")
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not result:
        raise SystemExit(f"{side} {case} printed no RESULT line:\n{done.stdout[-3000:]}")
    _, seconds, _rounds = result[-1].split()
    return float(seconds)


def running_cluster() -> str:
    """Start a Ray cluster in this process (all CPUs) for the attached runs; its
    address."""
    import ray

    ray.init(
        address="local",
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        logging_level=logging.WARNING,
        _system_config={"worker_niceness": 0},
    )
    return ray.get_runtime_context().gcs_address


def measure(runs: dict[str, tuple[str, str, str]], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for repeat in range(repeats):
        for name, (side, case, address) in runs.items():
            times[name].append(timed(side, case, address))
        print(
            f"  repeat {repeat + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
            flush=True,
        )
    for name, values in times.items():
        spread = (max(values) - min(values)) / statistics.median(values)
        print(f"  {name:18s} median {statistics.median(values):7.2f} s  spread {spread:.0%}")
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("(a) 569 x 30, 20 rounds, cold")
    small = measure(
        {"unipar": ("unipar", "small", "local"), "trainer": ("trainer", "small", "local")},
        args.repeats,
    )
    address = running_cluster()
    print(f"(b) 1M x 30, 50 rounds ({os.cpu_count()} CPUs; attached to {address})")
    large = measure(
        {
            "single": ("single", "large", "local"),
            "default attached": ("unipar", "large", address),
            "2 actors attached": ("unipar2", "large", address),
            "default cold": ("unipar", "large", "local"),
            "2 actors cold": ("unipar2", "large", "local"),
        },
        args.repeats,
    )
    toy = small["unipar"] / small["trainer"]
    ratios = {k: v / large["single"] for k, v in large.items() if k != "single"}
    print(f"\n(a) unipar / XGBoostTrainer = {toy:.3f} (target <= 0.1)")
    for name, ratio in ratios.items():
        print(f"(b) unipar {name} / single-process = {ratio:.3f}")
    print(
        f"RESULT toy_vs_raytrain={toy:.3f} "
        f"default_vs_single={ratios['default attached']:.3f} "
        f"two_actors_vs_single={ratios['2 actors attached']:.3f} "
        f"default_vs_single_cold={ratios['default cold']:.3f} "
        f"two_actors_vs_single_cold={ratios['2 actors cold']:.3f}"
    )


if __name__ == "__main__":
    main()
