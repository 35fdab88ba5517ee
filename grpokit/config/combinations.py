"""The rules between keys, checked once each key has passed on its own: the generation batch against the process
count, the generation engine (`engine.check_knobs`), what dynamic sampling needs; and `sampling:` checked for the
dynamic-sampling trainer built directly, not from a recipe.
"""

from __future__ import annotations

import math

from grpokit.config.engine import check_knobs
from grpokit.config.sections import PER_GROUP, SAMPLING, TOTAL_REWARD
from grpokit.errors import Problems, nearest
from grpokit.fields import validate_fields

# trl is imported inside the function that reads GRPOConfig's defaults: loading a recipe imports no torch.


def check_combinations(trainer: dict, model: dict, dataset: dict, sampling: dict, n_proc: int, problems: Problems,
                        where_set) -> None:
    """The rules between keys, in one section or across sections and the process count, once each key is checked."""
    if trainer.get("bf16") is True and trainer.get("fp16") is True:
        problems.add("trainer.fp16", "cannot be true together with trainer.bf16; set one (or neither: model.dtype picks)",
                     True, file=where_set("trainer.fp16"))
    if trainer.get("eval_strategy", "no") not in ("no", None) and dataset and not (
            dataset.get("eval_path") or dataset.get("eval_split") or dataset.get("reasoning_gym")):
        problems.add("trainer.eval_strategy", "evaluates on held-out data the recipe does not name; set dataset.eval_path "
                     "(a local file) or dataset.eval_split (a hub split), or leave eval_strategy at 'no'",
                     trainer["eval_strategy"], file=where_set("trainer.eval_strategy"))
    _check_batch(trainer, n_proc, problems, where_set)
    check_knobs(trainer, model, n_proc, problems, where_set)
    if sampling.get("dynamic"):
        _check_dynamic_sampling(trainer, problems, where_set)


def trainer_value(trainer: dict, key: str):
    """The trainer section's value for `key`, else `GRPOConfig`'s own default (None for no such field)."""
    if key in trainer:
        return trainer[key]
    import dataclasses

    from trl import GRPOConfig

    return next((f.default for f in dataclasses.fields(GRPOConfig) if f.name == key), None)


def _check_batch(trainer: dict, n_proc: int, problems: Problems, where_set) -> None:
    """The generation batch must hold whole prompt groups: TRL checks this only with its own world size."""
    per_device, num_gen, accum, gen_bs, spg = (trainer_value(trainer, k) for k in (
        "per_device_train_batch_size", "num_generations", "gradient_accumulation_steps", "generation_batch_size",
        "steps_per_generation"))
    if not all(isinstance(v, int) and v > 0 for v in (per_device, num_gen, accum)):
        return  # already reported as a type or range problem
    if gen_bs is not None and spg is not None:
        problems.add("trainer.generation_batch_size", "cannot be set together with trainer.steps_per_generation; set one",
                     gen_bs, file=where_set("trainer.generation_batch_size"))
        return
    global_batch = per_device * n_proc
    if gen_bs is not None:
        if gen_bs % global_batch:
            problems.add("trainer.generation_batch_size",
                         f"must be divisible by the global batch per_device_train_batch_size ({per_device}) x processes ({n_proc}) = {global_batch}",
                         gen_bs, file=where_set("trainer.generation_batch_size"))
            return
        generation = gen_bs
    else:
        generation = global_batch * (spg or accum)
    if generation % num_gen:
        steps = spg or accum
        fix = next(b for b in range(per_device, per_device + num_gen + 1) if (b * n_proc * steps) % num_gen == 0)
        problems.add(
            "trainer.num_generations",
            f"the generation batch ({generation} = per_device_train_batch_size {per_device} x {n_proc} process(es)"
            f" x {'steps_per_generation' if spg else 'gradient_accumulation_steps'} {steps}) must be divisible by"
            f" num_generations ({num_gen}) so every prompt's group is whole",
            num_gen,
            f"e.g. per_device_train_batch_size: {fix}",
            file=where_set("trainer.num_generations"),
        )


