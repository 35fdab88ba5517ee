"""reasoning-gym's procedural tasks as a recipe's dataset (`dataset.reasoning_gym`): checked, generated, explained.

reasoning-gym (`reasoning_gym.factory.DATASETS`: ~100 generators, each with a config dataclass and its own
`score_answer`) makes problems locally, from a seed: nothing is downloaded. A recipe names one task or a weighted mix,
how many problems, and a seed::

    dataset:
      reasoning_gym:
        tasks: [{name: leg_counting, config: {min_animals: 1, max_animals: 2}}]
        size: 1000         # training problems
        seed: 1
        eval_size: 100     # held-out problems for --eval, from eval_seed (default: seed + size)

Problem i of a task is drawn from `Random(seed + i)` (a mix offsets each task's seed by its position, the same for
both sets), so training uses the seeds [seed, seed + size) and the held-out set [eval_seed, eval_seed + eval_size):
the two ranges must not meet (held-out seed 2 next to training seed 1 would repeat all but one problem). A
held-out problem whose question still equals a training one (a small task space repeats itself) is dropped, with a
count. Each row carries `task_item` (the source and the problem's index), from which the `task_score` reward
rebuilds the problem and scores a completion with the task's own `score_answer`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields

from grpokit.errors import Problem, Problems, RecipeError, nearest
from grpokit.fields import Field, validate_dataclass_keys, validate_fields
# build and registry are made in taskgen (a leaf the scorer's cage imports too), reached through this module as well
from grpokit.taskgen import Died, Expensive, Failed, blame, bounds, build, produce, registry  # noqa: F401

# The column `task_score` reads: {"source": {tasks, size, seed}, "index": i, "entry": the problem, pickled (taskgen.row)}
ITEM_COLUMN = "task_item"
KEY = "dataset.reasoning_gym"
# Keys of a task's own config that the source sets for every task alike.
OWN_KEYS = {"seed": f"is set for every task by {KEY}.seed (and eval_seed)",
            "size": f"is set for every task by {KEY}.size (and eval_size)"}

# The section's keys (`dataset.reasoning_gym`): one reasoning-gym task or a weighted mix, generated from seeds.
REASONING_GYM = {
    "tasks": Field(list, doc="[{name, weight, config}]: reasoning-gym task names, each with its own config keys",
                   shape="a list of tasks, one entry each: tasks: [{name: chain_sum, weight: 1, config: {max_terms: 3}}] "
                   "(weight and config may be left out, and an entry may be the bare name)"),
    # Bounds: every problem is generated at --check and before training (a countdown problem takes ~10 ms).
    "size": Field(int, 1000, "training problems", min=1, max=1_000_000),
    "seed": Field(int, 1, "problem i of training is drawn from seed + i", min=0, max=2**31),
    "eval_size": Field(int, 100, "held-out problems for --eval and trainer.eval_strategy", min=1, max=100_000),
    "eval_seed": Field(int | None, None, "the held-out set's first seed; default seed + size, the first past training's",
                       min=0, max=2**31),
}
TASK_ENTRY = {
    "name": Field(str, doc="a reasoning-gym task (reasoning_gym.factory.DATASETS)"),
    "weight": Field(float, 1.0, "its share of a mix's problems, relative to the others'", gt=0.0),
    "config": Field(dict, {}, "the task's own config keys (its config dataclass), but seed and size"),
}


def version() -> str:
    from importlib.metadata import version as installed

    return installed("reasoning-gym")


def eval_seed(source: dict) -> int:
    """The held-out set's first seed: `eval_seed`, or the first seed past training's (`seed + size`).

    >>> eval_seed({"seed": 1, "size": 1000, "eval_seed": None})
    1001
    """
    return source["eval_seed"] if source.get("eval_seed") is not None else source["seed"] + source["size"]


def check_source(raw, where_set=lambda p: None) -> tuple[dict, list[Problem]]:
    """`dataset.reasoning_gym` with its defaults filled, and every problem with it: the keys, each task's name against
    reasoning-gym's registry, each config key against the task's config dataclass (its type), the config as the task's
    own `validate()` judges it, a mix's names listed once, the held-out seeds apart from training's.

    >>> source, problems = check_source({"tasks": ["leg_countin"]})
    >>> problems[0].path, problems[0].suggestion
    ('dataset.reasoning_gym.tasks[0].name', 'leg_counting')
    """
    problems = Problems()
    mapped = isinstance(raw, dict) and isinstance(raw.get("tasks"), dict)
    if mapped:  # said with the list it meant, not as a type
        problems.add(f"{KEY}.tasks", "is a mapping, and tasks are a list, one entry per task; write it as tasks: "
                     + as_list(raw["tasks"]), file=where_set(f"{KEY}.tasks"))
        raw = {k: v for k, v in raw.items() if k != "tasks"}
    source = validate_fields(raw, REASONING_GYM, KEY, problems, where_set)
    if mapped:  # said above, so not as "is required" too
        problems.items = [p for p in problems.items if (p.path, p.message) != (f"{KEY}.tasks", "is required")]
    tasks, seen = [], {}
    raw_tasks = source.get("tasks") if isinstance(source.get("tasks"), list) else []
    if "tasks" in source and not raw_tasks:
        problems.add(f"{KEY}.tasks", "must list at least one task", source["tasks"], file=where_set(f"{KEY}.tasks"))
    known = registry() if raw_tasks else {}
    for i, item in enumerate(raw_tasks):
        task = _check_task(i, item, known, seen, problems, where_set)
        if task is not None:
            tasks.append(task)
    if "tasks" in source:
        source["tasks"] = tasks
    _check_seeds(source, problems, where_set)
    return source, problems.items


def _check_task(i: int, item, known: dict, seen: dict, problems: Problems, where_set) -> dict | None:
    """Entry i of the task list, checked (its name against the registry and the earlier entries, its config keys and
    values, the task's own rules) and with its defaults filled; None when it cannot be used."""
    path, dotted = f"{KEY}.tasks[{i}]", f"{KEY}.tasks.{i}"
    if isinstance(item, str):  # shorthand: "- leg_counting"
        item = {"name": item}
    entry = validate_fields(item, TASK_ENTRY, path, problems, lambda p, d=dotted, s=path: where_set(p.replace(s, d)))
    name = entry.get("name")
    if name is None:
        return None
    if name not in known:
        problems.add(f"{path}.name", "is not a reasoning-gym task", name,
                     f"the {len(known)} tasks of reasoning-gym {version()} (python -c \"import reasoning_gym; "
                     "print(sorted(reasoning_gym.factory.DATASETS))\")", nearest(name, known) or nearest(name, known, 0.4),
                     file=where_set(f"{dotted}.name"))
        return None
    if name in seen:
        problems.add(f"{path}.name", f"task {name!r} is listed twice (also tasks[{seen[name]}]); give it one entry and weight",
                     name, file=where_set(f"{dotted}.name"))
        return None
    seen[name] = i
    config_cls = known[name][1]
    given = entry.get("config") or {}
    keys = [f.name for f in fields(config_cls) if f.init and f.name not in OWN_KEYS]
    for key in given:
        if key not in keys and key not in OWN_KEYS:
            problems.add(f"{path}.config.{key}", f"is not a config key of task {name}", allowed=", ".join(keys) or "none",
                         suggestion=nearest(key, keys), file=where_set(f"{dotted}.config.{key}"))
    given = {k: v for k, v in given.items() if k in keys or k in OWN_KEYS}
    config = validate_dataclass_keys(given, config_cls, f"{path}.config", problems, {},
                                     lambda p, d=dotted, s=path: where_set(p.replace(s, d)), refuse=OWN_KEYS)
    # the keys that passed are judged too (the others at their defaults), so a typo does not hide a bad value
    problem = _config_refused(name, config, path, where_set(f"{dotted}.config"))
    if problem:
        problems.items.append(problem)
    return {"name": name, "weight": entry.get("weight", 1.0), "config": config}


def as_list(mapping: dict) -> str:
    """A task list written as a mapping, as the list it meant (YAML flow style): one entry's own keys, or task names
    mapped to their configs.

    >>> as_list({"chain_sum": {"max_terms": 3}, "leg_counting": None})
    '[{name: chain_sum, config: {max_terms: 3}}, {name: leg_counting}]'
    """
    import yaml

    if "name" in mapping:
        entries = [mapping]
    else:
        entries = [{"name": k, **({"config": v} if v else {})} for k, v in mapping.items()]
    return yaml.safe_dump(entries, default_flow_style=True, sort_keys=False, width=10**6).strip()


def _config_refused(name: str, config: dict, path: str, file: str | None) -> Problem | None:
    """The task's own `validate()` on `config` (reasoning-gym states its ranges as assertions): the rule it states,
    blamed on the config key it names."""
    config_cls = registry()[name][1]
    try:
        built = config_cls(**config)
        if hasattr(built, "validate"):
            built.validate()
    except Exception as err:  # noqa: BLE001 - reasoning-gym states its rules as asserts; any refusal is the config's
        rule = str(err) or "a value outside what the task accepts (its validate() gives no reason)"
        key = next((k for k in sorted(config, key=len, reverse=True) if k in rule), None)
        where = f"{path}.config.{key}" if key else f"{path}.config"
        value = config[key] if key else config
        return Problem(where, f"is refused by reasoning-gym's {name} config", value, rule, file=file)
    return None


def _check_seeds(source: dict, problems: Problems, where_set) -> None:
    """The held-out seeds [eval_seed, eval_seed + eval_size) must miss training's [seed, seed + size)."""
    if not all(isinstance(source.get(k), int) for k in ("seed", "size", "eval_size")):
        return
    start, size, n = eval_seed(source), source["size"], source["eval_size"]
    seed = source["seed"]
    if start < seed + size and seed < start + n:
        problems.add(f"{KEY}.eval_seed", f"its held-out problems come from seeds {start}..{start + n - 1}, which meet "
                     f"training's {seed}..{seed + size - 1} (reasoning-gym draws problem i from seed + i), so held-out "
                     "problems would repeat training ones", start,
                     f"eval_seed >= {seed + size}" + (f" or eval_seed <= {seed - n}" if seed - n >= 0 else "")
                     + f"; e.g. {seed + size} (or leave it out: seed + size)",
                     file=where_set(f"{KEY}.eval_seed"))


def _part(source: dict, heldout: bool) -> dict:
    """The {tasks, size, seed} of the training set, or of the held-out set."""
    if heldout:
        return {"tasks": source["tasks"], "size": source["eval_size"], "seed": eval_seed(source)}
    return {"tasks": source["tasks"], "size": source["size"], "seed": source["seed"]}


@dataclass(frozen=True)
class Generated:
    rows: tuple  # dicts: prompt, answer, task, task_item
    repeats: int  # held-out problems dropped because a training problem has the same question


def _key(source: dict) -> str:
    return json.dumps({k: source.get(k) for k in ("tasks", "size", "seed", "eval_size", "eval_seed")}, sort_keys=True)


def _parts(source: dict) -> list[dict]:
    return [_part(source, False), _part(source, True)]


@functools.lru_cache(maxsize=8)
def _made(key: str) -> tuple:
    """Both sets' rows (`taskgen.row`), made at once in one bounded child process (`taskgen.produce`): every
    caller needs training's, and the held-out set is small beside it."""
    source = json.loads(key)
    parts = _parts(source)
    try:
        return tuple(produce(parts))
    except Expensive as err:
        which = ("training", "held-out")[err.part]
        named = blame(source["tasks"], err.bound, KEY)
        value = source["size"] if named.value is None else named.value
        raise RecipeError([Problem(named.path, f"reasoning-gym's {' + '.join(t['name'] for t in source['tasks'])} "
                                   f"{err.what} ({which} problem {err.index}, seeds from {parts[err.part]['seed']}): "
                                   f"{named.why}", value, f"the bound: {bounds()}; " + (
                                       "a smaller size" if named.path == f"{KEY}.size" else
                                       "a value nearer its default, or a smaller size" if ".config." in named.path else
                                       "another task: this one at its defaults is past the bound"))]) from None
    except Died as err:  # facts only: how it ended, the last line it printed, the limits it ran under
        which = ("training", "held-out")[err.part]
        raise RecipeError([Problem(f"{KEY}.tasks", f"the process making reasoning-gym's "
                                   f"{' + '.join(t['name'] for t in source['tasks'])} problems died at {which} problem "
                                   f"{err.index} (seeds from {parts[err.part]['seed']}): {err.what}",
                                   [t["name"] for t in source["tasks"]], f"the bound: {bounds()}")]) from None
    except Failed as err:  # a config the task accepted but cannot generate from: said, not a traceback
        which = ("training", "held-out")[err.part]
        raise RecipeError([Problem(f"{KEY}.tasks", f"reasoning-gym could not generate {which} problem {err.index} (seed "
                                   f"{parts[err.part]['seed']}): {err.shown}",
                                   [t["name"] for t in source["tasks"]])]) from None
    except RuntimeError as err:
        raise RecipeError([Problem(KEY, str(err))]) from None


@functools.lru_cache(maxsize=8)
def _generate(key: str, heldout: bool) -> Generated:
    source = json.loads(key)
    part = _part(source, heldout)
    shown = {k: part[k] for k in ("tasks", "size", "seed")}
    rows, repeats = [], 0
    train = {r["prompt"] for r in _generate(key, False).rows} if heldout else set()
    for i, (question, answer, task, entry) in enumerate(_made(key)[int(heldout)]):
        if question in train:
            repeats += 1
            continue
        rows.append({"prompt": question, "answer": answer, "task": task,
                     ITEM_COLUMN: json.dumps({"source": shown, "index": i, "entry": entry}, sort_keys=True)})
    return Generated(tuple(rows), repeats)


def generate(source: dict, heldout: bool = False) -> Generated:
    """The training problems (or the held-out ones, less any whose question a training problem has; `RecipeError`
    when that leaves none, for --check, --eval and a run's evaluation alike)."""
    made = _generate(_key(source), heldout)
    if heldout and not made.rows:
        n = source["eval_size"]
        raise RecipeError([Problem(f"{KEY}.eval_size", f"all {n} held-out problems ask a question training asks too: the "
                                   "task's config allows fewer distinct problems than size + eval_size", n,
                                   "a smaller size, or a config with more distinct problems (more digits, terms, ...)")])
    return made


def load(source: dict, heldout: bool = False, set_in: str | None = None):
    """`generate` as a `datasets.Dataset` (columns prompt, answer, task, task_item), what `data.load_raw` returns;
    a refusal names `set_in`, where the source was set."""
    import datasets

    try:
        rows = list(generate(source, heldout).rows)
    except RecipeError as err:
        for problem in err.problems:
            problem.file = problem.file or set_in
        raise RecipeError(err.problems) from None
    return datasets.Dataset.from_list(rows)


TAKES = {"last_number": "the last number", "last_line": "the last non-empty line", "whole": "the whole text"}


def answer_problems(source: dict, rewards: list[dict], extract, file: str | None = None) -> tuple[list[Problem], list[str]]:
    """Each `task_score` reward's `answer_from` against the tasks' own gold answers: a completion that states the gold
    the way `answer_from` reads it must yield the gold (`extract`, the reward's own `rewards.tasks.extract`, passed
    down). (problems, notes): a task none of whose training golds survives is refused (a right answer could never
    score 1.0: last_number on a task answered in words); one where some do not is a note."""
    problems, notes = [], []
    rows = generate(source).rows
    for i, reward in enumerate(rewards):
        if reward["name"] != "task_score":
            continue
        how, tag = reward["args"].get("answer_from", "tag"), reward["args"].get("tag", "answer")
        for task in source["tasks"]:
            golds = [r["answer"] for r in rows if r["task"] == task["name"] and r["answer"] is not None]
            lost = [(g, extract(f"<{tag}>{g}</{tag}>" if how == "tag" else g, how, tag)) for g in golds]
            lost = [(g, got) for g, got in lost if got != g.strip()]
            if not lost:
                continue
            gold, got = lost[0]
            kind = "is a number" if how == "last_number" else f"is left whole by {how}"
            if len(lost) == len(golds):
                problems.append(Problem(f"rewards[{i}].args.answer_from", f"takes {TAKES.get(how, how)} of a completion, "
                                        f"and none of {task['name']}'s gold answers {kind} (e.g. {gold!r}, of which it takes "
                                        f"{got!r}), so not even the gold answer can score 1.0", how,
                                        "tag (the answer in <answer>...</answer>, as reasoning-gym's prompts ask for it), "
                                        "whole, or last_line / last_number where the gold is one line / one number",
                                        file=file))
            else:
                notes.append(f"rewards[{i}] task_score (answer_from: {how}): {len(lost)} of {len(golds)} of "
                             f"{task['name']}'s training gold answers are not what it takes from a completion that states "
                             f"them (e.g. {gold!r} -> {got!r}): those problems can never score 1.0")
    return problems, notes


def describe(source: dict) -> str:
    """How messages name the source.

    >>> describe({"tasks": [{"name": "leg_counting", "weight": 1.0}], "size": 10, "seed": 1})
    'reasoning-gym leg_counting (10 problems, seed 1)'
    """
    names = " + ".join(t["name"] for t in source["tasks"])
    return f"reasoning-gym {names} ({source['size']} problems, seed {source['seed']})"


def explain(source: dict, rewards: list[dict]) -> list[str]:
    """--check's account of the source: each task with its config and scorer, the seeds of both sets, and how far
    apart they are (the held-out problems are generated here to count any repeat)."""
    known = registry()
    total = sum(t["weight"] for t in source["tasks"])
    lines = [f"# task source: reasoning-gym {version()}, generated here from seeds (nothing downloaded)"]
    for t in source["tasks"]:
        cls = known[t["name"]][0]
        share = f", {t['weight'] / total:.0%} of problems" if len(source["tasks"]) > 1 else ""
        scorer = (f"{cls.__name__}.score_answer, the task's own" if "score_answer" in vars(cls) else
                  "reasoning-gym's default score_answer (exact: 1.0; the gold inside a longer answer: len(gold)/len(answer))")
        lines.append(f"  task {t['name']}{share}: config {json.dumps(t['config']) if t['config'] else '{} (the defaults)'}; "
                     f"scored by {scorer}")
    seed, size, start, n = source["seed"], source["size"], eval_seed(source), source["eval_size"]
    lines.append(f"  training: {size:,} problems from seeds {seed}..{seed + size - 1} (problem i from seed + i)")
    lines.append(f"  both sets made in a child process within a bound: {bounds()} (past it: refused, naming the "
                 "config key that makes it expensive)")
    held = generate(source, heldout=True)
    repeats = f", {held.repeats} dropped whose question a training problem asks too" if held.repeats else ""
    lines.append(f"  held-out (--eval, trainer.eval_strategy): no held-out question is a training question; "
                 f"{len(held.rows):,} problems from seeds {start}..{start + n - 1}, apart from training's{repeats}")
    scorers = [r for r in rewards if r["name"] == "task_score"]
    if scorers:
        for r in scorers:
            how = r["args"].get("answer_from", "tag")
            where = {"tag": f"the last <{r['args'].get('tag', 'answer')}>...</{r['args'].get('tag', 'answer')}>",
                     "last_line": "the last non-empty line", "last_number": "the last number in the text",
                     "whole": "the whole completion"}.get(how, how)
            lines.append(f"  reward task_score: the answer is {where}, scored by the task's score_answer "
                         f"(its partial credit kept), at most {r['args'].get('timeout', 2.0)} s a completion")
    else:
        lines.append("  note: no task_score reward: the recipe's rewards do not use the tasks' own scorers")
    return lines
