"""One door for files (grpokit.files): what grpokit writes, removes and parses back passes there, and nowhere else.

Rules pinned here: the raw forms of writing, removing and parsing a file appear only inside the door; every file
grpokit reads back (a trainer state, a manifest, an adapter config, a recipe) ends in a value or one line naming it,
exit 2 -- never a hang on a FIFO, never a RecursionError or TypeError traceback; the base model's eval never writes
into a folder no run may use; a save a kill cut short vouches for nothing put in its folder after the run died.
Every test touches only pytest's tmp_path.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, SMOKE_DATA, overwrite, with_trainer, write_recipe

from grpokit import cli, files
from grpokit.errors import RecipeError
from grpokit.files import ownership

DEEP = "[" * 100_000 + "]" * 100_000  # Python's JSON parser ends in RecursionError near 1,000 levels


# --- the raw forms live only inside the door ---------------------------------------------------------------

_DOOR = ROOT / "grpokit" / "files"
# The cage writes kernel interfaces (cgroups, /proc, mounts) inside its own root, never a file of the user's or a run's.
_CAGE = ROOT / "grpokit" / "untrusted"
_WRITE_MODES = set("wax+")


def _raw_forms(path, root=ROOT) -> list[str]:
    """Each raw write / remove / parse of a file in `path`, as 'file:line: what' (the file relative to `root`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func, what = node.func, None
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
        if name == "open" and owner in ("", "io", "builtins", "os") or name == "fdopen":
            modes = [a for a in node.args[1:2]] + [k.value for k in node.keywords if k.arg in ("mode", "flags")]
            mode = next((m.value for m in modes if isinstance(m, ast.Constant)), None)
            if owner == "os" and node.args[1:2] and not isinstance(node.args[1], ast.Constant):
                what = "os.open(...)"  # flags of a write: only the door knows which are safe
            elif isinstance(mode, str) and _WRITE_MODES & set(mode):
                what = f"open(..., {mode!r})"
        elif name == "open" and isinstance(func, ast.Attribute):  # Path(...).open("w")
            mode = next((a.value for a in node.args[:1] if isinstance(a, ast.Constant)), None)
            if isinstance(mode, str) and _WRITE_MODES & set(mode):
                what = f".open({mode!r})"
        elif name in ("write_text", "write_bytes") and owner not in ("files",):
            what = f".{name}(...)"
        elif name == "load" and owner == "json":
            what = "json.load(file)"
        elif name == "loads" and owner == "json" and node.args and isinstance(node.args[0], ast.Call) and \
                isinstance(node.args[0].func, ast.Attribute) and node.args[0].func.attr in ("read_text", "read_bytes", "read"):
            what = "json.loads(<file>.read...())"
        elif name in ("rmtree", "unlink", "remove", "rmdir", "savefig", "replace", "rename", "copyfile", "copy",
                      "copy2", "move") and (owner in ("shutil", "os") or name in ("rmtree", "unlink", "savefig", "rename")):
            what = f"{owner + '.' if owner else '.'}{name}(...)"
        if what:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {what}")
    return found


def test_no_module_outside_the_door_writes_removes_or_parses_a_file_raw():
    scanned = [ROOT / "launch.py"] + [p for folder in ("grpokit", "labs", "bench") for p in sorted((ROOT / folder).rglob("*.py"))
                                      if _DOOR not in p.parents and _CAGE not in p.parents]
    assert [hit for path in scanned for hit in _raw_forms(path)] == []


def test_the_scan_sees_each_raw_form(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import json, shutil, os\nopen(p, 'w')\np.write_text('x')\njson.load(f)\njson.loads(p.read_text())\n"
                      "shutil.rmtree(p)\np.unlink()\nfig.savefig(p)\nos.replace(a, b)\np.open('a')\nfiles.write_text(p, 'x')\n")
    hits = [h.partition(": ")[2] for h in _raw_forms(sample, tmp_path)]
    assert hits == ["open(..., 'w')", ".write_text(...)", "json.load(file)", "json.loads(<file>.read...())",
                    "shutil.rmtree(...)", "p.unlink(...)", "fig.savefig(...)", "os.replace(...)", ".open('a')"]


# --- reading: a value or one line, never a hang or a traceback ---------------------------------------------

@pytest.mark.parametrize("content, expect, message", [
    (DEEP, dict, "is nested deeper than 64 levels"),
    ("[]", dict, "holds a JSON array, not a JSON object"),
    ('{"a": 1}', list, "holds a JSON object, not a JSON array"),
    ("{", dict, "is not valid JSON (line 1, column 2: Expecting property name"),
    (b"\xff\xfe{}", dict, "is not UTF-8 text"),
])
def test_read_json_names_the_file_and_what_is_wrong(tmp_path, content, expect, message):
    path = tmp_path / "state.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(RecipeError) as caught:
        files.read_json(path, expect, key="--plot")
    assert str(caught.value).splitlines()[1] .startswith(f"  - {path}: --plot: {message}")


def test_read_refuses_a_fifo_at_once_and_a_file_past_its_bound(tmp_path):
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    assert files.try_json(fifo) == (None, "is a FIFO, not a regular file")  # returns at once: no writer is waited for
    big = tmp_path / "big.json"
    big.write_text("[" + "1," * 600 + "1]")
    assert files.try_json(big, list, limit=1000)[1] == "is larger than 1,000 bytes, the most grpokit reads of such a file"


def _fifo_state(folder):
    """A checkpoint of a run (claimed in the run's manifest) whose trainer_state.json is a FIFO."""
    folder.mkdir(parents=True)
    os.mkfifo(folder / "trainer_state.json")
    ownership.claim(folder.parent, [folder.name])
    return folder


def test_resume_from_a_checkpoint_whose_state_is_a_fifo_is_refused_at_once(tmp_path):
    recipe = write_recipe(tmp_path, with_trainer(tmp_path))
    checkpoint = _fifo_state(tmp_path / "run" / "checkpoint-1")
    # a hang would end at the timeout, as a failure: no reader may wait on a FIFO
    done = subprocess.run([sys.executable, "launch.py", "--recipe", str(recipe), "--resume-from", str(checkpoint)],
                          cwd=ROOT, text=True, capture_output=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "trainer_state.json is a FIFO, not a regular file" in done.stderr and "Traceback" not in done.stderr


def _run_with_state(folder, state: str):
    """A finished run's folder (or a checkpoint of one) whose trainer_state.json holds `state` (as text)."""
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(state)
    ownership.claim(folder, ["trainer_state.json"])
    if folder.name.startswith("checkpoint-"):
        ownership.claim(folder.parent, [folder.name])
    return folder


@pytest.mark.parametrize("state, message", [
    (DEEP, "nested deeper than 64 levels"),
    ("[]", "holds a JSON array, not a JSON object"),
    ('{"log_history": [1, "x", null]}', "log_history holds 3 entries that are not JSON objects"),
])
def test_plot_of_a_malformed_trainer_state_is_one_line(tmp_path, capsys, state, message):
    run = _run_with_state(tmp_path / "run", state)
    assert cli.main(["--plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_resume_from_a_deep_trainer_state_is_one_line(tmp_path, capsys, no_weights):
    recipe = write_recipe(tmp_path, with_trainer(tmp_path))
    checkpoint = _run_with_state(tmp_path / "run" / "checkpoint-1", DEEP)
    assert cli.main(["--recipe", str(recipe), "--resume-from", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert "trainer_state.json is damaged (it is nested deeper than 64 levels)" in err and "Traceback" not in err


def test_a_deep_manifest_is_not_grpokits_and_is_never_replaced(tmp_path, capsys, no_weights):
    run = tmp_path / "run"
    run.mkdir()
    (run / ownership.MANIFEST).write_text(DEEP)
    recipe = write_recipe(tmp_path, with_trainer(tmp_path))
    assert cli.main(["--recipe", str(recipe)]) == 2  # a new run into that folder
    assert cli.main(["--plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and (run / ownership.MANIFEST).read_text() == DEEP


@pytest.mark.parametrize("flag", ["--merge", "--eval"])
def test_a_deep_adapter_config_is_one_line_before_any_weights_load(tmp_path, capsys, no_weights, flag):
    run = tmp_path / "run"
    run.mkdir()
    (run / "adapter_config.json").write_text(DEEP)
    (run / "adapter_model.safetensors").write_text("x")
    data = with_trainer(tmp_path)
    data["dataset"].update(eval_path=str(SMOKE_DATA), eval_limit=4)
    argv = [flag, str(run)] + (["--recipe", str(write_recipe(tmp_path, data))] if flag == "--eval" else [])
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "adapter_config.json" in err and "nested deeper than 64 levels" in err and "Traceback" not in err


# --- recipes: every key a plain value, every integer one torch can hold --------------------------------------

def test_a_yaml_complex_key_is_one_line(tmp_path, capsys):
    data = with_trainer(tmp_path)
    recipe = write_recipe(tmp_path, "trainer:\n  ? [a, b]\n  : 1\n" +
                          "".join(f"{k}: {json.dumps(v)}\n" for k, v in data.items() if k != "trainer"))
    assert cli.main(["--recipe", str(recipe), "--check"]) == 2
    err = capsys.readouterr().err
    assert "line 2: a key must be a plain value (text or a number), not a list" in err and "Traceback" not in err


def test_an_integer_knob_past_64_bits_is_refused_at_check(tmp_path, capsys):
    recipe = write_recipe(tmp_path, with_trainer(tmp_path))
    assert cli.main(["--recipe", str(recipe), "--check", "trainer.max_steps=1000000000000000000000000000000"]) == 2
    err = capsys.readouterr().err
    assert "trainer.max_steps" in err and "at most 9223372036854775807" in err


# --- where a base model's eval may write -------------------------------------------------------------------

def test_eval_of_the_base_model_never_writes_into_the_home_folder(tmp_path, capsys, monkeypatch, no_weights):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    data = with_trainer(tmp_path, output_dir=str(home))
    data["dataset"].update(eval_path=str(SMOKE_DATA), eval_limit=4)
    recipe = write_recipe(tmp_path, data)
    assert cli.main(["--recipe", str(recipe), "--eval"]) == 2
    assert "trainer.output_dir: is the home directory" in capsys.readouterr().err
    assert sorted(os.listdir(home)) == []


# --- a save a kill cut short vouches for nothing put there after the run died --------------------------------

def _killed_run(tmp_path):
    """A run folder whose run was killed: its lock file left, with the time of its last heartbeat."""
    run = tmp_path / "run"
    run.mkdir()
    (run / ownership.LOCK_FILE).write_text("pid 1 on host, since then\n")
    (run / "report.md").write_text("# run\n")
    ownership.claim(run, ["report.md"])
    return run


def _after(path, moment_ns: int) -> None:
    """Change `path` until its ctime is past `moment_ns` (the kernel's clock ticks in steps of a few ms)."""
    while os.lstat(path).st_ctime_ns <= moment_ns:
        os.utime(path, ns=(os.lstat(path).st_atime_ns, os.lstat(path).st_mtime_ns))


def _die(run, monkeypatch) -> int:
    """The run dies now: its last heartbeat is the latest change in the folder; no slack after it."""
    monkeypatch.setattr(ownership, "HEARTBEAT_S", 0.0)
    last = max(os.lstat(os.path.join(top, n)).st_ctime_ns for top, dirs, names in os.walk(run) for n in dirs + names)
    os.utime(run / ownership.LOCK_FILE, ns=(last, last))
    return last


def test_a_folder_added_after_a_killed_final_save_is_never_removed(tmp_path, monkeypatch):
    run = _killed_run(tmp_path)
    ownership.start_pending(run)  # the final save starts ...
    (run / "adapter_model.safetensors").write_text("weights")  # ... writes a file ...
    died = _die(run, monkeypatch)  # ... and the process is SIGKILLed here
    (run / "mine").mkdir()  # later, the user adds a folder of their own
    (run / "mine" / "notes.txt").write_text("keep")
    _after(run / "mine", died)
    _after(run / "mine" / "notes.txt", died)
    with pytest.raises(RecipeError, match="mine"):
        overwrite(run)
    assert (run / "mine" / "notes.txt").read_text() == "keep"
    assert ownership.listed(run) >= {"adapter_model.safetensors", "report.md"}  # what the save wrote stays the run's


def test_a_file_moved_into_a_killed_checkpoint_with_an_old_mtime_is_never_removed(tmp_path, monkeypatch):
    run = _killed_run(tmp_path)
    ownership.claim_writing(run, "checkpoint-2")  # the checkpoint's save starts ...
    (run / "checkpoint-2").mkdir()
    (run / "checkpoint-2" / "model.safetensors").write_text("half")
    died = _die(run, monkeypatch)  # ... and the process is SIGKILLed here
    notes = tmp_path / "notes.txt"
    notes.write_text("keep")
    os.utime(notes, ns=(died - 10**9, died - 10**9))  # an old file: its mtime says it is older than the kill
    os.replace(notes, run / "checkpoint-2" / "notes.txt")  # moved in later (a move sets the change time)
    _after(run / "checkpoint-2" / "notes.txt", died)
    with pytest.raises(RecipeError, match="checkpoint-2/notes.txt"):
        overwrite(run)
    assert (run / "checkpoint-2" / "notes.txt").read_text() == "keep"


def test_a_live_run_moves_its_heartbeat(tmp_path):
    from grpokit.checkpoints.rundir import RunLock

    with RunLock(tmp_path / "run", "recipe.yaml") as lock:
        lock.beating.wait(0)  # the thread has started: its first beat moves the lock file's time
        first = os.lstat(tmp_path / "run" / ownership.LOCK_FILE).st_mtime_ns
        assert lock.beating is not None and not lock.beating.is_set()
    assert lock.beating.is_set() and first > 0


# --- results committed to git stay grpokit's in a clone ------------------------------------------------------

def test_a_file_the_door_wrote_stays_grpokits_when_copied_unchanged_and_not_once_edited(tmp_path):
    results = tmp_path / "results"
    files.write_text(results / "table.md", "| a |\n")
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in ("table.md", ownership.MANIFEST):  # what `git clone` makes: new inodes, new times, same bytes
        (clone / name).write_bytes((results / name).read_bytes())
    files.write_text(clone / "table.md", "| b |\n")  # the script that made it may refresh it
    (clone / "table.md").write_text("| b |\nmy note\n")  # a person edits it
    with pytest.raises(RecipeError, match="table.md"):
        files.write_text(clone / "table.md", "| c |\n")
    assert (clone / "table.md").read_text() == "| b |\nmy note\n"


# --- the door's removals reach only grpokit's own names ------------------------------------------------------------

def test_remove_build_removes_only_a_build_folder_of_grpokits_form_and_never_through_a_link(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("keep")
    for name in ("model", "model.tmp-x", "model.tmp-"):  # not NAME.tmp-PID: refused, nothing removed
        (tmp_path / name).mkdir()
        with pytest.raises(ValueError, match="not a build folder grpokit makes"):
            files.remove_build(tmp_path / name)
        assert (tmp_path / name).is_dir()
    (tmp_path / "model.tmp-123").symlink_to(theirs)  # a link of the right form: refused, its target untouched
    with pytest.raises(ValueError):
        files.remove_build(tmp_path / "model.tmp-123")
    assert (theirs / "notes.txt").read_text() == "keep"


def test_remove_bookkeeping_removes_grpokits_bookkeeping_names_only(tmp_path):
    (tmp_path / "notes.txt").write_text("keep")
    (tmp_path / ownership.LOCK_FILE).write_text("pid 1\n")
    with pytest.raises(ValueError, match="not one of grpokit's bookkeeping files"):
        files.remove_bookkeeping(tmp_path, ["notes.txt"])
    files.remove_bookkeeping(tmp_path, [ownership.LOCK_FILE, ownership.MANIFEST])  # a missing one is no error
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_build_folder_keeps_the_first_finished_folder_and_leaves_no_build_behind(tmp_path):
    target = tmp_path / "cache" / "model"

    def build(into):
        (into / "weights").write_text("ours")

    assert files.build_folder(target, build) == target and (target / "weights").read_text() == "ours"
    files.build_folder(target, lambda into: (into / "weights").write_text("second"))  # another process was first
    assert (target / "weights").read_text() == "ours" and sorted(os.listdir(target.parent)) == ["model"]

    def fails(into):
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError):
        files.build_folder(tmp_path / "cache" / "other", fails)
    assert sorted(os.listdir(target.parent)) == ["model"]
