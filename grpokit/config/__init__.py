"""A recipe, from YAML to a validated `Recipe`: `load` (files, bases, overrides), then `validate` (every rule).

    from grpokit.config import load, validate
    recipe = validate(load("recipes/smoke.yaml", ["trainer.max_steps=5"]))
"""

from grpokit.config.loader import Loaded, dump, load
from grpokit.config.validate import Recipe, validate

__all__ = ["Loaded", "Recipe", "dump", "load", "validate"]
