"""Today's families in the memory plan: each shipped config is the model card's size, every layer kind is counted
(Gated DeltaNet layers, Qwen3.5's gated attention, SmolLM3's layers without rotary positions), and a family or a
config the plan cannot count is refused with one line that says what is not modelled.

Counts are checked against the real architecture built on the meta device, and the Gated DeltaNet mixer's
activations against autograd's own saved tensors of one layer: no weights, no GRPO steps.
"""

from __future__ import annotations

import pytest
import torch

from grpokit.planning.architecture import (FAMILIES, NotModelled, dims, layer_kinds, load_model_config,
                                           lora_param_count, param_counts)
from grpokit.planning.memory import plan
from grpokit.planning.moments import Settings, layer_activations

# A Qwen3.5 of a few dozen thousand parameters: both layer kinds, GQA in full attention, more value than key heads
TINY_QWEN3_5 = {"model_type": "qwen3_5", "tie_word_embeddings": False, "text_config": dict(
    model_type="qwen3_5_text", hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=101, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, tie_word_embeddings=False)}
# published sizes (model cards): total parameters, what the model card rounds them to
PUBLISHED = {"Qwen/Qwen3-1.7B": 1.7e9, "HuggingFaceTB/SmolLM3-3B": 3.0e9, "meta-llama/Llama-3.2-1B-Instruct": 1.23e9,
             "meta-llama/Llama-3.2-3B-Instruct": 3.21e9, "Qwen/Qwen3.5-0.8B": 0.8e9}


def meta_model(cfg: dict):
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shipped_config_builds_at_the_published_size(name):
    cfg, _ = load_model_config(name)
    total = param_counts(cfg)["total"]
    assert total == sum(p.numel() for p in meta_model(cfg).parameters())
    # Qwen3.5-0.8B's card counts its vision encoder, which AutoModelForCausalLM does not build
    assert abs(total / PUBLISHED[name] - 1) < (0.08 if name == "Qwen/Qwen3.5-0.8B" else 0.03)


def test_qwen3_5_counts_both_layer_kinds():
    assert layer_kinds(TINY_QWEN3_5) == ["linear", "linear", "linear", "full"]  # full_attention_interval 4
    assert param_counts(TINY_QWEN3_5)["total"] == sum(p.numel() for p in meta_model(TINY_QWEN3_5).parameters())
    d = dims(load_model_config("Qwen/Qwen3.5-0.8B")[0])
    assert (d["n_full"], d["n_linear"], d["conv"]) == (6, 18, 2 * 16 * 128 + 16 * 128)


@pytest.mark.parametrize("targets", ["all-linear", ["in_proj_qkv", "out_proj"], ["q_proj", "gate_proj"]])
def test_qwen3_5_lora_count_equals_peft(targets):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY_QWEN3_5))
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=targets, task_type="CAUSAL_LM"))
    assert lora_param_count(TINY_QWEN3_5, 4, targets) == peft_model.get_nb_trainable_parameters()[0]


def test_smollm3_layers_without_rotary_positions_are_planned_as_attention():
    cfg, _ = load_model_config("HuggingFaceTB/SmolLM3-3B")
    assert cfg["no_rope_layers"].count(0) == 9 and layer_kinds(cfg) == ["full"] * 36


@pytest.mark.parametrize("dtype,S", [(torch.bfloat16, 64), (torch.bfloat16, 128), (torch.float32, 128)])
def test_gated_deltanet_activations_equal_autograds_saved_tensors(dtype, S):
    """The mixer's planned bytes per token against what autograd saves for one layer (weights frozen, as under LoRA)."""
    from transformers import AutoConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    text = AutoConfig.for_model(**TINY_QWEN3_5).text_config
    layer = Qwen3_5GatedDeltaNet(text, 0).to(dtype).requires_grad_(False)
    weights = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    B = 2
    x = torch.randn(B, S, 64, dtype=dtype, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, attention_mask=torch.ones(B, S, dtype=torch.long))
    s = Settings(dtype={torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype], lora={"r": 4, "target_modules": []},
                 device="cpu")
    a = 2 if dtype == torch.bfloat16 else 4
    mlp_and_norms = 2 * (4 * 64 + 4 + a * 64) + 4 * a * 96
    planned = layer_activations(TINY_QWEN3_5, s, S, "linear")[0] - mlp_and_norms
    assert planned == pytest.approx(sum(saved.values()) / (B * S), rel=0.03)


