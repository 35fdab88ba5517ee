"""Multi-turn tool use from a recipe (`tools` section, grpokit/tools/tooluse.py): every malformed environment or tool is one
line at --check before any weights load; the rollout is explained; real GRPOTrainer steps on the tiny model call a tool,
mask its result out of the loss, and score the model's last turn."""

from __future__ import annotations

import copy
import json
import textwrap

import pytest

from grpokit import config
from grpokit.tools import tooluse
from grpokit.config import validate
from grpokit.errors import RecipeError
from tests.helpers import recipe_dict, write_recipe

GOOD_ENV = '''
CALLS = []  # (a, b) of every call any instance ran: what a test reads back


class Calculator:
    """Adds numbers for the model; rewards a rollout that used it."""

    def __init__(self, digits: int = 3):
        self.digits = digits
        self.calls = 0

    def reset(self, **row):
        self.calls = 0

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first number
            b: the second number
        """
        self.calls += 1
        CALLS.append((a, b))
        return a + b

    def get_reward(self) -> float:
        return float(self.calls > 0)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b
'''


def tool_recipe(folder, tools: dict, source: str = GOOD_ENV, **sections) -> dict:
    """The tiny recipe with a `tools` section naming code in `folder/env.py`, TRL's qwen2_5 template (whose tool calls
    TRL parses) and room for a call, its result and an answer."""
    (folder / "env.py").write_text(textwrap.dedent(source))
    data = recipe_dict(**sections)
    data["model"]["chat_template"] = "qwen2_5"
    data["tools"] = tools
    data["trainer"].update(max_completion_length=192, max_tool_calling_iterations=1, output_dir=str(folder / "run"))
    return data


def problems_of(folder, data) -> list[str]:
    with pytest.raises(RecipeError) as err:
        validate(config.load(write_recipe(folder, data)))
    return [f"{p.path}: {p.message}" for p in err.value.problems]


# ---------------------------------------------------------------------------------------------------------------
# Validation, before any weights: one line per fault, all at once


BROKEN = '''
class NoReset:
    def add(self, a: int, b: int) -> int:
        """Add.

        Args:
            a: first
            b: second
        """
        return a + b


class Env:
    def __init__(self, digits: int = 3):
        pass

    def reset(self, **row):
        pass

    def untyped(self, a) -> int:
        """Untyped.

        Args:
            a: a number
        """
        return a

    def get_reward(self, completion) -> float:
        return 0.0


def undocumented(a: int) -> int:
    return a


def half_documented(a: int, b: int) -> int:
    """Add.

    Args:
        a: first
    """
    return a + b
'''


@pytest.mark.parametrize("tools, expected", [
    # no reset: TRL cannot start a rollout
    ({"environment": "env.py:NoReset"}, ["tools.environment: NoReset has no `reset` method"]),
    # an untyped method argument, and get_reward taking an argument TRL never passes
    ({"environment": "env.py:Env"}, ["tools.environment: tool Env.untyped: Argument a is missing a type hint",
                                     "tools.environment: Env.get_reward takes argument(s) completion"]),
    # a constructor argument the class does not take: the nearest name
    ({"environment": "env.py:Env", "environment_args": {"digts": 4}, "functions": []},
     ["tools.environment_args.digts: is not an argument of Env's constructor"]),
    # functions: no docstring, an argument the docstring leaves out, the standard library
    ({"functions": ["env.py:undocumented", "env.py:half_documented", "os:getcwd"]},
     ["tools.functions[0]: tool undocumented: Cannot generate JSON schema for undocumented because it has no docstring",
      "tools.functions[1]: tool half_documented: Cannot generate JSON schema for half_documented because the docstring has "
      "no description for the argument 'b'",
      "tools.functions[2]: tool 'os:getcwd': module 'os' is part of Python's standard library"]),
    # a class where a function goes, and a function where the environment class goes
    ({"environment": "env.py:undocumented", "functions": ["env.py:Env"]},
     ["tools.environment: environment", "'undocumented' is a function; a recipe may name only a class with a `reset`",
      "tools.functions[0]: tool", "'Env' is a class; a recipe may name only a function"]),
    # nothing to call
    ({}, ["tools: names no tool"]),
])
def test_each_malformed_environment_or_tool_is_one_clear_line(tmp_path, no_weights, tools, expected):
    lines = problems_of(tmp_path, tool_recipe(tmp_path, tools, source=BROKEN))
    for part in expected:
        assert any(part in line for line in lines), (part, lines)


