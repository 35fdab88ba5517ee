"""What a dataset's prompt and answer cells may hold, checked before training: every fault a clear message.

A prompt is text or a list of chat messages (`{role, content}` with text content), one form per dataset; a
gold answer is text or a number (numbers become text: rewards compare text). Anything else -- a number or
true/false as a prompt, a mapping (which was read as its Python repr), bytes, a list of plain strings, a
message with no content (which passed --check and then raised KeyError in TRL's chat template) -- is refused
at `--check` with its 1-based line (JSON Lines) or row (parquet, CSV, hub), and a count of the rows like it.
Missing or blank cells are holes, dropped and counted by `grpokit.prompts.data.prepare`, not refused here.

Local files are screened before `datasets` reads them (`grpokit.prompts.screening`): not UTF-8, empty, a line that is not
JSON, a cell over the bound, so nothing is cached of a file that will be refused. Before that, each
data file a recipe names is checked without being opened (`file_problem`): a `builtin:` name that ships nothing, a
missing file, a FIFO or device (refused, never waited on), a type grpokit does not read; `--check` says it under the
key that named the file.

>>> check = Checker({"prompt_column": "prompt"}, "data.jsonl", "line")
>>> check.row({"prompt": 7}, 2); [p.format() for p in check.problems()]
["dataset.prompt_column: data.jsonl line 2: 'prompt' holds a number (got 7); allowed: text or a list of chat messages ({role, content})"]
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path

from grpokit.errors import CLI, Problem, RecipeError, nearest

ASSETS = Path(__file__).resolve().parents[1] / "assets"  # data shipped with grpokit, named `builtin:<file>`
BUILTIN = "builtin:"
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{(\w+)\}")
PROMPT_ALLOWED = "text or a list of chat messages ({role, content})"
ANSWER_ALLOWED = "a gold answer is text or a number"
SHOWN_ROWS = 5  # row numbers listed after the first of a kind
# A prompt (or gold answer) of more characters than this is refused before any tokenizer sees it: 2 M characters are
# some 500k tokens of English, past every model's context, and a fast tokenizer given 12 MB in one string aborted the
# whole process (SIGABRT at ~2 GB) instead of raising.
MAX_CELL_CHARS = 2_000_000
# A JSON Lines line longer than this is refused unread: reading and parsing a line costs several times its size in
# memory (a 200 MB line ended in SIGABRT at 6.3 GB), and a row of prompt and answer under MAX_CELL_CHARS fits.
MAX_LINE_BYTES = 16 * 2**20


def builtin_names() -> list[str]:
    """Data files shipped in grpokit/assets, as a recipe names them: `builtin:smoke.jsonl`, `builtin:arithmetic/train.jsonl`."""
    return sorted(f"{BUILTIN}{p.relative_to(ASSETS).as_posix()}" for p in ASSETS.rglob("*")
                  if p.suffix.lower() in LOCAL_FORMATS and "model_configs" not in p.parts)


def builtin_path(name: str, set_in: str = "", key: str = "dataset.path") -> Path:
    """`builtin:smoke.jsonl` -> the shipped file; a name that ships nothing is a recipe problem (under `key`) with the
    nearest name.

    >>> builtin_path("builtin:smoke.jsonl").name
    'smoke.jsonl'
    """
    if name not in builtin_names():
        raise RecipeError([Problem(key, f"no data file shipped as {name!r}", allowed=", ".join(builtin_names()),
                                   suggestion=nearest(name, builtin_names()), file=set_in)])
    return ASSETS / name[len(BUILTIN):]


# What else than a regular file can lie at a path (os.stat's file types), in a message's words.
_NOT_FILES = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
              stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}


def file_problem(value: str, key: str, set_in: str = "") -> Problem | None:
    """Why the data file a recipe names under `key` (`dataset.path`, `dataset.eval_path`) cannot be read, or None.

    Checked without opening it: a FIFO or a device at the path is refused at once, never waited on. A `builtin:` name
    must name a shipped file; a local file must exist, be a regular file, and be of a type grpokit reads.

    >>> file_problem("/dev/null", "dataset.eval_path").format()
    'dataset.eval_path: is a character device, not a regular file: /dev/null; a dataset is a .jsonl, .json, .parquet or .csv file'
    """
    if value.startswith(BUILTIN):
        try:
            path = builtin_path(value, set_in, key)
        except RecipeError as err:
            return err.problems[0]
    else:
        path = Path(value)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if set_in == CLI:
            relative = f"a relative path on the command line is read from the folder the command runs in ({Path.cwd()})"
        else:
            folder = f" ({Path(set_in).resolve().parent})" if set_in else ""
            relative = f"a relative path is read from the folder of the recipe that sets it{folder}"
        return Problem(key, f"dataset file does not exist; {relative}, and data shipped with grpokit is named "
                       f"{', '.join(builtin_names())} (looked for {path})", file=set_in)
    except OSError as err:
        return Problem(key, f"cannot be read ({err.strerror or err}): {path}", file=set_in)
    if not stat.S_ISREG(mode):  # the path in the message, not as a value: a value is cut at 80 characters
        kind = _NOT_FILES.get(stat.S_IFMT(mode), "not a regular file")
        return Problem(key, f"is {kind}, not a regular file: {path}; a dataset is a .jsonl, .json, .parquet or .csv file",
                       file=set_in)
    if path.suffix.lower() not in LOCAL_FORMATS:
        return Problem(key, "unsupported file type", path.suffix, ", ".join(LOCAL_FORMATS), file=set_in)
    return None


def data_file_problems(dataset: dict, where_set) -> list[Problem]:
    """`file_problem` for each data file the dataset section names (`path`, `eval_path`), blamed on the file (or the
    command line) that set it: what `--check` says before anything loads."""
    problems = []
    for key in ("path", "eval_path"):
        value = dataset.get(key)
        if isinstance(value, str) and value:
            where = where_set(f"dataset.{key}")
            problem = file_problem(value, f"dataset.{key}", where)
            if problem:
                problems.append(problem)
    return problems



def kind(value) -> str:
    """A cell's type in a user's words."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def _blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value)


