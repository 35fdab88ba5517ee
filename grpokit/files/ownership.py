"""What grpokit wrote, and removing only that.

The rule: grpokit removes or replaces only files and folders it wrote itself, and only after every check of
the new work has passed. It knows them from a manifest, `.grpokit-files`, kept in each folder it writes
into: each entry it created there, with its identity as grpokit left it (inode; and for a file its size and
modification time) and, for a folder, every file and folder inside. An entry that is not in the manifest,
or no longer the one grpokit left (replaced, edited, a folder swapped for a link), or a file inside a
recorded folder that grpokit did not record, is the user's: a destructive flag (`--overwrite`, `--merge-out
... --overwrite`, `--plot` replacing a report) refuses, exit 2, naming it, and removes nothing. A folder
with no readable manifest holds nothing of grpokit's as far as removal is concerned.

Some folders are never written into at all: the filesystem root, the home directory, and the recipe's own
folder or one above it -- their files are the user's by definition. grpokit's own bookkeeping files are
never written through a symbolic link.

A leaf: imports only grpokit.errors and grpokit.files.reading. Other modules reach it through `grpokit.files`,
the door every write passes.

>>> import tempfile; d = Path(tempfile.mkdtemp())
>>> _ = (d / "notes.txt").write_text("mine")
>>> write_text(d / "report.md", "# run")
>>> sorted(listed(d)), foreign(d)
(['report.md'], ['notes.txt'])
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from grpokit.errors import Problem, RecipeError
from grpokit.files.reading import try_bytes, try_json

MANIFEST = ".grpokit-files"
LOCK_FILE = ".grpokit.lock"  # a run's lock (rundir.RunLock): like the manifest, bookkeeping, never the user's
_OWN = (MANIFEST, LOCK_FILE)  # a folder's own bookkeeping: never listed among its entries
_TMP = ".grpokit-tmp-"  # a file being written, renamed into place at once (a kill may leave one: never removed)
SHOWN = 8  # entries named in a refusal before "and N more"
WRITING = None  # a claimed folder's contents, in memory between `claim_writing` and storing the claim: not yet known
PENDING = "pending"  # an entry vouched for by a pending save (`start_pending`) rather than recorded
# A save claimed before it was written (a checkpoint), or one under way when a kill came (the final save), vouches for
# what was written from its start until the run's last sign of life: the lock file's modification time, which the
# live run moves every HEARTBEAT_S (rundir.RunLock), plus five beats of slack (a beat a stalled thread missed); and
# never past SAVE_WINDOW_NS. The live run records what it saved as soon as a save is whole, so only a kill relies on it.
# Written is the change time (ctime), which a move, a link or `touch -d` sets to now and nobody can set back.
SAVE_WINDOW_NS = 3600 * 10**9
HEARTBEAT_S = 1.0
CONTENT_LIMIT = 64 * 2**20  # files recorded with their SHA-256 (results, reports): larger ones are never hashed


def _plain(name) -> bool:
    """A manifest entry is one name in its folder, never a path, `.` or `..`: a damaged manifest reaches no further."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def identity(path: Path) -> dict | None:
    """What grpokit remembers of an entry to know it again: its inode, and for a file its size, modification and
    change times (the change time moves on any edit, a `touch -r` or a new hard link, and cannot be set back)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if os.path.isdir(path) and not os.path.islink(path):
        return {"ino": st.st_ino}
    return {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _same(recorded: dict, now: dict | None) -> bool:
    return now is not None and all(recorded.get(k) == v for k, v in now.items())


def _window(folder: Path, since) -> tuple[int, int] | None:
    """(start, end) of the time a claim made at `since` in `folder` vouches for (see SAVE_WINDOW_NS); None when it
    vouches for nothing (no start recorded, or no heartbeat to end it: the lock file is gone or not a file)."""
    if not isinstance(since, int) or isinstance(since, bool):
        return None
    try:
        st = os.lstat(Path(folder) / LOCK_FILE)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return since, min(st.st_mtime_ns + int(5 * HEARTBEAT_S * 1e9), since + SAVE_WINDOW_NS)


def _within(path: Path, window) -> bool:
    """True when `path` was last changed inside `window` (`_window`): written by the save, not put there after it."""
    try:
        ctime = os.lstat(path).st_ctime_ns
    except OSError:
        return False
    return window is not None and window[0] <= ctime <= window[1]


def _written_in(path: Path, window) -> dict[str, dict]:
    """What lies inside the folder `path` that was written inside `window`, as `contents` lists it: the part of a
    claimed checkpoint a killed save vouches for. What came later (a file moved in, with any mtime) is not in it."""
    return {rel: ident for rel, ident in contents(path).items() if _within(path / rel.rstrip("/"), window)}


def _sha256(path: Path, size) -> str | None:
    """The SHA-256 of a regular file of at most CONTENT_LIMIT bytes (read without following a link: None for one)."""
    if os.path.islink(path) or not isinstance(size, int) or size > CONTENT_LIMIT:
        return None
    data, _ = try_bytes(path, CONTENT_LIMIT)
    return hashlib.sha256(data).hexdigest() if data is not None else None


def _same_content(path: Path, rec: dict) -> bool:
    """True when the file at `path` holds exactly what grpokit recorded writing there (its SHA-256): a results file
    committed to git and cloned has a new inode and new times, and is still the file grpokit wrote."""
    now = identity(path)
    return (isinstance(rec.get("sha256"), str) and now is not None and "size" in now and now["size"] == rec.get("size")
            and _sha256(path, now["size"]) == rec["sha256"])


def _load(folder: Path) -> dict:
    """The folder's manifest as grpokit wrote it; {} when there is none, or the file there is not one (read only
    when it is a regular file: a FIFO of that name must not hang the reader; bounded in size and depth)."""
    data, _ = try_json(Path(folder) / MANIFEST, dict, limit=64 * 2**20)
    return data if data is not None and data.get("written_by") == "grpokit" else {}


def manifest_is_theirs(folder: Path) -> bool:
    """True when something that is not grpokit's manifest sits at the manifest's name: grpokit never replaces it."""
    path = Path(folder) / MANIFEST
    return (path.exists() or path.is_symlink()) and not _load(folder)


def _read(folder: Path) -> dict[str, dict]:
    """The entries of `folder` grpokit recorded and that are still as it left them: name -> {"ino", ..., "inside"}.

    A checkpoint claimed before it was written (`claim_writing`), and what a save left when a kill cut it short
    (`start_pending`), count as grpokit's as far as they were written within the save's window (`_window`): what
    lies in a claimed checkpoint, or appeared beside a pending save, and was changed after it is the user's.
    A file recorded with its SHA-256 (`claim_file(..., content=True)`) is grpokit's while its content is unchanged.
    """
    folder = Path(folder)
    data = _load(folder)
    recorded = data.get("entries")
    mine = {}
    for name, rec in (recorded.items() if isinstance(recorded, dict) else ()):
        if not (_plain(name) and name not in _OWN and isinstance(rec, dict)):
            continue
        now = identity(folder / name)
        if "ino" not in rec:  # claimed before it was written: vouched for within the save's window only, and kept
            window = _window(folder, rec.get("since"))  # as a claim, never turned into a record
            if now is None or now.keys() == {"ino"} or _within(folder / name, window):
                mine[name] = {**(now or {}), "inside": _written_in(folder / name, window), "claimed": rec.get("since")}
        elif _same(rec, now) or _same_content(folder / name, rec):
            inside = rec.get("inside", {})
            kept = {"sha256": rec["sha256"]} if "sha256" in rec else {}
            mine[name] = {**now, **kept, "inside": {f: i for f, i in inside.items() if isinstance(i, dict)}
                          if isinstance(inside, dict) else {}}
    window = _window(folder, data.get("pending"))
    for name in entries(folder) if window is not None else ():
        path = folder / name
        if name in mine or not _within(path, window) or holds_run(path):
            continue
        inside = contents(path)
        if _written_in(path, window) == inside:  # a folder the save made, nothing put in it since
            mine[name] = {**identity(path), "inside": inside, "claimed": PENDING}
    return mine


def listed(folder: Path) -> set[str]:
    """The names of the entries of `folder` that grpokit wrote and that are still as it left them."""
    return set(_read(folder))


def _write_new(folder: Path, data: str | bytes) -> str:
    """Write `data` to a new file of a name no one else holds in `folder` (created exclusively, so never through a
    link and never over a file) and return its path, to be renamed into place."""
    fd, partial = tempfile.mkstemp(dir=folder, prefix=_TMP)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    os.chmod(partial, 0o644)
    return partial


def new_file_beside(path: Path) -> str:
    """An empty file of a fresh name beside `path` (created exclusively, never through a link), to be filled and then
    renamed over `path`."""
    return _write_new(Path(path).parent, b"")


_KEEP = object()


def _theirs_problem(folder: Path) -> Problem:
    return Problem(str(Path(folder) / MANIFEST), "is not a manifest grpokit wrote, and grpokit keeps its record of what "
                   "it wrote in a folder under that name: move the file, or choose another folder")


def _store(folder: Path, mine: dict[str, dict], pending=_KEEP) -> None:
    """Rewrite the manifest whole: a temporary file renamed over it, so a kill leaves the old one or the new one.
    `pending` (a save's start, `start_pending`) is kept as it is unless given; None clears it."""
    if manifest_is_theirs(folder):
        raise RecipeError([_theirs_problem(folder)])
    if pending is _KEEP:
        pending = _load(folder).get("pending")
    stored = {}
    for name, rec in sorted(mine.items()):
        if rec.get("claimed") == PENDING:
            continue  # the pending save vouches for it while its window lasts; it is not recorded
        if "claimed" in rec:  # a claim stays a claim: its window still applies
            stored[name] = {"inside": WRITING, "since": rec["claimed"]}
        else:
            stored[name] = rec
    data = {"written_by": "grpokit", "entries": stored}
    if isinstance(pending, int):
        data["pending"] = pending
    os.replace(_write_new(folder, json.dumps(data, indent=1) + "\n"), Path(folder) / MANIFEST)


def contents(path: Path) -> dict[str, dict]:
    """Every file, link and folder below the folder `path`, relative to it (folders end in `/`), each with its
    `identity` (a folder's is empty: what it holds is listed itself); links are not followed."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return {}
    found = {}
    for top, dirs, files in os.walk(path):
        rel = Path(top).relative_to(path)
        for f in files:
            found[str(rel / f)] = identity(Path(top) / f) or {}
        for d in dirs:
            link = (Path(top) / d).is_symlink()
            found[str(rel / d) + ("" if link else "/")] = (identity(Path(top) / d) or {}) if link else {}
    return found


def _unknown(now: dict[str, dict], known: dict[str, dict]) -> list[str]:
    """What lies in a folder now that grpokit did not record there, or that changed since it did."""
    return sorted(rel for rel, ident in now.items() if rel not in known or not _same(known[rel], ident or None)
                  and not (rel.endswith("/") and rel in known))


def _entry(folder: Path, name: str, content: bool = False) -> dict:
    """An entry as grpokit records it now: its identity and, for a folder, everything inside; with `content`, a
    file's SHA-256 too (`_same_content`)."""
    path = Path(folder) / name
    rec = dict(identity(path) or {})
    if path.is_dir() and not path.is_symlink():
        rec["inside"] = contents(path)
    elif content and _sha256(path, rec.get("size")) is not None:
        rec["sha256"] = _sha256(path, rec.get("size"))
    return rec


def replace_text(path: Path, text: str | bytes) -> None:
    """Write `text` as a new file that takes `path`'s place: never into the old file, which a hard link elsewhere
    (a backup made with `cp -al`) may share, and never through a link."""
    path = Path(path)
    os.replace(_write_new(path.parent, text), path)


def claim(folder: Path, names, content: bool = False) -> None:
    """Record `names`, entries of `folder`, as written by grpokit, as they are now (`content`: with their SHA-256)."""
    mine = _read(folder)
    for name in {n for n in names if _plain(n) and n not in _OWN}:
        if (Path(folder) / name).exists() or (Path(folder) / name).is_symlink():
            mine[name] = _entry(folder, name, content)
    _store(folder, mine)


def claim_writing(folder: Path, name: str) -> None:
    """Record `name` before grpokit writes it (a checkpoint about to be saved): a kill mid-write leaves it grpokit's."""
    mine = _read(folder)
    mine[name] = {"inside": WRITING, "claimed": time.time_ns()}  # recorded by `Recorder.record` once it is whole
    _store(folder, mine)


def start_pending(folder: Path) -> None:
    """A save of unknown file names is starting (the trainer's final save): what appears from now counts as grpokit's
    until the next `Recorder.record` (which a kill may never reach)."""
    _store(folder, _read(folder), pending=time.time_ns())


def claim_file(path: Path, content: bool = False) -> None:
    """Record a file (or a folder, with what it holds) grpokit just wrote: inside the recorded folder that holds it,
    else as an entry of its own folder.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); (d / "plots").mkdir(); claim(d, ["plots"])
    >>> _ = (d / "plots" / "a.png").write_text("x"); claim_file(d / "plots" / "a.png"); sorted(_read(d)["plots"]["inside"])
    ['a.png']
    """
    path = Path(path)
    for holder in path.parents:
        if holder.parent == holder:
            break
        mine = _read(holder.parent)
        if holder.name in mine:
            rec = mine[holder.name]
            if rec["inside"] is not WRITING:
                rel = path.relative_to(holder)
                added = {str(rel / f): i for f, i in contents(path).items()} if path.is_dir() else {}
                added[str(rel) + ("/" if path.is_dir() else "")] = {} if path.is_dir() else identity(path) or {}
                added.update({str(p) + "/": {} for p in rel.parents if str(p) != "."})
                rec["inside"] = {**rec["inside"], **added}
            rec.update(identity(holder) or {})
            _store(holder.parent, mine)
            return
    claim(path.parent, [path.name], content)


def entries(folder: Path) -> list[str]:
    """The names in `folder` (none when it does not exist), grpokit's bookkeeping files left out."""
    try:
        return sorted(p.name for p in Path(folder).iterdir() if p.name not in _OWN and not p.name.startswith(_TMP))
    except (FileNotFoundError, NotADirectoryError):
        return []


def foreign(folder: Path) -> list[str]:
    """The entries of `folder` grpokit did not write (or that are no longer as it left them)."""
    mine = listed(folder)
    return [n for n in entries(folder) if n not in mine]


def unknown_inside(folder: Path, names=None) -> list[str]:
    """What lies inside grpokit's folders in `folder` (all, or `names`) that grpokit did not record, or that changed."""
    mine = _read(folder)
    return [f"{n}/{rel}" for n in sorted(names if names is not None else mine) if n in mine and mine[n]["inside"] is not WRITING
            for rel in _unknown(contents(Path(folder) / n), mine[n]["inside"])]


def holds_run(path: Path) -> bool:
    """True when `path` is, or contains, the folder of a grpokit run (its lock file, which a run leaves)."""
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


def foreign_problem(folder: Path, key: str, others: list[str], fix: str, recipe_path: str | None = None) -> Problem:
    """The refusal for a folder holding entries grpokit did not write: names them; nothing is removed."""
    return Problem(key, f"holds {len(others)} entr{'y' if len(others) == 1 else 'ies'} grpokit did not write "
                   f"({describe(others)}); grpokit removes only what it wrote itself, so {fix}", str(folder), file=recipe_path)


def remove(folder: Path, names, key: str, recipe_path: str | None = None) -> None:
    """Remove those of `names` that grpokit wrote in `folder` (as it left them); nothing else, whatever `names` holds.

    Refused before anything is removed: a folder among them that now holds another run (one started inside
    it), or anything inside one of them that grpokit did not record.
    """
    folder = Path(folder)
    mine = _read(folder)
    names = sorted(set(names) & set(mine))
    if not names:
        return
    nested = [n for n in names if holds_run(folder / n)]
    if nested:
        raise RecipeError([Problem(key, f"{describe(nested)} in it now hold{'s' if len(nested) == 1 else ''} another grpokit "
                                   "run; nothing was removed: move it out, or choose another folder",
                                   str(folder), file=recipe_path)])
    unknown = unknown_inside(folder, names)
    if unknown:
        raise RecipeError([foreign_problem(folder, key, unknown, "nothing was removed: move them out first", recipe_path)])
    for name in names:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_symlink() or path.exists():
            path.unlink()
    _store(folder, {n: rec for n, rec in mine.items() if n not in names})


class Recorder:
    """Records as grpokit's what grpokit writes into `folder` while it works there.

    What a library writes on grpokit's behalf (the trainer's checkpoints, adapter and tokenizer files, its
    logging folder) has names grpokit does not choose, so a run records what is new since it started, and
    for each folder of grpokit's, the files that appeared in it. What was there when it started and was not
    grpokit's stays the user's, also inside grpokit's folders. A folder holding another grpokit run (one
    started inside this one) is never recorded.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        mine = _read(self.folder)
        # per entry there at the start: what lay inside it and was not grpokit's (it stays the user's); None for an
        # entry that was not grpokit's at all
        self.theirs = {n: set(_unknown(contents(self.folder / n), mine[n]["inside"]))
                       if n in mine and mine[n]["inside"] is not WRITING else
                       (set() if n in mine else None) for n in entries(self.folder)}

    def forget(self, names) -> None:
        """`names` were removed (the previous run, by --overwrite): what comes back under them is new."""
        for name in names:
            self.theirs.pop(name, None)

    def record(self) -> None:
        """Write down what is grpokit's now; what grpokit has written is then recorded, so no save is pending."""
        if not self.folder.is_dir():
            return
        mine = {}
        for name in entries(self.folder):
            theirs = self.theirs.get(name, set())
            if theirs is None or (name not in self.theirs and holds_run(self.folder / name)):
                continue  # the user's entry from before, or another run started inside this one
            rec = _entry(self.folder, name)
            if "inside" in rec:
                rec["inside"] = {rel: i for rel, i in rec["inside"].items() if rel not in theirs}
            mine[name] = rec
        _store(self.folder, mine, pending=None)


def replaceable(path: Path, root: Path | None = None) -> bool:
    """True when `path` does not exist, or grpokit wrote it: it, or a folder of grpokit's above it up to `root`,
    recorded and unchanged, and no link on the way.

    >>> replaceable(Path("/nonexistent/report.md"))
    True
    """
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return True
    stop = Path(root) if root is not None else path.parent
    for part in [path, *path.parents]:
        mine = _read(part.parent)
        if part.name in mine:
            if part == path:
                return True
            inside = mine[part.name].get("inside")
            rel = str(path.relative_to(part))
            return inside is WRITING or (rel in inside and _same(inside[rel], identity(path)))
        if part.is_symlink() or part.parent == stop or part.parent == part:
            return False
    return False


def refuse_unless_replaceable(paths, root: Path | None = None, key: str = "", recipe_path: str | None = None) -> None:
    """Before any work: every path grpokit is about to write is new, or grpokit's own (`replaceable`), is not
    reached through a link, and can be recorded: no folder from its own up to `root` holds a user's file under the
    manifest's name (a write grpokit could not record would be left behind as the user's, so none is made)."""
    paths = [Path(p) for p in paths]
    unrecordable = {f for p in paths for f in _recorders(p, root) if manifest_is_theirs(f)}
    if unrecordable:
        raise RecipeError([_theirs_problem(f) for f in sorted(unrecordable)])
    theirs = [str(p) for p in paths if not replaceable(p, root) or _through_link(Path(p), root)]
    if theirs:
        one = len(theirs) == 1
        raise RecipeError([Problem(key or theirs[0], f"{describe(theirs)} exist{'s' if one else ''} and grpokit did not "
                                   f"write {'it' if one else 'them'} (or not as {'it is' if one else 'they are'} now: "
                                   "edited, replaced or linked since); grpokit replaces only files it wrote: move "
                                   f"{'it' if one else 'them'}, or choose another path", file=recipe_path)])


def _recorders(path: Path, root: Path | None) -> list[Path]:
    """The folders whose manifest may record `path`: its own, and each above it up to `root` (`claim_file`)."""
    stop = Path(root) if root is not None else path.parent
    return [p for p in path.parents if p == stop or stop in p.parents]


def _through_link(path: Path, root: Path | None) -> bool:
    """True when a folder between `root` (or the file's own folder) and `path` is a symbolic link."""
    stop = Path(root) if root is not None else path.parent
    return any(p.is_symlink() for p in path.parents if p != stop and stop in p.parents)


def write_text(path: Path, text: str | bytes, key: str = "", recipe_path: str | None = None, root: Path | None = None) -> None:
    """Write a file grpokit owns: refused when `path` exists and grpokit did not write it; recorded after.

    The text goes to a fresh temporary file (never through a link) renamed over the target, so a kill leaves
    the old file or the new one.
    """
    path = Path(path)
    refuse_unless_replaceable([path], root=root, key=key, recipe_path=recipe_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_text(path, text)
    claim_file(path, content=True)
