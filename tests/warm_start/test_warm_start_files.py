"""A warm start's file and folder are read bounded (grpokit/warm_start/worked.py, grpokit/warm_start/section.py, grpokit/run/supervised.py):
a file of exchanges as the dataset screen reads a data file -- each line's size before it is parsed, its nesting, the
number of exchanges, the first faults named and the rest counted -- and a chat template that cannot render an exchange
refused in one line naming it; on `--resume` a warm-start folder is used only when whole (its record and its weights
there), a half-made one of grpokit's removed and made again, and one grpokit did not make never removed."""

from __future__ import annotations

import json

import pytest

from grpokit.warm_start import worked as examples
from grpokit.cli import main
from grpokit.prompts.datavalues import MAX_LINE_BYTES, SHOWN_ROWS
from grpokit.errors import RecipeError, show
from tests.helpers import write_recipe
from tests.warm_start.test_warm_start import tiny_recipe

CALL = {"role": "assistant", "tool_calls": [{"name": "multiply", "arguments": {"a": 2, "b": 3}}]}
GOOD = {"messages": [{"role": "user", "content": "What is 2 * 3?"}, CALL, {"role": "tool", "name": "multiply",
                                                                          "content": "6"},
                     {"role": "assistant", "content": "6"}]}


def refused(path) -> list[str]:
    with pytest.raises(RecipeError) as caught:
        examples.from_file(str(path), {}, ["multiply"])
    return [p.format() for p in caught.value.problems]


def test_a_deeply_nested_line_is_one_problem_not_a_recursion_error(tmp_path):
    path = tmp_path / "worked.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + "[" * 300_000 + "]" * 300_000 + "\n")
    assert refused(path) == [f"warm_start.examples: line 2 is nested deeper than 64 levels (got {show(str(path))})"]


def test_a_line_past_the_line_bound_is_refused_unread(tmp_path):
    path = tmp_path / "worked.jsonl"
    with path.open("w") as f:
        f.write(json.dumps(GOOD) + "\n" + '{"messages": "' + "x" * (MAX_LINE_BYTES + 10) + '"}\n' + "not json\n")
    said = refused(path)
    assert len(said) == 1 and "line 2 is longer than 16 MiB" in said[0] and "refused unread" in said[0]


def test_many_bad_lines_are_counted_after_the_first_few(tmp_path):
    path = tmp_path / "worked.jsonl"
    path.write_text("not json\n" * 100_000)
    said = refused(path)
    assert len(said) == SHOWN_ROWS + 1 and sum(map(len, said)) < 2_000
    assert said[0].startswith("warm_start.examples: line 1 is not valid JSON")
    assert said[-1].startswith(f"warm_start.examples: and {100_000 - SHOWN_ROWS:,} more lines with faults: 6, 7, 8, 9, 10, ...")


def test_a_line_that_is_not_an_object_is_named(tmp_path):
    path = tmp_path / "worked.jsonl"
    path.write_text(json.dumps(GOOD) + "\n[1, 2]\n")
    assert refused(path) == [f"warm_start.examples: line 2 holds a JSON array, not a JSON object (got {show(str(path))})"]


def test_two_calls_a_template_cannot_render_are_one_problem_not_a_template_traceback(tmp_path, capsys, no_weights):
    two = {"role": "assistant", "tool_calls": [{"name": "multiply", "arguments": {"a": 2, "b": 3}},
                                               {"name": "multiply", "arguments": {"a": 6, "b": 4}}]}
    exchange = {"messages": [{"role": "user", "content": "What is 2 * 3 * 4?"}, two,
                             {"role": "tool", "name": "multiply", "content": "6"},
                             {"role": "tool", "name": "multiply", "content": "24"}, {"role": "assistant", "content": "24"}]}
    (tmp_path / "worked.jsonl").write_text(json.dumps(GOOD) + "\n" + json.dumps(exchange) + "\n")
    data = tiny_recipe(tmp_path)
    data["model"]["chat_template"] = "llama3_2"  # "This model only supports single tool-calls at once!"
    data["warm_start"] = {"examples": "worked.jsonl"}
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "1 problem found:" in err and "Traceback" not in err
    assert ("warm_start.examples: line 2: the chat template (model.chat_template) cannot render it (TemplateError: "
            "This model only supports single tool-calls at once!)") in err


def _whole_warm_start(run):
    """A warm-start folder as a run makes it: built whole (files.build_folder), recorded as the run's."""
    from grpokit import files
    from grpokit.files import ownership

    run.mkdir(exist_ok=True)
    recorder = ownership.Recorder(run)

    def build(tmp):
        (tmp / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (tmp / "model.safetensors").write_bytes(b"weights")
        (tmp / "warm_start.json").write_text(json.dumps({"examples": 4}))

    files.build_folder(run / "warm_start", build)
    recorder.record()
    return run / "warm_start"


@pytest.mark.parametrize("damage", ["model.safetensors", "warm_start.json"])
def test_a_half_made_warm_start_is_not_trusted_but_removed_and_made_again(tmp_path, monkeypatch, damage):
    from grpokit import files
    from grpokit.run import supervised
    from grpokit.warm_start import section as warmstart

    run = tmp_path / "run"
    folder = _whole_warm_start(run)
    assert warmstart.made(run) == folder
    (folder / damage).unlink()  # weights gone, or the record written last never written
    assert warmstart.made(run) is None  # never loaded: from_pretrained would fail on it, or train from half a model

    made_again = []

    def make(prep, model, target):
        made_again.append(target)
        return files.build_folder(target, lambda tmp: [(tmp / n).write_text("{}") for n in
                                                       ("config.json", "model.safetensors", "warm_start.json")])

    monkeypatch.setattr(supervised, "make", make)
    assert supervised.ensure(None, run, base=None) == str(folder)
    assert made_again == [folder] and warmstart.made(run) == folder


def test_a_record_that_is_not_json_is_not_whole(tmp_path):
    from grpokit.warm_start import section as warmstart

    folder = _whole_warm_start(tmp_path / "run")
    (folder / "warm_start.json").write_text("{cut short")
    assert warmstart.made(tmp_path / "run") is None


def test_a_warm_start_folder_grpokit_did_not_make_is_never_removed(tmp_path, monkeypatch):
    from grpokit.run import supervised

    run = tmp_path / "run"
    (run / "warm_start").mkdir(parents=True)
    (run / "warm_start" / "notes.txt").write_text("the user's")
    monkeypatch.setattr(supervised, "make", lambda *a: pytest.fail("made over the user's folder"))
    with pytest.raises(RecipeError, match="grpokit did not make it: nothing was removed"):
        supervised.ensure(None, run, base=None)
    assert (run / "warm_start" / "notes.txt").read_text() == "the user's"
