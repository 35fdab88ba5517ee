"""The recipe: a YAML file made into a validated `Recipe` before anything heavy loads -- `load` (files, bases,
overrides, where each key was set), then `validate` (every rule, every problem at once).

    from grpokit.config import load, validate
    recipe = validate(load("recipes/smoke.yaml", ["trainer.max_steps=5"]))

`loader` reads the YAML; `sections` holds grpokit's own sections' keys; `validate` tells the story, composing every
section's check (the domains own theirs: `grpokit.prompts.tasks`, `grpokit.tools.tooluse`, `grpokit.warm_start.section`,
`grpokit.prompts.datavalues`); `combinations` the rules between keys; `reward_entries` the `rewards` entries; `engine`
vLLM's knobs; `trainer_args` the `GRPOConfig`; `lint` the knobs that cannot act.

Offers: `load`, `validate`, `Recipe`, `dump` here, and `loader`, `sections`, `validate`, `combinations`,
`reward_entries`, `engine`, `trainer_args`, `lint`.
Never: imports torch, transformers or TRL at import or to read a recipe's YAML (`validate` builds TRL's own
`GRPOConfig` once, to let TRL check its knobs), or loads a model's weights.
"""

from grpokit.config.loader import Loaded, dump, load
from grpokit.config.validate import Recipe, validate

__all__ = ["Loaded", "Recipe", "dump", "load", "validate"]
