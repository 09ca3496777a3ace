"""The Ray actor that holds one shard of the data and trains in xgboost's collective
(or alone, when it is the only actor).

Its data stays loaded across restarts: when a peer dies, this actor's training call
fails with a collective error and returns, and the next attempt reuses the loaded data.
The DMatrix itself is rebuilt for every attempt: it caches quantile cuts agreed with the
old set of peers, and reusing them makes the new collective exchange mismatched messages.
Every ``checkpoint_frequency`` rounds it keeps the model in memory, which the driver
fetches after a failure (all live actors hold the same model)."""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from typing import TYPE_CHECKING, Any

import numpy as np

from unipar.ray_cluster.supervisor import describe_process
from unipar.xgboost.lean_import import import_xgboost_core
from unipar.xgboost.matrix import RayDMatrix
from unipar.xgboost.session import init_session
from unipar.xgboost.sources import FIELDS, Shard, read_shard

if TYPE_CHECKING:
    import xgboost as xgb


class XGBoostActor:
    def __init__(
        self,
        rank: int,
        num_actors: int | None = None,
        distributed_callbacks: list[Any] | None = None,
    ) -> None:
        import_xgboost_core()
        self.rank = rank
        self.num_actors = num_actors
        self.session = init_session(rank)
        self.loaded: dict[str, tuple[RayDMatrix, dict[str, Any]]] = {}
        self.callbacks = list(distributed_callbacks or [])
        self._lock = threading.Lock()
        self._loading = threading.Lock()
        self._checkpoint: tuple[int, bytes] | None = None
        self._rounds: list[tuple[int, dict[str, float], bytes | None]] = []
        self.stop_requested = threading.Event()
        for callback in self.callbacks:
            callback.on_init(self)

    def describe(self) -> tuple[int, str, str, dict[str, float]]:
        """(process id, node IP, Ray node id, assigned resources): what the gang supervisor
        follows."""
        return describe_process()

    def load(self, name: str, matrix: RayDMatrix, shard: Shard) -> int:
        """Read this actor's shard of ``matrix`` once; return its rows. A matrix loaded
        under another name already (the training data also evaluated on) is not read
        again."""
        with self._loading:  # one load at a time: a second call may be the same matrix
            if name not in self.loaded:
                same = [v for v in self.loaded.values() if v[0] == matrix]
                self.loaded[name] = same[0] if same else (matrix, self._read(matrix, shard))
        return len(self.loaded[name][1]["data"])

    def _read(self, matrix: RayDMatrix, shard: Shard) -> dict[str, Any]:
        for callback in self.callbacks:
            callback.before_data_loading(self, matrix)
        parts = read_shard(matrix, shard)
        for callback in self.callbacks:
            callback.after_data_loading(self, matrix)
        return parts

    def keep_checkpoint(self, rounds: int, model: xgb.Booster) -> None:
        raw = bytes(model.save_raw("ubj"))
        with self._lock:
            self._checkpoint = (rounds, raw)

    def record_round(self, rounds: int, values: dict[str, float], model: bytes | None) -> None:
        with self._lock:
            self._rounds.append((rounds, values, model))

    def drain(self) -> tuple[list[tuple[int, dict[str, float], bytes | None]], list[Any]]:
        """The rounds recorded for Tune, and the items user code ``put_queue``-d, since
        the last call."""
        with self._lock:
            rounds, self._rounds = self._rounds, []
        return rounds, self.session.drain()

    def checkpoint(self) -> tuple[int, bytes] | None:
        with self._lock:
            return self._checkpoint

    def request_stop(self) -> None:
        self.stop_requested.set()

    def train(
        self,
        tracker_args: dict[str, Any] | None,
        params: dict[str, Any],
        rounds: int,
        *,
        evals: list[str],
        start: tuple[int, bytes] | None,
        checkpoint_frequency: int,
        callbacks: list[Any] | None,
        kwargs: dict[str, Any],
        report: bool = False,
        report_models: int = 0,
    ) -> dict[str, Any]:
        """Train ``rounds`` more rounds with the other actors (alone, outside any
        collective, when ``tracker_args`` is None). Returns the collective rank, the
        model (rank 0 only), the rounds done and the evaluation log; or, if training
        failed here, ``{"error": ..., "collective": <a peer broke the collective>,
        "exited": <user code called sys.exit()>}``."""
        import xgboost as xgb  # noqa: PLC0415 (heavy: xgboost)
        from xgboost import collective  # noqa: PLC0415 (heavy: xgboost)

        from unipar.xgboost.round_callback import RoundCallback  # noqa: PLC0415 (heavy: xgboost)

        self.stop_requested.clear()
        done_before, model = (start[0], bytearray(start[1])) if start else (0, None)
        result: dict[str, Any] = {}
        log: dict[str, Any] = {}
        after_each_round = RoundCallback(
            self, checkpoint_frequency, done_before, report, report_models
        )
        for callback in self.callbacks:
            callback.before_train(self)
        try:
            alone = tracker_args is None
            if alone and collective.is_distributed():  # left by a broken earlier gang
                collective.finalize()
            with contextlib.nullcontext() if alone else collective.CommunicatorContext(
                **tracker_args
            ):
                rank = collective.get_rank()
                # Inside the collective: a QuantileDMatrix agrees its bins with the peers
                # as it is built; evaluation matrices take the training matrix's bins.
                train_matrix = to_dmatrix(*self.loaded["train"])
                matrices = {"train": train_matrix}
                for name in evals:
                    if self.loaded[name] is self.loaded["train"]:  # evaluated as trained on
                        matrices[name] = train_matrix
                    else:
                        matrices[name] = to_dmatrix(*self.loaded[name], ref=train_matrix)
                booster = xgb.train(
                    params,
                    matrices["train"],
                    num_boost_round=rounds,
                    evals=[(matrices[name], name) for name in evals],
                    evals_result=log,
                    xgb_model=xgb.Booster(model_file=model) if model is not None else None,
                    callbacks=[*(callbacks or []), after_each_round],
                    **{"verbose_eval": False, **kwargs},  # xgboost prints on rank 0 only
                )
        except (Exception, SystemExit) as error:  # reported to the driver, naming this actor
            return {
                "error": f"{type(error).__name__}: {str(error)[:2000]}",
                "traceback": traceback.format_exc(),
                "collective": isinstance(error, xgb.core.XGBoostError),
                # sys.exit() in user code ends this actor's training as a lost actor's
                # (XGBoost-Ray's behaviour); the process and its data stay for the restart
                "exited": isinstance(error, SystemExit),
                "pid": os.getpid(),
            }
        for callback in self.callbacks:
            callback.after_train(self, result)
        result.update(
            rank=rank,
            rounds=booster.num_boosted_rounds(),
            # the driver's stop (a peer joins or leaves), not the job's own callbacks
            # (early stopping), ended this attempt before its last round
            asked_to_stop=self.stop_requested.is_set(),
            model=bytes(booster.save_raw("ubj")) if rank == 0 else None,
            # the training parameters (nthread, tree parameters...), which the model
            # file leaves out: the returned booster reports them as xgboost's does
            config=booster.save_config() if rank == 0 else None,
            evals_result=log,
        )
        return result

    def predict(
        self, matrix: RayDMatrix, shard: Shard, model: bytes, kwargs: dict[str, Any]
    ) -> tuple[np.ndarray, list[int]]:
        """Predictions on the shard, in its rows' order, and the rows of each of its
        parts (none for in-memory data)."""
        import xgboost as xgb  # noqa: PLC0415 (heavy: xgboost)

        booster = xgb.Booster(model_file=bytearray(model))
        parts = self._read(matrix, shard)
        for callback in self.callbacks:
            callback.before_predict(self)
        prediction = booster.predict(to_dmatrix(matrix, parts), **kwargs)
        order = parts.get("order")
        if order is not None:  # the shard was sorted by qid: put its rows back
            unsorted = np.empty_like(prediction)
            unsorted[order] = prediction
            prediction = unsorted
        for callback in self.callbacks:
            callback.after_predict(self, prediction)
        return prediction, parts.get("part_rows", [])


def to_dmatrix(
    matrix: RayDMatrix, parts: dict[str, Any], ref: xgb.DMatrix | None = None
) -> xgb.DMatrix:
    import xgboost as xgb  # noqa: PLC0415 (heavy: xgboost)

    data = parts["data"]
    fields = {k: v for k, v in parts.items() if k in FIELDS}
    quantile = getattr(matrix, "quantile", False)
    kind = xgb.QuantileDMatrix if quantile else xgb.DMatrix
    options: dict[str, Any] = {
        "feature_names": matrix.feature_names,
        "feature_types": matrix.feature_types,
        "enable_categorical": bool(matrix.enable_categorical),
    }
    if matrix.missing is not None:
        options["missing"] = matrix.missing
    if matrix.feature_weights is not None:
        options["feature_weights"] = matrix.feature_weights
    if quantile and isinstance(ref, xgb.QuantileDMatrix):
        options["ref"] = ref
    return kind(data, **fields, **options)
