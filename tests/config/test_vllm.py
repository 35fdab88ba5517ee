"""vLLM as the generation engine (trainer.use_vllm), on CPU without vLLM installed: the knobs validated before any
weight loads, the machine checked (installed in TRL's range where CUDA exists, a note without), the TRL source
lines the plan and messages follow, the explain rows, and the memory plan's figures (hand-computed here)."""

from __future__ import annotations

import pytest
from helpers import recipe_dict, write_recipe

from grpokit.cli import main
from grpokit.config import engine, load, validate
from grpokit.errors import RecipeError
from grpokit.planning import memory, vllm_share
from grpokit.planning.architecture import load_model_config
from grpokit import trl_compat

QWEN = "Qwen/Qwen2.5-1.5B-Instruct"


def recipe(tmp_path, model=None, **trainer):
    data = recipe_dict()
    data["trainer"].update(trainer, output_dir=str(tmp_path / "run"))
    if model:
        data["model"].update(model)
    return validate(load(write_recipe(tmp_path, data)))


def problems(tmp_path, model=None, **trainer) -> str:
    with pytest.raises(RecipeError) as err:
        recipe(tmp_path, model, **trainer)
    return str(err.value)


# -- validation -------------------------------------------------------------------------------------------


def test_an_8bit_base_with_vllm_is_refused(tmp_path):
    text = problems(tmp_path, {"quantization": "8bit"}, use_vllm=True)
    assert "model.quantization: cannot be 8bit with trainer.use_vllm" in text and "4bit" in text
    recipe(tmp_path, {"quantization": "4bit"}, use_vllm=True)  # 4-bit goes to vLLM as bitsandbytes
    recipe(tmp_path, {"quantization": "8bit"})  # no vLLM: 8-bit is fine


def test_each_mode_refuses_the_other_modes_knobs(tmp_path):
    text = problems(tmp_path, use_vllm=True, vllm_mode="server", vllm_gpu_memory_utilization=0.5,
                    vllm_enable_sleep_mode=True)
    assert "trainer.vllm_gpu_memory_utilization: applies to vllm_mode colocate only" in text
    assert "--gpu_memory_utilization" in text and "has no sleep mode" in text
    text = problems(tmp_path, use_vllm=True, vllm_server_port=8001)  # colocate is TRL's default mode
    assert "trainer.vllm_server_port: applies to vllm_mode server only" in text
    text = problems(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_base_url="http://h:8000", vllm_server_host="h")
    assert "trainer.vllm_server_host: is ignored when trainer.vllm_server_base_url is given" in text
    recipe(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_host="h", vllm_server_port=8001)
    recipe(tmp_path, use_vllm=False, vllm_server_port=8001)  # vLLM off: a lint (vllm-knobs-off), not an error


def test_tensor_parallel_must_divide_the_processes(tmp_path):
    text = problems(tmp_path, use_vllm=True, vllm_tensor_parallel_size=2)
    assert "trainer.vllm_tensor_parallel_size: must divide the number of processes (1)" in text


# -- the machine --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version, ok", [(None, False), ("0.21.9", False), ("0.22.0", True), ("0.31.0", True),
                                         ("0.31.0+cu129", True), ("0.31.1", False), ("not-a-version", False)])
def test_with_cuda_vllm_must_be_installed_in_trls_range(version, ok):
    found, notes = engine.environment(True, cuda=True, version=version, training=False)
    assert notes == [] and (found == []) == ok
    if not ok:
        assert trl_compat.VLLM_INSTALL in found[0] and "after the weights load" in found[0]


def test_without_cuda_check_notes_and_training_refuses():
    problems_, notes = engine.environment(True, cuda=False, version=None, training=False)
    assert problems_ == [] and "no CUDA GPU here, so vLLM is not checked (vLLM not installed)" in notes[0]
    problems_, notes = engine.environment(True, cuda=False, version="0.31.0", training=True)
    assert "needs a CUDA GPU" in problems_[0] and "trainer.use_vllm: false" in problems_[0]
    assert engine.environment(False, cuda=True, version=None, training=True) == ([], [])


def test_check_exits_2_before_weights_where_cuda_has_no_vllm(tmp_path, monkeypatch, capsys):
    from grpokit.run import build

    monkeypatch.setattr(build, "_cuda", lambda: True)
    monkeypatch.setattr(build, "vllm_version", lambda: None)
    data = recipe_dict()
    data["trainer"].update(use_vllm=True, output_dir=str(tmp_path / "run"))
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "trainer.use_vllm: vLLM is not installed" in err and "pip install -e '.[vllm]'" in err


def test_the_vllm_extra_is_pinned_inside_trls_range():
    import tomllib
    from packaging.version import Version

    from helpers import ROOT

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    assert f"vllm=={trl_compat.VLLM_PIN}" in extra
    lo, hi = map(Version, trl_compat.VLLM_RANGE)
    assert lo <= Version(trl_compat.VLLM_PIN) <= hi


