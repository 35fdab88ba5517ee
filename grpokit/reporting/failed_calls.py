"""report.md's "Failed tool calls": for each logged step at which tool calls failed, the calls as the model made them
and the error it read back, and -- where the tool's own code raised -- the exception's type, message and line for
the tool's author (grpokit.tools.toolfaults, kept on the trusted side as the call failed).

    from grpokit.reporting.failed_calls import keep_failed_calls, run_failed_calls, failed_calls_section
    keep_failed_calls(trainer, tally.faults)        # before training: each logged step's failed calls are kept
    rows = run_failed_calls(trainer)                 # after: [{"step", "call", "read", "author"}], stored with the run
    lines = failed_calls_section(rows)               # [] for a run whose calls never failed

A step's calls are read from the generation batch TRL keeps (the completions, with a `tool` message per call) when
its log says calls failed (`tools/failure_frequency` > 0); a call failed when TRL wrote `{'error': ...}` for it
(rewards.tools.failed_result) -- a tool that does not exist, a tool that raised, a limit of grpokit's.
"""

from __future__ import annotations

import weakref

from grpokit.reporting.messages import call_text, inline_code

FAILURES = "tools/failure_frequency"
PER_STEP = 2  # distinct failed calls kept a step: the first of each (call name, error read)
MAX_STEPS = 500  # logged steps whose failed calls are kept for the report
SHOWN = 30  # ways calls failed that report.md lists, at most


def failed_calls(completions: list) -> list[dict]:
    """The failed calls of a batch's completions, each {"tool", "call", "read"}: the call as the model made it and the
    result it read, in order.

    >>> failed_calls([[{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
    ...     {"name": "calc", "arguments": {"x": 1}}}]}, {"role": "tool", "name": "calc",
    ...     "content": "{'error': 'Tool calc not found.'}"}]])
    [{'tool': 'calc', 'call': 'calc({"x": 1})', 'read': "{'error': 'Tool calc not found.'}"}]
    """
    from rewards.tools import failed_result

    found = []
    for completion in completions:
        pending: list = []  # the calls of the last assistant turn, answered in order by the tool messages after it
        for message in completion if isinstance(completion, list) else []:
            if not isinstance(message, dict):
                continue
            if message.get("role") == "assistant":
                pending = list(message.get("tool_calls") or [])
            elif message.get("role") == "tool":
                call = pending.pop(0) if pending else None
                if failed_result(message.get("content")):
                    function = call.get("function", call) if isinstance(call, dict) else {}
                    name = function.get("name") if isinstance(function, dict) else None
                    found.append({"tool": str(name or message.get("name") or "?"),
                                  "call": call_text(call) if call is not None else f"{message.get('name', '?')}(?)",
                                  "read": message["content"]})
    return found


def keep_failed_calls(trainer, faults=None):
    """Keep each logged step's failed calls (up to PER_STEP distinct ways, those no earlier step kept first) with what
    their tool's exception tells its author (`faults`: a `toolfaults.Faults`); returns the installed callback."""
    from transformers import TrainerCallback

    from grpokit import trl_compat

    class FailedCalls(TrainerCallback):
        def __init__(self):
            self.rows: list[dict] = []
            self.steps = 0
            self.seen: set = set()  # (tool, read) of every way calls failed that a step kept

        def on_log(self, args, state, control, logs=None, **kwargs):
            failed = (logs or {}).get(FAILURES)
            batch = trl_compat.last_generation_logs(trainer)
            if not isinstance(failed, (int, float)) or failed <= 0 or not batch:
                return
            self.steps += 1
            if self.steps > MAX_STEPS:
                return
            ways: dict = {}  # the step's distinct ways calls failed, each its first call
            for call in failed_calls(list(batch.get("completion", []))):
                ways.setdefault((call["tool"], call["read"]), call)
            # ways no earlier step kept first: a way that comes third at every step is shown once all the same
            fresh = sorted(ways, key=lambda way: way in self.seen)
            kept = [ways[way] for way in fresh[:PER_STEP]]
            self.seen.update(fresh[:PER_STEP])
            for call in kept:
                fault = faults.get(call["tool"], call["read"]) if faults is not None else None
                self.rows.append({"step": state.global_step, "tool": call["tool"], "call": call["call"],
                                  "read": call["read"], "author": fault.text() if fault is not None else None})

    callback = FailedCalls()
    trainer.add_callback(callback)
    _kept[trainer] = callback
    return callback


_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # trainer -> its FailedCalls callback


def run_failed_calls(trainer) -> list[dict]:
    """The failed calls `keep_failed_calls` kept for this trainer's run ([] when it was not installed)."""
    kept = _kept.get(trainer)
    return list(kept.rows) if kept is not None else []


def _steps(steps: list[int]) -> str:
    """`step 3`, `steps 3-5`, `steps 3-5, 9`: consecutive logged steps as ranges."""
    spans: list[list[int]] = []
    for s in steps:
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    shown = ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in spans)
    return ("step " if len(steps) == 1 else "steps ") + shown


def failed_calls_section(rows: list[dict]) -> list[str]:
    """report.md's "Failed tool calls": one line per way calls failed (the tool, the error the model read, what the
    tool's own exception says): the steps it happened at, the first such call, what the model read, and for a tool's
    own exception its type, message and line; at most SHOWN lines. [] when no call failed."""
    if not rows:
        return []
    grouped: dict[tuple, dict] = {}
    for row in rows:
        key = (row.get("tool") or row.get("call"), row.get("read"), row.get("author"))
        seen = grouped.setdefault(key, {"call": row.get("call"), "steps": []})
        if isinstance(row.get("step"), int) and row["step"] not in seen["steps"]:
            seen["steps"].append(row["step"])
    lines = ["", "## Failed tool calls", "",
             "The steps at which tool calls failed, and how: the first such call as the model made it, and what it read "
             "back. Where your tool's own code raised, the exception's type, message and line follow, for you (the "
             "model read only the error).", ""]
    for (_, read, author), seen in list(grouped.items())[:SHOWN]:
        line = f"- {_steps(sorted(seen['steps']))}: {inline_code(seen['call'] or '?')} → the model read {inline_code(read or '')}"
        lines.append(line + (f"; your tool raised {inline_code(author)}" if author else ""))
    if len(grouped) > SHOWN:
        lines.append(f"- … and {len(grouped) - SHOWN} more ways calls failed (each in `report_record.json`, "
                     "`failed_calls`)")
    return lines
