"""Checks of a `tools` section past loading its code (grpokit/tools/tooluse.py loads it): tool names that clash, worked calls
in `dataset.few_shot` naming no tool or passing what it does not take, `environment_args` whose values the constructor's annotations do not take, the
shipped Python tool's limits out of their bounds or not fitting the section's own, tool-calling rounds that cannot fit
the completion. Each is one `Problem`, found at `--check` before any weights load; nothing here calls the user's code.
"""

from __future__ import annotations

import inspect
import typing

from grpokit.tools.environments import PythonTool
from grpokit.errors import Problem, nearest
from grpokit.fields import coerce, describe


def duplicate_problems(functions: list, environment: type | None, methods: list[str], where: str | None) -> list[Problem]:
    """A tool name given twice -- a function and a method of the environment, or a function listed twice. TRL keys the
    tools it calls by name, so one of the two would never be reached, and the model would read two schemas for one name.

    >>> def add(a: int) -> int: ...
    >>> [p.message[:35] for p in duplicate_problems([add, add], None, [], None)]
    ["tool name 'add' is also the name of"]
    """
    found, seen = [], {}
    if environment is not None:
        seen.update({name: f"{environment.__name__}.{name} (a method of tools.environment)" for name in methods})
    for i, function in enumerate(functions):
        name = function.__name__
        if name in seen:
            found.append(Problem(f"tools.functions[{i}]", f"tool name {name!r} is also the name of {seen[name]}: TRL keys "
                                 "tools by name, so the model could reach only one of them; rename one", file=where))
        else:
            seen[name] = f"tools.functions[{i}]"
    return found


def few_shot_problems(few_shot, tool_names: list[str], where: str | None) -> list[Problem]:
    """Each worked call in `dataset.few_shot` that names no tool of the recipe: the model would learn to call it, and
    every such call of its would fail.

    >>> shot = {"role": "assistant", "tool_calls": [{"name": "mul", "arguments": {}}]}
    >>> [p.suggestion for p in few_shot_problems([shot], ["add", "mult"], None)]
    ['mult']
    """
    found = []
    for i, shot in enumerate(few_shot if isinstance(few_shot, list) else []):
        calls = shot.get("tool_calls") if isinstance(shot, dict) else None
        for call in calls if isinstance(calls, list) else []:
            name = call.get("name") if isinstance(call, dict) else None
            if isinstance(name, str) and name not in tool_names:
                found.append(Problem(f"dataset.few_shot[{i}]", f"its tool call names {name!r}, which is not a tool of this "
                                     f"recipe (tools: {', '.join(tool_names)})", suggestion=nearest(name, tool_names),
                                     file=where))
    return found


