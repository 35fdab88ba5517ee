"""Making the warm start: TRL's `SFTTrainer` with a LoRA adapter over the worked exchanges, merged and saved in the
run folder whole or not at all; a folder already there (`--resume`) is used as it is, never trained again.

The exchanges reach the trainer tokenized, as `input_ids` with an `assistant_masks` column (SFTTrainer's documented
form of a processed dataset: it builds the labels from the mask, -100 off the assistant's turns). TRL's own
`assistant_only_loss` would render them itself, but needs `{% generation %}` markers in the chat template, which the
templates TRL parses tool calls with (qwen2_5) lack; `grpokit.warm_start.worked.tokens_and_labels` finds the turns by rendering, and
renders with the recipe's tools exactly as the GRPO tool loop will.
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

from grpokit import files
from grpokit.dist import say
from grpokit.run.progress import Pace
from grpokit.warm_start.section import FOLDER, KEY, RECORD, made


def load_base(prep):
    """The recipe's model, in the pass's dtype (`warm_start.dtype`), as the pass trains it."""
    from grpokit.trainer.models import load_model

    say(f"building model: {prep.recipe.model['name_or_path']} ({prep.recipe.warm_start['dtype']}) for the warm start")
    return load_model(prep.model_path, _in_dtype(prep.recipe, prep.recipe.warm_start["dtype"]))


def ensure(prep, output_dir: Path, base) -> str:
    """The warm start in `output_dir` (made from the loaded model `base` when it is not there whole); its path. A
    half-made one grpokit made is removed first; anything else at its name refuses the run, removing nothing."""
    found = made(output_dir)
    if found is not None:
        return str(found)
    target = Path(output_dir) / FOLDER
    if target.exists() or target.is_symlink():
        _remove_half_made(Path(output_dir), target)
    return str(make(prep, base, target))


def _remove_half_made(output_dir: Path, target: Path) -> None:
    """Remove the half-made warm start at `target`, only as grpokit wrote it (`files.remove`: recorded in the run
    folder's manifest, nothing inside it the user's); a `RecipeError` naming it, with nothing removed, otherwise."""
    from grpokit.errors import Problem, RecipeError

    files.remove(output_dir, [FOLDER], key=KEY)
    if target.exists() or target.is_symlink():
        raise RecipeError([Problem(KEY, f"{target} is not a whole warm start (its record, config.json or weights are "
                                   "missing) and grpokit did not make it: nothing was removed; move it out of the run "
                                   "folder, and the run makes its own")])
    say(f"warm start: {target} was half-made (its record, config.json or weights missing): removed, made again")


def adapter(section: dict, recipe_lora: dict | None) -> dict:
    """The LoRA the pass trains: its own `lora`, else the recipe's, else grpokit's defaults (`sections.LORA_DEFAULTS`)."""
    from grpokit.config.sections import LORA_DEFAULTS

    return dict(section.get("lora") or recipe_lora or LORA_DEFAULTS)


def make(prep, model, target: Path) -> Path:
    """Train, merge and save the warm start into `target`; its record (`RECORD`) is written last, inside."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    recipe, worked, section = prep.recipe, prep.warm_start, prep.recipe.warm_start
    lora = adapter(section, recipe.lora)
    say(f"warm start: {worked.source}; {section['steps']} steps of {section['batch_size']}, learning rate "
        f"{section['learning_rate']:g}, LoRA r={lora['r']} ({section['dtype']}), the loss on the assistant's turns only")
    rows = Dataset.from_list([{"input_ids": ids, "assistant_masks": mask} for ids, mask in worked.rows])
    started, losses, training = time.perf_counter(), [], []

    def build(tmp: Path) -> None:
        args = SFTConfig(output_dir=str(tmp), max_steps=section["steps"],
                         # one exchange at a time, a step's gradient accumulated over batch_size of them: the same
                         # mean over their assistant tokens as one batch (transformers divides by the step's tokens),
                         # in the memory of one exchange (a batch of 4 took 8.7 GB for SmolLM2-135M on CPU)
                         per_device_train_batch_size=1, gradient_accumulation_steps=section["batch_size"],
                         learning_rate=section["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
                         max_grad_norm=section["max_grad_norm"], seed=section["seed"], data_seed=section["seed"],
                         logging_steps=1, save_strategy="no", report_to="none", bf16=False, fp16=False,
                         activation_checkpointing=False, max_length=None, disable_tqdm=True,
                         dataloader_drop_last=False, use_cpu=not torch.cuda.is_available())
        trainer = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=prep.tokenizer,
                             peft_config=LoraConfig(**{**lora, "task_type": "CAUSAL_LM"}),
                             callbacks=[_Steps(section["steps"], losses)])
        trainer.remove_callback(PrinterCallback)  # its raw metrics dicts: _Steps says a step in one line
        began = time.perf_counter()
        trainer.train()
        training.append(time.perf_counter() - began)
        merged = trainer.model.merge_and_unload()
        merged.save_pretrained(tmp)
        prep.tokenizer.save_pretrained(tmp)
        record = _record(recipe, worked, lora, losses, time.perf_counter() - started)
        files.write_text(tmp / RECORD, json.dumps(record, indent=2) + "\n")

    files.build_folder(target, build)
    gc.collect()  # the SFT trainer and its callbacks refer to one another: freed now, before GRPO loads its model
    say(f"warm start: made {target} in {time.perf_counter() - started:.0f} s (last loss {losses[-1]:.3f})")
    gap = against_measured(training[0], prep, lora, on_cpu=not torch.cuda.is_available())
    if gap:
        say(gap)
    return target


