"""The dataset section: load a local file or a hub dataset, build prompts, drop holes, filter long prompts.

Rows whose prompt (or, when `answer_column` is set, gold answer) is missing or empty are dropped with
a count in the log: one bad row in 7,000 should not stop a run, and it must never crash mid-training.
A dataset left empty by that is a recipe error.
"""

from __future__ import annotations

import logging
import re
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpokit.prompts.datavalues import ASSETS, BUILTIN, LOCAL_FORMATS, builtin_names, builtin_path, file_problem  # noqa: F401
from grpokit.errors import Problem, RecipeError, nearest

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{(\w+)\}")
_NEW_ANSWER = "__grpokit_answer"


class NotReachable(Exception):
    """A hub dataset that is not cached and cannot be fetched (offline): reported as a note, not an error."""


def load_raw(spec: dict, set_in: str = "", key: str = "dataset.path"):
    """The split as a `datasets.Dataset`; `RecipeError` for a bad local file, `NotReachable` offline.

    A local file is screened before `datasets` reads it, so that each fault is said once, in the user's
    terms, with its 1-based line: not UTF-8, empty, a line that is not JSON, a prompt or answer of the wrong
    type (see `values`). `datasets` would say `StopIteration`, count rows from 0, or cast the value silently.

    `set_in` is where `dataset.path` (or `dataset.name`) was set, as `Recipe.blame` gives it: the recipe, or
    `CLI` for the command line. Messages name it, and a relative path is explained from it. `key` is the recipe key
    that named the file (`dataset.eval_path` for held-out data): problems with the file are blamed on it.
    """
    import datasets

    datasets.disable_progress_bars()
    if spec.get("reasoning_gym"):  # generated here from seeds (grpokit.prompts.tasks), checked when the recipe was validated
        from grpokit.prompts import tasks

        return tasks.load(spec["reasoning_gym"], heldout=bool(spec.get("heldout")), set_in=set_in or None)
    if spec.get("path"):
        problem = file_problem(spec["path"], key, set_in)
        if problem:
            raise RecipeError([problem])
        path = builtin_path(spec["path"], set_in, key) if spec["path"].startswith(BUILTIN) else Path(spec["path"])
        fmt = LOCAL_FORMATS[path.suffix.lower()]
        from grpokit.prompts.screening import screen_file

        columns = screen_file(path, fmt, spec, set_in)
        problems = check_columns(spec, columns, set_in) if columns is not None else []
        if problems:  # said before `datasets` reads the file and caches it, as check_source would say it after
            raise RecipeError(problems)
        try:
            with _quiet_datasets():
                return datasets.load_dataset(fmt, data_files=str(path), split="train")
        except Exception as err:  # noqa: BLE001 - any parse failure is the file's fault: say which and why
            cause = err.__cause__ or err  # datasets wraps the parser's message (what, which row) in a vague one
            raise RecipeError([Problem(key, f"cannot read {path.name}: {type(cause).__name__}: {str(cause)[:300]}", file=set_in)]) from None
    try:
        return datasets.load_dataset(spec["name"], spec.get("config"), split=spec.get("split", "train"))
    except Exception as err:  # noqa: BLE001
        text = f"{type(err).__name__}: {err}"
        if _unreachable(err):
            raise NotReachable(f"dataset {spec['name']!r} is not in the local cache") from None
        raise RecipeError([Problem("dataset", f"cannot load {spec['name']!r}: {text[:300]}", file=set_in)]) from None


def _unreachable(err: BaseException) -> bool:
    """The hub could not be asked (offline mode, no network) and the cache has no copy: told by the exception
    types datasets and huggingface_hub raise for it, anywhere in the chain, not by their messages."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, (ConnectionError, LocalEntryNotFoundError)):  # OfflineModeIsEnabled is a ConnectionError
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


@contextmanager
def _quiet_datasets():
    """datasets logs its own "Failed to load JSON ... in row 2" (0-based) before raising: the error is said once, by us."""
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def source_name(spec: dict) -> str:
    """How messages name the data: the file's name, or the hub dataset and its split."""
    if spec.get("path"):
        return Path(spec["path"]).name
    if spec.get("reasoning_gym"):
        from grpokit.prompts import tasks

        return tasks.describe(spec["reasoning_gym"])
    if not spec:
        return "prompts made by the tools.environment's reset()"
    return f"{spec.get('name')} ({spec.get('split', 'train')})"


