"""Reading a recipe: YAML (safe only), `base` inheritance, `section.key=value` overrides, where each key was set.

The result of `load()` is a plain mapping plus the file each key came from, so that every problem can
name the file to edit. Validation of the values lives in `grpokit.config.validate`.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpokit import files
from grpokit.errors import CLI, Problem, Problems, RecipeError
from rewards import user_reward_file


_KIND = {list: "list", dict: "mapping", set: "set"}


class _StrictLoader(yaml.SafeLoader):
    """`yaml.safe_load` that also refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (list, dict, set)) or not isinstance(key, Hashable):  # `? [a, b]`: a YAML complex key
            raise yaml.constructor.ConstructorError(
                None, None, f"a key must be a plain value (text or a number), not a {_KIND.get(type(key), type(key).__name__)}",
                key_node.start_mark)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass
class Loaded:
    """A recipe as read from disk and the command line, before validation."""

    path: Path
    data: dict
    set_by: dict[str, str] = field(default_factory=dict)  # key path -> file (or "command line")
    chain: list[Path] = field(default_factory=list)  # the recipe, then its bases

    def where_set(self, key_path: str) -> str:
        """The file that set `key_path` (or its nearest set parent); the recipe itself otherwise."""
        return where_set_in(self.set_by, key_path, str(self.path))


def where_set_in(set_by: dict[str, str], key_path: str, default: str) -> str:
    """The file (or "command line") that set `key_path`, or else its nearest set parent, as `set_by` records it;
    `default` when none of them was set.

    >>> set_by = {"trainer": "base.yaml", "trainer.beta": CLI}
    >>> [where_set_in(set_by, key, "r.yaml") for key in ("trainer.beta", "trainer.seed", "model")]
    ['command line', 'base.yaml', 'r.yaml']
    """
    parts = key_path.split(".")
    while parts:
        found = set_by.get(".".join(parts))
        if found:
            return found
        parts.pop()
    return default


MAX_RECIPE_BYTES = 1_000_000  # the largest shipped recipe is ~3 KB: anything near this is not a recipe
MAX_YAML_VALUES = 100_000  # values once aliases are expanded; a recipe holds a few hundred
# Recipes a chain of `base:` may hold, the recipe included: shipped recipes use at most 3, and each link costs a
# file read and a deep merge (a chain of 1,000 ran Python out of stack, reported as "YAML nested too deeply").
MAX_BASE_CHAIN = 32


class _TooLarge(ValueError):
    pass


