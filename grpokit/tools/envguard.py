"""An environment as TRL gets it (`environment_factory`): one subclass per recipe whose tools are bounded as every
tool call is (grpokit.tools.toolguard) and whose own code -- its constructor, `reset`, `get_reward` -- is blamed on the
sample it served when it fails: the run stops with `toolguard.EnvironmentFailure`, one line naming the environment,
the method, the value's type and the sample.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import numbers
import signal
from typing import Callable

from grpokit.errors import show
from grpokit.tools.toolguard import EnvironmentFailure, Limits, ToolCut, _call, _call_async, _Deadline, _error, _inside, _wrap
from grpokit.tools.tooltext import as_text



def environment_factory(env: type, args: dict, limits: Limits, tool_names: list[str]) -> Callable[[], object]:
    """TRL's `environment_factory`: builds instances of a subclass of `env` (same name, so the reward is logged under
    it) whose tools are bounded and whose `reset` and `get_reward` faults stop the run naming the sample.

    TRL builds one instance first (to read its tools) and keeps a pool, drawing instance i for sample i of every
    batch; the factory counts the instances it builds, so each knows its sample."""
    label = env.__name__
    namespace = {"__module__": env.__module__, "__qualname__": env.__qualname__, "__doc__": env.__doc__}
    for name in tool_names:
        namespace[name] = _tool_method(env, name, limits)
    namespace["reset"] = _reset(env, label)
    if inspect.isfunction(inspect.getattr_static(env, "get_reward", None)):
        namespace["get_reward"] = _get_reward(env, label)
    guarded = type(env.__name__, (env,), namespace)
    built = itertools.count()

    def factory():
        sample = next(built)
        instance = _environment_call(guarded, (), args, f"{label}.__init__", lambda err: f"environment {label}.__init__ "
                                     f"raised {_error(err)}, building the instance for sample {sample}")
        instance.__dict__[_SAMPLE] = (sample, None)  # reset adds the row's prompt
        return instance

    return factory


_SAMPLE = "_grpokit_sample"  # (the sample this instance serves, the prompt of the row it was last reset with)


def _environment_call(function: Callable, args, kwargs, shown: str, fault: Callable[[BaseException], str]):
    """A call into the environment's own code (`shown`: its constructor, reset, get_reward): a fault in it stops the
    run with `fault(err)`'s line; a stop signal while it runs stops the run at once, since no step can end around it."""
    import sys

    from grpokit.lifecycle import Stopped

    deadline = _Deadline(None, stops=True)  # no time limit: a reset may rightly take long (a repository checked out, a VM booted)
    depth, _inside.depth = getattr(_inside, "depth", 0), 1  # a tool it calls is part of this call
    try:
        deadline.open()
        try:
            return function(*args, **kwargs)
        finally:
            deadline.close()
    except ToolCut:
        print(f"[grpokit] {signal.Signals(deadline.signum).name} came while {shown} ran, which no step end can come "
              "around: stopping at once", file=sys.stderr, flush=True)
        raise Stopped(deadline.signum) from None
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001 - the user's code: one line, not a traceback
        raise EnvironmentFailure(fault(err)) from None
    finally:
        deadline.close()
        _inside.depth = depth


def _sample(instance, word: str = "on") -> str:
    """' on sample 3 (prompt: ...)': where an instance's fault happened, as a message says it."""
    sample, prompt = instance.__dict__.get(_SAMPLE, (None, None))
    if sample is None:
        return ""
    return f" {word} sample {sample}" + (f" (prompt: {show(prompt, 80)})" if prompt is not None else "")


def _prompt(row: dict) -> str | None:
    """The text of a row's prompt (its last message), or None for a row without one."""
    from rewards import text

    return text(row["prompt"]) if row.get("prompt") is not None else None


def _tool_method(env: type, name: str, limits: Limits):
    raw = inspect.getattr_static(env, name)
    shown = f"{env.__name__}.{name}"
    if isinstance(raw, staticmethod):  # no instance: the sample is not known
        return staticmethod(_wrap(raw.__func__, name, shown, limits, lambda: ""))

    def method(self, *args, **kwargs):
        return _call(raw.__get__(self, type(self)), name, shown, limits, lambda: _sample(self), args, kwargs)

    if inspect.iscoroutinefunction(raw):
        async def method(self, *args, **kwargs):  # noqa: F811 - the async form of the same wrapper
            return await _call_async(raw.__get__(self, type(self)), name, limits, args, kwargs)

    return functools.wraps(raw)(method)


def _reset(env: type, label: str):
    raw = inspect.getattr_static(env, "reset")

    @functools.wraps(raw)
    def reset(self, **row):
        self.__dict__[_SAMPLE] = (self.__dict__.get(_SAMPLE, (None, None))[0], _prompt(row))
        value = _environment_call(raw.__get__(self, type(self)), (), row, f"{label}.reset",
                                  lambda err: f"environment {label}.reset raised {_error(err)}{_sample(self)}")
        return _observation(value, label, _sample(self))

    return reset


def _observation(value, label: str, where: str):
    """What reset returned, as TRL adds it to the prompt: None, text (made valid), or a list of content blocks."""
    if value is None:
        return None
    if isinstance(value, str):
        return as_text(value)
    if isinstance(value, list) and all(isinstance(part, dict) and isinstance(part.get("type"), str) for part in value):
        return value
    raise EnvironmentFailure(f"environment {label}.reset returned {_shown(value)} (a {type(value).__name__}){where}; "
                             "expected text, a list of content blocks or None")


def _shown(value) -> str:
    """A value as a message shows it: its own text cut short, or only its type where that text raises."""
    try:
        return show(value)
    except Exception:  # noqa: BLE001 - its __repr__ is the user's code
        return f"a {type(value).__name__}"


def _get_reward(env: type, label: str):
    raw = inspect.getattr_static(env, "get_reward")

    def fault(self):
        return lambda err: f"environment {label}.get_reward raised {_error(err)}{_sample(self, 'for')}"

    if inspect.iscoroutinefunction(raw):  # TRL awaits it on its event loop thread, where no signal comes
        async def get_reward(self):
            try:
                value = await raw.__get__(self, type(self))()
            except Exception as err:  # noqa: BLE001 - the user's code: one line, not a traceback
                raise EnvironmentFailure(fault(self)(err)) from None
            return _reward_value(value, label, _sample(self, "for"))
    else:
        def get_reward(self):
            value = _environment_call(raw.__get__(self, type(self)), (), {}, f"{label}.get_reward", fault(self))
            return _reward_value(value, label, _sample(self, "for"))

    return functools.wraps(raw)(get_reward)


def _reward_value(value, label: str, where: str) -> float | None:
    """get_reward's value as TRL may take it: a finite float, or None to abstain (as any reward may). A real number
    (an int, a float, a numpy scalar) or a 0-dimensional array or tensor is taken; nothing else is guessed at."""
    if value is None:
        return None
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # np.array(0.5), torch.tensor(0.5)
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise EnvironmentFailure(f"environment {label}.get_reward returned {_shown(value)} (a {type(value).__name__})"
                                 f"{where}; expected a float or None")
    try:
        number = float(value)
    except OverflowError:
        raise EnvironmentFailure(f"environment {label}.get_reward returned an int too large for a float "
                                 f"(~{int(value.bit_length() * 0.30103) + 1} digits){where}; expected a float or None") from None
    if not math.isfinite(number):  # NaN poisons the group's mean, inf zeroes the loss: refused as any reward's
        raise EnvironmentFailure(f"environment {label}.get_reward returned {'NaN' if number != number else number}"
                                 f"{where}; rewards must be finite, return None to abstain")
    return number