# How far a pass's training time may stand from the time --check gave from bench's measured figure before it is said.
MEASURED_WITHIN = 1.5


def against_measured(seconds: float, prep, lora: dict, on_cpu: bool) -> str | None:
    """A line when the pass's training time (`seconds`) stands more than MEASURED_WITHIN times from the time `--check`
    gave for it (bench's measured per-step time on a CPU, grpokit.planning.cpu_time); None within it, or unmeasured."""
    from grpokit.planning.cpu_time import warm_start_measured
    from grpokit.warm_start.section import ROOT

    section, rows = prep.recipe.warm_start, prep.warm_start.rows
    found = warm_start_measured(prep.recipe.model["name_or_path"], section, lora["r"],
                                sum(len(ids) for ids, _ in rows) / max(1, len(rows)), ROOT) if on_cpu else None
    if found is None:
        return None
    expected = found[0] * section["steps"]
    if 1 / MEASURED_WITHIN <= seconds / expected <= MEASURED_WITHIN:
        return None
    how = "slower or busier" if seconds > expected else "faster"
    return (f"warm start: its {section['steps']} steps took {seconds:.0f} s, {seconds / expected:.1f}x the {expected:.0f} s "
            f"--check gave ({found[1]}): this machine is {how} than bench's")


def _in_dtype(recipe, dtype: str):
    """The recipe with `model.dtype` set to the pass's (a copy: the run's own recipe is not changed)."""
    from dataclasses import replace

    return replace(recipe, model={**recipe.model, "dtype": dtype})


def _record(recipe, worked, lora: dict, losses: list[float], seconds: float) -> dict:
    """What the warm start is, for the run folder and a bench to read back."""
    section = recipe.warm_start
    return {"examples": len(worked.exchanges), "source": worked.source, "steps": section["steps"],
            "batch_size": section["batch_size"], "learning_rate": section["learning_rate"],
            "max_grad_norm": section["max_grad_norm"], "seed": section["seed"], "dtype": section["dtype"],
            "lora": {k: lora[k] for k in ("r", "lora_alpha", "target_modules") if k in lora},
            "from_model": recipe.model["name_or_path"], "loss": losses, "seconds": round(seconds, 1),
            "tokens_per_example": round(sum(len(ids) for ids, _ in worked.rows) / len(worked.rows)),
            "trained_tokens_per_example": round(worked.trained_tokens / len(worked.rows)),
            "trained": "TRL SFTTrainer, LoRA merged into the weights; loss on the assistant's turns only"}


class _Steps(TrainerCallback):
    """One line a step while the warm start trains, with its pace and the time left as GRPO's step lines give them
    (grpokit.run.progress.Pace, from each step's own wall time), and its losses kept."""

    def __init__(self, steps: int, losses: list[float], clock=time.perf_counter):
        self.steps, self.losses, self.pace, self.clock = steps, losses, Pace(), clock
        self.began, self.took = 0.0, None

    def on_step_begin(self, args, state, control, **kwargs):
        self.began = self.clock()

    def on_step_end(self, args, state, control, **kwargs):
        self.took = self.clock() - self.began

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(round(float(logs["loss"]), 4))
            pace = self.pace.update({"step_time": self.took}, state.global_step, self.steps) if self.took else ""
            say(f"warm start step {state.global_step}/{self.steps}: loss {self.losses[-1]:.3f}" + (f"  {pace}" if pace else ""))