def call_argument_problems(few_shot, tools: dict, where: str | None) -> list[Problem]:
    """Each worked call in `dataset.few_shot` whose arguments its tool does not take, as TRL would call it (keyword
    arguments bound to the tool's signature): a name it has no parameter for (the nearest one said), a required one
    left out, a value its annotation does not take (`code: 5` for a `str`). The model would learn a call that always
    fails. `tools`: name -> the function TRL calls (an environment's method as its class holds it).

    >>> def python(code: str) -> str: ...
    >>> shot = {"role": "assistant", "tool_calls": [{"name": "python", "arguments": {"cod": "1"}}]}
    >>> [(p.message[:28], p.suggestion) for p in call_argument_problems([shot], {"python": python}, None)]
    [("its call of python passes 'c", 'code'), ('its call of python leaves ou', None)]
    """
    found = []
    for i, shot in enumerate(few_shot if isinstance(few_shot, list) else []):
        calls = shot.get("tool_calls") if isinstance(shot, dict) else None
        for call in calls if isinstance(calls, list) else []:
            if not isinstance(call, dict) or call.get("name") not in tools or not isinstance(call.get("arguments"), dict):
                continue
            name, args, function = call["name"], call["arguments"], tools[call["name"]]
            try:
                params = {k: p for k, p in inspect.signature(function).parameters.items() if k != "self"}
                hints = typing.get_type_hints(function)
            except Exception:  # noqa: BLE001 - a signature or annotations Python cannot read: nothing to check
                continue
            takes = [k for k, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            any_key = any(p.kind is p.VAR_KEYWORD for p in params.values())
            path = f"dataset.few_shot[{i}]"
            for key, value in args.items():
                if key not in params and not any_key:
                    found.append(Problem(path, f"its call of {name} passes {key!r}, which {name} takes no argument "
                                         f"named ({name} takes: {', '.join(takes) or 'nothing'})",
                                         suggestion=nearest(key, takes), file=where))
                elif key in hints:
                    ok, converted = coerce(value, hints[key])
                    if not ok or (isinstance(value, str) and not isinstance(converted, str)):
                        found.append(Problem(path, f"its call of {name} passes {key}={value!r}, which {name}'s "
                                             f"annotation for {key} does not take", value, describe(hints[key]),
                                             file=where))
            missing = [k for k in takes if k not in args and params[k].default is inspect.Parameter.empty]
            if missing:
                found.append(Problem(path, f"its call of {name} leaves out {', '.join(map(repr, missing))}, which "
                                     f"{name} needs", file=where))
    return found


def argument_problems(environment: type, args: dict, where: str | None) -> list[Problem]:
    """Each `environment_args` value the constructor's annotation for it does not take (`max_digits: twelve` for an
    `int`), by the recipe's own rules (grpokit.fields: an int is a number, true is not an integer). An argument
    without an annotation, or with one that cannot be read, is left to the constructor.

    >>> class Env:
    ...     def __init__(self, max_digits: int = 30): ...
    >>> [(p.path, p.allowed) for p in argument_problems(Env, {"max_digits": "twelve"}, None)]
    [('tools.environment_args.max_digits', 'integer')]
    """
    try:
        hints = typing.get_type_hints(environment.__init__)
        params = inspect.signature(environment).parameters
    except Exception:  # noqa: BLE001 - annotations that do not resolve, a signature Python cannot read: nothing to check
        return []
    found = []
    for key, value in args.items():
        if key not in params or key not in hints:
            continue
        ok, converted = coerce(value, hints[key])
        if ok and isinstance(value, str) and not isinstance(converted, str):
            ok = False  # the constructor gets the recipe's value as written: text is not the number it reads as
        if not ok:
            found.append(Problem(f"tools.environment_args.{key}", f"does not fit {environment.__name__}'s constructor's "
                                 f"annotation for {key}", value, describe(hints[key]), file=where))
    return found


def what_the_model_reads(function) -> str:
    """What the model reads as a tool's result, from its return annotation: TRL writes `str(result)` as the `tool`
    message, except a list, which it passes on as content blocks (`[{"type": "text", "text": ...}]`, images).

    >>> def add(a: int, b: int) -> int: ...
    >>> what_the_model_reads(add)
    'returns an int: the model reads str(value), e.g. 42'
    """
    try:
        returned = typing.get_type_hints(function).get("return", inspect.Signature.empty)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: said as not known
        returned = inspect.Signature.empty
    origin = typing.get_origin(returned) or returned
    if returned is inspect.Signature.empty:
        return ("return not annotated: the model reads str() of whatever it returns (a list goes on as content "
                "blocks)")
    if returned is type(None):
        return "returns None: the model reads the text 'None' after every call; return what the call did"
    if origin is str:
        return "returns a str: the model reads it as written"
    if origin is bool:
        return "returns a bool: the model reads True or False"
    if origin is int:
        return "returns an int: the model reads str(value), e.g. 42"
    if origin is float:
        return "returns a float: the model reads str(value), e.g. 0.1 + 0.2 as 0.30000000000000004"
    if origin is dict or (inspect.isclass(origin) and issubclass(origin, typing.Mapping)):
        return "returns a dict: the model reads its Python repr, not JSON (return json.dumps(...))"
    if origin is list:
        return ("returns a list: TRL passes it on as content blocks, not text; a list of anything but text or image "
                "blocks ([{'type': 'text', 'text': ...}]) breaks the chat template: return a str")
    return f"returns {getattr(returned, '__name__', returned)}: the model reads str(value)"


def python_tool_problems(environment: type, args: dict, limits: dict, where: str | None) -> list[Problem]:
    """The shipped Python tool's limits (`environment_args`) against their bounds and the section's own limits
    (`limits`: tools.timeout_seconds and tools.max_result_chars), by grpokit's own rule
    (`PythonTool.argument_problems`, never an override of a subclass's). Other environments: none.

    >>> [p.path for p in python_tool_problems(PythonTool, {"memory_mb": 10}, {"timeout_seconds": 10, "max_result_chars": 10000}, None)]
    ['tools.environment_args.memory_mb']
    """
    if not (inspect.isclass(environment) and issubclass(environment, PythonTool)):
        return []
    return [Problem(f"tools.environment_args.{key}", message, args.get(key), allowed, file=where)
            for key, message, allowed in PythonTool.argument_problems(args, limits)]


def round_problems(rounds: int | None, per_round: int, budget: int, where: str | None) -> list[Problem]:
    """`rounds` rounds of tool calls, each at least `per_round` tokens (a call and its result's wrapping in the chat
    template, measured before any code or output), that the `budget` of max_completion_length cannot hold: the last
    rounds could never happen. (Rounds that fit but leave little room are the lint's `tool-budget` warning.)

    >>> [p.message[:40] for p in round_problems(4, 30, 100, None)]
    ['4 rounds of tool calls take at least 120']
    """
    if rounds is None or rounds * per_round < budget:
        return []
    fits = max(1, (budget - 1) // per_round)
    return [Problem("trainer.max_tool_calling_iterations", f"{rounds} rounds of tool calls take at least {rounds * per_round} "
                    f"tokens ({per_round} a round: a call and its result's wrapping in this chat template, measured, before "
                    f"any code, output or answer), which trainer.max_completion_length ({budget}) cannot hold",
                    rounds, f"at most {fits} round(s), or max_completion_length above {rounds * per_round * 2}",
                    file=where)]