def prompt_fault(value) -> tuple[str, str] | None:
    """(what is wrong, what is allowed) for a prompt cell, or None when it is text or chat messages."""
    if isinstance(value, str):
        return None
    if isinstance(value, (bytes, bytearray)):
        return "holds bytes", "text: store it as text (UTF-8), not binary"
    if isinstance(value, list):
        if all(isinstance(m, str) for m in value):
            return "holds a list of plain strings", "text; a chat prompt is a list of {role, content} messages"
        for i, message in enumerate(value, 1):
            if not isinstance(message, dict):
                return f"message {i} is {kind(message)}", "each message a {role, content} mapping"
            if not isinstance(message.get("role"), str) or not message["role"].strip():
                return f"message {i} has no 'role'", "each message a {role, content} mapping with text content"
            if message.get("content") is None:
                return f"message {i} has no 'content'", "each message a {role, content} mapping with text content"
            if not isinstance(message["content"], str):
                return f"message {i}'s 'content' is {kind(message['content'])}", "text content in every message"
        return None
    return f"holds {kind(value)}", PROMPT_ALLOWED


def answer_fault(value) -> tuple[str, str] | None:
    """(what is wrong, what is allowed) for a gold-answer cell, or None when it is text or a finite number."""
    if isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
        return None
    if isinstance(value, bool):
        return "holds true/false", ANSWER_ALLOWED + " (quote it: \"true\")"
    if isinstance(value, float):
        return f"holds {value}", ANSWER_ALLOWED
    return f"holds {kind(value)}", ANSWER_ALLOWED


