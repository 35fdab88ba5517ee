"""Where a recipe's model comes from, and loading its tokenizer and weights.

`model_source` decides what `from_pretrained` gets (a built-in model, a local directory, or a hub id)
without loading any weights (a GGUF checkpoint is converted once, by grpokit.checkpoints.gguf, into a cached directory); `load_tokenizer` / `load_model` load it in the recipe's dtype and quantization.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from grpokit import trl_compat
from grpokit.config import Recipe
from grpokit.config.trainer_args import resolved_dtype
from grpokit.dist import say
from grpokit.errors import Problem, RecipeError
from grpokit.checkpoints.gguf import is_gguf_file
from grpokit.checkpoints.rundir import missing_weights

_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
# Why this process reads the hub's cache only (set by grpokit.cli, read by `not_cached`); an environment variable
# so the processes of a distributed launch inherit it with HF_HUB_OFFLINE.
OFFLINE_REASON = "GRPOKIT_OFFLINE_REASON"


def is_hub_id(name: str) -> bool:
    """A model name that means the Hugging Face hub: `owner/name` (or `name`) that is not a local path.

    >>> is_hub_id("Qwen/Qwen2.5-0.5B"), is_hub_id("."), is_hub_id("/abs/model")
    (True, False, False)
    """
    path = Path(name).expanduser()
    return bool(_HUB_ID.match(name)) and not path.is_absolute() and not path.exists()


def model_source(recipe: Recipe, convert: bool = True) -> tuple[str | None, str | None]:
    """(what from_pretrained gets, a note when it cannot be checked offline). Raises on a missing local dir.

    A GGUF not converted yet is converted here (a minute, a float32 copy on disk); with `convert=False`
    (`--check`) its validated .gguf path comes back instead, which `load_tokenizer` and
    `data.context_length` read without dequantizing a weight.
    """
    from grpokit.checkpoints import tiny

    name = recipe.model["name_or_path"]
    recipe_path = str(recipe.path)
    if recipe.model.get("gguf_file"):
        return _gguf_source(recipe, convert), None
    if name.startswith(tiny.BUILTIN_PREFIX):
        from grpokit.checkpoints import gguf

        builtin = name[len(tiny.BUILTIN_PREFIX):]
        try:
            if builtin in gguf.BUILTINS:
                return _gguf_path(gguf.builtin_gguf(builtin), convert), None
            return tiny.resolve(name), None
        except ValueError as err:  # GGUFError too: a missing package says how to install it
            known = ", ".join(tiny.BUILTIN_PREFIX + n for n in [*tiny.builtin_names(), *gguf.BUILTINS])
            raise RecipeError([Problem("model.name_or_path", str(err), name, known, file=recipe_path)]) from None
    path = Path(name).expanduser()
    if not is_hub_id(name):
        if not path.is_dir():
            raise RecipeError([Problem("model.name_or_path", "model directory does not exist", name, file=recipe_path)])
        if not (path / "config.json").is_file():
            raise RecipeError([Problem("model.name_or_path", "directory has no config.json: not a saved model", name, file=recipe_path)])
        missing = missing_weights(path)
        if missing:
            raise RecipeError([Problem("model.name_or_path", f"directory holds config.json but {missing}", name,
                                       "a saved model: config.json and its weights (model.safetensors, or the shards "
                                       "its index names; or pytorch_model.bin)", file=recipe_path)])
        return str(path), None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json", revision=recipe.model.get("revision"))
    except Exception:  # noqa: BLE001 - an odd cache is the same as no cache
        cached = None
    if isinstance(cached, str):
        return name, None
    if os.environ.get("HF_HUB_OFFLINE") == "1":  # always so under --check, and when the hub cannot be reached
        return name, not_cached("model", name)
    return name, None


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(timeout: float = 5.0) -> bool:
    """Whether the hub answers one HTTP request within `timeout` seconds (proxy variables honoured, no retries)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(hub_endpoint(), method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return True  # an HTTP error is an answer
    except (OSError, ValueError):
        return False
    return True


def hub_names(data: dict) -> list[str]:
    """The hub ids a loaded (not yet validated) recipe would fetch: its model and dataset when they are not local.

    >>> hub_names({"model": {"name_or_path": "Qwen/Qwen2.5-0.5B"}, "dataset": {"name": "openai/gsm8k"}})
    ['Qwen/Qwen2.5-0.5B', 'openai/gsm8k']
    """
    from grpokit.checkpoints import tiny

    model, dataset = data.get("model") or {}, data.get("dataset") or {}
    names = []
    name = model.get("name_or_path")
    if isinstance(name, str) and not name.startswith(tiny.BUILTIN_PREFIX) and not model.get("gguf_file") and is_hub_id(name):
        names.append(name)
    if isinstance(dataset.get("name"), str) and not dataset.get("path"):
        names.append(dataset["name"])
    return names


def offline_unless_hub_reachable(data: dict) -> None:
    """Before a run imports the Hugging Face libraries: when the recipe needs the hub and it does not answer, run
    offline, as with HF_HUB_OFFLINE=1 -- what is cached loads, what is not fails at once with the command that
    downloads it. Without this a machine with no network spent ~80 s in huggingface_hub's retries (18 warning
    lines) before an error. The libraries read HF_HUB_OFFLINE when imported, hence "before"."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not hub_names(data) or hub_reachable():
        return
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ[OFFLINE_REASON] = f"the hub ({hub_endpoint()}) cannot be reached from here"


def not_cached(kind: str, repo_id: str) -> str:
    """What to do about a hub model or dataset this offline process cannot find in the cache, in one sentence.

    >>> print(not_cached("dataset", "openai/gsm8k"))  # doctest: +ELLIPSIS
    dataset 'openai/gsm8k' is not in the local cache: fetch it once where the hub is reachable with `hf download openai/gsm8k --repo-type dataset` (...
    """
    reason = os.environ.get(OFFLINE_REASON) or "HF_HUB_OFFLINE=1 is set"
    flag = " --repo-type dataset" if kind == "dataset" else ""
    return (f"{kind} {repo_id!r} is not in the local cache: fetch it once where the hub is reachable with "
            f"`hf download {repo_id}{flag}` ({reason}, so nothing is downloaded; runs then read the cache, and with "
            "HF_HUB_OFFLINE=1 never wait on the network)")


def describe_error(err: BaseException) -> str:
    """An exception as one line, whole: a message cut at a fixed length once ended mid-URL."""
    return f"{type(err).__name__}: " + " ".join(str(err).split())


def _gguf_path(file: Path, convert: bool) -> str:
    """The cached conversion of a GGUF (made now when `convert`), else the validated file itself."""
    from grpokit.checkpoints import gguf

    if convert:
        return str(gguf.ensure_converted(file, log=say))
    gguf.check(file)
    return str(gguf.converted(file) or file)


def _gguf_source(recipe: Recipe, convert: bool = True) -> str:
    """`model.gguf_file` inside the `name_or_path` directory (as in transformers' `from_pretrained(dir,
    gguf_file=...)`), validated and converted once to a cached HF directory; its path."""
    from grpokit.checkpoints import gguf

    folder, recipe_path = Path(recipe.model["name_or_path"]).expanduser(), str(recipe.path)
    file = folder / recipe.model["gguf_file"]
    if not folder.is_dir():
        raise RecipeError([Problem("model.name_or_path", "with model.gguf_file, must be the local directory holding the "
                                   ".gguf file (a hub GGUF: download it first, `hf download <repo> <file> --local-dir DIR`)",
                                   recipe.model["name_or_path"], file=recipe_path)])
    try:
        return _gguf_path(file, convert)
    except gguf.GGUFError as err:
        raise RecipeError([Problem("model.gguf_file", str(err), str(file), file=recipe_path)]) from None


def load_tokenizer(path: str, recipe: Recipe, offline_only: bool = False):
    from transformers import AutoTokenizer

    kwargs = dict(trust_remote_code=recipe.model.get("trust_remote_code", False), revision=recipe.model.get("revision"))
    if offline_only:
        kwargs["local_files_only"] = True
    if is_gguf_file(path):  # the tokenizer and chat template from the GGUF's metadata; no tensor is read
        kwargs["gguf_file"], path = Path(path).name, str(Path(path).parent)
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    if recipe.model.get("chat_template"):  # one of TRL's by name, checked at validation (tooluse.template_names)
        from grpokit.tools.tooluse import template_text

        tokenizer.chat_template = template_text(recipe.model["chat_template"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: str, recipe: Recipe):
    """The policy, in the recipe's dtype and quantization."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, resolved_dtype(recipe.model, lora=recipe.lora is not None))
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
    _no_loading_weights_bar()
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if recipe.model.get("quantization") == "4bit":
        trl_compat.keep_4bit_trainable(model)  # on a CPU, generation would leave its layers without a backward
    return model


def _no_loading_weights_bar() -> None:
    """Drop transformers 5's "Loading weights" bar (a blink for small models; grpokit already says "building model"),
    keeping every other bar: huggingface_hub draws its download bars itself, and those are real progress.
    `set_tqdm_hook` is transformers' own hook for its bars; where it is missing the bar simply stays."""
    from transformers.utils import logging as hf_logging

    def hook(factory, args, kwargs):
        if kwargs.get("desc") == "Loading weights":
            kwargs = {**kwargs, "disable": True}
        return factory(*args, **kwargs)

    if hasattr(hf_logging, "set_tqdm_hook"):
        hf_logging.set_tqdm_hook(hook)


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
