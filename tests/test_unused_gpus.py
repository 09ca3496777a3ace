"""A run that reserves no GPU on a cluster that has some says so, and how to use them."""

from __future__ import annotations

from unipar.runtime.config import RunConfig
from unipar.runtime.elastic.gang_workers import unused_gpus_note


def test_a_run_without_gpus_on_a_gpu_cluster_is_told_how_to_use_them(tmp_path):
    cpu_only = RunConfig(workers=2, run_dir=tmp_path)
    note = unused_gpus_note(cpu_only, {"CPU": 16.0, "GPU": 2.0})
    assert note is not None and "has 2 GPUs and this run uses none" in note
    assert "--gpus-per-worker 1" in note
    assert "1 GPU and" in (unused_gpus_note(cpu_only, {"GPU": 1.0}) or "")
    assert unused_gpus_note(cpu_only, {"CPU": 16.0}) is None
    on_gpus = RunConfig(workers=2, gpus_per_worker=1.0, run_dir=tmp_path)
    assert unused_gpus_note(on_gpus, {"CPU": 16.0, "GPU": 2.0}) is None

