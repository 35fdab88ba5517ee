"""Reading a file grpokit (or its labs and benches) parses back: a state, a manifest, results, a config.

Whatever lies at the path, the reader ends in a value or in one line naming the file and what is wrong
(a `RecipeError`, exit 2), never in a hang or a traceback:

- a regular file only: it is opened without blocking and checked on the open descriptor, so a FIFO or a
  device at the name is refused at once, never waited on (and a swap between a check and the open is not
  possible: the check is of the file that was opened);
- at most `limit` bytes (read up to one past it, never the whole of a huge file);
- UTF-8 text;
- JSON nested at most `depth` deep (Python's parser ends in `RecursionError` near 1,000 levels; grpokit's own
  files are a few levels deep), and of the expected top-level type.

A leaf: imports only grpokit.errors.

>>> import tempfile, os; d = tempfile.mkdtemp(); p = os.path.join(d, "s.json")
>>> _ = open(p, "w").write("[" * 100 + "]" * 100)
>>> try_json(p)[1]
'is nested deeper than 64 levels'
"""

from __future__ import annotations

import errno
import json
import os
import stat

from grpokit.errors import Problem, RecipeError

MAX_BYTES = 256 * 2**20  # a trainer_state.json of a long run logged every step is a few MB; a results file, KBs
MAX_DEPTH = 64  # grpokit's own JSON files are under ten levels deep

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}
_TYPES = {dict: "a JSON object", list: "a JSON array"}


class Unreadable(Exception):
    """Why a file cannot be used, as a fragment of a sentence ("is a FIFO, not a regular file")."""


