"""Small things a new user meets in the first hour: a key given without its section, a reward file's name one letter
off, progress bars in a log that is not a terminal, accelerate's one thread on a CPU, and the time a run will take."""

from __future__ import annotations

import pytest
from helpers import recipe_dict, write_recipe

from grpokit.cli import main


@pytest.mark.parametrize("override, section", [("max_steps=3", "trainer.max_steps"),  # a GRPOConfig field
                                               ("chat_template=qwen2_5", "model.chat_template"),  # grpokit's own schema
                                               ("r=8", "lora.r")])  # a LoraConfig field
def test_a_key_given_without_its_section_gets_the_dotted_name(tmp_path, capsys, no_weights, override, section):
    assert main(["--recipe", str(write_recipe(tmp_path, recipe_dict())), override, "--check"]) == 2
    err = capsys.readouterr().err
    key = override.partition("=")[0]
    assert f"{key}: is not a recipe section" in err and f"did you mean '{section}'?" in err and "Traceback" not in err


def test_a_reward_file_one_letter_off_names_the_file_beside_it(tmp_path, capsys, no_weights):
    (tmp_path / "my_rewards.py").write_text("def mine(completions, **kwargs):\n    return [1.0 for _ in completions]\n")
    data = recipe_dict(rewards=[{"name": "my_reward.py:mine"}])
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "my_reward.py' does not exist; did you mean 'my_rewards.py' (beside it)?" in err
