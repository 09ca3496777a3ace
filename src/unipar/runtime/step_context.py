"""What a job's own step (``Job(step=fn)``, called as ``fn(model, batch, ctx)``) may use
of the run: the device mesh, its process groups per axis, the plan and the rank, so it
can call ``torch.distributed`` collectives on the same groups the runtime uses (what
``ray.util.collective`` gives Ray actors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unipar.plan import Plan
from unipar.plan.representation import MeshAxis


@dataclass(frozen=True)
class StepContext:
    """The run as one rank sees it during a step (one per run: :func:`step_context`).

    ``mesh``: the ``torch.distributed`` ``DeviceMesh`` over all ranks, axes
    ``("pp", "dp", "fsdp", "tp")`` (``None`` in a single process). ``data_group``: the
    group of the data-parallel replicas this rank's slice of the batch is one of
    (``dp`` x ``fsdp``): an all-gather over it sees the whole global batch.
    """

    mesh: Any
    plan: Plan
    rank: int
    world_size: int
    data_group: Any = None

    def group(self, axis: MeshAxis | str) -> Any:
        """This rank's process group along ``axis`` (``"dp"``, ``"fsdp"``, ``"tp"``,
        ``"pp"``); ``None`` in a single process (a collective has nothing to do)."""
        axis = MeshAxis(axis)
        if self.mesh is None:
            return None
        return self.mesh[axis.value].get_group()

    @property
    def groups(self) -> dict[MeshAxis, Any]:
        """This rank's process group along every axis of the mesh."""
        axes = (MeshAxis.PP, MeshAxis.DP, MeshAxis.FSDP, MeshAxis.TP)
        return {axis: self.group(axis) for axis in axes}

    @property
    def data_replicas(self) -> int:
        return self.plan.mesh.data_replicas


def step_context(mesh: Any, plan: Plan, rank: int, world_size: int) -> StepContext:
    """The context of a run on ``mesh`` (every rank calls this, in the same order: making
    the data group of a mesh with both ``dp`` and ``fsdp`` is collective)."""
    if mesh is None:
        return StepContext(None, plan, rank, world_size)
    sizes = plan.mesh
    if sizes.dp > 1 and sizes.fsdp > 1:
        data = mesh["dp", "fsdp"]._flatten("data").get_group()
    else:
        data = mesh["fsdp" if sizes.fsdp > 1 else "dp"].get_group()
    return StepContext(mesh, plan, rank, world_size, data)
