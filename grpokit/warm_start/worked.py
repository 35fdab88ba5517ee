"""The warm start's worked exchanges, and which of their tokens carry the loss.

An exchange is a whole rollout in TRL's message form -- the training prompt (system prompt, few-shot messages, the
problem), the assistant's tool calls, each tool's result as TRL's loop writes it (`str(result)`), the answer -- read
from a JSONL file (`warm_start.examples`) or written here for a problem of the recipe's own task
(`warm_start.from_task`, tasks in `WRITERS`). Each is rendered by the recipe's chat template, with the recipe's tools,
exactly as TRL's tool loop renders a rollout; its labels are the assistant turns' own tokens (`tokens_and_labels`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from grpokit import files
from grpokit.errors import Problem
from grpokit.warm_start.section import KEY, WRITTEN_FOR

_PRODUCT = re.compile(r"-?\d+(?:\s*\*\s*-?\d+)+")
_CHAIN = re.compile(r"(\d+(?:\s*[+-]\s*\d+)+)\s*=")
MAX_EXAMPLES = 100_000


@dataclass
class Worked:
    """The exchanges the pass trains on, how they were made (for --check and the record), and their tokens."""

    exchanges: list[list[dict]]
    source: str
    rows: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (input_ids, assistant mask) each
    lines: list[int] = field(default_factory=list)  # each exchange's line of its file; [] for exchanges written here

    @property
    def trained_tokens(self) -> int:
        return sum(sum(mask) for _, mask in self.rows)


def product_exchange(prompt: list[dict], question: str, answer: str | None, tool: str) -> list[dict]:
    """The product of a reasoning-gym `products` question, worked with a two-integer `tool` (multiply): the first two
    factors, then each result by the next factor, each result read back; the last result stated. ValueError when the
    question holds no product or the gold answer differs from it."""
    found = _PRODUCT.search(question)
    if not found:
        raise ValueError(f"no product a * b * ... in the question {question[:80]!r}")
    factors = [int(x) for x in found.group(0).replace(" ", "").split("*")]
    messages, value = list(prompt), factors[0]
    for factor in factors[1:]:
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": tool, "arguments": {"a": value, "b": factor}}}]})
        value *= factor
        messages.append({"role": "tool", "name": tool, "content": str(value)})  # as TRL writes a result: str(result)
    if answer is not None and str(answer).strip() != str(value):
        raise ValueError(f"the worked product {value} is not the task's answer {answer!r}")
    return messages + [{"role": "assistant", "content": str(value)}]


def chain_sum_exchange(prompt: list[dict], question: str, answer: str | None, add: str = "add",
                       subtract: str = "subtract") -> list[dict]:
    """The value of a reasoning-gym `chain_sum` question (`a + b - c ... =`), worked left to right with two-integer
    tools `add` and `subtract`: the first two terms, then each result with the next term, each result read back; the
    last result stated. ValueError when the question holds no such chain or the gold answer differs from it."""
    found = _CHAIN.search(question)
    if not found:
        raise ValueError(f"no chain a + b - ... = in the question {question[:80]!r}")
    terms = re.findall(r"([+-]?)\s*(\d+)", found.group(1))
    messages, value = list(prompt), int(terms[0][1])
    for sign, digits in terms[1:]:
        tool, term = subtract if sign == "-" else add, int(digits)
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": tool, "arguments": {"a": value, "b": term}}}]})
        value = value - term if sign == "-" else value + term
        messages.append({"role": "tool", "name": tool, "content": str(value)})  # as TRL writes a result: str(result)
    if answer is not None and str(answer).strip() != str(value):
        raise ValueError(f"the worked sum {value} is not the task's answer {answer!r}")
    return messages + [{"role": "assistant", "content": str(value)}]


# a task -> the function that works its problems, called with the tools WRITTEN_FOR names, in that order
WRITERS = {"products": product_exchange, "chain_sum": chain_sum_exchange}
assert set(WRITERS) == set(WRITTEN_FOR)


def from_task(spec: dict, dataset: dict, tool_names: list[str]) -> Worked:
    """`warm_start.from_task`: problems of the recipe's reasoning-gym tasks from `spec`'s seeds, made in the bounded
    child process training's are made in (`taskgen.produce`), each worked by its task's writer."""
    from grpokit.prompts.data import chat_prompt, few_shot_messages, render
    from grpokit.prompts.tasks import produce

    source = dataset["reasoning_gym"]
    (made,) = produce([{"tasks": source["tasks"], "size": spec["size"], "seed": spec["seed"]}])
    shots = few_shot_messages(dataset.get("few_shot"))
    exchanges = []
    for question, answer, task, _entry in made:
        missing = [tool for tool in WRITTEN_FOR[task] if tool not in tool_names]
        if missing:
            raise _refused(f"{KEY}.from_task", f"writes {task} exchanges that call the tools "
                           f"{', '.join(WRITTEN_FOR[task])}, and the recipe's tools are {', '.join(tool_names) or 'none'}"
                           "; give warm_start.examples instead")
        content = render(dataset["template"], {"prompt": question}) if dataset.get("template") else question
        prompt = chat_prompt(dataset.get("system_prompt"), shots, content)
        try:
            exchanges.append(WRITERS[task](prompt, question, answer, *WRITTEN_FOR[task]))
        except ValueError as err:
            raise _refused(f"{KEY}.from_task", f"cannot work a {task} problem: {err}") from None
    names = [t["name"] for t in source["tasks"]]
    tools = list(dict.fromkeys(tool for name in names for tool in WRITTEN_FOR[name]))
    return Worked(exchanges, f"{len(exchanges)} {' + '.join(names)} problems from reasoning-gym seeds {spec['seed']}.."
                             f"{spec['seed'] + spec['size'] - 1}, each worked with the tool{'s' * (len(tools) > 1)} "
                             f"{' and '.join(tools)}")


def from_file(path: str, dataset: dict, tool_names: list[str]) -> Worked:
    """`warm_start.examples`: one {"messages": [...]} a line; an exchange that starts at the user's turn is put after
    the recipe's own prompt (system prompt, few-shot), as a training prompt is. Read bounded, as the dataset screen
    reads a data file (`screening`): each line's size before it is parsed (`datavalues.MAX_LINE_BYTES`), its nesting as
    it is (the file door's `MAX_DEPTH`), at most `MAX_EXAMPLES` exchanges; the first faults named with their line,
    the rest counted."""
    from grpokit.prompts.data import few_shot_messages
    from grpokit.prompts.datavalues import MAX_LINE_BYTES, few_shot_fault

    key, faults, exchanges, numbers = f"{KEY}.examples", [], [], []
    head = ([{"role": "system", "content": dataset["system_prompt"]}] if dataset.get("system_prompt") else []) + \
        few_shot_messages(dataset.get("few_shot"))
    for number, raw in enumerate(files.read_lines(path, MAX_LINE_BYTES, key=key), 1):
        if raw is None:
            faults.append((number, f" is longer than {MAX_LINE_BYTES // 2**20} MiB (MAX_LINE_BYTES); refused unread, with "
                                   "every line after it: an exchange is a few chat messages"))
            break
        if not raw.strip():
            continue
        if len(exchanges) + len(faults) >= MAX_EXAMPLES:
            faults.append((number, f" is past the {MAX_EXAMPLES:,} exchanges a warm start reads; refused unread, with "
                                   "every line after it"))
            break
        try:
            row = files.parse_json(raw, expect=dict)
        except files.Unreadable as err:
            faults.append((number, f" {err}"))
            continue
        messages = row.get("messages")
        fault = _exchange_fault(messages, tool_names, few_shot_fault)
        if fault:
            faults.append((number, f": {fault}"))
            continue
        messages = few_shot_messages([_shorthand(m) for m in messages])
        exchanges.append(head + messages if messages[0]["role"] == "user" else messages)
        numbers.append(number)
    if faults:
        raise _refused(problems=counted(key, path, faults))
    if not exchanges:
        raise _refused(problems=[Problem(key, "holds no exchange", path)])
    return Worked(exchanges, f"{len(exchanges)} exchanges from {Path(path).name}", lines=numbers)


def counted(key: str, path: str, faults: list[tuple[int, str]], unit: str = "line") -> list[Problem]:
    """Faults by line (or another `unit`), (number, what follows "line N"), as problems: the first `SHOWN_ROWS` said
    whole, the rest counted in one more with their first numbers (a file of 100,000 bad lines is a few lines of
    messages).

    >>> [p.message for p in counted("k", "f", [(n, " is not JSON") for n in range(1, 9)])][-2:]
    ['line 5 is not JSON', 'and 3 more lines with faults: 6, 7, 8']
    """
    from grpokit.prompts.datavalues import SHOWN_ROWS

    said = [Problem(key, f"{unit} {number}{what}", path) for number, what in faults[:SHOWN_ROWS]]
    rest = [str(number) for number, _ in faults[SHOWN_ROWS:]]
    if rest:
        said.append(Problem(key, f"and {len(rest):,} more {unit}{'s' * (len(rest) > 1)} with faults: "
                            f"{', '.join(rest[:SHOWN_ROWS])}{', ...' if len(rest) > SHOWN_ROWS else ''}", path))
    return said


def _shorthand(message: dict) -> dict:
    """A message's tool calls as `{name, arguments}` (few_shot's form), whichever form the file wrote them in."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [c.get("function", c) if isinstance(c, dict) else c for c in calls]}