def test_hybrid_generation_holds_a_fixed_state_and_a_cache_for_full_layers_only():
    cfg, _ = load_model_config("Qwen/Qwen3.5-0.8B")
    d = dims(cfg)
    short, long = (plan(cfg, lora={"r": 16}, max_completion_length=c, generation_batch_size=8) for c in (256, 512))
    grown = [next(c.bytes for c in p.moments[1].components if c.name == "KV cache") for p in (short, long)]
    assert grown[1] - grown[0] == 8 * 256 * d["n_full"] * 2 * d["kv"] * 2  # only 6 of 24 layers grow
    state = 8 * d["n_linear"] * (d["conv"] * 4 * 2 + 16 * 128 * 128 * 4)
    assert grown[0] == 8 * (256 + 256 - 1) * d["n_full"] * 2 * d["kv"] * 2 + state


@pytest.mark.parametrize("cfg,what", [
    ({"model_type": "gemma4", "text_config": {"model_type": "gemma4_text", "enable_moe_block": True}},
     "mixture-of-experts blocks"),
    ({"model_type": "qwen3_moe", "hidden_size": 8}, "mixture-of-experts layers"),
    ({**TINY_QWEN3_5["text_config"], "model_type": "qwen3_5_text", "num_experts": 8}, "mixture-of-experts"),
    ({"model_type": "qwen3", "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]},
     "layer kind(s) sliding_attention"),
    ({"model_type": "smollm3", "use_sliding_window": True, "sliding_window": 4096, "num_hidden_layers": 2},
     "sliding-window layers"),
    ({"model_type": "phi3"}, "its layers are"),
])
def test_what_the_plan_cannot_count_is_refused_in_one_line(cfg, what):
    with pytest.raises(NotModelled) as err:
        plan(cfg, lora={"r": 16})
    text = str(err.value)
    assert "\n" not in text and what in text and "not modelled" in text
    assert f"cannot plan model_type={cfg['model_type'].removesuffix('_text') if 'experts' in what and 'qwen3_5' in cfg['model_type'] else cfg['model_type']!r}" in text
    assert "planned families: " + ", ".join(FAMILIES) in text


def test_check_names_an_unmodelled_family_and_checks_the_rest(tmp_path, capsys, no_weights, monkeypatch):
    """--check on a recipe whose model the plan cannot count: one line, and the recipe is still checked (exit 0)."""
    from grpokit import cli
    from grpokit.planning import memory
    from tests.helpers import recipe_dict, write_recipe

    gemma = {"model_type": "gemma4", "text_config": {"model_type": "gemma4_text", "enable_moe_block": True}}
    monkeypatch.setattr(memory, "load_model_config", lambda name: (gemma, "given"))
    assert cli.main(["--recipe", str(write_recipe(tmp_path, recipe_dict())), "--check"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "Memory plan" in line]
    assert lines == ["Memory plan: not available -- cannot plan model_type='gemma4': mixture-of-experts blocks "
                     "(enable_moe_block) is not modelled; planned families: " + ", ".join(FAMILIES)]
    assert "first formatted rows" in out.lower() or "rows" in out  # the data was still checked


def test_vllm_share_of_a_hybrid_model_is_refused_not_guessed():
    """vLLM keeps Gated DeltaNet state in a cache of its own, which vllm_share does not count."""
    from grpokit.planning import vllm_share

    cfg, _ = load_model_config("Qwen/Qwen3.5-0.8B")
    with pytest.raises(NotModelled, match="cannot plan model_type='qwen3_5': vLLM's share for Gated DeltaNet layers"):
        vllm_share.plan_colocate(cfg, utilization=0.3, sleep=True, lora={"r": 16})


@pytest.mark.slow
def test_a_real_step_of_a_hybrid_model_is_planned_within_tolerance():
    """One real GRPOTrainer step of a 64-wide Qwen3.5 (both layer kinds, every layer's activations kept) under the
    live-tensor counter: a transformers upgrade that changes what Gated DeltaNet layers hold fails here."""
    from helpers import load_bench

    pvm = load_bench("plan_vs_measured")
    [record] = pvm.run([pvm.TINY_HYBRID], log=lambda line: None)
    for name, phase in record["comparison"]["phases"].items():
        assert abs(phase["error"]) <= pvm.TOLERANCE, "\n".join(pvm.components(record))
    kept = record["comparison"]["phases"]["training"]["components"]["activations"]
    assert kept["planned"] == pytest.approx(kept["measured"], rel=0.10)  # the layer kinds' own share
