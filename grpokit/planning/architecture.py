"""A decoder's architecture from its config.json, found offline: its layer kinds, parameter counts, LoRA tensor sizes.

    >>> config, source = load_model_config("Qwen/Qwen2.5-0.5B-Instruct")
    >>> source.startswith("shipped config"), param_counts(config)["total"]
    (True, 494032768)

`grpokit.planning.memory` plans a step's GPU memory from these counts; the tests check them against the real
architecture built on the meta device. A family (FAMILIES) may mix layer kinds: Qwen3.5 interleaves Gated DeltaNet
layers (`linear_attention`: in_proj_qkv / z / b / a, a depthwise conv, out_proj) with gated full attention; Gemma 4's
four kinds (sliding or full, own or shared keys and values) and its towers are counted in `grpokit.planning.gemma4`.
A family or a config whose layers the plan cannot count raises `NotModelled`, one line naming what and why.
"""

from __future__ import annotations

from pathlib import Path

from grpokit import files
from grpokit.planning import gemma4

CONFIG_DIR = Path(__file__).resolve().parent.parent / "assets" / "model_configs"
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# model_type -> the layer kinds the plan counts for it
FAMILIES = {
    "qwen2": "dense attention (q/k/v biases)",
    "llama": "dense attention",
    "mistral": "dense attention",
    "qwen3": "dense attention with q/k norms",
    "smollm3": "dense attention; every 4th layer without rotary positions (no memory of its own)",
    "qwen3_5": "Gated DeltaNet linear-attention layers (a fixed conv + recurrent state, no KV cache) between gated "
               "full-attention layers",
    "gemma4": "sliding-window and full-attention layers with their own head sizes, shared-KV layers (no cache, no k/v "
              "projections), double-wide MLPs, per-layer input embeddings, soft-capped logits, and the vision and "
              "audio towers' weights (a text-only run never calls them); gemma4_text is the decoder alone",
}
SUPPORTED_TYPES = tuple(FAMILIES)
HYBRID = ("qwen3_5",)  # layers of more than one kind
# families a user may name that the plan knows it cannot count, and what it cannot count
_NOT_MODELLED = {
    "gemma3n": "per-layer input embeddings, shared-KV layers, AltUp and the audio/vision towers",
    **dict.fromkeys(("gemma2", "gemma3", "gemma3_text"), "sliding-window layers and soft-capped logits"),
    **dict.fromkeys(("qwen3_moe", "qwen3_5_moe", "qwen3_next", "mixtral", "qwen2_moe", "llama4", "gpt_oss"),
                    "mixture-of-experts layers"),
}


class NotModelled(ValueError):
    """A model_type or a config the plan cannot count: the message names it, what is not modelled, and the families
    that are. A ValueError, so `--check` reports it as the plan being unavailable and checks the rest."""

    def __init__(self, kind, what: str):
        super().__init__(f"cannot plan model_type={kind!r}: {what} not modelled; planned families: "
                         f"{', '.join(SUPPORTED_TYPES)}")

class ConfigNotFound(LookupError):
    """No config.json for a model is reachable offline; the message says where we looked."""

def shipped_models() -> list[str]:
    """Model ids whose config.json ships with grpokit, e.g. 'Qwen/Qwen2.5-3B-Instruct'."""
    return sorted(p.parent.name.replace("__", "/") for p in CONFIG_DIR.glob("*/config.json"))

def load_model_config(name_or_path: str) -> tuple[dict, str]:
    """The model's config.json as a dict, and where it came from; never touches the network.

    Looks in order at: the built-in tiny model, the configs shipped in grpokit/assets/model_configs, a
    local directory, the Hugging Face cache. Raises `ConfigNotFound` saying so when none has it.
    """
    own = _own_config(name_or_path)
    if own is not None:
        return own
    outside = _outside_config(name_or_path)
    if outside is not None:
        return files.read_json(outside[0], key="model.name_or_path"), outside[1]
    raise ConfigNotFound(
        f"the config.json of {name_or_path!r} is not reachable offline: it is not shipped (shipped: "
        f"{', '.join(shipped_models())}), not a local directory, not in the Hugging Face cache; "
        "fetch it once (`hf download <id> config.json`) to plan its memory"
    )


