"""Gemma 4 in the memory plan: the shipped E2B config builds at the published size (towers included, as
AutoModelForCausalLM loads it), every layer kind is counted (sliding and full attention with their own head sizes,
shared-KV layers without k/v projections or cache, double-wide MLPs, per-layer input embeddings), LoRA 'all-linear'
counts what PEFT adapts, the cache the plan assumes is the one transformers keeps, and what the plan cannot count
is refused in one line. Meta-device builds and a tiny model: no weights, no GRPO steps.
"""

from __future__ import annotations

import pytest
import torch

from grpokit.planning import gemma4
from grpokit.planning.architecture import NotModelled, load_model_config, lora_param_count, param_counts
from grpokit.planning.memory import plan

E2B = "google/gemma-4-E2B-it"
# every kind at a few thousand parameters: sliding and full layers, the last two reusing the first two's keys and
# values with double-wide MLPs, per-layer inputs, both towers (their clipped linears included)
TINY = {"model_type": "gemma4", "tie_word_embeddings": True,
        "text_config": dict(model_type="gemma4_text", hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=8, global_head_dim=16,
                            sliding_window=4, vocab_size=101, vocab_size_per_layer_input=101,
                            hidden_size_per_layer_input=8, num_kv_shared_layers=2, use_double_wide_mlp=True,
                            final_logit_softcapping=30.0,
                            layer_types=["sliding_attention", "full_attention"] * 2),
        "vision_config": dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=2, head_dim=8, patch_size=2,
                              position_embedding_size=8, use_clipped_linears=True),
        "audio_config": dict(model_type="gemma4_audio", hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                             subsampling_conv_channels=[8, 4], output_proj_dims=24, use_clipped_linears=True)}


def build(cfg: dict, device: str = "meta"):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))


def test_e2b_builds_at_the_published_size_towers_included():
    cfg, source = load_model_config(E2B)
    model = build(cfg)
    assert type(model).__name__ == "Gemma4ForConditionalGeneration"  # what AutoModelForCausalLM loads: the towers too
    counts = param_counts(cfg)
    assert counts["total"] == sum(p.numel() for p in model.parameters()) == 5_104_297_504
    towers = sum(p.numel() for n, p in model.named_parameters() if "language_model" not in n and "lm_head" not in n)
    assert counts["towers"] == towers
    # the model card: "2.3B effective (5.1B with embeddings)": without the token and per-layer embeddings
    assert abs(counts["total"] / 5.1e9 - 1) < 0.01
    assert abs((counts["total"] - counts["embedding"] - counts["per_layer_embedding"]) / 2.3e9 - 1) < 0.03


def test_the_text_decoder_alone_is_gemma4_text():
    cfg, _ = load_model_config(E2B)
    text = {**cfg["text_config"], "tie_word_embeddings": True}
    model = build(text)
    assert type(model).__name__ == "Gemma4ForCausalLM"
    assert param_counts(text)["total"] == sum(p.numel() for p in model.parameters())
    assert param_counts(text)["total"] == param_counts(cfg)["total"] - param_counts(cfg)["towers"]


def test_e2b_layer_kinds():
    cfg, _ = load_model_config(E2B)
    kinds = gemma4.layer_kinds(cfg)
    assert [kinds.count(k) for k in gemma4.KINDS] == [12, 3, 16, 4]  # layers 15-34 reuse 13's and 14's keys and values
    shapes = dict((k, s) for k, _, s in gemma4.layer_groups(cfg))
    assert "k_proj" not in shapes["sliding shared"] and shapes["full"]["q_proj"] == (1536, 8 * 512, False)
    assert shapes["sliding shared"]["gate_proj"] == (1536, 2 * 6144, False)  # double-wide where shared
    assert shapes["sliding"]["gate_proj"] == (1536, 6144, False)


def test_tiny_counts_equal_the_built_model_and_peft():
    from peft import LoraConfig, get_peft_model

    assert param_counts(TINY)["total"] == sum(p.numel() for p in build(TINY).parameters())
    model = build(TINY, "cpu")
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    assert lora_param_count(TINY, 4) == peft_model.get_nb_trainable_parameters()[0]