def test_trls_vllm_facts_are_still_in_its_source():
    """The range, the 4096-token budget, sleep level 2, the 4-bit / 8-bit handling, the LoRA merge: read from TRL."""
    assert trl_compat.vllm_internals_problems() == []
    from trl.import_utils import is_vllm_available
    import inspect

    assert "0.22.0" in inspect.getsource(is_vllm_available) and "0.31.0" in inspect.getsource(is_vllm_available)


# -- explain ------------------------------------------------------------------------------------------------


def rows(tmp_path, model=None, lora=True, **trainer) -> dict[str, str]:
    from grpokit.config.trainer_args import grpo_args
    from grpokit.reporting.explain import explain

    r = recipe(tmp_path, model, **trainer)
    return dict(explain(grpo_args(r), rewards=r.rewards, sampling=r.sampling, lora=r.lora if lora else None, model=r.model))


def test_explain_without_vllm_names_transformers(tmp_path):
    t = rows(tmp_path)
    assert t["generation engine"].startswith("transformers generate")
    assert not {"vLLM sleep mode", "weight sync", "vLLM importance sampling"} & t.keys()
    assert rows(tmp_path, use_transformers_continuous_batching=True)["generation engine"].startswith(
        "transformers continuous batching")


def test_explain_vllm_colocate(tmp_path):
    t = rows(tmp_path, use_vllm=True, vllm_gpu_memory_utilization=0.4, vllm_max_model_length=512)
    assert "vLLM, colocated" in t["generation engine"] and "0.4 of the card" in t["generation engine"]
    assert "4096 tokens" in t["generation engine"] and "max_model_len 512" in t["generation engine"]
    assert t["vLLM sleep mode"].startswith("off: vLLM keeps its weights and KV cache")
    assert "LoRA adapter is merged" in t["weight sync"] and "then unmerged" in t["weight sync"]
    assert "every generation here" in t["weight sync"]
    assert "π_θ / π_vLLM per sequence" in t["vLLM importance sampling"]
    assert "masked out of the loss outside [-inf, 3]" in t["vLLM importance sampling"]
    on = rows(tmp_path, use_vllm=True, vllm_enable_sleep_mode=True)
    assert on["vLLM sleep mode"].startswith("on (level 2)")
    full = rows(tmp_path, lora=False, use_vllm=True)
    assert full["weight sync"].split(": ", 1)[1].startswith("every weight is pushed")
    qlora = rows(tmp_path, {"quantization": "4bit"}, use_vllm=True)
    assert "re-quantizes a 4-bit base" in qlora["weight sync"]
    several = rows(tmp_path, use_vllm=True, gradient_accumulation_steps=2, steps_per_generation=1)  # 2 generations per optimizer step
    assert "one generation in 2 here" in several["weight sync"]
    off = rows(tmp_path, use_vllm=True, vllm_importance_sampling_correction=False)
    assert off["vLLM importance sampling"].startswith("off")
    trunc = rows(tmp_path, use_vllm=True, vllm_importance_sampling_mode="token_truncate")
    assert "per token" in trunc["vLLM importance sampling"] and "clipped to" in trunc["vLLM importance sampling"]


def test_explain_vllm_server(tmp_path):
    t = rows(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_host="gpu1")
    assert t["generation engine"] == ("vLLM server at gpu1:8000 (trl vllm-serve on another GPU): prompts go out, "
                                      "completions come back")
    assert "vLLM sleep mode" not in t and "over NCCL to the server" in t["weight sync"]


# -- the plan ----------------------------------------------------------------------------------------------

KNOBS = dict(lora={"r": 16, "target_modules": "all-linear"}, optim="adamw_bnb_8bit", per_device_train_batch_size=8,
             generation_batch_size=64, gradient_accumulation_steps=2, prompt_length=256, max_completion_length=1024)
GIB = 2**30


def colocate(utilization=0.4, sleep=True, max_model_len=1280, model=QWEN, **knobs):
    config, _ = load_model_config(model)
    return vllm_share.plan_colocate(config, utilization=utilization, sleep=sleep, max_model_len=max_model_len,
                                    **{**KNOBS, **knobs})


def test_the_share_by_hand():
    p, v = colocate(), colocate().engine
    config, _ = load_model_config(QWEN)
    assert v.kv_token_bytes == 28 * 2 * 256 * 2  # L x (k, v) x kv_dim x bf16: 28 KiB per token
    assert v.weights == int(memory.weight_bytes(config, "bfloat16")[0])  # vLLM's own full copy
    assert v.bytes == int(0.4 * 16 * GIB)
    free = v.bytes - v.weights - v.workspace - vllm_share.NON_TORCH_BYTES
    assert v.capacity_tokens == free // (16 * v.kv_token_bytes) * 16 and v.capacity_tokens % 16 == 0
    assert v.needed_tokens == 64 * 1280 and v.holds_batch
    gen = {c.name: c.bytes for c in p.phases[0].components}
    assert "KV cache" not in gen and "generation workspace" not in gen  # no transformers generate
    assert gen["vLLM weights"] + gen["vLLM workspace"] + gen["vLLM KV cache"] == v.bytes  # the share, whole


