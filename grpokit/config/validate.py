"""Validating a loaded recipe into typed sections, reporting every problem in one pass.

Sections: `model`, `lora`, `dataset`, `rewards`, `trainer`, `sampling` (and `base`, consumed by the
loader). `trainer` is checked against `trl.GRPOConfig` itself and `lora` against `peft.LoraConfig`,
plus the enumerations and ranges those libraries leave unchecked (TRL 1.16 accepts `beta: "high"`,
`loss_type: dapo2` or `max_completion_length: 0`, and PEFT accepts `r: 0`).
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import rewards
from grpokit import tasks, tooluse
from grpokit.config.engine import check_knobs
from grpokit.config.lint import RULE_NAMES
from grpokit.config.loader import CLI, Loaded, where_set_in
from grpokit.config.sections import (DATASET, LINT, LORA_BOUNDS, LORA_DEFAULTS, MODEL, PER_GROUP, REQUIRED_SECTIONS, REWARD_ENTRY,
                                     SAMPLING, SECTIONS, TOTAL_REWARD, TRAINER_BOUNDS, TRAINER_REFUSED)
from grpokit.config.trainer_args import build_grpo_config
from grpokit.datavalues import data_file_problems
from grpokit.dist import num_processes_from_env
from grpokit.errors import Problem, Problems, nearest
from grpokit.fields import non_finite, validate_dataclass_keys, validate_fields
from grpokit.tooluse import TOOLS
from grpokit.trl_compat import TRL_REWARD_KEYWORDS

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
    tools: dict | None = None  # the `tools` section (grpokit/tooluse.py), None without one
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
    rewards = _validate_rewards(data.get("rewards"), trainer, problems, where_set)
    tools = _validate_tools(data, model, trainer, problems, where_set)
    if rewards:
        check_sampling_metric(sampling, [r["logged_as"] for r in rewards], problems, where_set)
    n_proc = num_processes or num_processes_from_env()
    _check_combinations(trainer, model, dataset, sampling, n_proc, problems, where_set)
    problems.raise_if_any()
    _check_with_the_libraries(trainer, model, rewards, lora, n_proc, problems, where_set)
    problems.raise_if_any()
    for r in rewards:
        r.pop("logged_as")
    return Recipe(path, recipe_name(path), model, lora, dataset, rewards, trainer, sampling, n_proc, lint, tools,
                  dict(loaded.set_by))


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


FEW_SHOT_ROLES = ("system", "user", "assistant", "tool")


def few_shot_fault(shot) -> str | None:
    """What is wrong with one `dataset.few_shot` message, or None.

    >>> few_shot_fault({"role": "assistant", "tool_calls": [{"name": "add", "arguments": {"a": 1}}]}) is None
    True
    >>> few_shot_fault({"role": "bot", "content": "hi"})
    "its role 'bot' is not one of system, user, assistant, tool"
    """
    if not isinstance(shot, dict):
        return "is not a message mapping"
    unknown = [k for k in shot if k not in ("role", "content", "tool_calls", "name")]
    if unknown:
        return f"has key(s) {', '.join(map(str, unknown))} a chat message does not"
    if shot.get("role") not in FEW_SHOT_ROLES:
        return f"its role {shot.get('role')!r} is not one of {', '.join(FEW_SHOT_ROLES)}"
    if shot.get("content") is not None and not isinstance(shot["content"], str):
        return "its content is not text"
    calls = shot.get("tool_calls")
    if calls is not None:
        if shot["role"] != "assistant":
            return "has tool_calls, which only an assistant message makes"
        if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                                  and isinstance(c.get("arguments", {}), dict) for c in calls):
            return "its tool_calls must be a list of {name: text, arguments: mapping}"
    elif not isinstance(shot.get("content"), str):
        return "has neither content nor tool_calls"
    return None


def _check_task_source(dataset: dict, problems: Problems, where_set) -> None:
    """`dataset.reasoning_gym` against reasoning-gym itself (`grpokit.tasks.check_source`), its defaults filled in; its
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
    from peft import LoraConfig

    lora = None
    if raw is not None:
        lora = {**LORA_DEFAULTS, **validate_dataclass_keys(raw, LoraConfig, "lora", problems, LORA_BOUNDS, where_set)}
    if model.get("quantization") not in (None, "none") and lora is None:
        problems.add("model.quantization", "a quantized model cannot be fully fine-tuned; add a lora section (QLoRA)",
                     model["quantization"], file=where_set("model.quantization"))
    return lora


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


