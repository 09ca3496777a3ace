"""A batch the runtime cannot split (a leaf that is not a tensor, one without the batch
dimension, samples that do not stack) is refused before Ray starts, by one error that
names the key; a custom step under a plan that cannot honour it likewise. No Ray here
but the command line's own process, which must not get as far as starting it."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import default_collate

from unipar import ConfigError, Job
from unipar.plan import Strategy
from unipar.runtime.config import RunConfig
from unipar.runtime.preflight import preflight

SEQ = 8


class Records(torch.utils.data.Dataset):
    """Token ids with whatever else ``extra(index)`` puts in each sample's inputs."""

    def __init__(self, extra) -> None:  # type: ignore[no-untyped-def]
        self.extra = extra

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        inputs = {"input_ids": torch.full((SEQ,), index), **self.extra(index)}
        return inputs, torch.tensor(index % 2)


def _text(index: int) -> dict:
    return {"text": f"sentence {index}"}


def _ragged(index: int) -> dict:
    return {"attention_mask": torch.ones(SEQ + index)}


def _nothing(index: int) -> dict:
    return {}


def _shared_positions(samples):  # type: ignore[no-untyped-def]
    """A user's collate that adds one position row for the whole batch."""
    inputs, targets = default_collate(samples)
    return {**inputs, "position_ids": torch.arange(SEQ)}, targets


def _job(extra, **options) -> Job:  # type: ignore[no-untyped-def]
    return Job(
        model=lambda: torch.nn.Linear(SEQ, 2),
        dataset=functools.partial(Records, extra),
        global_batch_size=4,
        steps=1,
        **options,
    )


@pytest.mark.parametrize(
    ("job", "says"),
    [
        (_job(_text), r"batch leaf inputs\['text'\] is a str \('sentence 0'\), not a tensor"),
        (
            _job(_nothing, collate=_shared_positions),
            r"batch leaf inputs\['position_ids'\] has shape \(8,\), without the batch dimension",
        ),
        (_job(_ragged), r"cannot be collated into a batch at inputs\['attention_mask'\]"),
        (_job(_nothing, call="kwargs", collate=lambda s: (torch.zeros(2, SEQ), torch.zeros(2))),
         r"Job\(call='kwargs'\) calls model\(\*\*inputs\), so the inputs must be a dict"),
    ],
    ids=["text-leaf", "no-batch-dimension", "ragged", "kwargs-without-names"],
)
def test_a_batch_the_runtime_cannot_split_is_refused_by_key(tmp_path, job, says):
    with pytest.raises(ConfigError, match=says):
        preflight(job, RunConfig(workers=2, run_dir=tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def _step(model, batch, ctx):  # type: ignore[no-untyped-def]
    inputs, _ = batch
    return model(inputs["input_ids"].float()).sum()


def test_a_custom_step_under_a_pipeline_is_refused_before_start(tmp_path):
    job = _job(_nothing, step=_step)
    with pytest.raises(ConfigError, match="under pipeline parallelism the schedule owns"):
        preflight(job, RunConfig(workers=2, plan=Strategy.PP, run_dir=tmp_path / "run"))


JOB_FILE = """\
import torch
from unipar import Job

class Reviews(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        inputs = {"input_ids": torch.zeros(8, dtype=torch.long), "text": "a review"}
        return inputs, torch.tensor(1)

job = Job(model=lambda: torch.nn.Linear(8, 2), dataset=Reviews, global_batch_size=4,
          steps=1, call="kwargs")
"""


def test_the_command_line_answers_one_error_line_naming_the_key(tmp_path):
    (tmp_path / "job.py").write_text(JOB_FILE)
    command = [str(Path(sys.executable).parent / "unipar"), "train", "job.py", "--workers",
               "2", "--strategy", "ddp", "--no-progress"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env=os.environ | {"RAY_ADDRESS": ""})
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("unipar: error: batch leaf inputs['text'] is a str")
    assert "Ray" not in done.stdout + done.stderr  # answered before Ray started
