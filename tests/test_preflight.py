"""One preflight per run: before any worker starts, the driver builds the job's model on
the meta device once and opens its dataset once, whatever the plan asks of them (the
planner's analysis, the embedding share, the checks of tp/pp against the layers), and
``unipar train`` executes the job file once."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from ray import cloudpickle as ray_cloudpickle

from unipar.cluster import cluster_preset
from unipar.plan import Strategy
from unipar.plan.for_job import plan_job
from unipar.runtime.config import RunConfig
from unipar.runtime.preflight import preflight
from unipar.runtime.run import fit
from unipar.testing import tiny_gpt_job

CALLS: Counter[str] = Counter()
ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers unpickle Counted


class Counted:
    """A factory that counts its calls in the driver (workers count in their own process,
    where this module's counter is another object)."""

    def __init__(self, factory, name: str) -> None:
        self.factory, self.name = factory, name

    def __call__(self):
        where = "meta" if torch.empty(0).device.type == "meta" else "real"
        CALLS[f"{self.name} on {where}"] += 1
        return self.factory()


def _counted_job(steps: int = 2):
    job = tiny_gpt_job(steps=steps)
    return replace(job, model=Counted(job.model, "model"), dataset=Counted(job.dataset, "data"))


@pytest.mark.parametrize(
    ("plan", "elastic"),
    [("tp", True), ("auto", False)],
    ids=["tp", "auto-restart-mode"],
)
def test_the_model_is_built_on_meta_once_before_workers_start(
    ray_cluster, tmp_path, plan, elastic
):
    CALLS.clear()
    result = fit(_counted_job(), workers=2, plan=plan, elastic=elastic, progress=False,
                 run_dir=tmp_path / "run")
    assert len(result.history) == 2
    assert Counter({"model on meta": 1, "data on real": 1}) == CALLS, CALLS


def test_a_given_tp_plan_is_checked_against_one_meta_build(tmp_path):
    tp = plan_job(tiny_gpt_job(), cluster_preset("a100-80g", devices_per_node=2), Strategy.TP)
    CALLS.clear()
    job = _counted_job()
    tp = tp.best.plan
    assert tp.mesh.tp == 2
    pre = preflight(job, RunConfig(workers=2, plan=tp, run_dir=tmp_path / "run"))
    assert pre.facts.spec.meta_model is pre.facts.spec.meta_model
    assert pre.facts.profile is pre.facts.profile
    assert Counter({"model on meta": 1, "data on real": 1}) == CALLS, CALLS


JOB_FILE = """\
import os
from pathlib import Path

from unipar.testing import tiny_mlp_job

with Path(os.environ["EXECUTIONS"]).open("a") as log:
    log.write(f"{os.getpid()}\\n")

job = tiny_mlp_job(steps=3)
"""


def test_a_job_file_is_executed_once_per_command(tmp_path):
    """``--adaptive-batch`` used to execute the job file twice (once to check it);
    workers unpickle the job, they do not run its file."""
    (tmp_path / "job.py").write_text(JOB_FILE)
    log = tmp_path / "executions"
    command = [str(Path(sys.executable).parent / "unipar"), "train", "job.py", "--workers",
               "1", "--strategy", "ddp", "--adaptive-batch", "--no-progress"]
    with subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=os.environ | {"EXECUTIONS": str(log)}) as process:
        out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err[-3000:]
    assert "unipar run summary" in out
    assert log.read_text().split() == [str(process.pid)]
