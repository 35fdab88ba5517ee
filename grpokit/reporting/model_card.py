"""The model card (`README.md`) of a finished run: the real base model, dataset and recipe.

TRL's own card names the base model only when it is a hub id not found as a local folder, and its quick start
loads `hub_model_id`: for a model loaded from a local folder or grpokit's built-in one, and any run not pushed
to the hub, it read "a fine-tuned version of [None]" and `model="None"`. TRL's is never written into a run folder
(grpokit.trl_compat.no_draft_card); this card is, once the final save is done, from the recipe the run saved.
"""

from __future__ import annotations

from pathlib import Path

from grpokit import files
from grpokit.warm_start.section import FOLDER

CARD_FILE = "README.md"


def _is_hub_id(name: str) -> bool:
    return "/" in name and not name.startswith(("/", ".", "~", "builtin:")) and not Path(name).exists()


def _short(name: str) -> str:
    """A user reward given by file shows as its file name and function, not a machine's absolute path."""
    where, sep, attr = name.rpartition(":")
    return f"{Path(where).name}:{attr}" if sep and where.endswith(".py") else name


def model_card(recipe, output_dir: Path, global_step: int, trl_version: str, resumed_at: int | None = None) -> str:
    """The card's text for `recipe` trained to `global_step` in `output_dir` (its last session resumed at step
    `resumed_at`, when it did).

    >>> class R: name = "smoke"; model = {"name_or_path": "builtin:tiny-llama"}; lora = {"r": 8}
    >>> R.dataset = {"name": None, "path": "/x/smoke.jsonl", "split": "train"}; R.rewards = [{"name": "char_fraction", "weight": 1.0}]
    >>> "a LoRA adapter (r=8) for builtin:tiny-llama" in model_card(R, Path("runs/smoke"), 30, "1.16.0")
    True
    """
    base = recipe.model["name_or_path"]
    from grpokit.prompts.data import source_name  # a file's name, or generated tasks named with their size and seed
    from grpokit.reporting.warm_start import made_by, read

    made = read(output_dir) if recipe.warm_start else None  # the adapter's base is then the warm start, not `base`

    dataset = recipe.dataset.get("name") or source_name(recipe.dataset)
    front = ["---", "library_name: " + ("peft" if recipe.lora else "transformers"), "pipeline_tag: text-generation",
             "tags: [grpokit, grpo, trl" + (", lora" if recipe.lora else "") + "]"]
    if _is_hub_id(base) and made is None:
        front.append(f"base_model: {base}")
    if recipe.dataset.get("name"):
        front.append(f"datasets: [{recipe.dataset['name']}]")
    front.append("---")
    what = f"a LoRA adapter (r={recipe.lora['r']}) for {base}" if recipe.lora else f"a full fine-tune of {base}"
    base_link = f"[{base}](https://huggingface.co/{base})" if _is_hub_id(base) else f"`{base}`"
    if made is not None:
        what = (f"a LoRA adapter (r={recipe.lora['r']}) for this run's warm start" if recipe.lora else
                "a full fine-tune of this run's warm start")
        base_link = (f"this run's warm start, `{FOLDER}/` in this folder: {base_link} after {made_by(made)} "
                     "(a supervised pass, merged; report.md, \"Warm start\")")
    data_link = (f"[{dataset}](https://huggingface.co/datasets/{dataset})" if recipe.dataset.get("name") else f"`{dataset}`")
    rewards = " + ".join(f"{r.get('weight', 1.0):g} x {_short(r['name'])}" for r in recipe.rewards)
    load = (f'from peft import AutoPeftModelForCausalLM\nmodel = AutoPeftModelForCausalLM.from_pretrained("{output_dir}")'
            if recipe.lora else
            f'from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained("{output_dir}")')
    body = [
        f"# {output_dir.name}", "",
        f"This is {what}, trained with GRPO (the group-relative policy optimization of DeepSeekMath) by grpokit's "
        f"recipe `{recipe.name}` on TRL {trl_version}'s GRPOTrainer.", "",
        f"- base model: {base_link}",
        f"- dataset: {data_link}" + ("" if recipe.dataset.get("reasoning_gym") else f" (split `{recipe.dataset.get('split', 'train')}`)"),
        f"- rewards: {rewards}",
        f"- steps trained: {global_step}" + (f" (the last session resumed at step {resumed_at} and trained "
                                             f"{global_step - resumed_at})" if resumed_at else ""),
        "- recipe: `recipe.yaml` in this folder, exactly as it ran (`python launch.py --recipe recipe.yaml`)",
        "- curves and sampled completions: `report.md`, `plots/training.png`", "",
        "## Load it", "", "```python", load, "```", "",
        ("A LoRA adapter loads on top of its base model; `python launch.py --merge <this folder>` writes a merged "
         "model that loads without PEFT." if recipe.lora else ""),
    ]
    return "\n".join(front + [""] + body).rstrip() + "\n"


def write_model_card(recipe, output_dir: Path, global_step: int, resumed_at: int | None = None) -> Path:
    """Write the card over the one TRL saved; returns its path."""
    import trl

    path = Path(output_dir) / CARD_FILE
    files.write_text(path, model_card(recipe, Path(output_dir), global_step, trl.__version__, resumed_at),
                     root=Path(output_dir))
    return path
