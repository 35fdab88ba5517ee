"""Memory proven where it runs: the plan of the path that runs, every run measuring itself against it like for like,
`--probe`, and an out-of-memory error that explains itself (grpokit.trainer.watch, grpokit.run.probe)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
import torch
from helpers import ROOT

from grpokit import config, cpu, trl_compat
from grpokit.trainer import watch
from grpokit.cli import main
from grpokit.config import validate
from grpokit.config.trainer_args import grpo_args
from grpokit.planning import memory
from grpokit.planning.moments import Settings, loss_passes
from grpokit.reporting import memory_use

SMOKE = ROOT / "recipes" / "smoke.yaml"
SMOLLM2_CONFIG = ROOT / "grpokit" / "assets" / "model_configs" / "HuggingFaceTB__SmolLM2-135M-Instruct" / "config.json"


def smollm2() -> dict:
    return json.loads(SMOLLM2_CONFIG.read_text())


# --------------------------------------------------------------------------------------------------
# The plan of the path that runs


def test_grpokits_loss_pass_computes_each_distinct_prompt_once_and_the_lead_once():
    s = Settings(per_device_train_batch_size=16, num_generations=4, prompt_length=469, max_completion_length=192,
                 own_passes=True, lead=440)
    # the lead once, 4 distinct prompts' own tokens, then 16 rows of (last prompt token + completion)
    assert loss_passes(s) == [(1, 440, 440, False), (4, 28, 468, True), (16, 193, 661, True)]
    trl = Settings(per_device_train_batch_size=16, num_generations=4, prompt_length=469, max_completion_length=192)
    assert loss_passes(trl) == [(16, 661, 661, True)]
    # a lead too short for a pass of its own, and prompts that never repeat: TRL's pass
    assert loss_passes(Settings(per_device_train_batch_size=4, num_generations=1, own_passes=True, lead=8)) == \
        [(4, 256 + 512, 256 + 512, True)]


def test_the_own_path_plans_less_than_trls_where_prompts_repeat_and_share_a_lead():
    knobs = dict(dtype="bfloat16", device="cpu", lora={"r": 16, "target_modules": "all-linear"}, optim="adamw_torch_fused",
                 per_device_train_batch_size=16, num_generations=4, prompt_length=469, max_completion_length=192,
                 gradient_checkpointing=False, tool_rounds=2, suggest=False)
    trl = memory.plan(smollm2(), **knobs)
    own = memory.plan(smollm2(), own_passes=True, lead=440, **knobs)
    trl_training, own_training = (next(p for p in plan.phases if p.name == "training") for plan in (trl, own))
    assert own_training.bytes < 0.6 * trl_training.bytes
    # a tool round copies the last turn's kept states into its cache, letting each layer go once copied: one layer of
    # them beside the cache at most (SmolLM2: 30 layers)
    own_kv, trl_kv = (next(c.bytes for c in plan.moments[1].components if c.name == "KV cache") for plan in (own, trl))
    assert own_kv == pytest.approx(trl_kv * (1 + 1 / 30), rel=1e-3)
    assert "grpokit" in memory.path_text(own.settings) and "TRL" in memory.path_text(trl.settings)


def test_check_names_the_path_it_planned_and_the_card_users_have(capsys):
    code = main(["--recipe", str(ROOT / "recipes" / "smollm2-135m" / "calculator.yaml"), "--check"])
    out = capsys.readouterr().out
    assert code == 0
    section = out[out.index("Memory plan:"):out.index("check passed")]
    assert "on a T4 (16 GB, 15 GiB usable, float16)" in section and "float16 base" in section
    assert "path planned: grpokit's passes" in section and "-token lead once" in section
    assert "host memory <= " in section and "held now (libraries)" in section
    assert len(section.splitlines()) <= 12 and max(map(len, section.splitlines())) <= 160


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "recipes").rglob("*.yaml")
                                        if "accelerate" not in p.parts and p.parent.name != "base"
                                        and "lab" not in p.parts),
                         ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_every_shipped_gpu_recipe_fits_the_default_card_or_names_the_cards_it_needs(path):
    """The default card is a T4's 15 GiB: a recipe for one 16 GB GPU fits it with headroom; one that does not (a 7B
    model) names the smallest common card that fits."""
    recipe = validate(config.load(path), data_files=False)
    args = grpo_args(recipe)
    if args.use_vllm:
        pytest.skip("vLLM shares the card by its own utilization setting (grpokit.planning.vllm_share)")
    plan = memory.plan_for(args, model=recipe.model, lora=recipe.lora, prompt_length=recipe.dataset.get(
        "max_prompt_tokens"))
    assert plan.settings.gpu_memory_gb == memory.DEFAULT_CARD.gib
    assert plan.fits and plan.headroom_gb >= 0.5, (plan.total_gb, plan.suggestion)


def test_a_plan_over_the_card_names_the_smallest_common_card_that_fits():
    s = dict(lora={"r": 16}, per_device_train_batch_size=32, prompt_length=1024, max_completion_length=2048,
             gradient_checkpointing=False,
             card=memory.DEFAULT_CARD.name, gpu_memory_gb=memory.DEFAULT_CARD.gib)
    plan = memory.plan(smollm2(), **s)
    assert not plan.fits
    assert f"  on other cards: {memory.cards_that_fit(plan.total_gb)}" in plan.render()
    assert memory.cards_that_fit(20.0) == "fits a L4 / A10G (24 GB) and larger"
    assert memory.cards_that_fit(90.0) == "needs more than A100 / H100 (80 GB) offers"


# --------------------------------------------------------------------------------------------------
# A run measures itself


def test_shapes_are_read_from_the_generation_batch():
    pad = 0
    lead = list(range(10, 30))  # 20 shared tokens, of which 19 leave the shorter prompt two of its own
    prompts = [lead + [40, 41], lead + [50]]
    rows = [prompts[0]] * 2 + [prompts[1]] * 2
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    completion_mask = torch.tensor([[1] * 6 + [0] * 2, [1] * 8, [1] * 3 + [0] * 5, [1] * 7 + [0]])
    tool_mask = torch.tensor([[1, 0, 0, 1, 0, 1, 1, 1], [1] * 8, [1] * 8, [1, 1, 0, 1, 1, 1, 1, 1]])
    shapes = watch.shapes_of({"prompt_ids": ids, "prompt_mask": mask, "completion_mask": completion_mask,
                              "tool_mask": tool_mask}, micro_batch=4)
    assert shapes == watch.Shapes(rows=4, prompt=22, completion=8, micro_batch=4, distinct=2, lead=19, tool_rounds=2)


def test_the_report_and_the_watch_share_their_band():
    assert memory_use.BAND == watch.RATIO_BAND


@pytest.mark.slow
def test_a_run_measures_each_phase_against_its_plan_at_the_steps_shapes(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--recipe", str(SMOKE), f"trainer.output_dir={out}", "trainer.max_steps=3", "trainer.save_steps=10"]) == 0
    console = capsys.readouterr().out
    lines = [line for line in console.splitlines() if "] memory, step" in line]
    assert lines and "memory, step 1 (G 8, P " in lines[0] and "generation" in lines[0] and "training" in lines[0]
    assert "the recipe's worst case" in lines[0]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    logged = [h for h in history if "memory/training_measured_gib" in h]
    assert len(logged) == 3  # every step
    for h in logged:
        for phase in ("generation", "training"):
            measured, planned = h[f"memory/{phase}_measured_gib"], h[f"memory/{phase}_planned_gib"]
            # like for like on a CPU: the process's peak resident memory against the plan plus its libraries
            assert 0.5 < measured / planned < 2.0, (phase, measured, planned)
    assert "memory/training_bound_gib" in logged[0] and logged[0]["memory/on_cuda"] == 0.0
    report = (out / "report.md").read_text()
    section = report[report.index("## Memory"):]
    assert "| training |" in section and "| generation |" in section and "peak resident memory" in section


# --------------------------------------------------------------------------------------------------
# Out of memory explains itself


def refuse(*args, **kwargs):
    torch.empty(2**60, dtype=torch.uint8)  # a real refusal by torch's CPU allocator


@pytest.mark.slow
@pytest.mark.parametrize("where", ["generation", "training", "optimizer step"])
def test_out_of_memory_in_each_phase_is_one_message_with_ranked_changes(where, tmp_path, monkeypatch, capsys):
    from transformers import GenerationMixin
    from trl import GRPOTrainer

    if where == "generation":
        monkeypatch.setattr(GenerationMixin, "generate", refuse)
    elif where == "training":
        monkeypatch.setattr(GRPOTrainer, "compute_loss", refuse)
    else:
        monkeypatch.setattr(torch.optim.AdamW, "step", refuse)
    out = tmp_path / "run"
    code = main(["--recipe", str(SMOKE), f"trainer.output_dir={out}", "trainer.max_steps=2", "trainer.optim=adamw_torch"])
    err = capsys.readouterr().err
    assert code == watch.EXIT_OUT_OF_MEMORY == 3
    assert "Traceback" not in err
    phase = "generation" if where == "generation" else "training"
    assert f"out of memory in the {phase} phase of step 1 (on cpu)" in err
    assert "planned at them:" in err and "the device: the machine's memory" in err or "limit" in err
    assert "what the plan says each change saves" in err and "    1. " in err
    assert "no checkpoint was saved yet" in err


def test_a_cpu_allocators_refusal_is_recognised_as_out_of_memory():
    with pytest.raises(RuntimeError) as refused:
        refuse()
    assert trl_compat.out_of_memory(refused.value)
    assert trl_compat.out_of_memory(MemoryError()) and not trl_compat.out_of_memory(RuntimeError("shapes differ"))
    assert trl_compat.library_internals_problems(["torch:DefaultCPUAllocator's refusal"]) == []


def test_ranked_changes_put_the_smallest_change_that_fits_first():
    s = Settings(dtype="bfloat16", device="cuda", lora={"r": 16}, per_device_train_batch_size=16, num_generations=4,
                 prompt_length=1024, max_completion_length=1024, gradient_checkpointing=False)
    now = memory.Plan("", "", s, memory._compute(smollm2(), s)[0])
    ranked = memory.ranked_changes(smollm2(), s, capacity=int(now.total_gb * memory.GIB * 0.7))
    fitting = [r for r in ranked if r[3]]
    assert fitting and ranked[:len(fitting)] == fitting  # the changes that fit come first ...
    assert [r[1] for r in fitting] == sorted(r[1] for r in fitting)  # ... the one that saves least first
    assert all(after <= int(now.total_gb * memory.GIB * 0.7) for _, _, after, fits in fitting)


def test_cuda_runs_get_expandable_segments_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv(cpu.ALLOC_CONF, raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    cpu.cuda_allocator()
    assert os.environ[cpu.ALLOC_CONF] == "expandable_segments:True"
    monkeypatch.setenv(cpu.ALLOC_CONF, "max_split_size_mb:128")
    cpu.cuda_allocator()
    assert os.environ[cpu.ALLOC_CONF] == "max_split_size_mb:128"


# --------------------------------------------------------------------------------------------------
# --probe


@pytest.mark.parametrize("flag", [["--resume"], ["--eval"], ["--merge", "runs/x"], ["--check"]])
def test_probe_refuses_what_it_cannot_combine_with(flag, capsys):
    assert main(["--recipe", str(SMOKE), "--probe", *flag]) == 2
    err = capsys.readouterr().err
    assert "--probe" in err and "does not combine with" in err and "Traceback" not in err


@pytest.mark.slow
def test_probe_says_fits_with_a_figure_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    assert main(["--recipe", str(SMOKE), "--probe", f"trainer.output_dir={tmp_path / 'never'}"]) == 0
    out = capsys.readouterr().out
    assert "probe: fits -- peak" in out and "headroom" in out and "probe: training" in out
    assert "C 16" in out  # every completion forced to max_completion_length
    assert not scratch_or_run(tmp_path)  # the scratch folder is gone, and no run folder was made


def scratch_or_run(folder) -> list:
    """What a probe may have left in `folder` (the temporary folder it ran with): its scratch folder, a run folder
    (torch's own compile cache, which torch puts there, is not grpokit's)."""
    return [p.name for p in folder.iterdir() if p.name.startswith("grpokit-probe-") or p.name == "never"]


CAPPED = """
import resource, sys
sys.path.insert(0, {root!r})
from grpokit.trainer import watch
begin = watch.Watch.begin
def capped(self, phase):
    begin(self, phase)
    if phase == "training" and self.shapes is not None:  # a real address-space cap, as `ulimit -v` sets it
        room = watch._status("VmSize") + 128 * 2**20  # the head's 512 MiB tile is refused, not a C library's malloc
        resource.setrlimit(resource.RLIMIT_AS, (room, room))
