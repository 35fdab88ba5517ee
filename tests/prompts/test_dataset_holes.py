"""Dataset holes: rows with a missing or empty prompt or gold answer are dropped with a count in the log.

The choice (recipes/README.md, "What a dataset may hold"): one bad row in thousands should not stop a run, and must
never crash it mid-training, so holes are dropped and counted; a dataset left with no rows fails `--check`.
"""

from __future__ import annotations

import json

import pytest
from helpers import with_trainer, write_recipe

from grpokit.prompts import data
from grpokit.cli import main

SPEC = {"prompt_column": "prompt", "answer_column": "answer"}

# (row, kept?) one comment per kind of hole
ROWS = [
    ({"id": 0, "prompt": "Say apple.", "answer": "a"}, True),  # a whole row
    ({"id": 1, "prompt": None, "answer": "a"}, False),  # null prompt
    ({"id": 2, "prompt": "", "answer": "a"}, False),  # empty prompt
    ({"id": 3, "prompt": " \n\t", "answer": "a"}, False),  # blank prompt
    ({"id": 4, "answer": "a"}, False),  # the prompt key absent from the row (read as null)
    ({"id": 5, "prompt": "Say river.", "answer": None}, False),  # null gold answer
    ({"id": 6, "prompt": "Say stone.", "answer": ""}, False),  # empty gold answer
    ({"id": 7, "prompt": "Say stone."}, False),  # the answer key absent
    ({"id": 8, "prompt": "Say cat.", "answer": "0"}, True),  # "0" is an answer, not a hole
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_holes_are_dropped_and_counted(tmp_path):
    raw = data.load_raw({"path": str(write_jsonl(tmp_path / "holes.jsonl", [r for r, _ in ROWS]))})
    log = []
    ds = data.prepare(raw, SPEC, data.TargetModel(conversational=False), log=log.append)
    assert ds["id"] == [r["id"] for r, kept in ROWS if kept]
    assert "dataset: dropped 7 of 9 rows with a missing or empty 'prompt' or 'answer'" in log
    assert "dataset: 2 prompts ready (of 9 rows)" in log


def test_without_an_answer_column_only_prompts_count(tmp_path):
    raw = data.load_raw({"path": str(write_jsonl(tmp_path / "holes.jsonl", [r for r, _ in ROWS]))})
    log = []
    ds = data.prepare(raw, {"prompt_column": "prompt"}, data.TargetModel(conversational=False), log=log.append)
    assert ds["id"] == [0, 5, 6, 7, 8]  # answers are not read, so their holes do not matter
    assert "dataset: dropped 4 of 9 rows with a missing or empty 'prompt'" in log


def test_empty_chat_prompt_is_a_hole(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "answer": "a"}, {"prompt": [], "answer": "a"}]
    raw = data.load_raw({"path": str(write_jsonl(tmp_path / "chat.jsonl", rows))})
    log = []
    assert len(data.prepare(raw, SPEC, data.TargetModel(conversational=True), log=log.append)) == 1
    assert log[0].startswith("dataset: dropped 1 of 2 rows")


def test_csv_empty_cells_are_holes(tmp_path):
    (tmp_path / "holes.csv").write_text("prompt,answer\nSay a.,1\n,2\nSay b.,\nSay c.,4\n")
    log = []
    ds = data.prepare(data.load_raw({"path": str(tmp_path / "holes.csv")}), SPEC, data.TargetModel(conversational=False), log=log.append)
    assert ds["prompt"] == ["Say a.", "Say c."]
    assert "dataset: dropped 2 of 4 rows" in log[0]


def test_an_all_holes_file_fails_check(tmp_path, capsys):
    rows = [r for r, kept in ROWS if not kept]
    data_dict = with_trainer(tmp_path)
    data_dict["dataset"]["path"] = str(write_jsonl(tmp_path / "holes.jsonl", rows))
    assert main(["--recipe", str(write_recipe(tmp_path, data_dict)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "dataset: no rows left to train on (7 read: 7 missing or empty)" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_training_on_a_file_with_holes_runs_to_the_end(tmp_path, capsys):
    """Holes spread through the file: the run drops them up front and trains its steps without a crash."""
    picks = [ROWS[i % len(ROWS)] for i in range(24)]
    rows = [{**row, "id": i} for i, (row, _) in enumerate(picks)]
    dropped = sum(not kept for _, kept in picks)
    data_dict = with_trainer(tmp_path, max_steps=2, per_device_train_batch_size=4, num_generations=4)
    data_dict["dataset"]["path"] = str(write_jsonl(tmp_path / "holes.jsonl", rows))
    assert main(["--recipe", str(write_recipe(tmp_path, data_dict))]) == 0
    out = capsys.readouterr().out
    assert f"[grpokit] dataset: dropped {dropped} of 24 rows with a missing or empty 'prompt' or 'answer'" in out
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