def test_a_typo_in_an_environment_argument_gets_the_nearest_name(tmp_path, no_weights):
    with pytest.raises(RecipeError) as err:
        validate(config.load(write_recipe(tmp_path, tool_recipe(tmp_path, {"environment": "env.py:Calculator",
                                                                        "environment_args": {"digts": 4}}))))
    [problem] = err.value.problems
    assert (problem.path, problem.suggestion) == ("tools.environment_args.digts", "digits")


def test_tool_knobs_without_tools_and_template_typos_are_refused(tmp_path, no_weights):
    data = recipe_dict()
    data["model"]["chat_template"] = "qwen25"
    data["trainer"]["max_tool_calling_iterations"] = 2
    with pytest.raises(RecipeError) as err:
        validate(config.load(write_recipe(tmp_path, data)))
    found = {p.path: p for p in err.value.problems}
    assert found["model.chat_template"].suggestion == "qwen2_5"
    assert "has no tools section" in found["trainer.max_tool_calling_iterations"].message


def test_rewards_come_from_the_list_or_from_the_environment(tmp_path, no_weights):
    # get_reward scores each rollout: no rewards section needed
    owned = tool_recipe(tmp_path, {"environment": "env.py:Calculator"}, rewards=None)
    assert validate(config.load(write_recipe(tmp_path, owned))).rewards == []
    # plain functions score nothing by themselves
    lines = problems_of(tmp_path, tool_recipe(tmp_path, {"functions": ["env.py:multiply"]}, rewards=None))
    assert any(line.startswith("rewards: section is required") for line in lines), lines


def test_tool_files_are_found_beside_the_recipe_from_any_folder(tmp_path, monkeypatch, no_weights):
    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator", "functions": ["env.py:multiply"]})
    path = write_recipe(tmp_path, data)
    monkeypatch.chdir("/")
    recipe = validate(config.load(path))
    assert recipe.tools["environment"] == f"{tmp_path.resolve()}/env.py:Calculator"
    toolset = tooluse.resolve(recipe.tools)
    assert toolset.tool_names() == ["multiply", "add"] and toolset.owns_reward


# ---------------------------------------------------------------------------------------------------------------
# The chat template, at --check (the tokenizer loads; no weights)


def test_a_template_that_cannot_render_tool_calls_is_refused_at_check(tmp_path, capsys, no_weights):
    from grpokit import cli

    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator"})
    del data["model"]["chat_template"]  # the tiny model's own template drops tool calls
    assert cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "model.name_or_path: the model's own (builtin:tiny-llama): cannot render a tool call and its result" in err
    assert "allowed: TRL's templates whose tool calls it parses: " in err and " qwen2_5," in err
    assert "set model.chat_template" in err and "Traceback" not in err


def test_check_explains_the_rollout(tmp_path, capsys, no_weights):
    from grpokit import cli

    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator", "environment_args": {"digits": 4},
                                  "functions": ["env.py:multiply"]})
    assert cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 0
    out = capsys.readouterr().out
    assert "# tool use: how a rollout goes" in out
    assert "Calculator(digits=4), one instance per rollout" in out
    assert "tool          multiply(a: int, b: int) -> int (function); returns an int" in out
    assert "tool          Calculator.add(a: int, b: int) -> int (environment method); returns an int" in out
    assert "at most 1 round(s)" in out and "masked out of the loss" in out
    assert "Calculator.get_reward() (x1" in out