def template_columns(template: str) -> list[str]:
    return [m.group(1) for m in _PLACEHOLDER.finditer(template) if m.group(1)]


def render(template: str, row: dict) -> str:
    """Fill `{column}` placeholders; `{{` and `}}` are literal braces (for LaTeX like `\\boxed{{}}`)."""

    def sub(m):
        if m.group(0) == "{{":
            return "{"
        if m.group(0) == "}}":
            return "}"
        return str(row[m.group(1)])

    return _PLACEHOLDER.sub(sub, template)


def check_columns(spec: dict, columns: list[str], set_in: str = "") -> list[Problem]:
    """Every column the recipe names must exist in the data."""
    problems = []
    for key in ("prompt_column", "answer_column"):
        col = spec.get(key)
        if col is not None and col not in columns:
            problems.append(Problem(f"dataset.{key}", "names no column of the dataset", col, ", ".join(columns), nearest(col, columns), file=set_in))
    if spec.get("template"):
        for col in template_columns(spec["template"]):
            if col not in columns:
                problems.append(Problem("dataset.template", f"placeholder {{{col}}} names no column (write {{{{ and }}}} for literal braces)",
                                        col, ", ".join(columns), nearest(col, columns), file=set_in))
    return problems


def _missing(value) -> bool:
    """None, a blank string, or an empty list of chat messages: a prompt (or answer) with nothing in it."""
    return value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value)


def is_conversational(spec: dict, tokenizer) -> bool:
    """`dataset.conversational`, with "auto" read as: the tokenizer has a chat template (no tokenizer: text).

    >>> is_conversational({"conversational": "auto"}, None), is_conversational({"conversational": True}, None)
    (False, True)
    """
    if spec["conversational"] == "auto":
        return bool(getattr(tokenizer, "chat_template", None))
    return spec["conversational"]


@dataclass(frozen=True)
class TargetModel:
    """The model the prompts are prepared for: whether it reads chat messages, and how long a prompt may be.

    A prompt is dropped, with a count, when it is over `dataset.max_prompt_tokens` or leaves the completion no room in
    the model's context (`room`): TRL 1.16 does not truncate prompts, and a longer one runs past the model's positions
    or out of memory mid-training.
    """

    tokenizer: Any = None  # measures the prompts; None: none is measured, so none is dropped for its length
    conversational: bool = True  # a text prompt becomes chat messages (`is_conversational`)
    context_length: int | None = None  # the model's positions (`context_length()`); None when unknown
    completion_length: int = 0  # trainer.max_completion_length
    schema_length: int = 0  # tokens the tools' schemas add to every prompt (TRL renders each with `tools=`)

    @property
    def room(self) -> int | None:
        """The tokens a prompt may take in the model's context (as measured without tool schemas, which take their
        share first); None when the context is unknown.

        >>> TargetModel(context_length=2048, completion_length=512).room, TargetModel().room
        (1536, None)
        >>> TargetModel(context_length=2048, completion_length=512, schema_length=300).room
        1236
        """
        return self.context_length - self.completion_length - self.schema_length if self.context_length else None

    def room_sum(self) -> str:
        """How `room` is reached, for a message."""
        schemas = f" - {self.schema_length} tokens of tool schemas" if self.schema_length else ""
        return (f"{self.context_length} positions - max_completion_length {self.completion_length}{schemas} = "
                f"{self.room} tokens")


class _Said:
    """What `prepare` tells as it goes: each line logged now and kept (`preparation_of` gives them back), and each
    drop counted, for the message when no row is left."""

    def __init__(self, log):
        self.log, self.lines, self.drops = log, [], []

    def note(self, line: str) -> None:
        self.lines.append(line)
        self.log(line)

    def dropped(self, count: int, why: str, line: str) -> None:
        """`count` rows dropped (none: nothing said); `line` is logged, `why` ("3 missing or empty") summed up."""
        if count:
            self.note(line)
            self.drops.append(f"{count} {why}")


