"""unipar.xgboost (2 actors) against Ray Train's XGBoostTrainer (2 workers) and
single-process xgboost (2 threads), in one invocation, each side in a fresh process:
(a) 569 rows x 30 features x 20 rounds, (b) 1,000,000 rows x 30 features x 50 rounds.
Prints end-to-end seconds (Ray start included) and the ratios.
Targets: (a) unipar <= 0.1 x XGBoostTrainer; (b) unipar <= 1.2 x single-process.
Needs the bench extra: pip install -e ".[bench]"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).with_name("xgboost_runner.py")


def timed(side: str, case: str) -> float:
    done = subprocess.run(
        [sys.executable, str(RUNNER), side, case], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"{side} {case} failed:\n{done.stderr[-3000:]}")
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not result:
        raise SystemExit(f"{side} {case} printed no RESULT line:\n{done.stdout[-3000:]}")
    _, seconds, rounds = result[-1].split()
    print(f"  {side:8s} {float(seconds):8.2f} s  ({rounds} trees)", flush=True)
    return float(seconds)


def main() -> None:
    times = {}
    for case, label in (("small", "(a) 569 x 30, 20 rounds"), ("large", "(b) 1M x 30, 50 rounds")):
        print(label)
        times[case] = {side: timed(side, case) for side in ("unipar", "trainer", "single")}
    small, large = times["small"], times["large"]
    print(
        f"\n(a) unipar / XGBoostTrainer = {small['unipar'] / small['trainer']:.3f}  "
        f"(target <= 0.1); unipar / single = {small['unipar'] / small['single']:.2f}"
    )
    print(
        f"(b) unipar / single-process = {large['unipar'] / large['single']:.3f}  "
        f"(target <= 1.2); unipar / XGBoostTrainer = {large['unipar'] / large['trainer']:.3f}"
    )


if __name__ == "__main__":
    main()
