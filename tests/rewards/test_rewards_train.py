"""The answer and shaping rewards inside real GRPOTrainer steps on the tiny model: TRL calls them with its
own keyword arguments (prompts, completion_ids, dataset columns, trainer_state) and logs each under its name."""

from __future__ import annotations

import json

import pytest
from helpers import with_trainer, write_recipe

from grpokit.cli import main

pytestmark = pytest.mark.slow

REWARDS = ["accuracy", "reasoning_accuracy", "tag_count", "reasoning_steps", "len_reward"]


def test_rewards_run_and_are_logged_in_real_steps(tmp_path):
    data_file = tmp_path / "sums.jsonl"
    data_file.write_text("".join(json.dumps({"prompt": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(16)))
    data = with_trainer(tmp_path, max_steps=2, logging_steps=1)
    data["dataset"] = {"path": str(data_file), "prompt_column": "prompt", "answer_column": "answer"}
    data["rewards"] = [{"name": name} for name in REWARDS]
    assert main(["--recipe", str(write_recipe(tmp_path, data))]) == 0
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    logged = [h for h in state["log_history"] if "reward" in h]
    assert len(logged) == 2
    for name in REWARDS:
        values = [h[f"rewards/{name}/mean"] for h in logged]
        assert all(v == v for v in values), (name, values)  # a number every step (all golds are checkable)
