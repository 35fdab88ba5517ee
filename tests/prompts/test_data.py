"""The steps of `data.prepare`, each on its own: check the source, drop holes, format the prompts, drop the prompts
the model has no room for. End to end (a real file, a real tokenizer, `--check`): test_dataset_holes.py and
test_hostile_inputs.py."""

from __future__ import annotations

import pytest
from datasets import Dataset

from grpokit.prompts import data
from grpokit.errors import RecipeError


class CharTokenizer:
    """One token a character, for text prompts: lengths anyone can count by eye."""

    def __call__(self, text):
        return {"input_ids": [list(t) for t in text]}


# (lengths, max_prompt_tokens, room, expected (kept indices, over the limit, over the room)); one comment per case
SPLITS = [
    ([3, 9, 6, 2], 8, 5, ([0, 3], 1, 1)),  # one over each bound
    ([9, 9], 8, 5, ([], 2, 0)),  # over both: counted once, as over max_prompt_tokens
    ([9, 6], None, 5, ([], 0, 2)),  # no max_prompt_tokens: only the room bounds
    ([9, 6], 0, 5, ([], 0, 2)),  # max_prompt_tokens 0 is no bound
    ([9, 6], 8, None, ([1], 1, 0)),  # the context unknown: only max_prompt_tokens bounds
    ([5, 8, 9], 8, 5, ([0], 1, 1)),  # at a bound is within it: 5 fits the room, 8 the limit but not the room
    ([], 8, 5, ([], 0, 0)),  # nothing to measure
]


@pytest.mark.parametrize("lengths, limit, room, expected", SPLITS)
def test_split_by_length(lengths, limit, room, expected):
    assert data.split_by_length(lengths, limit, room) == expected


def test_room_is_what_the_completion_leaves_of_the_context():
    assert data.TargetModel(context_length=1024, completion_length=16).room == 1008
    assert data.TargetModel(context_length=None, completion_length=16).room is None  # unknown context: no bound
    assert data.TargetModel(context_length=1024, completion_length=16).room_sum() == \
        "1024 positions - max_completion_length 16 = 1008 tokens"


class Chat:
    chat_template = "{{ messages }}"


# (dataset.conversational, tokenizer, expected)
CONVERSATIONAL = [
    ("auto", Chat(), True),  # a chat template: chat messages
    ("auto", CharTokenizer(), False),  # none: text
    ("auto", None, False),  # no tokenizer (a hub model --check cannot reach): text
    (False, Chat(), False),  # the recipe's word wins
    (True, None, True),
]


@pytest.mark.parametrize("setting, tokenizer, expected", CONVERSATIONAL)
def test_is_conversational(setting, tokenizer, expected):
    assert data.is_conversational({"conversational": setting}, tokenizer) is expected


USER = [{"role": "user", "content": "What is 2+3?"}]
# (dataset section, conversational, the first prompt TRL gets); one comment per case
FORMATS = [
    ({}, True, USER),  # text becomes one user message
    ({"system_prompt": "Be brief."}, True, [{"role": "system", "content": "Be brief."}] + USER),  # system first
    ({}, False, "What is 2+3?"),  # text stays text
    ({"system_prompt": "Be brief."}, False, "Be brief.\n\nWhat is 2+3?"),  # system prompt, a blank line, the prompt
    ({"template": "Q: {question} \\boxed{{}}"}, False, "Q: What is 2+3? \\boxed{}"),  # {{ }} are literal braces
    ({"prompt_column": "chat"}, True, [{"role": "user", "content": "hi"}]),  # chat messages are kept as they are
    ({"prompt_column": "chat", "system_prompt": "Be brief."}, False, [{"role": "user", "content": "hi"}]),  # ... in any mode
]


@pytest.mark.parametrize("spec, conversational, expected", FORMATS)
def test_format_prompts(spec, conversational, expected):
    raw = Dataset.from_list([{"question": "What is 2+3?", "chat": [{"role": "user", "content": "hi"}], "gold": 5}])
    spec = {"prompt_column": "question", **spec}
    assert data.format_prompts(raw, spec, conversational)["prompt"][0] == expected


def test_format_prompts_writes_the_gold_answer_as_text_over_an_answer_column():
    raw = Dataset.from_list([{"prompt": "2+3?", "answer": "old", "gold": 5}])
    ds = data.format_prompts(raw, {"answer_column": "gold"}, False)
    assert ds["answer"] == ["5"]  # the int 5 as "5", in place of the old `answer`
    assert "__grpokit_answer" not in ds.column_names


def _said():
    lines = []
    return data._Said(lines.append), lines


def test_drop_holes_counts_what_it_drops():
    raw = Dataset.from_list([{"prompt": "a", "answer": "1"}, {"prompt": " ", "answer": "1"}, {"prompt": "b", "answer": ""}])
    said, lines = _said()
    assert data.drop_holes(raw, {"answer_column": "answer"}, said)["prompt"] == ["a"]
    assert lines == ["dataset: dropped 2 of 3 rows with a missing or empty 'prompt' or 'answer'"]
    assert said.drops == ["2 missing or empty"]


def test_drop_long_prompts_says_each_bound_apart_and_keeps_the_lengths():
    ds = Dataset.from_list([{"prompt": "x" * n} for n in (3, 9, 6, 2)])
    said, lines = _said()
    model = data.TargetModel(CharTokenizer(), False, context_length=15, completion_length=10)
    kept, lengths = data.drop_long_prompts(ds, {"max_prompt_tokens": 8}, model, said)
    assert kept["prompt"] == ["xxx", "xx"] and lengths == [3, 2]
    assert lines == ["dataset: dropped 1 of 4 prompts longer than 8 tokens (max_prompt_tokens)",
                     "dataset: dropped 1 of 4 prompts longer than the model's context leaves them: "
                     "15 positions - max_completion_length 10 = 5 tokens"]


