"""Today's families (Qwen3, Qwen3.5, Gemma 4, SmolLM3, Llama 3.2), each a tiny random instance keeping its layer kinds
with its real TRL chat template (tests/helpers.py FAMILIES): real GRPO steps with the Python tool, the model's calls
written as the template writes them and parsed by TRL's tool loop; the template as TRL's loop needs it; and --check
saying so, or refusing what TRL cannot parse."""

from __future__ import annotations

import json
import textwrap

import pytest

from grpokit import config, tooluse
from grpokit.config import validate
from tests.helpers import FAMILIES, family_dir, family_tokenizer, recipe_dict, write_recipe

CODE = "print(6 * 7)"


@pytest.fixture(scope="session")
def families(tmp_path_factory):
    """family -> its tiny instance's folder, built once per test session."""
    root = tmp_path_factory.mktemp("families")
    return {f: family_dir(f, root) for f in FAMILIES}


def written_call(tokenizer) -> str:
    """A call of the Python tool as this template writes the model's turn: the rendered exchange past the generation
    prompt, up to and including the token that ends the turn."""
    question = [{"role": "user", "content": "What is 6 * 7?"}]
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": {"code": CODE}}}]}
    prompt = tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template(question + [call], tokenize=False)
    assert whole.startswith(prompt)
    turn = whole[len(prompt):]
    ends = [turn.index(t) + len(t) for t in (tokenizer.eos_token, "<|tool_response>") if t in turn]
    return turn[:min(ends)]


def tool_recipe(folder, family: str, model_dir, **trainer) -> dict:
    data = recipe_dict(rewards=[{"name": "reader.py:seen", "weight": 0.0}])
    data["model"] = {"name_or_path": str(model_dir), "chat_template": FAMILIES[family][2]}
    data["tools"] = {"environment": "grpokit.environments:PythonTool"}
    data["trainer"].update(max_completion_length=256, max_tool_calling_iterations=1, output_dir=str(folder / "run"),
                           per_device_train_batch_size=2, num_generations=2, max_steps=1, gradient_checkpointing=False,
                           **trainer)
    return data


@pytest.fixture
def scripted(monkeypatch):
    """A random model never writes a call: every other first turn is the call its template writes, every later turn
    `42` and the end of the turn (`scripted.family`'s model class; its tokenizer in `scripted.tokenizer`). Generation
    is the script; the tool loop, the parser, the rewards, the loss and the backward are TRL's own."""
    import torch

    def generate(self, *args, **kwargs):
        prompt_ids = kwargs.get("input_ids", args[0] if args else None)
        tokenizer = generate.tokenizer
        rows = []
        for i in range(prompt_ids.shape[0]):
            text = tokenizer.decode(prompt_ids[i], skip_special_tokens=False)
            first = "42" not in text  # the tool's result is in every later turn's prompt
            script = generate.call if first and i % 2 == 0 else "42" + tokenizer.eos_token
            rows.append(tokenizer(script, add_special_tokens=False)["input_ids"])
        cache = kwargs.get("cache")  # grpokit.generation keeps it for the next turn: it holds the prompt at most, as a
        assert cache is None or cache.get_seq_length() < prompt_ids.shape[1]  # script computed nothing past it
        width = max(map(len, rows))
        completion = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows], dtype=prompt_ids.dtype)
        return torch.cat([prompt_ids, completion], dim=1)

    def script(family, model_dir):
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        from grpokit.models import load_tokenizer

        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(model_dir))]
        monkeypatch.setattr(model_class, "generate", generate)
        generate.tokenizer = family_tokenizer(family)
        generate.call = written_call(generate.tokenizer)
        return generate

    return script


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_grpo_step_calls_the_python_tool_as_the_family_writes_it(family, families, tmp_path, monkeypatch, scripted):
    from grpokit.build import make_trainer, prepare
    from grpokit.models import load_model

    (tmp_path / "reader.py").write_text(textwrap.dedent('''
        import json, os

        def seen(completions, **kwargs):
            with open(os.environ["SEEN_COMPLETIONS"], "a") as f:
                for c in completions:
                    f.write(json.dumps(c) + "\\n")
            return [0.0 for _ in completions]
    '''))
    monkeypatch.setenv("SEEN_COMPLETIONS", str(tmp_path / "seen.jsonl"))
    recipe = validate(config.load(write_recipe(tmp_path, tool_recipe(tmp_path, family, families[family]))))
    script = scripted(family, families[family])
    prep = prepare(recipe, mode="train", log=lambda m: None)
    trainer = make_trainer(prep, load_model(prep.model_path, recipe))
    trainer.train()

    rollouts = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    calls = [m["tool_calls"] for r in rollouts for m in r if m.get("tool_calls")]
    # TRL's parser read the call the template writes: the tool's name and its code
    assert calls and all(c[0]["function"] == {"name": "python", "arguments": {"code": CODE}} for c in calls)
    results = [m["content"] for r in rollouts for m in r if m.get("role") == "tool"]
    assert results and all(r.strip() == "42" for r in results)  # the caged interpreter ran it
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] == 0.5 and logged["tools/failure_frequency"] == 0
    assert script.call  # (the script wrote the family's own call)
