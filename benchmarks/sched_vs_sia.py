"""unipar's policy against Sia (SOSP'23) on its own traces, by simulation.

Sia's setting: 64 GPUs of three types (6 nodes of 4 T4, 2 of 8 A100-40GB, 3 of 8 RTX
2080Ti), 60 s rounds, each application's restart time and slowdown; its Philly (8
workloads, 160 jobs each) and newTrace (10 workloads, 960 jobs each) traces. Per trace and
policy: average JCT over all jobs (and its spread over the workloads), p99 JCT (Sia's
index rule), makespan and GPU-hours per job, beside Sia's published figures
(``published.csv``). Fidelity: our renderings of Sia and of Pollux (heterogeneity-unaware,
as Sia ran it) against their published average JCTs. Then unipar's policy against the
published Sia and our rendering, per workload; on 64 T4 (Philly) against Sia's published
1.9 h; and the time of one scheduling round (960 jobs on the 64 GPUs; 15,360 jobs on the
16x cluster), alternating policies over three repeats.

Simulations are deterministic (no randomness; only Sia's HiGHS round has a 30 s wall-clock
limit, which a busy machine can reach on very long queues), so each runs once; the spread
shown is over workloads. Each run is written to --out as JSON; --resume reuses those files.

    python benchmarks/sched_vs_sia.py [--reference DIR] [--quick] [--processes 2]
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import time
from pathlib import Path

import numpy as np

from unipar.goodput.throughput import Observation, fit
from unipar.sched.policies import TypedPolicyName, make_typed_policy
from unipar.sched.typed_cluster import TypedCluster, parse_cluster
from unipar.sched.typed_policy import LocalLimits, TypedJobView, TypedRoundState
from unipar.sched.typed_simulator import simulate_typed
from unipar.sched.typed_traces import default_sia_reference_dir, load_typed_applications
from unipar.sched.workload import read_workload

HETERO = "6xaws+2xdgx-ext+3xrtx"
HOMO = "16xaws"
TRACES = {"philly": 8, "newtrace": 10}
POLICIES = (TypedPolicyName.SIA, TypedPolicyName.POLLUX, TypedPolicyName.UNIPAR)


def published(reference: Path) -> dict[tuple[str, str, str], dict[str, float]]:
    with (reference / "published.csv").open() as f:
        return {(r["setting"], r["trace"], r["policy"]): {k: float(v) for k, v in r.items()
                                                         if k.endswith(("_h", "_job")) and v}
                for r in csv.DictReader(f)}


def _run(task: tuple[str, str, int, str, str]) -> dict:
    reference, trace, workload, policy, cluster = task
    ref = Path(reference)
    apps = load_typed_applications(ref)
    specs = read_workload(ref / "workloads" / trace / f"workload-{workload}.csv", apps)
    tick = time.process_time()
    run = simulate_typed(specs, apps, make_typed_policy(TypedPolicyName(policy)),
                         parse_cluster(cluster))
    r = run.result
    return {
        "trace": trace, "workload": workload, "policy": policy, "cluster": cluster,
        "jct": [j.jct for j in r.jobs], "gpu_seconds": [j.gpu_seconds for j in r.jobs],
        "restarts": [j.restarts for j in r.jobs], "makespan": r.makespan,
        "migrations": run.migrations, "round_median_s": float(np.median(run.round_seconds)),
        "cpu_s": time.process_time() - tick,
    }


def run_all(tasks: list[tuple], out: Path, resume: bool, processes: int) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)

    def path(t) -> Path:
        return out / f"{t[1]}-{t[2]}-{t[3]}-{t[4]}.json"

    todo = [t for t in tasks if not (resume and path(t).is_file())]
    with multiprocessing.Pool(processes) as pool:
        for res in pool.imap_unordered(_run, todo):
            task = (None, res["trace"], res["workload"], res["policy"], res["cluster"])
            path(task).write_text(json.dumps(res))
            print(f"  {res['trace']} workload-{res['workload']} {res['policy']:6s} "
                  f"{res['cluster']}: avg JCT {np.mean(res['jct']) / 3600:.3f} h "
                  f"(simulated in {res['cpu_s']:.0f} s CPU)", flush=True)
    return [json.loads(path(t).read_text()) for t in tasks]


def summarise(runs: list[dict]) -> dict:
    """Sia's metrics over a trace's workloads (``utils/print_run_stats.py``): the mean of
    all jobs' JCTs, the spread of the per-workload means, the 99th percentile by index
    ⌊0.99 n⌋ of all JCTs, the mean makespan, GPU-hours held per job."""
    jct = np.concatenate([r["jct"] for r in runs])
    return {
        "avg": jct.mean() / 3600,
        "sd": float(np.std([np.mean(r["jct"]) for r in runs])) / 3600,
        "p99": float(np.sort(jct)[int(0.99 * len(jct))]) / 3600,
        "makespan": float(np.mean([r["makespan"] for r in runs])) / 3600,
        "gpu_h": float(np.concatenate([r["gpu_seconds"] for r in runs]).mean()) / 3600,
        "restarts": float(np.concatenate([r["restarts"] for r in runs]).mean()),
        "per_workload": {r["workload"]: float(np.mean(r["jct"])) / 3600 for r in runs},
    }


def synthetic_round(apps, cluster: TypedCluster, jobs: int, seed: int = 0) -> TypedRoundState:
    """A busy round: ``jobs`` jobs of the traces' mix all waiting or running at once, each
    application's model pooled per type from step times at a few spreads, each job at a
    random point of its training, having run on one to three of the types."""
    rng = np.random.default_rng(seed)
    names = ("bert", "cifar10", "deepspeech2", "imagenet", "yolov3")
    pooled = {}
    for name in names:
        for t in cluster.types:
            trace, gpn = apps[name].trace(t.name), t.gpus_per_node
            obs = []
            for placement in ((1,), (gpn // 2,), (gpn,), (gpn, gpn)):
                m = trace.max_local_for(placement)
                obs.append(Observation(len(placement), sum(placement), m,
                                       *trace.step_time(placement, m)))
            pooled[(name, t.name)] = fit(obs)
    types = cluster.type_names
    views = []
    for i in range(jobs):
        app = apps[names[i % len(names)]]
        epoch = int(rng.integers(0, app.epochs))
        mine = types[: 1 + i % len(types)]
        seen = {t: 2 * cluster.gpu_type(t).gpus_per_node for t in types}
        views.append(TypedJobView(
            name=f"job-{i}", application=app.name, submit_time=float(i),
            requested_replicas=4, requested_batch=4 * app.init_batch,
            init_batch=app.init_batch, max_batch=app.max_batch,
            limits={t: LocalLimits(app.trace(t).min_local, app.trace(t).max_local)
                    for t in types},
            restart_seconds=app.restart_seconds, epoch=epoch,
            progress=app.progress_at(epoch), remaining_progress=app.target_progress
            - app.progress_at(epoch), attained_service=float(rng.uniform(0, 1e5)),
            restarts=int(rng.integers(0, 5)), restart_left=0.0, allocation=None,
            grad=app.grad_stats(4 * app.init_batch, epoch),
            models={t: pooled[(app.name, t)] for t in mine},
            seen={t: seen[t] for t in mine},
            pooled_models={t: pooled[(app.name, t)] for t in types}, pooled_seen=seen,
            profile={t: app.trace(t).one_gpu_throughput for t in types},
        ))
    return TypedRoundState(now=1e5, cluster=cluster, jobs=views)


def round_times(apps, cluster: TypedCluster, jobs: int, policies, repeats: int = 3) -> dict:
    """Seconds per round (wall clock and this process's CPU), policies alternated."""
    state = synthetic_round(apps, cluster, jobs)
    times: dict = {p: {"wall": [], "cpu": []} for p in policies}
    for _ in range(repeats):
        for p in policies:
            policy = make_typed_policy(p)
            wall, cpu = time.perf_counter(), time.process_time()
            out = policy.allocate(state)
            times[p]["wall"].append(time.perf_counter() - wall)
            times[p]["cpu"].append(time.process_time() - cpu)
            used = sum(a.replicas for a in out.values())
            assert used <= cluster.total_gpus and len(out) <= jobs
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", type=Path, default=default_sia_reference_dir())
    parser.add_argument("--quick", action="store_true", help="workloads 1-2 of each trace")
    parser.add_argument("--philly", type=int, default=None, help="first N Philly workloads")
    parser.add_argument("--newtrace", type=int, default=None,
                        help="first N newTrace workloads")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("sched-vs-sia-runs"))
    parser.add_argument("--resume", action="store_true", help="reuse runs found in --out")
    args = parser.parse_args()
    ref = args.reference
    pub = published(ref)
    counts = {t: (2 if args.quick else n) for t, n in TRACES.items()}
    counts = {t: min(n if getattr(args, t) is None else getattr(args, t), TRACES[t])
              for t, n in counts.items()}
    counts = {t: n for t, n in counts.items() if n > 0}
    # Philly first, workload by workload: partial results come early
    tasks = [(str(ref), t, w, p.value, HETERO) for t, n in counts.items()
             for w in range(1, n + 1) for p in POLICIES]
    tasks += [(str(ref), "philly", w, TypedPolicyName.UNIPAR.value, HOMO)
              for w in range(1, counts.get("philly", 0) + 1)]
    print(f"== {len(tasks)} simulations, {args.processes} processes; workloads "
          f"{', '.join(f'{t} 1-{n}' for t, n in counts.items())} ==")
    runs = run_all(tasks, args.out, args.resume, args.processes)
    stats = {}
    for t in counts:
        for p in POLICIES:
            stats[(t, p)] = summarise([r for r in runs if (r["trace"], r["policy"],
                                                           r["cluster"]) == (t, p.value, HETERO)])
    homo = summarise([r for r in runs if r["cluster"] == HOMO]) if "philly" in counts else None

    print("== heterogeneous 64 GPUs: ours (published), hours ==")
    for t in counts:
        for p in POLICIES:
            s = stats[(t, p)]
            theirs = pub.get(("heterogeneous-64", t, p.value), {})
            def cell(key, val, theirs=theirs):
                return f"{val:.2f} ({theirs[key]:.1f})" if key in theirs else f"{val:.2f}"
            print(f"{t:8s} {p.value:6s} avg JCT {cell('avg_jct_h', s['avg'])} sd "
                  f"{cell('avg_jct_sd_h', s['sd'])}  p99 {cell('p99_jct_h', s['p99'])}  "
                  f"makespan {cell('makespan_h', s['makespan'])}  GPU-h/job "
                  f"{cell('gpu_h_per_job', s['gpu_h'])}  restarts/job {s['restarts']:.1f}")

    print("== fidelity: our rendering / published average JCT ==")
    fidelity = {}
    for t in counts:
        for p in (TypedPolicyName.SIA, TypedPolicyName.POLLUX):
            fidelity[(t, p)] = stats[(t, p)]["avg"] / pub[("heterogeneous-64", t, p.value)][
                "avg_jct_h"]
            print(f"{t:8s} {p.value:6s} {fidelity[(t, p)]:.3f}")

    print("== unipar per workload: / our Sia, / our Pollux ==")
    ratios, vs_pub, vs_ours = [], [], []
    for t in counts:
        u = stats[(t, TypedPolicyName.UNIPAR)]
        s = stats[(t, TypedPolicyName.SIA)]
        o = stats[(t, TypedPolicyName.POLLUX)]
        for w, jct in sorted(u["per_workload"].items()):
            ratios.append(jct / s["per_workload"][w])
            print(f"{t:8s} workload-{w:2d}: unipar {jct:.3f} h  Sia {s['per_workload'][w]:.3f} "
                  f"h  x{ratios[-1]:.3f}  Pollux {o['per_workload'][w]:.3f} h  "
                  f"x{jct / o['per_workload'][w]:.3f}")
        vs_pub.append(u["avg"] / pub[("heterogeneous-64", t, "sia")]["avg_jct_h"])
        vs_ours.append(u["avg"] / s["avg"])
        print(f"{t:8s} mean: unipar {u['avg']:.3f} h / published Sia x{vs_pub[-1]:.3f}, / our "
              f"Sia x{vs_ours[-1]:.3f}, / our Pollux x{u['avg'] / o['avg']:.3f}")
    homo_sia = pub[("homogeneous-64-t4", "philly", "sia")]
    homo_ratio = homo["avg"] / homo_sia["avg_jct_h"] if homo else float("nan")
    if homo:
        print(f"== homogeneous 64 T4, Philly: unipar {homo['avg']:.3f} h (published Sia "
              f"{homo_sia['avg_jct_h']:.1f} h) x{homo_ratio:.3f}; p99 {homo['p99']:.1f} "
              f"({homo_sia['p99_jct_h']:.1f}), makespan {homo['makespan']:.1f} "
              f"({homo_sia['makespan_h']:.1f}), GPU-h/job {homo['gpu_h']:.2f} "
              f"({homo_sia['gpu_h_per_job']:.1f}) ==")

    print("== one scheduling round: median (min-max) over 3 alternated repeats ==")
    apps = load_typed_applications(ref)
    base = parse_cluster(HETERO)
    small = round_times(apps, base, 960, POLICIES)
    large = round_times(apps, base.scaled(16), 16 * 960, (TypedPolicyName.UNIPAR,))
    for label, times in (("960 jobs, 64 GPUs", small), ("15360 jobs, 1024 GPUs", large)):
        for p, t in times.items():
            print(f"{label}: {p.value:6s} wall {np.median(t['wall']):.3f} s "
                  f"({min(t['wall']):.3f}-{max(t['wall']):.3f}), CPU "
                  f"{np.median(t['cpu']):.3f} s ({min(t['cpu']):.3f}-{max(t['cpu']):.3f})")
    unipar = TypedPolicyName.UNIPAR
    fidelity_keys = " ".join(f"{p.value}_fidelity_{t}={f:.3f}"
                             for (t, p), f in fidelity.items())
    print(
        f"RESULT vs_sia={np.mean(vs_pub):.3f} vs_sia_ours={np.mean(vs_ours):.3f} "
        f"worst_workload={max(ratios):.3f} {fidelity_keys} "
        f"homogeneous_vs_sia={homo_ratio:.3f} "
        f"round_960_s={np.median(small[unipar]['wall']):.3f} "
        f"round_960_cpu_s={np.median(small[unipar]['cpu']):.3f} "
        f"round_15360_s={np.median(large[unipar]['wall']):.3f} "
        f"round_15360_cpu_s={np.median(large[unipar]['cpu']):.3f} "
        f"workloads={'+'.join(f'{t}:{n}' for t, n in counts.items())}"
    )


if __name__ == "__main__":
    main()
