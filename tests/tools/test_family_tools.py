"""Today's families (Qwen3, Qwen3.5, Gemma 4, SmolLM3, Llama 3.2), each a tiny random instance keeping its layer kinds
with its real TRL chat template (tests/helpers.py FAMILIES): real GRPO steps with the Python tool, the model's calls
written as the template writes them and parsed by TRL's tool loop; the template as TRL's loop needs it; and --check
saying so, or refusing what TRL cannot parse."""

from __future__ import annotations

import json

import pytest

from grpokit import config
from grpokit.tools import tooluse
from grpokit.config import validate
from tests.helpers import FAMILIES, TODAY, completion_reader, family_dir, family_tokenizer, recipe_dict, write_recipe

CODE = "print(6 * 7)"


@pytest.fixture(scope="session")
def families(tmp_path_factory):
    """family -> its tiny instance's folder, built once per test session."""
    root = tmp_path_factory.mktemp("families")
    return {f: family_dir(f, root) for f in TODAY}


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
    data["tools"] = {"environment": "grpokit.tools.environments:PythonTool"}
    data["trainer"].update({"max_completion_length": 256, "max_tool_calling_iterations": 1,
                            "output_dir": str(folder / "run"), "per_device_train_batch_size": 2, "num_generations": 2,
                            "max_steps": 1, "gradient_checkpointing": False, **trainer})
    return data


@pytest.fixture
def scripted(monkeypatch):
    """`scripted(family, model_dir)`: a random model never writes a call, so that family's model class generates a
    script -- every other first turn the call its template writes, every later turn `42` and the end of the turn.
    Generation is the script; the tool loop, the parser, the rewards, the loss and the backward are TRL's own."""
    import torch

    def generate(self, *args, **kwargs):
        prompt_ids = kwargs.get("input_ids", args[0] if args else None)
        tokenizer = generate.tokenizer
        rows = []
        for i in range(prompt_ids.shape[0]):
            text = tokenizer.decode(prompt_ids[i], skip_special_tokens=False)
            first = CODE not in text  # the call is in every later turn's prompt
            script = generate.call if first and i % 2 == 0 else "42" + tokenizer.eos_token
            rows.append(tokenizer(script, add_special_tokens=False)["input_ids"])
        cache = kwargs.get("cache")  # grpokit.trainer.generation keeps it for the next turn: it holds the prompt at most, as a
        assert cache is None or cache.get_seq_length() < prompt_ids.shape[1]  # script computed nothing past it
        width = max(map(len, rows))
        completion = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows], dtype=prompt_ids.dtype)
        return torch.cat([prompt_ids, completion], dim=1)

    def script(family, model_dir):
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(model_dir))]
        monkeypatch.setattr(model_class, "generate", generate)
        generate.tokenizer = family_tokenizer(family)
        generate.call = written_call(generate.tokenizer)
        return generate

    return script


@pytest.mark.slow
@pytest.mark.parametrize("family", TODAY)
def test_a_grpo_step_calls_the_python_tool_as_the_family_writes_it(family, families, tmp_path, monkeypatch, scripted):
    from grpokit.run.build import make_trainer, prepare
    from grpokit.trainer.models import load_model

    completion_reader(tmp_path, monkeypatch)
    recipe = validate(config.load(write_recipe(tmp_path, tool_recipe(tmp_path, family, families[family]))))
    scripted(family, families[family])
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


# ---------------------------------------------------------------------------------------------------------------
# The template as TRL's loop needs it, and --check saying so, before any weights load

# family -> (TRL parses its calls, prefix-preserving, the training template TRL's loop swaps in when it is not)
TEMPLATE_FACTS = {"qwen3": (True, False, "qwen3_training"), "qwen3_5": (True, True, None), "gemma4": (True, True, None),
                  "smollm3": (True, False, "qwen3_training"), "llama3_2": (True, True, None),
                  "qwen2_5": (True, True, None)}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_familys_template_is_one_trls_tool_loop_runs_on(family):
    from grpokit.tools import templates

    tokenizer = family_tokenizer(family)
    assert tooluse.template_problems(tokenizer, {"chat_template": FAMILIES[family][2]}, None) == []
    parsed, keeps, variant = TEMPLATE_FACTS[family]
    assert tooluse.parsed_by_trl(FAMILIES[family][2]) is parsed
    assert templates.training_variant(tokenizer) == (keeps, variant)


