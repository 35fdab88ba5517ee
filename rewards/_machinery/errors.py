"""The reward library's two errors (a leaf: the registry, user-reward loading and the wrapper all raise them)."""

from __future__ import annotations


class RewardError(ValueError):
    """A reward cannot be resolved, bound or run; the message names the reward and says why.

    `arg` names the recipe argument at fault when there is one, so that a recipe check can point at the place
    that argument was set (a file line, a command-line override) without reading the message.
    """

    def __init__(self, message: str, arg: str | None = None):
        super().__init__(message)
        self.arg = arg


class RewardNameError(RewardError):
    """The name itself is at fault: no registered reward has it, or the user reward it names cannot be loaded."""


class RewardFailure(RuntimeError):
    """A reward failed during training; the message names the reward, step and sample."""
