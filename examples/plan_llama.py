"""Ask the planner how to train a Llama-7B-like model on 4 nodes of 8 H100s.

python examples/plan_llama.py
"""

from __future__ import annotations

from unipar.cluster import cluster_preset
from unipar.models import LlamaConfig
from unipar.plan import plan


def main() -> None:
    model = LlamaConfig(
        vocab_size=32000,
        seq_len=4096,
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        ffn_hidden=11008,
    )
    report = plan(model.spec(), cluster_preset("h100-80g", nodes=4), global_batch_size=256)
    print(report.explain())
    print("\nplan for the runtime:", report.best.plan.to_json())


if __name__ == "__main__":
    main()