def prepare(raw, spec: dict, model: TargetModel = TargetModel(), log=print, set_in: str = ""):
    """Build the `prompt` (and `answer`) columns TRL and the rewards read, from `raw` as the dataset section says.

    In order: check the source (`check_source`), drop rows with a hole (`drop_holes`), format the prompts
    (`format_prompts`), drop those `model` has no room for (`drop_long_prompts`), keep the first `dataset.limit`.
    Each drop is logged with a count; a dataset left with no rows is a `RecipeError` that counts them all.
    """
    said = _Said(log)
    check_source(raw, spec, set_in)
    ds = drop_holes(raw, spec, said)
    ds = format_prompts(ds, spec, model.conversational)
    ds, lengths = drop_long_prompts(ds, spec, model, said)
    if spec.get("limit") and len(ds) > spec["limit"]:
        ds = ds.select(range(spec["limit"]))
        lengths = lengths[: spec["limit"]] if lengths is not None else None
    if len(ds) == 0:
        raise RecipeError([Problem("dataset", f"no rows left to train on ({len(raw)} read: {', '.join(said.drops)})", file=set_in)])
    said.note(f"dataset: {len(ds)} prompts ready (of {len(raw)} rows)")
    # --check reads the lengths again (measured once) and the lines: kept as long as the dataset object lives
    _prepared[ds] = Preparation(said.lines, model.tokenizer if lengths is not None else None, lengths)
    return ds


def check_source(raw, spec: dict, set_in: str = "") -> None:
    """The data as loaded, before any row is dropped: the columns the recipe names exist, there are rows, and the
    values are of a usable type. `RecipeError` otherwise."""
    problems = check_columns(spec, raw.column_names, set_in)
    if problems:
        raise RecipeError(problems)
    if len(raw) == 0:
        raise RecipeError([Problem("dataset", f"{source_name(spec)} is empty: no rows", file=set_in)])
    if not (spec.get("path") and LOCAL_FORMATS.get(Path(spec["path"]).suffix.lower()) == "json"):  # JSON: screened by line
        from grpokit.prompts.datavalues import check_dataset

        check_dataset(raw, spec, source_name(spec), set_in)


def drop_holes(raw, spec: dict, said: _Said):
    """`raw` without the rows whose prompt (or, when `answer_column` is set, gold answer) is missing or empty."""
    prompt_col, answer_col = spec.get("prompt_column", "prompt"), spec.get("answer_column")
    keep = raw.filter(
        lambda row: not _missing(row[prompt_col]) and (answer_col is None or not _missing(row[answer_col])),
        desc=None,
    )
    dropped = len(raw) - len(keep)
    said.dropped(dropped, "missing or empty", f"dataset: dropped {dropped} of {len(raw)} rows with a missing or empty "
                 f"{prompt_col!r}" + (f" or {answer_col!r}" if answer_col else ""))
    return keep


def format_prompts(ds, spec: dict, conversational: bool):
    """The `prompt` column TRL reads (from `prompt_column`, or `template` filled from the row, after `system_prompt`),
    and the gold answer as text in `answer` when `answer_column` is set.

    A text prompt becomes chat messages when `conversational`; a prompt that already is chat messages is kept as it
    is. A source column already named `prompt` is used as it is (or with the template).
    """
    prompt_col, answer_col = spec.get("prompt_column", "prompt"), spec.get("answer_column")
    template, system, shots = spec.get("template"), spec.get("system_prompt"), few_shot_messages(spec.get("few_shot"))

    def build(row):
        content = render(template, row) if template else row[prompt_col]
        if conversational and isinstance(content, str):
            out = {"prompt": chat_prompt(system, shots, content)}
        else:
            if isinstance(content, list):  # already chat messages
                out = {"prompt": content}
            else:
                out = {"prompt": (f"{system}\n\n" if system else "") + str(content)}
        if answer_col is not None:
            out[_NEW_ANSWER] = str(row[answer_col])
        return out

    ds = ds.map(build)
    if _NEW_ANSWER in ds.column_names:
        # Written under a new name, then renamed: map() casts a value written into an existing column back to that
        # column's type (datasets 5.2, even with remove_columns), so a numeric gold str(5) would come back as the int 5.
        ds = ds.remove_columns([c for c in ("answer",) if c in ds.column_names]).rename_column(_NEW_ANSWER, "answer")
    return ds


