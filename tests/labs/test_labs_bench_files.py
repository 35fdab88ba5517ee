"""The labs' and benches' files pass the one door (grpokit.files): what they write and what they read back.

Each script, pointed with --out at a folder or file of the user's, replaces nothing it did not write, never writes
through a symbolic link, and writes nothing at all when it refuses; a malformed input it reads back (a results file,
a measures file, a trainer state) ends in one line naming the file and exit 2, never in a traceback. Every path a
test hands a script lies in pytest's tmp_path; where a refusal must come before costly work (training, measuring),
that work is replaced by a stub that fails the test if reached.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import date
from pathlib import Path

import pytest
from helpers import ROOT, load_bench

from grpokit import files
from grpokit.errors import RecipeError
from labs import algorithms as lab_algorithms
from labs import grpo_pieces

MINE = "the user's own file\n"


def refused(capsys, code: int, name: str) -> str:
    """The script's exit was 2 with one line on stderr naming `name`, and no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in err, err
    return lines[0]


def must_not_run(*args, **kwargs):
    pytest.fail("costly work started before the script refused its output")


def users_file(path: Path, text: str = MINE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def link_out(link: Path, tmp_path: Path) -> Path:
    """A symbolic link at `link` to a file of the user's outside the folder; returns that file."""
    target = users_file(tmp_path / "elsewhere" / f"{link.name}.target")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return target


# -- labs/grpo_pieces.py ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["kl_estimators.csv", "kl_estimators.png"])
def test_pieces_refuses_a_users_file_in_out_and_writes_neither_file(tmp_path, capsys, name):
    out = tmp_path / "lab"
    users_file(out / name)
    refused(capsys, grpo_pieces.main(["--out", str(out)]), name)
    assert (out / name).read_text() == MINE
    assert sorted(p.name for p in out.iterdir() if p.name != files.ownership.MANIFEST) == [name]


@pytest.mark.parametrize("name", ["kl_estimators.csv", "kl_estimators.png"])
def test_pieces_never_writes_through_a_link_in_out(tmp_path, capsys, name):
    out = tmp_path / "lab"
    target = link_out(out / name, tmp_path)
    refused(capsys, grpo_pieces.main(["--out", str(out)]), name)
    assert target.read_text() == MINE and (out / name).is_symlink()


def test_pieces_replaces_its_own_files_on_a_second_run(tmp_path, capsys):
    out = tmp_path / "lab"
    assert grpo_pieces.main(["--out", str(out)]) == 0
    first = (out / "kl_estimators.csv").read_text()
    assert grpo_pieces.main(["--out", str(out)]) == 0
    assert (out / "kl_estimators.csv").read_text() == first and (out / "kl_estimators.png").read_bytes()[:4] == b"\x89PNG"


# -- labs/algorithms.py ----------------------------------------------------------------------------------------

REPORT = ["README.md", "table.md", "lab.json", "claim-length_growth.png", "claim-kl_to_reference.png"]


@pytest.mark.parametrize("name", REPORT)
def test_lab_report_refuses_a_users_file_in_out_and_writes_nothing(tmp_path, capsys, name):
    out = tmp_path / "lab"
    users_file(out / name, '{"command": "mine"}\n' if name == "lab.json" else MINE)
    refused(capsys, lab_algorithms.main(["--report-only", "--out", str(out)]), name)
    assert (out / name).read_text() == ('{"command": "mine"}\n' if name == "lab.json" else MINE)
    assert sorted(p.name for p in out.iterdir() if p.name != files.ownership.MANIFEST) == [name]


def test_lab_report_never_writes_through_a_link(tmp_path, capsys):
    out = tmp_path / "lab"
    target = link_out(out / "README.md", tmp_path)
    refused(capsys, lab_algorithms.main(["--report-only", "--out", str(out)]), "README.md")
    assert target.read_text() == MINE


@pytest.mark.parametrize("text", ["not json {", "[1, 2]", '{"command": 3}'])
def test_lab_report_reads_a_damaged_lab_json_as_one_line(tmp_path, capsys, text):
    out = tmp_path / "lab"
    files.write_text(out / "lab.json", text)  # grpokit's own file, damaged: the reading must say so, not the owner check
    refused(capsys, lab_algorithms.main(["--report-only", "--out", str(out)]), "lab.json")
    assert (out / "lab.json").read_text() == text


def test_lab_report_replaces_its_own_page_and_keeps_the_training_command(tmp_path, capsys):
    out = tmp_path / "lab"
    assert lab_algorithms.main(["--report-only", "--out", str(out)]) == 0
    lab = json.loads((out / "lab.json").read_text())
    files.write_text(out / "lab.json", json.dumps({**lab, "command": "python labs/algorithms.py --seeds 7"}))
    assert lab_algorithms.main(["--report-only", "--out", str(out)]) == 0
    assert "python labs/algorithms.py --seeds 7" in (out / "README.md").read_text()


def fake_run(runs: Path, job) -> None:
    run = job.run_dir(runs)
    run.mkdir(parents=True)
    history = [{"step": i + 1, "loss": 0.0, "completions/mean_length": 10.0, "entropy": 1.0} for i in range(6)]
    (run / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": 6}))


@pytest.mark.parametrize("name,text", [("grpo-seed-0.json", "{"), ("grpo-seed-0.json", '{"pass@1": 0.5}'),
                                       ("base-eval.json", "[]"), ("base-eval.json", '{"greedy": {}}')])
def test_lab_report_reads_a_damaged_measures_file_as_one_line(tmp_path, capsys, name, text):
    out = tmp_path / "lab"
    fake_run(out / "runs", lab_algorithms.Job("grpo", 0))
    files.write_text(out / "measures" / name, text)
    refused(capsys, lab_algorithms.main(["--report-only", "--out", str(out)]), name)
    assert not (out / "README.md").exists()


def test_lab_log_is_appended_by_every_step_of_a_run_and_stays_grpokits(tmp_path):
    log = tmp_path / "runs" / "grpo" / "seed-0.log"
    for word in ("first", "second"):
        lab_algorithms.run_logged([sys.executable, "-c", f"print('{word}')"], log, 1)
    text = log.read_text()
    assert "first" in text and "second" in text and text.index("first") < text.index("second")


def test_lab_log_refuses_a_users_file_and_a_link(tmp_path):
    mine = users_file(tmp_path / "runs" / "grpo" / "seed-0.log")
    with pytest.raises(RecipeError, match="seed-0.log"):
        lab_algorithms.run_logged([sys.executable, "-c", "print('x')"], mine, 1)
    assert mine.read_text() == MINE
    target = link_out(tmp_path / "runs" / "grpo" / "seed-1.log", tmp_path)
    with pytest.raises(RecipeError, match="seed-1.log"):
        lab_algorithms.run_logged([sys.executable, "-c", "print('x')"], tmp_path / "runs" / "grpo" / "seed-1.log", 1)
    assert target.read_text() == MINE


def test_lab_run_with_a_users_log_fails_by_name_and_the_lab_says_so(tmp_path):
    out = tmp_path / "lab"
    files.write_text(out / "measures" / "base-eval.json", "{}")  # the base model counts as scored: nothing is launched
    mine = users_file(lab_algorithms.Job("grpo", 0).log(out / "runs"))
    failures = lab_algorithms.run_all([lab_algorithms.Job("grpo", 0)], out / "runs", out, [], 1, every=0.1)
    assert len(failures) == 1 and "grpo seed 0" in failures[0] and "seed-0.log" in failures[0], failures
    assert mine.read_text() == MINE


def test_lab_progress_line_does_not_wait_on_a_fifo_at_a_log(tmp_path):
    job = lab_algorithms.Job("grpo", 0)
    job.log(tmp_path).parent.mkdir(parents=True)
    os.mkfifo(job.log(tmp_path))
    lines = []
    reader = threading.Thread(target=lambda: lines.append(
        lab_algorithms.progress_line([job], tmp_path, tmp_path, {job}, 0.0)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # let the blocked reader go before failing
        os.close(os.open(job.log(tmp_path), os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("progress_line waited on a FIFO")
    assert "grpo seed 0 starting" in lines[0]


# -- bench/plan_vs_measured.py ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pvm():
    return load_bench("plan_vs_measured")


def tiny_record() -> dict:
    committed = json.loads((ROOT / "bench" / "results" / "plan_vs_measured_cpu.json").read_text())
    return next(r for r in committed["records"] if r["setting"]["name"] == "tiny-qwen-lora")


def test_replan_refuses_a_users_json_and_leaves_it_as_it_was(tmp_path, capsys, pvm):
    out = users_file(tmp_path / "mine.json", json.dumps({"records": [], "my": "keys"}))
    refused(capsys, pvm.main(["--replan", "--out", str(out)]), "mine.json")
    assert json.loads(out.read_text()) == {"records": [], "my": "keys"}


def test_replan_refuses_a_copy_of_the_results_it_did_not_write(tmp_path, capsys, pvm):
    out = users_file(tmp_path / "copy.json", json.dumps({"records": [tiny_record()]}))
    before = out.read_text()
    refused(capsys, pvm.main(["--replan", "--out", str(out)]), "copy.json")
    assert out.read_text() == before


@pytest.mark.parametrize("text", ["not json", "[]", '{"records": 3}', '{"records": [7]}',
                                  '{"records": [{"setting": {"name": "no-such-setting"}}]}',
                                  '{"records": [{"setting": {"name": "tiny-qwen-lora"}, "measured": {"phases": []}}]}'])
def test_replan_reads_results_of_the_wrong_shape_as_one_line(tmp_path, capsys, pvm, text):
    out = tmp_path / "results.json"
    files.write_text(out, text)  # grpokit's own file, damaged
    refused(capsys, pvm.main(["--replan", "--out", str(out)]), "results.json")
    assert out.read_text() == text


def test_replan_replaces_its_own_results(tmp_path, capsys, pvm):
    out = tmp_path / "results.json"
    pvm.write(out, [tiny_record()], 1)
    assert pvm.main(["--replan", "--out", str(out)]) in (0, 1)
    assert [r["setting"]["name"] for r in json.loads(out.read_text())["records"]] == ["tiny-qwen-lora"]


def test_a_measuring_run_refuses_a_users_out_before_measuring(tmp_path, capsys, pvm, monkeypatch):
    monkeypatch.setattr(pvm, "measure", must_not_run)
    out = users_file(tmp_path / "mine.json", json.dumps({"records": [tiny_record()]}))
    refused(capsys, pvm.main(["--settings", "tiny-qwen-lora", "--out", str(out)]), "mine.json")


# -- bench/real_model.py ---------------------------------------------------------------------------------------


@pytest.fixture
def real_model(monkeypatch):
    module = load_bench("real_model")
    for costly in ("train_seed", "eval_run", "score"):
        monkeypatch.setattr(module, costly, must_not_run)
    return module


@pytest.mark.parametrize("name", ["real.json", "real.png"])
def test_real_model_refuses_a_users_out_before_any_work(tmp_path, capsys, real_model, name):
    users_file(tmp_path / name)
    refused(capsys, real_model.main(["--report-only", "--out", str(tmp_path / "real.json")]), name)
    assert (tmp_path / name).read_text() == MINE


def test_real_model_never_writes_through_a_link(tmp_path, capsys, real_model):
    target = link_out(tmp_path / "real.json", tmp_path)
    refused(capsys, real_model.main(["--report-only", "--out", str(tmp_path / "real.json")]), "real.json")
    assert target.read_text() == MINE


def test_real_model_readme_section_needs_its_markers_and_no_link(tmp_path, real_model):
    readme = users_file(tmp_path / "README.md", "# bench\nno markers here\n")
    with pytest.raises(RecipeError, match="README.md"):
        real_model.write_readme_section("table", readme)
    assert readme.read_text() == "# bench\nno markers here\n"
    page = f"# bench\n{real_model.BEGIN}\nold\n{real_model.END}\nafter\n"
    users_file(tmp_path / "page.md", page)
    real_model.write_readme_section("new", tmp_path / "page.md")
    assert (tmp_path / "page.md").read_text() == f"# bench\n{real_model.BEGIN}\nnew\n{real_model.END}\nafter\n"
    target = link_out(tmp_path / "linked.md", tmp_path)
    target.write_text(page)
    with pytest.raises(RecipeError, match="linked.md"):
        real_model.write_readme_section("new", tmp_path / "linked.md")
    assert target.read_text() == page


@pytest.mark.parametrize("text", ["{", "[]", '{"log_history": 3}'])
def test_real_model_reads_a_damaged_trainer_state_as_one_line(tmp_path, real_model, text):
    users_file(tmp_path / "run" / "adapter_config.json", "{}")
    users_file(tmp_path / "run" / "trainer_state.json", text)
    with pytest.raises(RecipeError, match="trainer_state.json"):
        real_model.trained_state(tmp_path / "run")


# -- bench/gpu_memory.py and bench/gpu_generation.py -----------------------------------------------------------


@pytest.mark.parametrize("bench,results", [("gpu_memory", {"date": "d", "versions": {}, "note": "n", "cases": []}),
                                           ("gpu_generation", {"date": "d", "versions": {}, "note": "n", "engines": [],
                                                               "cap_gib": 16.0, "recipe": "r"})])
def test_gpu_bench_results_write_nothing_when_one_file_is_the_users(tmp_path, bench, results):
    module = load_bench(bench)
    users_file(tmp_path / "stem.md")
    with pytest.raises(RecipeError, match="stem.md"):
        module.write(results, tmp_path, "stem")
    assert not (tmp_path / "stem.json").exists() and (tmp_path / "stem.md").read_text() == MINE


def test_gpu_memory_refuses_a_users_results_file_before_any_case(tmp_path, capsys, monkeypatch):
    module = load_bench("gpu_memory")
    monkeypatch.setattr(module, "run_case", must_not_run)
    name = f"gpu_memory-{date.today().isoformat()}-dry-run.md"
    users_file(tmp_path / name)
    refused(capsys, module.main(["--dry-run", "--cases", "3b-lora", "--out", str(tmp_path)]), name)


def test_gpu_generation_refuses_a_users_results_file_before_building_the_model(tmp_path, capsys, monkeypatch):
    module = load_bench("gpu_generation")
    monkeypatch.setattr(module, "build_model", must_not_run)
    name = f"gpu_generation-{date.today().isoformat()}-dry-run.json"
    link_out(tmp_path / name, tmp_path)
    refused(capsys, module.main(["--dry-run", "--engines", "hf", "--out", str(tmp_path)]), name)


def test_pack_deps_refuses_a_users_folder_and_a_link_with_one_line(tmp_path, capsys, monkeypatch):
    module = load_bench("gpu_memory")
    monkeypatch.setattr(module.shutil, "copytree", must_not_run)
    users_file(tmp_path / "deps" / "notes.txt")
    refused(capsys, module.main(["--pack-deps", str(tmp_path / "deps")]), "notes.txt")
    (tmp_path / "empty").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "empty")
    refused(capsys, module.main(["--pack-deps", str(tmp_path / "linked")]), "linked")
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.mark.parametrize("name", ["refusals", "outputs"])
def test_labs_docstring_examples_run(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"labs.{name}"))
    assert result.attempted and not result.failed


# --- bench/gpu_memory.py's results writer (write, for --out): a link there is not followed, a user's file not replaced.


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


# --- bench/cpu_speed.py ---------------------------------------------------------------------------------------------

def test_cpu_speed_refuses_a_users_results_file_before_any_run(tmp_path, capsys, monkeypatch):
    cpu_speed = load_bench("cpu_speed")
    monkeypatch.setattr(cpu_speed, "run_one", lambda *a: pytest.fail("a run started before the outputs were checked"))
    theirs = tmp_path / "speed.json"
    theirs.write_text("my notes\n")
    assert cpu_speed.main(["--out", str(theirs)]) == 2
    assert "exists and grpokit did not write it" in capsys.readouterr().err and theirs.read_text() == "my notes\n"


def test_cpu_speed_measures_each_dtype_thread_count_and_wait_policy_it_is_asked_for():
    cpu_speed = load_bench("cpu_speed")
    labels = [s["label"] for s in cpu_speed.settings(2, [])]
    assert len(labels) == 8 and "bfloat16, 2 thread(s), passive" in labels and "float32, 1 thread(s), active" in labels
    assert [s["label"] for s in cpu_speed.settings(2, ["bfloat16, 1"])] == ["bfloat16, 1 thread(s), active",
                                                                           "bfloat16, 1 thread(s), passive"]


def test_a_bench_or_lab_stopped_by_a_signal_says_so_in_one_line_with_the_shells_exit_code(capsys):
    """A bench trains in its own process (bench/real_model.py calls grpokit.run.training directly): a second SIGTERM
    stops it at once with grpokit's Stopped, which must end as one line and exit 143, as launch.py does, not as
    a traceback through the trainer."""
    import signal

    from grpokit.lifecycle import Stopped
    from labs.refusals import one_line_exit

    @one_line_exit
    def main():
        raise Stopped(signal.SIGTERM)

    assert main() == 143
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["test_labs_bench_files.py: stopped by SIGTERM, at once"]


# -- where results go by default (labs/outputs.py) ---------------------------------------------------------------
# Rule: a lab or bench script run with its defaults writes nothing git tracks (it writes under runs/, gitignored), so a
# try never replaces the committed reference results; those change only with --commit-results. Each case stops at the
# first file the script is about to write or declares it will write (the file door's own calls), so nothing is written
# and nothing costly runs; the paths it named are then asked of git.


class _Declared(Exception):
    """Raised by the door's stand-in at the script's first write (or declaration of its writes)."""


@pytest.fixture
def declared(monkeypatch):
    """The paths a script handed the file door, the door replaced by a recorder that stops the script there."""
    from grpokit.files import ownership

    paths: list[Path] = []

    def record(first, *args, **kwargs):
        paths.extend([Path(first)] if isinstance(first, (str, Path)) else [Path(p) for p in first])
        raise _Declared

    for name in ("refuse_unless_replaceable", "write_text", "replace_text"):
        monkeypatch.setattr(ownership, name, record)
    return paths


def _tracked_or_unignored(paths: list[Path]) -> list[str]:
    """The paths git would show in `git status` once written: those inside the checkout that no .gitignore covers."""
    import subprocess

    inside = [p.resolve() for p in paths if ROOT in p.resolve().parents]
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    got = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--stdin"], input="\n".join(map(str, inside)),
                         capture_output=True, text=True)
    ignored = {Path(line).resolve() for line in got.stdout.splitlines()}
    return [str(p.relative_to(ROOT)) for p in inside if p not in ignored]


# What a script computes before its first write, replaced by nothing: the whole suite, a measured setting.
BEFORE_WRITING = {"suite_time": ("measure", {}), "plan_vs_measured": ("run", [])}


DEFAULT_RUNS = [("labs", "algorithms", ["--report-only"]), ("labs", "algorithms", ["--report-only", "--task", "chain_sum"]),
                ("labs", "grpo_pieces", []), ("bench", "tasks", ["--report-only"]), ("bench", "tool_use", ["--report-only"]),
                ("bench", "tool_use", ["--report-only", "--recipe", "multi_call"]), ("bench", "multi_call", ["--base"]),
                ("bench", "real_model", ["--seeds", "0"]), ("bench", "cage_cost", ["--before", "/nonexistent"]),
                ("bench", "cpu_speed", []), ("bench", "python_tool", []), ("bench", "sampled_calls", []),
                ("bench", "plan_vs_measured", ["--settings", "tiny-qwen-lora"]), ("bench", "suite_time", [])]


@pytest.mark.parametrize("where,name,argv", DEFAULT_RUNS, ids=[f"{n} {' '.join(a)}".strip() for _, n, a in DEFAULT_RUNS])
def test_a_script_run_with_its_defaults_leaves_git_status_clean(declared, monkeypatch, where, name, argv):
    import importlib

    module = importlib.import_module(f"labs.{name}") if where == "labs" else load_bench(name)
    if name in BEFORE_WRITING:
        costly, result = BEFORE_WRITING[name]
        monkeypatch.setattr(module, costly, lambda *args, **kwargs: result)
    with pytest.raises(_Declared):
        module.main(argv)
    assert declared, f"{name} wrote nothing"
    assert _tracked_or_unignored(declared) == [], f"{name} {argv} would change what git tracks"


@pytest.mark.parametrize("task,folder", [("additions", "lab"), ("chain_sum", "lab-chain_sum")])
def test_the_committed_lab_results_are_written_only_when_asked_for_by_name(declared, task, folder):
    with pytest.raises(_Declared):
        lab_algorithms.main(["--report-only", "--task", task, "--commit-results"])
    assert {p.parent for p in declared} == {ROOT / "bench" / "results" / folder}
