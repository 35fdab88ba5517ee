"""The one door for files: every file grpokit, its labs and its benches write, remove or parse back passes here.

Writing (`write_text`, `write_bytes`, `save_figure`, `write_csv`, `replace_section`, `open_log`): a path that
exists is replaced only when grpokit wrote it (its folder's manifest says so, `ownership`), never through a
symbolic link; the new content goes to a fresh file created exclusively beside it and renamed into place, so a
kill leaves the old file or the new one, and a hard-linked backup of the old one keeps its content. What was
written is recorded in the folder's manifest with its SHA-256, so results committed to git stay grpokit's in a
fresh clone (where inodes and times are new) for as long as their content is what grpokit wrote.

Removing (`remove`, `remove_build`): only what grpokit wrote and the manifest lists, as it left it.

Reading (`read_json`, `read_text`, `read_lines`, `read_bytes`, `try_json`; see `reading`): regular files only, bounded in
size and nesting, of the expected type, or one line naming the file and what is wrong (a `RecipeError`, exit 2).

A test (tests/files/test_file_door.py) forbids the raw forms -- `open(..., "w")`, `write_text`, `json.load` of a
file, `shutil.rmtree`, `unlink` -- anywhere else in grpokit, labs/ and bench/.

Offers: the functions above (the readers handed on from its reading room), and `ownership` (the manifest: what
grpokit wrote).
Never: writes through a link, replaces or removes a file grpokit did not write, or reads an unbounded file.

>>> import tempfile; d = Path(tempfile.mkdtemp())
>>> write_text(d / "table.md", "| a |")
>>> read_text(d / "table.md")
'| a |'
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from pathlib import Path

from grpokit.files import ownership
from grpokit.files.reading import (MAX_BYTES, MAX_DEPTH, Unreadable, parse_json, problem, read_bytes,
                                   read_json, read_lines, read_text, try_bytes, try_json)


def write_bytes(path, data: bytes | str, key: str = "", recipe_path: str | None = None, root=None) -> None:
    """Write a file grpokit owns (see the module's rules): refused, naming it, when `path` exists and grpokit did not
    write it (itself, or a folder of grpokit's above it up to `root` recorded it), or is reached through a link; the
    folder is created when missing; recorded after."""
    ownership.write_text(Path(path), data, key=key, recipe_path=recipe_path, root=root)


write_text = write_bytes  # text is written as UTF-8; one function, two names for the reader's sake


def copy_file(src, dest, key: str = "") -> None:
    """Copy the regular file `src` to `dest` under `write_bytes`' rules, in blocks (a checkpoint's weights are large):
    a fresh file beside `dest`, renamed into place once whole."""
    dest = Path(dest)
    ownership.refuse_unless_replaceable([dest], key=key)
    partial = ownership.new_file_beside(dest)
    shutil.copyfile(src, partial)
    os.replace(partial, dest)
    ownership.claim_file(dest)


def save_figure(fig, path, key: str = "", dpi: int = 100, root=None, **kwargs) -> None:
    """A matplotlib figure as a PNG grpokit owns (`write_bytes`' rules): rendered in memory first, so nothing is
    written if drawing fails."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, **kwargs)
    write_bytes(path, buffer.getvalue(), key=key, root=root)


def write_csv(path, header: list[str], rows, key: str = "") -> None:
    """A CSV file grpokit owns: `header`, then one line per row."""
    import csv

    buffer = io.StringIO()
    out = csv.writer(buffer, lineterminator="\n")
    out.writerow(header)
    out.writerows(rows)
    write_bytes(path, buffer.getvalue(), key=key)


def replace_section(path, begin: str, end: str, text: str, key: str = "") -> None:
    """Replace what lies between the marker lines `begin` and `end` of a text file that is not grpokit's (a README a
    person writes, with a section a bench keeps): the rest stays byte for byte, the file is replaced whole by a
    new one (never written in place or through a link); refused when a marker is missing."""
    path = Path(path)
    if path.is_symlink():
        raise problem(path, "is a symbolic link; grpokit never writes through one", key)
    page = read_text(path, key)
    head, found, rest = page.partition(begin)
    if not found or end not in rest:
        raise problem(path, f"has no section between {begin!r} and {end!r} for grpokit to fill", key,
                      "put the two marker lines where the figures should go")
    ownership.replace_text(path, head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1])


def open_log(path, key: str = ""):
    """A log file grpokit owns, opened to append (a run's output streamed into it); refused like `write_bytes`
    when `path` exists and is not grpokit's; never opened through a link. Recorded as grpokit's when opened."""
    path = Path(path)
    ownership.refuse_unless_replaceable([path], key=key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    handle = os.fdopen(fd, "a")
    ownership.claim_file(path)
    return handle


def open_lock(path) -> int:
    """The descriptor of a run's lock file (`ownership.LOCK_FILE`), created when missing, read-write, never through a
    link (a planted link's target would be emptied): OSError otherwise. Only a run lock is opened this way."""
    if Path(path).name != ownership.LOCK_FILE:
        raise ValueError(f"{path} is not a run's lock file")
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


def remove(folder, names, key: str, recipe_path: str | None = None) -> None:
    """Remove those of `names` in `folder` that grpokit wrote, as it left them; refused, naming it, when one of them
    holds anything grpokit did not write (see `ownership.remove`)."""
    ownership.remove(Path(folder), names, key, recipe_path)


def remove_build(folder) -> None:
    """Remove a folder grpokit was building under a name only it makes (`NAME.tmp-PID` beside a cache entry, see
    `build_folder`): a kill leaves one behind. Any other name is refused: this is no general-purpose delete."""
    folder = Path(folder)
    stem, _, pid = folder.name.rpartition(".tmp-")
    if not (stem and pid.isdigit()) or folder.is_symlink():
        raise ValueError(f"{folder} is not a build folder grpokit makes")
    shutil.rmtree(folder, ignore_errors=True)


def build_folder(target, build) -> Path:
    """Make the cache folder `target` whole or not at all: `build(tmp)` fills a sibling `NAME.tmp-PID` that is then
    renamed into place; when another process finished first, its (identical) folder is kept and ours removed."""
    target = Path(target)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    remove_build(tmp)
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        tmp.rename(target)
    except OSError:
        if not target.is_dir():
            remove_build(tmp)
            raise
    finally:
        if tmp.exists():
            remove_build(tmp)
    return target


def tell_kernel(path: str, text: str) -> bool:
    """Write `text` to one of this process's own kernel interfaces (a path under /proc/self/): no file on any disk, so
    none of a run's or a user's; anything else is refused. False where the kernel does not take it (no such
    interface, not allowed here)."""
    if not path.startswith("/proc/self/") or ".." in path:
        raise ValueError(f"{path} is not one of this process's kernel interfaces")
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def scratch(prefix: str):
    """A folder of grpokit's own for the length of the block: made new, empty and private (mkdtemp: mode 0700, a name
    no one else chose) in the system's temporary folder, so whatever is in it after was put there by the block, and
    removed whole after it, whatever the block did.

    >>> with scratch("grpokit-doc-") as d:
    ...     _ = (d / "x").write_text("y")
    >>> d.exists()
    False
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def remove_bookkeeping(folder, names) -> None:
    """Remove grpokit's own bookkeeping files of `folder` (`ownership.MANIFEST`, `ownership.LOCK_FILE`) -- a refused
    run leaves no trace -- and nothing else."""
    for name in names:
        if name not in (ownership.MANIFEST, ownership.LOCK_FILE):
            raise ValueError(f"{name} is not one of grpokit's bookkeeping files")
        try:
            os.unlink(Path(folder) / name)
        except FileNotFoundError:
            pass


__all__ = ["MAX_BYTES", "MAX_DEPTH", "Unreadable", "build_folder", "copy_file", "open_lock", "open_log", "ownership", "parse_json",
           "problem", "read_bytes", "read_json", "read_lines", "read_text", "remove", "remove_bookkeeping", "remove_build",
           "replace_section", "save_figure", "scratch", "tell_kernel", "try_bytes", "try_json", "write_bytes", "write_csv", "write_text"]