def chat_prompt(system: str | None, shots: list[dict], content: str) -> list[dict]:
    """A prompt as chat messages: the system prompt, the worked messages (`few_shot_messages`), the user's text."""
    return ([{"role": "system", "content": system}] if system else []) + shots + [{"role": "user", "content": content}]


def few_shot_messages(shots: list | None) -> list[dict]:
    """`dataset.few_shot` as chat messages in TRL's form: an assistant's `tool_calls` entries `{name, arguments}`
    become `{type: function, function: {name, arguments}}`; a message without tool calls carries none.

    >>> few_shot_messages([{"role": "assistant", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}])
    [{'role': 'assistant', 'content': '', 'tool_calls': [{'type': 'function', 'function': {'name': 'add', 'arguments': {'a': 1, 'b': 2}}}]}]
    """
    out = []
    for shot in shots or []:
        message = {"role": shot["role"], "content": shot.get("content") or ""}
        if shot.get("name"):
            message["name"] = shot["name"]
        if shot.get("tool_calls"):
            message["tool_calls"] = [{"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments") or {}}}
                                     for c in shot["tool_calls"]]
        out.append(message)
    return out


def drop_long_prompts(ds, spec: dict, model: TargetModel, said: _Said):
    """`ds` without the prompts over `dataset.max_prompt_tokens` or over the model's `room`, and the token counts of
    the prompts kept; `(ds, None)` when nothing is measured (no tokenizer, or neither bound is known)."""
    limit = spec.get("max_prompt_tokens")
    if model.tokenizer is None or not (limit or model.context_length):
        return ds, None
    lengths = prompt_lengths(model.tokenizer, ds)
    kept, over_limit, over_room = split_by_length(lengths, limit, model.room)
    said.dropped(over_limit, f"over max_prompt_tokens ({limit})",
                 f"dataset: dropped {over_limit} of {len(ds)} prompts longer than {limit} tokens (max_prompt_tokens)")
    said.dropped(over_room, f"longer than the model's context leaves for a prompt ({model.room_sum()})",
                 f"dataset: dropped {over_room} of {len(ds)} prompts longer than the model's context leaves them: "
                 f"{model.room_sum()}")
    if len(kept) < len(ds):
        return ds.select(kept), [lengths[i] for i in kept]
    return ds, lengths


def split_by_length(lengths: list[int], limit: int | None, room: int | None) -> tuple[list[int], int, int]:
    """(the indices of the prompts that fit, how many are over `limit`, how many over `room`); no bound: None or 0.
    A prompt over both counts once, as over `limit`.

    >>> split_by_length([3, 9, 6, 2], limit=8, room=5)
    ([0, 3], 1, 1)
    """
    kept, over_limit, over_room = [], 0, 0
    for i, n in enumerate(lengths):
        if limit and n > limit:
            over_limit += 1
        elif room is not None and n > room:
            over_room += 1
        else:
            kept.append(i)
    return kept, over_limit, over_room


@dataclass
class Preparation:
    """What `prepare` did to one dataset: the lines it logged (rows dropped and why, rows ready), and the prompt
    lengths it measured with `tokenizer` (None when it measured none)."""

    lines: list[str] = field(default_factory=list)
    tokenizer: object = None
    lengths: list[int] | None = None


# keyed by the dataset object itself (datasets' Dataset hashes by identity): an entry goes with its dataset
_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def preparation_of(ds) -> Preparation:
    """What `prepare` logged and measured for the dataset it returned; an empty `Preparation` for any other.

    >>> preparation_of(object.__new__(type("NotPrepared", (), {}))).lines
    []
    """
    try:
        return _prepared.get(ds) or Preparation()
    except TypeError:  # not weakly referable: never a dataset `prepare` returned
        return Preparation()