def _expanded_size(node, limit: int) -> int:
    """How many values `node` stands for once every alias is expanded, counted up to just past `limit`.

    PyYAML shares an aliased object rather than copying it, so parsing an alias bomb is cheap; the cost
    comes later, from anything that walks or prints the result (a deep copy, a repr in a message), which
    sees 9^8 values. Counting on the node graph, each distinct node once (memoised), costs what the file costs.
    """
    sizes: dict[int, int] = {}

    def size(n) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        total = 1
        if isinstance(n, yaml.SequenceNode):
            children = n.value
        elif isinstance(n, yaml.MappingNode):
            children = [c for pair in n.value for c in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                raise _TooLarge
        sizes[id(n)] = total
        return total

    return size(node)


def parse_yaml(text: str):
    """`text` as plain data: safe tags only, no duplicate keys, aliases expanding to at most MAX_YAML_VALUES.

    Raises `yaml.YAMLError` for bad YAML and `ValueError` for a bomb or nesting too deep to read.

    >>> parse_yaml("trainer: {beta: 0.04}")
    {'trainer': {'beta': 0.04}}
    """
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            _expanded_size(node, MAX_YAML_VALUES)
        except _TooLarge:
            raise ValueError(f"YAML aliases expand to more than {MAX_YAML_VALUES:,} values (a recipe holds a few hundred); "
                             "refused before reading it further") from None
        return loader.construct_document(node)
    except RecursionError:
        raise ValueError("YAML nested too deeply to read (a recipe is a few levels deep)") from None
    finally:
        loader.dispose()


def _tag_problem(what: str) -> str:
    """PyYAML's "could not determine a constructor for the tag 'tag:yaml.org,2002:python/...'" as the tag a user wrote."""
    found = re.search(r"tag '([^']+)'", what)
    if not found:
        return f"YAML tag not allowed ({what}): recipes are plain data, loaded with safe_load"
    tag = found.group(1).replace("tag:yaml.org,2002:", "!!")
    return f"YAML tag {tag} is not allowed: recipes are plain data, loaded with safe_load"


def read_yaml(path: Path) -> Any:
    """Parse one YAML file; every failure becomes a `RecipeError` naming the file and line, never its content."""
    if not path.exists():
        raise RecipeError([Problem("", "recipe file does not exist", file=str(path))])
    if path.is_dir():
        raise RecipeError([Problem("", "recipe path is not a file", file=str(path))])
    data, why = files.try_bytes(path, MAX_RECIPE_BYTES)  # a FIFO or device at the name: refused, never waited on
    if data is None and why.startswith("is larger"):
        raise RecipeError([Problem("", f"the file is {path.stat().st_size / 1e6:.1f} MB; a recipe is at most "
                                   f"{MAX_RECIPE_BYTES / 1e6:g} MB (is this a recipe?)", file=str(path))])
    if data is None:
        raise RecipeError([Problem("", f"recipe path {why}" if why.startswith("is a") else f"cannot read the file: {why}",
                                   file=str(path))])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RecipeError([Problem("", f"cannot read the file: {err}", file=str(path))]) from None
    try:
        return parse_yaml(text)
    except ValueError as err:
        raise RecipeError([Problem("", str(err), file=str(path))]) from None
    except yaml.constructor.ConstructorError as err:
        mark = err.problem_mark
        what = err.problem or str(err)
        if "could not determine a constructor" in what:
            what = _tag_problem(what)
        line = f"line {mark.line + 1}: " if mark else ""
        raise RecipeError([Problem("", f"{line}{what}", file=str(path))]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise RecipeError([Problem("", f"YAML syntax error at {line}{problem}", file=str(path))]) from None


_KINDS = {str: "text", list: "a list", int: "a number", float: "a number", bool: "true/false"}


def deep_merge(base: dict, child: dict) -> dict:
    """Child wins; mappings merge key by key; lists and scalars are replaced whole.

    >>> deep_merge({"a": {"x": 1, "y": 2}, "l": [1]}, {"a": {"y": 3}, "l": [2]})
    {'a': {'x': 1, 'y': 3}, 'l': [2]}
    """
    out = copy.deepcopy(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _leaf_paths(data, prefix="") -> list[str]:
    paths = []
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths.append(path)
            paths.extend(_leaf_paths(value, path))
    return paths


def _is_local_path(value: str) -> bool:
    return value.startswith(("./", "../", "/", "~")) or value in (".", "..")


def _anchor_paths(data: dict, folder: Path) -> None:
    """Make file paths written in a recipe relative to that recipe's folder (bases included)."""
    dataset = data.get("dataset")
    for key in ("path", "eval_path"):
        # `builtin:smoke.jsonl` names data shipped with grpokit, the same from any folder: kept as written
        if isinstance(dataset, dict) and isinstance(dataset.get(key), str) and not dataset[key].startswith("builtin:"):
            dataset[key] = str((folder / Path(dataset[key]).expanduser()).resolve())
    warm = data.get("warm_start")
    if isinstance(warm, dict) and isinstance(warm.get("examples"), str):  # a file of worked exchanges, as dataset.path
        warm["examples"] = str((folder / Path(warm["examples"]).expanduser()).resolve())
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("name_or_path"), str) and _is_local_path(model["name_or_path"]):
        model["name_or_path"] = str((folder / Path(model["name_or_path"]).expanduser()).resolve())

    def anchored(name):
        found = user_reward_file(name) if isinstance(name, str) else None
        return f"{(folder / Path(found[0]).expanduser()).resolve()}:{found[1]}" if found else name

    for reward in data.get("rewards") or []:
        if isinstance(reward, dict) and "name" in reward:
            reward["name"] = anchored(reward["name"])
    tools = data.get("tools")
    if isinstance(tools, dict):  # the environment and tool functions follow a user reward's rule (grpokit/tools/tooluse.py)
        if "environment" in tools:
            tools["environment"] = anchored(tools["environment"])
        if isinstance(tools.get("functions"), list):
            tools["functions"] = [anchored(name) for name in tools["functions"]]


def _load_chain(path: Path, seen: list[Path], set_by: dict) -> tuple[dict, list[Path]]:
    path = path.resolve() if path.exists() else path
    if path in seen:
        cycle = " -> ".join(str(p) for p in seen + [path])
        raise RecipeError([Problem("base", f"recipes extend each other in a cycle: {cycle}", file=str(seen[-1]))])
    if len(seen) >= MAX_BASE_CHAIN:
        raise RecipeError([Problem("base", f"the chain of base recipes is longer than {MAX_BASE_CHAIN} (MAX_BASE_CHAIN; "
                                   f"shipped recipes use at most 3): stopped before reading {path}, the base named here, "
                                   f"{MAX_BASE_CHAIN} links from {seen[0]}", file=str(seen[-1]))])
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):  # its content is not shown: `base: /etc/passwd` must not print the file
        kind = _KINDS.get(type(data), type(data).__name__)
        read_as = f" (read as the base of {seen[-1]})" if seen else ""
        raise RecipeError([Problem("", f"not a recipe: the file holds {kind}, not a mapping of sections{read_as}", file=str(path))])
    # A section left empty (`trainer:` with only comments under it) reads as null; merged as is, it would
    # wipe the base's whole section. It means "nothing to change" -- except `lora: null`, which says "full
    # fine-tune" and must replace the base's LoRA.
    for key in [k for k, v in data.items() if v is None and k != "lora"]:
        del data[key]
    _anchor_paths(data, path.parent)
    chain = [path]
    base_value = data.pop("base", None)
    merged = {}
    if base_value is not None:
        if not isinstance(base_value, str):
            raise RecipeError([Problem("base", "must be a path to another recipe", base_value, file=str(path))])
        base_path = (path.parent / base_value).expanduser()
        if not base_path.exists():
            raise RecipeError([Problem("base", f"base recipe {str(base_path)!r} does not exist", base_value, file=str(path))])
        merged, base_chain = _load_chain(base_path, seen + [path], set_by)
        chain += base_chain
    for key_path in _leaf_paths(data):
        set_by[key_path] = str(path)
    return deep_merge(merged, data), chain


def parse_override(text: str) -> tuple[list[str], Any]:
    """`trainer.beta=0.04` -> (["trainer", "beta"], 0.04); the value is a YAML scalar or list.

    >>> parse_override("lora.target_modules=[q_proj, v_proj]")
    (['lora', 'target_modules'], ['q_proj', 'v_proj'])
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {text!r} must look like section.key=value")
    parts = key.strip().split(".")
    if any(not p for p in parts):
        raise ValueError(f"override {text!r} has an empty key in {key!r}")
    try:
        value = parse_yaml(raw) if raw.strip() else None
    except ValueError as err:
        raise ValueError(f"override {text.partition('=')[0]!r}: {err}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"override {text!r}: value is not valid YAML ({getattr(err, 'problem', err)})") from None
    return parts, value


def _list_index(node: list, parts: list[str], i: int) -> int:
    """`parts[i]` as an index into `node`, or a ValueError naming the path."""
    part = parts[i]
    if not part.isdigit() or int(part) >= len(node):
        raise ValueError(f"{'.'.join(parts[: i + 1])}: no list item {part} (the list has {len(node)})")
    return int(part)


def apply_override(data: dict, parts: list[str], value) -> None:
    """Set `value` at `parts`, creating mappings; a number indexes into a list (`rewards.0.weight=2`)."""
    node = data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = node[_list_index(node, parts, i)]
            continue
        if not isinstance(node, dict):
            raise ValueError(f"{'.'.join(parts[:i])} is not a mapping, cannot set {'.'.join(parts)}")
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
    if isinstance(node, list):
        node[_list_index(node, parts, len(parts) - 1)] = value
    elif isinstance(node, dict):
        node[parts[-1]] = value
    else:
        raise ValueError(f"{'.'.join(parts[:-1])} is not a mapping, cannot set {'.'.join(parts)}")


def load(path: str | os.PathLike, overrides: list[str] = ()) -> Loaded:
    """Read a recipe, its bases and the command-line overrides into one mapping."""
    path = Path(path).expanduser()
    set_by: dict[str, str] = {}
    data, chain = _load_chain(path, [], set_by)
    problems = Problems()
    for text in overrides:
        try:
            parts, value = parse_override(text)
            if parts == ["base"]:
                raise ValueError("base cannot be overridden from the command line; edit the recipe")
            apply_override(data, parts, value)
            key_path = ".".join(parts)
            set_by[key_path] = CLI
            for sub in _leaf_paths(value, key_path):
                set_by[sub] = CLI
        except ValueError as err:
            problems.add(text.partition("=")[0], str(err), file=CLI)
    problems.raise_if_any()
    if overrides:
        # A path given on the command line is relative to where the command runs; the file's own paths are
        # absolute by now, so this anchors exactly the overridden ones (`dataset.path=...` or a whole section).
        _anchor_paths(data, Path.cwd())
    return Loaded(path=path, data=data, set_by=set_by, chain=chain)


def _counts_as_written(data):
    """`data` with each `*_steps` count that GRPOConfig types as float (so validation made `save_steps: 10` a 10.0)
    back as the int a person writes; a fraction of the run (`save_steps: 0.1`) stays a float."""
    if isinstance(data, dict):
        return {key: int(value) if str(key).endswith("_steps") and isinstance(value, float) and value.is_integer()
                else _counts_as_written(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_counts_as_written(value) for value in data]
    return data


def dump(data: dict) -> str:
    """The resolved recipe as YAML, keys in the order the sections were given, step counts as ints.

    >>> print(dump({"trainer": {"save_steps": 10.0, "logging_steps": 0.5, "learning_rate": 1.0}}).strip())
    trainer:
      save_steps: 10
      logging_steps: 0.5
      learning_rate: 1.0
    """
    return yaml.safe_dump(_counts_as_written(data), sort_keys=False, default_flow_style=False, allow_unicode=True)
