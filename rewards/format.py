"""Format rewards: does the completion have the shape the recipe asks for (reasoning, then an answer)?"""

from __future__ import annotations

import re

from rewards import is_integer, register, text


@register("think_format")
class ThinkFormat:
    """1.0 when the completion is exactly one `<think>...</think>` block followed by a non-empty answer, else 0.0.

    r = 1[ completion = ws <think> T </think> A ws,  "<think>" and "</think>" each occur once,  A.strip() != "" ]

    The thinking T may be empty (a template that switches thinking off still emits the block). With
    `answer_tag=True` the answer A must itself be exactly one non-empty `<answer>...</answer>` with
    nothing after it. With `think_in_prompt=True` the chat template already opened `<think>` in the
    prompt (DeepSeek-R1 distills, Qwen3 thinking), so the completion must start inside the block: it
    holds no `<think>` and exactly one `</think>`.

    Unlike open-r1's `format_reward`, a completion that closes the block and stops (`<think>x</think>`)
    scores 0.0 here: the format exists to carry an answer, and paying for an empty one teaches the
    policy to stop after thinking.

    >>> ThinkFormat()(completions=["<think>2+2=4</think> 4", "4", "<think>a</think><think>b</think> 4"])
    [1.0, 0.0, 0.0]
    >>> ThinkFormat(answer_tag=True)(completions=["<think>.</think>\\n<answer>4</answer>", "<think>.</think> 4"])
    [1.0, 0.0]
    """

    def __init__(self, answer_tag: bool = False, think_in_prompt: bool = False):
        self.answer_tag = bool(answer_tag)
        self.think_in_prompt = bool(think_in_prompt)

    def __call__(self, completions, **kwargs) -> list[float]:
        return [1.0 if self.matches(text(c)) else 0.0 for c in completions]

    def matches(self, s: str) -> bool:
        if self.think_in_prompt:
            s = "<think>" + s
        if s.count("<think>") != 1 or s.count("</think>") != 1:
            return False
        open_at, close_at = s.index("<think>"), s.index("</think>")
        if close_at < open_at or s[:open_at].strip():
            return False
        answer = s[close_at + len("</think>") :].strip()
        if not answer:
            return False
        if not self.answer_tag:
            return True
        if answer.count("<answer>") != 1 or answer.count("</answer>") != 1:
            return False
        if not (answer.startswith("<answer>") and answer.endswith("</answer>")):
            return False
        return bool(answer[len("<answer>") : -len("</answer>")].strip())


@register("tag_count")
class TagCount:
    """Partial format credit: 1/len(tags) for each tag that occurs exactly once (open-r1's `tag_count_reward`).

    r = (1 / K) * sum_k 1[ count(completion, tag_k) = 1 ],  K = len(tags)

    A dense step towards `think_format`: a policy that writes some of the tags is paid for those. The
    default tags are `<think>`, `</think>`, `<answer>`, `</answer>`; when the chat template opens `<think>`
    in the prompt, leave it out (`tags: ["</think>", "<answer>", "</answer>"]`). Unlike open-r1, a tag
    need not sit on its own line (open-r1 counts `"<think>\\n"` and `"\\n</think>\\n"`): line breaks
    around a tag say nothing about the format, and the rule would pay for whitespace. Order is not
    checked; `think_format` checks the whole shape.

    >>> TagCount()(completions=["<think>r</think><answer>4</answer>", "<think>r</think> 4", "4"])
    [1.0, 0.5, 0.0]
    """

    def __init__(self, tags: list[str] = ("<think>", "</think>", "<answer>", "</answer>")):
        if not isinstance(tags, (list, tuple)) or not tags or not all(isinstance(t, str) and t.strip() for t in tags):
            raise ValueError(f"tag_count: tags must be a non-empty list of non-empty strings, got {tags!r}")
        if len(set(tags)) != len(tags):
            raise ValueError(f"tag_count: tags must be distinct, got {list(tags)!r}")
        self.tags = tuple(tags)

    def __call__(self, completions, **kwargs) -> list[float]:
        out = []
        for c in completions:
            s = text(c)
            out.append(sum(1.0 for t in self.tags if s.count(t) == 1) / len(self.tags))
        return out


# An explicit step: "Step 3:", a numbered or bulleted line ("2." / "2)" / "-" / "*" then a space), or an
# ordinal word opening a clause. A decimal like "3.5" at a line start is not a list item (the space).
_STEP_MARKER = re.compile(
    r"\bStep\s+\d+\s*:|^[ \t]*(?:\d+[.)]|[-*\u2022])[ \t]+|\b(?:First|Second|Third|Next|Then|Finally),",
    re.MULTILINE,
)


@register("reasoning_steps")
class ReasoningSteps:
    """Credit for explicit reasoning steps, capped: min(1, markers / min_steps) (open-r1's `reasoning_steps_reward`).

    r = min(1, n / min_steps),  n = number of step markers in the completion

    A marker is `Step N:`, a numbered or bulleted line (`1.`, `2)`, `-`, `*`, then a space), or a clause
    opening with First, / Second, / Third, / Next, / Then, / Finally,. Unlike open-r1, a numbered item
    counts on every line, not only at the very start of the completion (its `^\\d+\\.` has no
    multi-line flag), and a decimal such as `3.5` at a line start is not a list item. Meant as a small
    shaping term next to a correctness reward: on its own it pays for lists, not for reasoning.

    >>> ReasoningSteps()(completions=["Step 1: add.\\nStep 2: carry.\\nStep 3: done.", "1. add\\n2. done", "42"])
    [1.0, 0.6666666666666666, 0.0]
    """

    def __init__(self, min_steps: int = 3):
        if not is_integer(min_steps) or min_steps < 1:
            raise ValueError(f"reasoning_steps: min_steps must be an integer >= 1, got {min_steps!r}")
        self.min_steps = min_steps

    def __call__(self, completions, **kwargs) -> list[float]:
        return [min(1.0, len(_STEP_MARKER.findall(text(c))) / self.min_steps) for c in completions]
