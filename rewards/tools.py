"""Tool-use rewards: did a multi-turn rollout (a recipe's `tools` section) call its tools?

With tools, TRL passes each completion as the whole exchange: the model's turns and a `tool` message per call
holding the tool's result, or `{'error': ...}` when the call failed (TRL's own wording of a failure, the only
trace of it a reward sees).
"""

from __future__ import annotations

from rewards import is_integer, register

_FAILED = "{'error':"  # how TRL 1.16 writes a failed call's result: str({"error": message})


def failed_result(content) -> bool:
    """Whether a `tool` message's content is a failed call's, as TRL 1.16 writes one (`str({"error": message})`).

    >>> failed_result("{'error': 'Tool calc not found.'}"), failed_result("42"), failed_result(None)
    (True, False, False)
    """
    return isinstance(content, str) and content.startswith(_FAILED)


def failure_text(message: str) -> str:
    """What the model reads for a call whose tool raised with `message`, as TRL 1.16 writes it.

    >>> failure_text("division by zero")
    "{'error': 'division by zero'}"
    """
    return str({"error": message})


def tool_results(completion) -> tuple[int, int]:
    """(tool results, of which failed) in one completion; (0, 0) for plain text.

    >>> tool_results([{"role": "assistant", "content": ""}, {"role": "tool", "content": "42"},
    ...               {"role": "tool", "content": "{'error': 'bad'}"}, {"role": "assistant", "content": "42"}])
    (2, 1)
    """
    if not isinstance(completion, list):
        return 0, 0
    results = [m for m in completion if isinstance(m, dict) and m.get("role") == "tool"]
    failed = sum(1 for m in results if failed_result(m.get("content")))
    return len(results), failed


@register("tool_use")
class ToolUse:
    """1.0 when the rollout made at least `min_calls` tool calls that returned a result (not an error), else 0.0.

    A shaping reward for getting a model to call its tools at all: weight it well below the correctness
    reward, or the policy learns to call tools and ignore what they return. Failed calls count only with
    `count_failed=True`.

    >>> done = [{"role": "assistant", "content": ""}, {"role": "tool", "content": "42"}, {"role": "assistant", "content": "42"}]
    >>> ToolUse()(completions=[done, [{"role": "assistant", "content": "41"}], "text"])
    [1.0, 0.0, 0.0]
    """

    def __init__(self, min_calls: int = 1, count_failed: bool = False):
        if not is_integer(min_calls) or min_calls < 1:
            raise ValueError(f"tool_use: min_calls must be an integer >= 1, got {min_calls!r}")
        self.min_calls = min_calls
        self.count_failed = bool(count_failed)

    def __call__(self, completions, **kwargs) -> list[float]:
        scores = []
        for c in completions:
            results, failed = tool_results(c)
            worked = results if self.count_failed else results - failed
            scores.append(1.0 if worked >= self.min_calls else 0.0)
        return scores