def _check_combinations(trainer: dict, model: dict, dataset: dict, sampling: dict, n_proc: int, problems: Problems,
                        where_set) -> None:
    """The rules between keys, in one section or across sections and the process count, once each key is checked."""
    if trainer.get("bf16") is True and trainer.get("fp16") is True:
        problems.add("trainer.fp16", "cannot be true together with trainer.bf16; set one (or neither: model.dtype picks)",
                     True, file=where_set("trainer.fp16"))
    if trainer.get("eval_strategy", "no") not in ("no", None) and dataset and not (
            dataset.get("eval_path") or dataset.get("eval_split") or dataset.get("reasoning_gym")):
        problems.add("trainer.eval_strategy", "evaluates on held-out data the recipe does not name; set dataset.eval_path "
                     "(a local file) or dataset.eval_split (a hub split), or leave eval_strategy at 'no'",
                     trainer["eval_strategy"], file=where_set("trainer.eval_strategy"))
    _check_batch(trainer, n_proc, problems, where_set)
    check_knobs(trainer, model, n_proc, problems, where_set)
    if sampling.get("dynamic"):
        _check_dynamic_sampling(trainer, problems, where_set)


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


def _validate_rewards(raw, trainer: dict, problems: Problems, where_set) -> list[dict]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        problems.add("rewards", "must be a non-empty list of {name, weight, args}", raw, file=where_set("rewards"))
        return []
    out, seen = [], {}
    for i, item in enumerate(raw):
        path = f"rewards[{i}]"
        if isinstance(item, str):  # shorthand: "- accuracy"
            item = {"name": item}
        entry = validate_fields(item, REWARD_ENTRY, path, problems, lambda p: where_set(_dotted(p)))
        if "name" not in entry:
            continue
        args = dict(entry.get("args") or {})
        bad = {arg: non_finite(value) for arg, value in args.items() if non_finite(value) is not None}
        for arg, value in bad.items():  # a user reward's own checks may miss it: refused for every reward alike
            problems.add(f"{path}.args.{arg}", "must be a finite number", value, file=where_set(f"rewards.{i}.args.{arg}"))
        if bad:
            continue
        try:
            e = rewards.bind(entry["name"], args)
            for arg, key_path in e.from_recipe.items():
                if args.get(arg) is None:
                    section, _, key = key_path.partition(".")
                    args[arg] = _knob(trainer, key) if section == "trainer" else None
            rewards.build(entry["name"], **args)
        except rewards.RewardNameError as err:
            problems.add(f"{path}.name", str(err), file=where_set(f"rewards.{i}.name"))
            continue
        except rewards.RewardError as err:  # blamed on where the argument at fault was set (a command-line override, say)
            problems.add(f"{path}.args", str(err), file=where_set(f"rewards.{i}.args.{err.arg}" if err.arg in args else f"rewards.{i}.args"))
            continue
        if e.name in seen:
            problems.add(f"{path}.name", f"reward {e.name!r} is listed twice (also rewards[{seen[e.name]}]); TRL logs them under one name",
                         file=where_set(f"rewards.{i}.name"))
        seen[e.name] = i
        out.append({"name": entry["name"], "weight": entry["weight"], "args": args, "logged_as": e.name})
    return out


def _validate_tools(data: dict, model: dict, trainer: dict, problems: Problems, where_set) -> dict | None:
    """The `tools` section (grpokit/tooluse.py) and the keys that act with it: `model.chat_template` names one of TRL's
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


def _dotted(path: str) -> str:
    """`rewards[0].args.char` -> `rewards.0.args.char`: how the loader records where a key was set."""
    return path.replace("[", ".").replace("]", "")


def reward_column_problems(entries: list[dict], columns: list[str], file: str | None = None) -> list[Problem]:
    """The rewards against the prepared dataset's columns: the gold column each reads, and what each requires."""
    return gold_column_problems(entries, columns, file) + reward_call_problems(entries, columns, file)


