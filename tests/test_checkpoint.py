"""Checkpoint files in one process: atomic layout, partial writes ignored, pruning."""

from __future__ import annotations

import pytest
import torch

from unipar import CheckpointError
from unipar.runtime.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_model_state,
    read_checkpoint,
    save_checkpoint,
)


def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


STATE = {"world_size": 1, "global_batch_size": 4, "plan": {}}


def test_save_load_roundtrip_and_keep_last(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    for step in (1, 2, 3):
        save_checkpoint(
            tmp_path, step=step, parts=[model], optimizers=[optimizer], state=STATE, keep=2
        )
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002", "step_00000003"]
    assert read_checkpoint(latest_checkpoint(tmp_path)).step == 3

    other, other_optimizer = _model_and_optimizer(1)
    load_checkpoint(latest_checkpoint(tmp_path), parts=[other], optimizers=[other_optimizer])
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(
        optimizer.state_dict()["state"][0]["exp_avg"],
        other_optimizer.state_dict()["state"][0]["exp_avg"],
    )
    full = load_model_state(tmp_path)
    assert torch.equal(full["0.weight"], model[0].weight)


def test_partial_write_is_ignored_and_cleaned(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    save_checkpoint(tmp_path, step=1, parts=[model], optimizers=[optimizer], state=STATE, keep=3)
    crashed = tmp_path / ".step_00000002.partial"  # as if a writer died midway
    crashed.mkdir()
    (crashed / "__0_0.distcp").write_bytes(b"half")
    assert latest_checkpoint(tmp_path).name == "step_00000001"
    save_checkpoint(tmp_path, step=2, parts=[model], optimizers=[optimizer], state=STATE, keep=3)
    assert not crashed.exists()
    assert latest_checkpoint(tmp_path).name == "step_00000002"


def test_missing_state_file_is_corrupt(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    path = save_checkpoint(
        tmp_path, step=1, parts=[model], optimizers=[optimizer], state=STATE, keep=1
    )
    (path / "unipar_state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        read_checkpoint(path)


def test_clean_name_drops_only_the_recompute_wrapper():
    from unipar.runtime.weights import clean_name

    wrapped = "layers.0._checkpoint_wrapped_module.attention.rope_cos"
    assert clean_name(wrapped) == "layers.0.attention.rope_cos"
    assert clean_name("my_module.submodule.scale") == "my_module.submodule.scale"
