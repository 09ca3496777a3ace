"""Checkpoint files in one process: atomic layout, partial writes ignored, pruning."""

from __future__ import annotations

import warnings

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


def test_one_process_saves_and_loads_without_dcps_warning(tmp_path):
    """DCP warns at each save and load without a process group; a one-worker run is
    one process by intent, and its output stays clean of it."""
    model, optimizer = _model_and_optimizer(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = save_checkpoint(
            tmp_path, step=1, parts=[model], optimizers=[optimizer], state=STATE, keep=1
        )
        load_checkpoint(path, parts=[model], optimizers=[optimizer])


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
    from unipar.runtime.parallel.weights import clean_name

    wrapped = "layers.0._checkpoint_wrapped_module.attention.rope_cos"
    assert clean_name(wrapped) == "layers.0.attention.rope_cos"
    assert clean_name("my_module.submodule.scale") == "my_module.submodule.scale"


class _CreatesFile:
    """Unpickling this creates ``path``: a stand-in for any code a pickle can run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _checkpoint(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    path = save_checkpoint(
        tmp_path / "ckpt", step=1, parts=[model], optimizers=[optimizer], state=STATE, keep=1
    )
    return path, model, optimizer


def test_the_crafted_pickle_runs_code_when_loaded_unsafely(tmp_path):
    """The control: without weights_only the payload below does create its file."""
    torch.save({"torch": _CreatesFile(tmp_path / "pwned")}, tmp_path / "evil.pt")
    torch.load(tmp_path / "evil.pt", weights_only=False)
    assert (tmp_path / "pwned").exists()


def test_crafted_rng_state_is_refused_and_runs_nothing(tmp_path):
    from unipar.runtime.safe_load import UnsafeCheckpointError

    path, model, optimizer = _checkpoint(tmp_path)
    marker = tmp_path / "pwned"
    torch.save({"torch": _CreatesFile(marker)}, path / "rng_rank0.pt")
    with pytest.raises(UnsafeCheckpointError, match=r"refused to load .*rng_rank0\.pt.*Nothing"):
        load_checkpoint(path, parts=[model], optimizers=[optimizer])
    assert not marker.exists()


def test_crafted_dcp_metadata_is_refused_and_runs_nothing(tmp_path):
    import pickle

    from unipar.runtime.safe_load import UnsafeCheckpointError

    path, model, optimizer = _checkpoint(tmp_path)
    marker = tmp_path / "pwned"
    (path / ".metadata").write_bytes(pickle.dumps(_CreatesFile(marker)))
    for load in (read_checkpoint, load_model_state):
        with pytest.raises(UnsafeCheckpointError, match=r"refused to load .*\.metadata"):
            load(path)
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(path, parts=[model], optimizers=[optimizer])
    assert not marker.exists()


def test_crafted_consolidated_model_state_is_refused_and_runs_nothing(tmp_path):
    """A DCP checkpoint whose model state holds a pickled object next to its tensors:
    reading the full model state (and resuming from it) refuses it."""
    import json

    import torch.distributed.checkpoint as dcp

    from unipar.runtime.safe_load import UnsafeCheckpointError

    marker = tmp_path / "pwned"
    path = tmp_path / "ckpt" / "step_00000001"
    state = {"model": {"weight": torch.ones(2), "extra": _CreatesFile(marker)}}
    dcp.save(state, checkpoint_id=str(path))
    (path / "unipar_state.json").write_text(json.dumps({"step": 1, **STATE}))
    with pytest.raises(UnsafeCheckpointError, match="Nothing in it was run"):
        load_model_state(path)
    assert not marker.exists()


def test_rng_state_file_holds_only_plain_data(tmp_path):
    path, _, _ = _checkpoint(tmp_path)
    states = torch.load(path / "rng_rank0.pt", weights_only=True)
    assert set(states) == {"torch", "numpy", "python", "cuda"}


def test_damaged_rng_state_is_reported_as_corrupt_not_as_crafted(tmp_path):
    path, model, optimizer = _checkpoint(tmp_path)
    (path / "rng_rank0.pt").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match=r"incomplete or corrupt: rng_rank0\.pt cannot be"):
        load_checkpoint(path, parts=[model], optimizers=[optimizer])
