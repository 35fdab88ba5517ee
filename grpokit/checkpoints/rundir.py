"""The run directory (`trainer.output_dir`): its checkpoints, which one to resume, guarding a previous run, and
whether a model folder in it (or anywhere) holds its weights.

A leaf: imports only grpokit's other leaves (errors, dist, files).
"""

from __future__ import annotations

import sys
from pathlib import Path

import grpokit.files as files
from grpokit.dist import is_main_process, num_processes_from_env, say
from grpokit.errors import Problem, RecipeError
from grpokit.files import ownership

STATE_FILE = "trainer_state.json"  # what the trainer saves in output_dir and in every checkpoint-N/
RECIPE_FILE = "recipe.yaml"  # the resolved recipe a run saves beside its results
EVAL_FILE = "eval.json"  # `--eval RUN_DIR`: the trained run's held-out figures
BASE_EVAL_FILE = "eval-base.json"  # `--eval` of the base model, written before the run: its "before" figures
WARM_EVAL_FILE = "eval-warm-start.json"  # `--eval RUN_DIR/warm_start`: the figures of the model GRPO started from


LOCK_FILE = ownership.LOCK_FILE  # held by the run writing to output_dir (RunLock), with its pid for the message
_held: set[str] = set()  # run directories this process holds: POSIX locks do not conflict within one process


class RunLock:
    """An exclusive lock on a run directory for the run's whole life; a second run into it is refused (exit 2).

    `fcntl.lockf` (a POSIX record lock) on `output_dir/.grpokit.lock`: the kernel drops it when the holding
    process ends however it ends (SIGKILL, OOM, a node reboot of a local disk), so a stale lock of a dead run
    never blocks the next one; and unlike `flock` it is not inherited by forked children (math or dataloader
    workers), which could outlive a killed run and keep its lock. The one rule it brings: this process must
    not open and close the lock file elsewhere, which would drop the lock -- nothing else in grpokit reads it.

    In a multi-process launch only the main process locks (other ranks would conflict with it); if it refuses,
    it exits 2 before any weights load and the launcher stops the other ranks, which write nothing into the
    directory before the trainer starts.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> with RunLock(d / "run", "my.yaml"):
    ...     (d / "run" / LOCK_FILE).is_file()
    True
    """

    def __init__(self, output_dir: Path, recipe_path: str):
        self.output_dir, self.recipe_path, self.fd, self.created = Path(output_dir), recipe_path, None, False
        self.recorder: ownership.Recorder | None = None
        self.began = False  # the run has started writing: what appears now is recorded as its own
        self.beating = None  # the heartbeat's stop event (`_heartbeat`)

    def begin(self) -> None:
        """Every check has passed and the run starts writing (only then does the lock's exit record anything)."""
        self.began = True

    def record(self) -> None:
        """Note in the folder's manifest what the run has written so far (`ownership.Recorder`); main process only."""
        if self.recorder is not None:
            self.recorder.record()

    def claim_writing(self, name: str) -> None:
        """`name` is about to be written by the run (a checkpoint): grpokit's even if a kill cuts the write short."""
        if self.recorder is not None:
            ownership.claim_writing(self.output_dir, name)

    def pending(self) -> None:
        """A save of names the run does not choose starts now (the final save; see `ownership.start_pending`)."""
        if self.recorder is not None:
            ownership.start_pending(self.output_dir)

    def _problem(self, message: str) -> RecipeError:
        return RecipeError([Problem("trainer.output_dir", message, str(self.output_dir), file=self.recipe_path)])

    def __enter__(self) -> "RunLock":
        if not is_main_process():
            return self
        import fcntl
        import os

        self.created = not self.output_dir.exists()
        # the folders this run makes above its own (runs/a for runs/a/b): a run that writes nothing leaves none of them
        self.made_parents = [p for p in reversed(self.output_dir.absolute().parents) if not p.exists()]
        self.made_lock = not (self.output_dir / LOCK_FILE).exists()
        try:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            # never through a link: a planted .grpokit.lock pointing elsewhere would have its target overwritten
            fd = files.open_lock(self.output_dir / LOCK_FILE)
        except OSError as err:
            if (self.output_dir / LOCK_FILE).is_symlink():
                raise self._problem(f"its {LOCK_FILE} is a symbolic link, not a lock grpokit made; remove the link, or "
                                    "choose another trainer.output_dir=...") from None
            raise self._problem(f"cannot be written ({err.strerror or err}); choose a writable trainer.output_dir=...") from None
        theirs = self._not_a_lock(fd)
        if theirs:
            os.close(fd)
            raise self._problem(f"holds a {LOCK_FILE} grpokit did not write ({theirs}); it is left as it is: move it, or "
                                "choose another trainer.output_dir=...")
        key = str(self.output_dir.resolve())
        try:
            if key in _held:
                raise BlockingIOError
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "starting"
            os.close(fd)
            raise self._problem(f"is in use by another run ({holder}); wait for it to end, or choose another "
                                "trainer.output_dir=...") from None
        try:
            current = os.stat(self.output_dir / LOCK_FILE).st_ino
        except OSError:
            current = None
        if current != os.fstat(fd).st_ino:  # a run that wrote nothing removed the file as we opened it: lock the new one
            os.close(fd)
            return self.__enter__()
        import socket
        import time

        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        self.fd = fd
        _held.add(key)
        self.recorder = ownership.Recorder(self.output_dir)
        self._heartbeat()
        return self

    def _heartbeat(self) -> None:
        """While the run lives, move the lock file's modification time every `ownership.HEARTBEAT_S`: after a kill it
        tells when the run died, so a save the kill cut short vouches for nothing put in the folder after that
        (see `ownership._window`). Through the open descriptor: the lock file is never opened again."""
        import os
        import threading

        stop, fd = threading.Event(), self.fd
        self.beating = stop

        def beat():
            while not stop.is_set():
                try:
                    os.utime(fd)
                except OSError:
                    return
                stop.wait(ownership.HEARTBEAT_S)

        threading.Thread(target=beat, name="grpokit-heartbeat", daemon=True).start()

    @staticmethod
    def _not_a_lock(fd: int) -> str | None:
        """Why the file open at `fd` is not a lock file grpokit wrote (so must not be emptied), or None."""
        import os
        import stat

        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_nlink > 1:
            return "a hard link to another file"
        head = os.pread(fd, 4, 0)
        return None if head in (b"", b"pid ") else "not a run's pid line"

    def __exit__(self, *exc) -> None:
        if self.fd is None:
            return
        import os

        _held.discard(str(self.output_dir.resolve()))
        self.beating.set()
        if self.created and not ownership.entries(self.output_dir):
            try:  # the run failed before writing anything: leave no folder behind
                files.remove_bookkeeping(self.output_dir, (ownership.MANIFEST, LOCK_FILE))
                self.output_dir.rmdir()
                for parent in reversed(self.made_parents):  # deepest first; one that now holds anything stays
                    parent.rmdir()
            except OSError:
                pass  # another run is starting in it: the folder is its now
        else:
            if self.began:
                self.record()
            if self.made_lock and not ownership.listed(self.output_dir):
                files.remove_bookkeeping(self.output_dir, (LOCK_FILE,))  # a refused folder keeps no trace of the attempt
        os.close(self.fd)  # releases the lock
        self.fd = None


