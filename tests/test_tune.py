"""unipar.tune: unipar runs as Ray Tune trials. Bad input fails before any trial starts
(pure, no Ray); each searcher and scheduler runs a tiny space end to end on the session
cluster (4 CPUs, one worker per trial), combined so that the whole file stays short."""

from __future__ import annotations

import json
import numbers
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import ray.cloudpickle

sys.path.insert(0, str(Path(__file__).parent))
import tune_jobs

from unipar.errors import ConfigError, ResourceError
from unipar.tuning.api import tune
from unipar.tuning.space import ParamKind, load_space

ray.cloudpickle.register_pickle_by_value(tune_jobs)  # the trainable runs remotely

SPACE = {"lr": {"loguniform": [1e-3, 3e-2]}, "warmup": {"choice": [0, 2]}}


def _tune(tmp_path: Path, space=SPACE, **kwargs):
    options = {"num_samples": 3, "workers_per_trial": 1, "storage_path": tmp_path, "name": "x"}
    return tune(tune_jobs.make_job, space, **{**options, **kwargs})


# -- bad input: errors before any trial starts (no Ray needed) -----------------------


@pytest.mark.parametrize(
    ("space", "words"),
    [
        ({}, "nothing to search"),
        ({"steps": 3}, "nothing to search"),
        ({"lr": {"logunifrom": [1e-3, 1e-2]}}, "unknown kind 'logunifrom'"),
        ({"lr": {"uniform": [0.1, 0.01]}}, "low < high"),
        ({"lr": {"loguniform": [0.0, 0.1]}}, "low > 0"),
        ({"lr": {"uniform": [0.1]}}, "two numbers"),
        ({"lr": {"quniform": [0.05, 1.0, 0.1]}}, "multiples of q"),
        ({"n": {"qrandint": [1, 4, 5]}}, "no multiple of q=5"),
        ({"n": {"randint": [1, 4.5]}}, "needs integers"),
        ({"w": {"randn": [0.0, 0.0]}}, "sd > 0"),
        ({"lr": {"uniform": [0, 1], "choice": [1]}}, "exactly one kind"),
        ([1, 2], "must be a mapping"),
    ],
)
def test_bad_space_is_refused(tmp_path, space, words):
    with pytest.raises(ConfigError, match=words):
        _tune(tmp_path, space)
    assert not (tmp_path / "x").exists()


def test_space_from_yaml(tmp_path):
    good = tmp_path / "space.yaml"
    good.write_text("lr: {loguniform: [1.0e-4, 1.0e-2]}\nwarmup: {grid: [0, 5]}\nsteps: 4\n")
    space = load_space(good)
    assert [p.kind for p in space.params] == [
        ParamKind.LOGUNIFORM,
        ParamKind.GRID,
        ParamKind.CONSTANT,
    ]
    assert space.grid_size == 2 and space.constants() == {"steps": 4}
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: {loguniform: [1.0e-4, \n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_space(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_space(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"metric": "val_loss"}, "never reported"),
        ({"searcher": "optuna", "scheduler": "pbt"}, "random/grid searcher only"),
        ({"searcher": "tpe"}, "unknown searcher 'tpe'"),
        ({"scheduler": "asha2"}, "unknown scheduler"),
        ({"pruner": object()}, "needs searcher='optuna'"),
        ({"searcher": "hyperopt", "space": {"lr": {"grid": [0.1, 0.2]}}}, "cannot enumerate"),
        ({"plan": object()}, "plan must be a Plan"),
        ({"gpus_per_worker": -1}, "gpus_per_worker"),
        ({"grace_steps": 0}, "grace_steps must be at least 1"),
        ({"grace_steps": 9}, r"grace_steps \(9\) is more than the most steps a trial runs \(8\)"),
        ({"reduction_factor": 1}, "reduction_factor must be at least 2"),
    ],
)
def test_bad_settings_are_refused(tmp_path, kwargs, words):
    space = kwargs.pop("space", SPACE)
    with pytest.raises(ConfigError, match=words):
        _tune(tmp_path, space, **kwargs)


