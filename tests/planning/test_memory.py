"""The memory planner: counts equal the real architecture's, parts add up, and the shipped settings' verdicts.

Everything here runs on the meta device or tiny CPU modules: no weights, no GPU, no hub.
"""

import json

import pytest
from helpers import load_bench
import torch

from grpokit.planning import memory
from grpokit.planning.architecture import ConfigNotFound, load_model_config, lora_param_count, param_counts, shipped_models
from grpokit.planning.memory import GIB, plan

SHIPPED = shipped_models()
LORA = {"r": 16, "target_modules": "all-linear"}
# The settings the shipped recipes are planned with: 8 completions of 1024 tokens per prompt, prompts of
# ~256 tokens (GSM8K + chat template), 4 prompts per generation batch, micro-batch 8 (one group).
RUN = dict(num_generations=8, max_completion_length=1024, prompt_length=256, gradient_checkpointing=True,
           per_device_train_batch_size=8, generation_batch_size=32)
TINY_QWEN = dict(model_type="qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=101, tie_word_embeddings=False)


def meta_count(cfg: dict) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    return sum(p.numel() for p in model.parameters())  # tied weights are one parameter, counted once


def test_the_qwen2_5_models_smollm2_and_todays_families_ship():
    assert SHIPPED == sorted(["HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM3-3B", "Qwen/Qwen3-1.7B",
                              "google/gemma-4-E2B-it",
                              "Qwen/Qwen3.5-0.8B", "meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct"]
                             + [f"Qwen/Qwen2.5-{s}-Instruct" for s in ("0.5B", "1.5B", "3B", "7B")])


@pytest.mark.parametrize("name", SHIPPED)
def test_param_count_equals_the_architecture_built_on_meta(name):
    cfg, source = load_model_config(name)
    assert source.startswith("shipped config")
    assert param_counts(cfg)["total"] == meta_count(cfg)


@pytest.mark.parametrize("extra", [
    dict(model_type="llama", attention_bias=True, mlp_bias=True),  # llama's biases cover o_proj too
    dict(model_type="mistral"),
    dict(model_type="qwen3", head_dim=32),  # head_dim != hidden/heads, plus q_norm and k_norm
    dict(tie_word_embeddings=True),
])
def test_param_count_other_llama_like_architectures(extra):
    cfg = {**TINY_QWEN, **extra}
    assert param_counts(cfg)["total"] == meta_count(cfg)


def test_builtin_tiny_model_config_is_planned_without_building_it():
    cfg, source = load_model_config("builtin:tiny-llama")
    assert source == "built-in tiny model"
    assert param_counts(cfg)["total"] == meta_count(cfg)


@pytest.mark.parametrize("targets,dora", [
    ("all-linear", False),
    (["q_proj", "v_proj"], False),
    (["gate_proj", "down_proj", "o_proj"], True),
])
def test_lora_count_equals_peft(targets, dora):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY_QWEN))
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=targets, use_dora=dora, task_type="CAUSAL_LM"))
    trainable, _ = peft_model.get_nb_trainable_parameters()
    assert lora_param_count(TINY_QWEN, 4, targets, use_dora=dora) == trainable


def test_lora_unknown_target_module_says_what_exists():
    with pytest.raises(ValueError, match="'qkv_proj' is not a module of this architecture.*q_proj"):
        lora_param_count(TINY_QWEN, 4, ["qkv_proj"])


def test_load_config_from_a_local_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN))
    cfg, source = load_model_config(str(tmp_path))
    assert cfg == TINY_QWEN and source.startswith("local config")


def test_unreachable_config_says_so():
    with pytest.raises(ConfigNotFound, match="not reachable offline"):
        load_model_config("nobody/no-such-model-anywhere")


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("setup", ["lora", "full", "qlora-beta"])
def test_components_add_up_to_the_phase_totals_and_the_peak_is_the_larger_phase(name, setup):
    cfg, _ = load_model_config(name)
    knobs = {"lora": dict(lora=LORA, optim="adamw_bnb_8bit"), "full": dict(optim="adamw_torch"),
             "qlora-beta": dict(lora=LORA, quantization="4bit", beta=0.04, optim="paged_adamw_8bit")}[setup]
    p = plan(cfg, **RUN, **knobs)
    for phase in p.phases:
        assert phase.bytes == sum(c.bytes for c in phase.components)
        assert all(c.bytes >= 0 and c.how for c in phase.components)
    assert [ph.name for ph in p.phases] == ["generation", "training"]
    assert p.peak.bytes == max(ph.bytes for ph in p.phases)  # the phases alternate: max, not sum
    assert p.total_gb * GIB == pytest.approx(p.peak.bytes + p.overhead_bytes)
    text = "\n".join(p.render(full=True))  # the table: every component by name (the default view names the largest)
    assert "not measured" in text and p.peak.name in text
    for c in p.peak.components:
        assert c.name in text


