"""The line the whole suite starts with quotes bench/results/suite_time.json (tests/conftest.py): the file is data
a hand edit or a cut write can damage, so each value is checked before it is said, and a value that cannot be said
is named, never raised out of pytest's session start (which would stop the suite before its first test)."""

from __future__ import annotations

import json

import pytest

from conftest import measured

GOOD = {"wall_s": 356.2, "cores": 2, "idle": True, "others_cpu_share": 0.013, "date": "2026-12-06"}


def test_a_sound_file_is_quoted():
    assert measured().endswith("bench/results/suite_time.json)")  # the committed file


@pytest.mark.parametrize("change", [
    {"wall_s": "356"},                 # a number as text
    {"wall_s": float("inf")},          # JSON's Infinity
    {"wall_s": -5},                    # negative time
    {"wall_s": True},                  # a boolean is not a number of seconds
    {"cores": 0},                      # no cores
    {"cores": 2.5},                    # not a count
    {"idle": "yes"},                   # not a boolean
    {"others_cpu_share": None},        # missing where a busy run needs it
    {"date": "2026\n# not a date"},    # a line break in the quoted text
    {"date": 20261206},                # not text
])
def test_a_bad_value_is_named_not_raised(tmp_path, change):
    path = tmp_path / "suite_time.json"
    path.write_text(json.dumps({**GOOD, "idle": False, **change}))
    said = measured(path)
    assert said.startswith("not known (bench/results/suite_time.json cannot be quoted: ") and "\n" not in said
    assert next(iter(change)) in said


@pytest.mark.parametrize("content", ["[1, 2]", "{", "", '"text"'])
def test_a_file_that_is_not_a_json_object_is_named(tmp_path, content):
    path = tmp_path / "suite_time.json"
    path.write_text(content)
    assert measured(path).startswith("not known (bench/results/suite_time.json cannot be quoted: ")


def test_a_missing_key_is_named(tmp_path):
    path = tmp_path / "suite_time.json"
    path.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "cores"}))
    assert "cores is missing" in measured(path)
