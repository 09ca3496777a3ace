"""Hugging Face models without Ray: where their blocks are, how pipeline stages of them
compose, what the planner sees on the meta device, and clear refusals."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("transformers")

import torch
from hf_models import CHECKED_ONLY, FAMILIES, SEQ, VOCAB, hf_job
from plans_for_tests import planned

from unipar import ConfigError, UnsupportedPlanError
from unipar.analysis import LayerKind, layer_sequence
from unipar.model_call import ModelCall
from unipar.plan import PipelineSchedule, TensorParallelStyle
from unipar.plan.for_job import job_model_spec
from unipar.runtime.parallel import stages
from unipar.runtime.parallel.model_checks import check_plan_for_model


def test_blocks_found_at_depth_with_embeddings_first_and_head_last():
    llama = [name for name, _ in layer_sequence(FAMILIES["llama"]())]
    assert llama == [
        "model.embed_tokens",
        *(f"model.layers.{i}" for i in range(4)),
        "model.norm",
        "model.rotary_emb",
        "lm_head",
    ]
    gpt2 = [name for name, _ in layer_sequence(FAMILIES["gpt2"]())]
    assert gpt2[:3] == ["transformer.wte", "transformer.wpe", "transformer.drop"]
    assert gpt2[3:7] == [f"transformer.h.{i}" for i in range(4)]
    assert gpt2[7:] == ["transformer.ln_f", "lm_head"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_planner_sees_blocks_head_and_model_facts(family):
    job = hf_job(family)
    spec = job_model_spec(job)
    assert spec.hidden == 32
    assert ("num_key_value_heads", 4 if family == "gpt2" else 2) in spec.tp_divisibility
    plan = planned(job, 4, pp=4, microbatch_size=2)
    assert len(plan.stage_boundaries) == 3  # one block per stage: 4 blocks found
    tp_plan = planned(job, 2, tp=2)
    names = [n for n, _ in layer_sequence(job.model())]
    styles = dict(zip(names, tp_plan.layer_tp, strict=True))
    assert styles["lm_head"] is TensorParallelStyle.VOCAB
    assert sum(s is TensorParallelStyle.MEGATRON for s in styles.values()) == 4


@pytest.mark.parametrize("family", [*FAMILIES, *CHECKED_ONLY])
@pytest.mark.parametrize("cuts", [(2,), (1, 2, 3)], ids=["2-stages", "4-stages"])
def test_stages_run_hf_forward_and_compose_to_the_whole_model(family, cuts):
    """``cuts``: the blocks where stages 2, 3, ... start. The last stage gives the whole
    model's output in its own type (a ``ModelOutput`` with ``logits``)."""
    torch.manual_seed(0)
    model = (FAMILIES | CHECKED_ONLY)[family]()
    names = [name for name, _ in layer_sequence(model)]
    first_block = next(i for i, name in enumerate(names) if name.endswith(".0"))
    bounds = [0, *(first_block + c for c in cuts), len(names)]
    chunks = [names[a:b] for a, b in itertools.pairwise(bounds)]
    sample = torch.randint(0, VOCAB, (2, SEQ))
    stages.check_stages_compose(model, chunks, sample, ModelCall.POSITIONAL)
    built = [stages.build_stage(model, chunk) for chunk in chunks]
    runs = [
        stages.attach_stage_forward(stage, chunks, index, ModelCall.POSITIONAL)
        for index, stage in enumerate(built)
    ]
    with torch.no_grad():
        expected = model(sample)
        h: tuple = ()
        for stage in built:
            h = (stage(*h, batch=sample),)
        output = runs[-1].rebuild(h[0])
    assert type(output) is type(expected)
    torch.testing.assert_close(
        getattr(output, "logits", output), getattr(expected, "logits", expected),
        rtol=1e-5, atol=1e-5,
    )
    # Each stage keeps only its own parameters, under their whole-model names.
    held = [{n for n, _ in stage.named_parameters()} for stage in built]
    everything = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    assert set().union(*held) == everything
    assert sum(len(h) for h in held) == len(everything)  # a tie across stages: one copy each


def test_tied_embedding_and_head_found_and_kept_in_sync_across_stages():
    model = FAMILIES["gpt2"]()
    assert stages.tied_parameters(model) == [["transformer.wte.weight", "lm_head.weight"]]
    plan = planned(hf_job("gpt2"), 2, pp=2, microbatch_size=2, schedule=PipelineSchedule.GPIPE)
    assert stages.cross_stage_ties(model, plan) == [
        [(0, "transformer.wte.weight"), (1, "lm_head.weight")]
    ]


def test_tensor_parallel_needs_whole_key_value_heads():
    from transformers import LlamaConfig, LlamaForCausalLM

    plan = planned(hf_job("llama"), 2, tp=2)
    one_kv_head = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=32,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=1,
            intermediate_size=64,
            vocab_size=VOCAB,
        )
    )
    with pytest.raises(UnsupportedPlanError, match="num_key_value_heads=1, which tp=2"):
        check_plan_for_model(one_kv_head, plan)


def test_planner_refuses_tp_that_splits_heads():
    from transformers import LlamaConfig, LlamaForCausalLM

    def model():  # type: ignore[no-untyped-def]
        return LlamaForCausalLM(
            LlamaConfig(
                hidden_size=48,
                num_hidden_layers=2,
                num_attention_heads=3,
                num_key_value_heads=3,
                intermediate_size=64,
                vocab_size=VOCAB,
            )
        )

    job = hf_job("llama")
    job = type(job)(**{**job.__dict__, "model": model})
    with pytest.raises(ConfigError, match="`tp` must divide `num_attention_heads`"):
        planned(job, 2, tp=2)


