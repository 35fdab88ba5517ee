"""Every value a user's tool or environment hands TRL is checked where it enters (grpokit/tools/toolguard.py), and every
bound on a call holds whatever the tool does: turning its result into text counts against its time, its own use of
`signal.alarm` cannot disarm the cut, an async tool that blocks its event loop past the limit has its result
dropped. A value no TRL step can take is a failed call the model reads (a tool) or one `run stopped:` line (an
environment's `reset` or `get_reward`), never a traceback.

Written from the classes of value (numbers too large for a float, arrays, tensors, objects whose text raises or never
comes, generators), not from any one case.
"""

from __future__ import annotations

import asyncio
import signal
import threading

import numpy as np
import pytest
import torch

from grpokit.tools.envguard import environment_factory
from grpokit.tools.toolguard import EnvironmentFailure, Limits, ToolLimitError, bounded_function


class Hangs:
    def __str__(self):
        threading.Event().wait(20)  # bounded only so that an unbounded grpokit fails this test, not hangs it
        return "late"


class Raises:
    def __str__(self):
        raise RuntimeError("no text")


def returning(value):
    def tool() -> str:
        """Return the value."""
        return value
    return tool


# --- a tool's result -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [Hangs(), [Hangs()], [{"type": "text", "text": Hangs()}]],
                         ids=["object", "list of objects", "content block"])
def test_turning_a_result_into_text_counts_against_the_calls_time(value):
    with pytest.raises(ToolLimitError, match=r"no result within tools.timeout_seconds \(0.3 s\); the call was stopped"):
        bounded_function(returning(value), Limits(0.3, 1000))()


@pytest.mark.parametrize("value, text", [
    (7, "7"),                                            # an int
    (10 ** 400, "1" + "0" * 400),                        # an int too large for a float: still text
    (float("nan"), "nan"),                               # a float
    (np.arange(3), "[0 1 2]"),                           # an array
    (torch.tensor([1.5]), "tensor([1.5000])"),           # a tensor
    ("caf\udce9", "caf\ufffd"),                          # undecodable bytes as Python escapes them
    (iter([1, 2]).__class__, "<class 'list_iterator'>"),  # a type
])
def test_a_result_reaches_trl_as_text_it_can_tokenize(value, text):
    out = bounded_function(returning(value), Limits(1.0, 10_000))()
    assert out == text and isinstance(out, str)
    out.encode("utf-8")


def test_a_result_whose_text_raises_is_a_failed_call():
    with pytest.raises(RuntimeError, match="no text"):  # TRL writes it for the model and counts a failed call
        bounded_function(returning(Raises()), Limits(1.0, 1000))()


def test_a_generator_is_its_text_not_run():
    out = bounded_function(returning(x for x in range(3)), Limits(1.0, 1000))()
    assert out.startswith("<generator object")


def test_a_tool_that_uses_the_alarm_for_its_own_step_is_still_cut():
    # The common pattern: arm an alarm for a sub-step, disarm it when the step is done -- which cancels any timer the
    # process had armed on the same clock.
    def careful() -> str:
        """Fetch with a 5 s bound of its own."""
        previous = signal.signal(signal.SIGALRM, lambda *_: None)
        signal.alarm(5)
        signal.alarm(0)  # its step finished
        signal.signal(signal.SIGALRM, previous)
        threading.Event().wait(20)
        return "late"

    with pytest.raises(ToolLimitError, match=r"no result within tools.timeout_seconds \(0.3 s\)"):
        bounded_function(careful, Limits(0.3, 1000))()


def test_an_async_tool_that_blocks_its_event_loop_past_the_limit_has_its_result_dropped():
    import time

    async def blocking() -> str:
        """Wait, the wrong way."""
        time.sleep(0.6)  # no await: the event loop cannot cut it
        return "late"

    with pytest.raises(ToolLimitError, match=r"blocked its event loop past tools.timeout_seconds \(0.2 s; 0.6 s without awaiting"):
        asyncio.run(bounded_function(blocking, Limits(0.2, 1000))())


# --- an environment's reset and get_reward -------------------------------------------------------------------------

def environment(reset_value=None, reward=0.5):
    class Box:
        def reset(self, **row):
            return reset_value

        def get_reward(self):
            return reward

        def look(self) -> str:
            """Look."""
            return "a box"

    return environment_factory(Box, {}, Limits(1.0, 1000), ["look"])()


@pytest.mark.parametrize("value, said", [
    (10 ** 400, "an int too large for a float"),
    (np.array([0.5, 0.5]), "a ndarray"),
    (torch.tensor([1.0, 2.0]), "a Tensor"),
    ("0.5", "a str"),
    (Raises(), "a Raises"),
    (iter([1.0]), "a list_iterator"),
    (float("nan"), "NaN"),
])
def test_a_reward_no_trl_step_can_take_stops_the_run_in_one_line(value, said):
    with pytest.raises(EnvironmentFailure, match=rf"environment Box.get_reward returned .*{said}"):
        environment(reward=value).get_reward()


@pytest.mark.parametrize("value, expected", [
    (1, 1.0), (True, 1.0), (np.float32(0.25), 0.25), (torch.tensor(0.75), 0.75), (np.array(0.5), 0.5), (None, None),
])
def test_a_reward_of_any_real_number_is_taken_as_a_float(value, expected):
    got = environment(reward=value).get_reward()
    assert got == expected and (got is None or type(got) is float)