def check_sampling_metric(sampling: dict, reward_names: list[str], problems: Problems, where_set=lambda p: None) -> None:
    """`sampling.metric` must be the weighted total or the logged name of one of the rewards."""
    metric = sampling.get("metric")
    if isinstance(metric, str) and metric != TOTAL_REWARD and metric not in reward_names:
        allowed = [TOTAL_REWARD] + [n for n in reward_names if n != TOTAL_REWARD]
        problems.add("sampling.metric", "names no reward of this recipe", metric, ", ".join(allowed), nearest(metric, allowed),
                     file=where_set("sampling.metric"))


def sampling_settings(sampling: dict | None, reward_names: list[str] | None = None) -> dict:
    """A `sampling:` mapping checked by the same rules as a recipe's, defaults filled; `ValueError` listing every
    problem. For the dynamic-sampling trainer built directly (not from a recipe); `metric` is checked when the
    reward names are given.

    >>> sampling_settings({"dynamic": True}, ["char_fraction"])
    {'dynamic': True, 'max_rounds': 4, 'metric': 'reward', 'reuse_prefix': True}
    """
    problems = Problems()
    settings = validate_fields(sampling or {}, SAMPLING, "sampling", problems)
    if reward_names is not None and not problems:
        check_sampling_metric(settings, list(reward_names), problems)
    if problems:
        raise ValueError("\n".join(p.format() for p in problems.items))
    return settings


def batch_level_knobs(scale_rewards, multi_objective_aggregation) -> dict:
    """The advantage knobs (name -> value) that make advantages depend on the whole batch: dynamic sampling
    builds a batch from several generation rounds, whose statistics must not mix.

    >>> batch_level_knobs(True, "sum_then_normalize"), batch_level_knobs("batch", "sum_then_normalize")
    ({}, {'scale_rewards': 'batch'})
    """
    given = {"scale_rewards": {True: "group", False: "none"}.get(scale_rewards, scale_rewards),  # TRL's bool forms
             "multi_objective_aggregation": multi_objective_aggregation}
    return {knob: value for knob, value in given.items() if value not in PER_GROUP[knob]}


def check_group_layout(per_device_train_batch_size: int, steps_per_generation: int, num_generations: int) -> None:
    """Each process's generation batch must hold whole prompt groups, or a group would straddle two ranks.

    >>> check_group_layout(8, 1, 4)
    """
    local = per_device_train_batch_size * steps_per_generation
    if local % num_generations:
        fix = num_generations // math.gcd(num_generations, steps_per_generation)
        raise ValueError(
            f"dynamic sampling needs each process's generation batch, per_device_train_batch_size x "
            f"steps_per_generation ({per_device_train_batch_size} x {steps_per_generation} = {local}), to be a "
            f"multiple of num_generations ({num_generations}), so that every prompt group stays on one process; "
            f"set per_device_train_batch_size to a multiple of {fix}."
        )


def _check_dynamic_sampling(trainer: dict, problems: Problems, where_set) -> None:
    """What the dynamic-sampling trainer would refuse at init, said before any weight loads."""
    for knob, value in batch_level_knobs(trainer_value(trainer, "scale_rewards"), trainer_value(trainer, "multi_objective_aggregation")).items():
        problems.add(f"trainer.{knob}", "cannot be used with sampling.dynamic: batch-level statistics would mix "
                     "the generation rounds a batch is built from", value, ", ".join(PER_GROUP[knob]), file=where_set(f"trainer.{knob}"))
    per_device, num_gen = trainer_value(trainer, "per_device_train_batch_size"), trainer_value(trainer, "num_generations")
    steps = trainer_value(trainer, "steps_per_generation") or trainer_value(trainer, "gradient_accumulation_steps")
    if trainer.get("generation_batch_size") and trainer.get("steps_per_generation") is None:
        return  # steps per generation follow from the process count: the trainer checks it at init
    if all(isinstance(v, int) and v > 0 for v in (per_device, num_gen, steps)):
        try:
            check_group_layout(per_device, steps, num_gen)
        except ValueError as err:
            problems.add("trainer.per_device_train_batch_size", str(err), per_device, file=where_set("trainer.per_device_train_batch_size"))