def guard_output_dir(output_dir: Path, resume: str | None, overwrite: bool, recipe_path: str, recipe: Path | None = None) -> list[str]:
    """A previous run is never silently destroyed, and nothing but a previous run is ever removed.

    Returns the entries `--overwrite` will remove -- the previous run's, as its manifest lists them -- which the
    caller removes only once the new run has passed every check (`remove_previous`). Refused (RecipeError): a
    folder that can never hold a run (`ownership.forbidden_reason`), a previous run without --resume or
    --overwrite, and a folder holding anything grpokit did not write -- for --overwrite, which would remove it, and
    for --resume, which would write the run's model, report and recipe among it and let the trainer's checkpoint
    rotation delete a checkpoint holding it. The base model's eval (`eval-base.json`, written before the run)
    neither blocks a run nor goes with --overwrite.

    Only the main process judges: another rank could otherwise see the main one's fresh `recipe.yaml` and
    refuse its own run; when the main process refuses, the launcher stops them all.
    """
    forbidden = forbidden_problems(output_dir, recipe, recipe_path)
    if forbidden:
        raise RecipeError(forbidden)
    if ownership.manifest_is_theirs(output_dir):
        raise RecipeError([Problem("trainer.output_dir", f"holds a {ownership.MANIFEST} that is not a manifest grpokit "
                                   "wrote (grpokit keeps its record of what it wrote under that name); it is left as it "
                                   "is: move it, or choose another trainer.output_dir=...", str(output_dir), file=recipe_path)])
    previous = [n for n in ownership.entries(output_dir) if n != BASE_EVAL_FILE]
    if not is_main_process() or not previous:
        return []
    # kept either way (eval-base.json blocks nothing); inside grpokit's folders, what it did not record
    others = [n for n in ownership.foreign(output_dir) if n != BASE_EVAL_FILE] + ownership.unknown_inside(output_dir)
    if others:
        fix = ("--resume would write its model, report and recipe among them" if resume else
               "--overwrite cannot replace it" if overwrite else "a new run cannot start in it")
        fix += ": choose a new or empty trainer.output_dir=..." if not resume else ": move them out of the folder first"
        if not ownership.listed(output_dir) and (output_dir / RECIPE_FILE).is_file() and (output_dir / LOCK_FILE).exists():
            fix += ("; it looks like a run of a grpokit that kept no manifest (.grpokit-files): if everything in it is "
                    "yours to lose, remove the folder yourself")
        raise RecipeError([ownership.foreign_problem(output_dir, "trainer.output_dir", others, fix, recipe_path)])
    if resume:
        return []
    if not overwrite:
        raise RecipeError([Problem("trainer.output_dir", "already holds a run; pass --resume to continue it, --overwrite to replace it, "
                                   "or choose another trainer.output_dir=...", str(output_dir), file=recipe_path)])
    return previous


