"""The run's `trl.GRPOConfig`, built from a validated recipe (the trainer section plus what the model implies).

Imports torch and TRL when called, never at import: validating a recipe builds one config to let TRL's own
checks run, `--help` builds none.
"""

from __future__ import annotations

import os

from grpokit.cpu import cpu_dtype
from grpokit.dist import num_processes_from_env


def grpo_args(recipe, num_processes: int | None = None):
    """The run's `GRPOConfig` for a validated `Recipe`: the trainer section plus what the model section implies for TRL."""
    kwargs = dict(recipe.trainer)
    init = {k: recipe.model[k] for k in ("revision",) if recipe.model.get(k)}
    if init:
        kwargs["model_init_kwargs"] = init
    kwargs["trust_remote_code"] = recipe.model.get("trust_remote_code", False)
    kwargs.setdefault("project", recipe.name)  # Trackio's project (transformers' default is "huggingface")
    if recipe.lora is not None:
        # transformers asks DDP to search for unused parameters in any model that is not its own (a PEFT model
        # is not): a graph traversal per step and a warning per rank, though every adapter weight is used
        kwargs.setdefault("ddp_find_unused_parameters", False)
    return build_grpo_config(kwargs, recipe.model, recipe.rewards, num_processes=num_processes)


def build_grpo_config(trainer: dict, model: dict, rewards: list[dict], num_processes: int | None = None):
    """The real `GRPOConfig` for a validated trainer section (no weights involved).

    `num_processes` (for `--check`): the config as each of that many processes will see it, built in this
    one process: TRL derives and checks the generation batch from its world size, which would be 1 here.
    """
    import warnings

    import torch
    from trl import GRPOConfig

    kwargs = dict(trainer)
    kwargs["reward_weights"] = [float(r["weight"]) for r in rewards] or None
    on_gpu = torch.cuda.is_available()
    if not on_gpu and "LOCAL_RANK" in os.environ and num_processes_from_env() > 1:
        # N processes launched on a machine without a GPU (torchrun, `accelerate launch --multi_gpu`): without
        # use_cpu, transformers leaves each process alone (world size 1), so TRL's batch check disagrees with
        # ours and each process would train its own copy; with it they form one DDP run over gloo.
        kwargs.setdefault("use_cpu", True)
    dtype = resolved_dtype(model)
    if "bf16" not in kwargs and "fp16" not in kwargs:
        kwargs["bf16"] = on_gpu and dtype == "bfloat16"
        kwargs["fp16"] = on_gpu and dtype == "float16"
    cls = GRPOConfig
    if num_processes is not None:
        cls = type("GRPOConfigPlanned", (GRPOConfig,), {"world_size": property(lambda self: num_processes)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return cls(**kwargs)


def resolved_dtype(model: dict, lora: bool = False) -> str:
    """`auto` means bfloat16 on a GPU (TRL would otherwise load float32), float16 on one without bfloat16
    (T4, V100: common 16 GB cards); on CPU, bfloat16 for a LoRA run on a CPU that computes it natively
    (`cpu.cpu_computes_bf16`: the frozen base in bfloat16, the adapter and its optimizer in float32, PEFT's
    `autocast_adapter_dtype`), float32 otherwise (a full fine-tune, a quantized base, or a CPU that would emulate
    bfloat16 more slowly than it computes float32). Measured: bench/README.md, "CPU speed"."""
    dtype = model.get("dtype", "auto")
    if dtype != "auto":
        return dtype
    import torch

    if not torch.cuda.is_available():
        return cpu_dtype(model, lora)
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
