"""A local model's config.json is data whoever shared the folder wrote (grpokit/planning/proof.py): `--check` proves it
before it is believed -- every size the memory plan reads a whole number within bounds, then the architecture built
by transformers on the meta device within a time bound, then counted by the plan -- and refuses a hostile one in one
line naming the key and the file, exit 2, no traceback, never a hang, never a negative plan. The folders hold
config.json alone (and a weights file where --check asks for one): the proof reads nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpokit import cli
from grpokit.planning.proof import problems
from tests.helpers import recipe_dict, write_recipe

SOUND = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "vocab_size": 104, "max_position_embeddings": 4096, "hidden_act": "silu", "tie_word_embeddings": False}


def folder(tmp_path: Path, **change) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({k: v for k, v in {**SOUND, **change}.items() if v is not ...}))
    return model


def said(found) -> list[str]:
    return [p.format() for p in found]


def test_a_sound_config_is_built_and_passes(tmp_path):
    assert problems(str(folder(tmp_path))) == []


@pytest.mark.parametrize("change, key", [
    ({"num_hidden_layers": 10**9}, "num_hidden_layers"),      # would hang the plan
    ({"hidden_size": -64}, "hidden_size"),                     # would plan negative memory
    ({"num_hidden_layers": 0}, "num_hidden_layers"),           # no layers
    ({"num_attention_heads": 0}, "num_attention_heads"),       # no heads: a division by zero in transformers
    ({"vocab_size": 1e5}, "vocab_size"),                       # a float
    ({"intermediate_size": True}, "intermediate_size"),        # a boolean
    ({"num_key_value_heads": 3}, "num_key_value_heads"),       # does not divide the heads
    ({"head_dim": "16"}, "head_dim"),                          # text
    ({"head_dim": None, "num_attention_heads": 128, "num_key_value_heads": 128}, "num_attention_heads"),  # 0-wide heads
    ({"vocab_size": ...}, "vocab_size"),                       # missing
    ({"model_type": "nosuchmodel"}, "model_type"),             # transformers has no such architecture
    ({"model_type": None}, "model_type"),                      # none named
    ({"hidden_act": "nosuchact"}, "model_type"),               # ranges pass, the build fails
    ({"model_type": "t5"}, "model_type"),                      # an architecture that is no causal LM
])
def test_a_hostile_config_is_refused_in_one_line_naming_key_and_file(tmp_path, change, key):
    model = folder(tmp_path, **change)
    lines = said(problems(str(model)))
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith(f"{model / 'config.json'}: {key}: "), lines


@pytest.mark.parametrize("config, key", [
    ({"model_type": "gpt2", "n_layer": 10**9, "n_embd": 64, "n_head": 4, "vocab_size": 100}, "n_layer"),  # its own name
    ({"model_type": "qwen3_5", "text_config": {**SOUND, "hidden_size": -1}}, "text_config.hidden_size"),  # nested
])
def test_a_size_is_named_as_the_file_writes_it(tmp_path, config, key):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    lines = said(problems(str(model)))
    assert len(lines) == 1 and lines[0].startswith(f"{model / 'config.json'}: {key}: must be a whole number"), lines


@pytest.mark.parametrize("text", ["{cut short", "[1, 2]", "[" * 100_000])
def test_a_config_that_is_not_a_json_object_is_one_line(tmp_path, text):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(text)
    lines = said(problems(str(model)))
    assert len(lines) == 1 and lines[0].startswith(f"{model / 'config.json'}: model.name_or_path: "), lines


def test_a_build_past_its_time_bound_is_refused_not_waited_for(tmp_path, monkeypatch):
    import threading

    from transformers import AutoModelForCausalLM

    release = threading.Event()  # the build never ends until the test has its answer
    monkeypatch.setattr(AutoModelForCausalLM, "from_config", lambda *a, **k: release.wait())
    try:
        lines = said(problems(str(folder(tmp_path)), timeout=0.05))
    finally:
        release.set()
    assert lines == [f"{tmp_path / 'model' / 'config.json'}: model_type: transformers cannot build this config's model "
                     "(building it on the meta device took over 0.05 s)"]


def test_check_refuses_a_hostile_local_model_with_exit_2_and_no_traceback(tmp_path, capsys):
    model = folder(tmp_path, num_hidden_layers=10**9)
    (model / "model.safetensors").write_bytes(b"")  # a folder with weights, as --check asks of a local model
    data = recipe_dict()
    data["model"] = {"name_or_path": str(model)}
    data["trainer"]["output_dir"] = str(tmp_path / "run")
    assert cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{model / 'config.json'}: num_hidden_layers: must be a whole number from 1 to 1,000 (got 1000000000)" in err
    assert "Traceback" not in err


def test_every_shipped_config_passes_the_proof_as_a_local_folder(tmp_path):
    from grpokit.planning.architecture import CONFIG_DIR, shipped_models

    for name in shipped_models():
        model = tmp_path / name.replace("/", "__")
        model.mkdir()
        (model / "config.json").write_bytes((CONFIG_DIR / model.name / "config.json").read_bytes())
        assert problems(str(model)) == [], name
