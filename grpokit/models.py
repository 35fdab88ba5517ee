"""Where a recipe's model comes from, and loading its tokenizer and weights.

`model_source` decides what `from_pretrained` gets (a built-in model, a local directory, or a hub id)
without loading anything; `load_tokenizer` / `load_model` load it in the recipe's dtype and quantization.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from grpokit.config import Recipe
from grpokit.config.trainer_args import resolved_dtype
from grpokit.errors import Problem, RecipeError

_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def model_source(recipe: Recipe) -> tuple[str | None, str | None]:
    """(what from_pretrained gets, a note when it cannot be checked offline). Raises on a missing local dir."""
    from grpokit import tiny

    name = recipe.model["name_or_path"]
    origin = str(recipe.path)
    if name.startswith(tiny.BUILTIN_PREFIX):
        try:
            return tiny.resolve(name), None
        except ValueError as err:
            raise RecipeError([Problem("model.name_or_path", str(err), name, file=origin)]) from None
    path = Path(name).expanduser()
    if path.is_absolute() or path.exists() or not _HUB_ID.match(name):
        if not path.is_dir():
            raise RecipeError([Problem("model.name_or_path", "model directory does not exist", name, file=origin)])
        if not (path / "config.json").is_file():
            raise RecipeError([Problem("model.name_or_path", "directory has no config.json: not a saved model", name, file=origin)])
        return str(path), None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json", revision=recipe.model.get("revision"))
    except Exception:  # noqa: BLE001 - an odd cache is the same as no cache
        cached = None
    if isinstance(cached, str):
        return name, None
    if os.environ.get("HF_HUB_OFFLINE") == "1":  # always so under --check, which never downloads
        return name, f"model {name!r} is not in the local cache: its tokenizer and prompt lengths are not checked (training downloads it)"
    return name, None


def load_tokenizer(path: str, recipe: Recipe, offline_only: bool = False):
    from transformers import AutoTokenizer

    kwargs = dict(trust_remote_code=recipe.model.get("trust_remote_code", False), revision=recipe.model.get("revision"))
    if offline_only:
        kwargs["local_files_only"] = True
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: str, recipe: Recipe):
    """The policy, in the recipe's dtype and quantization."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, resolved_dtype(recipe.model))
    kwargs: dict[str, Any] = dict(
        dtype=dtype,
        trust_remote_code=recipe.model.get("trust_remote_code", False),
        revision=recipe.model.get("revision"),
    )
    if recipe.model.get("attn_implementation"):
        kwargs["attn_implementation"] = recipe.model["attn_implementation"]
    quant = quantization_config(recipe.model.get("quantization", "none"), dtype)
    if quant is not None:
        kwargs["quantization_config"] = quant
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def quantization_config(quantization: str, dtype):
    """bitsandbytes settings for `model.quantization` (None for "none"): 4bit is NF4 with double quantization
    (what grpokit.planning.memory plans), computing in `dtype` (bfloat16 for a float32 base); 8bit is LLM.int8."""
    if quantization == "none":
        return None
    import torch
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=dtype if dtype != torch.float32 else torch.bfloat16)
