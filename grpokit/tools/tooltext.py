"""What a user's tool hands back, as the model will read it: its result or its exception written as text the
tokenizer takes, cut to size, and its arguments as the model wrote them.

Every function here may run the tool's own code (a `__str__`, a `__repr__`): grpokit.tools.toolguard calls them while the
call's deadline is open, so text that never comes is cut with the call, and one that raises is the call's failure.
What leaves here is plain `str`, a list of content blocks, or copies of JSON values: nothing of the tool's runs when
TRL or the report reads them later.
"""

from __future__ import annotations

from grpokit.untrusted.keeper import valid_text


def as_text(value) -> str:
    """`str(value)` as the tokenizer can take it (the cage's rule, grpokit.untrusted.keeper.valid_text)."""
    return valid_text(str(value))


def as_result(result):
    """A result as TRL writes it for the model, made inside the call's time: text, or for content blocks (a list)
    each block's text (`{"type": "text", "text": ...}`; a part that is not a block becomes a text block)."""
    if not isinstance(result, list):
        return as_text(result)
    blocks = []
    for part in result:
        if isinstance(part, dict) and part.get("type", "text") != "text":
            blocks.append(part)  # an image or another block TRL takes as it is
        else:
            blocks.append({"type": "text", "text": as_text(part.get("text", "") if isinstance(part, dict) else part)})
    return blocks


def text_size(result) -> int:
    """Characters of a result as `as_result` made it: its text, or the text of each block."""
    if isinstance(result, list):
        return sum(len(part.get("text", "")) for part in result)
    return len(result)


def message(err: BaseException, most: int) -> str:
    """What `str(err)` says, cut to `most` characters (a note says how many more there were) and made valid; when it
    raises, a line naming both types instead (what the second exception says is never read: it is the tool's too).

    >>> message(ValueError("x" * 12), 5)
    'xxxxx [7 more characters cut]'
    """
    try:
        text = str(err)
    except Exception as why:  # noqa: BLE001 - an exception whose message raises
        return f"{type(err).__name__} (its message cannot be read: {type(why).__name__})"
    cut = f" [{len(text) - most} more characters cut]" if len(text) > most else ""
    return valid_text(text, most) + cut


def named(err: BaseException, most: int) -> str:
    """`SystemExit: 3`: the exception's type and message (read as `message` reads it), or its type alone.

    >>> named(SystemExit(3), 100), named(KeyboardInterrupt(), 100)
    ('SystemExit: 3', 'KeyboardInterrupt')
    """
    text = message(err, most)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def as_parsed(value):
    """A call's arguments as parsed, for the tool to use: JSON's containers (and the call's tuple) copied, so a tool
    that changes its arguments changes its own copy, never the completion's record of the call; leaves are shared
    (immutable: TRL parsed them from JSON). Only these exact types are copied: a subclass's code never runs here.

    >>> call = {"items": [1, [2]]}
    >>> mine = as_parsed(call); mine["items"][1].append(3); call
    {'items': [1, [2]]}
    """
    if type(value) is dict:
        return {key: as_parsed(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(as_parsed(item) for item in value)
    return value
