"""``unipar plan`` from a cold process, for the two largest cases the planner promises
within 3 s of wall time: a 1-trillion-parameter GPT on 384 x 8 A100-80GB and Llama 3
405B (seq 8192, global batch 2048) on 2,048 x 8 H100-80GB.

Each case is the command a user types, run in a fresh process (interpreter start,
imports of torch and the planner, the model's analysis on the meta device, the search,
the explanation), ``--repeats`` times, the cases alternated. Prints each run's wall and
CPU time, the median and spread per case, the chosen plan (the same every run, or the
check fails) and the machine's load average: on a shared machine the wall time is the
neighbours' as much as the planner's, the CPU time is the planner's.

    python benchmarks/plan_cold.py [--repeats 3]

Last line: ``RESULT gpt1t_3072_s=<median wall> llama405b_16384_s=<median wall>
gpt1t_3072_cpu_s=... llama405b_16384_cpu_s=... ok=0|1`` (ok: both medians <= 3 s);
exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 3.0
UNIPAR = Path(sys.executable).parent / "unipar"
CASES = {
    "gpt1t_3072": [
        "plan", "gpt", "--hidden", "25600", "--layers", "128", "--heads", "160", "--vocab",
        "51200", "--seq", "2048", "--cluster", "a100-80g", "--nodes", "384",
        "--global-batch", "3072",
    ],
    "llama405b_16384": [
        "plan", "llama", "--hidden", "16384", "--layers", "126", "--heads", "128",
        "--kv-heads", "8", "--ffn-hidden", "53248", "--vocab", "128256", "--seq", "8192",
        "--cluster", "h100-80g", "--nodes", "2048", "--global-batch", "2048",
    ],
}


def cold_run(arguments: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s, the chosen plan) of one ``unipar`` command in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([str(UNIPAR), *arguments], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"unipar {' '.join(arguments)} failed:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    chosen = next(line for line in done.stdout.splitlines() if line.startswith("chosen:"))
    return wall, cpu, chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {name: [] for name in CASES}
    cpus: dict[str, list[float]] = {name: [] for name in CASES}
    chosen: dict[str, set[str]] = {name: set() for name in CASES}
    for repeat in range(args.repeats):
        for name, arguments in CASES.items():
            wall, cpu, plan = cold_run(arguments)
            walls[name].append(wall)
            cpus[name].append(cpu)
            chosen[name].add(plan)
            print(f"{repeat + 1}  {name:16s} wall {wall:5.2f} s  cpu {cpu:5.2f} s  (load "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)", flush=True)
    ok = True
    for name in CASES:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        same = len(chosen[name]) == 1
        ok = ok and same and wall <= TARGET_S
        print(f"{name:16s} median wall {wall:.2f} s (spread {min(walls[name]):.2f}-"
              f"{max(walls[name]):.2f}), cpu {cpu:.2f} s, target <= {TARGET_S:g} s: "
              f"{'ok' if wall <= TARGET_S else 'MISSED'}; {sorted(chosen[name])[0]}"
              + ("" if same else "  PLANS DIFFER between runs"))
    print(
        "RESULT " + " ".join(f"{n}_s={statistics.median(walls[n]):.2f}" for n in CASES) + " "
        + " ".join(f"{n}_cpu_s={statistics.median(cpus[n]):.2f}" for n in CASES)
        + f" ok={int(ok)}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
