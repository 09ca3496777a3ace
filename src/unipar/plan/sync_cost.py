"""Price a parameter server next to an all-reduce, per training step, and choose. Pure:
the planner's cost model of the gradient exchange (:mod:`unipar.plan.grad_sync` feeds it
a model's tables), below the servers themselves (:mod:`unipar.ps`).

- All-reduce (ring; Patarasuk & Yuan 2009; Thakur et al. 2005):
  ``t = 2 (n-1)/n * B / bw + 2 (n-1) * alpha`` where ``B`` is every gradient byte,
  embedding tables included (a dense gradient of a table is as big as the table).
- Parameter server (Li et al., OSDI 2014): each worker pulls the rows its batch
  touches and the served dense tensors, and pushes as many gradient bytes (plus 8-byte
  row ids); its own link carries ``pull + push`` and each of ``k`` servers carries
  ``n/k`` of every worker's traffic, so ``t = max(worker bytes / bw_worker,
  n * worker bytes / (k * bw_server)) + r * alpha_ps + rows * c_row * max(1, n/k)``:
  ``r`` round trips of an actor call (one pull of dense tensors and rows, one push;
  a model that runs a dense layer before its first table pulls the dense tensors alone,
  one more)
  and a per-row cost ``c_row`` for finding, routing, gathering and scattering each
  touched row on the worker and applying it on its server (whose share grows with
  ``n/k``).
- Staleness: with SSP (s > 0) or ASP the exchange of one step overlaps the next
  step's compute (Ho et al., NIPS 2013), so a step costs ``max(compute, comm)``
  instead of ``compute + comm``.
"""

from __future__ import annotations

from dataclasses import dataclass

from unipar.errors import ConfigError
from unipar.plan.representation import GradSync

ROW_ID_BYTES = 8  # int64 ids pushed with each gradient row
PS_ROUND_TRIPS = 2  # a pull (dense tensors and rows in one call), a push


# Below this share of the parameters in embedding tables, sparse pulls save little over
# an all-reduce of everything (the dense part dominates the bytes either way).
WORTH_SERVING_SHARE = 0.5


@dataclass(frozen=True)
class SparseWorkload:
    """One step of a model with embedding tables, for pricing."""

    table_rows: int  # rows of all embedding tables together
    dim: int  # embedding width
    dense_params: int  # parameters outside the tables
    touched_fraction: float  # share of table rows one worker's batch touches per step
    workers: int
    servers: int = 1
    serve_dense: bool = False  # dense tensors on the servers (else all-reduced)
    bytes_per_value: int = 4
    staleness: int = 0  # 0: BSP; > 0: SSP; None-like large: ASP
    compute_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.touched_fraction <= 1:
            raise ConfigError(
                f"touched_fraction must be in [0, 1], but got {self.touched_fraction}"
            )
        if self.workers < 1 or self.servers < 1:
            raise ConfigError(
                f"workers and servers must be >= 1, but got workers={self.workers}, "
                f"servers={self.servers}"
            )


@dataclass(frozen=True)
class Links:
    """Measured or preset bandwidths (bytes/s one way) and per-message latency."""

    all_reduce_bw: float
    worker_bw: float
    server_bw: float
    latency_s: float = 50e-6  # per all-reduce message
    ps_latency_s: float = 200e-6  # per server round trip (an actor call)
    update_bw: float = 10e9  # bytes/s an optimizer update streams
    row_s: float = 0.0  # s per touched row: unique, route, gather, scatter, server update


@dataclass(frozen=True)
class Price:
    kind: GradSync
    bytes_per_worker: float  # bytes one worker sends and receives per step
    comm_s: float
    step_s: float


def price_all_reduce(w: SparseWorkload, links: Links) -> Price:
    n = w.workers
    grad_bytes = (w.table_rows * w.dim + w.dense_params) * w.bytes_per_value
    moved = 2 * (n - 1) / n * grad_bytes
    comm = moved / links.all_reduce_bw + 2 * (n - 1) * links.latency_s if n > 1 else 0.0
    update = 3 * grad_bytes / links.update_bw
    return Price(GradSync.ALL_REDUCE, moved, comm, w.compute_s + comm + update)


def price_ps(w: SparseWorkload, links: Links) -> Price:
    rows = w.touched_fraction * w.table_rows
    pull = rows * w.dim * w.bytes_per_value
    push = pull + rows * ROW_ID_BYTES
    dense_bytes = w.dense_params * w.bytes_per_value
    if w.serve_dense:
        pull, push = pull + dense_bytes, push + dense_bytes
    per_worker = pull + push
    comm = (
        max(per_worker / links.worker_bw, w.workers * per_worker / (w.servers * links.server_bw))
        + PS_ROUND_TRIPS * links.ps_latency_s
        + rows * links.row_s * max(1.0, w.workers / w.servers)
    )
    if not w.serve_dense and w.workers > 1:  # dense part all-reduced among workers
        dense = SparseWorkload(0, w.dim, w.dense_params, 0.0, w.workers)
        comm += price_all_reduce(dense, links).comm_s
    step = max(w.compute_s, comm) if w.staleness > 0 else w.compute_s + comm
    return Price(GradSync.PARAMETER_SERVER, per_worker, comm, step)


@dataclass(frozen=True)
class SyncChoice:
    kind: GradSync
    ps: Price
    all_reduce: Price
    reason: str


def choose_grad_sync(w: SparseWorkload, links: Links) -> SyncChoice:
    """The faster of the two per step, with the reason in numbers."""
    ps, ar = price_ps(w, links), price_all_reduce(w, links)
    kind = GradSync.PARAMETER_SERVER if ps.step_s < ar.step_s else GradSync.ALL_REDUCE
    win, lose = (ps, ar) if kind is GradSync.PARAMETER_SERVER else (ar, ps)
    reason = (
        f"{kind.value}: {win.step_s * 1e3:.1f} ms/step vs {lose.step_s * 1e3:.1f} ms for "
        f"{lose.kind.value}; a worker moves {win.bytes_per_worker / 2**20:.2f} MiB vs "
        f"{lose.bytes_per_worker / 2**20:.2f} MiB (touched rows {w.touched_fraction * 100:.3g}% "
        f"of {w.table_rows:,}, {w.servers} server(s), {w.workers} workers"
        + (f", staleness {w.staleness} overlaps the exchange" if w.staleness > 0 else "")
        + ")"
    )
    return SyncChoice(kind, ps, ar, reason)