def test_3b_lora_recipe_fits_16_gib():
    cfg, _ = load_model_config("Qwen/Qwen2.5-3B-Instruct")
    p = plan(cfg, lora=LORA, optim="adamw_bnb_8bit", **RUN)
    assert p.fits, "\n".join(p.render())
    assert p.peak.name == "training" and p.headroom_gb > 2
    assert p.suggestion is None


def test_3b_full_fine_tune_does_not_fit_and_says_what_to_turn():
    cfg, _ = load_model_config("Qwen/Qwen2.5-3B-Instruct")
    p = plan(cfg, optim="adamw_torch", **RUN)
    assert not p.fits
    # weights + gradients + two Adam states are already 4 x 5.75 GiB before any activation
    parts = {c.name: c.bytes for c in p.peak.components}
    assert parts["weights"] + parts["gradients"] + parts["optimizer states"] > 16 * GIB
    assert p.suggestion.startswith("a lora section")
    assert "does NOT fit" in p.render()[-1]


def test_7b_qlora_fits_16_gib():
    cfg, _ = load_model_config("Qwen/Qwen2.5-7B-Instruct")
    p = plan(cfg, lora=LORA, quantization="4bit", optim="adamw_bnb_8bit", **{**RUN, "per_device_train_batch_size": 4})
    assert p.fits, "\n".join(p.render())
    weights = next(c for c in p.peak.components if c.name == "weights").bytes
    assert 4.5 * GIB < weights < 6 * GIB  # 6.5 B linear params at ~0.52 B + 1.1 B embedding/head params at 2 B


def test_kv_cache_is_the_documented_formula():
    cfg, _ = load_model_config("Qwen/Qwen2.5-3B-Instruct")
    p = plan(cfg, lora=LORA, **{**RUN, "generation_batch_size": 64})
    gen = p.phases[0]
    assert gen.moment == "last decode step"
    kv = next(c for c in gen.components if c.name == "KV cache").bytes
    # G x len x layers x (k, v) x kv_heads x head_dim x bf16; len = P + C - 1: the last token is never fed back
    assert kv == 64 * (256 + 1024 - 1) * 36 * 2 * 2 * 128 * 2


def test_generation_can_be_the_peak():
    cfg, _ = load_model_config("Qwen/Qwen2.5-1.5B-Instruct")
    p = plan(cfg, lora=LORA, **{**RUN, "per_device_train_batch_size": 1, "generation_batch_size": 256})
    assert p.peak.name == "generation"
    assert "generation phase" in p.render()[-1]


def test_reference_model_none_shared_or_copy():
    cfg, _ = load_model_config("Qwen/Qwen2.5-0.5B-Instruct")

    def ref(**knobs):
        p = plan(cfg, **RUN, **knobs)
        return next(c for c in p.peak.components if c.name == "reference model")

    weights = next(c for c in plan(cfg, **RUN).peak.components if c.name == "weights").bytes
    assert ref(beta=0.0).bytes == 0 and "none" in ref(beta=0.0).how
    assert ref(beta=0.04, lora=LORA).bytes == 0 and "adapter disabled" in ref(beta=0.04, lora=LORA).how
    assert ref(beta=0.04).bytes == weights


def test_optimizer_8bit_vs_32bit_per_param():
    cfg, _ = load_model_config("Qwen/Qwen2.5-1.5B-Instruct")
    n = lora_param_count(cfg, 16)

    def states(optim):
        return next(c for c in plan(cfg, lora=LORA, optim=optim, **RUN).peak.components if c.name == "optimizer states").bytes

    assert states("adamw_torch") == 8 * n  # fp32 adapters: two fp32 states
    assert states("paged_adamw_32bit") == 8 * n
    assert 2 * n < states("adamw_bnb_8bit") < 2.1 * n  # two 1-byte states + block scales


def test_full_fine_tune_with_8bit_adam_keeps_embeddings_32bit():
    cfg, _ = load_model_config("Qwen/Qwen2.5-0.5B-Instruct")
    counts = param_counts(cfg)
    states = next(c for c in plan(cfg, optim="adamw_bnb_8bit", **RUN).peak.components if c.name == "optimizer states")
    rest = counts["total"] - counts["embedding"]
    assert states.bytes == pytest.approx(8 * counts["embedding"] + 2 * rest * memory.BNB_8BIT_STATE, rel=1e-6)