def _chars(value) -> int:
    """The characters of text a cell holds: a string's, or the sum of a list of chat messages' contents."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(len(m["content"]) for m in value if isinstance(m, dict) and isinstance(m.get("content"), str))
    return 0


def size_fault(value) -> tuple[str, str] | None:
    """(what is wrong, what is allowed) for a cell of more than MAX_CELL_CHARS characters, else None."""
    n = _chars(value)
    if n <= MAX_CELL_CHARS:
        return None
    return f"holds {n:,} characters", f"at most {MAX_CELL_CHARS:,} characters a cell (far past any model's context)"


def template_fault(value) -> tuple[str, str] | None:
    if value is None or isinstance(value, (str, int, float)):
        return None
    return f"holds {kind(value)}", "text or a number in a template placeholder"


class Checker:
    """Collects faults row by row: the first of each kind in full, then a count and a few row numbers."""

    def __init__(self, spec: dict, source: str, unit: str, set_in: str = ""):
        self.source, self.unit, self.set_in = source, unit, set_in
        self.prompt_col, self.answer_col = spec.get("prompt_column", "prompt"), spec.get("answer_column")
        template = spec.get("template")
        self.template_cols = [m.group(1) for m in _PLACEHOLDER.finditer(template) if m.group(1)] if template else []
        self.faults: dict[tuple, list] = {}  # (key, column, what) -> [first row, its value, allowed, [later rows]]
        self.form: tuple[str, int] | None = None  # the first prompt's form ('text' or 'chat') and its row

    def _add(self, key: str, column: str, what: str, allowed: str, value, n: int) -> None:
        if _chars(value) > 80:  # shown cut short anyway: never copy a megabyte cell into a message
            value = value[:80] if isinstance(value, str) else f"{len(value)} messages"
        found = self.faults.get((key, column, what))
        if found is None:
            self.faults[(key, column, what)] = [n, value, allowed, []]
        else:
            found[3].append(n)

    def row(self, row: dict, n: int) -> None:
        if not self.template_cols:
            value = row.get(self.prompt_col)
            if not _blank(value):
                fault = prompt_fault(value) or size_fault(value)
                if fault:
                    self._add("prompt_column", self.prompt_col, *fault, value, n)
                else:
                    form = "text" if isinstance(value, str) else "chat"
                    if self.form is None:
                        self.form = (form, n)
                    elif form != self.form[0]:
                        first = f"{self.unit} {self.form[1]}'s is {'text' if self.form[0] == 'text' else 'chat messages'}"
                        self._add("prompt_column", self.prompt_col,
                                  f"holds {'text' if form == 'text' else 'chat messages'}, but {first}",
                                  "one form per dataset: all text or all chat messages", value, n)
        for col in self.template_cols:
            fault = template_fault(row.get(col)) or size_fault(row.get(col))
            if fault:
                self._add("template", col, *fault, row.get(col), n)
        if self.answer_col is not None and not _blank(row.get(self.answer_col)):
            fault = answer_fault(row[self.answer_col]) or size_fault(row[self.answer_col])
            if fault:
                self._add("answer_column", self.answer_col, *fault, row[self.answer_col], n)

    def problems(self) -> list[Problem]:
        out = []
        for (key, column, what), (n, value, allowed, more) in self.faults.items():
            text = f"{self.source} {self.unit} {n}: {column!r} {what}"
            if more:
                shown = ", ".join(map(str, more[:SHOWN_ROWS])) + (", ..." if len(more) > SHOWN_ROWS else "")
                text += f" (and {len(more)} more {self.unit}{'s' if len(more) > 1 else ''} like it: {self.unit}{'s' if len(more) > 1 else ''} {shown})"
            out.append(Problem(f"dataset.{key}", text, value, allowed, file=self.set_in))
        return out

    def raise_if_any(self) -> None:
        if self.faults:
            raise RecipeError(self.problems())


def check_dataset(ds, spec: dict, source: str, set_in: str = "") -> None:
    """Screen the prompt, answer and template columns of a loaded dataset; rows counted from 1."""
    check = Checker(spec, source, "row", set_in)
    cols = [c for c in dict.fromkeys([check.prompt_col, check.answer_col, *check.template_cols]) if c in ds.column_names]
    if not cols:
        return
    n = 0
    for batch in ds.select_columns(cols).iter(batch_size=1000):
        for i in range(len(batch[cols[0]])):
            n += 1
            check.row({c: batch[c][i] for c in cols}, n)
    check.raise_if_any()


FEW_SHOT_ROLES = ("system", "user", "assistant", "tool")


def few_shot_fault(shot) -> str | None:
    """What is wrong with one `dataset.few_shot` message, or None.

    >>> few_shot_fault({"role": "assistant", "tool_calls": [{"name": "add", "arguments": {"a": 1}}]}) is None
    True
    >>> few_shot_fault({"role": "bot", "content": "hi"})
    "its role 'bot' is not one of system, user, assistant, tool"
    """
    if not isinstance(shot, dict):
        return "is not a message mapping"
    unknown = [k for k in shot if k not in ("role", "content", "tool_calls", "name")]
    if unknown:
        return f"has key(s) {', '.join(map(str, unknown))} a chat message does not"
    if shot.get("role") not in FEW_SHOT_ROLES:
        return f"its role {shot.get('role')!r} is not one of {', '.join(FEW_SHOT_ROLES)}"
    if shot.get("content") is not None and not isinstance(shot["content"], str):
        return "its content is not text"
    calls = shot.get("tool_calls")
    if calls is not None:
        if shot["role"] != "assistant":
            return "has tool_calls, which only an assistant message makes"
        if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                                  and isinstance(c.get("arguments", {}), dict) for c in calls):
            return "its tool_calls must be a list of {name: text, arguments: mapping}"
    elif not isinstance(shot.get("content"), str):
        return "has neither content nor tool_calls"
    return None
