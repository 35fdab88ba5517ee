"""How a prompt or a completion reads in report.md: conversational messages as `role: content` lines, with the tool
calls an assistant turn made and the tool each result came from; and any row value as JSON holds it.

    from grpokit.reporting.messages import text
    text(row["completion"])   # the lines report.md shows

A leaf: imports nothing of grpokit's.
"""

from __future__ import annotations

import json
import math


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


def _call(call) -> str:
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
    calls = [f"→ calls {_call(c)}" for c in message.get("tool_calls") or []]
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
