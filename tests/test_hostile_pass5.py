"""Hostile inputs against one promise: grpokit deletes, truncates or replaces only files it wrote.

Each test pins one rule (its `Rule:` comment) where a hostile input could break a promise. Every test touches only pytest's tmp_path.
"""

from __future__ import annotations

from helpers import load_bench


# Rule: `python bench/gpu_memory.py --out DIR` (and --dry-run with --out) writes its results
# (`DIR/gpu_memory-<date>[-dry-run].json` and `.md`) through ownership, never opening a path "w": a symbolic link
# there (`gpu_memory-....json -> ../notes/plan.json`, kept by a user) is not followed, and the file it points to
# keeps its content (README: "grpokit's bookkeeping files are never written through a symbolic link"; a file grpokit
# did not write is never replaced).
def test_bench_results_never_truncate_a_file_reached_through_a_symlink(tmp_path):
    gpu_memory = load_bench("gpu_memory")
    theirs = tmp_path / "notes" / "plan.json"
    theirs.parent.mkdir()
    theirs.write_text("my own notes\n")
    out = tmp_path / "results"
    out.mkdir()
    (out / "gpu_memory-2026-01-01.json").symlink_to(theirs)
    results = {"date": "2026-01-01", "versions": {}, "note": "n", "cases": []}
    try:
        gpu_memory.write(results, out, "gpu_memory-2026-01-01")
    except (SystemExit, Exception):
        pass  # refused: what a fix may do
    assert theirs.read_text() == "my own notes\n", "a file grpokit did not write was overwritten through a link"


# Rule: the same writer does not replace a user's own file of that name in --out.
def test_bench_results_never_replace_a_users_file(tmp_path):
    gpu_memory = load_bench("gpu_memory")
    out = tmp_path / "results"
    out.mkdir()
    (out / "gpu_memory-2026-01-01.md").write_text("my hand-edited table\n")
    results = {"date": "2026-01-01", "versions": {}, "note": "n", "cases": []}
    try:
        gpu_memory.write(results, out, "gpu_memory-2026-01-01")
    except (SystemExit, Exception):
        pass
    assert (out / "gpu_memory-2026-01-01.md").read_text() == "my hand-edited table\n"
