"""Training with parameter servers on Ray: the driver partitions the model, starts the
servers and one worker actor per data shard; each worker loops pull -> forward/backward
-> push under the consistency model until a shared step budget is spent.

The model is a plain ``nn.Module``; its ``nn.Embedding`` tables live on the servers and
the worker's copy gets, at each lookup, only the rows the batch touches (a forward
pre-hook swaps in the pulled rows and renumbers the ids). Dense tensors live on the
servers too, pulled at their first use in a clock (with the first table's rows, in the
same call to each server, when a table comes first), or (``serve_dense=False``) stay on
the workers and are all-reduced with gloo, each worker then stepping a local
``torch.optim`` optimizer. Pushes are not waited for: they travel while the worker
reads its next batch (see :class:`~unipar.runtime.servers.client.PSClient`).
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
import torch.distributed as dist
from torch import nn

from unipar.errors import ConfigError
from unipar.optimizer import OptimizerKind, OptimizerSpec
from unipar.ps.consistency import Consistency, ConsistencySpec
from unipar.ps.partition import Partitioning, RowSharding, TensorInfo, partition
from unipar.ps.worth import check_worth_serving
from unipar.runtime.servers.client import PSClient, start_servers

DataFn = Callable[[int, int], Any]  # (worker, clock) -> batch
# What the servers run when a PSConfig names no optimizer.
SERVER_DEFAULT_OPTIMIZER = OptimizerSpec(OptimizerKind.SGD, lr=0.01)
LossFn = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(frozen=True)
class PSConfig:
    num_servers: int = 1
    sharding: RowSharding = RowSharding.RANGE
    optimizer: OptimizerSpec = SERVER_DEFAULT_OPTIMIZER
    consistency: ConsistencySpec = field(default_factory=ConsistencySpec)
    serve_dense: bool = True  # False: dense tensors all-reduced among the workers
    snapshot_dir: str | None = None
    snapshot_every: int = 0  # clocks between server snapshots (0: none)


def tensor_infos(model: nn.Module) -> list[TensorInfo]:
    tables = {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Embedding)}
    return [
        TensorInfo(name, tuple(p.shape), name in tables) for name, p in model.named_parameters()
    ]


class _Budget:
    """Steps left to the whole run (workers take one per clock)."""

    def __init__(self, steps: int) -> None:
        self.left = steps

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


class PSWorker:
    """One data-parallel worker (a Ray actor)."""

    def __init__(
        self,
        rank: int,
        world: int,
        factory: Callable[[], nn.Module],
        parts: Partitioning,
        servers: list[Any],
        config: PSConfig,
        dense_init: dict[str, torch.Tensor] | None,
        port: int,
    ) -> None:
        self.rank, self.world, self.config = rank, world, config
        self.client = PSClient(rank, parts, servers)
        with torch.device("meta"):
            self.model = factory()
        self.tables = {
            f"{name}.weight": m
            for name, m in self.model.named_modules()
            if isinstance(m, nn.Embedding)
        }
        for table, module in self.tables.items():
            module.register_forward_pre_hook(self._lookup_hook(table))
        self.clock = 0
        self._dense_fresh = False  # this clock's dense tensors are in the model
        self._materialized = False  # the model's dense tensors are off the meta device
        self.local_optimizer = None
        if dense_init is None:  # dense tensors on the servers: pulled with the first use
            table_modules = set(self.tables.values())
            for module in self.model.modules():
                owns = next(module.parameters(recurse=False), None) is not None
                if owns and module not in table_modules:
                    module.register_forward_pre_hook(self._dense_hook)
        else:  # dense tensors stay here, all-reduced
            self.model.load_state_dict(dense_init, strict=False, assign=True)
            dense = [p for n, p in self.model.named_parameters() if n not in self.tables]
            self.local_optimizer = config.optimizer.build(dense)
            if world > 1:
                dist.init_process_group(
                    "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
                )

    def ready(self) -> bool:
        """Answers once the worker is built (``PSRun`` times training from there)."""
        return True

    def _lookup_hook(self, table: str) -> Callable:
        """Swap in the rows ``ids`` touch (and, in the same calls to the servers, the
        dense tensors if this clock has not pulled them yet)."""

        def hook(module: nn.Embedding, args: tuple) -> tuple:
            (ids, *rest) = args
            wants_dense = self.local_optimizer is None and not self._dense_fresh
            pulled = self.client.pull(self.clock, {table: ids.reshape(-1)}, dense=wants_dense)
            if wants_dense:
                self._load_dense(pulled.dense)
            module.weight = nn.Parameter(pulled.rows[table])
            self._touched[table] = pulled.ids[table]
            local = torch.searchsorted(pulled.ids[table], ids)
            return (local, *rest)

        return hook

    def _dense_hook(self, module: nn.Module, args: tuple) -> None:
        """A dense layer runs before any table this clock: pull the dense tensors alone."""
        if not self._dense_fresh:
            self._load_dense(self.client.pull(self.clock, {}, dense=True).dense)

    def _load_dense(self, dense: dict[str, torch.Tensor]) -> None:
        if not self._materialized:
            self.model.load_state_dict(dense, strict=False, assign=True)
            for name, p in self.model.named_parameters():
                if name not in self.tables:
                    p.requires_grad_(True)
            self._materialized = True
        else:
            with torch.no_grad():
                params = dict(self.model.named_parameters())
                for name, t in dense.items():
                    params[name].copy_(t)
        self._dense_fresh = True

    def run(
        self,
        data: DataFn,
        loss_fn: LossFn,
        budget: Any,
        quota: int,
        slowdown: Slowdown | None = None,
    ) -> dict:
        """Run ``quota`` clocks, or while the shared ``budget`` actor gives steps."""
        losses, step_s = [], []
        start = time.perf_counter()
        while ray.get(budget.take.remote()) if budget is not None else self.clock < quota:
            self.clock += 1
            began, pulling = time.perf_counter(), self.client.traffic.pull_s
            self._touched: dict[str, torch.Tensor] = {}
            self._dense_fresh = False
            if self.local_optimizer is None and not self._materialized:  # off the meta
                self._load_dense(self.client.pull(self.clock, {}, dense=True).dense)  # device
            self.model.zero_grad(set_to_none=True)
            loss = loss_fn(self.model, data(self.rank, self.clock))
            loss.backward()
            if self.client.pulled_clock < self.clock:  # read nothing: still wait, in order
                self.client.pull(self.clock, {}, dense=False)
            factor = slowdown.factor_at(self.rank, self.clock, self.world) if slowdown else 1.0
            if factor > 1:  # stretch the worker's own work (not its waits in pulls): its
                waited = self.client.traffic.pull_s - pulling  # gradients come later
                time.sleep((factor - 1) * (time.perf_counter() - began - waited))
            rows = {t: (self._touched[t], self.tables[t].weight.grad) for t in self._touched}
            dense = {
                n: p.grad
                for n, p in self.model.named_parameters()
                if n not in self.tables and p.grad is not None
            }
            if self.local_optimizer is None and dense and not self._dense_fresh:
                raise ConfigError(
                    f"dense parameters {sorted(dense)[:3]} got gradients in clock "
                    f"{self.clock}, but no module owning dense parameters ran its forward, "
                    "so they held the previous clock's values: a worker refreshes them "
                    "when such a module is called; call the module (model.head(x)), not "
                    "its weights directly, or pass serve_dense=False"
                )
            if self.local_optimizer is not None:
                self._all_reduce(dense)
                self.local_optimizer.step()
                dense = {}
            self.client.push(self.clock, dense, rows)
            losses.append(loss.item())
            step_s.append(time.perf_counter() - began)
        self.client.settle()
        for server in self.client.servers:
            ray.get(server.leave.remote(self.rank))
        return {
            "losses": losses,
            "step_s": step_s,
            "wall_s": time.perf_counter() - start,
            "pulled": self.client.traffic.pulled,
            "pushed": self.client.traffic.pushed,
            "dense": {
                n: p.detach().clone()
                for n, p in self.model.named_parameters()
                if n not in self.tables
            }
            if self.local_optimizer
            else {},
        }

    def _all_reduce(self, grads: dict[str, torch.Tensor]) -> None:
        if self.world == 1:
            return
        for g in grads.values():
            dist.all_reduce(g)
            g.div_(self.world)
            self.client.traffic.pushed += g.numel() * g.element_size()


@dataclass(frozen=True)
class Slowdown:
    """A straggler, for experiments: the slow worker sleeps ``factor - 1`` times as long
    again as each step's work up to its backward pass took (its time in pulls, and their
    waits, left out), before it pushes: its gradients come that much later.
    Persistent (``rotate_every=0``): always ``worker``. Transient (``rotate_every=k``):
    the slow worker changes every ``k`` clocks, worker ``(clock - 1) // k % workers``,
    so at any time exactly one worker is slow."""

    factor: float = 2.0
    worker: int = 0
    rotate_every: int = 0

    def __post_init__(self) -> None:
        if self.factor < 1 or self.rotate_every < 0 or self.worker < 0:
            raise ConfigError(
                f"a slowdown needs factor >= 1, worker >= 0 and rotate_every >= 0, but got "
                f"factor={self.factor}, worker={self.worker}, rotate_every={self.rotate_every}"
            )

    def factor_at(self, worker: int, clock: int, workers: int) -> float:
        slow = (clock - 1) // self.rotate_every % workers if self.rotate_every else self.worker
        return self.factor if worker == slow else 1.0


@dataclass(frozen=True)
class PSResult:
    losses: list[list[float]]  # per worker
    step_s: list[list[float]]  # per worker, each step's time
    params: dict[str, torch.Tensor]  # the trained model's full state
    wall_s: float  # from every worker and server up to the last worker's end
    bytes_pulled: int
    bytes_pushed: int
    steps: int
    server_status: list[dict]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PSRun:
    """A running PS job: ``start`` returns at once; ``result`` waits for it."""

    def __init__(
        self,
        factory: Callable[[], nn.Module],
        data: DataFn,
        loss_fn: LossFn,
        *,
        workers: int,
        steps: int,
        config: PSConfig,
        slowdown: Slowdown | None = None,
        shared_budget: bool = False,
    ) -> None:
        """``steps`` clocks per worker; with ``shared_budget``, ``steps * workers``
        worker-steps shared first come first served (fast workers do more)."""
        model = factory()
        infos = tensor_infos(model)
        check_worth_serving(infos, serve_dense=config.serve_dense)
        served = infos if config.serve_dense else [t for t in infos if t.embedding]
        self.parts = partition(served, config.num_servers, config.sharding)
        state = {n: p.detach() for n, p in model.named_parameters()}
        if config.snapshot_dir:
            shutil.rmtree(config.snapshot_dir, ignore_errors=True)
            os.makedirs(config.snapshot_dir)
        self.servers = start_servers(
            self.parts,
            state,
            optimizer=config.optimizer,
            consistency=config.consistency,
            num_workers=workers,
            snapshot_dir=config.snapshot_dir,
            snapshot_every=config.snapshot_every,
        )
        dense_init = (
            None
            if config.serve_dense
            else {n: t for n, t in state.items() if n not in self.parts.tables}
        )
        del model, state
        self.config = config
        self.workers: list[Any] = []
        self.budget = None
        try:
            if shared_budget:
                self.budget = ray.remote(_Budget).options(num_cpus=0).remote(steps * workers)
            port = _free_port()
            actor = ray.remote(PSWorker).options(num_cpus=0)
            self.workers = [
                actor.remote(
                    r, workers, factory, self.parts, self.servers, config, dense_init, port
                )
                for r in range(workers)
            ]
            # training time starts once every worker is up (processes, model, connections)
            up = [w.ready.remote() for w in self.workers]
            ray.get(up + [server.status.remote() for server in self.servers])
        except BaseException:  # a worker failed to build: stop what was started
            self.stop()
            raise
        self.started = time.perf_counter()
        self.refs = [
            w.run.remote(data, loss_fn, self.budget, steps, slowdown) for w in self.workers
        ]
        self._running = list(self.refs)  # the workers not yet done

    def stop(self) -> None:
        """Stop the run's workers, servers and shared step budget."""
        for handle in [*self.workers, *self.servers, self.budget]:
            if handle is not None:
                ray.kill(handle)

    def server_status(self) -> list[dict]:
        return ray.get([s.status.remote() for s in self.servers])

    def poll(self, timeout_s: float | None = None) -> bool:
        """Whether every worker is done, waiting up to ``timeout_s`` (None: no limit) for
        one more. A worker's error is raised as soon as it comes (its peers may wait for
        it at a barrier forever), and the run is stopped."""
        if self._running:
            done, self._running = ray.wait(self._running, num_returns=1, timeout=timeout_s)
            try:
                ray.get(done)
            except BaseException:
                self.stop()
                raise
        return not self._running

    def result(self) -> PSResult:
        """The run's outcome once every worker is done (:meth:`poll`); workers and
        servers are stopped either way."""
        while not self.poll():
            pass
        try:
            outs = ray.get(self.refs)
            wall = time.perf_counter() - self.started
            params = self.gather()
            params.update(outs[0]["dense"])
            status = self.server_status()
        finally:
            self.stop()
        return PSResult(
            losses=[o["losses"] for o in outs],
            step_s=[o["step_s"] for o in outs],
            params=params,
            wall_s=wall,
            bytes_pulled=sum(o["pulled"] for o in outs),
            bytes_pushed=sum(o["pushed"] for o in outs),
            steps=sum(len(o["losses"]) for o in outs),
            server_status=status,
        )

    def gather(self) -> dict[str, torch.Tensor]:
        states = ray.get([s.state.remote() for s in self.servers])
        out = {}
        for name, rows in self.parts.tables.items():
            table = torch.empty(rows, states[0][name].shape[1])
            for s, st in enumerate(states):
                table[self.parts.global_ids(name, s, torch.arange(len(st[name])))] = st[name]
            out[name] = table
        for name, s in self.parts.dense.items():
            out[name] = states[s][name]
        return out


def train(
    factory: Callable[[], nn.Module],
    data: DataFn,
    loss_fn: LossFn,
    *,
    workers: int,
    steps: int,
    config: PSConfig = PSConfig(),
    slowdown: Slowdown | None = None,
    shared_budget: bool = False,
) -> PSResult:
    """Train ``factory()`` with parameter servers (see :class:`PSRun`)."""
    return PSRun(
        factory,
        data,
        loss_fn,
        workers=workers,
        steps=steps,
        config=config,
        slowdown=slowdown,
        shared_budget=shared_budget,
    ).result()


__all__ = ["Consistency", "PSConfig", "PSResult", "PSRun", "Slowdown", "train"]