def test_unknown_family_refused_for_tp_naming_the_layer():
    """BLOOM declares no tensor-parallel plan and names its layers by none of the roles
    unipar knows."""
    from transformers import BloomConfig, BloomForCausalLM

    def model():  # type: ignore[no-untyped-def]
        return BloomForCausalLM(
            BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=VOCAB)
        )

    job = hf_job("llama")
    job = type(job)(**{**job.__dict__, "model": model})
    plan = planned(job, 2, tp=2)
    with pytest.raises(UnsupportedPlanError, match=r"cannot split layer 'transformer\.h\.0'"):
        check_plan_for_model(model(), plan)


def test_tensor_parallel_follows_the_models_own_plan():
    """GPT-NeoX names its layers by none of the roles unipar knows by name
    (``query_key_value``, ``dense_h_to_4h``, ...), but declares its own plan
    (``base_model_tp_plan``): the roles are the plan's."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from unipar.runtime.parallel.tensor import tensor_parallel_roles

    def model():  # type: ignore[no-untyped-def]
        config = GPTNeoXConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, vocab_size=VOCAB,
        )
        return GPTNeoXForCausalLM(config)

    job = hf_job("llama")
    job = type(job)(**{**job.__dict__, "model": model})
    roles = tensor_parallel_roles(model(), planned(job, 2, tp=2))
    block = {
        k.removeprefix("gpt_neox.layers.0."): role.value
        for k, role in roles.items()
        if ".layers.0." in k
    }
    assert block == {
        "attention.query_key_value": "column",
        "attention.dense": "row",
        "mlp.dense_h_to_4h": "column",
        "mlp.dense_4h_to_h": "row",
    }


def test_meta_analysis_counts_hf_blocks():
    from unipar.analysis import analyze

    profile = analyze(FAMILIES["llama"], (SEQ,))
    kinds = [layer.kind for layer in profile.layers]
    assert kinds.count(LayerKind.BLOCK) == 4
    assert kinds[0] is LayerKind.EMBEDDING and kinds[-1] is LayerKind.HEAD
    assert all(layer.forward_flops > 0 for layer in profile.layers if layer.kind is LayerKind.BLOCK)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_plan_the_planner_ranks_is_one_the_runtime_takes(family):
    """Across meshes of 8 devices (tp, pp, fsdp, dp and their mixes), each ranked
    plan passes the runtime's own check on the model (built on the meta device).
    Running them is the parity tests' part."""
    from unipar.analysis.meta import SkipInPlaceOnMeta
    from unipar.cluster import cluster_preset
    from unipar.plan import Constraints, plan

    job = hf_job(family, global_batch_size=16)
    spec = job_model_spec(job)
    with torch.device("meta"), SkipInPlaceOnMeta():
        model = job.model()
    cluster = cluster_preset("a100-80g", nodes=1, devices_per_node=8)
    seen = set()
    for pins in ({}, {"tp": 2}, {"pp": 2}, {"pp": 4}, {"pp": 2, "tp": 2}, {"fsdp": 4, "tp": 2}):
        report = plan(
            spec, cluster, 16, constraints=Constraints(**pins, runtime_only=True), keep=50
        )
        for candidate in report.result.ranked:
            check_plan_for_model(model, candidate.plan)
            mesh = candidate.plan.mesh
            seen.add((mesh.pp > 1, mesh.tp > 1, mesh.data_replicas > 1))
    # (pp, tp, data parallel): every mix 8 devices allow (pp <= 4 blocks, tp <= 2 heads)
    assert seen == {(False, False, True), (False, True, True), (True, False, True)} | {
        (True, True, False),
        (True, True, True),
    }


def test_mistral_blocks_split_by_role_under_tp():
    from unipar.runtime.parallel.tensor import tensor_parallel_roles

    job = hf_job("llama")
    job = type(job)(**{**job.__dict__, "model": CHECKED_ONLY["mistral"]})
    roles = {
        name: role.value
        for name, role in tensor_parallel_roles(job.model(), planned(job, 2, tp=2)).items()
    }
    block = {k.removeprefix("model.layers.0."): v for k, v in roles.items() if ".layers.0." in k}
    assert block == {
        "self_attn.q_proj": "column",
        "self_attn.k_proj": "column",
        "self_attn.v_proj": "column",
        "self_attn.o_proj": "row",
        "mlp.gate_proj": "column",
        "mlp.up_proj": "column",
        "mlp.down_proj": "row",
    }
    assert roles["model.embed_tokens"] == roles["lm_head"] == "vocab"


def test_gpt2_conv1d_and_fused_qkv_roles_under_tp():
    from unipar.runtime.parallel.tensor import tensor_parallel_roles

    job = hf_job("gpt2")
    roles = {
        name: role.value
        for name, role in tensor_parallel_roles(job.model(), planned(job, 2, tp=2)).items()
    }
    block = {k.removeprefix("transformer.h.0."): v for k, v in roles.items() if ".h.0." in k}
    assert block == {
        "attn.c_attn": "fused_qkv",
        "attn.c_proj": "row",
        "mlp.c_fc": "column",
        "mlp.c_proj": "row",
    }
    assert roles["transformer.wte"] == roles["lm_head"] == "vocab"


def test_tied_layers_sharded_differently_refused_before_start():
    from dataclasses import replace

    job = hf_job("gpt2")
    plan = planned(job, 2, tp=2)
    styles = list(plan.layer_tp)
    styles[0] = TensorParallelStyle.REPLICATE  # transformer.wte, tied to lm_head
    with pytest.raises(UnsupportedPlanError, match=r"share a parameter \(tied weights\)"):
        check_plan_for_model(job.model(), replace(plan, layer_tp=tuple(styles)))