def gold_column_problems(entries: list[dict], columns: list[str], file: str | None = None) -> list[Problem]:
    """A reward reading a gold column (`gold_column` arg, given or its default) needs that column in the prepared data."""
    problems = []
    for i, r in enumerate(entries):
        param = rewards.arg_parameters(rewards.resolve(r["name"]).target).get("gold_column")
        col = r["args"].get("gold_column", None if param is None or param.default is param.empty else param.default)
        if isinstance(col, str) and col not in columns:
            hint = " (set dataset.answer_column to expose a column as `answer`)" if col == "answer" else ""
            problems.append(Problem(f"rewards[{i}].args.gold_column", f"names no column of the prepared dataset{hint}", col,
                                    ", ".join(columns), file=file))
    return problems


def reward_call_problems(entries: list[dict], columns: list[str], file: str | None = None) -> list[Problem]:
    """A reward's required call parameters must be among what TRL passes: its keywords and the dataset's columns.

    `def f(completions, solution, **kwargs)` on data without a `solution` column passed --check, then raised
    TypeError at the first step. Parameters with a default are optional and not checked.
    """
    passed = [c for c in columns if c not in ("prompt", "completion", "completion_ids")]
    problems = []
    for i, entry in enumerate(entries):
        target = rewards.resolve(entry["name"]).target
        try:
            sig = inspect.signature(target.__call__ if inspect.isclass(target) else target)
        except (TypeError, ValueError):
            continue  # validation already refused a reward whose signature cannot be read
        for name, param in sig.parameters.items():
            if (name == "self" or param.default is not param.empty or name in passed or name in TRL_REWARD_KEYWORDS
                    or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD)):
                continue
            hint = "; set dataset.answer_column to pass a gold column as `answer`" if name == "answer" else ""
            problems.append(Problem(f"rewards[{i}].name", f"reward {getattr(target, '__name__', entry['name'])!r} requires {name!r}, "
                                    f"which TRL does not pass: it passes {', '.join(TRL_REWARD_KEYWORDS[:4])} and the "
                                    f"dataset columns: {', '.join(passed)}{hint}",
                                    suggestion=nearest(name, passed), file=file))
    return problems


def _knob(trainer: dict, key: str):
    """The trainer section's value for `key`, else `GRPOConfig`'s own default (None for no such field)."""
    if key in trainer:
        return trainer[key]
    import dataclasses

    from trl import GRPOConfig

    return next((f.default for f in dataclasses.fields(GRPOConfig) if f.name == key), None)


def _check_batch(trainer: dict, n_proc: int, problems: Problems, where_set) -> None:
    """The generation batch must hold whole prompt groups: TRL checks this only with its own world size."""
    per_device, num_gen, accum, gen_bs, spg = (_knob(trainer, k) for k in (
        "per_device_train_batch_size", "num_generations", "gradient_accumulation_steps", "generation_batch_size",
        "steps_per_generation"))
    if not all(isinstance(v, int) and v > 0 for v in (per_device, num_gen, accum)):
        return  # already reported as a type or range problem
    if gen_bs is not None and spg is not None:
        problems.add("trainer.generation_batch_size", "cannot be set together with trainer.steps_per_generation; set one",
                     gen_bs, file=where_set("trainer.generation_batch_size"))
        return
    global_batch = per_device * n_proc
    if gen_bs is not None:
        if gen_bs % global_batch:
            problems.add("trainer.generation_batch_size",
                         f"must be divisible by the global batch per_device_train_batch_size ({per_device}) x processes ({n_proc}) = {global_batch}",
                         gen_bs, file=where_set("trainer.generation_batch_size"))
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
            file=where_set("trainer.num_generations"),
        )


