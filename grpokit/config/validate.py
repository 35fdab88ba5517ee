"""Validating a loaded recipe into typed sections, reporting every problem in one pass.

Sections: `model`, `lora`, `dataset`, `rewards`, `trainer`, `sampling` (and `base`, consumed by the
loader). `trainer` is checked against `trl.GRPOConfig` itself and `lora` against `peft.LoraConfig`,
plus the enumerations and ranges those libraries leave unchecked (TRL 1.16 accepts `beta: "high"`,
`loss_type: dapo2` or `max_completion_length: 0`, and PEFT accepts `r: 0`).

`validate` is the story; the rules between keys are `combinations`, the `rewards` entries `reward_entries`, and a
section a domain owns is checked by its owner (`tasks.check_source`, `tooluse.check`, `datavalues.data_file_problems`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from grpokit.prompts import tasks
from grpokit.tools import tooluse
from grpokit.warm_start import section as warmstart
from grpokit.config.combinations import check_combinations, check_sampling_metric
from grpokit.config.lint import RULE_NAMES
from grpokit.config.loader import CLI, Loaded, where_set_in
from grpokit.config.reward_entries import validate_rewards
from grpokit.config.sections import (DATASET, LINT, LORA_BOUNDS, LORA_DEFAULTS, MODEL, REQUIRED_SECTIONS, SAMPLING,
                                     SECTIONS, TRAINER_BOUNDS, TRAINER_REFUSED)
from grpokit.config.trainer_args import build_grpo_config
from grpokit.prompts.datavalues import data_file_problems, few_shot_fault
from grpokit.dist import num_processes_from_env
from grpokit.errors import Problems, nearest
from grpokit.fields import validate_dataclass_keys, validate_fields
from grpokit.tools.tooluse import TOOLS

# trl and peft are imported inside the functions that read them: loading a recipe imports neither (nor torch).


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
    lint: dict = field(default_factory=lambda: {"ignore": []})
    tools: dict | None = None  # the `tools` section (grpokit/tools/tooluse.py), None without one
    warm_start: dict | None = None  # the `warm_start` section (grpokit/warm_start/), None without one
    set_by: dict = field(default_factory=dict)  # key path -> the file (or "command line") that set it

    def where_set(self, key_path: str) -> str:
        """Where `key_path` (or its nearest set parent) was set, for a message to name: a file or "command line"."""
        return where_set_in(self.set_by, key_path, str(self.path))

    def blame(self, key_path: str) -> str:
        """What a message about the data `key_path` names (a dataset file, a split) names as its source: the recipe,
        or "command line" when that is where the value came from."""
        where = self.where_set(key_path)
        return where if where == CLI else str(self.path)

    def as_dict(self) -> dict:
        """What is saved as the resolved recipe next to a run: rerunnable as is."""
        return {
            "model": self.model,
            "lora": self.lora,
            "dataset": self.dataset,
            "rewards": self.rewards,
            "trainer": self.trainer,
            "sampling": self.sampling,
            **({"tools": self.tools} if self.tools else {}),
            **({"warm_start": self.warm_start} if self.warm_start else {}),
            **({"lint": self.lint} if self.lint.get("ignore") else {}),
        }


def recipe_name(path: Path) -> str:
    """`recipes/qwen2.5-3b/dapo.yaml` -> `qwen2.5-3b/dapo`; a file elsewhere -> its stem."""
    path = path.resolve()
    folders = path.parent.parts
    if "recipes" in folders:
        return "/".join(folders[len(folders) - folders[::-1].index("recipes"):] + (path.stem,))
    return path.stem


def default_output_dir(path: Path) -> Path:
    """`runs/<recipe name>` beside the recipe's `recipes/` folder (its project), or beside the recipe file when it is in
    none: the same folder from wherever a command runs.

    >>> str(default_output_dir(Path("/srv/project/recipes/qwen2.5-3b/dapo.yaml")))
    '/srv/project/runs/qwen2.5-3b/dapo'
    >>> str(default_output_dir(Path("/home/me/my_run.yaml")))
    '/home/me/runs/my_run'
    """
    path = path.resolve()
    folders = path.parent.parts
    if "recipes" in folders:
        project = Path(*folders[: len(folders) - 1 - folders[::-1].index("recipes")])
    else:
        project = path.parent
    return project / "runs" / recipe_name(path)


def anchored_output_dir(value: str, set_in: str) -> str:
    """`trainer.output_dir` as an absolute path, by the rule every path of a recipe follows: relative to the folder of
    the recipe file that sets it (a base recipe's own folder for a base), or, on the command line, to the folder the
    command runs in. `~` is the home directory. `..` is resolved; links are kept as written.

    >>> anchored_output_dir("runs/a", "/srv/project/recipes/my.yaml"), anchored_output_dir("/tmp/x", CLI)
    ('/srv/project/recipes/runs/a', '/tmp/x')
    """
    folder = Path.cwd() if set_in == CLI else Path(set_in).parent
    return os.path.normpath(folder / Path(value).expanduser())


def validate(loaded: Loaded, num_processes: int | None = None, data_files: bool = True) -> Recipe:
    """Check every section; raise `RecipeError` with all problems, or return the `Recipe`. `data_files=False` leaves
    the data files unchecked, for a command that reads a finished run and not its data (`--plot`).

    Three passes, each reporting all it finds: every section on its own (keys, types, bounds, its own rules), then
    the rules between keys (batch sizes against the process count, the generation engine, dynamic sampling), then,
    on values that passed ours, TRL's and PEFT's own checks.
    """
    data = loaded.data
    # Every message names the recipe by one absolute path, as the loader records where each key was set.
    path = loaded.path.resolve() if loaded.path.exists() else loaded.path.absolute()

    def where_set(key_path: str) -> str:
        return where_set_in(loaded.set_by, key_path, str(path))

    problems = Problems(file=str(path))
    _check_section_names(data, problems, where_set)
    model = _plain_section(data, "model", MODEL, problems, where_set)
    # an environment that makes its own prompts (reset() returns them) needs no dataset: TRL feeds it empty rows
    dataset = {} if environment_only(data) else _plain_section(data, "dataset", DATASET, problems, where_set)
    sampling = _plain_section(data, "sampling", SAMPLING, problems, where_set)
    lint = _plain_section(data, "lint", LINT, problems, where_set)
    _check_lint_rules(lint, problems, where_set)
    if dataset:
        _check_data_sources(dataset, problems, where_set, data_files)
    lora = _validate_lora(data.get("lora"), model, problems, where_set)
    trainer = _validate_trainer(data.get("trainer"), path, problems, where_set)
    rewards = validate_rewards(data.get("rewards"), trainer, problems, where_set)
    tools = _validate_tools(data, model, trainer, problems, where_set)
    warm_start = warmstart.check(data.get("warm_start"), data, problems, where_set,
                                 lambda raw, key: _lora_fields(raw, key, problems, where_set))
    if rewards:
        check_sampling_metric(sampling, [r["logged_as"] for r in rewards], problems, where_set)
    n_proc = num_processes or num_processes_from_env()
    if warm_start:
        warmstart.check_processes(n_proc, problems, where_set)
    check_combinations(trainer, model, dataset, sampling, n_proc, problems, where_set)
    problems.raise_if_any()
    _check_with_the_libraries(trainer, model, rewards, lora, n_proc, problems, where_set)
    problems.raise_if_any()
    for r in rewards:
        r.pop("logged_as")
    return Recipe(path, recipe_name(path), model, lora, dataset, rewards, trainer, sampling, n_proc, lint, tools,
                  warm_start, dict(loaded.set_by))


def _section_of(key: str) -> str | None:
    """`trainer.max_steps` for `max_steps`: the section a key given without one (`max_steps=3` on the command line)
    belongs to, first match in the order a recipe is read; None when no section has it. Read only on that mistake."""
    from dataclasses import fields

    from peft import LoraConfig
    from trl import GRPOConfig

    for section, names in (("model", MODEL), ("dataset", DATASET), ("trainer", [f.name for f in fields(GRPOConfig)]),
                           ("lora", [f.name for f in fields(LoraConfig)]), ("sampling", SAMPLING), ("tools", TOOLS)):
        if key in names:
            return f"{section}.{key}"
    return None


def _check_section_names(data: dict, problems: Problems, where_set) -> None:
    """Every top-level key names a recipe section, and each required section is there."""
    for key in data:
        if key not in SECTIONS:
            suggestion = nearest(str(key), SECTIONS) or _section_of(str(key))
            problems.add(str(key), "is not a recipe section", allowed=", ".join(SECTIONS), suggestion=suggestion,
                         file=where_set(str(key)))
    for key in REQUIRED_SECTIONS:
        if data.get(key) is None and not (key == "rewards" and data.get("tools")) and not (key == "dataset" and environment_only(data)):
            # an environment may own the reward (get_reward) and make the prompts (reset)
            problems.add(key, "section is required")


def _plain_section(data: dict, name: str, spec: dict, problems: Problems, where_set) -> dict:
    """A section of grpokit's own keys (`sections.py`), checked with its defaults filled; {} for a required section
    that is missing, which `_check_section_names` has said."""
    if name in REQUIRED_SECTIONS and data.get(name) is None:
        return {}
    return validate_fields(data.get(name) or {}, spec, name, problems, where_set)


def _check_lint_rules(lint: dict, problems: Problems, where_set) -> None:
    """`lint.ignore` names lint rules."""
    for i, name in enumerate(lint.get("ignore", [])):
        if name not in RULE_NAMES:
            problems.add(f"lint.ignore[{i}]", "is not a lint rule", name, ", ".join(RULE_NAMES), nearest(name, RULE_NAMES),
                         file=where_set("lint.ignore"))


def _check_data_sources(dataset: dict, problems: Problems, where_set, data_files: bool = True) -> None:
    """The training data is a hub dataset or a local file, never both; the held-out split is a local file or a split
    of the hub dataset, never both; a hub split needs a hub dataset; every data file named (`dataset.path`,
    `dataset.eval_path`) can be read, each blamed under its own key (`datavalues.data_file_problems`)."""
    sources = ("name", "path", "reasoning_gym")
    if sum(bool(dataset.get(k)) for k in sources) != 1:
        problems.add("dataset", "give exactly one of dataset.name (hub), dataset.path (local file) or dataset.reasoning_gym "
                     "(procedural tasks)", {k: dataset.get(k) for k in sources if dataset.get(k)} or None, file=where_set("dataset"))
    if dataset.get("reasoning_gym"):
        _check_task_source(dataset, problems, where_set)
    for i, shot in enumerate(dataset.get("few_shot") or []):
        fault = few_shot_fault(shot)
        if fault:
            problems.add(f"dataset.few_shot[{i}]", fault, shot, "{role: system|user|assistant|tool, content: text, "
                         "tool_calls (assistant): [{name, arguments: {...}}], name (tool)}", file=where_set("dataset.few_shot"))
    if dataset.get("eval_path") and dataset.get("eval_split"):
        problems.add("dataset.eval_split", "give one of dataset.eval_path (local file) or dataset.eval_split (hub split)",
                     dataset["eval_split"], file=where_set("dataset.eval_split"))
    elif dataset.get("eval_split") and not dataset.get("name"):
        problems.add("dataset.eval_split", "names a split of a hub dataset (dataset.name); for a local file set dataset.eval_path",
                     dataset["eval_split"], file=where_set("dataset.eval_split"))
    if dataset.get("eval_limit") and not (dataset.get("eval_path") or dataset.get("eval_split") or dataset.get("reasoning_gym")):
        problems.add("dataset.eval_limit", "limits held-out data the recipe does not name; set dataset.eval_path or dataset.eval_split",
                     dataset["eval_limit"], file=where_set("dataset.eval_limit"))
    if data_files:
        problems.extend(data_file_problems(dataset, where_set))


def _check_task_source(dataset: dict, problems: Problems, where_set) -> None:
    """`dataset.reasoning_gym` against reasoning-gym itself (`grpokit.prompts.tasks.check_source`), its defaults filled in; its
    problems have their own held-out set, so a file or split for one is refused."""
    dataset["reasoning_gym"], found = tasks.check_source(dataset["reasoning_gym"], where_set)
    problems.extend(found)
    for key in ("eval_path", "eval_split"):
        if dataset.get(key):
            problems.add(f"dataset.{key}", f"names held-out data, but dataset.reasoning_gym generates its own "
                         "(reasoning_gym.eval_size, eval_seed); leave it out", dataset[key], file=where_set(f"dataset.{key}"))


def _validate_lora(raw, model: dict, problems: Problems, where_set) -> dict | None:
    """The `lora` section against `peft.LoraConfig`'s own fields, on grpokit's defaults; None (a full fine-tune) when
    the recipe has none, which a quantized model cannot have."""
    lora = _lora_fields(raw, "lora", problems, where_set) if raw is not None else None
    if model.get("quantization") not in (None, "none") and lora is None:
        problems.add("model.quantization", "a quantized model cannot be fully fine-tuned; add a lora section (QLoRA)",
                     model["quantization"], file=where_set("model.quantization"))
    return lora


def _lora_fields(raw, key: str, problems: Problems, where_set) -> dict:
    """A LoRA mapping (`lora`, `warm_start.lora`) against `peft.LoraConfig`'s own fields, on grpokit's defaults."""
    from peft import LoraConfig

    return {**LORA_DEFAULTS, **validate_dataclass_keys(raw, LoraConfig, key, problems, LORA_BOUNDS, where_set)}


def _validate_trainer(raw, recipe_path: Path, problems: Problems, where_set) -> dict:
    """The `trainer` section against `trl.GRPOConfig`'s own fields, with grpokit's defaults: output_dir
    runs/<recipe name> beside the recipe's project (`default_output_dir`), report_to none. The output_dir is made
    absolute (`anchored_output_dir`), so every message names the one folder a run uses wherever the command runs."""
    from trl import GRPOConfig

    trainer = validate_dataclass_keys(raw or {}, GRPOConfig, "trainer", problems, TRAINER_BOUNDS, where_set,
                                      refuse=TRAINER_REFUSED)
    if "output_dir" in trainer and not (isinstance(trainer["output_dir"], str) and trainer["output_dir"].strip()):
        # GRPOConfig types it `str | None`, so null (`trainer.output_dir=` on the command line) passed the type check
        problems.add("trainer.output_dir", "must be a folder path; leave the key out for the default runs/<recipe name>",
                     trainer.pop("output_dir"), file=where_set("trainer.output_dir"))
    if "output_dir" in trainer:
        trainer["output_dir"] = anchored_output_dir(trainer["output_dir"], where_set("trainer.output_dir"))
    trainer.setdefault("output_dir", str(default_output_dir(recipe_path)))
    trainer.setdefault("report_to", "none")
    return trainer


def _check_with_the_libraries(trainer: dict, model: dict, rewards: list[dict], lora: dict | None, n_proc: int,
                              problems: Problems, where_set) -> None:
    """TRL's and PEFT's own checks, on values that passed ours: their messages are reworded, not shown raw."""
    from peft import LoraConfig

    try:
        build_grpo_config(trainer, model, rewards, num_processes=n_proc)
    except (ValueError, TypeError) as err:
        problems.add("trainer", f"TRL rejects this configuration: {err}", file=where_set("trainer"))
    if lora is not None:
        try:
            LoraConfig(**lora)
        except (ValueError, TypeError) as err:
            problems.add("lora", f"PEFT rejects this configuration: {err}", file=where_set("lora"))


def _validate_tools(data: dict, model: dict, trainer: dict, problems: Problems, where_set) -> dict | None:
    """The `tools` section (grpokit/tools/tooluse.py) and the keys that act with it: `model.chat_template` names one of TRL's
    templates, `trainer.max_tool_calling_iterations` needs tools, and a run without a `rewards` section needs an
    environment whose `get_reward` scores each rollout."""
    name = model.get("chat_template")
    if name is not None and name not in tooluse.template_names():
        problems.add("model.chat_template", "is not one of TRL's chat templates", name, ", ".join(tooluse.template_names()),
                     nearest(name, tooluse.template_names()), file=where_set("model.chat_template"))
    if data.get("tools") is None:
        if trainer.get("max_tool_calling_iterations") is not None:
            problems.add("trainer.max_tool_calling_iterations", "bounds tool-calling rounds, and the recipe has no tools "
                         "section", trainer["max_tool_calling_iterations"], file=where_set("trainer.max_tool_calling_iterations"))
        return None
    section = validate_fields(data["tools"], TOOLS, "tools", problems, where_set)
    if environment_only(data):
        _check_environment_only(trainer, problems, where_set)
    dataset = data.get("dataset") if isinstance(data.get("dataset"), dict) else {}
    toolset = tooluse.check(section, problems, where_set, few_shot=dataset.get("few_shot")) if section else None
    if data.get("rewards") is None and toolset is not None and not toolset.owns_reward:
        problems.add("rewards", "section is required: the recipe names no reward, and its tools.environment "
                     f"{'(' + toolset.environment.__name__ + ') ' if toolset.environment else ''}defines no get_reward() "
                     "to score a rollout", file=where_set("tools"))
    return section


def environment_only(data: dict) -> bool:
    """A recipe with a tools.environment and no dataset section: the environment's reset() makes every prompt."""
    return data.get("dataset") is None and isinstance(data.get("tools"), dict) and bool(data["tools"].get("environment"))


def _check_environment_only(trainer: dict, problems: Problems, where_set) -> None:
    """Without a dataset TRL drives the loop with empty rows: only max_steps says how long, and nothing is held out."""
    if not (isinstance(trainer.get("max_steps"), int) and trainer["max_steps"] > 0):
        problems.add("trainer.max_steps", "must be set (> 0): the recipe has no dataset, its tools.environment makes the "
                     "prompts, so no dataset length can say how long to train", trainer.get("max_steps"),
                     file=where_set("trainer.max_steps"))
    if trainer.get("eval_strategy", "no") not in ("no", None):
        problems.add("trainer.eval_strategy", "evaluates on held-out prompts, and the recipe has no dataset (its environment "
                     "makes the prompts); add a dataset section with held-out data, or leave eval_strategy at 'no'",
                     trainer["eval_strategy"], file=where_set("trainer.eval_strategy"))
