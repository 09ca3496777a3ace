"""Fit the rate factors of :mod:`unipar.cluster.corrections` to measured runs. Pure numpy.

Each observation ``i`` of a record (a step, or a traced component) was predicted as a
sum of the rate groups' seconds ``S_ig``; with factor ``f_g = exp(theta_g)`` on each
group's rate, its prediction becomes ``p_i = sum_g S_ig exp(-theta_g)``. The factors
minimise

    sum_i w_i |log p_i - log m_i|  +  (lambda / 2) |theta|^2,   |theta_g| <= log MAX_FACTOR

- absolute, not squared, errors of the logarithm: a least-absolute-deviations fit, the
  regression form of the median (Koenker and Bassett 1978), so that one odd run moves
  the factors no more than its rank among the others allows; solved by iteratively
  reweighted least squares with Gauss-Newton steps (Schlossmacher 1973);
- relative errors (logarithms): a run of 10 ms counts as much as one of 10 s;
- ``w_i``: recent runs weigh more, each run ``HALF_LIFE_RUNS`` older half as much;
- a run's step counts fully, its traced components (forward, optimizer) at
  ``COMPONENT_WEIGHT``: they tell the groups apart, but where they disagree with the
  step (time the model does not price: data loading, clipping, a backward that is not
  twice the forward) the step, which is what a plan is chosen by, wins;
- a pull of every factor towards 1 (``lambda``): a group that no run tells apart from
  the others keeps its share of the error in proportion to its share of the time, a
  group no run exercised stays at 1, and two groups the runs cannot tell apart (the
  FLOP rate and the per-op cost of one plan) do not drift apart to gain a hair of fit;
- each factor bounded to [1/MAX_FACTOR, MAX_FACTOR]: a correction larger than that is
  no longer a correction of the rates, but of the model;
- a group that only one run exercises (``MATERIAL_SHARE`` of its step or more: tensor
  parallelism's framework time where one run of the cluster's was tensor parallel)
  takes that run's residual before any shared group does: the groups several runs
  exercise are fitted first with each run's own groups free (no pull towards 1), so
  that what one plan's own mechanism leaves unexplained does not move the factors
  every plan carries; then its own groups are fitted, the shared ones held, with the
  pull towards 1 as the others. A run that exercises no group of its own informs the
  shared groups as before; with a single run every group is its own (the first bullet's
  proportional split);
- runs on an overloaded machine (:attr:`RunRecord.overloaded`) are left out, and so is
  an odd run: one whose measured over predicted step is more than ``ODD_RUN`` times
  off the (weighted) median of the cluster's runs (three runs or more), as a run
  disturbed by something the cost model does not price would be.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from unipar.cluster.corrections import Rate, corrected
from unipar.cluster.run_records import Measured, RunRecord, records_for
from unipar.cluster.spec import ClusterSpec

MAX_FACTOR = 4.0
HALF_LIFE_RUNS = 4  # a run this many runs older weighs half as much
MAX_RUNS = 20  # the newest runs fitted
PRIOR = 0.2  # lambda: the pull of each log-factor towards 0 (x2 costs a 5% error)
COMPONENT_WEIGHT = 0.3  # a traced component's weight against its run's step
ODD_RUN = 3.0  # a run this many times off the median measured/predicted is left out
MATERIAL_SHARE = 0.05  # a group this share of a run's predicted step is exercised by it
_FREE = 1e-6  # the pull on a run's own groups while the shared ones are fitted
_HELD = 1e6  # the pull that holds the shared groups while a run's own are fitted
_FLOOR = 1e-3  # smallest |residual| in the reweighting (0.1% in log terms)


@dataclass(frozen=True)
class FittedFactors:
    """The factors (one per :class:`Rate`), fitted from ``runs`` records;
    ``kept_apart``: records of overloaded machines, left out; ``odd``: records far off
    the others (``ODD_RUN``), left out."""

    factors: dict[Rate, float]
    runs: int
    kept_apart: int
    odd: int = 0


def fit_factors(records: Sequence[RunRecord]) -> FittedFactors:
    """The factors that make ``records``' predictions meet their measurements (module
    doc); all 1 when no record is usable."""
    usable = [r for r in records if not r.overloaded and r.observations]
    kept_apart = sum(1 for r in records if r.overloaded)
    usable = sorted(usable, key=lambda r: r.finished_at)[-MAX_RUNS:]
    rates = list(Rate)
    weights_of = [0.5 ** (age / HALF_LIFE_RUNS) for age in range(len(usable))][::-1]
    before = len(usable)
    usable, weights_of = _without_odd_runs(usable, weights_of)
    odd = before - len(usable)
    if not usable:
        return FittedFactors(dict.fromkeys(rates, 1.0), 0, kept_apart, odd)
    rows, measured, weights = [], [], []
    for record, weight in zip(usable, weights_of, strict=True):
        for observation in record.observations:
            seconds = dict(observation.seconds)
            row = [max(0.0, seconds.get(rate, 0.0)) for rate in rates]
            if sum(row) > 0 and observation.measured_s > 0:
                rows.append(row)
                measured.append(observation.measured_s)
                step = observation.what is Measured.STEP
                weights.append(weight * (1.0 if step else COMPONENT_WEIGHT))
    theta = solve_shared_first(
        np.array(rows), np.array(measured), np.array(weights), exercised_by(usable, rates)
    )
    factors = {rate: float(math.exp(t)) for rate, t in zip(rates, theta, strict=True)}
    return FittedFactors(factors, len(usable), kept_apart, odd)


def exercised_by(records: Sequence[RunRecord], rates: list[Rate]) -> np.ndarray:
    """How many of ``records`` exercise each of ``rates``' groups: the group's seconds
    are :data:`MATERIAL_SHARE` of the run's predicted step or more."""
    counts = np.zeros(len(rates))
    for record in records:
        step = next((o for o in record.observations if o.what is Measured.STEP), None)
        if step is None or step.predicted_s <= 0:
            continue
        seconds = dict(step.seconds)
        counts += [seconds.get(rate, 0.0) >= MATERIAL_SHARE * step.predicted_s for rate in rates]
    return counts