def forbidden_problems(output_dir: Path, recipe: Path | None, recipe_path: str) -> list[Problem]:
    """The output folder is never `/`, the home directory, or the recipe's own folder (or one above it).

    `recipe` is the recipe file whose folder is refused (None: no such check); `recipe_path`, the file messages name.
    """
    reason = ownership.forbidden_reason(output_dir, recipe)
    return [Problem("trainer.output_dir", f"{reason}; choose a folder of its own, e.g. trainer.output_dir=runs/NAME",
                    str(output_dir), file=recipe_path)] if reason else []


def remove_previous(output_dir: Path, names: list[str], recipe_path: str, lock: "RunLock | None" = None) -> None:
    """`--overwrite`, once the new run has passed its checks: remove the previous run's entries (and only those)."""
    if names:
        say(f"--overwrite: removing the previous run in {output_dir} ({ownership.describe(names)})")
        ownership.remove(output_dir, names, "trainer.output_dir", recipe_path)
        if lock is not None and lock.recorder is not None:
            lock.recorder.forget(names)  # what the new run writes under these names is its own


def warn(message: str) -> None:
    """A warning line on stderr, from the main process only."""
    if is_main_process():
        print(f"[grpokit] warning: {message}", file=sys.stderr, flush=True)


def read_state(path: Path) -> tuple[dict | None, str | None]:
    """(the parsed trainer_state.json at `path`, None) or (None, why it cannot be used: "is missing", "is damaged
    (...)", or what else lies there: "is a FIFO, not a regular file").

    A state counts only when it parses as a JSON object with an integer `global_step`: a 0-byte file (the disk
    filled as it was opened) or one cut mid-write is damaged, never a checkpoint to resume.
    """
    state, why = files.try_json(path, dict)
    if state is None:
        return None, ("is missing" if why == "missing" else why if why.startswith(("is a ", "is larger", "cannot"))
                      else f"is damaged (it {why})")
    if not isinstance(state.get("global_step"), int):
        return None, "is damaged (not a trainer state: no integer global_step)"
    return state, None


def checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """Every `checkpoint-N/` folder in `output_dir`, complete or not, highest N last."""
    return sorted((int(p.name.partition("-")[2]), p) for p in Path(output_dir).glob("checkpoint-*")
                  if p.name.partition("-")[2].isdigit() and p.is_dir())


def latest_checkpoint(output_dir: Path, quiet: bool = False) -> str | None:
    """The highest-numbered complete `checkpoint-N/`, if any; a damaged one is skipped with a warning naming it.

    The trainer writes a checkpoint's trainer_state.json last (after weights, optimizer, scheduler and RNG
    state), so a readable one means the checkpoint is whole; a kill or a full disk mid-save leaves it
    missing or cut short.

    >>> latest_checkpoint(Path("/nonexistent")) is None
    True
    """
    for _, folder in reversed(checkpoints(output_dir)):
        state, why = read_state(folder / STATE_FILE)
        if state is not None:
            return str(folder)
        if not quiet:
            warn(f"skipping {folder}: its {STATE_FILE} {why}; an earlier checkpoint is used")
    return None


def resolve_resume(resume: str | None, output_dir: Path, recipe_path: str) -> str | None:
    """The checkpoint directory `--resume` ("latest") or `--resume-from PATH` means (None: start afresh).

    Raises `RecipeError` when there is none or the given one is incomplete.
    """
    if resume is None:
        return None
    if resume == "latest":
        found = latest_checkpoint(output_dir)
        if found is None:
            raise RecipeError([Problem("--resume", "no checkpoint to resume in trainer.output_dir", str(output_dir), file=recipe_path)])
        return found
    state, why = read_state(Path(resume) / STATE_FILE)
    if state is None and why == "is missing":
        raise RecipeError([Problem("--resume-from", f"is not a checkpoint directory (no {STATE_FILE})", resume, file=recipe_path)])
    if state is None:
        raise RecipeError([Problem("--resume-from", f"is not a complete checkpoint (its {STATE_FILE} {why}); "
                                   "resume from an earlier one", resume, file=recipe_path)])
    return resume


# Flags that belong to one invocation, not to the run: dropped from the command that continues it.
_ONE_OFF_FLAGS = {"--overwrite": 0, "--resume": 0, "--resume-from": 1}


