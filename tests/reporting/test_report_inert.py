"""report.md shows the model's and the tools' text, never executes it (grpokit/reporting/report.py): control
characters appear as visible escapes (an ESC or BEL from a tool's output would clear or retitle the terminal of
whoever runs `cat report.md`), bidirectional overrides too, and the text stays inside a fence it cannot close. Each
context outside text lands in has one function (grpokit/reporting/messages.py: `inline_code`, `cell`, `fenced`), each
tested with one hostile corpus."""

from __future__ import annotations

import json
import re

import pytest

from grpokit.reporting.report import write_report

HOSTILE = [
    "\x1b]0;pwned\x07\x1b[2J\x1b[31mred",         # retitle the terminal, clear it, colour it
    "tool python: \x08\x08\x08\x7fgone\x9b2J",       # backspaces, DEL, an 8-bit CSI
    "abc\u202egnp.exe",                              # a right-to-left override that reorders what is shown
    "```\n</details><script>alert(1)</script>\n```",  # close the fence, then raw HTML
]


def written(tmp_path, completion: str) -> str:
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "loss": 0.1}],
                                                             "global_step": 1, "max_steps": 1}))
    rows = [{"prompt": "q", "completion": completion, "rewards": {"r": 1.0}, "advantage": 0.0, "step": 1}]
    return write_report(tmp_path, recipe_name="t", completions=rows, plots=[]).read_text()


@pytest.mark.parametrize("text", HOSTILE, ids=["escape sequences", "erasing", "bidi override", "fence and html"])
def test_what_the_model_or_a_tool_wrote_is_shown_not_run(tmp_path, text):
    report = written(tmp_path, text)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", report), repr(report)
    fences = [line for line in report.splitlines() if re.fullmatch(r"`{3,}(text)?", line)]
    assert len(fences) % 2 == 0  # every fence opened is closed by the report's own, not by the text
    if "\x1b" in text:
        assert "\\x1b]0;pwned\\x07\\x1b[2J" in report  # shown, as escapes a reader can see
    if "\u202e" in text:
        assert "abc\\u202egnp.exe" in report


# One corpus for every context report.md puts outside text in: each entry tries to leave its place.
CORPUS = [
    "line one\n# a heading\n```\nan open fence",                # a newline that writes a heading and opens a fence
    "crlf\r\n## heading\rcr alone",                              # carriage returns, alone and before a newline
    "a\u2028line separator\u2029paragraph separator\x85next line",  # Unicode's own line breaks
    "````` five backticks `` and ` one",                          # runs of backticks longer than any fence
    "col | umn || and a backslash \\| before a pipe",             # pipes that split a table row
    "<details><script>alert(1)</script>",                         # raw HTML
    "- a list\n> a quote\n| a | table |\n---",                    # block starts on later lines
    "\x1b[2J\x07\u202eright to left",                             # acting characters
    "x" * 100_000,                                                # very long text
    "",                                                           # nothing at all
]
LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


def _longest_ticks(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)


@pytest.mark.parametrize("text", CORPUS)
def test_inline_text_stays_in_its_span_on_its_line(text):
    from grpokit.reporting.messages import INLINE_LIMIT, inline_code

    shown = inline_code(text)
    assert not LINE_BREAKS.search(shown) and not re.search(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", shown)
    ticks = re.match(r"`+", shown).group()
    assert shown.endswith(ticks) and _longest_ticks(shown[len(ticks):-len(ticks)]) < len(ticks)
    assert len(shown) < 8 * INLINE_LIMIT


@pytest.mark.parametrize("text", CORPUS)
def test_a_table_cell_keeps_its_row_whole(text):
    from grpokit.reporting.messages import INLINE_LIMIT, cell

    row = f"| {cell(text)} | next |"
    assert not LINE_BREAKS.search(row) and len(row) < 8 * INLINE_LIMIT
    # GitHub's rule: a row splits at every pipe not escaped by a backslash (a backslash escapes the next character)
    splits = re.findall(r"(?:\\.|[^|\\])*\|", row[1:])
    assert len(splits) == 2, row


@pytest.mark.parametrize("text", CORPUS)
def test_a_fenced_block_is_closed_only_by_its_own_fence(text):
    from grpokit.reporting.messages import fenced

    lines = fenced(text, limit=400).split("\n")
    fence = lines[0].removesuffix("text")
    assert set(fence) == {"`"} and len(fence) >= 3 and lines[-1] == fence
    inside = "\n".join(lines[1:-1])
    assert _longest_ticks(inside) < len(fence) and len(inside) < 8 * 400
    assert not re.search(r"[\r\x0b\x0c\x85\u2028\u2029\x00-\x08\x7f-\x9f\u202a-\u202e]", inside)


@pytest.mark.parametrize("text", CORPUS)
def test_a_failed_calls_message_stays_on_its_line(text):
    from grpokit.reporting.failed_calls import failed_calls_section

    rows = [{"step": 1, "tool": "t", "call": f"t({text!s})", "read": text, "author": f"ValueError: {text}"}]
    lines = failed_calls_section(rows)
    assert "\n".join(lines).split("\n") == lines  # each of the section's lines is one line of report.md
    assert not any(LINE_BREAKS.search(line) for line in lines)


@pytest.mark.parametrize("text", [t for t in CORPUS if t and len(t) < 1000])
def test_the_whole_report_keeps_its_own_structure(tmp_path, text):
    """A tool's exception, a reward's name and a completion with the corpus in them: every heading of report.md is
    the report's own and every fence it opens is closed."""
    from grpokit.reporting.report import store_record

    history = [{"step": s, "loss": 0.1, "reward": 0.5, "rewards/r/mean": 0.5, f"rewards/{text}/mean": 1.0,
                "tools/call_frequency": 1.0, "tools/failure_frequency": 1.0} for s in (1, 2)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": 2, "max_steps": 2}))
    calls = [{"step": 1, "tool": "t", "call": f"t({text})", "read": f"{{'error': {text!r}}}", "author": f"E: {text}"}]
    rows = [{"prompt": text, "completion": text, "rewards": {"r": 1.0}, "advantage": 0.0, "step": 1}]
    store_record(tmp_path, rows, failed_calls=calls, recipe_name="t")
    report = write_report(tmp_path, recipe_name="t", plots=[]).read_text()
    own = {"# GRPO run report: t", "## Recipe", "## Final figures", "## What the curves say", "## Tool use",
           "## Failed tool calls", "## Curves", "## Sampled completions", "### Sampled: step 1 (1 completions, 1 distinct)",
           "#### 1. r 1 · advantage +0.000"}
    inside, heads = None, []
    for line in report.splitlines():
        fence = re.fullmatch(r"(`{3,})(text)?", line)
        if fence and (inside is None or fence.group(1) == inside):
            inside = fence.group(1) if inside is None else None
        elif inside is None and line.startswith("#"):
            heads.append(line)
    assert inside is None and set(heads) <= own, heads
