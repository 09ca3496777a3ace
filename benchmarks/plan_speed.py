"""How long `plan()` takes, from a cold process, for the sizes the planner promises:
a 1-trillion-parameter GPT on 384 x 8 A100-80GB (target < 10 s) and models up to 20B on
up to 256 GPUs (target < 2 s). Prints analysis, search and total time per case."""

from __future__ import annotations

import time

from unipar.cluster import cluster_preset
from unipar.models import GPTConfig
from unipar.plan import plan

CASES = [
    # name, hidden, layers, heads, nodes, global batch, target seconds
    ("GPT 1.3B, 8 GPUs", 2048, 24, 16, 1, 512, 2.0),
    ("GPT 6.7B, 64 GPUs", 4096, 32, 32, 8, 1024, 2.0),
    ("GPT 18.4B, 256 GPUs", 6144, 40, 48, 32, 1024, 2.0),
    ("GPT 1T, 3072 GPUs", 25600, 128, 160, 384, 3072, 10.0),
]


def main() -> None:
    print(f"{'case':24s}{'analysis s':>12s}{'search s':>10s}{'total s':>9s}{'target':>8s}  plan")
    for name, hidden, layers, heads, nodes, batch, target in CASES:
        spec = GPTConfig(
            vocab_size=51200,
            seq_len=2048,
            hidden=hidden,
            layers=layers,
            heads=heads,
            dropout=0.1,
            tie_embeddings=True,
        ).spec()
        started = time.perf_counter()
        report = plan(spec, cluster_preset("a100-80g", nodes=nodes), batch)
        total = time.perf_counter() - started
        verdict = "ok" if total < target else "SLOW"
        print(
            f"{name:24s}{report.analysis_time_s:12.2f}{report.result.search_time_s:10.2f}"
            f"{total:9.2f}{target:7.0f}s {verdict}  {report.to_dict()['plan']}"
        )


if __name__ == "__main__":
    main()