def solve_shared_first(
    seconds: np.ndarray, measured: np.ndarray, weights: np.ndarray, exercised: np.ndarray
) -> np.ndarray:
    """:func:`solve`, the groups several runs exercise (``exercised``: runs per group)
    fitted first with the groups of a single run free, then those with the shared ones
    held (module doc); one solve where no group is shared, or none a single run's."""
    shared, own = exercised >= 2, exercised == 1
    if not shared.any() or not own.any():
        return solve(seconds, measured, weights)
    first = solve(seconds, measured, weights, np.where(own, _FREE, PRIOR))
    held = np.where(shared, first, 0.0)
    then = solve(seconds * np.exp(-held), measured, weights, np.where(shared, _HELD, PRIOR))
    return held + np.where(shared, 0.0, then)


def _without_odd_runs(
    records: list[RunRecord], weights: list[float]
) -> tuple[list[RunRecord], list[float]]:
    """``records`` (oldest first, with their weights) but those whose measured over
    predicted step (the cost model's as specified, not the corrected prediction the run
    was told) is more than :data:`ODD_RUN` times off the weighted median."""
    if len(records) < 3:
        return records, weights
    logs = np.array([math.log(_step_ratio(r)) for r in records])
    middle = weighted_median(logs, np.array(weights))
    keep = np.abs(logs - middle) <= math.log(ODD_RUN)
    return (
        [r for r, k in zip(records, keep, strict=True) if k],
        [w for w, k in zip(weights, keep, strict=True) if k],
    )


def _step_ratio(record: RunRecord) -> float:
    """Measured over the uncorrected prediction of the record's step."""
    for observation in record.observations:
        if observation.what is Measured.STEP:
            return observation.measured_s / observation.predicted_s
    return record.measured_s / record.predicted_s


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The value below and above which half the weight lies."""
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def solve(
    seconds: np.ndarray,
    measured: np.ndarray,
    weights: np.ndarray,
    prior: np.ndarray | None = None,
    iterations: int = 100,
) -> np.ndarray:
    """The log-factors ``theta`` minimising the objective of the module doc, for
    observations with group seconds ``seconds`` (rows x groups), ``measured`` times
    and ``weights``; ``prior``: each group's pull towards 1 (default :data:`PRIOR`)."""
    groups = seconds.shape[1]
    pull = np.full(groups, PRIOR) if prior is None else prior
    theta = np.zeros(groups)
    bound = math.log(MAX_FACTOR)
    if seconds.size == 0:
        return theta
    target = np.log(measured)

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.log((seconds * np.exp(-theta)).sum(axis=1)) - target

    def objective(theta: np.ndarray) -> float:
        return float(weights @ np.abs(residuals(theta)) + pull @ theta**2 / 2)

    for _ in range(iterations):
        scaled = seconds * np.exp(-theta)  # each group's seconds under theta
        predicted = scaled.sum(axis=1)
        residual = np.log(predicted) - target
        jacobian = -scaled / predicted[:, None]  # d residual / d theta
        u = weights / np.maximum(np.abs(residual), _FLOOR)  # L1 as reweighted L2
        normal = jacobian.T @ (u[:, None] * jacobian) + np.diag(pull)
        gradient = jacobian.T @ (u * residual) + pull * theta
        step = np.linalg.solve(normal, -gradient)
        before, length = objective(theta), 1.0
        while length > 1e-3:  # halve the step until the objective does not grow
            updated = np.clip(theta + length * step, -bound, bound)
            if objective(updated) <= before + 1e-12:
                break
            length /= 2
        else:
            return theta
        if np.max(np.abs(updated - theta)) < 1e-7:
            return updated
        theta = updated
    return theta


def learned_cluster(cluster: ClusterSpec, directory: Path | None = None) -> ClusterSpec:
    """``cluster`` corrected by the factors its own measured runs give (the records in
    ``directory``, default ``~/.cache/unipar``, under its fingerprint); as it is where
    no usable run was measured on it: a preset with no runs stays its spec sheet."""
    fitted = fit_factors(records_for(cluster, directory))
    if fitted.runs == 0:
        return cluster
    return corrected(cluster, fitted.factors, runs=fitted.runs, kept_apart=fitted.kept_apart)
