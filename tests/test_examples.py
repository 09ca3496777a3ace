"""The examples stay runnable."""

from __future__ import annotations

import runpy
from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_plan_example(capsys):
    runpy.run_path(str(EXAMPLES / "plan_llama.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "chosen:" in out and "plan for the runtime:" in out


def test_job_example_trains_in_one_process():
    job = runpy.run_path(str(EXAMPLES / "my_job.py"))["job"]()
    torch.manual_seed(job.seed)
    model, data = job.model(), job.dataset()
    optimizer = job.build_optimizer(model.parameters())
    inputs = torch.stack([data[i][0] for i in range(64)])
    targets = torch.stack([data[i][1] for i in range(64)])
    losses = []
    for _ in range(30):
        loss = job.loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