def test_more_workers_per_trial_than_the_cluster_has(ray_cluster, tmp_path):
    with pytest.raises(ResourceError, match=r"8 CPUs .* the Ray cluster has 4"):
        _tune(tmp_path, workers_per_trial=8)
    assert not (tmp_path / "x").exists()


# -- end to end on the session cluster -----------------------------------------------


def test_grid_with_hyperband_and_random_with_median(ray_cluster, tmp_path):
    grid = _tune(
        tmp_path,
        {"lr": {"grid": [1e-3, 2e-2]}},
        num_samples=1,
        searcher="grid",
        scheduler="hyperband",
        name="grid",
    )
    assert sorted(r.config["lr"] for r in grid.rows) == [1e-3, 2e-2]
    assert grid.best_config == grid.rows[0].config and grid.best_checkpoint.is_dir()
    assert grid.curves_png.stat().st_size > 0
    median = _tune(tmp_path, num_samples=2, scheduler="median", name="median")
    values = [r.value for r in median.rows]
    assert values == sorted(values) and len(values) == 2
    tensorboard = list((tmp_path / "median").glob("*/events.out.tfevents.*"))
    assert len(tensorboard) == 2
    assert "loss" in median.table().splitlines()[0]


def test_hyperopt_with_asha(ray_cluster, tmp_path):
    # Two trials: each assertion means as much as with four (hyperopt samples at random
    # for its first 20 points), and a trial costs about 10 CPU-seconds.
    result = _tune(tmp_path, num_samples=2, searcher="hyperopt", scheduler="asha")
    assert len(result.rows) == 2
    assert all(r.status in ("done", "stopped") for r in result.rows)
    assert result.rows[0].value == min(r.value for r in result.rows)


def test_optuna_tpe_with_its_median_pruner(ray_cluster, tmp_path):
    import optuna

    space = {"lr": {"choice": [1e-5, 3e-2]}, "steps": 12}
    result = _tune(
        tmp_path,
        space,
        num_samples=6,
        searcher="optuna",
        scheduler="fifo",
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=3),
        max_concurrent=2,
    )
    stopped = [r for r in result.rows if r.status == "stopped"]
    assert stopped, result.table()
    assert all(r.steps < 12 for r in stopped)
    assert result.best_config["lr"] == 3e-2


@pytest.mark.alone  # PBT exploits only when the best trial reports first at an exploit point:
# beside another test process (make test's -n 2) that order failed 2 runs of 3
def test_pbt_exploits_and_the_exploited_trial_continues_from_the_donor_step(ray_cluster, tmp_path):
    # Each trial takes about 4 s, and the three take their first step together, so they
    # run side by side: PBT compares live trials.
    space = {"lr": {"loguniform": [1e-5, 3e-2]}, "steps": 16, "step_delay_s": 0.25,
             "start_folder": str(tmp_path / "started"), "start_together": 3}
    result = _tune(tmp_path, space, num_samples=3, scheduler="pbt", perturbation_interval=4)
    assert (tmp_path / "x" / "pbt_global.txt").read_text().strip(), "no exploit happened"
    continued = []
    for path in (tmp_path / "x").glob("run_trial_*/progress.csv"):
        import pandas

        frame = pandas.read_csv(path)
        restarts = frame[frame["resumed_from"] > 0]
        for resumed, steps in restarts.groupby("resumed_from")["step"]:
            continued.append((resumed, steps.min()))
    assert continued, "no trial continued from a donor's checkpoint"
    assert all(first == resumed + 1 for resumed, first in continued), continued
    assert all(r.steps == 16 for r in result.rows)