watch.Watch.begin = capped
from grpokit.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_probe_under_a_memory_cap_names_the_phase_and_the_cap(tmp_path):
    script = tmp_path / "capped.py"
    script.write_text(CAPPED.format(root=str(ROOT)))
    env = dict(os.environ, TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, str(script), "--recipe", str(SMOKE), "--probe",
                           "trainer.per_device_train_batch_size=64", "trainer.num_generations=4",
                           "trainer.max_completion_length=128"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert done.returncode == watch.EXIT_OUT_OF_MEMORY, done.stderr[-3000:]
    assert "probe: does NOT fit -- out of memory in the training phase" in done.stderr
    assert "an address-space limit (ulimit -v" in done.stderr and "Traceback" not in done.stderr
    assert not scratch_or_run(tmp_path)


def test_a_later_turn_lets_the_last_turns_states_go_layer_by_layer_as_it_copies_them():
    """grpokit's generation copies each row's kept keys and values into the new turn's cache; every holder lets each
    layer go once it is copied, so the last turn's cache is never held whole beside the new one."""
    import weakref

    from grpokit.trainer import generation

    class Model:
        config = None

    base = [torch.randn(4, 2, 10, 8) for _ in range(3)]  # the last turn's cache: 3 layers, 4 rows
    alive = [weakref.ref(t) for t in base]
    rows = [[(b[i], b[i]) for b in base] for i in range(3)]  # the rows that go on: their kept states, views of it
    other = [(b[3], b[3]) for b in base]  # a row of the last turn that does not go on
    del base
    seen = []
    original = torch.Tensor.new_zeros

    def noting(self, *size, **kwargs):
        seen.append(sum(ref() is not None for ref in alive))
        return original(self, *size, **kwargs)

    torch.Tensor.new_zeros = noting
    try:
        cache, width = generation._batch_cache(Model(), rows[:3], [10, 10, 10], [0, 0, 0], release=[*rows[:3], other])
    finally:
        torch.Tensor.new_zeros = original
    assert width == 10 and all(ref() is None for ref in alive)  # nothing of the last turn is left
    assert seen == [3, 3, 2, 2, 1, 1]  # before each layer's copy, only the layers not copied yet are held
    assert all(h[i] is None for h in [*rows[:3], other] for i in range(3))


def test_a_run_fixes_glibcs_mmap_threshold_unless_the_user_set_one(monkeypatch):
    """Large tensors' memory goes back to the system when freed (grpokit.cpu.MMAP_THRESHOLD): a CPU run's resident
    memory then follows its live tensors (bench/README.md, "A run's own figures")."""
    calls = []
    monkeypatch.setattr(cpu, "fixed_mmap_threshold", lambda: calls.append(1) or True)
    cpu.configure(None)
    assert calls == [1]
    monkeypatch.undo()
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert cpu.fixed_mmap_threshold() is False  # the user's own, read by glibc at start, is kept
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    assert cpu.fixed_mmap_threshold() is True  # glibc takes it (this machine's C library is glibc)


def test_the_probes_scratch_folder_is_new_and_private_so_removing_it_whole_removes_only_grpokits():
    from grpokit import files

    with files.scratch("grpokit-probe-") as folder:
        assert list(folder.iterdir()) == [] and (folder.stat().st_mode & 0o777) == 0o700
    assert not folder.exists()