def test_smollm2s_own_template_gets_the_trl_template_that_reads_like_it():
    """SmolLM2 writes ChatML, as Qwen2.5 does: TRL's qwen2_5 template renders a plain conversation exactly as SmolLM2's
    own does, and TRL parses its tool calls."""
    from grpokit.trainer.models import load_tokenizer, model_source

    recipe = validate(config.load(str(tooluse_recipe_path())))
    recipe.model.pop("chat_template")
    tokenizer = load_tokenizer(model_source(recipe, convert=False)[0], recipe, offline_only=True)
    assert "qwen2_5" in tooluse.same_format(tokenizer)
    [problem] = tooluse.template_problems(tokenizer, recipe.model, None)
    assert "set model.chat_template: " in problem.message


def tooluse_recipe_path():
    from tests.helpers import ROOT

    return ROOT / "recipes" / "smollm2-135m" / "calculator.yaml"


# ---------------------------------------------------------------------------------------------------------------
# Real GRPOTrainer steps: a tool call parsed and run, its result masked, the model's last turn scored

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 20, "b": 22}}\n</tool_call>'


# The model's own turns are generated for real, but no longer than this: a random model writes to the budget (192+
# tokens a turn, each a forward pass over the whole ~1,500-token prompt: most of a step's time) and no test reads more
# of its text than that it is there.
OWN_TOKENS = 4


@pytest.fixture
def scripted_calls(monkeypatch):
    """The tiny model is random and never writes a tool call: every other first-turn completion is replaced by a call
    (the tokens a model that had learned the format would write), taken in turn from `generate.calls` (CALL unless a
    test sets others); all else it generates itself (TRL's generation config, sampling and end of sequence), at most
    OWN_TOKENS tokens a turn."""
    import torch
    from transformers import LlamaForCausalLM

    real = LlamaForCausalLM.generate

    def generate(self, *args, **kwargs):
        config = kwargs.get("generation_config")
        if config is not None:  # TRL's: a copy (max_new_tokens beside it is deprecated), the trainer keeps its own
            config = kwargs["generation_config"] = copy.deepcopy(config)
            config.max_new_tokens = min(config.max_new_tokens or OWN_TOKENS, OWN_TOKENS)
        else:  # grpokit's --eval passes its knobs as arguments
            kwargs["max_new_tokens"] = min(kwargs.get("max_new_tokens") or OWN_TOKENS, OWN_TOKENS)
        out = real(self, *args, **kwargs)
        prompt_ids = kwargs.get("input_ids", args[0] if args else None)
        if kwargs.get("cache") is not None:  # grpokit.trainer.generation keeps it: a scripted turn is not what it computed
            kwargs["cache"].crop(prompt_ids.shape[1] - kwargs["cache"].get_seq_length())
        tokenizer = generate.tokenizer
        rows = []
        for i, row in enumerate(out):
            prompt = tokenizer.decode(prompt_ids[i], skip_special_tokens=False)
            first_turn = "<tool_response>" not in prompt
            if first_turn and i % 2 == 0:
                call, generate.made = generate.calls[generate.made % len(generate.calls)], generate.made + 1
                ids = tokenizer(call, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            else:
                ids = row[prompt_ids.shape[1]:].tolist()
            rows.append(ids)
        width = max(len(r) for r in rows)
        pad = tokenizer.pad_token_id
        completion = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=out.dtype)
        return torch.cat([prompt_ids, completion], dim=1)

    generate.calls, generate.made = [CALL], 0
    monkeypatch.setattr(LlamaForCausalLM, "generate", generate)
    return generate