def test_min_utilization_is_the_threshold():
    v = colocate().engine
    assert colocate(utilization=v.min_utilization).engine.holds_batch
    assert not colocate(utilization=round(v.min_utilization - 0.01, 2)).engine.holds_batch


def test_training_phase_holds_what_vllm_keeps():
    config, _ = load_model_config(QWEN)
    trainer = memory.plan(config, **KNOBS).phases[1].bytes  # the trainer's side, as without vLLM
    asleep, awake = colocate(sleep=True), colocate(sleep=False)
    assert asleep.phases[1].bytes == trainer + vllm_share.NON_TORCH_BYTES
    assert awake.phases[1].bytes == trainer + awake.engine.bytes
    assert asleep.phases[0].bytes == awake.phases[0].bytes  # generation: the whole share is awake either way


def test_a_4bit_base_gives_vllm_a_4bit_copy():
    config, _ = load_model_config("Qwen/Qwen2.5-7B-Instruct")
    v = colocate(model="Qwen/Qwen2.5-7B-Instruct", quantization="4bit", utilization=0.55).engine
    assert v.weights == int(memory.weight_bytes(config, "bfloat16", "4bit")[0])


@pytest.mark.parametrize("utilization, max_model_len, kind", [
    (0.9, 1280, "startup"),  # asks more than is free next to the trainer's weights
    (0.15, 1280, "no-kv"),  # does not cover vLLM's own weights
    (0.25, None, "max-model-len"),  # unset: the model's 32k context must fit the KV cache
    (0.4, 1280, None),
])
def test_why_vllm_would_refuse_to_start(utilization, max_model_len, kind):
    p = colocate(utilization=utilization, max_model_len=max_model_len)
    assert (p.engine.blocker() or (None,))[0] == kind
    assert p.fits == (kind is None)
    if kind:
        assert "vLLM refuses to start" in "\n".join(p.render())


def test_plan_for_reads_the_recipe_and_says_it_is_modelled(tmp_path):
    from grpokit.config.trainer_args import grpo_args

    r = recipe(tmp_path, use_vllm=True, vllm_gpu_memory_utilization=0.4, vllm_max_model_length=1280,
               vllm_enable_sleep_mode=True)
    p = vllm_share.plan_for(grpo_args(r), model={"name_or_path": QWEN}, lora=r.lora, prompt_length=256)
    assert p.engine.utilization == 0.4 and p.engine.sleep and p.engine.max_model_len == 1280
    text = "\n".join(p.render())
    assert "vLLM KV capacity:" in text and "least utilization that does" in text
    assert "modelled from TRL's and vLLM's code, not measured" in text
    server = recipe(tmp_path, use_vllm=True, vllm_mode="server")
    s = vllm_share.plan_for(grpo_args(server), model={"name_or_path": QWEN}, lora=server.lora)
    assert s.engine is None and "server's GPU" in "\n".join(s.render())


@pytest.mark.parametrize("model", ["qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"])
def test_each_vllm_recipe_prints_share_capacity_and_verdict(model, capsys):
    from helpers import ROOT

    path = ROOT / "recipes" / model / "dapo-vllm.yaml"
    assert main(["--recipe", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "vLLM colocate: utilization" in out and "vLLM KV capacity:" in out and "holds one generation batch" in out
    peak = next(line for line in out.splitlines() if line.startswith("  peak "))
    assert "-> fits" in peak
    planned = peak.split()[1]  # the recipe's header states the planned peak --check prints
    assert f"Planned peak {float(planned):.1f} GiB" in path.read_text().replace("\n#", "")


@pytest.mark.slow
def test_gpu_generation_dry_run(tmp_path):
    """bench/gpu_generation.py --dry-run: the CPU-possible path (tiny shape, transformers engines run, vLLM's are
    planned and recorded as skipped where vLLM is absent), results written."""
    import json
    import subprocess
    import sys

    from helpers import ROOT

    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_generation.py"), "--dry-run", "--engines",
                           "hf,vllm-sleep", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(next(tmp_path.glob("gpu_generation-*-dry-run.json")).read_text())
    hf, vllm = results["engines"]
    assert hf["status"] == "ok" and hf["measured"]["completion_tokens_per_s"] > 0 and hf["plan"]["peak_gib"] > 0
    assert vllm["plan"]["kv_capacity_tokens"] > 0
    assert vllm["status"] == "ok" or vllm["status"].startswith("skipped: vLLM is not importable")
