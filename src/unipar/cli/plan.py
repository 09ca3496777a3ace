"""``unipar plan``: choose a parallel strategy for a reference model, or a Hugging Face
config (``hf:path/config.json``), on a cluster."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from unipar import checks
from unipar.cli.plan_hetero import is_hetero_cluster, run_hetero_plan
from unipar.cluster import cluster_preset
from unipar.cluster.learned_fit import learned_cluster
from unipar.errors import ConfigError
from unipar.plan.representation import PipelineSchedule, Recompute

if TYPE_CHECKING:
    from unipar.models import ModelSpec

_INT_KEYS = {"tp", "pp", "dp", "fsdp", "cp", "microbatch_size", "virtual_stages", "recompute_every"}
_ENUM_KEYS = {"schedule", "recompute"}
_BOOL_KEYS = {"sequence_parallel", "distributed_optimizer"}
_MODELS = ("gpt", "llama", "mlp", "ctr")


def parse_fix(text: str | None):  # type: ignore[no-untyped-def]
    """``tp=8,pp=2,recompute=full`` -> Constraints."""
    # the command line is parsed without torch: the planner loads when a plan is made
    from unipar.plan.strategy_search import Constraints  # noqa: PLC0415 (heavy: torch)

    if not text:
        return Constraints()
    values: dict[str, object] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key = key.strip().replace("microbatch", "microbatch_size").replace("_size_size", "_size")
        if key in _INT_KEYS and value.isdigit() and int(value) >= 1:
            values[key] = int(value)
        elif key == "schedule":
            values[key] = _choice(PipelineSchedule, value, key)
        elif key == "recompute":
            values[key] = _choice(Recompute, value, key)
        elif key in _BOOL_KEYS and value.lower() in ("true", "false"):
            values[key] = value.lower() == "true"
        else:
            raise ConfigError(
                f"--fix takes key=value pairs with keys "
                f"{sorted(_INT_KEYS | _ENUM_KEYS | _BOOL_KEYS)} (integers >= 1, a "
                f"schedule/recompute name, or true/false), but got {item!r}"
            )
    return Constraints(**values)  # type: ignore[arg-type]


def _choice(enum, value: str, key: str):  # type: ignore[no-untyped-def]
    try:
        return enum(value)
    except ValueError:
        raise ConfigError(
            f"--fix {key} must be one of {[m.value for m in enum]}, but got {value!r}"
        ) from None


def model_spec(args: argparse.Namespace) -> ModelSpec:
    from unipar.models import GPTConfig, LlamaConfig, MLPConfig  # noqa: PLC0415 (heavy: torch)

    if args.model.startswith("hf:"):
        from unipar.models.hf_config import hf_spec  # noqa: PLC0415 (heavy: torch)

        return hf_spec(args.model.removeprefix("hf:"), seq_len=args.seq)
    seq = DEFAULT_SEQ if args.seq is None else args.seq
    if args.model not in _MODELS:
        raise ConfigError(
            f"the model must be one of {list(_MODELS)} or hf:PATH/config.json, but got "
            f"{args.model!r}"
        )
    if args.model == "gpt":
        return GPTConfig(
            vocab_size=args.vocab,
            seq_len=seq,
            hidden=args.hidden,
            layers=args.layers,
            heads=args.heads,
            dropout=args.dropout,
            tie_embeddings=not args.untied_embeddings,
        ).spec()
    if args.model == "llama":
        return LlamaConfig(
            vocab_size=args.vocab,
            seq_len=seq,
            hidden=args.hidden,
            layers=args.layers,
            heads=args.heads,
            kv_heads=args.kv_heads or args.heads,
            ffn_hidden=args.ffn_hidden or 4 * args.hidden,
        ).spec()
    if args.model == "ctr":
        from unipar.models.ctr import ctr_spec  # noqa: PLC0415 (heavy: torch)

        return ctr_spec(rows=args.vocab, dim=args.hidden, fields=args.in_features)
    return MLPConfig(
        in_features=args.in_features,
        hidden=args.hidden,
        layers=args.layers,
        out_features=args.out_features,
    ).spec()


DEFAULT_SEQ = 2048  # tokens per sample of the built-in models; an HF config: its positions
_SIZES = ("hidden", "layers", "heads", "vocab", "in_features", "out_features")
_OPTIONAL_SIZES = ("seq", "kv_heads", "ffn_hidden", "gpus_per_node")


def check_plan_args(args: argparse.Namespace) -> None:
    """Every flag of ``unipar plan``, before a model is built or a CPU calibrated."""
    sizes = [*_SIZES, "global_batch", "nodes"]
    sizes += [name for name in _OPTIONAL_SIZES if getattr(args, name) is not None]
    checks.positive_ints("", ((_flag(name), getattr(args, name)) for name in sizes))
    checks.number("--dropout", args.dropout, minimum=0, below=1)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def run_plan(args: argparse.Namespace) -> int:
    check_plan_args(args)  # before torch is imported
    if is_hetero_cluster(args.cluster):
        return run_hetero_plan(args, seq_len=DEFAULT_SEQ if args.seq is None else args.seq)
    from unipar.models.hf_config import hf_seq_reason  # noqa: PLC0415 (heavy: torch)
    from unipar.plan.report import plan  # noqa: PLC0415 (heavy: torch)

    # The model and the pinned choices are checked before a CPU cluster is calibrated.
    spec = model_spec(args)
    constraints = parse_fix(args.fix)
    versus_constraints = parse_fix(args.versus) if args.versus else None
    cluster = cluster_preset(
        args.cluster,
        nodes=args.nodes,
        devices_per_node=args.gpus_per_node,
        attention=args.attention,
        kernels=args.kernels,
    )
    if not args.as_specified:  # what runs on this cluster measured, if any ran
        cluster = learned_cluster(cluster)
    report = plan(spec, cluster, args.global_batch, constraints=constraints)
    versus = None
    if versus_constraints is not None:
        from unipar.plan.explain import trades  # noqa: PLC0415 (heavy: torch)

        pinned = plan(spec, cluster, args.global_batch, constraints=versus_constraints)
        versus = trades(report.best, pinned.best, f"--versus {args.versus}")
    if args.json:
        result = report.to_dict()
        if versus:
            result["versus"] = versus
        print(json.dumps(result, indent=1))
    else:
        if args.seq is None:  # an HF config's own length
            print(f"sequence length {spec.seq_len}: {hf_seq_reason(spec.seq_len)} (--seq sets "
                  "another)")
        print(report.explain() + (f"\n\n{versus}" if versus else ""))
    if args.plot:
        from unipar.viz.plan_pictures import plot_plan  # noqa: PLC0415 (heavy: torch)

        pictures = plot_plan(report, args.plot)
        if not args.json:
            print(f"pictures: {pictures.timeline}, {pictures.memory}, {pictures.breakdown}")
    return 0


def add_plan_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "plan", help="choose how to parallelise a model on a cluster (no cluster needed)"
    )
    parser.add_argument(
        "model",
        help="gpt, llama, mlp, ctr (an embedding table of --vocab rows and --hidden width "
        "looked up by --in-features id fields, then an MLP), or hf:PATH/config.json (a "
        "Hugging Face config of the Llama, Qwen2, Mistral or GPT-2 family; needs unipar[hf])",
    )
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=None, help="llama: grouped KV heads")
    parser.add_argument("--ffn-hidden", type=int, default=None, help="llama: SwiGLU width")
    parser.add_argument("--vocab", type=int, default=51200)
    parser.add_argument(
        "--seq",
        type=int,
        default=None,
        help=f"tokens per sample (default: {DEFAULT_SEQ}; an HF config: its positions, at most "
        "8192)",
    )
    parser.add_argument("--dropout", type=float, default=0.1, help="gpt: as in Megatron-LM")
    parser.add_argument("--untied-embeddings", action="store_true", help="gpt")
    parser.add_argument("--in-features", type=int, default=32, help="mlp; ctr: id fields")
    parser.add_argument("--out-features", type=int, default=10, help="mlp")
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument(
        "--cluster",
        default="a100-80g",
        help="a100-80g, a100-40g, h100-80g, h200-141g, v100-16g or cpu (measured here); "
        'mixed: "4xa100-80g+8xv100-16g" or a cluster YAML file',
    )
    parser.add_argument(
        "--attention",
        choices=["math", "flash"],
        default=None,
        help="the attention kernel (default: the preset's; GPUs: flash)",
    )
    parser.add_argument(
        "--kernels",
        choices=["fused", "eager"],
        default=None,
        help="fused (default: Megatron-LM, torch.compile) or eager PyTorch kernels",
    )
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument(
        "--gpus-per-node", type=int, default=None, help="devices per node (default: the preset's)"
    )
    parser.add_argument(
        "--fix",
        default=None,
        help="pin choices, e.g. tp=8,pp=2,dp=4,cp=2,recompute=full,sequence_parallel=true",
    )
    parser.add_argument(
        "--versus",
        default=None,
        help="also plan with these choices pinned (as --fix) and say what the chosen plan "
        "trades against it, e.g. a published plan: tp=8,pp=16,dp=64",
    )
    parser.add_argument(
        "--as-specified",
        action="store_true",
        help="plan with the cluster's rates as specified (spec sheet or calibration), "
        "without the corrections learned from runs measured on it",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--plot", default=None, metavar="DIR", help="write timeline/memory/breakdown PNGs here"
    )
    parser.set_defaults(handler=run_plan)