@pytest.mark.slow
def test_real_steps_call_the_tool_mask_its_result_and_score_the_last_turn(tmp_path, monkeypatch, scripted_calls):
    import trl

    from grpokit.run import training
    from grpokit.trainer.models import load_tokenizer

    seen = {"masks": [], "completions": []}
    real_loss = trl.GRPOTrainer.compute_loss

    def compute_loss(self, model, inputs, *args, **kwargs):
        seen["masks"].append((inputs["completion_ids"].tolist(), inputs["tool_mask"].tolist()))
        return real_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(trl.GRPOTrainer, "compute_loss", compute_loss)
    reader = tmp_path / "reader.py"
    reader.write_text(textwrap.dedent('''
        import json, os
        from rewards import text

        def last_turn(completions, **kwargs):
            with open(os.environ["SEEN_COMPLETIONS"], "a") as f:
                for c in completions:
                    f.write(json.dumps({"roles": [m.get("role") for m in c], "text": text(c)}) + "\\n")
            return [0.0 for _ in completions]
    '''))
    monkeypatch.setenv("SEEN_COMPLETIONS", str(tmp_path / "seen.jsonl"))
    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator"},
                       rewards=[{"name": "reader.py:last_turn", "weight": 0.0}])
    data["trainer"].update(per_device_train_batch_size=4, num_generations=4, max_steps=2)
    recipe = validate(config.load(write_recipe(tmp_path, data)))
    scripted_calls.tokenizer = load_tokenizer(str(__import__("grpokit.checkpoints.tiny", fromlist=["x"]).ensure_tiny_model()), recipe)
    training.train(recipe)

    import sys
    env = next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str((tmp_path / "env.py").resolve()))
    assert (20, 22) in env.CALLS  # the parsed call ran the environment's method with the model's arguments
    history = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "tools/call_frequency" in h]
    assert steps and all(h["tools/call_frequency"] > 0 for h in steps)
    assert all(h["tools/failure_frequency"] == 0 for h in steps)
    assert any(h.get("rewards/Calculator/mean", 0) > 0 for h in steps)  # get_reward scored the rollouts that called
    tokenizer = scripted_calls.tokenizer
    masked_any = False
    for ids, masks in seen["masks"]:
        for row, mask in zip(ids, masks):
            called = tokenizer.decode(row, skip_special_tokens=False)
            if CALL not in called:
                assert all(m == 1 for m in mask)  # nothing but the model's own tokens
                continue
            result = "".join(tokenizer.decode([t]) for t, m in zip(row, mask) if m == 0)
            trained = "".join(tokenizer.decode([t]) for t, m in zip(row, mask) if m == 1)
            assert "42" in result and "<tool_response>" in result  # the tool's result: never trained on
            assert CALL in trained  # the model's call: trained on
            masked_any = True
    assert masked_any
    seen_rows = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    after_tool = [r for r in seen_rows if "tool" in r["roles"]]
    assert after_tool and all(r["roles"][-1] == "assistant" and "42\n</tool_response>" not in r["text"] for r in after_tool)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Tool use" in report


# ---------------------------------------------------------------------------------------------------------------
# Costs and knobs, at --check


def test_the_plan_counts_the_tool_schemas_and_the_lint_the_rounds(tmp_path, capsys, no_weights):
    from grpokit import cli

    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator"})
    # two rounds of ~150 tokens each (the tiny tokenizer spells the template's wrapping out): they fit 400, tightly
    data["trainer"].update(max_completion_length=400, max_tool_calling_iterations=2)
    data["rewards"].append({"name": "overlong_penalty", "args": {"buffer": 8}})
    assert cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "of tool schemas every prompt carries" in out
    assert "the plan's bound holds for tool use" in out
    assert "warning [tool-budget]" in out and "2 round(s) of tool calls take at least" in out
    assert "warning [overlong-counts-tools]" in out


def test_unbounded_rounds_are_said(tmp_path, capsys, no_weights):
    from grpokit import cli

    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator"})
    del data["trainer"]["max_tool_calling_iterations"]
    assert cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 0
    assert "warning [tool-budget] trainer.max_tool_calling_iterations: is unset" in capsys.readouterr().out


