"""``unipar plan --cluster "4xa100-80g+8xv100-16g"`` (or a cluster YAML file): the
heterogeneous planner for a GPT-style decoder of the given sizes."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from unipar.cluster.hetero import hetero_cluster_from_yaml, parse_hetero_cluster
from unipar.errors import ConfigError
from unipar.plan.hetero import plan_hetero, transformer_layers

_MIXED = re.compile(r"^\d+x")


def is_hetero_cluster(text: str) -> bool:
    """A ``COUNTxDEVICE[+...]`` string or a ``.yaml``/``.yml`` file."""
    return bool(_MIXED.match(text)) or text.endswith((".yaml", ".yml"))


def run_hetero_plan(args: argparse.Namespace, *, seq_len: int) -> int:
    if args.model not in ("gpt", "llama"):
        raise ConfigError(
            f"heterogeneous clusters are planned for gpt and llama models, but got "
            f"{args.model!r}; use --model gpt with the sizes, or a preset --cluster"
        )
    if args.cluster.endswith((".yaml", ".yml")):
        cluster = hetero_cluster_from_yaml(Path(args.cluster).read_text())
    else:
        cluster = parse_hetero_cluster(args.cluster)
    layers = transformer_layers(
        hidden=args.hidden, layers=args.layers, seq_len=seq_len, vocab=args.vocab
    )
    plan = plan_hetero(layers, cluster, args.global_batch)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=1))
        return 0
    print(
        f"{plan.kind.value} over {cluster.num_devices} devices, micro-batch "
        f"{plan.microbatch_size}, predicted step {plan.predicted_step_s:.3f} s"
    )
    for a in plan.assignments:
        where = (
            f"stage {a.stage}: layers [{a.first_layer}, {a.end_layer})"
            if a.end_layer
            else f"micro-batches per replica {list(a.microbatches)}"
        )
        print(f"  {a.group}: {a.devices}x {a.device}, tp={a.tp} x {a.replicas} replicas; {where}")
    return 0