def outside_config_file(name_or_path: str) -> Path | None:
    """The config.json `load_model_config` reads for this model when it comes from outside grpokit (a local folder's,
    the Hugging Face cache's); None for grpokit's own (the built-in models, the shipped configs) or none offline."""
    if _own_config(name_or_path) is not None:
        return None
    outside = _outside_config(name_or_path)
    return outside[0] if outside is not None else None


def _own_config(name_or_path: str) -> tuple[dict, str] | None:
    """(config, source) of a model grpokit ships or builds itself, else None."""
    from grpokit.checkpoints import tiny

    if name_or_path == tiny.BUILTIN_PREFIX + tiny.TINY_NAME:
        return {"model_type": "llama", "vocab_size": len(tiny._vocab()), **tiny.TINY_CONFIG}, "built-in tiny model"
    from grpokit.checkpoints.gguf import BUILTINS

    builtin = BUILTINS.get(name_or_path.removeprefix(tiny.BUILTIN_PREFIX)) if name_or_path.startswith(tiny.BUILTIN_PREFIX) else None
    if builtin:  # the GGUF's own config, as shipped for the same model on the hub: no conversion to plan it
        name_or_path = builtin.hub_id
    shipped = CONFIG_DIR / name_or_path.replace("/", "__") / "config.json"
    if shipped.is_file():
        return files.read_json(shipped), f"shipped config ({shipped.relative_to(CONFIG_DIR.parent.parent)})"
    return None


def _outside_config(name_or_path: str) -> tuple[Path, str] | None:
    """(the config.json's path, source) of a local folder's model or a cached hub model, else None."""
    local = Path(name_or_path).expanduser() / "config.json"
    if local.is_file():
        return local, f"local config ({local})"
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name_or_path, "config.json")
    except Exception:  # not a repo id (a path that does not exist, say): nothing cached under it
        cached = None
    if isinstance(cached, str) and Path(cached).is_file():
        return Path(cached), f"Hugging Face cache ({cached})"
    return None


def text_config(config: dict) -> dict:
    """The decoder's keys: a multimodal checkpoint (Qwen3.5) nests them under `text_config`; the top level's
    model_type (what the checkpoint is) and tie_word_embeddings (what AutoModelForCausalLM ties) win."""
    inner = config.get("text_config")
    if not isinstance(inner, dict):
        return config
    return {**inner, "model_type": config.get("model_type"),
            "tie_word_embeddings": config.get("tie_word_embeddings", inner.get("tie_word_embeddings", False))}


def family(config: dict) -> str:
    """The planned family of a config (a text-only Qwen3.5 checkpoint is Qwen3.5); `NotModelled` otherwise."""
    kind = config.get("model_type")
    kind = {"qwen3_5_text": "qwen3_5", "gemma4_text": "gemma4"}.get(kind, kind)
    if kind == "gemma4" and gemma4.refusal(config):
        raise NotModelled(config.get("model_type"), gemma4.refusal(config) + " is")
    if kind in _NOT_MODELLED:
        raise NotModelled(kind, _NOT_MODELLED[kind])
    if kind not in FAMILIES:
        raise NotModelled(kind, "its layers are")
    if config.get("num_experts") or config.get("num_local_experts"):
        raise NotModelled(kind, "mixture-of-experts layers (num_experts)")
    return kind