def test_a_sigkilled_trial_worker_is_recovered(ray_cluster, tmp_path):
    marker = tmp_path / "kill-once"
    marker.touch()
    space = {"lr": {"choice": [1e-2]}, "steps": 40, "kill_marker": str(marker)}
    result = _tune(tmp_path, space, num_samples=1, scheduler="fifo")
    assert not marker.exists(), "the worker never killed itself"
    assert [(r.status, r.steps) for r in result.rows] == [("done", 40)]
    lines = (next((tmp_path / "x").glob("*/run-0/metrics.jsonl"))).read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert any("worker lost" in e.get("reason", "") for e in events)  # the elastic recovery


def test_an_interrupted_experiment_resumes_without_rerunning_finished_trials(ray_cluster, tmp_path):
    def interrupt_after_first_trial() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any('"step": 12,' in p.read_text() for p in tmp_path.glob("x/*/result.json")):
                time.sleep(1.0)  # the trial ends (its final report was its last step)
                signal.raise_signal(signal.SIGINT)  # Tune stops, saving the experiment
                return
            time.sleep(0.1)

    space = {"lr": {"grid": [1e-3, 1e-2, 2e-2]}, "steps": 12}
    watcher = threading.Thread(target=interrupt_after_first_trial)
    watcher.start()
    first = _tune(tmp_path, space, num_samples=1, scheduler="fifo", max_concurrent=1)
    watcher.join()
    finished = {r.trial_id for r in first.rows if r.status == "done"}
    assert 1 <= len(finished) < 3, first.table()
    runs_before = {p.parent.name: p for p in tmp_path.glob("x/*/run-0")}
    resumed = _tune(tmp_path, space, num_samples=1, scheduler="fifo", resume=True)
    assert [r.status for r in resumed.rows] == ["done"] * 3
    for trial_dir in (tmp_path / "x").glob("run_trial_*"):
        if any(trial_dir.name.startswith(f"run_trial_{t}") for t in finished):
            assert not (trial_dir / "run-1").exists(), f"{trial_dir.name} was rerun"
    assert runs_before


