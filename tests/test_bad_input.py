"""Bad input: each mistake gets an error that names the rule and values, and nothing
already on disk is overwritten."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from unipar import CheckpointError, ConfigError, ResourceError, UserCodeError, fit
from unipar.testing import tiny_gpt_job


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def finished_run(ray_cluster, tmp_path_factory):
    """A completed run whose checkpoints the bad inputs below must not touch."""
    run_dir = tmp_path_factory.mktemp("finished")
    fit(tiny_gpt_job(steps=4), workers=2, run_dir=run_dir, checkpoint_every=2, progress=False)
    return run_dir


def test_more_workers_than_cluster(ray_cluster, tmp_path):
    with pytest.raises(ResourceError, match=r"needs 12 CPUs \(6 workers x 2 CPU each\).*has 4"):
        fit(
            tiny_gpt_job(global_batch_size=12),
            workers=6,
            cpus_per_worker=2,
            run_dir=tmp_path,
            progress=False,
        )
    assert not (tmp_path / "metrics.jsonl").exists()


def test_model_factory_raises(ray_cluster, tmp_path):
    with pytest.raises(UserCodeError, match=r"model factory raised RuntimeError: .*on purpose"):
        fit(tiny_gpt_job(failing_model=True), workers=2, run_dir=tmp_path, progress=False)


def test_dataset_smaller_than_one_global_batch(ray_cluster, tmp_path):
    job = tiny_gpt_job(global_batch_size=16, dataset_size=10)
    with pytest.raises(ConfigError, match="10 samples and global_batch_size=16"):
        fit(job, workers=2, run_dir=tmp_path, progress=False)


def test_unwritable_checkpoint_dir(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match="not writable"):
        fit(tiny_gpt_job(), workers=2, checkpoint_dir=blocker / "ckpt", run_dir=tmp_path)
    assert blocker.read_text() == "not a directory"


def test_resume_from_missing_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        fit(tiny_gpt_job(), workers=2, run_dir=tmp_path, resume=tmp_path / "nope")
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        fit(tiny_gpt_job(), workers=2, run_dir=tmp_path, resume=True)


def test_resume_from_corrupt_checkpoint(finished_run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(finished_run / "checkpoints", copy)
    newest = sorted(copy.glob("step_*"))[-1]
    (newest / ".metadata").write_bytes(b"\x00garbage")
    before = _tree_digest(copy)
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        fit(tiny_gpt_job(steps=6), workers=2, checkpoint_dir=copy, run_dir=tmp_path, resume=True)
    assert _tree_digest(copy) == before


def test_existing_checkpoints_are_not_overwritten(finished_run):
    before = _tree_digest(finished_run)
    with pytest.raises(CheckpointError, match=r"already holds checkpoints.*resume=True"):
        fit(tiny_gpt_job(), workers=2, run_dir=finished_run, progress=False)
    assert _tree_digest(finished_run) == before


def test_batch_not_divisible_by_workers():
    with pytest.raises(ConfigError, match="global_batch_size=9, workers=2"):
        fit(tiny_gpt_job(global_batch_size=9), workers=2)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"workers": 0}, "workers must be >= 1, but got 0"),
        ({"max_failures": -1}, "max_failures must be >= 0"),
        ({"checkpoint_every": 0}, "checkpoint_every must be >= 1"),
    ],
)
def test_bad_run_settings(kwargs, pattern, tmp_path):
    with pytest.raises(ConfigError, match=pattern):
        fit(tiny_gpt_job(), run_dir=tmp_path, **kwargs)


def test_resume_continues_a_finished_run_to_more_steps(finished_run, ray_cluster, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    result = fit(tiny_gpt_job(steps=6), workers=2, run_dir=run, resume=True, progress=False)
    assert [m.step for m in result.history] == [4, 5]
    assert result.final_checkpoint.name == "step_00000006"