def interpreter() -> str:
    """The Python a user types to run grpokit again as this process runs: `python` when that is the one their PATH
    finds (an activated venv), else this interpreter's path, relative to the working folder when it is inside it
    (`.venv/bin/python`, as the README's commands write it)."""
    import shutil

    exe = Path(sys.executable).absolute()
    found = shutil.which("python")
    if found and Path(found).absolute() == exe:
        return "python"
    here = Path.cwd()
    if here != Path(here.anchor) and here in exe.parents:
        return str(exe.relative_to(here))
    return str(exe)


def resume_command(argv: list[str], extra: tuple[str, ...] = ()) -> str:
    """The shell command that continues the run `argv` started: same interpreter, recipe and overrides, then `--resume`.

    >>> resume_command(["--recipe", "my.yaml", "trainer.beta=0.04", "--overwrite"]).endswith(
    ...     "launch.py --recipe my.yaml trainer.beta=0.04 --resume")
    True
    """
    import shlex

    kept, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        flag = arg.partition("=")[0] if arg.startswith("--") else None
        if flag in _ONE_OFF_FLAGS:
            skip = _ONE_OFF_FLAGS[flag] if "=" not in arg else 0
            continue
        kept.append(arg)
    program = sys.argv[0] if Path(sys.argv[0]).name == "launch.py" else "launch.py"
    # Started by `accelerate launch launch.py ...`, the run continues the same way; started by grpokit's own
    # `--num-processes N` / `--accelerate-config`, which the argv still holds, plain python starts the processes again.
    own_launcher = any(a.partition("=")[0] in ("--num-processes", "--accelerate-config") for a in kept)
    launcher = ["accelerate", "launch"] if num_processes_from_env() > 1 and not own_launcher else [interpreter()]
    return shlex.join(launcher + [program] + kept + list(extra) + ["--resume"])


# What a checkpoint holds only to resume training; the rest (weights, adapter and tokenizer files, the model card,
# training_args.bin) is what the trainer's final save writes into output_dir.
_RESUME_ONLY = ("optimizer", "scheduler", "scaler", "rng_state")


def complete_final_save(checkpoint: Path, output_dir: Path) -> None:
    """Redo a finished run's final save from its final checkpoint (a kill or full disk cut the real one short).

    Each file is copied beside its target and renamed over it, so a second kill leaves whole files; the
    trainer state, which marks the run finished, goes last.
    """
    saved = [p for p in sorted(Path(checkpoint).iterdir()) if p.is_file() and not p.name.startswith(_RESUME_ONLY)
             and p.name not in (ownership.MANIFEST, LOCK_FILE)]  # another folder's bookkeeping is not the run's
    for src in sorted(saved, key=lambda p: p.name == STATE_FILE):
        files.copy_file(src, Path(output_dir) / src.name, key="--resume")


def writable_problems(output_dir: Path, recipe_path: str) -> list[Problem]:
    """`--check`'s look at trainer.output_dir: it (or the folder it will be created in) must take a file.

    Tried for real -- a probe file created and removed in the nearest existing folder -- because permission
    bits do not tell: root ignores them, and a read-only mount refuses root too.

    >>> writable_problems(Path("/proc/version/run"), "my.yaml")[0].message
    'cannot be written: /proc/version is a file, not a folder; choose a writable trainer.output_dir=...'
    """
    import tempfile

    folder = Path(output_dir).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        why = f"{folder} is a file, not a folder"
    else:
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".grpokit-probe-"):
                return []
        except OSError as err:
            why = f"{folder}: {err.strerror or err}"
    return [Problem("trainer.output_dir", f"cannot be written: {why}; choose a writable trainer.output_dir=...", file=recipe_path)]


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def missing_weights(folder: Path) -> str | None:
    """What a local model folder lacks of its weights, in words (None: they are there): no weight file at all (a warm
    start copied without its safetensors), or the shards its index names that are not there."""
    for name in WEIGHT_INDEXES:
        if (folder / name).is_file():
            weight_map = (files.try_json(folder / name)[0] or {}).get("weight_map")
            shards = sorted({v for v in weight_map.values() if isinstance(v, str)} if isinstance(weight_map, dict) else ())
            if not shards:
                return f"its {name} names no weight files"
            gone = [s for s in shards if not (folder / s).is_file()]
            if gone:
                return (f"{len(gone)} of the {len(shards)} weight files its {name} names are not there: "
                        f"{', '.join(gone[:3])}{', ...' if len(gone) > 3 else ''}")
            return None
    if any((folder / name).is_file() for name in WEIGHT_FILES) or any(folder.glob("*.safetensors")):
        return None
    return f"no weights: none of {', '.join(WEIGHT_FILES + WEIGHT_INDEXES)} is there"