def test_the_cache_keeps_what_the_plan_counts():
    """A shared-KV layer's cache stores nothing; a full layer every position; a sliding one the last window - 1 as a
    view of the cat it made: the prompt's length after the prefill, the window after a decode step."""
    text = {**TINY["text_config"], "tie_word_embeddings": True}
    model = build(text, "cpu").eval()
    G, P, W = 2, 10, text["sliding_window"]
    with torch.no_grad():
        out = model(torch.randint(2, 100, (G, P)), use_cache=True)
        cache = out.past_key_values
        held = [layer.keys.untyped_storage().nbytes() if getattr(layer, "keys", None) is not None else 0
                for layer in cache.layers]
        for _ in range(3):
            out = model(torch.randint(2, 100, (G, 1)), past_key_values=cache, use_cache=True)
        after = [layer.keys.untyped_storage().nbytes() if getattr(layer, "keys", None) is not None else 0
                 for layer in cache.layers]
    per = {k: gemma4.kind_dims(text, k)["kv"] * 4 for k in gemma4.KINDS}
    assert held == [G * P * per["sliding"], G * P * per["full"], 0, 0]
    assert after == [G * W * per["sliding"], G * (P + 3) * per["full"], 0, 0]
    prefill, last, _ = gemma4.kv_cache(text, G, P, P + 4, 4)
    assert (prefill, last) == (2 * sum(held), 2 * sum(after))  # keys and values alike


def test_e2b_plan_grows_the_cache_of_full_layers_only_past_the_window():
    cfg, _ = load_model_config(E2B)
    short, long = (plan(cfg, lora={"r": 16}, max_completion_length=c, generation_batch_size=8) for c in (1024, 2048))
    grown = [next(c.bytes for c in p.moments[1].components if c.name == "KV cache") for p in (short, long)]
    assert grown[1] - grown[0] == 8 * 1024 * 3 * 2 * 512 * 2  # 3 full layers of one 512-wide KV head, bf16


@pytest.mark.parametrize("change,what", [
    ({"enable_moe_block": True}, "mixture-of-experts blocks"),
    ({"attention_k_eq_v": True}, "keys are their values"),
    ({"use_bidirectional_attention": "all"}, "bidirectional attention"),
    ({"num_kv_shared_layers": 3}, "shared-KV layers of a type no earlier layer produces"),
])
def test_what_gemma4_the_plan_cannot_count_is_refused_in_one_line(change, what):
    cfg = {**TINY, "text_config": {**TINY["text_config"], **change}}
    with pytest.raises(NotModelled) as err:
        plan(cfg, lora={"r": 16})
    assert "\n" not in str(err.value) and what in str(err.value) and "model_type='gemma4'" in str(err.value)


def test_named_lora_targets_are_refused_for_gemma4():
    """A name like q_proj also names the towers' clipped linears, which PEFT refuses to adapt: only 'all-linear'
    (nn.Linear by class, the towers' inner ones included) builds, so only it is planned."""
    from peft import LoraConfig, get_peft_model

    with pytest.raises(ValueError, match="'all-linear'"):
        plan(TINY, lora={"r": 16, "target_modules": ["q_proj"]})
    with pytest.raises(ValueError, match="Gemma4ClippableLinear"):
        get_peft_model(build(TINY, "cpu"), LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))


def test_each_layer_kinds_activations_equal_autograds_saved_tensors():
    """At E2B's widths (vocabulary cut to 128 rows), LoRA all-linear on bf16: what each layer kind saves for backward,
    storages of parameters left out, is what moments.layer_activations plans (adapters' fp32 inputs included)."""
    from peft import LoraConfig, get_peft_model

    from grpokit.planning.moments import Settings, layer_activations

    cfg, _ = load_model_config(E2B)
    text = {**cfg["text_config"], "num_hidden_layers": 4, "num_kv_shared_layers": 2, "vocab_size": 128,
            "vocab_size_per_layer_input": 128, "tie_word_embeddings": True,
            "layer_types": ["sliding_attention", "full_attention"] * 2}
    model = get_peft_model(build(text, "cpu").to(torch.bfloat16),
                           LoraConfig(r=16, target_modules="all-linear", task_type="CAUSAL_LM")).train()
    params = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved, where = {}, ["outside"]

    def pack(x):
        ptr = x.untyped_storage().data_ptr()
        if ptr not in params:
            saved.setdefault(ptr, (where[0], x.untyped_storage().nbytes()))
        return x

    for i, layer in enumerate(model.base_model.model.model.layers):
        layer.register_forward_pre_hook(lambda *_, i=i: where.__setitem__(0, i))
        layer.register_forward_hook(lambda *_: where.__setitem__(0, "outside"))
    S = 32
    ids = torch.randint(2, 128, (1, S))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    settings = Settings(dtype="bfloat16", lora={"r": 16, "target_modules": "all-linear"}, device="cpu")
    for i, kind in enumerate(gemma4.layer_kinds(text)):
        measured = sum(n for w, n in saved.values() if w == i)
        planned = S * layer_activations(text, settings, S, kind)[0]
        assert abs(planned / measured - 1) < 0.03, (kind, planned, measured)


def test_a_vllm_share_for_gemma4_is_refused_in_one_line():
    from grpokit.planning.vllm_share import share

    cfg, _ = load_model_config(E2B)
    with pytest.raises(NotModelled, match="vLLM's share for Gemma 4"):
        share(cfg, plan(cfg, lora={"r": 16}).settings, utilization=0.3, sleep=True, max_model_len=None, startup_resident=0)
