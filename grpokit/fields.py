"""Type, enumeration and range checks for recipe values.

Two sources of truth feed these checks: our own `Field` specs for the sections we define (`model`,
`dataset`, ...), and the annotations of TRL's / PEFT's dataclasses for `trainer` and `lora`, so a new
TRL knob is accepted with its declared type without any change here.

Below every section's owner: `grpokit.config` checks its own sections with it, and `grpokit.prompts.tasks` and
`grpokit.tools.tooluse` theirs, so no owner reaches up into `config` for it. Imports only `grpokit.errors`.
"""

from __future__ import annotations

import enum
import math
import re
import types
import typing
from dataclasses import dataclass, replace
from typing import Any

from grpokit.errors import Problems, nearest

REQUIRED = object()
_FLOAT_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


@dataclass(frozen=True)
class Field:
    """What a recipe key may hold: its type, default, and allowed values or range.

    For the sections we define, all of it (`Field(str, "auto", choices=...)`); for `GRPOConfig` / `LoraConfig`
    fields only the constraints their loose annotations leave out (`Field(min=0.0)`): the type and default
    come from the dataclass itself.
    """

    type: Any = Any
    default: Any = REQUIRED
    doc: str = ""
    choices: tuple | None = None
    min: float | None = None  # inclusive
    max: float | None = None  # inclusive
    gt: float | None = None  # exclusive lower bound
    lt: float | None = None  # exclusive upper bound
    also: tuple = ()  # extra accepted literal values, e.g. scale_rewards also takes True/False
    shape: str = ""  # what the value is, in words, where the type alone says too little ("a list of tasks, ...")


def describe(annotation) -> str:
    """A short human name for a type annotation: `int | None` -> 'integer or null'."""
    origin = typing.get_origin(annotation)
    if annotation is Any or annotation is None:
        return "anything" if annotation is Any else "null"
    if annotation is type(None):
        return "null"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(describe(a) for a in typing.get_args(annotation)))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (list, tuple) or annotation in (list, tuple):
        args = typing.get_args(annotation)
        return f"list of {describe(args[0])}" if args else "list"
    if origin is dict or annotation is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in annotation)
    return {bool: "true/false", int: "integer", float: "number", str: "string"}.get(annotation, str(annotation))


def coerce(value, annotation) -> tuple[bool, Any]:
    """Check `value` against `annotation`; return (ok, value), converting only what YAML gets wrong.

    PyYAML reads `1e-5` (no dot) as a string, so numeric text is accepted for float fields.
    An int is accepted for a float. A bool is never accepted as a number.
    """
    origin = typing.get_origin(annotation)
    if annotation is Any or isinstance(annotation, typing.TypeVar):
        return True, value
    if annotation is None or annotation is type(None):
        return value is None, value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            ok, out = coerce(value, arg)
            if ok:
                return True, out
        return False, value
    if origin is typing.Literal:
        return value in typing.get_args(annotation), value
    if origin in (list, tuple) or annotation in (list, tuple):
        if not isinstance(value, list):
            return False, value
        args = typing.get_args(annotation)
        if not args or args[0] is Any:
            return True, value
        out = []
        for item in value:
            ok, item = coerce(item, args[0])
            if not ok:
                return False, value
            out.append(item)
        return True, out
    if origin is dict or annotation is dict:
        return isinstance(value, dict), value
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [m.value for m in annotation]
        return value in values, value
    if annotation is bool:
        return isinstance(value, bool), value
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if annotation is float:
        if isinstance(value, bool):
            return False, value
        if isinstance(value, (int, float)):
            return True, float(value)
        if isinstance(value, str) and _FLOAT_TEXT.match(value.strip()):
            return True, float(value)
        return False, value
    if annotation is str:
        return isinstance(value, str), value
    if isinstance(annotation, type):
        return isinstance(value, annotation), value
    return True, value  # an annotation we cannot read: let the library judge


def enum_choices(annotation) -> tuple | None:
    """Values of the Enum inside an annotation like `OptimizerNames | str`, if any."""
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, enum.Enum):
            return tuple(m.value for m in arg)
    return None


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def check_bounds(value, bounds: Field, path: str, problems: Problems, file=None) -> None:
    """Choices, numeric ranges, and finiteness: NaN fails no comparison, so a range alone lets it through."""
    if value is None:
        return
    bad = non_finite(value)
    if bad is not None:
        problems.add(path, "must be a finite number", bad, "a finite number" + (f" ({describe_range(bounds)})" if describe_range(bounds) else ""),
                     file=file)
        return
    if bounds.choices is not None and value not in bounds.choices and value not in bounds.also:
        shown = list(bounds.choices) + list(bounds.also)
        problems.add(
            path,
            "is not an allowed value",
            value,
            ", ".join(map(str, shown)),
            nearest(str(value), [str(c) for c in bounds.choices]),
            file=file,
        )
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:  # past it, torch raises or TRL wraps mid-run
        problems.add(path, "is past what a 64-bit integer holds (TRL and torch keep it in one)", value,
                     f"at least {INT64_MIN} and at most {INT64_MAX}" + (f", and {describe_range(bounds)}" if describe_range(bounds) else ""),
                     file=file)
        return
    lo, hi, gt, lt = bounds.min, bounds.max, bounds.gt, bounds.lt
    if (lo is not None and value < lo) or (gt is not None and value <= gt) or (hi is not None and value > hi) or (
        lt is not None and value >= lt
    ):
        problems.add(path, "is out of range", value, describe_range(bounds), file=file)


