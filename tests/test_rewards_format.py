"""think_format: one <think> block, then a non-empty answer (optionally in <answer> tags)."""

import pytest

from rewards.format import ThinkFormat


def conv(s):
    return [{"role": "assistant", "content": s}]


# (completion, expected) with default args
PLAIN = [
    ("<think>2+2=4</think>4", 1.0),  # the shape asked for
    ("\n<think>\nstep\n</think>\n\nThe answer is 4.\n", 1.0),  # whitespace around the parts
    ("<think></think> 4", 1.0),  # empty thinking still counts (templates with thinking off emit it)
    ("<think>step</think>", 0.0),  # no answer
    ("<think>step</think>  \n ", 0.0),  # a whitespace-only answer is no answer
    ("4", 0.0),  # no think block
    ("So <think>step</think> 4", 0.0),  # text before the block
    ("<think>a</think><think>b</think> 4", 0.0),  # two blocks
    ("<think>a<think>b</think> 4", 0.0),  # a nested opening tag
    ("</think>a<think> 4", 0.0),  # tags in the wrong order
    ("<think>step 4", 0.0),  # never closed
    ("", 0.0),  # empty completion
]


@pytest.mark.parametrize("completion, expected", PLAIN)
def test_think_format(completion, expected):
    assert ThinkFormat()(completions=[completion]) == [expected]
    assert ThinkFormat()(completions=[conv(completion)]) == [expected]  # conversational format agrees


# (completion, expected) with answer_tag=True
TAGGED = [
    ("<think>s</think>\n<answer>4</answer>", 1.0),  # answer in tags
    ("<think>s</think> 4", 0.0),  # untagged answer
    ("<think>s</think><answer> </answer>", 0.0),  # empty tagged answer
    ("<think>s</think><answer>4</answer> and more", 0.0),  # text after the answer
    ("<think>s</think>so <answer>4</answer>", 0.0),  # text before the answer
    ("<think>s</think><answer>4</answer><answer>5</answer>", 0.0),  # two answers
]


@pytest.mark.parametrize("completion, expected", TAGGED)
def test_think_format_answer_tag(completion, expected):
    assert ThinkFormat(answer_tag=True)(completions=[completion]) == [expected]


# (completion, expected) with think_in_prompt=True: the template opened <think> already
IN_PROMPT = [
    ("step</think> 4", 1.0),  # continues inside the block
    ("<think>step</think> 4", 0.0),  # a second opening tag
    ("step 4", 0.0),  # never closes the block
]


@pytest.mark.parametrize("completion, expected", IN_PROMPT)
def test_think_format_think_in_prompt(completion, expected):
    assert ThinkFormat(think_in_prompt=True)(completions=[completion]) == [expected]


def test_think_format_ignores_extra_kwargs():
    got = ThinkFormat()(prompts=["q"], completions=["<think>a</think> b"], completion_ids=[[1]], answer=["b"], trainer_state=None)
    assert got == [1.0]