def check_output(tmp_path, capsys, family, model_dir, **trainer) -> tuple[int, str, str]:
    from grpokit import cli

    data = tool_recipe(tmp_path, family, model_dir, **trainer)
    (tmp_path / "reader.py").write_text("def seen(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    code = cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_check_names_a_qwen3_template_its_training_variant_and_grpokits_passes(tmp_path, capsys, families, no_weights):
    code, out, _ = check_output(tmp_path, capsys, "qwen3", families["qwen3"])
    assert code == 0
    assert ("template      qwen3 (TRL's, model.chat_template); TRL parses its tool calls: yes; not prefix-preserving: "
            "TRL's tool loop renders with qwen3_training") in out
    assert "thinking      the model writes a thinking block" in out
    assert "grpokit's in the loss pass and generation" in out and "on a tiny Qwen3 " in out
    assert "warning [thinking-room] trainer.max_completion_length: is 256 tokens" in out


def test_check_says_trls_method_runs_on_qwen3_5s_hybrid_cache(tmp_path, capsys, families, no_weights):
    code, out, _ = check_output(tmp_path, capsys, "qwen3_5", families["qwen3_5"], max_completion_length=1024)
    assert code == 0
    assert "template      qwen3_5_think (TRL's, model.chat_template); TRL parses its tool calls: yes; prefix-preserving" in out
    assert "TRL's own passes: layer kinds full_attention, linear_attention: its cache is not plain " \
           "keys and values per token in every layer" in out
    assert "thinking-room" not in out


def test_a_tool_recipe_on_a_template_trl_cannot_parse_is_refused(tmp_path, capsys, families, no_weights):
    """SmolLM3's own template is not one of TRL's: TRL has no parser for the calls written in it. A stand-in of the
    same shape (ChatML, a call as JSON in <tool_call> tags) in the model's folder."""
    import shutil

    own = tmp_path / "smollm3-own"
    shutil.copytree(families["smollm3"], own)
    config_path = own / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    (own / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>\n"
        "{{ c.function | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tokenizer_config.pop("chat_template", None)
    config_path.write_text(json.dumps(tokenizer_config))
    data = tool_recipe(tmp_path, "smollm3", own)
    del data["model"]["chat_template"]
    (tmp_path / "reader.py").write_text("def seen(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    from grpokit import cli

    assert cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"model.name_or_path: the model's own ({own}): TRL cannot parse tool calls written in it" in err
    assert "allowed: TRL's templates whose tool calls it parses: " in err
    for name in ("gemma4", "llama3_2", "qwen3", "qwen3_5_think", "qwen2_5"):
        assert f" {name}," in err or f" {name} " in err or err.rstrip().endswith(name)
    assert "Traceback" not in err


# A hub model's tokenizer is not here at --check (it never downloads); a template the recipe names from TRL's is
# still read (grpokit.tools.templates.stand_in), so what it says of the template holds offline as it does beside the model.
def test_check_of_a_shipped_tool_recipe_reads_its_named_template_without_the_model(capsys, no_weights):
    from helpers import ROOT

    from grpokit import cli

    assert cli.main(["--recipe", str(ROOT / "recipes" / "qwen3-1.7b" / "python_tool.yaml"), "--check"]) == 0
    out = capsys.readouterr().out
    assert ("template      qwen3 (TRL's, model.chat_template); TRL parses its tool calls: yes; not prefix-preserving"
            in out and "TRL's tool loop renders with qwen3_training" in out)


def test_a_hub_tool_recipe_naming_a_template_trl_cannot_parse_is_refused_offline(capsys, no_weights):
    from helpers import ROOT

    from grpokit import cli

    recipe = str(ROOT / "recipes" / "qwen3-1.7b" / "python_tool.yaml")
    assert cli.main(["--recipe", recipe, "model.chat_template=phi3", "--check"]) == 2
    err = capsys.readouterr().err
    assert "model.chat_template: phi3 (TRL's, model.chat_template): cannot render a tool call" in err
    assert "allowed: TRL's templates whose tool calls it parses: " in err and " qwen3," in err
    assert "Traceback" not in err


def test_a_thinking_recipe_too_short_for_its_block_is_linted_without_the_model(capsys, no_weights):
    from helpers import ROOT

    from grpokit import cli

    recipe = str(ROOT / "recipes" / "qwen3-1.7b" / "grpo.yaml")
    assert cli.main(["--recipe", recipe, "trainer.max_completion_length=256", "--check"]) == 0
    assert "warning [thinking-room] trainer.max_completion_length: is 256 tokens" in capsys.readouterr().out
