"""Gemma 4's layer kinds, counted from its config.json as transformers 5.25 builds them (`models/gemma4`).

    >>> from grpokit.planning.architecture import load_model_config
    >>> config = load_model_config("google/gemma-4-E2B-it")[0]
    >>> layer_kinds(config).count("sliding shared"), param_counts(config)["total"]
    (16, 5104297504)

What `AutoModelForCausalLM` builds for `model_type` gemma4 is `Gemma4ForConditionalGeneration`: the text decoder
and, where the config has them, the vision and audio towers with their projections into the decoder's width. A
text-only GRPO run never calls the towers: they hold their weights (and, under LoRA `all-linear`, adapters) and
nothing else. `gemma4_text` builds `Gemma4ForCausalLM`, the decoder alone.

The decoder's layers are of four kinds, by attention (`layer_types`: a sliding window of `sliding_window` tokens
with `head_dim`, or full attention with `global_head_dim`) and by whether the layer makes its own keys and values:
the last `num_kv_shared_layers` layers have no k/v projections or norms and read those of the last earlier layer
of their type (`kv_sharing_modes`); with `use_double_wide_mlp` their MLP is twice `intermediate_size`. Every layer
adds a per-layer input (PLE): a slice of one `vocab_size_per_layer_input` x (L x `hidden_size_per_layer_input`)
embedding, plus a projection of the token embedding, gated in by two small linears.

This module is a leaf: `architecture` and `moments` call it, it imports nothing of grpokit's.
"""

from __future__ import annotations

FAMILY = ("gemma4", "gemma4_text")
KINDS = ("sliding", "full", "sliding shared", "full shared")
# Gemma4TextConfig's defaults (transformers 5.25, configuration_gemma4.py) for keys a config.json may leave out
_TEXT_DEFAULTS = dict(vocab_size=262_144, hidden_size=2304, intermediate_size=9216, num_hidden_layers=30,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=256, global_head_dim=512,
                      sliding_window=512, final_logit_softcapping=None, vocab_size_per_layer_input=262_144,
                      hidden_size_per_layer_input=256, num_kv_shared_layers=0, use_double_wide_mlp=False,
                      attention_bias=False, attention_k_eq_v=False, enable_moe_block=False,
                      use_bidirectional_attention=None, tie_word_embeddings=True)
_VISION_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=16, num_attention_heads=12,
                        num_key_value_heads=12, head_dim=64, patch_size=16, position_embedding_size=10 * 1024)
_AUDIO_DEFAULTS = dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=8,
                       subsampling_conv_channels=[128, 32], conv_kernel_size=5, output_proj_dims=1536)


def text(config: dict) -> dict:
    """The decoder's keys with Gemma4TextConfig's defaults filled in (a gemma4 checkpoint nests them under
    `text_config`); the top level's tie_word_embeddings wins, as `Gemma4ForConditionalGeneration` ties by it."""
    inner = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    c = {**_TEXT_DEFAULTS, **{k: v for k, v in inner.items() if v is not None or k == "final_logit_softcapping"}}
    if inner is not config and "tie_word_embeddings" in config:
        c["tie_word_embeddings"] = config["tie_word_embeddings"]
    L = c["num_hidden_layers"]
    types = list(c.get("layer_types") or ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(L)])
    if types:
        types[-1] = "full_attention"  # Gemma4TextConfig forces the last layer to full attention
    c["layer_types"] = types
    return c


def refusal(config: dict) -> str | None:
    """What of this Gemma 4 config the plan cannot count (one phrase), or None."""
    c = text(config)
    if c["enable_moe_block"] or c.get("num_experts"):
        return "mixture-of-experts blocks (enable_moe_block)"
    if c["attention_k_eq_v"]:
        return "full-attention layers whose keys are their values (attention_k_eq_v)"
    if c["use_bidirectional_attention"] == "all":  # "vision" leaves text tokens causal: a text run is unchanged
        return "bidirectional attention over every token (use_bidirectional_attention: all)"
    unknown = sorted(set(c["layer_types"]) - {"sliding_attention", "full_attention"})
    if unknown:
        return f"layer kind(s) {', '.join(unknown)} (layer_types)"
    if len(c["layer_types"]) < c["num_hidden_layers"]:
        return f"a layer_types list of {len(c['layer_types'])} for {c['num_hidden_layers']} layers"
    shared = c["num_kv_shared_layers"]
    first = c["num_hidden_layers"] - shared
    if shared and (first <= 0 or set(c["layer_types"][first:]) - set(c["layer_types"][:first])):
        return "shared-KV layers of a type no earlier layer produces (num_kv_shared_layers)"
    return None