def describe_range(bounds: Field) -> str:
    """`Field(min=0, lt=1)` -> '>= 0 and < 1'; '' when unbounded."""
    parts = [f"{op} {v}" for op, v in ((">=", bounds.min), (">", bounds.gt), ("<=", bounds.max), ("<", bounds.lt)) if v is not None]
    return " and ".join(parts)


def non_finite(value, depth: int = 0):
    """The first NaN or +-inf float in `value` (searched through lists), else None.

    Every check against NaN is false (`nan < 0` and `nan >= 0` alike), so ranges let it pass; +-inf passes
    one-sided ranges (`temperature > 0`). Both then poison training far from the recipe line that set them.
    Mappings are not searched: their keys are checked one by one, each under its own key path.

    >>> non_finite([1.0, float("inf")]), non_finite([2])
    (inf, None)
    """
    if isinstance(value, float):
        return None if math.isfinite(value) else value
    if depth < 20 and isinstance(value, (list, tuple)):
        for item in value:
            found = non_finite(item, depth + 1)
            if found is not None:
                return found
    return None


def validate_fields(data, spec: dict[str, Field], path: str, problems: Problems, where_set=None) -> dict:
    """Validate a mapping against `spec`; return it with defaults filled and values coerced.

    Every problem is added to `problems`; nothing raises. `where_set(path)` names the file a key came from.
    """
    where_set = where_set or (lambda p: None)
    if not isinstance(data, dict):
        problems.add(path, "must be a mapping", data, file=where_set(path))
        return {}
    out = {}
    for key, value in data.items():
        key_path = f"{path}.{key}"
        if key not in spec:
            problems.add(
                key_path, "is not a known key", allowed=", ".join(spec), suggestion=nearest(key, spec), file=where_set(key_path)
            )
            continue
        field = spec[key]
        ok, value = coerce(value, field.type)
        if not ok:
            problems.add(key_path, "has the wrong type", value, field.shape or describe(field.type), file=where_set(key_path))
            continue
        check_bounds(value, field, key_path, problems, where_set(key_path))
        out[key] = value
    for key, field in spec.items():
        if key in out:
            continue
        if field.default is REQUIRED:
            if key not in data:
                allowed = field.shape or describe(field.type) + (f" ({field.doc})" if field.doc else "")
                problems.add(f"{path}.{key}", "is required", allowed=allowed, file=where_set(path))
        else:
            out[key] = field.default
    return {key: out[key] for key in spec if key in out}  # in the spec's order, for a readable resolved recipe


def dataclass_hints(cls) -> dict[str, Any]:
    """Resolved annotations of a dataclass, tolerant of names its module cannot resolve at runtime."""
    import dataclasses

    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - fall back to the raw annotations, which `coerce` treats leniently
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(cls) if f.init}


def validate_dataclass_keys(data, cls, path: str, problems: Problems, bounds: dict[str, Field], where_set=None,
                            refuse: dict[str, str] | None = None) -> dict:
    """Check a mapping's keys and values against a dataclass's own fields and annotations (+ `bounds`)."""
    where_set = where_set or (lambda p: None)
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.add(path, "must be a mapping", data, file=where_set(path))
        return {}
    hints = dataclass_hints(cls)
    out = {}
    for key, value in data.items():
        key_path = f"{path}.{key}"
        if refuse and key in refuse:
            problems.add(key_path, refuse[key], file=where_set(key_path))
            continue
        if key not in hints:
            problems.add(
                key_path,
                f"is not a {cls.__name__} field",
                suggestion=nearest(key, hints),
                allowed=f"the field names of {cls.__module__.split('.')[0]}.{cls.__name__}",
                file=where_set(key_path),
            )
            continue
        b = bounds.get(key, Field())
        if value in b.also and not isinstance(value, (list, dict)):
            out[key] = value
            continue
        choices = b.choices or enum_choices(hints[key])
        if value is False and choices and "no" in choices:
            value = "no"  # YAML 1.1 reads an unquoted `no` as false: `save_strategy: no` means "no"
        ok, coerced = coerce(value, hints[key])
        if not ok:
            allowed = ", ".join(map(str, choices)) if choices else describe(hints[key])
            problems.add(key_path, "has the wrong type", value, allowed, file=where_set(key_path))
            continue
        check_bounds(coerced, replace(b, choices=choices), key_path, problems, where_set(key_path))
        out[key] = coerced
    return out