def _exchange_fault(messages, tool_names: list[str], message_fault) -> str | None:
    """What is wrong with one exchange of the file, or None."""
    if not isinstance(messages, list) or not messages:
        return 'is not {"messages": [chat messages]}'
    for i, message in enumerate(messages):
        fault = message_fault(_shorthand(message) if isinstance(message, dict) else message)
        if fault:
            return f"message {i} {fault}"
    if not any(m["role"] == "assistant" for m in messages):
        return "has no assistant turn: nothing to learn from"
    called = {c["name"] for m in messages for c in _shorthand(m).get("tool_calls") or []}
    unknown = sorted(called - set(tool_names))
    if unknown:
        return f"calls {', '.join(unknown)}, which the recipe's tools do not hold ({', '.join(tool_names) or 'none'})"
    return None


def _refused(key: str = KEY, message: str = "", problems: list[Problem] | None = None):
    from grpokit.errors import RecipeError

    return RecipeError(problems or [Problem(key, message)])


class NotAPrefix(ValueError):
    """A chat template that renders a conversation's start differently from its whole: no turn's tokens can be found."""


def tokens_and_labels(tokenizer, messages: list[dict], tools: list | None) -> tuple[list[int], list[int]]:
    """The exchange's tokens as the chat template renders it, and its assistant mask: 1 on the assistant turns' own
    tokens (their role header excluded, their end marker included), 0 elsewhere. Each turn's span is the difference
    between renderings of the conversation up to it, which must extend one another (checked): TRL's own
    `assistant_only_loss` needs `{% generation %}` markers the recipe's template (e.g. TRL's qwen2_5) lacks."""
    def render(upto: int, prompt: bool) -> list[int]:
        return tokenizer.apply_chat_template(messages[:upto], tools=tools, tokenize=True, return_dict=False,
                                             add_generation_prompt=prompt)

    ids = render(len(messages), False)
    mask = [0] * len(ids)
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start, end = len(render(k, True)), len(render(k + 1, False))
        if ids[:end] != render(k + 1, False):
            raise NotAPrefix("the chat template renders a conversation's start differently from its whole: the "
                             "assistant turns' tokens cannot be found")
        mask[start:end] = [1] * (end - start)
    return ids, mask


