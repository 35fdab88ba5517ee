"""A decoder's architecture from its config.json, found offline: parameter counts and LoRA tensor sizes.

    >>> config, source = load_model_config("Qwen/Qwen2.5-0.5B-Instruct")
    >>> source.startswith("shipped config"), param_counts(config)["total"]
    (True, 494032768)

`grpokit.planning.memory` plans a step's GPU memory from these counts; the tests check them against the real
architecture built on the meta device.
"""

from __future__ import annotations

from pathlib import Path

from grpokit import files

CONFIG_DIR = Path(__file__).resolve().parent.parent / "assets" / "model_configs"
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SUPPORTED_TYPES = ("qwen2", "llama", "mistral", "qwen3")

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
    from grpokit import tiny

    if name_or_path == tiny.BUILTIN_PREFIX + tiny.TINY_NAME:
        return {"model_type": "llama", "vocab_size": len(tiny._vocab()), **tiny.TINY_CONFIG}, "built-in tiny model"
    from grpokit.gguf import BUILTINS

    builtin = BUILTINS.get(name_or_path.removeprefix(tiny.BUILTIN_PREFIX)) if name_or_path.startswith(tiny.BUILTIN_PREFIX) else None
    if builtin:  # the GGUF's own config, as shipped for the same model on the hub: no conversion to plan it
        name_or_path = builtin.hub_id
    shipped = CONFIG_DIR / name_or_path.replace("/", "__") / "config.json"
    if shipped.is_file():
        return files.read_json(shipped), f"shipped config ({shipped.relative_to(CONFIG_DIR.parent.parent)})"
    local = Path(name_or_path).expanduser() / "config.json"
    if local.is_file():
        return files.read_json(local, key="model.name_or_path"), f"local config ({local})"
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name_or_path, "config.json")
    except Exception:  # not a repo id (a path that does not exist, say): nothing cached under it
        cached = None
    if isinstance(cached, str) and Path(cached).is_file():
        return files.read_json(cached, key="model.name_or_path"), f"Hugging Face cache ({cached})"
    raise ConfigNotFound(
        f"the config.json of {name_or_path!r} is not reachable offline: it is not shipped (shipped: "
        f"{', '.join(shipped_models())}), not a local directory, not in the Hugging Face cache; "
        "fetch it once (`hf download <id> config.json`) to plan its memory"
    )

def dims(config: dict) -> dict:
    kind = config.get("model_type")
    if kind not in SUPPORTED_TYPES:
        raise ValueError(f"cannot plan architecture model_type={kind!r}; planned: {', '.join(SUPPORTED_TYPES)}")
    H, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or H // heads
    return dict(H=H, I=config["intermediate_size"], L=config["num_hidden_layers"], V=config["vocab_size"],
                q=heads * head_dim, kv=config.get("num_key_value_heads", heads) * head_dim, head_dim=head_dim,
                tied=bool(config.get("tie_word_embeddings", False)), kind=kind)

def linear_shapes(config: dict) -> dict[str, tuple[int, int, bool]]:
    """One decoder layer's linear layers: name -> (in_features, out_features, has_bias)."""
    d = dims(config)
    H, I, q, kv = d["H"], d["I"], d["q"], d["kv"]
    attn_bias = d["kind"] == "qwen2" or bool(config.get("attention_bias", False))  # Qwen2 hard-codes q/k/v bias
    o_bias = d["kind"] != "qwen2" and bool(config.get("attention_bias", False))
    mlp_bias = bool(config.get("mlp_bias", False))
    return {"q_proj": (H, q, attn_bias), "k_proj": (H, kv, attn_bias), "v_proj": (H, kv, attn_bias),
            "o_proj": (q, H, o_bias), "gate_proj": (H, I, mlp_bias), "up_proj": (H, I, mlp_bias),
            "down_proj": (I, H, mlp_bias)}

def param_counts(config: dict) -> dict[str, int]:
    """Parameter counts by part, as `AutoModelForCausalLM.from_config` builds them (tied weights once).

    >>> param_counts(load_model_config("Qwen/Qwen2.5-3B-Instruct")[0])["total"]
    3085938688
    """
    d = dims(config)
    shapes = linear_shapes(config)
    attn = sum(i * o + (o if b else 0) for n, (i, o, b) in shapes.items() if n in ALL_LINEAR[:4])
    mlp = sum(i * o + (o if b else 0) for n, (i, o, b) in shapes.items() if n in ALL_LINEAR[4:])
    norms = 2 * d["H"] + (2 * d["head_dim"] if d["kind"] == "qwen3" else 0)  # qwen3 adds q_norm, k_norm
    linear_weights = d["L"] * sum(i * o for i, o, _ in shapes.values())
    counts = {"embedding": d["V"] * d["H"], "attention_per_layer": attn, "mlp_per_layer": mlp,
              "norms_per_layer": norms, "layers": d["L"] * (attn + mlp + norms), "final_norm": d["H"],
              "lm_head": 0 if d["tied"] else d["V"] * d["H"], "linear_weights": linear_weights}
    counts["total"] = counts["embedding"] + counts["layers"] + counts["final_norm"] + counts["lm_head"]
    return counts

def lora_targets(config: dict, target_modules) -> dict[str, tuple[int, int]]:
    """Targeted module name -> (in, out); 'all-linear' is every decoder linear (PEFT leaves lm_head out)."""
    d = dims(config)
    known = {n: (i, o) for n, (i, o, _) in linear_shapes(config).items()}
    known |= {"lm_head": (d["H"], d["V"]), "embed_tokens": (d["V"], d["H"])}
    names = ALL_LINEAR if target_modules in ("all-linear", None) else (
        [target_modules] if isinstance(target_modules, str) else list(target_modules))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"lora.target_modules: {', '.join(map(repr, unknown))} is not a module of this "
                         f"architecture; planned: 'all-linear' or any of {', '.join(known)}")
    return {n: known[n] for n in names}

def lora_tensors(config: dict, r: int, target_modules="all-linear", use_dora: bool = False) -> list[int]:
    """Sizes of every trainable LoRA tensor (A: r x in, B: out x r, per layer; + DoRA magnitudes)."""
    L = dims(config)["L"]
    sizes = []
    for name, (i, o) in lora_targets(config, target_modules).items():
        per = [r * i, o * r] + ([o] if use_dora else [])
        sizes += per * (1 if name in ("lm_head", "embed_tokens") else L)
    return sizes

def lora_param_count(config: dict, r: int, target_modules="all-linear", use_dora: bool = False) -> int:
    """Trainable LoRA parameters, as PEFT's `get_nb_trainable_parameters` counts them."""
    return sum(lora_tensors(config, r, target_modules, use_dora))

