"""The memory plan against the live tensors of a real GRPO step on CPU, so it cannot drift silently.

One real `GRPOTrainer` step of a small random Qwen2-shaped model under `grpokit.planning.measure.LiveTensors`
(bench/plan_vs_measured.py's harness, its smallest setting): every phase must be within the harness's
tolerance of what `memory.plan(device="cpu")` predicts. A TRL / transformers / PEFT upgrade that changes
what a step holds fails here. The committed results file, which `--check` cites, is checked too.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import ROOT, load_bench

from grpokit.planning import memory
from grpokit.planning.measure import LiveTensors



def _harness():
    return load_bench("plan_vs_measured")


def test_counter_counts_views_once_and_frees_on_last_reference():
    with LiveTensors() as live:
        a = torch.zeros(1024)  # 4 KiB
        view = a[:10]  # same storage: not counted again
        live.track(a, "weights")  # retagged, still counted once
        del a
        assert live.total == 4096 and live.by_tag["weights"] == 4096  # the view keeps the storage alive
        del view
        assert live.total == 0
    assert live.peaks["default"].total == 4096


@pytest.mark.slow
def test_a_real_step_is_planned_within_tolerance():
    pvm = _harness()
    [record] = pvm.run([pvm.TINY], log=lambda line: None)
    phases = record["comparison"]["phases"]
    assert set(phases) == {"generation", "training"}
    for name, phase in phases.items():
        assert abs(phase["error"]) <= pvm.TOLERANCE, "\n".join(pvm.components(record))
    # the counter saw the step's parts where the plan puts them
    generation = record["measured"]["phases"]["generation"]["parts"]
    assert generation["KV cache"] > 0 and generation["optimizer states"] > 0 and "gradients" not in generation
    moments = record["measured"]["moments"]
    assert moments["head backward"]["parts"]["logits"] > 0
    assert moments["optimizer step"]["parts"]["gradients"] > 0


def test_committed_results_back_what_check_says():
    """bench/results/plan_vs_measured_cpu.json: >= 8 settings, every phase within tolerance, and --check's
    note quotes its worst error and count (never a hard-coded figure)."""
    results = json.loads((ROOT / "bench" / "results" / "plan_vs_measured_cpu.json").read_text())
    records = results["records"]
    assert len(records) >= 8
    errors = [abs(ph["error"]) for r in records for ph in r["comparison"]["phases"].values()]
    assert len(errors) == 2 * len(records) and max(errors) <= results["summary"]["tolerance"] == 0.10
    settings = [r["setting"] for r in records]
    assert {s["lora"] is None for s in settings} == {True, False}
    assert {s["gradient_checkpointing"] for s in settings} == {True, False}
    assert {"4bit"} <= {s["quantization"] for s in settings} and any(s["beta"] > 0 for s in settings)
    note = memory.validation_note()
    assert f"within {max(errors):.1%}" in note and f"over {len(records)} settings" in note
    assert "GPU allocator and kernels not yet measured" in note