def context_length(model_path: str | None) -> int | None:
    """The model's positions (`max_position_embeddings` of its config.json, read offline), or None when unknown."""
    if not model_path:
        return None
    from grpokit.checkpoints.gguf import context_length as gguf_context_length, is_gguf_file

    if is_gguf_file(model_path):  # --check reads an unconverted GGUF's own metadata
        return gguf_context_length(Path(model_path))
    from grpokit.planning.architecture import ConfigNotFound, load_model_config

    try:
        config, _ = load_model_config(model_path)
    except (ConfigNotFound, OSError, ValueError):
        return None
    n = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def prompt_lengths(tokenizer, ds, batch_size: int = 512, rows=None) -> list[int]:
    """Token count of every prompt of `ds` (or of `rows`, a list of indices), as TRL 1.16 tokenizes it.

    TRL's `_tokenize_prompts` calls `apply_chat_template(..., add_generation_prompt=True, tokenize=True)` on a batch
    of chat prompts, and the tokenizer itself (special tokens included) on text prompts: the same calls, in batches,
    so measuring every row of a 7,000-row dataset takes about as long as reading it.
    """
    known = preparation_of(ds)
    if rows is None and known.lengths is not None and known.tokenizer is tokenizer:
        return list(known.lengths)
    source = ds.select(rows) if rows is not None else ds
    out: list[int] = []
    for batch in source.select_columns(["prompt"]).iter(batch_size=batch_size):
        out.extend(len(x) for x in _token_ids(tokenizer, batch["prompt"]))
    return out


def _token_ids(tokenizer, prompts: list) -> list[list[int]]:
    """Token ids of a batch of prompts, as TRL 1.16 tokenizes them (chat template and generation prompt included)."""
    if prompts and isinstance(prompts[0], list):
        return tokenizer.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    return tokenizer(text=list(prompts))["input_ids"]


LEAD_ROWS = 64  # the lead is measured on this many rows, evenly spaced: more can only shorten it, rarely


def prompt_lead(tokenizer, ds, rows: int = LEAD_ROWS) -> int:
    """Leading tokens every prompt of `ds` shares (a system text, a worked call), measured on up to `rows` rows evenly
    spaced, tokenized as TRL does: what grpokit's own passes compute once for all prompts (grpokit.trainer.shared_prompt)."""
    n = len(ds)
    if n < 2:
        return 0
    picked = sorted({i * n // min(n, rows) for i in range(min(n, rows))})
    ids = _token_ids(tokenizer, ds.select(picked).select_columns(["prompt"]).to_dict()["prompt"])
    first, lead = ids[0], min(len(x) for x in ids)
    for other in ids[1:]:
        lead = next((i for i, (a, b) in enumerate(zip(first[:lead], other[:lead])) if a != b), lead)
    return lead


def prompt_tokens(tokenizer, prompt) -> int:
    """Token count of one prompt as TRL feeds it (chat template included)."""
    if isinstance(prompt, list):
        return len(tokenizer.apply_chat_template([prompt], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"][0])
    return len(tokenizer(text=[prompt])["input_ids"][0])


def heldout_spec(dataset: dict) -> dict | None:
    """The dataset section with its held-out split in place of the train split (None when it names none).

    >>> heldout_spec({"path": "train.jsonl", "eval_path": "test.jsonl", "eval_limit": 8, "limit": 100})["path"]
    'test.jsonl'
    """
    if dataset.get("reasoning_gym"):  # its own held-out problems, from eval_seed (grpokit.prompts.tasks)
        spec = {**dataset, "heldout": True}
    elif dataset.get("eval_path"):
        spec = {**dataset, "path": dataset["eval_path"]}
    elif dataset.get("eval_split"):
        spec = {**dataset, "split": dataset["eval_split"]}
    else:
        return None
    spec["limit"] = dataset.get("eval_limit")
    return spec


def heldout_dataset(recipe, tokenizer, log=print):
    """The held-out prompts, formatted exactly like the train split (template, system prompt, chat format)."""
    spec = heldout_spec(recipe.dataset)
    if spec is None:
        raise RecipeError([Problem("dataset.eval_path", "--eval and trainer.eval_strategy need held-out data; set "
                                   "dataset.eval_path (a local file) or dataset.eval_split (a hub split)", file=str(recipe.path))])
    try:
        set_in = recipe.blame("dataset.reasoning_gym" if spec.get("reasoning_gym") else
                              "dataset.eval_path" if spec.get("path") else "dataset.eval_split")
        raw = load_raw(spec, set_in=set_in, key="dataset.eval_path")
    except NotReachable as err:
        raise RecipeError([Problem("dataset.eval_split", str(err), spec.get("split"), file=set_in)]) from None
    model = TargetModel(tokenizer, is_conversational(recipe.dataset, tokenizer))
    return prepare(raw, spec, model, log=lambda m: log(f"held-out {m}"), set_in=set_in)
