"""An adaptive job's batch, chosen by the scheduler together with its workers (pure).

Pollux (Qiao et al., OSDI'21) §3: the scheduler picks each job's GPUs and batch together,
by goodput = throughput × statistical efficiency. A job with ``Job.adaptive`` publishes
its gradient statistics (|G|² and tr(Σ) per sample, as its runtime estimates them,
:mod:`unipar.adapt.noise`) and its step times at each shape it ran (workers, micro-batch,
micro-batches per worker; :mod:`unipar.service.ledger`). Once it has, the policy sees it
as Pollux's does: its throughput model fitted on the batches actually run
(:func:`unipar.goodput.throughput.fit`, Pollux eqs. 8-10), its statistics (the variance
at M0, as :func:`unipar.adapt.chooser.choose` gives them), its batch bounds; and the
batch at the workers the round gives it is the goodput table's best there
(:func:`unipar.goodput.table.goodput_table`, the search the policy and the job's own
chooser run). The runtime runs that batch from its next step boundary, its learning rate
and progress by the job's rule (:meth:`unipar.adapt.state.AdaptState.hold`).
"""

from __future__ import annotations

from dataclasses import replace

from unipar.adapt.lr import var_at_init
from unipar.adapt.noise import NoiseEstimate
from unipar.goodput.table import goodput_table
from unipar.goodput.throughput import Observation, ThroughputModel, fit
from unipar.sched.arrays import job_arrays
from unipar.sched.policy import JobView
from unipar.service.state import JobRow


def batch_observations(row: JobRow) -> list[Observation]:
    """The mean step time of each shape an adaptive job ran: (workers, micro-batch,
    micro-batches per worker) -> an observation of the batch actually run."""
    return [
        Observation(nodes=1, replicas=k, local_bsz=float(micro), step_time=sec / n,
                    sync_time=0.0, accum=accum - 1)
        for (k, micro, accum), (n, sec) in sorted((row.batch_times or {}).items())
        if n > 0
    ]


def reported_goodput(row: JobRow) -> bool:
    """Whether ``row`` is an adaptive job that has reported what its goodput needs: its
    gradient statistics and a step time at some batch."""
    return row.max_batch > 0 and row.grad_sqr > 0 and bool(batch_observations(row))


def batch_model(row: JobRow) -> ThroughputModel:
    """Pollux's throughput model fitted on the step times of the batches ``row`` ran."""
    return fit(batch_observations(row))


def goodput_view(view: JobView, row: JobRow) -> JobView:
    """``view`` of an adaptive job that reported (:func:`reported_goodput`) as the policy
    sees it to choose its workers and batch together: its own throughput model (also as
    the pooled one: the jobs of a name pool step times of M0's progress, another unit),
    its gradient statistics, its batch bounds."""
    model = batch_model(row)
    # the published estimates are unbiased, not floored (tr(Σ) can dip below 0): floored
    # as the job's own chooser reads them
    noise = NoiseEstimate(sqr_avg=row.grad_sqr, var_avg=row.grad_var, weight=1.0)
    return replace(view, model=model, peer_model=model, grad_sqr=noise.sqr,
                   grad_var=var_at_init(noise.var, row.batch), max_batch=row.max_batch,
                   max_local=row.max_local)


def batch_for(view: JobView, workers: int, slots: int) -> int:
    """The global batch of the best goodput for ``view`` (a :func:`goodput_view`) on
    ``workers`` workers of a node of ``slots``, as the policy's table picks it (0: none in
    bounds)."""
    table = goodput_table(job_arrays([view], [view.model]), workers, max(slots, workers))
    k = workers - 1
    if table.goodput[0, k] <= 0:
        return 0
    local = min(int(table.local_bsz[0, k]), view.max_local)
    return workers * local * (int(table.accum[0, k]) + 1)