@pytest.mark.parametrize("value", [3, 2.5, b"text", {"a": 1}, [1, 2], [{"no": "type"}]])
def test_a_reset_that_returns_what_trl_cannot_add_to_the_prompt_stops_the_run_in_one_line(value):
    box = environment(reset_value=value)
    with pytest.raises(EnvironmentFailure, match=r"environment Box.reset returned .*; expected text, a list of content "
                                                 r"blocks or None"):
        box.reset(prompt=[{"role": "user", "content": "q"}])


@pytest.mark.parametrize("value, expected", [
    (None, None), ("more", "more"), ("caf\udce9", "caf\ufffd"),
    ([{"type": "text", "text": "more"}], [{"type": "text", "text": "more"}]),
])
def test_a_reset_returns_text_content_blocks_or_nothing(value, expected):
    assert environment(reset_value=value).reset(prompt=[{"role": "user", "content": "q"}]) == expected


# --- a deadline is a fact: the elapsed time is checked, every text a call hands back is read within it ----------------

@pytest.fixture
def cut_signal_unblocked():
    """Whatever a tool did to the cut signal's mask, the next test finds it unblocked (a pending cut is ignored)."""
    from grpokit.tools.toolguard import CUT_SIGNAL

    yield
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {CUT_SIGNAL})


@pytest.mark.parametrize("deafen", ["ignore", "block"])
def test_a_result_that_comes_back_past_the_limit_is_refused_whatever_the_signal_did(deafen, cut_signal_unblocked):
    import time

    from grpokit.tools.toolguard import CUT_SIGNAL

    def deaf() -> str:
        """Return late, with the cut signal ignored or blocked."""
        if deafen == "ignore":
            signal.signal(CUT_SIGNAL, signal.SIG_IGN)
        else:
            signal.pthread_sigmask(signal.SIG_BLOCK, {CUT_SIGNAL})
        time.sleep(0.5)
        return "late"

    with pytest.raises(ToolLimitError, match=r"no result within tools.timeout_seconds \(0.2 s; it came back after "):
        bounded_function(deaf, Limits(0.2, 1000))()


class HangsError(Exception):
    def __str__(self):
        threading.Event().wait(20)  # bounded only so that an unbounded grpokit fails this test, not hangs it
        return "late"


class RaisesError(Exception):
    def __str__(self):
        raise RuntimeError("no text")


class HugeError(Exception):
    def __str__(self):
        return "x" * 10_000_000


def raising(err: BaseException):
    def tool() -> str:
        """Raise."""
        raise err
    return tool


@pytest.mark.parametrize("err, read", [
    (HangsError(), r"no result within tools.timeout_seconds \(0.3 s\)"),     # its text never comes: cut at the deadline
    (RaisesError(), r"RaisesError \(its message cannot be read: RuntimeError\)"),  # its text raises
    (HugeError(), r"^x{1000} \[9999000 more characters cut\]$"),              # 10 MB of text: cut to the limit
], ids=["text that never comes", "text that raises", "10 MB of text"])
def test_an_exceptions_text_is_read_within_the_calls_bounds_and_what_trl_reads_is_plain_text(err, read):
    # What TRL does with a tool's exception: str() it, outside any bound of grpokit's (the model reads that).
    with pytest.raises(Exception) as raised:
        bounded_function(raising(err), Limits(0.3, 1000))()
    assert type(raised.value).__str__ is Exception.__str__  # its text is already read: nothing runs when TRL reads it
    import re

    assert re.search(read, str(raised.value)), str(raised.value)[:200]


@pytest.mark.parametrize("err", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()], ids=type)
def test_a_sync_tools_base_exception_stops_the_run_in_one_line(err):
    with pytest.raises(EnvironmentFailure, match=rf"tool tool \(tools.functions\) raised {type(err).__name__}"):
        bounded_function(raising(err), Limits(1.0, 1000))()


@pytest.mark.parametrize("err", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()], ids=type)
def test_an_async_tools_base_exception_is_a_failed_call_and_the_event_loop_lives_on(err):
    async def quits() -> str:
        """Quit."""
        raise err

    async def trl_calls(tool):  # as TRL 1.16 runs async tools: gathered on its loop, exceptions returned
        return await asyncio.gather(tool(), return_exceptions=True)

    loop = asyncio.new_event_loop()
    try:
        [got] = loop.run_until_complete(trl_calls(bounded_function(quits, Limits(1.0, 1000))))
        assert isinstance(got, Exception) and type(err).__name__ in str(got)  # TRL counts a failed call
        assert loop.run_until_complete(asyncio.sleep(0, "alive")) == "alive"
    finally:
        loop.close()


def test_the_record_of_a_call_is_the_call_as_parsed_not_as_the_tool_left_it():
    def take(items: list, box: dict) -> str:
        """Take."""
        items.append("taken")
        box["seen"] = True
        return "ok"

    arguments = {"items": [1, [2]], "box": {"k": "v"}}  # TRL passes the parsed call's arguments as **kwargs
    bounded_function(take, Limits(1.0, 1000))(**arguments)
    assert arguments == {"items": [1, [2]], "box": {"k": "v"}}