def _open(path) -> int:
    """A descriptor of the regular file at `path`, opened without blocking and checked on the descriptor itself;
    `Unreadable` for anything else at the name, FileNotFoundError when nothing is there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise
    except OSError as err:
        if err.errno == errno.ENXIO:  # a FIFO with no writer, opened for reading without blocking, or a socket
            raise Unreadable("is a FIFO or socket, not a regular file") from None
        raise Unreadable(f"cannot be read ({err.strerror or err})") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as err:
        os.close(fd)
        raise Unreadable(f"cannot be read ({err.strerror or err})") from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise Unreadable(f"is {_KINDS.get(stat.S_IFMT(mode), 'not a regular file')}, not a regular file")
    return fd


def _too_large(limit: int) -> Unreadable:
    return Unreadable(f"is larger than {limit:,} bytes, the most grpokit reads of such a file")


def _bytes(path, limit: int) -> bytes:
    fd = _open(path)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        return b"".join(chunks)
    except OSError as err:
        raise Unreadable(f"cannot be read ({err.strerror or err})") from None
    finally:
        os.close(fd)


def _depth(value, bound: int) -> int:
    """How deep `value` nests, counted without recursion, stopping once past `bound`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if deepest > bound:
                break
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(text: str | bytes, expect: type | None = dict, depth: int = MAX_DEPTH):
    """JSON text as a value of type `expect` (None: any), nested at most `depth` deep; raises `Unreadable`.

    >>> parse_json('{"a": [1, 2]}')
    {'a': [1, 2]}
    >>> parse_json('[]')
    Traceback (most recent call last):
    ...
    grpokit.files.reading.Unreadable: holds a JSON array, not a JSON object
    """
    try:
        value = json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except RecursionError:
        raise Unreadable(f"is nested deeper than {depth} levels") from None
    except UnicodeDecodeError as err:
        raise Unreadable(f"is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise Unreadable(f"is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    except ValueError as err:
        raise Unreadable(f"is not valid JSON ({err})") from None
    if _depth(value, depth) > depth:
        raise Unreadable(f"is nested deeper than {depth} levels")
    if expect is not None and not isinstance(value, expect):
        got = next((name for kind, name in _TYPES.items() if isinstance(value, kind)), f"a JSON {type(value).__name__}")
        raise Unreadable(f"holds {got}, not {_TYPES.get(expect, expect.__name__)}")
    return value


def try_bytes(path, limit: int = MAX_BYTES) -> tuple[bytes | None, str | None]:
    """(the bytes of the regular file at `path`, None) or (None, why not: "missing", "is a FIFO, ...")."""
    try:
        return _bytes(path, limit), None
    except FileNotFoundError:
        return None, "missing"
    except Unreadable as err:
        return None, str(err)


def try_json(path, expect: type | None = dict, limit: int = MAX_BYTES, depth: int = MAX_DEPTH):
    """(the JSON value at `path`, None) or (None, why it cannot be used): for readers to whom a damaged file is
    one state among others (a checkpoint cut short by a kill is skipped, not an error)."""
    data, why = try_bytes(path, limit)
    if data is None:
        return None, why
    try:
        return parse_json(data, expect, depth), None
    except Unreadable as err:
        return None, str(err)


def problem(path, why: str, key: str = "", fix: str = "") -> RecipeError:
    """The one line a refused file gives: its path, the key or flag that named it, what is wrong, what to do."""
    return RecipeError([Problem(key, f"{why}{'; ' + fix if fix else ''}", file=str(path))])


def read_bytes(path, key: str = "", limit: int = MAX_BYTES, fix: str = "") -> bytes:
    """The bytes of the regular file at `path`, or a `RecipeError` naming it (missing included)."""
    data, why = try_bytes(path, limit)
    if data is None:
        raise problem(path, "does not exist" if why == "missing" else why, key, fix)
    return data


def read_lines(path, line_limit: int, key: str = "", limit: int | None = MAX_BYTES, fix: str = ""):
    """The lines of the regular file at `path`, as bytes, one at a time: a line is read with at most `line_limit` + 1
    bytes in memory, and one longer (or one past `limit` bytes in all; None lifts it) comes as None, after which
    nothing more is read. A file that is not regular, or larger than `limit`, is refused before its first line: a
    `RecipeError` naming it, as `read_bytes` refuses.

    >>> import tempfile, os; d = tempfile.mkdtemp(); p = os.path.join(d, "x.jsonl")
    >>> _ = open(p, "w").write("{}" + chr(10) + "x" * 10 + chr(10) + "{}" + chr(10))
    >>> list(read_lines(p, line_limit=5))
    [b'{}\\n', None]
    """
    try:
        fd = _open(path)
    except FileNotFoundError:
        raise problem(path, "does not exist", key, fix) from None
    except Unreadable as err:
        raise problem(path, str(err), key, fix) from None
    try:
        with os.fdopen(fd, "rb") as f:
            if limit is not None and os.fstat(f.fileno()).st_size > limit:
                raise problem(path, str(_too_large(limit)), key, fix)
            read = 0
            while line := f.readline(line_limit + 1):
                read += len(line)
                if len(line) > line_limit or (limit is not None and read > limit):
                    yield None
                    return
                yield line
    except OSError as err:
        raise problem(path, f"cannot be read ({err.strerror or err})", key, fix) from None


def read_text(path, key: str = "", limit: int = MAX_BYTES, fix: str = "") -> str:
    """The UTF-8 text of the regular file at `path`, or a `RecipeError` naming it."""
    data = read_bytes(path, key, limit, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise problem(path, f"is not UTF-8 text ({err.reason} at byte {err.start})", key, fix) from None


def read_json(path, expect: type | None = dict, key: str = "", limit: int = MAX_BYTES, depth: int = MAX_DEPTH,
              fix: str = ""):
    """The JSON value of type `expect` at `path`, or a `RecipeError` naming the file and what is wrong.

    >>> read_json("/dev/null")
    Traceback (most recent call last):
    ...
    grpokit.errors.RecipeError: 1 problem found:
      - /dev/null: is a character device, not a regular file
    """
    data = read_bytes(path, key, limit, fix)
    try:
        return parse_json(data, expect, depth)
    except Unreadable as err:
        raise problem(path, str(err), key, fix) from None


__all__ = ["MAX_BYTES", "MAX_DEPTH", "Unreadable", "parse_json", "problem", "read_bytes", "read_json",
           "read_lines", "read_text", "try_bytes", "try_json"]
