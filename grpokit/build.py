"""Prepare, then build: everything a run needs before it trains, with no run folder touched.

`prepare()` builds all that needs no weights (GRPOConfig, LoRA config, rewards, tokenizer, formatted
dataset) and is what `--check` runs; `make_trainer()` builds the trainer around the loaded weights. `--check`, a launch and a run go
through the same code, so a recipe that passes `--check` fails at training time only for reasons no check can
see before the weights load (out of memory, a reward raising on real completions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from grpokit import rundir
from grpokit.config import Recipe, engine
from grpokit.config.trainer_args import grpo_args
from grpokit.dist import say
from grpokit.errors import Problem, RecipeError
from grpokit.models import describe_error, is_gguf_file, load_tokenizer, model_source, not_cached
from grpokit.trl_compat import vllm_version

# Who prepares: `--check` (notes what it cannot reach offline), a run in this process, or the process about to
# launch several (training's rules, the batch rule for the processes it starts).
Purpose = Literal["check", "train", "launch"]
PURPOSES = get_args(Purpose)


@dataclass
class Prepared:
    recipe: Recipe
    args: Any  # trl.GRPOConfig
    lora: Any  # peft.LoraConfig | None
    reward_funcs: list
    model_path: str | None  # local dir, or hub id; None when not reachable
    tokenizer: Any = None
    dataset: Any = None
    notes: list[str] = field(default_factory=list)


def prepare(recipe: Recipe, log=say, mode: Purpose = "check") -> Prepared:
    """Everything but the weights. Raises `RecipeError` listing every problem.

    "check" (`--check`): a hub model or dataset that cannot be reached offline becomes a note, and the output
    folder is checked here. "train": it must load (from the cache, or downloaded where the hub is reachable); the
    batch rule is for the processes the launcher started. "launch": checked by the process that is about to start
    `recipe.num_processes` (grpokit.launcher), with training's rules and the batch rule for those processes.
    """
    if mode not in PURPOSES:
        raise ValueError(f"prepare: mode must be one of {', '.join(PURPOSES)} (got {mode!r})")
    training = mode != "check"
    import rewards
    from peft import LoraConfig

    from grpokit import data

    args = grpo_args(recipe, num_processes=None if mode == "train" else recipe.num_processes)
    lora = LoraConfig(**recipe.lora) if recipe.lora is not None else None
    reward_funcs = [rewards.build(r["name"], **r["args"]) for r in recipe.rewards]
    notes, problems = [], []

    model_path, note = None, None
    try:
        model_path, note = model_source(recipe, convert=training)
    except RecipeError as err:
        problems += err.problems
    if is_gguf_file(model_path):
        notes.append(f"{Path(model_path).name}: tokenizer and context length read from the GGUF's metadata; its weights are "
                     "converted once (dequantized to float32, cached in ~/.cache/grpokit or $GRPOKIT_CACHE) by the first run")
    if note:  # a hub model neither cached nor fetchable: --check notes it, training cannot go on
        if training:
            problems.append(Problem("model.name_or_path", note, file=str(recipe.path)))
        else:
            notes.append(f"{note}; its tokenizer and prompt lengths are not checked")

    tokenizer = None
    if model_path and not note:
        log(f"loading tokenizer: {model_path}")
        try:
            tokenizer = load_tokenizer(model_path, recipe, offline_only=not training)
        except Exception as err:  # noqa: BLE001 - a broken model dir is a recipe problem, said plainly
            problems.append(Problem("model.name_or_path", f"cannot load its tokenizer: {describe_error(err)}",
                                    recipe.model["name_or_path"], file=str(recipe.path)))

    dataset = None
    try:
        log("loading dataset")
        source = recipe.blame("dataset.path" if recipe.dataset.get("path") else "dataset.name")
        raw = data.load_raw(recipe.dataset, set_in=source)
        target = data.TargetModel(tokenizer, data.is_conversational(recipe.dataset, tokenizer),
                                  data.context_length(model_path), args.max_completion_length)
        dataset = data.prepare(raw, recipe.dataset, target, log=log, set_in=source)
        from grpokit.config.validate import reward_column_problems

        problems += reward_column_problems(recipe.rewards, dataset.column_names, str(recipe.path))
    except data.NotReachable:
        if training:
            problems.append(Problem("dataset.name", not_cached("dataset", recipe.dataset["name"]), file=str(recipe.path)))
        else:
            notes.append(f"{not_cached('dataset', recipe.dataset['name'])}; its columns are not checked")
    except RecipeError as err:
        problems += err.problems
    vllm_problems, vllm_notes = engine.environment(bool(args.use_vllm), _cuda(), vllm_version(), training)
    problems += [Problem("trainer.use_vllm", m, file=str(recipe.path)) for m in vllm_problems]
    notes += vllm_notes
    if not training:  # --check; a run finds out when it locks the folder (rundir.RunLock), before any weights load
        output_dir = Path(recipe.trainer["output_dir"])
        problems += rundir.forbidden_problems(output_dir, recipe.path, str(recipe.path))
        problems += rundir.writable_problems(output_dir, str(recipe.path))
    if problems:
        raise RecipeError(problems)
    return Prepared(recipe, args, lora, reward_funcs, model_path, tokenizer, dataset, notes)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def make_trainer(prep: Prepared, model):
    """The GRPOTrainer (or its dynamic-sampling subclass) exactly as `training.train()` uses it; tests call this too."""
    from trl import GRPOTrainer

    kwargs = dict(model=model, reward_funcs=prep.reward_funcs, args=prep.args, train_dataset=prep.dataset,
                  processing_class=prep.tokenizer, peft_config=prep.lora)
    if str(getattr(prep.args.eval_strategy, "value", prep.args.eval_strategy)) != "no":  # TRL's own periodic eval
        from grpokit.data import heldout_dataset

        kwargs["eval_dataset"] = heldout_dataset(prep.recipe, prep.tokenizer, log=say)
    if prep.recipe.sampling.get("dynamic"):
        from grpokit.dynamic_sampling import DynamicSamplingGRPOTrainer

        return DynamicSamplingGRPOTrainer(sampling=prep.recipe.sampling, **kwargs)
    return GRPOTrainer(**kwargs)
