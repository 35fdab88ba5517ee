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


# tag_count: a quarter for each of the four tags that occurs exactly once (open-r1's partial credit),
# with no newline required around a tag. (completion, expected)
TAG_COUNT = [
    ("<think>\nr\n</think>\n<answer>\n4\n</answer>", 1.0),  # open-r1's layout
    ("<think>r</think><answer>4</answer>", 1.0),  # the same tags on one line (open-r1: 0.0)
    ("<think>r</think> 4", 0.5),  # no answer tags
    ("<think>r</think><think>s</think><answer>4</answer>", 0.5),  # think tags twice: no credit for them
    ("<answer>4</answer>", 0.5),
    ("plain", 0.0),
    ("", 0.0),
]


@pytest.mark.parametrize("completion, expected", TAG_COUNT)
def test_tag_count(completion, expected):
    from rewards.format import TagCount

    assert TagCount()(completions=[completion]) == [expected]
    assert TagCount()(completions=[conv(completion)]) == [expected]


def test_tag_count_tags_are_configurable():
    from rewards.format import TagCount

    # The chat template opens <think> in the prompt: only three tags are the completion's to write.
    reward = TagCount(tags=["</think>", "<answer>", "</answer>"])
    assert reward(completions=["r</think><answer>4</answer>", "r</think> 4"]) == [1.0, 1 / 3]


@pytest.mark.parametrize("args", [{"tags": []}, {"tags": ["<a>", ""]}, {"tags": "<think>"}, {"tags": ["<a>", "<a>"]}])
def test_tag_count_bad_args(args):
    import rewards

    with pytest.raises(rewards.RewardError, match="tags"):
        rewards.build("tag_count", **args)


# reasoning_steps: min(1, markers / min_steps), markers being explicit steps. (completion, expected), min_steps=3
STEPS = [
    ("Step 1: add. Step 2: carry. Step 3: done.", 1.0),  # three "Step N:" markers
    ("1. add\n2. carry\n3. done", 1.0),  # a numbered list, one item per line (open-r1 counts only the first)
    ("First, add. Next, carry. Finally, done.", 1.0),  # ordinal words
    ("- add\n- carry", 2 / 3),  # bullets
    ("* add", 1 / 3),
    ("Step 1: a\nStep 2: b\nStep 3: c\nStep 4: d\nStep 5: e", 1.0),  # capped at 1
    ("just the answer: 42", 0.0),  # no markers
    ("3.5 and 2.5", 0.0),  # a decimal number at a line start is not a list item
    ("", 0.0),
]


@pytest.mark.parametrize("completion, expected", STEPS)
def test_reasoning_steps(completion, expected):
    from rewards.format import ReasoningSteps

    assert ReasoningSteps()(completions=[completion]) == [pytest.approx(expected)]


def test_reasoning_steps_min_steps():
    from rewards.format import ReasoningSteps

    assert ReasoningSteps(min_steps=1)(completions=["Step 1: go"]) == [1.0]
    import rewards

    with pytest.raises(rewards.RewardError, match="min_steps"):
        rewards.build("reasoning_steps", min_steps=0)
