"""What grpokit wrote, and removing only that.

The rule: grpokit removes or replaces only files and folders it wrote itself, and only after every check of
the new work has passed. It knows them from a manifest, `.grpokit-files`, kept in each folder it writes
into: the names of the entries it created there. Anything else in the folder is the user's (or another
program's): a destructive flag (`--overwrite`, `--merge-out ... --overwrite`, `--plot` replacing a report)
refuses, exit 2, naming what is there, and removes nothing. A folder with no readable manifest holds nothing
of grpokit's as far as removal is concerned.

Some folders are never written into at all: the filesystem root, the home directory, and the recipe's own
folder or one above it -- their files are the user's by definition.

A leaf: imports only grpokit.errors.

>>> import tempfile; d = Path(tempfile.mkdtemp())
>>> _ = (d / "notes.txt").write_text("mine")
>>> write_text(d / "report.md", "# run")
>>> sorted(listed(d)), foreign(d)
(['report.md'], ['notes.txt'])
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from grpokit.errors import Problem, RecipeError

MANIFEST = ".grpokit-files"
LOCK_FILE = ".grpokit.lock"  # a run's lock (rundir.RunLock): like the manifest, bookkeeping, never the user's
_OWN = (MANIFEST, LOCK_FILE, f"{MANIFEST}.partial")
SHOWN = 8  # entries named in a refusal before "and N more"


def _plain(name) -> bool:
    """A manifest entry is one name in its folder, never a path, `.` or `..`: a damaged manifest reaches no further."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _read(folder: Path) -> tuple[set[str], dict[str, set[str]]]:
    """(names grpokit wrote in `folder`, the files it wrote inside each listed folder); empty without a manifest."""
    try:
        data = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return set(), {}
    names = data.get("written") if isinstance(data, dict) else None
    names = {n for n in names if _plain(n) and n not in _OWN} if isinstance(names, list) else set()
    inside = data.get("inside") if isinstance(data, dict) else None
    inside = inside if isinstance(inside, dict) else {}
    return names, {n: {f for f in files if isinstance(f, str)} for n, files in inside.items()
                   if n in names and isinstance(files, list)}


def listed(folder: Path) -> set[str]:
    """The names grpokit recorded writing in `folder` (empty when it keeps no readable manifest)."""
    return _read(folder)[0]


def _store(folder: Path, names: set[str], inside: dict[str, set[str]]) -> None:
    """Rewrite the manifest whole: a temporary file renamed over it, so a kill leaves the old one or the new one."""
    data = {"written_by": "grpokit", "written": sorted(names),
            "inside": {n: sorted(files) for n, files in sorted(inside.items()) if n in names}}
    partial = Path(folder) / f"{MANIFEST}.partial"
    partial.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, Path(folder) / MANIFEST)


def contents(path: Path) -> set[str]:
    """Every file (and link) below the folder `path`, as paths relative to it; symbolic links are not followed."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return set()
    found = set()
    for top, dirs, files in os.walk(path):
        rel = Path(top).relative_to(path)
        found |= {str(rel / f) for f in files if f not in _OWN}  # grpokit's bookkeeping is never the user's
        found |= {str(rel / d) for d in dirs if (Path(top) / d).is_symlink()}
    return found


def claim(folder: Path, names) -> None:
    """Record `names`, entries of `folder`, as written by grpokit; a folder among them with what it holds now."""
    folder = Path(folder)
    names = {n for n in names if _plain(n) and n not in _OWN}
    current, inside = _read(folder)
    for name in names:
        if (folder / name).is_dir() and not (folder / name).is_symlink():
            inside[name] = contents(folder / name)
    _store(folder, current | names, inside)


def claim_file(path: Path) -> None:
    """Record a file (or a folder, with its files) grpokit just wrote: inside the listed folder that holds it,
    else as an entry of its own folder.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); (d / "plots").mkdir(); claim(d, ["plots"])
    >>> _ = (d / "plots" / "a.png").write_text("x"); claim_file(d / "plots" / "a.png"); sorted(_read(d)[1]["plots"])
    ['a.png']
    """
    path = Path(path)
    for holder in path.parents:
        if holder.parent == holder:
            break
        names, inside = _read(holder.parent)
        if holder.name in names:
            rel = path.relative_to(holder)
            added = {str(rel / f) for f in contents(path)} if path.is_dir() else {str(rel)}
            inside[holder.name] = inside.get(holder.name, set()) | added
            _store(holder.parent, names, inside)
            return
    claim(path.parent, [path.name])


def entries(folder: Path) -> list[str]:
    """The names in `folder` (none when it does not exist), grpokit's bookkeeping files left out."""
    try:
        return sorted(p.name for p in Path(folder).iterdir() if p.name not in _OWN)
    except (FileNotFoundError, NotADirectoryError):
        return []


def foreign(folder: Path) -> list[str]:
    """The entries of `folder` grpokit did not record writing."""
    mine = listed(folder)
    return [n for n in entries(folder) if n not in mine]


