"""Format rewards: does the completion have the shape the recipe asks for (reasoning, then an answer)?"""

from __future__ import annotations

from rewards import register, text


@register("think_format")
class ThinkFormat:
    """1.0 when the completion is exactly one `<think>...</think>` block followed by a non-empty answer, else 0.0.

    r = 1[ completion = ws <think> T </think> A ws,  "<think>" and "</think>" each occur once,  A.strip() != "" ]

    The thinking T may be empty (a template that switches thinking off still emits the block). With
    `answer_tag=True` the answer A must itself be exactly one non-empty `<answer>...</answer>` with
    nothing after it. With `think_in_prompt=True` the chat template already opened `<think>` in the
    prompt (DeepSeek-R1 distills, Qwen3 thinking), so the completion must start inside the block: it
    holds no `<think>` and exactly one `</think>`.

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
