"""``predict`` across Ray actors, rows returned in the data's order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from unipar.errors import ConfigError
from unipar.xgboost.connect import attach_or_start_ray, run_on_this_node
from unipar.xgboost.gang import in_tune_trial, resolve_params, split_datasets, start_gang
from unipar.xgboost.matrix import RayDMatrix
from unipar.xgboost.params import RayParams

if TYPE_CHECKING:
    import xgboost as xgb


def predict(
    model: xgb.Booster,
    data: RayDMatrix,
    ray_params: RayParams | dict[str, Any] | None = None,
    _remote: bool | None = None,
    **kwargs: Any,
) -> np.ndarray:
    """Predict on ``data`` with ``ray_params.num_actors`` actors, in ``data``'s row order;
    ``kwargs`` go to ``Booster.predict`` (``output_margin``, ``pred_leaf``, ...).
    ``_remote``: run this call's driver part in a Ray task on this node (default: when
    connected through Ray Client)."""
    if not isinstance(data, RayDMatrix):
        raise ConfigError(f"data must be a RayDMatrix, but got {type(data).__name__}")
    expected, given = model.feature_names, data.feature_names
    if expected is not None and given is not None and list(expected) != list(given):
        missing = [f for f in expected if f not in given]
        extra = [f for f in given if f not in expected]
        raise ConfigError(
            "the data's feature names differ from the model's: missing "
            f"{missing}, unexpected {extra}"
            + ("" if missing or extra else " (order differs)")
            + "; pass the columns the model was trained on, in the same order"
        )
    attach_or_start_ray()
    if _remote is None:
        _remote = ray.util.client.ray.is_connected() and not in_tune_trial()
    if _remote:
        return run_on_this_node(
            predict, model, data.carrying_data(), ray_params, _remote=False, **kwargs
        )
    rp, planned, current = resolve_params(ray_params, {})
    data.assert_enough_shards_for_actors(rp.num_actors)
    split_datasets([data], rp.num_actors)
    shards: list[Any] = []  # filled while the actors start
    gang = start_gang(rp, planned, current, lambda a: shards.extend(data.shards(len(a), a)))
    try:
        raw = bytes(model.save_raw("ubj"))
        outputs = ray.get(
            [actor.predict.remote(data, shards[i], raw, kwargs) for i, actor in gang.actors.items()]
        )
        return _in_data_order(data, shards, outputs)
    finally:
        gang.stop()


def _in_data_order(
    data: RayDMatrix, shards: list[Any], outputs: list[tuple[np.ndarray, list[int]]]
) -> np.ndarray:
    """The actors' predictions put back in the rows' order: in-memory rows by their
    indices (and before their sort by qid); parts (files, object refs, partitions) in
    the order they were given (an actor may hold files 0, 3, 6...)."""
    parts = [prediction for prediction, _ in outputs]
    if shards[0].indices is not None:
        total = sum(len(part) for part in parts)
        out = np.empty((total, *parts[0].shape[1:]), dtype=parts[0].dtype)
        for shard, part in zip(shards, parts, strict=True):
            out[shard.indices] = part
        if data.row_order is None:
            return out
        unsorted = np.empty_like(out)
        unsorted[data.row_order] = out
        return unsorted
    if data.parts:
        by_part: dict[int, np.ndarray] = {}
        for shard, (prediction, part_rows) in zip(shards, outputs, strict=True):
            bounds = np.cumsum([0, *part_rows])
            for k, position in enumerate(shard.part_indices):
                by_part[position] = prediction[bounds[k] : bounds[k + 1]]
        return np.concatenate([by_part[k] for k in range(len(data.parts))])
    return np.concatenate(parts)