def check_sampling_metric(sampling: dict, reward_names: list[str], problems: Problems, where_set=lambda p: None) -> None:
    """`sampling.metric` must be the weighted total or the logged name of one of the rewards."""
    metric = sampling.get("metric")
    if isinstance(metric, str) and metric != TOTAL_REWARD and metric not in reward_names:
        allowed = [TOTAL_REWARD] + [n for n in reward_names if n != TOTAL_REWARD]
        problems.add("sampling.metric", "names no reward of this recipe", metric, ", ".join(allowed), nearest(metric, allowed),
                     file=where_set("sampling.metric"))


def sampling_settings(sampling: dict | None, reward_names: list[str] | None = None) -> dict:
    """A `sampling:` mapping checked by the same rules as a recipe's, defaults filled; `ValueError` listing every
    problem. For the dynamic-sampling trainer built directly (not from a recipe); `metric` is checked when the
    reward names are given.

    >>> sampling_settings({"dynamic": True}, ["char_fraction"])
    {'dynamic': True, 'max_rounds': 4, 'metric': 'reward'}
    """
    problems = Problems()
    settings = validate_fields(sampling or {}, SAMPLING, "sampling", problems)
    if reward_names is not None and not problems:
        check_sampling_metric(settings, list(reward_names), problems)
    if problems:
        raise ValueError("\n".join(p.format() for p in problems.items))
    return settings


def batch_level_knobs(scale_rewards, multi_objective_aggregation) -> dict:
    """The advantage knobs (name -> value) that make advantages depend on the whole batch: dynamic sampling
    builds a batch from several generation rounds, whose statistics must not mix.

    >>> batch_level_knobs(True, "sum_then_normalize"), batch_level_knobs("batch", "sum_then_normalize")
    ({}, {'scale_rewards': 'batch'})
    """
    given = {"scale_rewards": {True: "group", False: "none"}.get(scale_rewards, scale_rewards),  # TRL's bool forms
             "multi_objective_aggregation": multi_objective_aggregation}
    return {knob: value for knob, value in given.items() if value not in PER_GROUP[knob]}


def check_group_layout(per_device_train_batch_size: int, steps_per_generation: int, num_generations: int) -> None:
    """Each process's generation batch must hold whole prompt groups, or a group would straddle two ranks.

    >>> check_group_layout(8, 1, 4)
    """
    local = per_device_train_batch_size * steps_per_generation
    if local % num_generations:
        fix = num_generations // math.gcd(num_generations, steps_per_generation)
        raise ValueError(
            f"dynamic sampling needs each process's generation batch, per_device_train_batch_size x "
            f"steps_per_generation ({per_device_train_batch_size} x {steps_per_generation} = {local}), to be a "
            f"multiple of num_generations ({num_generations}), so that every prompt group stays on one process; "
            f"set per_device_train_batch_size to a multiple of {fix}."
        )


def _check_dynamic_sampling(trainer: dict, problems: Problems, where_set) -> None:
    """What the dynamic-sampling trainer would refuse at init, said before any weight loads."""
    for knob, value in batch_level_knobs(_knob(trainer, "scale_rewards"), _knob(trainer, "multi_objective_aggregation")).items():
        problems.add(f"trainer.{knob}", "cannot be used with sampling.dynamic: batch-level statistics would mix "
                     "the generation rounds a batch is built from", value, ", ".join(PER_GROUP[knob]), file=where_set(f"trainer.{knob}"))
    per_device, num_gen = _knob(trainer, "per_device_train_batch_size"), _knob(trainer, "num_generations")
    steps = _knob(trainer, "steps_per_generation") or _knob(trainer, "gradient_accumulation_steps")
    if trainer.get("generation_batch_size") and trainer.get("steps_per_generation") is None:
        return  # steps per generation follow from the process count: the trainer checks it at init
    if all(isinstance(v, int) and v > 0 for v in (per_device, num_gen, steps)):
        try:
            check_group_layout(per_device, steps, num_gen)
        except ValueError as err:
            problems.add("trainer.per_device_train_batch_size", str(err), per_device, file=where_set("trainer.per_device_train_batch_size"))