def layer_kinds(config: dict) -> list[str]:
    """Each decoder layer's kind, in order: 'sliding' or 'full', '+ shared' where it reuses another's keys and values."""
    c = text(config)
    L = c["num_hidden_layers"]
    first = L - c["num_kv_shared_layers"]
    return [("sliding" if t == "sliding_attention" else "full") + (" shared" if i >= first else "")
            for i, t in enumerate(c["layer_types"][:L])]


def kind_dims(config: dict, kind: str) -> dict:
    """One layer kind's widths: heads x head_dim for q and (non-shared) kv, its MLP width."""
    c = text(config)
    head_dim = c["global_head_dim"] if kind.startswith("full") else c["head_dim"]
    shared = kind.endswith("shared")
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    wide = 2 if shared and c["use_double_wide_mlp"] else 1
    return dict(head_dim=head_dim, heads=heads, kv_heads=kv_heads, q=heads * head_dim, kv=kv_heads * head_dim,
                shared=shared, I=wide * c["intermediate_size"])


def shapes(config: dict, kind: str) -> dict[str, tuple[int, int, bool]]:
    """One decoder layer of `kind`'s linear layers: name -> (in_features, out_features, has_bias)."""
    c = text(config)
    k, H, b = kind_dims(config, kind), c["hidden_size"], bool(c["attention_bias"])
    out = {"q_proj": (H, k["q"], b)}
    if not k["shared"]:  # a shared-KV layer builds no k/v projections (Gemma4TextAttention)
        out |= {"k_proj": (H, k["kv"], b), "v_proj": (H, k["kv"], b)}
    out |= {"o_proj": (k["q"], H, b), "gate_proj": (H, k["I"], False), "up_proj": (H, k["I"], False),
            "down_proj": (k["I"], H, False)}
    Hp = c["hidden_size_per_layer_input"]
    if Hp:
        out |= {"per_layer_input_gate": (H, Hp, False), "per_layer_projection": (Hp, H, False)}
    return out


def layer_groups(config: dict) -> list[tuple[str, int, dict[str, tuple[int, int, bool]]]]:
    """(kind, how many layers, one layer's linear shapes) for each kind the decoder has."""
    kinds = layer_kinds(config)
    return [(k, kinds.count(k), shapes(config, k)) for k in KINDS if k in kinds]


def _norms(config: dict, kind: str) -> int:
    """A layer's norm weights: four of H, the PLE norm's H, q_norm and (own keys) k_norm; v_norm has none."""
    c, k = text(config), kind_dims(config, kind)
    return (4 + bool(c["hidden_size_per_layer_input"])) * c["hidden_size"] + k["head_dim"] * (1 if k["shared"] else 2)