@pytest.mark.parametrize("model, spec", [
    (data.TargetModel(None, False, context_length=15), {"max_prompt_tokens": 8}),  # no tokenizer to measure with
    (data.TargetModel(CharTokenizer(), False), {}),  # no bound to measure against
])
def test_drop_long_prompts_measures_nothing_without_a_tokenizer_and_a_bound(model, spec):
    ds = Dataset.from_list([{"prompt": "x" * 100}])
    said, lines = _said()
    assert data.drop_long_prompts(ds, spec, model, said) == (ds, None)
    assert lines == []


def test_prepare_with_no_row_left_counts_every_drop():
    raw = Dataset.from_list([{"prompt": "", "answer": "1"}, {"prompt": "x" * 9, "answer": "1"}, {"prompt": "x" * 7, "answer": "1"}])
    spec = {"answer_column": "answer", "max_prompt_tokens": 8}
    with pytest.raises(RecipeError) as caught:
        data.prepare(raw, spec, data.TargetModel(CharTokenizer(), False, context_length=12, completion_length=6),
                     log=lambda line: None, set_in="r.yaml")
    assert [p.format() for p in caught.value.problems] == [
        "r.yaml: dataset: no rows left to train on (3 read: 1 missing or empty, 1 over max_prompt_tokens (8), 1 longer "
        "than the model's context leaves for a prompt (12 positions - max_completion_length 6 = 6 tokens))"]


def test_prepare_keeps_its_lines_and_lengths_with_the_dataset():
    raw = Dataset.from_list([{"prompt": "x" * n} for n in (3, 9, 6, 2)])
    tokenizer = CharTokenizer()
    ds = data.prepare(raw, {"max_prompt_tokens": 8, "limit": 2}, data.TargetModel(tokenizer, False), log=lambda line: None)
    known = data.preparation_of(ds)
    assert ds["prompt"] == ["xxx", "xxxxxx"]  # the first `limit` of those that fit
    assert known.lengths == [3, 6] and known.tokenizer is tokenizer
    assert known.lines == ["dataset: dropped 1 of 4 prompts longer than 8 tokens (max_prompt_tokens)",
                           "dataset: 2 prompts ready (of 4 rows)"]


# (dataset section, rows, what the problem says); one comment per case
SOURCE_FAULTS = [
    ({"prompt_column": "question"}, [{"prompt": "a"}], "dataset.prompt_column: names no column of the dataset"),
    ({"template": "{q}"}, [{"prompt": "a"}], "dataset.template: placeholder {q} names no column"),
    ({"name": "org/data"}, [], "dataset: org/data (train) is empty: no rows"),
    ({"name": "org/data"}, [{"prompt": 5}], "dataset.prompt_column: org/data (train) row 1: 'prompt' holds"),
]


@pytest.mark.parametrize("spec, rows, said", SOURCE_FAULTS)
def test_check_source_refuses(spec, rows, said):
    raw = Dataset.from_list(rows) if rows else Dataset.from_dict({"prompt": []})
    with pytest.raises(RecipeError) as caught:
        data.check_source(raw, spec, "r.yaml")
    assert caught.value.problems[0].format().startswith(f"r.yaml: {said}")


# Rule: a local file refused for what it holds is refused before `datasets` reads it, so nothing is cached: a 1 GB CSV
# over the cell bound wrote a 1.1 GB Arrow cache into ~/.cache/huggingface first. The bound is made small here.
@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
def test_a_file_over_the_cell_bound_is_refused_before_anything_is_cached(fmt, tmp_path, capsys, monkeypatch, no_weights):
    import json

    import datasets
    from helpers import with_trainer, write_recipe

    from grpokit.prompts import datavalues
    from grpokit.cli import main

    monkeypatch.setattr(datavalues, "MAX_CELL_CHARS", 1000)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    rows = [{"prompt": "Say apple.", "answer": "a"}, {"prompt": "x" * 1001, "answer": "b"}]
    path = tmp_path / f"big.{fmt}"
    if fmt == "parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif fmt == "csv":
        path.write_text("prompt,answer\n" + "".join(f"{r['prompt']},{r['answer']}\n" for r in rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = with_trainer(tmp_path)
    recipe["dataset"]["path"] = str(path)
    assert main(["--recipe", str(write_recipe(tmp_path, recipe)), "--check"]) == 2
    err = capsys.readouterr().err
    unit = "line" if fmt == "jsonl" else "row"
    assert f"dataset.prompt_column: big.{fmt} {unit} 2: 'prompt' holds 1,001 characters" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "hf-cache").exists() or not any((tmp_path / "hf-cache").rglob("*.arrow"))


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_file_without_the_prompt_column_is_refused_before_anything_is_cached(fmt, tmp_path, capsys, monkeypatch,
                                                                               no_weights):
    import datasets
    from helpers import with_trainer, write_recipe

    from grpokit.cli import main

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    path = tmp_path / f"data.{fmt}"
    if fmt == "parquet":
        datasets.Dataset.from_list([{"question": "Say apple.", "answer": "a"}]).to_parquet(str(path))
    else:
        path.write_text("question,answer\nSay apple.,a\n")
    recipe = with_trainer(tmp_path)
    recipe["dataset"]["path"] = str(path)
    assert main(["--recipe", str(write_recipe(tmp_path, recipe)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "dataset.prompt_column: names no column of the dataset (got 'prompt'); allowed: question, answer" in err, err
    assert not (tmp_path / "hf-cache").exists() or not any((tmp_path / "hf-cache").rglob("*.arrow"))
