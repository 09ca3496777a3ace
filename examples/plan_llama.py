"""Ask the planner how to train Llama 3 8B (4,096-token sequences) on 4 nodes of 8 H100s.

python examples/plan_llama.py
"""

from __future__ import annotations

from unipar.cluster import cluster_preset
from unipar.models import llama3_8b
from unipar.plan import plan


def main() -> None:
    model = llama3_8b(seq_len=4096)
    report = plan(model.spec(), cluster_preset("h100-80g", nodes=4), global_batch_size=256)
    print(report.explain())
    print("\nplan for the runtime:", report.best.plan.to_json())


if __name__ == "__main__":
    main()
