"""Every TRL internal grpokit relies on beyond TRL's public API, listed and checked in one place.

TRL is pinned exactly (pyproject.toml). What we use past its public API -- private methods the dynamic-sampling
trainer overrides or whose behaviour it assumes, lines that must still be in their source, trainer attributes
read, the last generation batch kept for the report, the fused LM head's tile sizes the memory plan counts --
is named here, so a TRL upgrade is this one file to port, and `check_trl_internals()` fails loudly, naming
each difference, instead of training wrong.

Importing this module imports neither torch nor TRL (the memory planner reads `LOGPROB_TILE` from it).
"""

from __future__ import annotations

import inspect

TRL_VERSION = "1.16.0"

# Log-probs of the fused LM head are computed in tiles of trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE tokens x
# trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE vocabulary entries (read by grpokit.planning.memory).
LOGPROB_TILE = (4096, 32768)
# fp32 temporaries of one tile the fused head's torch fold (`_forward_tile` / `_backward_tile`, devices without
# Triton) holds at once; the Triton kernels fold in place. Counted in bench/plan_vs_measured.py's CPU runs.
HEAD_TEMPORARIES = {"cuda": {"forward": 0, "backward": 0}, "cpu": {"forward": 3, "backward": 7}}
_TILE_SOURCE = (("trl.kernels.chunked_logprob", "TOKEN_CHUNK_SIZE"), ("trl.trainer.utils", "_CHUNKED_LOGPROB_CHUNK_SIZE"))

# What GRPOTrainer._calculate_rewards passes every reward besides the dataset's columns ("prompt" goes as
# `prompts`; "completion" and "completion_ids" columns are not passed as such). A test reads TRL's source for it.
TRL_REWARD_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")

# GRPOTrainer methods overridden or relied on (grpokit.dynamic_sampling), with their parameters, and text that
# must still be in their source; trainer attributes the subclass reads.
SIGNATURES = {
    "_generate_and_score_completions": ("self", "inputs"),
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_generate": ("self", "prompts"),
    "_prepare_inputs": ("self", "generation_batch"),
    "_compute_loss": ("self", "model", "inputs"),
    "_remove_unused_columns": ("self", "dataset", "description"),
}
SOURCE_MARKERS = {
    "_generate_and_score_completions": (
        "= self._generate(prompts)",
        "self._calculate_rewards(inputs, prompts, completions, completion_ids_list)",
        '"num_items_in_batch": num_items_in_batch',
        "process_slice = slice(",
    ),
    "_calculate_rewards": ("rewards_per_func = gather(rewards_per_func)",),
    "_compute_loss": ('"tool_mask" not in inputs', 'inputs["num_items_in_batch"]'),
    "_prepare_inputs": ("split_tensor_dict(generation_batch, self.args.steps_per_generation)",),
}
TRAINER_ATTRIBUTES = (
    "_metrics", "_step", "_tokenizer", "_is_vlm", "accelerator", "eos_token_ids", "num_generations",
    "reward_func_names", "reward_weights", "scale_rewards", "multi_objective_aggregation", "state",
)


class TrlInternalsError(RuntimeError):
    """The installed TRL is not the one dynamic sampling was written against."""


def check_trl_internals(trainer=None) -> None:
    """Raise `TrlInternalsError` listing every TRL internal grpokit relies on that has changed.

    Checks the version pin, the signatures and key source lines of the methods overridden or relied on,
    the kernel tile sizes the memory plan assumes, and (given a trainer) the instance attributes read.

    >>> check_trl_internals()  # passes silently on trl 1.16.0
    """
    import trl
    from trl import GRPOTrainer

    problems = []
    if trl.__version__ != TRL_VERSION:
        problems.append(f"trl version is {trl.__version__}, expected {TRL_VERSION}")
    for name, expected in SIGNATURES.items():
        method = getattr(GRPOTrainer, name, None)
        if not callable(method):
            problems.append(f"GRPOTrainer.{name} is missing")
            continue
        params = tuple(inspect.signature(method).parameters)
        if params != expected:
            problems.append(f"GRPOTrainer.{name}{params} has changed; expected parameters {expected}")
            continue
        try:
            source = inspect.getsource(method)
        except (OSError, TypeError):
            source = None
        for marker in SOURCE_MARKERS.get(name, ()):
            if source is None or marker not in source:
                problems.append(f"GRPOTrainer.{name} no longer contains `{marker}`")
    problems += _tile_problems()
    if trainer is not None:
        problems += [f"trainer attribute `{a}` is missing" for a in TRAINER_ATTRIBUTES if not hasattr(trainer, a)]
    if problems:
        raise TrlInternalsError(
            f"grpokit is written against TRL {TRL_VERSION} internals (dynamic sampling, the memory plan), and these differ:\n  - "
            + "\n  - ".join(problems)
            + f"\nInstall the pinned version (pip install trl=={TRL_VERSION}) or set sampling.dynamic: false."
        )


def _tile_problems() -> list[str]:
    import importlib

    problems = []
    for (module_name, name), expected in zip(_TILE_SOURCE, LOGPROB_TILE):
        try:
            found = getattr(importlib.import_module(module_name), name, None)
        except ImportError:
            found = None
        if found != expected:
            problems.append(f"{module_name}.{name} is {found}, the memory plan assumes {expected} (trl_compat.LOGPROB_TILE)")
    return problems


def fused_head_function():
    """The autograd function of TRL's fused LM head (`trl.kernels.chunked_logprob.ChunkedLogProbFunction`):
    grpokit.planning.measure tags what its forward and backward allocate as the plan's "logits"."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    return ChunkedLogProbFunction


def last_generation_logs(trainer) -> dict | None:
    """The last generation batch TRL keeps for its completions table (`GRPOTrainer._logs`: prompt, completion,
    rewards, advantages), or None; read by the run report."""
    return getattr(trainer, "_logs", None) or None
