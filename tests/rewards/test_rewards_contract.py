"""Every built-in reward honours TRL's contract: keyword call, both completion formats, extra kwargs
ignored, one float or None per completion, pickles, documented with a working example."""

import doctest
import importlib
import pickle

import pytest

import rewards

# Each built-in with the smallest args it needs (what a recipe's `args:` would hold).
BUILTINS = {
    "accuracy": {},
    "think_format": {"answer_tag": True},
    "overlong_penalty": {"max_length": 8, "buffer": 4},
    "cosine_scaled": {"max_length": 8},
    "repetition_penalty": {"ngram_size": 2},
    "reasoning_accuracy": {},
    "tag_count": {},
    "reasoning_steps": {},
    "len_reward": {},
}
MODULES = ["rewards", "rewards._machinery.user", "rewards.math", "rewards.format", "rewards.length",
           "rewards.repetition"]

TEXTS = [
    "<think>1+1</think><answer>\\boxed{2}</answer>",  # right, well formed
    "<think>x</think> 3 3 3 3",  # wrong, loops
    "",  # empty
    "\\boxed{\\frac{1}{2}}",  # LaTeX answer
]


def batch(conversational: bool) -> dict:
    completions = [[{"role": "assistant", "content": t}] if conversational else t for t in TEXTS]
    return dict(
        prompts=["q"] * len(TEXTS),
        completions=completions,
        completion_ids=[list(range(n)) for n in (3, 6, 0, 12)],
        answer=["2", "#### 3", "7", "0.5"],
        trainer_state=None,
        log_extra=None,
        log_metric=None,
        some_other_column=[1, 2, 3, 4],  # a dataset column the reward does not use
    )


@pytest.mark.parametrize("name", BUILTINS)
def test_contract(name):
    reward = rewards.build(name, **BUILTINS[name])
    plain = reward(**batch(conversational=False))
    assert len(plain) == len(TEXTS)
    assert all(v is None or isinstance(v, float) for v in plain)
    assert reward(**batch(conversational=True)) == plain  # same verdict in both formats
    clone = pickle.loads(pickle.dumps(reward))  # TRL and accelerate may copy rewards across processes
    assert clone(**batch(conversational=False)) == plain
    assert clone.__name__ == name  # the name TRL logs as rewards/<name>/mean


def test_registry_lists_every_builtin_with_a_summary():
    rows = {r["name"]: r for r in rewards.describe()}
    for name in BUILTINS:
        assert rows[name]["summary"], name
        assert ">>>" in rewards.entry(name).doc, f"{name} has no example in its docstring"


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0


def test_user_reward_file_runs_once_per_version(tmp_path):
    # Validation, --check and training each resolve the name; the user's file runs once unless it changed.
    runs = tmp_path / "runs.txt"
    src = tmp_path / "mine.py"
    body = "open({runs!r}, 'a').write('x')\ndef mine(completions, **kw):\n    return [{v}] * len(completions)\n"
    src.write_text(body.format(runs=str(runs), v="1.0"))
    first = rewards.resolve(f"{src}:mine").target
    assert rewards.resolve(f"{src}:mine").target is first
    assert runs.read_text() == "x"
    src.write_text(body.format(runs=str(runs), v="0.25"))  # edited (size changes): loaded afresh
    assert rewards.resolve(f"{src}:mine").target(completions=["a"]) == [0.25]
    assert runs.read_text() == "xx"