def overlap(worked: Worked, questions: set[str]) -> list[str]:
    """The problems of the exchanges (each one's last user turn: few-shot turns before it are every prompt's) that are
    training or held-out questions (`questions`)."""
    asked = [next((m["content"] for m in reversed(ex) if m["role"] == "user"), None) for ex in worked.exchanges]
    return [q for q in asked if q in questions]


def prepare(recipe, tokenizer, toolset, dataset) -> Worked:
    """The recipe's worked exchanges, tokenized with its chat template and tools; `RecipeError` for any fault, and for
    an exchange whose user turn is a training prompt's (`dataset`, the prepared training rows) or a held-out question."""
    from grpokit.tools import tooluse

    section, names = recipe.warm_start, toolset.tool_names() if toolset else []
    if section.get("from_task"):
        worked = from_task(section["from_task"], recipe.dataset, names)
    else:
        worked = from_file(section["examples"], recipe.dataset, names)
    hits = overlap(worked, _asked(recipe, dataset))
    if hits:
        raise _refused(KEY, f"{len(hits)} of its exchanges ask a training or held-out question, e.g. {hits[0][:80]!r}: "
                       "the warm start would show the model problems it is then trained or scored on")
    tools = tooluse.template_tools(toolset) if toolset else None
    faults = []
    for i, exchange in enumerate(worked.exchanges):
        try:
            worked.rows.append(tokens_and_labels(tokenizer, exchange, tools))
        except Exception as err:  # noqa: BLE001 - the chat template is the user's code: whatever it raises is refused
            # (jinja's "only supports single tool-calls at once" among them), said with the exchange it could not render
            faults.append((worked.lines[i] if worked.lines else i + 1, _template_fault(err)))
    if faults:  # a file's exchanges by their line; those written here by their number
        raise _refused(problems=counted(f"{KEY}.examples", section["examples"], faults) if worked.lines else
                       counted(f"{KEY}.from_task", "", faults, unit="exchange"))
    return worked


def _template_fault(err: Exception) -> str:
    """A chat template's failure on one exchange, as what follows "line N" in its problem."""
    if isinstance(err, NotAPrefix):
        return f": {err} (model.chat_template)"
    said = " ".join(str(err).split())[:200]
    return f": the chat template (model.chat_template) cannot render it ({type(err).__name__}: {said})"


def _asked(recipe, dataset) -> set[str]:
    """The questions training and scoring ask: each training prompt's user turn, and reasoning-gym's held-out ones."""
    asked = set()
    for prompt in (dataset["prompt"] if dataset is not None else []):
        if isinstance(prompt, list):  # its problem: the last user turn
            asked.update([next((m["content"] for m in reversed(prompt) if m.get("role") == "user"), None)])
        else:
            asked.add(prompt)
    source = recipe.dataset.get("reasoning_gym")
    if source:
        from grpokit.prompts import tasks

        asked.update(row["prompt"] for row in tasks.generate(source).rows)
        asked.update(row["prompt"] for row in tasks.generate(source, heldout=True).rows)
    return asked
