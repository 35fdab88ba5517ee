"""The `rewards` section: each entry bound against its reward (the registry's or a user's file), and, once the data is
prepared, the entries against its columns (what TRL passes a reward is the dataset's columns and its own keywords).
"""

from __future__ import annotations

import inspect

import rewards
from grpokit.config.combinations import trainer_value
from grpokit.config.sections import REWARD_ENTRY
from grpokit.errors import Problem, Problems, nearest
from grpokit.fields import non_finite, validate_fields
from grpokit.trl_compat import TRL_REWARD_KEYWORDS


def validate_rewards(raw, trainer: dict, problems: Problems, where_set) -> list[dict]:
    """Each entry (a name, or {name, weight, args}) bound against its reward's signature and built once, with the
    name TRL logs it under (`logged_as`); an argument the reward takes from the trainer section is filled from it."""
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
            e, faults = rewards.bind_all(entry["name"], args)
        except rewards.RewardNameError as err:
            problems.add(f"{path}.name", str(err), file=where_set(f"rewards.{i}.name"))
            continue
        except rewards.RewardError as err:  # its call signature does not fit TRL's
            faults = [err]
            e = None
        if e is not None:
            for arg, key_path in e.from_recipe.items():
                if args.get(arg) is None:
                    section, _, key = key_path.partition(".")
                    args[arg] = trainer_value(trainer, key) if section == "trainer" else None
            # Every key at once: with an unknown key, the values of the keys it does take are still checked.
            known = {k: v for k, v in args.items() if k in rewards.arg_parameters(e.target)}
            if faults:
                faults += rewards.value_faults(entry["name"], known, tuple(e.from_recipe))
            else:
                try:
                    rewards.build(entry["name"], **args)
                except rewards.RewardError as err:
                    faults = rewards.value_faults(entry["name"], args, tuple(e.from_recipe)) or [err]
        for err in faults:  # blamed on where each argument was set (a command-line override, say)
            problems.add(f"{path}.args", str(err), file=where_set(f"rewards.{i}.args.{err.arg}" if err.arg in args
                                                                  else f"rewards.{i}.args"))
        if faults:
            continue
        if e.name in seen:
            problems.add(f"{path}.name", f"reward {e.name!r} is listed twice (also rewards[{seen[e.name]}]); TRL logs them under one name",
                         file=where_set(f"rewards.{i}.name"))
        seen[e.name] = i
        out.append({"name": entry["name"], "weight": entry["weight"], "args": args, "logged_as": e.name})
    return out


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
