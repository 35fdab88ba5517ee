"""recipes/README.md: smoke.yaml points a new user to it, so its catalogue must name every recipe
and launch config that exists, and nothing that does not; the `builtin:` data it lists must be the shipped files."""

from __future__ import annotations

import re

from helpers import ROOT

from grpokit.prompts.data import builtin_names

RECIPES = ROOT / "recipes"
TEXT = (RECIPES / "README.md").read_text()


def _named() -> set[str]:
    """Recipe paths the catalogue names, with `{a,b}` groups expanded."""
    names = set()
    for cell in re.findall(r"`([\w./{},-]+\.yaml)`", TEXT):
        group = re.search(r"\{([^}]*)\}", cell)
        names |= {cell.replace(group.group(0), part) for part in group.group(1).split(",")} if group else {cell}
    return names


def test_the_catalogue_names_every_recipe_and_only_those():
    shipped = {p.relative_to(RECIPES).as_posix() for p in RECIPES.rglob("*.yaml")}
    named = _named()
    named = {n if "/" in n or n in shipped else f"accelerate/{n}" for n in named}  # launch configs are named bare
    assert shipped - named == set(), "recipes missing from recipes/README.md"
    assert {n for n in named if not (RECIPES / n).is_file() and not n.startswith(("path/", "my"))} == set()


def test_the_builtin_data_it_lists_is_what_ships():
    listed = set(re.findall(r"`(builtin:[\w/.-]+\.(?:jsonl|json|parquet|csv))`", TEXT))
    assert listed == set(builtin_names())


def test_smoke_yaml_uses_builtin_data_and_points_here():
    smoke = (RECIPES / "smoke.yaml").read_text()
    assert "path: builtin:smoke.jsonl" in smoke and "recipes/README.md" in smoke