def test_tools_need_chat_format_prompts(tmp_path, capsys, no_weights):
    from grpokit import cli

    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator"})
    data["dataset"]["conversational"] = False
    assert cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    assert "dataset.conversational: is false, and tools need chat-format prompts" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# An environment that makes its own prompts: no dataset

PROMPTING_ENV = GOOD_ENV + '''

class Quiz(Calculator):
    """Asks its own question: reset() returns the text TRL adds to an empty prompt."""

    def reset(self, **row):
        self.calls = 0
        return "What is 20 + 22? Use the add tool."
'''


def test_an_environment_without_a_dataset_needs_max_steps(tmp_path, no_weights):
    data = tool_recipe(tmp_path, {"environment": "env.py:Quiz"}, source=PROMPTING_ENV, dataset=None, rewards=None)
    del data["trainer"]["max_steps"]
    data["trainer"]["eval_strategy"] = "steps"
    lines = problems_of(tmp_path, data)
    assert any(line.startswith("trainer.max_steps: must be set (> 0): the recipe has no dataset") for line in lines), lines
    assert any(line.startswith("trainer.eval_strategy: evaluates on held-out prompts") for line in lines), lines


@pytest.mark.slow
def test_an_environment_that_makes_its_prompts_trains_without_a_dataset(tmp_path, capsys, scripted_calls):
    from grpokit import cli
    from grpokit.trainer.models import load_tokenizer
    from grpokit.checkpoints.tiny import ensure_tiny_model

    data = tool_recipe(tmp_path, {"environment": "env.py:Quiz"}, source=PROMPTING_ENV, dataset=None, rewards=None)
    data["trainer"].update(per_device_train_batch_size=4, num_generations=4, max_steps=1)
    path = write_recipe(tmp_path, data)
    recipe = validate(config.load(path))
    scripted_calls.tokenizer = load_tokenizer(str(ensure_tiny_model()), recipe)
    assert cli.main(["--recipe", str(path), "--check"]) == 0
    assert "the environment's reset() makes each prompt" in capsys.readouterr().out
    assert cli.main(["--recipe", str(path)]) == 0
    history = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"]
    assert history[0]["tools/call_frequency"] > 0 and "rewards/Quiz/mean" in history[0]


# ---------------------------------------------------------------------------------------------------------------
# --eval of a recipe with tools: greedy rollouts through TRL's own loop


@pytest.mark.slow
def test_eval_runs_the_tools_and_reports_their_use(tmp_path, scripted_calls):
    from grpokit.run import evaluate
    from grpokit.trainer.models import load_tokenizer
    from grpokit.checkpoints.tiny import ensure_tiny_model

    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator"}, rewards=None)
    data["dataset"]["eval_path"] = data["dataset"]["path"]
    data["dataset"]["eval_limit"] = 6
    recipe = validate(config.load(write_recipe(tmp_path, data)))
    scripted_calls.tokenizer = load_tokenizer(str(ensure_tiny_model()), recipe)
    result = evaluate.evaluate(recipe, out=str(tmp_path / "eval.json"))
    # every other prompt's first turn is the scripted call: 3 of 6 call the tool, and the environment rewards those
    assert result["tools"]["calls_per_completion"] == pytest.approx(0.5)
    assert result["tools"]["failures_per_call"] == 0
    assert result["pass_reward"] == "Calculator" and result["greedy"]["passed"] == 3
    assert result["examples"][0]["tool_calls"] == 1 and result["examples"][0]["completion"][1]["role"] == "tool"
    assert "tool calls per completion 0.50" in evaluate.summary(result)


