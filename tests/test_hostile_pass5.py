"""A fifth hostile pass on one promise: grpokit deletes, truncates or replaces only files it wrote.

Each test reproduces one defect; each fails until the defect is fixed. Every test touches only pytest's tmp_path.
"""

from __future__ import annotations

from helpers import load_bench


# Reproduces: `python bench/gpu_memory.py --out DIR` (and --dry-run with --out) writes its results with Path.write_text,
# never through ownership: `DIR/gpu_memory-<date>[-dry-run].json` and `.md` are opened "w" -- following a symbolic link
# and truncating whatever file is there, grpokit's or not. A folder of one's own (a shared results folder, a link
# `gpu_memory-....json -> ../notes/plan.json` kept by a user) loses the file the link points to. The same script's
# --pack-deps got ownership checks in pass 4; its results writer is the one write path in bench/gpu_memory.py left
# without them (README: "grpokit's bookkeeping files are never written through a symbolic link"; the promise is that
# a file grpokit did not write is never replaced).
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


# Reproduces: the same writer replaces a user's own file of that name in --out (no check that grpokit wrote it).
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
