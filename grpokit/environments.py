"""Environments shipped with grpokit, for recipes' `tools.environment` (TRL's `environment_factory`).

`Calculator`: exact integer arithmetic the model calls as tools, for problems with numbers too long to work
out in a small model's head (reasoning-gym's `products`: "Solve the following multiplication: 4821 * 637").
The recipes that use it: recipes/smollm2-135m/calculator.yaml (offline) and recipes/qwen2.5-1.5b/calculator.yaml.
How to write one of your own: docs/tools.md.
"""

from __future__ import annotations

# Operands past this many digits are refused (the call fails, which TRL counts): a model asking for a
# thousand-digit product is not doing the task, and its result would crowd the completion budget.
MAX_DIGITS = 30


class Calculator:
    """Integer add, subtract and multiply as tools; one instance per rollout, reset with the dataset row."""

    def __init__(self, max_digits: int = MAX_DIGITS):
        self.max_digits = max_digits
        self.calls: list[tuple[str, int, int]] = []

    def reset(self, **row) -> None:
        """Start a rollout: no calls yet. The row's question is already in the prompt, so nothing is added to it."""
        self.calls = []

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self._record("add", a, b)
        return a + b

    def subtract(self, a: int, b: int) -> int:
        """Subtract the second integer from the first.

        Args:
            a: The integer to subtract from.
            b: The integer to subtract.
        """
        self._record("subtract", a, b)
        return a - b

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self._record("multiply", a, b)
        return a * b

    def _record(self, name: str, a, b) -> None:
        """Refuse what the schema does not allow (TRL reports the error to the model and counts a failed call)."""
        for value in (a, b):
            if not isinstance(value, int) or isinstance(value, bool):  # "12" or 1.5: the schema says integer
                raise TypeError(f"{name} takes integers, got {type(value).__name__} {value!r}")
            if len(str(abs(value))) > self.max_digits:
                raise ValueError(f"{name}: operands are limited to {self.max_digits} digits")
        self.calls.append((name, a, b))