def test_cli_refuses_an_empty_space_before_any_trial(tmp_path, capsys):
    from unipar.cli.main import main

    job_file = tmp_path / "my_job.py"
    here = str(Path(__file__).parent)
    job_file.write_text(
        f"import sys\nsys.path.insert(0, {here!r})\nfrom tune_jobs import make_job as job\n"
    )
    space = tmp_path / "space.yaml"
    space.write_text("")
    argv = ["tune", str(job_file), "--space", str(space), "--storage", str(tmp_path)]
    assert main(argv) == 2
    assert "nothing to search" in capsys.readouterr().err
    assert main([*argv[:3], str(tmp_path / "none.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    space.write_text("lr: {loguniform: [0.001, 0.1]}\n")
    assert main([*argv, "--max-concurrent", "0"]) == 2
    assert "max_concurrent must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "my_job-tune").exists()


def test_pbt_mutates_a_grid_parameter_over_its_values():
    """PBT reads a dict in its mutations as a nested space: a grid parameter goes to it as
    the list of its values (a ``grid_search`` dict failed at PBT's first exploit)."""
    from unipar.tuning.choices import SchedulerKind, build_scheduler
    from unipar.tuning.space import load_space

    space = load_space({"lr": {"loguniform": [1e-4, 1e-1]}, "seed": {"grid": [0, 1]}})
    pbt = build_scheduler(SchedulerKind.PBT, space, max_steps=10, grace_steps=2,
                          reduction_factor=2, perturbation_steps=2, seed=0)
    assert pbt._hyperparam_mutations["seed"] == [0, 1]


def test_a_missing_plot_extra_is_refused_before_any_trial(tmp_path, monkeypatch):
    """The curves are drawn after every trial: without matplotlib the run stops before it
    starts (it used to train every trial, then fail at the plot and lose the results)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    with pytest.raises(ConfigError, match=r"unipar\[plot\]"):
        _tune(tmp_path)
    assert not (tmp_path / "x").exists()


def test_results_are_written_before_the_plot(tmp_path):
    from unipar.tuning.report import TrialRow, write_results

    rows = [
        TrialRow("b", {"lr": 0.1}, 0.5, 4, "done"),
        TrialRow("a", {"lr": 1.0}, 0.9, 2, "stopped"),
    ]
    saved = json.loads(write_results(rows, "loss", tmp_path / "x").read_text())
    assert [(r["trial_id"], r["value"]) for r in saved] == [("b", 0.5), ("a", 0.9)]
    assert "loss" in (tmp_path / "x" / "results.txt").read_text().splitlines()[0]


# -- each backend samples what Ray Tune's sampler of the same name samples ------------

N = 300


def _draws(backend: str, spec, n: int = N) -> list:
    """``n`` values of the space's one parameter, as ``backend`` samples it."""
    import numpy as np

    from unipar.tuning.backends import from_optuna, hyperopt_expression, optuna_distribution

    [param] = load_space({"x": spec}).params
    if backend == "tune":
        return list(param.tune_domain().sample(size=n, random_state=np.random.default_rng(0)))
    if backend == "hyperopt":
        from hyperopt.pyll import stochastic

        rng = np.random.default_rng(0)
        return [stochastic.sample(hyperopt_expression(param), rng=rng) for _ in range(n)]
    import optuna

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    dist = {"x": optuna_distribution(param)}
    return [from_optuna(param, study.ask(dist).params["x"]) for _ in range(n)]


@pytest.mark.parametrize("backend", ["tune", "optuna", "hyperopt"])
@pytest.mark.parametrize(
    ("spec", "values"),
    [
        ({"randint": [0, 4]}, {0, 1, 2, 3}),  # upper bound excluded
        ({"lograndint": [1, 4]}, {1, 2, 3}),
        ({"qrandint": [0, 10, 5]}, {0, 5, 10}),  # upper bound included for q > 1
        ({"qrandint": [1, 4, 1]}, {1, 2, 3}),  # ... and excluded for q = 1
        ({"qlograndint": [2, 8, 2]}, {2, 4, 6, 8}),
        ({"qrandint": [3, 13, 5]}, {5, 10}),  # multiples of q, not low + k * q
    ],
)
def test_integer_kinds_sample_tunes_values_in_every_backend(backend, spec, values):
    draws = _draws(backend, spec)
    assert set(draws) == values
    assert all(isinstance(v, numbers.Integral) for v in draws)


@pytest.mark.parametrize("backend", ["tune", "optuna", "hyperopt"])
@pytest.mark.parametrize(
    ("spec", "q", "middle"),
    [
        ({"qloguniform": [1e-3, 1.0, 1e-3]}, 1e-3, 0.0316),  # log scale: half below sqrt
        ({"loguniform": [1e-3, 1.0]}, None, 0.0316),
        ({"quniform": [0.0, 1.0, 0.1]}, 0.1, 0.5),
        ({"lograndint": [1, 1001]}, 1, 31.6),
    ],
)
def test_range_kinds_keep_tunes_scale_and_q_in_every_backend(backend, spec, q, middle):
    draws = _draws(backend, spec)
    low = min(spec[next(iter(spec))][:2])
    assert 0.35 < sum(v < middle for v in draws) / N < 0.65, sorted(draws)[:: N // 10]
    assert min(draws) >= low
    if q is not None:
        assert all(abs(v / q - round(v / q)) < 1e-6 for v in draws)


def test_tune_domains_keep_their_kind():
    from ray import tune as ray_tune

    space = load_space(
        {
            "a": ray_tune.qloguniform(1e-3, 1.0, 1e-3),
            "b": ray_tune.lograndint(1, 100),
            "c": ray_tune.qrandint(0, 10, 5),
            "d": ray_tune.randn(0.0, 2.0),
            "e": ray_tune.qrandn(1.0, 2.0, 0.5),
        }
    )
    assert [(p.kind, p.values) for p in space.params] == [
        (ParamKind.QLOGUNIFORM, (1e-3, 1.0, 1e-3)),
        (ParamKind.LOGRANDINT, (1, 100)),
        (ParamKind.QRANDINT, (0, 10, 5)),
        (ParamKind.RANDN, (0.0, 2.0)),
        (ParamKind.QRANDN, (1.0, 2.0, 0.5)),
    ]


def test_a_normal_goes_to_hyperopt_and_is_refused_by_optuna(tmp_path):
    import statistics

    draws = _draws("hyperopt", {"randn": [3.0, 0.5]})
    assert abs(statistics.mean(draws) - 3.0) < 0.15 and 0.4 < statistics.stdev(draws) < 0.6
    with pytest.raises(ConfigError, match="optuna searcher cannot sample"):
        _tune(tmp_path, {"lr": {"randn": [0.01, 0.001]}}, searcher="optuna")
    assert not (tmp_path / "x").exists()


def test_the_schedulers_horizon_is_the_most_steps_a_searched_steps_gives():
    from unipar.tuning.api import _most_steps

    space = load_space({"lr": {"loguniform": [1e-3, 1e-2]}, "steps": {"choice": [12, 4, 20]}})
    assert _most_steps(tune_jobs.make_job, space, 12) == 20
    ranged = load_space({"lr": {"choice": [1e-2]}, "steps": {"qrandint": [4, 30, 4]}})
    assert _most_steps(tune_jobs.make_job, ranged, 4) == 28


def test_each_trial_runs_its_own_searched_steps(ray_cluster, tmp_path):
    """The first job has 4 steps; the trial with 8 used to be stopped at step 4."""
    space = {"lr": {"choice": [1e-2]}, "steps": {"grid": [4, 8]}}
    result = _tune(tmp_path, space, num_samples=1, searcher="grid", scheduler="asha")
    assert sorted((r.steps, r.status) for r in result.rows) == [(4, "done"), (8, "done")]


def test_an_optuna_experiment_resumes(ray_cluster, tmp_path):
    """The searcher saves its study: a resume used to fail to restore the run and start
    a new experiment in its place."""
    space = {"lr": {"loguniform": [1e-3, 3e-2]}, "steps": 4}
    options = {"searcher": "optuna", "scheduler": "fifo", "num_samples": 2, "plot": False}
    first = _tune(tmp_path, space, **options)
    resumed = _tune(tmp_path, space, resume=True, **options)
    assert sorted(r.trial_id for r in resumed.rows) == sorted(r.trial_id for r in first.rows)
    assert [r.status for r in resumed.rows] == ["done", "done"]


def _sampled_configs(searcher: str, seed, samples: int = 3) -> list[dict]:
    """The configs the searcher gives its trials, without running them."""
    from ray.tune.experiment import Experiment

    from unipar.tuning.choices import SearcherKind, build_searcher

    space = load_space({"lr": {"loguniform": [1e-4, 1e-1]}, "seed": {"grid": [0, 1]}})
    generator = build_searcher(SearcherKind(searcher), space, "loss", "min", seed)
    generator.add_configurations(
        [Experiment("x", tune_jobs.make_job, config=space.tune_space(), num_samples=samples)]
    )
    configs = []
    while (trial := generator.next_trial()) is not None:
        configs.append(trial.config)
    return configs


@pytest.mark.parametrize("searcher", ["random", "grid"])
def test_random_and_grid_sampling_follow_the_seed(searcher):
    first = _sampled_configs(searcher, seed=0)
    assert len(first) == 6 and first == _sampled_configs(searcher, seed=0)
    assert first != _sampled_configs(searcher, seed=1)


def test_hyperopt_runs_as_many_trials_at_once_as_asked(tmp_path):
    from unipar.tuning.choices import SearcherKind, build_searcher

    space = load_space(SPACE)
    limited = build_searcher(SearcherKind.HYPEROPT, space, "loss", "min", 0, max_concurrent=6)
    assert limited.max_concurrent == 6  # was capped at 4 whatever was asked
    unlimited = build_searcher(SearcherKind.HYPEROPT, space, "loss", "min", 0)
    assert getattr(unlimited, "max_concurrent", None) is None
    with pytest.raises(ConfigError, match="max_concurrent must be at least 1"):
        _tune(tmp_path, max_concurrent=0)


def test_every_trial_diverging_is_a_clear_error(ray_cluster, tmp_path):
    from unipar.errors import TuningFailedError

    space = {"lr": {"choice": [1e30]}, "steps": 4}  # the loss is NaN by the last step
    with pytest.raises(TuningFailedError, match=r"1 of 1 ended with NaN.*lower the learning"):
        _tune(tmp_path, space, num_samples=1, scheduler="fifo", plot=False)
    assert "nan" in (tmp_path / "x" / "results.txt").read_text()


@pytest.mark.parametrize("steps", [4, 12, 15, 23, 40, 81, 200])
def test_a_trial_keeps_every_checkpoint_it_writes(steps):
    from unipar.tuning.trainable import checkpoint_plan

    every, keep = checkpoint_plan(steps)  # 23 steps: 12 checkpoints, 10 were kept
    written = len(set(range(every, steps + 1, every)) | {steps})  # the last step's too
    assert keep >= written >= min(steps, 8)


@pytest.mark.parametrize(
    ("grace", "factor", "rungs"),
    [(6, 2, [6, 12, 24, 48]), (12, 2, [12, 24, 48]), (3, 4, [3, 12, 48])],
)
def test_asha_stops_at_the_rungs_its_grace_and_factor_give(grace, factor, rungs):
    """Ray's ASHA itself, built as tune() builds it: its rungs over 48 steps are the
    grace times powers of the factor below the end, then the end."""
    from unipar.tuning.choices import SchedulerKind, build_scheduler

    asha = build_scheduler(SchedulerKind.ASHA, load_space(SPACE), max_steps=48,
                           grace_steps=grace, reduction_factor=factor,
                           perturbation_steps=2, seed=0)
    levels = sorted(level for level, _ in asha._brackets[0]._rungs)
    assert levels == rungs


def test_pb2_without_scikit_learn_names_it(monkeypatch):
    from unipar.tuning.choices import SchedulerKind, build_scheduler

    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn fails
    with pytest.raises(ConfigError, match=r"needs scikit-learn.*pip install scikit-learn`"):
        build_scheduler(SchedulerKind.PB2, load_space(SPACE), max_steps=8, grace_steps=2,
                        reduction_factor=2, perturbation_steps=2, seed=0)


@pytest.mark.parametrize(("mode", "order"), [("min", "abcn"), ("max", "cban")])
def test_rows_come_best_first_from_any_order(mode, order):
    """The end-to-end runs check sorted rows on whatever order Tune gave them; here the
    input is worst-first with the trial without a value (NaN) first."""
    from unipar.tuning.report import TrialRow, best_first

    given = [("n", float("nan")), ("c", 0.9), ("b", 0.5), ("a", 0.2)]
    rows = [TrialRow(name, {}, value, 4, "done") for name, value in given]
    if mode == "max":
        rows = [rows[0], *reversed(rows[1:])]  # worst first for max too
    assert "".join(r.trial_id for r in best_first(rows, mode)) == order


def test_each_trial_gets_the_plan_and_gpus_asked_for(tmp_path):
    from unipar.plan import Plan
    from unipar.runtime.config import RunConfig
    from unipar.tuning.trainable import gang_resources

    with pytest.raises(ConfigError, match="the plan's mesh needs 2 workers"):
        _tune(tmp_path, plan=Plan.data_parallel(2, 8), workers_per_trial=1)
    gang = gang_resources(RunConfig(workers=2, cpus_per_worker=2, gpus_per_worker=1))
    assert gang.bundles == [{"CPU": 2, "GPU": 1}] * 2  # the empty head bundle is implied
