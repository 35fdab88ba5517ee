"""User-facing problems: one clear line each, all reported together, exit code 2, never a traceback.

A `Problem` says where (file and key path), what is wrong, the bad value, what is allowed and, for a
typo, the nearest valid name. `RecipeError` carries every problem found in one pass, so a user fixes a
recipe in one edit rather than one run per mistake.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

EXIT_USAGE = 2
# Where a value set on the command line (an override) was set, as a message names it in place of a recipe file
# (`Problem.file`): a loaded recipe records each key's source this way.
CLI = "command line"
_UNSET = object()


def nearest(name: str, candidates, cutoff: float = 0.6) -> str | None:
    """The closest valid name to a typo, or None when nothing is close.

    >>> nearest("epsilon_hihg", ["epsilon", "epsilon_high", "beta"])
    'epsilon_high'
    """
    matches = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=1, cutoff=cutoff)
    return matches[0] if matches else None


def show(value: Any, limit: int = 80) -> str:
    """A value as it goes in a message: its repr, cut in the middle past `limit` so that both ends stay (the end of
    a path is the file's name, the end of a list its closing items).

    >>> show("/a/" + "b" * 100 + "/nope.gguf", limit=30)
    "'/a/bbbbbbbbb...bbb/nope.gguf'"
    """
    text = repr(value)
    if len(text) <= limit:
        return text
    head = (limit - 3) // 2
    return text[:head] + "..." + text[-(limit - 3 - head):]


@dataclass
class Problem:
    """One thing wrong with a recipe or its inputs."""

    path: str  # key path, e.g. "trainer.epsilon_hihg"; "" for the file as a whole
    message: str  # what is wrong, as a sentence fragment
    value: Any = _UNSET
    allowed: str | None = None
    suggestion: str | None = None  # nearest valid name
    file: str | None = None

    def format(self) -> str:
        where = ": ".join(p for p in (self.file, self.path) if p)
        text = f"{where}: {self.message}" if where else self.message
        if self.value is not _UNSET:
            text += f" (got {show(self.value)})"
        if self.allowed:
            text += f"; allowed: {self.allowed}"
        if self.suggestion is not None:
            text += f"; did you mean '{self.suggestion}'?"
        return text


class RecipeError(Exception):
    """Every problem found in one pass. `str()` lists them one per line."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} found:"
        return "\n".join([head] + [f"  - {p.format()}" for p in self.problems])


@dataclass
class Problems:
    """A collector: checks append to it; `raise_if_any()` ends the pass."""

    file: str | None = None
    items: list[Problem] = field(default_factory=list)

    def add(self, path: str, message: str, value: Any = _UNSET, allowed=None, suggestion=None, file=None):
        self.items.append(Problem(path, message, value, allowed, suggestion, file or self.file))

    def extend(self, problems):
        self.items.extend(problems)

    def raise_if_any(self):
        if self.items:
            raise RecipeError(self.items)

    def __bool__(self):
        return bool(self.items)
