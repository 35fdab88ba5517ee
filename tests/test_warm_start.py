"""bench/multi_call.py's warm start: the worked exchanges it trains on, and which of their tokens carry the loss."""

from __future__ import annotations

import pytest

from tests.helpers import load_bench

QUESTION = "Solve the following multiplication: 709 * 132 * 653. Give only the result as your final answer."


@pytest.fixture(scope="module")
def multi_call():
    return load_bench("multi_call")


def test_an_exchange_is_two_calls_that_reach_the_answer(multi_call):
    messages = multi_call.exchange("SYSTEM", QUESTION)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    first, second = (m["tool_calls"][0]["function"] for m in (messages[2], messages[4]))
    assert first == {"name": "multiply", "arguments": {"a": 709, "b": 132}}
    assert second == {"name": "multiply", "arguments": {"a": 709 * 132, "b": 653}}  # reads the first's result
    assert messages[3]["content"] == str(709 * 132) and messages[5]["content"] == str(709 * 132 * 653)
    assert messages[-1]["content"] == "61112964"  # reasoning-gym's own answer to this question


def test_the_loss_falls_on_the_assistant_turns_only(multi_call, tiny_model_dir):
    from grpokit import models, tooluse

    recipe = multi_call.recipe_with([])
    tokenizer = models.load_tokenizer(str(tiny_model_dir), recipe)  # the recipe's qwen2_5 template
    toolset = tooluse.resolve(recipe.tools)
    tools = [tooluse.tool_view(toolset.environment, name) for name in toolset.methods()]
    messages = multi_call.exchange(recipe.dataset["system_prompt"], QUESTION)
    ids, labels = multi_call.tokens_and_labels(tokenizer, messages, tools)
    assert ids == tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)
    trained = tokenizer.decode([i for i, label in zip(ids, labels) if label != -100])
    untrained = tokenizer.decode([i for i, label in zip(ids, labels) if label == -100])
    assert trained.count("<tool_call>") == 2 and '"a": 93588, "b": 653' in trained
    assert trained.rstrip().endswith("61112964<|im_end|>")
    # the tool results are the environment's (GRPO masks them too); the prompt and the role headers are not the model's
    assert "<tool_response>" not in trained and "<tool_response>" in untrained
    assert "93588\n</tool_response>" in untrained and "Solve the following" in untrained
    assert "<|im_start|>assistant" not in trained and untrained.count("<|im_start|>assistant") == 3
    # every labelled token is the token itself (shifted by the model, not here)
    assert all(label in (-100, token) for token, label in zip(ids, labels))
