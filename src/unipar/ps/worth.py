"""Is there anything worth a parameter server in this model? Pure."""

from __future__ import annotations

import warnings

from unipar.errors import ConfigError
from unipar.plan.sync_cost import WORTH_SERVING_SHARE
from unipar.ps.partition import TensorInfo


def check_worth_serving(tensors: list[TensorInfo], *, serve_dense: bool) -> None:
    """Error when the servers would hold nothing; warn when they would hold only dense
    tensors or a small share of embedding rows (all-reduce moves no more bytes then)."""
    total = sum(t.numel for t in tensors)
    sparse = sum(t.numel for t in tensors if t.embedding)
    if not serve_dense and sparse == 0:
        raise ConfigError(
            "a parameter server with dense tensors all-reduced among workers needs "
            "embedding tables (nn.Embedding) to serve, but the model has none; use "
            "grad_sync='all_reduce', or serve_dense=True"
        )
    share = sparse / max(total, 1)
    if share < WORTH_SERVING_SHARE:
        warnings.warn(
            f"nothing worth a parameter server: embedding tables hold {share:.0%} of the "
            f"model's {total:,} parameters (< {WORTH_SERVING_SHARE:.0%}), so pulls and "
            "pushes move about as many bytes as an all-reduce; use grad_sync='all_reduce'",
            UserWarning,
            stacklevel=3,
        )
