"""Validating a loaded recipe into typed sections, reporting every problem in one pass.

Sections: `model`, `lora`, `dataset`, `rewards`, `trainer`, `sampling` (and `base`, consumed by the
loader). `trainer` is checked against `trl.GRPOConfig` itself and `lora` against `peft.LoraConfig`,
plus the enumerations and ranges those libraries leave unchecked (TRL 1.16 accepts `beta: "high"`,
`loss_type: dapo2` or `max_completion_length: 0`, and PEFT accepts `r: 0`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from grpokit.errors import Problems, nearest
from grpokit.recipe import Loaded
from grpokit.schema import Bounds, Field, validate_dataclass_keys, validate_fields

SECTIONS = ("model", "lora", "dataset", "rewards", "trainer", "sampling")
REQUIRED_SECTIONS = ("model", "dataset", "rewards")

MODEL = {
    "name_or_path": Field(str, doc="a hub id, a local directory, or builtin:tiny-llama"),
    "dtype": Field(str, "auto", "weights dtype; auto = bfloat16 on a GPU (float16 where it lacks bfloat16), float32 on CPU",
                   choices=("auto", "bfloat16", "float16", "float32")),
    "quantization": Field(str, "none", "none, 8bit, or 4bit (nf4, QLoRA)", choices=("none", "8bit", "4bit")),
    "attn_implementation": Field(str | None, None, choices=("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")),
    "trust_remote_code": Field(bool, False),
    "revision": Field(str | None, None),
}

DATASET = {
    "name": Field(str | None, None, "hub dataset id"),
    "config": Field(str | None, None, "hub dataset config, e.g. main"),
    "split": Field(str, "train"),
    "path": Field(str | None, None, "local .jsonl/.json/.parquet/.csv, relative to the recipe"),
    "prompt_column": Field(str, "prompt"),
    "template": Field(str | None, None, "text with {column} placeholders; default: the prompt column as is"),
    "system_prompt": Field(str | None, None),
    "answer_column": Field(str | None, None, "gold answer column; exposed to rewards as `answer`"),
    "conversational": Field(str | bool, "auto", "auto: chat format when the tokenizer has a chat template",
                            choices=("auto", True, False)),
    "max_prompt_tokens": Field(int | None, None, min=1),
    "limit": Field(int | None, None, min=1),
}

SAMPLING = {
    "dynamic": Field(bool, False, "DAPO dynamic sampling: train only on groups whose metric varies"),
    "max_rounds": Field(int, 4, "generation rounds per batch before going on with what it has", min=1),
    "metric": Field(str, "reward", "'reward' (the weighted total) or the name of one reward"),
}

REWARD_ENTRY = {
    "name": Field(str, doc="a registered reward, path/to/file.py:function, or package.module:function"),
    "weight": Field(float, 1.0),
    "args": Field(dict, {}),
}

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
TRAINER_BOUNDS = {
    "loss_type": Bounds(choices=LOSS_TYPES),
    "scale_rewards": Bounds(choices=("group", "batch", "none"), also=(True, False)),
    "importance_sampling_level": Bounds(choices=("token", "sequence")),
    "multi_objective_aggregation": Bounds(choices=("sum_then_normalize", "normalize_then_sum")),
    "vllm_mode": Bounds(choices=("server", "colocate")),
    "vllm_importance_sampling_mode": Bounds(choices=("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")),
    "beta": Bounds(min=0.0),
    "epsilon": Bounds(gt=0.0),
    "epsilon_high": Bounds(gt=0.0),
    "delta": Bounds(gt=1.0),
    "num_generations": Bounds(min=2),
    "num_generations_eval": Bounds(min=1),
    "max_completion_length": Bounds(min=1),
    "num_iterations": Bounds(min=1),
    "generation_batch_size": Bounds(min=1),
    "steps_per_generation": Bounds(min=1),
    "per_device_train_batch_size": Bounds(min=1),
    "per_device_eval_batch_size": Bounds(min=1),
    "gradient_accumulation_steps": Bounds(min=1),
    "learning_rate": Bounds(gt=0.0),
    "weight_decay": Bounds(min=0.0),
    "max_grad_norm": Bounds(min=0.0),
    "warmup_steps": Bounds(min=0),
    "num_train_epochs": Bounds(gt=0.0),
    "max_steps": Bounds(min=-1),
    "logging_steps": Bounds(gt=0.0),
    "save_steps": Bounds(gt=0.0),
    "save_total_limit": Bounds(min=1),
    "temperature": Bounds(gt=0.0),
    "top_p": Bounds(gt=0.0, max=1.0),
    "top_k": Bounds(min=0),
    "min_p": Bounds(min=0.0, max=1.0),
    "repetition_penalty": Bounds(gt=0.0),
    "top_entropy_quantile": Bounds(min=0.0, max=1.0),
    "ref_model_mixup_alpha": Bounds(min=0.0, max=1.0),
    "ref_model_sync_steps": Bounds(min=1),
    "vllm_gpu_memory_utilization": Bounds(gt=0.0, max=1.0),
    "entropy_coef": Bounds(min=0.0),
    "seed": Bounds(min=0),
}
TRAINER_REFUSED = {
    "model_init_kwargs": "is set by grpokit from the model section (dtype, quantization, attn_implementation)",
    "reward_weights": "is set by grpokit from the rewards list: give each entry a weight",
    "auto_find_batch_size": "is not supported by GRPO: shrinking the batch on OOM breaks whole prompt groups; "
    "lower trainer.per_device_train_batch_size instead",
}

LORA_BOUNDS = {
    "r": Bounds(min=1),
    "lora_alpha": Bounds(gt=0),
    "lora_dropout": Bounds(min=0.0, lt=1.0),
}
LORA_DEFAULTS = {"task_type": "CAUSAL_LM", "target_modules": "all-linear", "r": 16, "lora_alpha": 32}


@dataclass
class Recipe:
    """A validated recipe: every section with its defaults filled, ready to build from."""

    path: Path
    name: str
    model: dict
    lora: dict | None
    dataset: dict
    rewards: list[dict]
    trainer: dict
    sampling: dict
    num_processes: int = 1

    def as_dict(self) -> dict:
        """What is saved as the resolved recipe next to a run: rerunnable as is."""
        return {
            "model": self.model,
            "lora": self.lora,
            "dataset": self.dataset,
            "rewards": self.rewards,
            "trainer": self.trainer,
            "sampling": self.sampling,
        }


def recipe_name(path: Path) -> str:
    """`recipes/qwen2.5-3b/dapo.yaml` -> `qwen2.5-3b/dapo`; a file elsewhere -> its stem."""
    path = path.resolve()
    parts = path.with_suffix("").parts
    if "recipes" in parts:
        return "/".join(parts[len(parts) - parts[::-1].index("recipes") :])
    return path.stem


def num_processes_from_env() -> int:
    """The process count an accelerate/torchrun launch gives this run (1 when run with plain python)."""
    for var in ("WORLD_SIZE", "ACCELERATE_NUM_PROCESSES"):
        value = os.environ.get(var)
        if value and value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def validate(loaded: Loaded, num_processes: int | None = None) -> Recipe:
    """Check every section; raise `RecipeError` with all problems, or return the `Recipe`."""
    from peft import LoraConfig
    from trl import GRPOConfig

    data, origin = loaded.data, loaded.origin
    problems = Problems(file=str(loaded.path))

    for key in data:
        if key not in SECTIONS:
            problems.add(str(key), "is not a recipe section", allowed=", ".join(SECTIONS), suggestion=nearest(str(key), SECTIONS), file=origin(str(key)))
    for key in REQUIRED_SECTIONS:
        if data.get(key) is None:
            problems.add(key, "section is required", file=str(loaded.path))

    model = validate_fields(data.get("model") or {}, MODEL, "model", problems, origin) if data.get("model") is not None else {}
    dataset = validate_fields(data.get("dataset") or {}, DATASET, "dataset", problems, origin) if data.get("dataset") is not None else {}
    sampling = validate_fields(data.get("sampling") or {}, SAMPLING, "sampling", problems, origin)

    if dataset:
        if bool(dataset.get("name")) == bool(dataset.get("path")):
            problems.add("dataset", "give exactly one of dataset.name (hub) or dataset.path (local file)",
                         {k: dataset.get(k) for k in ("name", "path")}, file=origin("dataset"))

    lora = None
    if data.get("lora") is not None:
        raw_lora = validate_dataclass_keys(data["lora"], LoraConfig, "lora", problems, LORA_BOUNDS, origin)
        lora = {**LORA_DEFAULTS, **raw_lora}
    if model.get("quantization") not in (None, "none") and lora is None:
        problems.add("model.quantization", "a quantized model cannot be fully fine-tuned; add a lora section (QLoRA)",
                     model["quantization"], file=origin("model.quantization"))

    trainer = validate_dataclass_keys(data.get("trainer") or {}, GRPOConfig, "trainer", problems, TRAINER_BOUNDS,
                                      origin, refuse=TRAINER_REFUSED)
    trainer.setdefault("output_dir", str(Path("runs") / recipe_name(loaded.path)))
    trainer.setdefault("report_to", "none")

    rewards = _validate_rewards(data.get("rewards"), trainer, problems, origin)
    if sampling.get("metric") not in (None, "reward") and rewards:
        names = [r["logged_as"] for r in rewards]
        if sampling["metric"] not in names:
            problems.add("sampling.metric", "names no reward of this recipe", sampling["metric"],
                         "reward, " + ", ".join(names), nearest(sampling["metric"], names + ["reward"]), file=origin("sampling.metric"))

    if trainer.get("bf16") is True and trainer.get("fp16") is True:
        problems.add("trainer.fp16", "cannot be true together with trainer.bf16; set one (or neither: model.dtype picks)",
                     True, file=origin("trainer.fp16"))
    n_proc = num_processes or num_processes_from_env()
    _check_batch(trainer, n_proc, problems, origin)
    if sampling.get("dynamic"):
        _check_dynamic_sampling(trainer, problems, origin)
    problems.raise_if_any()

    # The libraries' own checks, on values that passed ours: their messages are reworded, not shown raw.
    try:
        build_grpo_config(trainer, model, rewards, num_processes=n_proc)
    except (ValueError, TypeError) as err:
        problems.add("trainer", f"TRL rejects this configuration: {err}", file=origin("trainer"))
    if lora is not None:
        try:
            LoraConfig(**lora)
        except (ValueError, TypeError) as err:
            problems.add("lora", f"PEFT rejects this configuration: {err}", file=origin("lora"))
    problems.raise_if_any()

    for r in rewards:
        r.pop("logged_as")
    return Recipe(loaded.path, recipe_name(loaded.path), model, lora, dataset, rewards, trainer, sampling, n_proc)


def _validate_rewards(raw, trainer: dict, problems: Problems, origin) -> list[dict]:
    import rewards as registry

    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        problems.add("rewards", "must be a non-empty list of {name, weight, args}", raw, file=origin("rewards"))
        return []
    out, seen = [], {}
    for i, item in enumerate(raw):
        path = f"rewards[{i}]"
        if isinstance(item, str):  # shorthand: "- accuracy"
            item = {"name": item}
        entry = validate_fields(item, REWARD_ENTRY, path, problems, lambda p: origin("rewards"))
        if "name" not in entry:
            continue
        args = dict(entry.get("args") or {})
        try:
            e = registry.bind(entry["name"], args)
            for arg, key_path in e.from_recipe.items():
                if args.get(arg) is None:
                    section, _, key = key_path.partition(".")
                    args[arg] = _knob(trainer, key) if section == "trainer" else None
            registry.build(entry["name"], **args)
        except registry.RewardError as err:
            problems.add(f"{path}.name" if "unknown reward" in str(err) or "user reward" in str(err) else f"{path}.args",
                         str(err), file=origin("rewards"))
            continue
        if e.name in seen:
            problems.add(f"{path}.name", f"reward {e.name!r} is listed twice (also rewards[{seen[e.name]}]); TRL logs them under one name",
                         file=origin("rewards"))
        seen[e.name] = i
        out.append({"name": entry["name"], "weight": entry["weight"], "args": args, "logged_as": e.name})
    return out


def _knob(trainer: dict, key: str):
    """The trainer section's value for `key`, else `GRPOConfig`'s own default (None for no such field)."""
    if key in trainer:
        return trainer[key]
    import dataclasses

    from trl import GRPOConfig

    return next((f.default for f in dataclasses.fields(GRPOConfig) if f.name == key), None)


def _check_batch(trainer: dict, n_proc: int, problems: Problems, origin) -> None:
    """The generation batch must hold whole prompt groups: TRL checks this only with its own world size."""
    per_device, num_gen, accum, gen_bs, spg = (_knob(trainer, k) for k in (
        "per_device_train_batch_size", "num_generations", "gradient_accumulation_steps", "generation_batch_size",
        "steps_per_generation"))
    if not all(isinstance(v, int) and v > 0 for v in (per_device, num_gen, accum)):
        return  # already reported as a type or range problem
    if gen_bs is not None and spg is not None:
        problems.add("trainer.generation_batch_size", "cannot be set together with trainer.steps_per_generation; set one",
                     gen_bs, file=origin("trainer.generation_batch_size"))
        return
    global_batch = per_device * n_proc
    if gen_bs is not None:
        if gen_bs % global_batch:
            problems.add("trainer.generation_batch_size",
                         f"must be divisible by the global batch per_device_train_batch_size ({per_device}) x processes ({n_proc}) = {global_batch}",
                         gen_bs, file=origin("trainer.generation_batch_size"))
            return
        generation = gen_bs
    else:
        generation = global_batch * (spg or accum)
    if generation % num_gen:
        steps = spg or accum
        fix = next(b for b in range(per_device, per_device + num_gen + 1) if (b * n_proc * steps) % num_gen == 0)
        problems.add(
            "trainer.num_generations",
            f"the generation batch ({generation} = per_device_train_batch_size {per_device} x {n_proc} process(es)"
            f" x {'steps_per_generation' if spg else 'gradient_accumulation_steps'} {steps}) must be divisible by"
            f" num_generations ({num_gen}) so every prompt's group is whole",
            num_gen,
            f"e.g. per_device_train_batch_size: {fix}",
            file=origin("trainer.num_generations"),
        )


def _check_dynamic_sampling(trainer: dict, problems: Problems, origin) -> None:
    """What the dynamic-sampling trainer would refuse at init, said before any weight loads."""
    from grpokit.sampling import PER_GROUP, batch_level_knobs, check_group_layout

    for knob, value in batch_level_knobs(_knob(trainer, "scale_rewards"), _knob(trainer, "multi_objective_aggregation")).items():
        problems.add(f"trainer.{knob}", "cannot be used with sampling.dynamic: batch-level statistics would mix "
                     "the generation rounds a batch is built from", value, ", ".join(PER_GROUP[knob]), file=origin(f"trainer.{knob}"))
    per_device, num_gen = _knob(trainer, "per_device_train_batch_size"), _knob(trainer, "num_generations")
    steps = _knob(trainer, "steps_per_generation") or _knob(trainer, "gradient_accumulation_steps")
    if trainer.get("generation_batch_size") and trainer.get("steps_per_generation") is None:
        return  # steps per generation follow from the process count: the trainer checks it at init
    if all(isinstance(v, int) and v > 0 for v in (per_device, num_gen, steps)):
        try:
            check_group_layout(per_device, steps, num_gen)
        except ValueError as err:
            problems.add("trainer.per_device_train_batch_size", str(err), per_device, file=origin("trainer.per_device_train_batch_size"))


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


def resolved_dtype(model: dict) -> str:
    """`auto` means bfloat16 on a GPU (TRL would otherwise load float32), float16 on one without bfloat16
    (T4, V100: common 16 GB cards), and float32 on CPU."""
    dtype = model.get("dtype", "auto")
    if dtype != "auto":
        return dtype
    import torch

    if not torch.cuda.is_available():
        return "float32"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