def test_eval_samples_rollouts_with_tools(tmp_path, scripted_calls):
    """--eval-samples K on a tool recipe: K sampled rollouts of each prompt through TRL's loop, pass@K over the prompts
    and the calls of every rollout -- how a user sees whether the policy ever samples what training should reinforce."""
    from grpokit.run import evaluate
    from grpokit.trainer.models import load_tokenizer
    from grpokit.checkpoints.tiny import ensure_tiny_model

    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator"}, rewards=None)
    data["dataset"]["eval_path"] = data["dataset"]["path"]
    data["dataset"]["eval_limit"] = 3
    recipe = validate(config.load(write_recipe(tmp_path, data)))
    scripted_calls.tokenizer = load_tokenizer(str(ensure_tiny_model()), recipe)
    result = evaluate.evaluate(recipe, samples=2, out=str(tmp_path / "eval.json"))
    sampled = result["sampled"]
    # a prompt's 2 rollouts are side by side, and every other rollout's first turn is the scripted call: each prompt
    # has one rollout that calls (and the environment rewards it) and one that does not
    assert (sampled["k"], sampled["pass@2"], sampled["mean@2"]) == (2, 1.0, 0.5)
    assert sampled["tools"]["calls_distribution"] == {"0": 0.5, "1": 0.5, "2": 0.0, "3+": 0.0}
    assert sampled["temperature"] == recipe.trainer.get("temperature", 1.0)
    assert "sampled rollouts with 0/1/2/3+ calls 0.50/0.50/0.00/0.00" in evaluate.summary(result)
    # how the greedy rollouts' calls ended: the Calculator keeps no record of its own, so TRL's failed calls tell
    made = round(result["tools"]["calls_per_completion"] * result["prompts"])
    assert f"calls by outcome: {made} ok" in evaluate.summary(result) and made > 0
    # and how the sampled rollouts' calls ended, said apart from the greedy ones
    assert sampled["tools"]["call_outcomes"] == {"ok": 3}
    assert "; sampled calls by outcome: 3 ok" in evaluate.summary(result)


def test_eval_refuses_what_it_cannot_do_with_tools(tmp_path, no_weights):
    from grpokit.run import evaluate

    data = tool_recipe(tmp_path, {"environment": "env.py:Quiz"}, source=PROMPTING_ENV, dataset=None, rewards=None)
    recipe = validate(config.load(write_recipe(tmp_path, data)))
    with pytest.raises(RecipeError) as err:
        evaluate.evaluate(recipe, samples=4, out=str(tmp_path / "eval.json"))
    paths = [p.path for p in err.value.problems]
    assert paths == ["dataset"]  # no held-out data; sampled rollouts with tools are fine (above)


# ---------------------------------------------------------------------------------------------------------------
# Worked examples before the question (dataset.few_shot), the shipped Calculator, the tool_use reward


@pytest.mark.parametrize("shot, fault", [
    ({"role": "bot", "content": "hi"}, "its role 'bot' is not one of system, user, assistant, tool"),
    ({"role": "user", "tool_calls": [{"name": "add"}]}, "has tool_calls, which only an assistant message makes"),
    ({"role": "assistant", "tool_calls": [{"arguments": {}}]}, "its tool_calls must be a list of {name: text"),
    ({"role": "assistant"}, "has neither content nor tool_calls"),
    ({"role": "user", "content": "hi", "tools": []}, "has key(s) tools a chat message does not"),
])
def test_each_malformed_few_shot_message_is_named(tmp_path, no_weights, shot, fault):
    data = recipe_dict()
    data["dataset"]["few_shot"] = [{"role": "user", "content": "fine"}, shot]
    lines = problems_of(tmp_path, data)
    assert any(line.startswith(f"dataset.few_shot[1]: {fault}") for line in lines), lines


def test_few_shot_messages_come_between_the_system_prompt_and_the_question():
    from datasets import Dataset

    from grpokit.prompts.data import format_prompts

    spec = {"prompt_column": "q", "system_prompt": "S", "few_shot": [
        {"role": "user", "content": "2 * 3?"}, {"role": "assistant", "tool_calls": [{"name": "multiply", "arguments": {"a": 2, "b": 3}}]}]}
    [prompt] = format_prompts(Dataset.from_list([{"q": "4 * 5?"}]), spec, conversational=True)["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]
    assert prompt[2]["tool_calls"] == [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 2, "b": 3}}}]
    assert prompt[3]["content"] == "4 * 5?"


