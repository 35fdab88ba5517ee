"""grpokit's reward library: one topic per module, one registry, TRL's call convention.

A reward is a plain function, or a callable class when it takes arguments (instances pickle), with
TRL 1.16's signature::

    def my_reward(prompts, completions, completion_ids, **kwargs) -> list[float | None]

`completions` are plain strings or conversational (`[{"role": "assistant", "content": ...}]`); every
dataset column arrives as a keyword list; `None` means "does not apply to this sample".

Register one with `@register` (its registry name is the name TRL logs as `rewards/<name>/mean`) and
build it with `build(name, **args)`. `name` may also be a user reward: `path/to/file.py:function` or
`package.module:function`, and must then be a function or an `@reward_class` class defined there
(`rewards._machinery.user` states the rule: a recipe reaches no other code). Every way that can fail raises
`RewardError` with a message saying how.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from math import isfinite  # not `import math`: the submodule rewards.math takes that name in this namespace
from typing import Any, Callable

from grpokit.errors import nearest
from rewards._machinery.errors import RewardError, RewardFailure, RewardNameError
from rewards._machinery.user import MARK, is_user_reward, load_user_target, reward_class, user_reward_file

__all__ = [
    "Entry", "Guarded", "RewardError", "RewardFailure", "RewardNameError", "arg_parameters", "bind", "build", "describe", "entry",
    "is_integer", "is_number", "is_user_reward", "names", "register", "resolve", "reward_class", "text",
    "token_ids", "user_reward_file",
]


@dataclass(frozen=True)
class Entry:
    name: str
    target: Callable  # a function (args set its keyword arguments) or a class (args go to __init__)
    # args the recipe loader fills from the recipe when the entry leaves them out: {arg: "trainer.key"}
    from_recipe: dict

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.target) or ""

    @property
    def summary(self) -> str:
        return self.doc.split("\n", 1)[0]


_REGISTRY: dict[str, Entry] = {}


def register(name: str | None = None, *, from_recipe: dict | None = None):
    """Decorator: add a reward function or callable class to the registry.

    >>> @register("shout")
    ... def shout(completions, **kwargs):
    ...     return [1.0 if text(c).isupper() else 0.0 for c in completions]
    >>> build("shout")(completions=["HI", "hi"])
    [1.0, 0.0]
    >>> _ = _REGISTRY.pop("shout")  # only an example: --list-rewards (and rewards/README.md's copy of it) stay as shipped
    """

    def wrap(target):
        reg_name = name or getattr(target, "__name__")
        if reg_name in _REGISTRY and _REGISTRY[reg_name].target is not target:
            raise RewardError(f"reward name {reg_name!r} is registered twice")
        _REGISTRY[reg_name] = Entry(reg_name, target, dict(from_recipe or {}))
        if inspect.isclass(target):
            setattr(target, MARK, True)  # a registered class may also be named by module path
        return target

    return wrap


def names() -> list[str]:
    return sorted(_REGISTRY)


def entry(name: str) -> Entry:
    _load_builtins()
    if name not in _REGISTRY:
        raise RewardNameError(
            f"unknown reward {name!r}; registered: {', '.join(names())}"
            + (f"; did you mean {n!r}?" if (n := nearest(name, _REGISTRY)) else "")
            + "; a user reward is 'path/to/file.py:function' or 'package.module:function'"
        )
    return _REGISTRY[name]


_MAX_DEPTH = 32  # nested content blocks deeper than this hold no text worth reading (and must not recurse forever)


def text(completion) -> str:
    """The text of a completion, in every shape TRL can pass; never raises.

    * a string is its own text; None, and an empty conversation `[]`, have none ("")
    * a conversation (a list of message dicts) has the text of its last message not written by a tool:
      with tools, the completion is the whole exchange and the answer is the model's last turn; a tool's
      result (role "tool") is never read as the model's answer
    * a message's `content` may be a string, None (a tool-call-only turn: ""), a number (its digits), one
      content block, or a list of blocks; a block is a string or a dict whose `text` is read the same way
      (None, a number, a list); blocks without text (images) add nothing
    * bytes decode as UTF-8; any other object has no text ("")

    >>> text("4"), text([{"role": "assistant", "content": [{"type": "text", "text": "4"}, {"type": "image"}]}])
    ('4', '4')
    >>> text([]), text([{"role": "assistant", "content": None}])
    ('', '')
    >>> text([{"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "content": "42"}])
    ''
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        if not completion or not isinstance(completion[-1], dict):
            return ""  # a list of plain strings or Nones is not a conversation
        said = [m for m in completion if isinstance(m, dict) and m.get("role") != "tool"]  # a tool result is never the answer
        return _content_text(said[-1].get("content"), 0) if said else ""
    if isinstance(completion, dict):
        return _content_text(completion.get("content"), 0)
    return _content_text(completion, 0)


def _content_text(content, depth: int) -> str:
    if isinstance(content, str):
        return content
    if depth > _MAX_DEPTH or content is None:
        return ""
    if isinstance(content, (bytes, bytearray)):
        return content.decode("utf-8", errors="replace")
    if isinstance(content, (int, float)):  # bool included: YAML-ish data may carry one
        return str(content)
    if isinstance(content, dict):
        return _content_text(content.get("text"), depth + 1)
    if isinstance(content, (list, tuple)):
        return "".join(_content_text(block, depth + 1) for block in content)
    return ""


def _shown(completion) -> str:
    """A completion as an error message quotes it: its text, cut to 200 characters."""
    return repr(text(completion)[:200])


def _shown_error(err: BaseException) -> str:
    try:
        return f"{type(err).__name__}: {err}"
    except Exception:  # noqa: BLE001 - an exception whose str() raises still gets named
        return f"{type(err).__name__} (its message cannot be printed)"


def _shown_value(value) -> str:
    try:
        shown = repr(value)
    except Exception:  # noqa: BLE001 - the message must be written whatever the reward returned
        shown = f"<{type(value).__name__} that cannot be printed>"
    return shown if len(shown) <= 80 else shown[:77] + "..."


def is_integer(value) -> bool:
    """An int that is not a bool (YAML's `true` must not pass for 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def token_ids(name: str, completions, completion_ids) -> list:
    """`completion_ids`, checked to be there (TRL's GRPOTrainer passes them) and one per completion."""
    if completion_ids is None:
        raise ValueError(f"{name} needs completion_ids (token ids), which TRL's GRPOTrainer passes; got none")
    if len(completion_ids) != len(completions):
        raise ValueError(f"{name}: got {len(completions)} completions but {len(completion_ids)} completion_ids")
    return completion_ids


# ----------------------------------------------------------------------------------------------------
# Resolving names: registered, file path, module path


def resolve(name: str) -> Entry:
    """The registry entry for `name`, loading a user reward from its file or module."""
    if is_user_reward(name):
        return Entry(name.rpartition(":")[2], load_user_target(name), {})
    return entry(name)


def _call_signature(target) -> inspect.Signature:
    fn = target.__call__ if inspect.isclass(target) else target
    return inspect.signature(fn)


def _check_call_signature(name: str, target) -> None:
    """A reward must accept TRL's keyword call: `completions` by name, and the other columns (via **kwargs).

    `completions` must be named, not only caught by `**kwargs`: otherwise any library function taking
    keywords (`torch.load(f, **pickle_load_args)`) would pass for a reward.
    """
    try:
        sig = _call_signature(target)
    except (TypeError, ValueError):
        raise RewardError(f"reward {name!r}: its signature cannot be read, so it cannot be checked against TRL's call") from None
    params = sig.parameters.values()
    has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    named = sig.parameters.get("completions")
    accepts_completions = named is not None and named.kind in (named.POSITIONAL_OR_KEYWORD, named.KEYWORD_ONLY)
    required_positional = [
        p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty and p.name != "self"
    ]
    if not accepts_completions or not has_var_kw or required_positional:
        shown = str(sig) if len(str(sig)) <= 120 else str(sig)[:117] + "..."
        raise RewardError(
            f"reward {name!r} has signature {shown}, which cannot take TRL's call; "
            "use `def f(completions, **kwargs)` (prompts, completion_ids and dataset columns come as keywords)"
        )


# What TRL's call passes a reward itself (dataset columns come too): never a recipe's `args`.
TRL_CALL = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                      "environments"})


def arg_parameters(target) -> dict[str, inspect.Parameter]:
    """The arguments a recipe may give: a class's __init__ parameters; a plain function's keyword arguments that have a
    default, other than those TRL's call passes (one without a default is filled by the call: a dataset column)."""
    if not inspect.isclass(target):
        params = _call_signature(target).parameters
        return {k: p for k, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and p.default is not p.empty and k not in TRL_CALL}
    params = inspect.signature(target.__init__).parameters
    return {k: p for k, p in params.items() if k != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


class Bound:
    """A plain function with the recipe's `args` for its keyword arguments: what `functools.partial` does, with the
    function's name kept (TRL logs `rewards/<name>/mean`) and pickling by reference to the function. The recipe's
    value wins over a dataset column of the same name: the entry set it on purpose.

    >>> def at_most(completions, n: int = 1, **kwargs):
    ...     return [float(len(c) <= n) for c in completions]
    >>> Bound(at_most, {"n": 2})(completions=["ab", "abc"])
    [1.0, 0.0]
    """

    def __init__(self, fn: Callable, args: dict):
        self.fn, self.args = fn, dict(args)
        self.__name__ = fn.__name__

    def __call__(self, completions, **kwargs):
        return self.fn(completions=completions, **{**kwargs, **self.args})


def bind(name: str, args: dict) -> Entry:
    """Resolve `name` and check `args` against its signature, without building it: the first fault raised."""
    e, faults = bind_all(name, args)
    if faults:
        raise faults[0]
    return e


def bind_all(name: str, args: dict) -> tuple[Entry, list[RewardError]]:
    """Resolve `name` (RewardNameError when it cannot be) and check every key of `args` against its signature:
    (the entry, one RewardError per fault -- each argument it has no parameter for, then the ones it needs)."""
    e = resolve(name)
    _check_call_signature(name, e.target)
    params = arg_parameters(e.target)
    faults = []
    for key in args:
        if key not in params:
            hint = nearest(key, params)
            if inspect.isclass(e.target):
                allowed = ", ".join(params) if params else "none"
            else:
                allowed = (f"{', '.join(params)} (the function's keyword arguments with a default)" if params else
                           "none (`args` sets a function's keyword arguments that have a default, e.g. "
                           f"`def {e.target.__name__}(completions, max_chars: int = 8, **kwargs)`; the others come from "
                           "TRL's call and the dataset's columns)")
            faults.append(RewardError(
                f"reward {name!r} has no argument {key!r}; arguments: {allowed}"
                + (f"; did you mean {hint!r}?" if hint else ""),
                arg=key,
            ))
    missing = [k for k, p in params.items() if p.default is p.empty and k not in args]
    if missing:
        faults.append(RewardError(f"reward {name!r} needs argument(s) {', '.join(missing)}"))
    return e, faults


def value_faults(name: str, args: dict, fixed: tuple = ()) -> list[RewardError]:
    """Each argument of `args` a reward class refuses on its own (its constructor built with that one, and the
    `fixed` ones): every bad value at once, where building with all of them says only the first. Empty when none is
    refused alone (then the fault, if any, is between them: `build` says it)."""
    target = resolve(name).target
    if not inspect.isclass(target):
        return []
    faults = []
    for key, value in args.items():
        if key in fixed:
            continue
        try:
            target(**{k: args[k] for k in fixed if k in args}, **{key: value})
        except (TypeError, ValueError) as err:
            faults.append(RewardError(f"reward {name!r}: argument {key}={value!r}: {err}", arg=key))
    return faults


def build(name: str, **args: Any) -> Callable:
    """The callable the trainer gets for reward `name` with `args`.

    >>> fn = build("char_fraction", char="a")
    >>> fn(completions=["aab", "bbb"])
    [0.6666666666666666, 0.0]
    """
    e = bind(name, args)
    if inspect.isclass(e.target):
        try:
            fn = e.target(**args)
        except (TypeError, ValueError) as err:
            # the constructor's error is the class's own text: blamed on the first argument given
            raise RewardError(f"reward {name!r}: bad arguments {args}: {err}", arg=next(iter(args), None)) from None
    else:
        fn = Bound(e.target, args) if args else e.target
    return Guarded(e.name, fn)


class Guarded:
    """Wraps a reward so a failure names the reward, the step and the sample instead of a bare traceback.

    On an exception it re-runs the reward one sample at a time to find the first sample that fails.
    It also checks the output: one float or None per completion, no NaN.
    """

    def __init__(self, name: str, fn: Callable):
        self.__name__ = name  # what TRL logs: rewards/<name>/mean
        self.fn = fn

    def __call__(self, completions, **kwargs):
        try:
            out = self.fn(completions=completions, **kwargs)
        except Exception as err:  # noqa: BLE001 - re-raised with the sample that caused it
            raise self._explain(err, completions, kwargs) from err
        return self._check(out, completions, kwargs)

    def _step(self, kwargs) -> str:
        step = getattr(kwargs.get("trainer_state"), "global_step", None)  # steps completed: 0 during the first
        return f" at step {step + 1}" if is_integer(step) else ""  # counted from 1, as the console counts

    def _explain(self, err: Exception, completions, kwargs) -> "RewardFailure":
        n = len(completions)
        for i in range(n):
            one = {k: ([v[i]] if isinstance(v, list) and len(v) == n else v) for k, v in kwargs.items()}
            try:
                self.fn(completions=[completions[i]], **one)
            except Exception as single:  # noqa: BLE001
                return RewardFailure(
                    f"reward {self.__name__!r} raised{self._step(kwargs)} on sample {i}: "
                    f"{_shown_error(single)}; completion: {_shown(completions[i])}"
                )
        return RewardFailure(f"reward {self.__name__!r} raised{self._step(kwargs)} on a batch of {n}: {_shown_error(err)}")

    def _check(self, out, completions, kwargs):
        n = len(completions)
        if not isinstance(out, (list, tuple)) or len(out) != n:
            got = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
            raise RewardFailure(f"reward {self.__name__!r} returned {got}{self._step(kwargs)}; expected a list of {n}")
        clean = []
        for i, value in enumerate(out):
            if value is None:
                clean.append(None)
                continue
            try:
                number = float(value)
            except Exception:  # noqa: BLE001 - whatever float() raises on, the answer is "not a number"
                raise RewardFailure(
                    f"reward {self.__name__!r} returned {_shown_value(value)} for sample {i}{self._step(kwargs)}; "
                    f"expected a float or None; completion: {_shown(completions[i])}"
                ) from None
            if not isfinite(number):
                # NaN poisons the group mean, +-inf makes the advantages NaN or the loss 0: refuse both;
                # None is the way to abstain.
                raise RewardFailure(
                    f"reward {self.__name__!r} returned {'NaN' if number != number else number} for sample {i}"
                    f"{self._step(kwargs)}; rewards must be finite, return None to abstain; "
                    f"completion: {_shown(completions[i])}"
                )
            clean.append(number)
        return clean


_BUILTIN_MODULES = ("rewards.toy", "rewards.math", "rewards.format", "rewards.length", "rewards.repetition", "rewards.code",
                    "rewards.tasks", "rewards.tools")
_loaded = False


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def describe() -> list[dict]:
    """Every registered reward with its arguments and one-line doc (for `--list-rewards` and rewards/README.md)."""
    _load_builtins()
    rows = []
    for name in names():
        e = _REGISTRY[name]
        args = []
        for key, p in arg_parameters(e.target).items():
            if key in e.from_recipe and p.default is None:
                args.append(f"{key}=<{e.from_recipe[key]}>")
            else:
                default = list(p.default) if isinstance(p.default, tuple) else p.default  # as YAML writes it
                args.append(key if p.default is p.empty else f"{key}={default!r}")
        rows.append({"name": name, "args": args, "summary": e.summary})
    return rows
