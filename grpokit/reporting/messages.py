"""How a prompt or a completion reads in report.md: conversational messages as `role: content` lines, with the tool
calls an assistant turn made and the tool each result came from; and any row value as JSON holds it.

    from grpokit.reporting.messages import text
    text(row["completion"])   # the lines report.md shows

A leaf: imports nothing of grpokit's.
"""

from __future__ import annotations

import json
import math
import re


def plain(value):
    """A completion row's value as JSON holds it: chat messages and numbers as they are, a non-finite number as
    None, anything else (a numpy array, a tensor) as plain lists and numbers."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def call_text(call) -> str:
    """One tool call as the model made it: `add({"a": 20, "b": 22})`; TRL's `{type, function: {name, arguments}}` or a
    bare `{name, arguments}` (arguments as a dict or the JSON text a parser left)."""
    if not isinstance(call, dict):
        return str(call)
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False, default=str)
    return f"{function.get('name', '?')}({arguments})"


def _content(content) -> str:
    """A message's content as text: content blocks (a multimodal tool result) give their text parts."""
    if isinstance(content, list):
        return " ".join(str(b.get("text", f"[{b.get('type', '?')}]")) if isinstance(b, dict) else str(b) for b in content)
    return "" if content is None else str(content)


def _message(message: dict, alone: bool = False) -> str:
    """`role: content`, with the tool calls an assistant turn made (an empty turn but for them reads as the call) and
    the tool a result came from; `alone`: the only message, shown without its role."""
    role = message.get("role") or "?"
    if role == "tool" and message.get("name"):
        role = f"tool {message['name']}"
    text = _content(message.get("content"))
    calls = [f"→ calls {call_text(c)}" for c in message.get("tool_calls") or []]
    body = "\n".join(([text] if text else []) + calls)
    return body if alone else f"{role}: {body}"


def text(value) -> str:
    """A prompt or completion as plain text: conversational messages become `role: content` lines, with the tool
    calls an assistant turn made and the tool each result came from.

    >>> print(text([{"role": "assistant", "content": "", "tool_calls": [{"type": "function",
    ...              "function": {"name": "add", "arguments": {"a": 1}}}]}, {"role": "tool", "name": "add", "content": "1"}]))
    assistant: → calls add({"a": 1})
    tool add: 1
    """
    value = plain(value)  # numpy arrays from parquet, nested too
    if isinstance(value, dict) and ("content" in value or "tool_calls" in value):
        value = [value]
    if isinstance(value, list) and value and all(isinstance(m, dict) and ("content" in m or "tool_calls" in m) for m in value):
        return "\n".join(_message(m, alone=len(value) == 1 and not m.get("tool_calls")) for m in value)
    return str(value)


# Characters a terminal or a viewer acts on rather than shows: C0 controls but tab and newline, DEL, C1 controls
# (8-bit CSI and NEL among them), the bidirectional overrides and isolates that reorder what is shown, and the
# Unicode line and paragraph separators some viewers break lines at.
_ACTING = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
INLINE_LIMIT = 300  # characters of a value shown in a line of report.md (inline code, a table cell)


def visible(text: str) -> str:
    """Text as report.md shows it: every character that acts instead of showing, as its escape (tab and newline
    stay).

    >>> visible("then " + chr(27) + "[2J" + chr(0x202E)) == "then " + chr(92) + "x1b[2J" + chr(92) + "u202e"
    True
    """
    return _ACTING.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                       text)


def _cut(value, limit: int | None) -> str:
    """`value` as text, cut to `limit` characters with how many more it had (the report is a glance, not a dump)."""
    value = value if isinstance(value, str) else str(value)
    return value if limit is None or len(value) <= limit else value[:limit] + f"… [{len(value) - limit} more characters]"


def _in_ticks(shown: str) -> str:
    """One-line text as inline code, its backtick fence longer than any run of backticks inside."""
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", shown)), default=0) + 1)
    return f"{ticks} {shown} {ticks}" if "`" in shown else f"{ticks}{shown}{ticks}"


def one_line(value, limit: int | None = INLINE_LIMIT) -> str:
    """Text that stays on its line of report.md: cut to `limit`, acting characters and every line break escaped,
    so it can neither end the line it is in nor start a heading, a list or a fence on the next.

    >>> print(one_line("a" + chr(10) + "# b"))
    a\\n# b
    """
    return visible(_cut(value, limit)).replace("\n", "\\n")


def inline_code(value, limit: int = INLINE_LIMIT) -> str:
    """Text in a line of report.md as inline code (`one_line`): whatever backticks, newlines or acting characters
    it holds, it stays inside its span.

    >>> inline_code("a`b"), inline_code("x" * 5, limit=3)
    ('`` a`b ``', '`xxx… [2 more characters]`')
    """
    return _in_ticks(one_line(value, limit))


def cell(value, limit: int = INLINE_LIMIT) -> str:
    """Text in a cell of a report.md table, as inline code (`inline_code`) whose pipes are escaped: GitHub's tables
    split a row at every unescaped `|`, inside code spans too, and a backslash of the text's own just before a pipe
    would escape the escape, so it shows as `\\x5c`.

    >>> print(cell("a|b"))
    `a\\|b`
    """
    shown = re.sub(r"\\+(?=\|)", lambda m: "\\x5c" * len(m.group()), inline_code(value, limit))
    return shown.replace("|", "\\|")


def fenced(value, limit: int | None = None) -> str:
    """Text as a fenced block of report.md, cut to `limit` characters: acting characters escaped (`visible`) and a
    fence longer than any run of backticks inside, so the text can neither close it nor act on the reader's terminal.

    >>> print(fenced("a" + chr(10) + "```"))
    ````text
    a
    ```
    ````
    """
    shown = visible(_cut(value, limit))
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", shown)), default=0) + 1)
    return f"{fence}text\n{shown}\n{fence}"


def number(value) -> str:
    """A figure as report.md shows it: whole numbers plainly, others to 4 significant digits, a missing or non-finite
    one as a dash.

    >>> number(3.0), number(0.123456), number(None)
    ('3', '0.1235', '—')
    """
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e6:
        return f"{value:g}"
    return f"{value:.4g}"
