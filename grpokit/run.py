"""From a validated recipe to a trained run: everything `launch.py` does after reading its arguments.

`prepare()` builds all that needs no weights (GRPOConfig, LoRA config, rewards, tokenizer, formatted
dataset) and is what `--check` runs; `train()` adds the weights and the trainer. Both go through the
same code, so a recipe that passes `--check` fails at training time only for reasons no check can
see before the weights load (out of memory, a reward raising on real completions).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpokit import recipe as recipe_io
from grpokit.errors import Problem, RecipeError
from grpokit.sections import Recipe, build_grpo_config, resolved_dtype

_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
STATE_FILE = "trainer_state.json"  # what the trainer saves in output_dir and in every checkpoint-N/


def is_main_process() -> bool:
    return os.environ.get("RANK", "0") in ("0", "") and os.environ.get("LOCAL_RANK", "0") in ("0", "")


def say(message: str) -> None:
    """One progress line per phase, from the main process only."""
    if is_main_process():
        print(f"[grpokit] {message}", flush=True)


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


def prepare(recipe: Recipe, log=say, training: bool = False) -> Prepared:
    """Everything but the weights. Raises `RecipeError` listing every problem.

    For `--check` (training=False) a hub model or dataset that cannot be reached offline becomes a note;
    for training it must load (from the cache, or downloaded where the hub is reachable).
    """
    import rewards as registry
    from peft import LoraConfig

    from grpokit import data

    args = grpo_args(recipe, num_processes=None if training else recipe.num_processes)
    lora = LoraConfig(**recipe.lora) if recipe.lora is not None else None
    reward_funcs = [registry.build(r["name"], **r["args"]) for r in recipe.rewards]
    notes, problems = [], []

    model_path, note = None, None
    try:
        model_path, note = model_source(recipe)
    except RecipeError as err:
        problems += err.problems
    if note and not training:
        notes.append(note)

    tokenizer = None
    if model_path and (training or not note):
        log(f"loading tokenizer: {model_path}")
        try:
            tokenizer = load_tokenizer(model_path, recipe, offline_only=not training)
        except Exception as err:  # noqa: BLE001 - a broken model dir is a recipe problem, said plainly
            problems.append(Problem("model.name_or_path", f"cannot load its tokenizer: {type(err).__name__}: {str(err)[:200]}",
                                    recipe.model["name_or_path"], file=str(recipe.path)))

    dataset = None
    try:
        log("loading dataset")
        raw = data.load_raw(recipe.dataset, origin=str(recipe.path))
        conversational = recipe.dataset["conversational"]
        if conversational == "auto":
            conversational = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
        dataset = data.prepare(raw, recipe.dataset, tokenizer, conversational, log=log, origin=str(recipe.path))
        missing = _reward_columns_missing(recipe, dataset.column_names)
        problems += missing
    except data.NotReachable as err:
        if training:
            problems.append(Problem("dataset.name", str(err), recipe.dataset["name"], file=str(recipe.path)))
        else:
            notes.append(f"{err}: dataset columns not checked")
    except RecipeError as err:
        problems += err.problems
    if problems:
        raise RecipeError(problems)
    return Prepared(recipe, args, lora, reward_funcs, model_path, tokenizer, dataset, notes)


def _reward_columns_missing(recipe: Recipe, columns: list[str]) -> list[Problem]:
    """A reward reading a gold column (`gold_column` arg, given or its default) needs that column in the prepared data."""
    import rewards as registry

    problems = []
    for i, r in enumerate(recipe.rewards):
        param = registry.arg_parameters(registry.resolve(r["name"]).target).get("gold_column")
        col = r["args"].get("gold_column", None if param is None or param.default is param.empty else param.default)
        if isinstance(col, str) and col not in columns:
            hint = " (set dataset.answer_column to expose a column as `answer`)" if col == "answer" else ""
            problems.append(Problem(f"rewards[{i}].args.gold_column", f"names no column of the prepared dataset{hint}", col,
                                    ", ".join(columns), file=str(recipe.path)))
    return problems


def grpo_args(recipe: Recipe, num_processes: int | None = None):
    """The run's `GRPOConfig`: the trainer section plus what the model section implies for TRL."""
    kwargs = dict(recipe.trainer)
    init = {k: recipe.model[k] for k in ("revision",) if recipe.model.get(k)}
    if init:
        kwargs["model_init_kwargs"] = init
    kwargs["trust_remote_code"] = recipe.model.get("trust_remote_code", False)
    return build_grpo_config(kwargs, recipe.model, recipe.rewards, num_processes=num_processes)


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
    (what grpokit.memory plans), computing in `dtype` (bfloat16 for a float32 base); 8bit is LLM.int8."""
    if quantization == "none":
        return None
    import torch
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=dtype if dtype != torch.float32 else torch.bfloat16)


def guard_output_dir(output_dir: Path, resume: str | None, overwrite: bool, origin: str) -> None:
    """A previous run is never silently destroyed: a non-empty output_dir needs --resume or --overwrite.

    Only the main process judges: another rank could otherwise see the main one's fresh `recipe.yaml` and
    refuse its own run (or remove it under --overwrite); when the main process refuses, the launcher stops them all.
    """
    if resume or not is_main_process() or not output_dir.exists() or not any(output_dir.iterdir()):
        return
    if overwrite:
        import shutil

        say(f"--overwrite: removing the previous run in {output_dir}")
        shutil.rmtree(output_dir)
        return
    raise RecipeError([Problem("trainer.output_dir", "already holds a run; pass --resume to continue it, --overwrite to replace it, "
                               "or choose another trainer.output_dir=...", str(output_dir), file=origin)])


def latest_checkpoint(output_dir: Path) -> str | None:
    """The highest-numbered `checkpoint-N/` that holds a `trainer_state.json` (a complete one), if any."""
    found = [(int(p.name.partition("-")[2]), p) for p in output_dir.glob("checkpoint-*")
             if p.name.partition("-")[2].isdigit() and (p / STATE_FILE).is_file()]
    return str(max(found)[1]) if found else None


def resolve_resume(resume: str | None, output_dir: Path, origin: str) -> str | None:
    if resume is None:
        return None
    if resume == "latest":
        found = latest_checkpoint(output_dir)
        if found is None:
            raise RecipeError([Problem("--resume", "no checkpoint to resume in trainer.output_dir", str(output_dir), file=origin)])
        return found
    if not (Path(resume) / STATE_FILE).exists():
        raise RecipeError([Problem("--resume", f"is not a checkpoint directory (no {STATE_FILE})", resume, file=origin)])
    return resume


def make_trainer(prep: Prepared, model):
    """The GRPOTrainer (or its dynamic-sampling subclass) exactly as `train()` uses it; tests call this too."""
    from trl import GRPOTrainer

    kwargs = dict(model=model, reward_funcs=prep.reward_funcs, args=prep.args, train_dataset=prep.dataset,
                  processing_class=prep.tokenizer, peft_config=prep.lora)
    if prep.recipe.sampling.get("dynamic"):
        from grpokit.sampling import DynamicSamplingGRPOTrainer

        return DynamicSamplingGRPOTrainer(sampling=prep.recipe.sampling, **kwargs)
    return GRPOTrainer(**kwargs)


def train(recipe: Recipe, resume: str | None = None, overwrite: bool = False):
    """Train a validated recipe; returns the trainer. Writes the resolved recipe first, then the run."""
    output_dir = Path(recipe.trainer["output_dir"])
    origin = str(recipe.path)
    guard_output_dir(output_dir, resume, overwrite, origin)
    checkpoint = resolve_resume(resume, output_dir, origin)
    prep = prepare(recipe, training=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    if is_main_process():
        (output_dir / "recipe.yaml").write_text(
            f"# resolved from {recipe.path} (overrides applied); rerun: python launch.py --recipe {output_dir / 'recipe.yaml'}\n"
            + recipe_io.dump(recipe.as_dict())
        )
    say(f"building model: {recipe.model['name_or_path']} ({resolved_dtype(recipe.model)}, quantization {recipe.model['quantization']}, "
        + (f"LoRA r={recipe.lora['r']})" if recipe.lora else "full fine-tune)"))
    model = load_model(prep.model_path, recipe)
    trainer = make_trainer(prep, model)
    from grpokit import progress

    progress.install(trainer)
    say(f"training: {prep.args.max_steps if prep.args.max_steps > 0 else prep.args.num_train_epochs} "
        f"{'steps' if prep.args.max_steps > 0 else 'epochs'} -> {output_dir}" + (f" (resuming {checkpoint})" if checkpoint else ""))
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(str(output_dir))
    trainer.save_state()
    if is_main_process():
        finish_run(output_dir, recipe, prep.args, trainer)
    return trainer


def end_distributed(code: int) -> None:
    """End a distributed launch's process here with `code`; returns at once when no process group is up.

    On success every rank waits for the others (all have saved) and the process group is closed. Then the
    process leaves without interpreter finalization: in torch 2.13 a gloo worker thread can drop the last
    reference to a finished collective's tensors just after the main thread began finalizing, and taking
    the GIL then aborts the process (SIGABRT, "terminate called without an active exception") after a
    complete run -- caught here about once in 30-40 two-process CPU runs; see pytorch/pytorch#190489.
    Python's exit handlers still run and output is flushed first, so nothing a run writes is lost.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return
    if code == 0:  # a failed rank may have left collectives unmatched: waiting for the others would hang
        dist.barrier()
        dist.destroy_process_group()
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def explain_table(recipe: Recipe, args) -> list[str]:
    """What the recipe computes, in the seed chapter's terms, as table lines (for --check and report.md)."""
    from grpokit import explain

    rows = explain.explain(args, rewards=recipe.rewards, sampling=recipe.sampling, lora=recipe.lora, model=recipe.model)
    return explain.render(rows)


def finish_run(output_dir: Path, recipe: Recipe, args, trainer=None) -> list[Path]:
    """Curves (PNG) and report.md for a finished run; with a live trainer, its last completions too."""
    from grpokit.plots import plot_run
    from grpokit.report import completions_from_logs, write_report

    plots = plot_run(output_dir)
    completions = None
    if trainer is not None and getattr(trainer, "_logs", None):
        completions = completions_from_logs(trainer._logs, step=trainer.state.global_step) or None
    report = write_report(output_dir, recipe_name=recipe.name, explain_lines=[f"recipe: {recipe.path}", f"model: {recipe.model['name_or_path']}"] + explain_table(recipe, args),
                          completions=completions, plots=plots)
    for path in plots + [report]:
        say(f"wrote {path}")
    return plots + [report]