def global_linears(config: dict) -> list[tuple[str, int, int, int]]:
    """Linear layers outside the decoder's layers: (name, in, out, how many): the PLE projection of the token
    embedding, and the towers' (every nn.Linear, as PEFT's 'all-linear' finds them; the lm_head is left out)."""
    c = text(config)
    H, L, Hp = c["hidden_size"], c["num_hidden_layers"], c["hidden_size_per_layer_input"]
    out = [("per_layer_model_projection", H, L * Hp, 1)] if Hp else []
    v = _vision(config)
    if v:
        q, kv = v["num_attention_heads"] * v["head_dim"], v["num_key_value_heads"] * v["head_dim"]
        Hv, Iv, n = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
        out += [("vision patch input_proj", 3 * v["patch_size"] ** 2, Hv, 1), ("vision q_proj", Hv, q, n),
                ("vision k_proj", Hv, kv, n), ("vision v_proj", Hv, kv, n), ("vision o_proj", q, Hv, n),
                ("vision gate_proj", Hv, Iv, n), ("vision up_proj", Hv, Iv, n), ("vision down_proj", Iv, Hv, n),
                ("embed_vision", Hv, H, 1)]
    a = _audio(config)
    if a:
        Ha, n, (c0, c1), O = a["hidden_size"], a["num_hidden_layers"], a["subsampling_conv_channels"], a["output_proj_dims"]
        out += [("audio input_proj_linear", c0 // 4 * c1, Ha, 1), ("audio ffw_layer_1", Ha, 4 * Ha, 2 * n),
                ("audio ffw_layer_2", 4 * Ha, Ha, 2 * n), ("audio q/k/v/post", Ha, Ha, 4 * n),
                ("audio relative_k_proj", Ha, Ha, n), ("audio linear_start", Ha, 2 * Ha, n),
                ("audio linear_end", Ha, Ha, n), ("audio output_proj", Ha, O, 1), ("embed_audio", O, H, 1)]
    return out


def _vision(config: dict) -> dict | None:
    v = config.get("vision_config") if config.get("model_type") == "gemma4" else None
    return {**_VISION_DEFAULTS, **v} if isinstance(v, dict) else None


def _audio(config: dict) -> dict | None:
    a = config.get("audio_config") if config.get("model_type") == "gemma4" else None
    return {**_AUDIO_DEFAULTS, **a} if isinstance(a, dict) else None


def tower_params(config: dict) -> int:
    """Parameters of the vision and audio towers and their embedders (0 for gemma4_text): their linears, and what
    else holds parameters -- the patch position table, q/k norms, norms, the audio convolutions and biases."""
    total = sum(i * o * n for name, i, o, n in global_linears(config) if name != "per_layer_model_projection")
    v = _vision(config)
    if v:
        Hv, n = v["hidden_size"], v["num_hidden_layers"]
        total += 2 * v["position_embedding_size"] * Hv + n * (2 * v["head_dim"] + 4 * Hv)
    a = _audio(config)
    if a:
        Ha, n, (c0, c1), K = a["hidden_size"], a["num_hidden_layers"], a["subsampling_conv_channels"], a["conv_kernel_size"]
        # the two 3x3 sub-sampling convolutions (no bias) and their LayerNorms (no bias)
        total += 9 * c0 + c0 + 9 * c0 * c1 + c1
        # per layer: 2 FFNs' two norms, attention's per-dim scale, the light conv's depthwise kernel and two norms,
        # the layer's three norms; the output projection's bias
        total += n * (4 * Ha + Ha // a["num_attention_heads"] + K * Ha + 2 * Ha + 3 * Ha) + a["output_proj_dims"]
    return total


def param_counts(config: dict) -> dict[str, int]:
    """Parameter counts by part, as `AutoModelForCausalLM.from_config` builds them (tied weights once)."""
    c = text(config)
    H, V, L, Hp = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["hidden_size_per_layer_input"]
    layers = linear_weights = 0
    for kind, n, sh in layer_groups(config):
        linear = sum(i * o for i, o, _ in sh.values())
        layers += n * (linear + sum(o for _, o, b in sh.values() if b) + _norms(config, kind))
        linear_weights += n * linear
    ple = c["vocab_size_per_layer_input"] * L * Hp if Hp else 0
    ple_proj = H * L * Hp + Hp if Hp else 0  # the embedding's projection and its norm
    towers = tower_params(config)
    counts = {"embedding": V * H, "per_layer_embedding": ple, "layers": layers + ple_proj, "towers": towers,
              "final_norm": H, "lm_head": 0 if c["tie_word_embeddings"] else V * H,
              "linear_weights": linear_weights + sum(i * o * n for _, i, o, n in global_linears(config))}
    counts["total"] = sum(counts[k] for k in ("embedding", "per_layer_embedding", "layers", "towers", "final_norm", "lm_head"))
    return counts


def lora_tensors(config: dict, r: int, use_dora: bool = False) -> list[int]:
    """Every LoRA tensor PEFT's 'all-linear' makes on this model: the decoder's linears, the PLE projection and
    the towers' linears (a text-only run leaves the towers' adapters without gradients: planned as if they had)."""
    sizes = []
    for _, n, sh in layer_groups(config):
        for i, o, _ in sh.values():
            sizes += [r * i, o * r, *([o] if use_dora else [])] * n
    for _, i, o, n in global_linears(config):
        sizes += [r * i, o * r, *([o] if use_dora else [])] * n
    return sizes


def largest_linear(config: dict) -> int:
    """Values of the largest linear weight (a double-wide MLP's, or the PLE projection's)."""
    return max(i * o for _, _, sh in layer_groups(config) for i, o, _ in sh.values())


# --------------------------------------------------------------------------------------------------
# Memory: what the decoder's layer kinds hold, per token (bytes), for `grpokit.planning.moments`


def layer_activations(config: dict, kind: str, a: int, S: int, full_finetune: bool) -> tuple[int, str]:
    """Bytes one layer of `kind` saves for backward per token (no checkpointing), on transformers' SDPA path;
    LoRA's own tensors (the adapters' fp32 inputs) are added by `moments.layer_activations`.

    Each of the five Gemma4RMSNorms of H keeps its fp32 input and 1/rms (4H + 4), q_norm its fp32 input (4q);
    a layer that makes its own keys and values keeps k_norm's and the scale-less v_norm's fp32 inputs and k and v
    (2 x (4 + a) kv: GQA reaches SDPA unexpanded; a shared-KV layer reads the producer's). Attention keeps q and
    its output (2 a q) and the log-sum-exp; the MLP gate, up and gelu(gate) (3 a I, I doubled in a double-wide
    layer); the PLE gate's output and its gelu (2 a Hp). A frozen linear keeps no input (its weight is all its
    backward needs), so no norm output is kept under LoRA; a full fine-tune keeps every linear's input (3 a H, a q,
    a I, a Hp) and each scaled norm's fp32 output for its weight's gradient. Checked against autograd's saved
    tensors of each kind at E2B's widths (tests/planning/test_gemma4.py)."""
    c, k = text(config), kind_dims(config, kind)
    H, Hp = c["hidden_size"], c["hidden_size_per_layer_input"] or 0
    norms = 4 + bool(Hp)
    A = norms * (4 * H + 4) + 4 * k["q"] + 4 * k["heads"] + 2 * a * k["q"] + 4 * k["heads"] + 3 * a * k["I"] + 2 * a * Hp
    how = f"{norms} norms (4H+4) + q_norm 4q + 2x{a}q + 3x{a}I ({k['I']}) + 2x{a}Hp"
    own = 0 if k["shared"] else 2 * (4 + a) * k["kv"] + 8 * k["kv_heads"]
    if own:
        how += f" + k, v and their norms' fp32 inputs 2x(4+{a})kv"
    A += own
    if full_finetune:
        A += a * (3 * H + k["q"] + k["I"] + Hp) + 4 * (norms * H + k["q"] + (0 if k["shared"] else k["kv"]))
        how += " + every linear's input and the scaled norms' fp32 outputs"
    return int(A), how


def ple_activations(config: dict, a: int) -> tuple[int, str]:
    """Per token, what the per-layer inputs hold for the whole forward and backward: the combined per-layer
    inputs (a x L x Hp, each layer reads its slice) and the projection norm's fp32 input and 1/rms."""
    c = text(config)
    width = c["num_hidden_layers"] * (c["hidden_size_per_layer_input"] or 0)
    if not width:
        return 0, ""
    return (a + 4) * width + 4 * c["num_hidden_layers"], f"per-layer inputs T x L x Hp x ({a} + 4 fp32) B"


def masks(config: dict) -> int:
    """Attention masks made per forward: one for full attention, one for sliding windows when any layer slides."""
    return 1 + any(t == "sliding_attention" for t in text(config)["layer_types"])


def kv_cache(config: dict, G: int, P: int, S: int, a: int) -> tuple[int, int, str]:
    """(bytes at the prefill, bytes at the last decode step, how) of the generation cache (transformers'
    DynamicCache by `get_layer_types_and_kwargs`): a layer that reuses another's keys and values gets a cache
    layer that stores nothing; a full-attention layer keeps every position; a sliding one
    (DynamicSlidingWindowLayer) keeps the last window - 1 positions as a view of the torch.cat it made, so the
    whole prompt at the prefill and `sliding_window` positions (the cat of window - 1 and the new one) after."""
    c = text(config)
    W = c["sliding_window"]
    prefill = last = 0
    parts = []
    for kind, n, _ in layer_groups(config):
        if kind.endswith("shared"):
            continue
        per = 2 * kind_dims(config, kind)["kv"] * a
        prefill += n * G * P * per
        last += n * G * (min(S - 1, W) if kind == "sliding" else S - 1) * per
        parts.append(f"{n} {kind} x (k, v) x {kind_dims(config, kind)['kv']} x {a} B"
                     + (f" over min(positions, {W})" if kind == "sliding" else ""))
    shared = sum(n for k, n, _ in layer_groups(config) if k.endswith("shared"))
    return prefill, last, "G x positions x (" + " + ".join(parts) + f"); {shared} shared-KV layers hold none"


def prefill_workspace(config: dict, G: int, P: int, a: int) -> tuple[int, str]:
    """The prefill's no-grad transient beyond the cache: the larger layer's activations over the prompt (the
    shared-KV layers run on the last position only: `_maybe_slice_kv_shared_inputs`, generate's logits_to_keep=1),
    the per-layer inputs (embedding lookup, projection, fp32 norm) and both float masks."""
    c = text(config)
    H, width = c["hidden_size"], c["num_hidden_layers"] * (c["hidden_size_per_layer_input"] or 0)
    own = [kind_dims(config, k) for k, _, _ in layer_groups(config) if not k.endswith("shared")]
    layer = max(a * (2 * H + 2 * k["q"] + 2 * k["kv"] + 3 * k["I"]) + 4 * (H + k["q"]) for k in own)
    ple = width * (3 * a + 2 * 4)
    total = G * P * (layer + ple) + masks(config) * G * P * P * a
    return int(total), f"one layer's no-grad activations + per-layer inputs ({width} wide) over G x P + {masks(config)} float masks"


def softcap_temporaries(device: str) -> dict[str, int]:
    """Extra fp32 tiles TRL's fused head holds for `final_logit_softcapping` (the torch fold's tanh on CPU:
    z / cap and tanh(z / cap) beside the tile; the Triton kernels fold it in registers)."""
    return {"forward": 1, "backward": 1} if device == "cpu" else {"forward": 0, "backward": 0}
