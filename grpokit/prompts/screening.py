"""A local data file's faults before `datasets` reads it -- and caches it as Arrow in ~/.cache/huggingface, as big as
the file -- so a file that will be refused is refused with nothing written: empty, not UTF-8, a line that is not
JSON, a cell over `datavalues.MAX_CELL_CHARS` (a JSON line or CSV cell past `MAX_LINE_BYTES` refused unread), every
JSON cell judged as the loaded dataset's would be (`datavalues.Checker`). Rows and lines counted from 1.
"""

from __future__ import annotations

import json
from pathlib import Path

from grpokit.prompts import datavalues
from grpokit import files
from grpokit.prompts.datavalues import SHOWN_ROWS, Checker, kind
from grpokit.errors import Problem, RecipeError


def screen_file(path: Path, fmt: str, spec: dict, set_in: str = "") -> list[str] | None:
    """A local file's faults before `datasets` reads it: empty, not UTF-8, bad JSON lines, bad cells; the column names
    a CSV's header or a Parquet schema gives (None for JSON), for the caller to check before it loads the file."""
    name = path.name

    def fail(message, allowed=None):
        raise RecipeError([Problem("dataset.path", f"{name} {message}", allowed=allowed, file=set_in)])

    if path.stat().st_size == 0:
        fail("is empty (0 bytes)")
    if fmt == "parquet":  # every cell a refusal would name is judged before `datasets` caches the file as Arrow
        return _screen_parquet(path, Checker(spec, name, "row", set_in))
    blank = True
    with path.open("rb") as f:  # in blocks: a file's first line may be hundreds of MB
        while block := f.read(1 << 16):
            if block.strip():
                blank = False
                break
    if blank:
        fail("is empty (only blank lines)")
    if fmt == "json":
        _screen_json(path, spec, set_in, fail)
    elif fmt == "csv":
        return _screen_csv(path, Checker(spec, name, "row", set_in), fail)
    return None


def _screen_csv(path: Path, check: Checker, fail) -> list[str]:
    """The sizes of a CSV's cells that a refusal would name, rows counted from 1 under the header, blank lines skipped
    (as `datasets`, through pandas, reads them); a cell longer than datavalues.MAX_LINE_BYTES is refused unread, as a JSON line is."""
    import csv

    limit = csv.field_size_limit()
    csv.field_size_limit(datavalues.MAX_LINE_BYTES)
    try:
        with path.open(encoding="utf-8-sig", errors="replace", newline="") as f:
            records = csv.reader(f)
            header, n = next(records, None) or [], 0
            names = {check.prompt_col, check.answer_col, *check.template_cols}
            judged = [i for i, name in enumerate(header) if name in names]  # a text cell's one possible fault: its size
            while True:
                try:
                    record = next(records)
                except StopIteration:
                    break
                except csv.Error as err:
                    if "field limit" not in str(err):  # the csv module's other complaints are pandas' to judge
                        break
                    fail(f"row {n + 1} has a cell longer than {datavalues.MAX_LINE_BYTES // 2**20} MiB (MAX_LINE_BYTES); "
                         f"refused unread: a cell is at most {datavalues.MAX_CELL_CHARS:,} characters")
                if record:
                    n += 1
                    if any(len(record[i]) > datavalues.MAX_CELL_CHARS for i in judged if i < len(record)):
                        check.row(dict(zip(header, record)), n)  # said as the loaded dataset's check would say it
    finally:
        csv.field_size_limit(limit)
    check.raise_if_any()
    return header


def _screen_parquet(path: Path, check: Checker) -> list[str]:
    """A Parquet file's text cells that a refusal would name, by their length in batches (pyarrow, no Python rows):
    only a row with a cell over datavalues.MAX_CELL_CHARS is turned into values, for the message the loaded dataset would get."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    columns = [c for c in dict.fromkeys([check.prompt_col, check.answer_col, *check.template_cols]) if c]
    table = pq.ParquetFile(path)
    columns = [c for c in columns if c in table.schema_arrow.names]
    seen = 0
    for batch in table.iter_batches(batch_size=1000, columns=columns) if columns else ():
        for col in columns:
            values = batch.column(col)
            if not (_text(values.type) and len(values)):
                continue
            over = pc.greater(pc.utf8_length(values), datavalues.MAX_CELL_CHARS)
            if pc.any(over).as_py():
                i = pc.index(over, True).as_py()
                check.row({c: batch.column(c)[i].as_py() for c in columns}, seen + i + 1)
        seen += batch.num_rows
    check.raise_if_any()
    return list(table.schema_arrow.names)


def _text(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _screen_json(path: Path, spec: dict, set_in: str, fail) -> None:
    """JSON Lines (or one JSON array): every line decoded and parsed once, cells checked, faults by 1-based line."""
    check = Checker(spec, path.name, "line", set_in)
    bad_json: list[tuple[int, str]] = []  # (line, why): the first is said in full, the rest counted
    with path.open("rb") as f:
        first = f.read(1)
    if first == b"[":  # one JSON array: rows counted from 1
        try:
            rows = json.loads(path.read_bytes().decode("utf-8"))
        except RecursionError:
            fail("nests JSON arrays or objects deeper than Python's JSON reader can follow; a row is a flat {...} of "
                 "columns")
        except UnicodeDecodeError as err:
            fail(f"is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start})", "save the file as UTF-8")
        except json.JSONDecodeError as err:
            fail(f"line {err.lineno} is not valid JSON: {err.msg} (column {err.colno})")
        check.unit = "row"
        for n, row in enumerate(rows, 1):
            if isinstance(row, dict):
                check.row(row, n)
        check.raise_if_any()
        return
    for n, raw in enumerate(files.read_lines(path, datavalues.MAX_LINE_BYTES, key="dataset.path", limit=None), 1):
        if raw is None:
            fail(f"line {n} is longer than {datavalues.MAX_LINE_BYTES // 2**20} MiB (MAX_LINE_BYTES); refused unread: a "
                 f"row is a prompt and its answer, each at most {datavalues.MAX_CELL_CHARS:,} characters")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            fail(f"line {n} is not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1})", "save the file as UTF-8")
        if not line.strip():
            continue
        try:
            row = json.loads(line.lstrip("\ufeff") if n == 1 else line)
        except json.JSONDecodeError as err:
            bad_json.append((n, f"is not valid JSON: {err.msg} (column {err.colno})"))
            continue
        except RecursionError:
            bad_json.append((n, "nests JSON arrays or objects deeper than Python's JSON reader can follow; a row is "
                                "a flat {...} of columns"))
            continue
        if not isinstance(row, dict):
            bad_json.append((n, f"is not a JSON object ({{...}}, one row): it holds {'null' if row is None else kind(row)}"))
            continue
        if not bad_json:
            check.row(row, n)
    if bad_json:
        n, why = bad_json[0]
        later = [str(b[0]) for b in bad_json[1:]]
        more = f" (and {len(later)} more bad line{'s' if len(later) > 1 else ''}: {', '.join(later[:SHOWN_ROWS])}{', ...' if len(later) > SHOWN_ROWS else ''})" if later else ""
        fail(f"line {n} {why}{more}")
    check.raise_if_any()
