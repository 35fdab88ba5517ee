"""The reward library's two errors (a leaf: the registry, user-reward loading and the wrapper all raise them)."""

from __future__ import annotations


class RewardError(ValueError):
    """A reward cannot be resolved, bound or run; the message names the reward and says why."""


class RewardFailure(RuntimeError):
    """A reward failed during training; the message names the reward, step and sample."""
