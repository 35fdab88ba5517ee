"""`build.prepare`: each step adds what it finds to one `_Findings`; `--check` notes what it cannot reach offline, a
run refuses it, and every problem is raised together. (The whole of --check: test_recipes.py, test_hostile_inputs.py.)"""

from __future__ import annotations

import pytest
from helpers import recipe_dict, write_recipe

from grpokit.run import build
from grpokit.config import load, validate
from grpokit.errors import Problems, RecipeError

# Nothing in the tests reaches the hub (conftest sets HF_HUB_OFFLINE=1), and no cache holds these.
HUB = recipe_dict(model={"name_or_path": "grpokit-tests/no-such-model"},
                  dataset={"name": "grpokit-tests/no-such-dataset", "prompt_column": "prompt"})


def hub_recipe(tmp_path):
    data = HUB | {"trainer": HUB["trainer"] | {"output_dir": str(tmp_path / "run")}}
    return validate(load(write_recipe(tmp_path, data)))


@pytest.mark.parametrize("training", [False, True])
def test_out_of_reach_is_a_note_for_check_and_a_problem_for_a_run(training):
    found = build._Findings(training=training, problems=Problems(file="r.yaml"))
    found.out_of_reach("dataset.name", "'d' is not in the local cache", "its columns are not checked")
    if training:
        assert [p.format() for p in found.problems.items] == ["r.yaml: dataset.name: 'd' is not in the local cache"]
        assert found.notes == []
    else:
        assert found.notes == ["'d' is not in the local cache; its columns are not checked"]
        assert not found.problems


def test_check_notes_a_hub_model_and_dataset_it_cannot_reach(tmp_path):
    said = []
    prep = build.prepare(hub_recipe(tmp_path), log=said.append)
    assert prep.tokenizer is None and prep.dataset is None  # nothing to measure them with, nothing to check
    model, dataset = prep.notes
    assert "'grpokit-tests/no-such-model' is not in the local cache" in model
    assert model.endswith("; its tokenizer and prompt lengths are not checked")
    assert "'grpokit-tests/no-such-dataset' is not in the local cache" in dataset
    assert dataset.endswith("; its columns are not checked")
    assert said == ["loading dataset"]  # no tokenizer was tried for a model out of reach


def test_a_run_refuses_both_at_once(tmp_path):
    with pytest.raises(RecipeError) as caught:
        build.prepare(hub_recipe(tmp_path), log=lambda line: None, mode="train")
    assert [p.path for p in caught.value.problems] == ["model.name_or_path", "dataset.name"]
    assert all(p.file == str(tmp_path / "recipe.yaml") for p in caught.value.problems)


def test_an_unknown_purpose_is_a_programming_error(tmp_path):
    with pytest.raises(ValueError, match="mode must be one of check, train, launch"):
        build.prepare(hub_recipe(tmp_path), mode="plan")
