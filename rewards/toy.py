"""Toy rewards for the offline smoke run: simple enough that a random tiny model learns them from scratch."""

from __future__ import annotations

from rewards import register, text


@register("char_fraction")
class CharFraction:
    """Fraction of the completion's characters equal to `char` (0.0 for an empty completion).

    A dense, verifiable signal a random 2-layer model can climb in a few dozen steps, so the smoke
    recipe shows the mean reward rising within a minute on a CPU.

    >>> CharFraction("a")(completions=["aab", ""])
    [0.6666666666666666, 0.0]
    """

    def __init__(self, char: str = "a"):
        if not isinstance(char, str) or len(char) != 1:
            raise ValueError(f"char must be a single character, got {char!r}")
        self.char = char

    def __call__(self, completions, **kwargs) -> list[float]:
        out = []
        for completion in completions:
            t = text(completion)
            out.append(t.count(self.char) / len(t) if t else 0.0)
        return out
