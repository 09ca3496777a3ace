"""Every Python block of docs/models.md runs: each defines a ``job`` that passes the
preflight (its batch splits, its model builds on the meta device), and one without a
custom step takes a pipeline plan (its stages compose on the meta device). No Ray."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from unipar.cluster import cluster_preset
from unipar.plan import Strategy
from unipar.plan.for_job import plan_job
from unipar.runtime.config import RunConfig
from unipar.runtime.preflight import check_model_takes_plan, preflight

PAGE = Path(__file__).resolve().parents[1] / "docs" / "models.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)


def test_the_page_has_its_examples():
    assert len(BLOCKS) == 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_each_block_defines_a_job_that_passes_the_preflight(tmp_path, index):
    namespace: dict = {"__name__": f"docs_models_{index}"}
    exec(compile(BLOCKS[index], f"{PAGE}:block{index}", "exec"), namespace)
    job = namespace["job"]
    pre = preflight(job, RunConfig(workers=2, run_dir=tmp_path / "run"))
    assert pre.batch is not None
    if job.step is None:
        cluster = cluster_preset("a100-80g", devices_per_node=2)
        plan = plan_job(pre.facts, cluster, Strategy.PP).best.plan
        assert plan.mesh.pp == 2
        check_model_takes_plan(pre, plan)