def test_the_calculator_computes_exactly_and_refuses_what_its_schema_does_not_allow():
    from grpokit.tools.environments import Calculator

    calc = Calculator(max_digits=6)
    calc.reset(prompt="x", answer="y")
    assert (calc.multiply(7311, 64), calc.add(52450, 272493), calc.subtract(2, 5)) == (467904, 324943, -3)
    with pytest.raises(TypeError, match="multiply takes integers, got str '12'"):
        calc.multiply("12", 3)
    with pytest.raises(ValueError, match="limited to 6 digits"):
        calc.add(10**7, 1)
    assert calc.calls == [("multiply", 7311, 64), ("add", 52450, 272493), ("subtract", 2, 5)]
    calc.reset()
    assert calc.calls == []


@pytest.mark.parametrize("completion, args, expected", [
    ([{"role": "assistant", "content": ""}, {"role": "tool", "content": "42"}, {"role": "assistant", "content": "42"}], {}, 1.0),
    # the call failed: TRL wrote the error as the result
    ([{"role": "assistant", "content": ""}, {"role": "tool", "content": "{'error': 'bad'}"}], {}, 0.0),
    ([{"role": "assistant", "content": ""}, {"role": "tool", "content": "{'error': 'bad'}"}], {"count_failed": True}, 1.0),
    # one call where two are asked for
    ([{"role": "assistant", "content": ""}, {"role": "tool", "content": "42"}], {"min_calls": 2}, 0.0),
    ([{"role": "assistant", "content": "41"}], {}, 0.0),  # answered without a call
    ("41", {}, 0.0),  # plain text: no tools at all
])
def test_tool_use_pays_for_calls_that_returned(completion, args, expected):
    import rewards

    assert rewards.build("tool_use", **args)(completions=[completion]) == [expected]


def test_the_shipped_calculator_recipe_checks_its_tools_offline(no_weights):
    recipe = validate(config.load(str(tooluse_recipe_path())))
    toolset = tooluse.resolve(recipe.tools)
    assert toolset.tool_names() == ["add", "multiply", "subtract"] and not toolset.owns_reward
    assert recipe.model["chat_template"] == "qwen2_5" and recipe.trainer["max_tool_calling_iterations"] == 1


class _Counter:
    """A minimal environment: one tool, nothing kept."""

    def reset(self, **kwargs) -> str | None:
        return None

    def count(self, text: str) -> int:
        """Count the characters of a text.

        Args:
            text: the text to count.
        """
        return len(text)


# Rule: TRL's "environment_factory is experimental" warning speaks to the author of grpokit's GRPOTrainer call, not
# to a recipe's user: grpokit's trainer never shows it, in a run or in a test that builds it, while TRL's own still does.
def test_grpokits_trainer_with_an_environment_never_shows_trls_experimental_warning(tmp_path):
    import warnings

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from grpokit.trainer.generation import PrefixReuseGRPOTrainer
    from grpokit.tools.templates import template_text
    from grpokit.checkpoints.tiny import ensure_tiny_model
    from tests.helpers import TINY_GRPO

    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model())
    tokenizer.chat_template = template_text("qwen2_5")  # one whose tool calls TRL parses
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "count 'abc'"}]}] * 4)

    def reward(completions, **kwargs):
        return [0.0] * len(completions)

    said = {}
    for cls in (GRPOTrainer, PrefixReuseGRPOTrainer):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cls(model=AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype="float32"), reward_funcs=[reward],
                args=GRPOConfig(output_dir=str(tmp_path / cls.__name__), **TINY_GRPO), train_dataset=rows,
                processing_class=tokenizer, environment_factory=_Counter)
        said[cls] = [str(w.message) for w in caught if "'environment_factory'" in str(w.message)]
    assert said[GRPOTrainer] and not said[PrefixReuseGRPOTrainer]