def test_gradient_checkpointing_off_costs_activations_and_is_the_first_knob():
    cfg, _ = load_model_config("Qwen/Qwen2.5-3B-Instruct")
    on = plan(cfg, lora=LORA, optim="adamw_bnb_8bit", **RUN)
    off = plan(cfg, lora=LORA, optim="adamw_bnb_8bit", **{**RUN, "gradient_checkpointing": False})

    def acts(p):
        return next(c for c in p.phases[1].components if c.name == "activations").bytes

    assert acts(off) > 5 * acts(on)
    assert not off.fits and off.suggestion.startswith("trainer.gradient_checkpointing: true")


def test_logits_are_tiled_not_tokens_times_vocab():
    cfg, _ = load_model_config("Qwen/Qwen2.5-3B-Instruct")
    p = plan(cfg, lora=LORA, **RUN)
    head = next(m for m in p.moments if m.moment == "head backward")
    logits = next(c for c in head.components if c.name == "logits")
    full = 8 * 1024 * 151936 * 4
    assert logits.bytes < full / 10
    assert f"{full / GIB:.2f} GiB" in logits.how  # the unfused size is still shown


def test_plan_for_reads_a_real_grpo_config(tmp_path):
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=8,
                      gradient_accumulation_steps=4, num_generations=8, max_completion_length=1024,
                      optim="adamw_bnb_8bit", beta=0.0)
    p = memory.plan_for(args, model={"name_or_path": "Qwen/Qwen2.5-3B-Instruct", "dtype": "auto",
                                     "quantization": "none"}, lora=LORA, prompt_length=256)
    s = p.settings
    # the default card is a T4, without bfloat16: `auto` runs float16 there
    assert (s.dtype, s.optim, s.gen_batch, s.per_device_train_batch_size) == ("float16", "adamw_bnb_8bit", 32, 8)
    assert (s.card, s.gpu_memory_gb) == (memory.DEFAULT_CARD.name, 15.0)
    assert p.fits and p.model == "Qwen/Qwen2.5-3B-Instruct"
    assert p.as_dict()["peak_phase"] == "training"
    other = memory.plan_for(args, model={"name_or_path": "Qwen/Qwen2.5-3B-Instruct", "dtype": "auto",
                                         "quantization": "none"}, lora=LORA, prompt_length=256, gpu_memory_gb=24)
    assert (other.settings.dtype, other.settings.card, other.settings.gpu_memory_gb) == ("bfloat16", None, 24)


def test_bad_knobs_are_refused_with_the_allowed_values():
    cfg, _ = load_model_config("Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(ValueError, match="none, 8bit or 4bit"):
        plan(cfg, quantization="3bit")
    with pytest.raises(ValueError, match="cannot plan model_type=.gpt2.: its layers are not modelled; planned families: qwen2"):
        plan({**cfg, "model_type": "gpt2"})


def _bench():
    return load_bench("gpu_memory")


def test_bench_cases_are_planned_to_fit_and_compared_per_phase():
    """The GPU benchmark's cases (run on a GPU only) are the shipped settings, planned for the GPU path; its
    allocator bookkeeping runs here on made-up peaks."""
    bench = _bench()
    assert {c.name for c in bench.CASES} == {"3b-lora", "7b-qlora", "1.5b-lora", "0.5b-lora"}
    for case in bench.CASES:
        p = bench.pvm.plan(case, "cuda")
        assert p.fits, case.name
        assert p.settings.device == "cuda" and p.settings.dtype == "bfloat16"
    peaks = {"generation": {"allocated": 4 * GIB, "reserved": 5 * GIB}, "forward": {"allocated": 7 * GIB, "reserved": 8 * GIB},
             "backward": {"allocated": 8 * GIB, "reserved": 9 * GIB}}
    measured = {"phases": {"generation": {"bytes": 3 * GIB}, "training": {"bytes": 7 * GIB}}}
    out = bench.allocator_phases(peaks, measured)
    assert out["training"] == {"allocated": 8 * GIB, "reserved": 9 * GIB, "kernel_and_rounding": GIB}
    assert out["generation"]["kernel_and_rounding"] == GIB


@pytest.mark.parametrize("module", ["grpokit.planning.architecture", "grpokit.planning.memory",
                                    "grpokit.planning.moments", "grpokit.planning.measure"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted and not result.failed