def holds_run(path: Path) -> bool:
    """True when `path` is, or contains, the folder of another grpokit run (its lock file, which a run leaves)."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return False
    return any(LOCK_FILE in files for _, _, files in os.walk(path))


def describe(names: list[str]) -> str:
    """`a, b, c`: at most SHOWN names, then how many more.

    >>> describe([str(i) for i in range(10)])
    '0, 1, 2, 3, 4, 5, 6, 7 and 2 more'
    """
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def forbidden_reason(folder: Path, recipe: Path | None = None) -> str | None:
    """Why `folder` can never be one grpokit writes a run or a merge into; None when it can be.

    >>> forbidden_reason(Path("/"))
    'is the filesystem root'
    """
    target = Path(folder).resolve()
    if target == Path(target.anchor):
        return "is the filesystem root"
    if target == Path.home().resolve():
        return "is the home directory"
    if recipe is not None:
        recipe_dir = Path(recipe).resolve().parent
        if target == recipe_dir:
            return f"is the folder of the recipe itself ({recipe_dir}): a run's files would mix with yours"
        if target in recipe_dir.parents:
            return f"holds the recipe itself ({Path(recipe).resolve()}): a run's files would mix with yours"
    return None


def foreign_problem(folder: Path, key: str, others: list[str], fix: str, origin: str | None = None) -> Problem:
    """The refusal for a folder holding entries grpokit did not write: names them; nothing is removed."""
    return Problem(key, f"holds {len(others)} entr{'y' if len(others) == 1 else 'ies'} grpokit did not write "
                   f"({describe(others)}); grpokit removes only what it wrote itself, so {fix}", str(folder), file=origin)


def remove(folder: Path, names, key: str, origin: str | None = None) -> None:
    """Remove those of `names` that `folder`'s manifest lists; nothing else, whatever `names` holds.

    A listed folder that now holds another run's or merge's manifest or lock (one started inside it) is
    refused, before anything is removed.
    """
    folder = Path(folder)
    mine, inside = _read(folder)
    names = sorted(set(names) & mine)
    if not names:
        return
    nested = [n for n in names if holds_run(folder / n)]
    if nested:
        raise RecipeError([Problem(key, f"{describe(nested)} in it now hold{'s' if len(nested) == 1 else ''} another grpokit "
                                   "run; nothing was removed: move it out, or choose another folder",
                                   str(folder), file=origin)])
    unknown = sorted(f"{n}/{f}" for n in names for f in contents(folder / n) - inside.get(n, set()))
    if unknown:
        raise RecipeError([foreign_problem(folder, key, unknown, "nothing was removed: move them out first", origin)])
    for name in names:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    _store(folder, mine - set(names), inside)


class Recorder:
    """Records as grpokit's every entry that appears in `folder` while grpokit writes into it.

    What a library writes on grpokit's behalf (the trainer's checkpoints, adapter and tokenizer files, its
    logging folder) has names grpokit does not choose, so a run records what is new since it started, and for
    each folder it made, the files in it; what was there before and not grpokit's stays the user's. While a
    run holds its folder, what appears there counts as the run's. A folder holding another grpokit run (one
    started inside this one) is never recorded.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.before = set(foreign(self.folder))

    def record(self) -> None:
        if not self.folder.is_dir():
            return
        current = entries(self.folder)
        names, inside = _read(self.folder)
        mine = {n for n in current if n in names or (n not in self.before and not holds_run(self.folder / n))}
        for name in mine:
            if (self.folder / name).is_dir() and not (self.folder / name).is_symlink():
                inside[name] = contents(self.folder / name)
        _store(self.folder, mine, inside)


def replaceable(path: Path, root: Path | None = None) -> bool:
    """True when `path` does not exist, or grpokit wrote it: it, or a folder above it up to `root`, is listed.

    >>> replaceable(Path("/nonexistent/report.md"))
    True
    """
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return True
    stop = Path(root) if root is not None else path.parent
    for part in [path, *path.parents]:
        if part.name in listed(part.parent):
            return True
        if part.parent == stop or part.parent == part:
            return False
    return False


def refuse_unless_replaceable(paths, root: Path | None = None, key: str = "", origin: str | None = None) -> None:
    """Before any work: every path grpokit is about to write is new, or grpokit's own (`replaceable`)."""
    theirs = [str(p) for p in paths if not replaceable(p, root)]
    if theirs:
        one = len(theirs) == 1
        raise RecipeError([Problem(key or theirs[0], f"{describe(theirs)} exist{'s' if one else ''} and grpokit did not "
                                   f"write {'it' if one else 'them'}; grpokit replaces only files it wrote: move "
                                   f"{'it' if one else 'them'}, or choose another path", file=origin)])


def write_text(path: Path, text: str, key: str = "", origin: str | None = None) -> None:
    """Write a file grpokit owns: refused when `path` exists and grpokit did not write it; recorded after.

    The text goes to a temporary file renamed over the target, so a kill leaves the old file or the new one.
    """
    path = Path(path)
    refuse_unless_replaceable([path], key=key, origin=origin)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
    claim_file(path)
