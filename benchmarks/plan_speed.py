"""How long `plan()` takes, from a cold process, for the sizes the planner promises:
Llama 3.1 405B on 1,024 x 8 H100-80GB (target <= 5 s, once from unipar's Llama and
once from the Hugging Face config, which imports transformers on first use), a
1-trillion-parameter GPT on 384 x 8 A100-80GB (target <= 5 s) and models up to 20B on
up to 256 GPUs (target < 2 s). Prints analysis, search and total (wall) time and the
process's CPU time per case (the CPU time is what the work costs on a shared machine),
the published 405B plan (TP8 x PP16 x DP64) pinned, and each case's time as a ratio of
the smallest case's (measured in the same invocation)."""

from __future__ import annotations

import time
from pathlib import Path

from unipar.cluster import cluster_preset
from unipar.models import GPTConfig, llama3_405b
from unipar.plan import Constraints, plan
from unipar.plan.explain import describe

HF_405B = Path(__file__).resolve().parents[1] / "tests" / "hf_configs" / "llama3.1_405b.json"


def _gpt(hidden: int, layers: int, heads: int):  # type: ignore[no-untyped-def]
    return GPTConfig(
        vocab_size=51200,
        seq_len=2048,
        hidden=hidden,
        layers=layers,
        heads=heads,
        dropout=0.1,
        tie_embeddings=True,
    ).spec()


def _llama_405b():  # type: ignore[no-untyped-def]
    return llama3_405b(seq_len=8192).spec()


def _hf_405b():  # type: ignore[no-untyped-def]
    from unipar.models.hf_config import hf_spec

    return hf_spec(HF_405B, seq_len=8192)


PUBLISHED_405B = Constraints(tp=8, pp=16, dp=64, cp=1)
CASES = [
    # name, spec, preset, nodes, global batch, constraints, target seconds
    ("GPT 1.3B, 8 GPUs", lambda: _gpt(2048, 24, 16), "a100-80g", 1, 512, None, 2.0),
    ("GPT 6.7B, 64 GPUs", lambda: _gpt(4096, 32, 32), "a100-80g", 8, 1024, None, 2.0),
    ("GPT 18.4B, 256 GPUs", lambda: _gpt(6144, 40, 48), "a100-80g", 32, 1024, None, 2.0),
    ("GPT 1T, 3072 GPUs", lambda: _gpt(25600, 128, 160), "a100-80g", 384, 3072, None, 5.0),
    ("Llama 405B, 8192 GPUs", _llama_405b, "h100-80g", 1024, 2048, None, 5.0),
    ("  published TP8xPP16", _llama_405b, "h100-80g", 1024, 2048, PUBLISHED_405B, 5.0),
    ("HF Llama 405B, 8192", _hf_405b, "h100-80g", 1024, 2048, None, 5.0),
]


def main() -> None:
    print(
        f"{'case':24s}{'analysis s':>12s}{'search s':>10s}{'total s':>9s}{'cpu s':>7s}"
        f"{'target':>8s}  plan"
    )
    totals = {}
    for name, spec, preset, nodes, batch, constraints, target in CASES:
        started, cpu = time.perf_counter(), time.process_time()
        report = plan(spec(), cluster_preset(preset, nodes=nodes), batch, constraints=constraints)
        total = time.perf_counter() - started
        cpu = time.process_time() - cpu
        totals[name.strip()] = total
        verdict = "ok" if total <= target else "SLOW"
        fits = "fits" if report.best.estimate.fits else "OVER MEMORY"
        print(
            f"{name:24s}{report.analysis_time_s:12.2f}{report.result.search_time_s:10.2f}"
            f"{total:9.2f}{cpu:7.2f}{target:7.0f}s {verdict} {fits}  {describe(report.best)}"
        )
    smallest = min(totals.values())
    ratios = ", ".join(f"{k} {v / smallest:.1f}x" for k, v in totals.items())
    print(f"time / smallest case: {ratios}")
    print(
        "RESULT "
        f"llama405b_8192_s={totals['Llama 405B, 8192 GPUs']:.2f} "
        f"llama405b_published_s={totals['published TP8xPP16']:.2f} "
        f"hf_llama405b_8192_s={totals['HF Llama 405B, 8192']:.2f} "
        f"gpt1t_3072_s={totals['GPT 1T, 3072 GPUs']:.2f}"
    )


if __name__ == "__main__":
    main()