def layer_kinds(config: dict) -> list[str]:
    """Each decoder layer's token mixer, in order: 'full' (attention with a KV cache) or 'linear' (Gated DeltaNet).

    Qwen3.5 reads `layer_types` (or, as its config class does, every `full_attention_interval`-th layer full);
    SmolLM3's layers without rotary positions are 'full' too: they hold the same tensors. A kind the plan does not
    count (a sliding window, say) raises `NotModelled`.
    """
    c = text_config(config)
    kind, L = family(c), c["num_hidden_layers"]
    if kind == "gemma4":
        return gemma4.layer_kinds(config)
    types = c.get("layer_types")
    if kind == "qwen3_5" and types is None:
        every = c.get("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(L)]
    allowed = {"full_attention", "linear_attention"} if kind == "qwen3_5" else {"full_attention"}
    unknown = sorted(set(types or []) - allowed)
    if unknown:
        raise NotModelled(kind, f"layer kind(s) {', '.join(unknown)} (layer_types) are")
    if kind in ("qwen2", "qwen3", "smollm3") and c.get("use_sliding_window") and c.get("sliding_window"):
        raise NotModelled(kind, "sliding-window layers (use_sliding_window) are")
    if types is not None and len(types) < L:
        raise ValueError(f"config: layer_types names {len(types)} layers, num_hidden_layers is {L}")
    return ["linear" if t == "linear_attention" else "full" for t in (types or ["full_attention"] * L)[:L]]


def dims(config: dict) -> dict:
    """The widths the plan reads: H, I, L, V, q and kv (heads x head_dim), the layer counts by kind (n_full,
    n_linear) and, for Gated DeltaNet layers, their key / value widths (lk, lv), heads (lh), conv width and kernel."""
    c = text_config(config)
    kind, kinds = family(c), layer_kinds(config)
    if kind == "gemma4":
        return _gemma4_dims(config, kinds)
    H, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or H // heads
    d = dict(H=H, I=c["intermediate_size"], L=len(kinds), V=c["vocab_size"], q=heads * head_dim,
             kv=c.get("num_key_value_heads", heads) * head_dim, head_dim=head_dim,
             tied=bool(c.get("tie_word_embeddings", False)), kind=kind,
             n_full=kinds.count("full"), n_linear=kinds.count("linear"), gated=kind == "qwen3_5")
    if d["n_linear"]:
        dk, dv = c.get("linear_key_head_dim", 128), c.get("linear_value_head_dim", 128)
        kh, vh = c.get("linear_num_key_heads", 16), c.get("linear_num_value_heads", 32)
        d.update(lk=kh * dk, lv=vh * dv, lh=vh, lkh=kh, dk=dk, dv=dv, conv_kernel=c.get("linear_conv_kernel_dim", 4))
        d["conv"] = 2 * d["lk"] + d["lv"]
    return d


def _gemma4_dims(config: dict, kinds: list[str]) -> dict:
    """`dims` of a Gemma 4 decoder: each width the largest of its layer kinds' (gemma4.kind_dims has each kind's);
    n_full counts the layers that keep a KV cache of their own."""
    c, per = gemma4.text(config), [gemma4.kind_dims(config, k) for k in dict.fromkeys(kinds)]
    return dict(H=c["hidden_size"], I=max(k["I"] for k in per), L=len(kinds), V=c["vocab_size"],
                q=max(k["q"] for k in per), kv=max(k["kv"] for k in per), head_dim=max(k["head_dim"] for k in per),
                tied=bool(c["tie_word_embeddings"]), kind="gemma4", n_full=sum(not k.endswith("shared") for k in kinds),
                n_linear=0, gated=False)


def _shapes(config: dict, d: dict, kind: str) -> dict[str, tuple[int, int, bool]]:
    """One decoder layer of `kind`'s linear layers: name -> (in_features, out_features, has_bias)."""
    c = text_config(config)
    H, I, q, kv = d["H"], d["I"], d["q"], d["kv"]
    mlp_bias = bool(c.get("mlp_bias", False))
    mlp = {"gate_proj": (H, I, mlp_bias), "up_proj": (H, I, mlp_bias), "down_proj": (I, H, mlp_bias)}
    if kind == "linear":
        return {"in_proj_qkv": (H, d["conv"], False), "in_proj_z": (H, d["lv"], False),
                "in_proj_b": (H, d["lh"], False), "in_proj_a": (H, d["lh"], False),
                "out_proj": (d["lv"], H, False), **mlp}
    attn_bias = d["kind"] == "qwen2" or bool(c.get("attention_bias", False))  # Qwen2 hard-codes q/k/v bias
    o_bias = d["kind"] != "qwen2" and bool(c.get("attention_bias", False))
    q_out = 2 * q if d["gated"] else q  # Qwen3.5's q_proj also makes the output gate
    return {"q_proj": (H, q_out, attn_bias), "k_proj": (H, kv, attn_bias), "v_proj": (H, kv, attn_bias),
            "o_proj": (q, H, o_bias), **mlp}


def layer_groups(config: dict) -> list[tuple[str, int, dict[str, tuple[int, int, bool]]]]:
    """(kind, how many layers, one layer's linear shapes) for each kind of decoder layer the model has."""
    d = dims(config)
    if d["kind"] == "gemma4":
        return gemma4.layer_groups(config)
    return [(kind, n, _shapes(config, d, kind)) for kind, n in (("full", d["n_full"]), ("linear", d["n_linear"])) if n]


def linear_shapes(config: dict) -> dict[str, tuple[int, int, bool]]:
    """Every linear layer name of the decoder and its shape (a name in several kinds of layer has one shape)."""
    return {name: shape for _, _, shapes in layer_groups(config) for name, shape in shapes.items()}


def largest_linear(config: dict) -> int:
    """Values of the largest linear weight of a decoder layer."""
    if dims(config)["kind"] == "gemma4":
        return gemma4.largest_linear(config)
    return max(i * o for i, o, _ in linear_shapes(config).values())


def param_counts(config: dict) -> dict[str, int]:
    """Parameter counts by part, as `AutoModelForCausalLM.from_config` builds them (tied weights once).

    >>> param_counts(load_model_config("Qwen/Qwen2.5-3B-Instruct")[0])["total"]
    3085938688
    """
    d = dims(config)
    if d["kind"] == "gemma4":
        return gemma4.param_counts(config)
    layers = linear_weights = 0
    for kind, n, shapes in layer_groups(config):
        linears = sum(i * o + (o if b else 0) for i, o, b in shapes.values())
        norms = 2 * d["H"]
        if kind == "linear":  # the depthwise conv (no bias), dt_bias and A_log per value head, the gated norm
            norms += d["conv"] * d["conv_kernel"] + 2 * d["lh"] + d["dv"]
        elif d["kind"] in ("qwen3", "qwen3_5"):  # q_norm, k_norm
            norms += 2 * d["head_dim"]
        layers += n * (linears + norms)
        linear_weights += n * sum(i * o for i, o, _ in shapes.values())
    counts = {"embedding": d["V"] * d["H"], "layers": layers, "final_norm": d["H"],
              "lm_head": 0 if d["tied"] else d["V"] * d["H"], "linear_weights": linear_weights}
    counts["total"] = counts["embedding"] + counts["layers"] + counts["final_norm"] + counts["lm_head"]
    return counts


def lora_targets(config: dict, target_modules) -> dict[str, tuple[int, int]]:
    """Targeted module name -> (in, out); 'all-linear' is every decoder linear (PEFT leaves lm_head out)."""
    d = dims(config)
    if d["kind"] == "gemma4" and target_modules not in ("all-linear", None):
        raise ValueError(f"lora.target_modules: {target_modules!r} is not planned for Gemma 4; use 'all-linear' (a "
                         "module name such as 'q_proj' also names the towers' clipped linears, which PEFT cannot adapt)")
    known = {n: (i, o) for n, (i, o, _) in linear_shapes(config).items()}
    every = list(known)
    known |= {"lm_head": (d["H"], d["V"]), "embed_tokens": (d["V"], d["H"])}
    names = every if target_modules in ("all-linear", None) else (
        [target_modules] if isinstance(target_modules, str) else list(target_modules))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"lora.target_modules: {', '.join(map(repr, unknown))} is not a module of this "
                         f"architecture; planned: 'all-linear' or any of {', '.join(known)}")
    return {n: known[n] for n in names}


def lora_tensors(config: dict, r: int, target_modules="all-linear", use_dora: bool = False) -> list[int]:
    """Sizes of every trainable LoRA tensor (A: r x in, B: out x r, per layer that has the module; + DoRA magnitudes)."""
    targets = lora_targets(config, target_modules)
    if dims(config)["kind"] == "gemma4":
        return gemma4.lora_tensors(config, r, use_dora)
    sizes = []
    for name, (i, o) in targets.items():
        per = [r * i, o * r] + ([o] if use_dora else [])
        if name in ("lm_head", "embed_tokens"):
            sizes += per
            continue
        sizes += per * sum(n for _, n, shapes in layer_groups(config) if name in shapes)
    return sizes


def lora_param_count(config: dict, r: int, target_modules="all-linear", use_dora: bool = False) -> int:
    """Trainable LoRA parameters, as PEFT's `get_nb_trainable_parameters` counts them."""
    return sum(lora_tensors(config, r, target_modules, use_dora))
