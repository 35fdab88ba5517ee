"""How long a run takes on a CPU, from measured figures only: `--check` gives the expected time of the run on this
machine when a measured row fits it, and says where the figure comes from; else it says nothing was measured.

    from grpokit.planning.cpu_time import estimate
    estimate("builtin:smollm2-135m-instruct", trainer, dtype="float32", cpu_bf16=False, cores=2)

The rows are `bench/cpu_speed.py` runs of the real-model recipe (recipes/smollm2-135m/arithmetic.yaml, every knob as
shipped but `max_steps` and saving): the trainer's own `step_time`, the first step apart (it warms kernels up), the rest
averaged. bench/README.md ("CPU time of the real-model recipe") shows the same rows; a test holds the two equal. A
figure of a recipe of another shape (model, batch, group, completion length) would be a guess, so none is given.
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL = "builtin:smollm2-135m-instruct"
# The shape the rows were measured at: what a step's work depends on, besides the CPU and the dtype.
SHAPE = {"per_device_train_batch_size": 32, "num_generations": 8, "max_completion_length": 16,
         "gradient_accumulation_steps": 1, "gradient_checkpointing": False}
WHERE = "bench/README.md, \"CPU time of the real-model recipe\""


@dataclass(frozen=True)
class Row:
    cpu_bf16: bool  # the CPU has bfloat16 instructions (AVX512-BF16 or AMX-BF16)
    dtype: str  # the frozen base's dtype (`model.dtype: auto` gives bfloat16 only where the CPU has them)
    first_s: float  # the first step, warm-up included
    per_step_s: float  # each later step, averaged
    cores: int  # torch threads = cores, OpenMP waiting passive (grpokit's default)
    measured: str  # when, on what, how loaded


MEASURED = (
    Row(True, "bfloat16", 15.6, 14.5, 2, "bench/cpu_speed.py --steps 3 on 2026-12-02, a 2-core x86_64 with AVX512-BF16 "
        "and AMX, other sessions idle (load average 1.55 before)"),
    Row(True, "float32", 16.0, 16.7, 2, "bench/cpu_speed.py --steps 3 on 2026-12-02, a 2-core x86_64 with AVX512-BF16 "
        "and AMX, other sessions idle (load average 1.19 before)"),
    Row(False, "float32", 115.3, 147.1, 2, "bench/cpu_speed.py --steps 3 on 2026-12-03, a 2-core x86_64 with AVX2 and no "
        "bfloat16 instructions, shared with other sessions' test runs (load average 4.94 before: 2-3 busy processes)"),
)


def total_s(row: Row, steps: int) -> float:
    """The first step plus the later ones at the measured rate.

    >>> total_s(MEASURED[0], 30)
    436.1
    """
    return round(row.first_s + max(0, steps - 1) * row.per_step_s, 1)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 300 else f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def estimate(model: str, trainer: dict, dtype: str, cpu_bf16: bool, cores: int, short: bool = False) -> str:
    """`--check`'s line on the time a CPU run of `trainer["max_steps"]` steps takes here, with its source (`short`:
    naming the source's place only, for the default view).

    >>> estimate(MODEL, {**SHAPE, "max_steps": 30}, "bfloat16", True, 2)[:78]
    'time on this CPU: about 7 min for 30 steps (a first step of 16 s, then 14.5 s a'
    """
    steps = trainer.get("max_steps")
    shape = {k: trainer.get(k) for k in SHAPE}
    if model != MODEL or shape != SHAPE or not isinstance(steps, int) or steps <= 0:
        return "time on this CPU: not measured for this model and batch shape; the step line gives the pace"
    row = next((r for r in MEASURED if r.cpu_bf16 == cpu_bf16 and r.dtype == dtype), None)
    kind = "with bfloat16 instructions" if cpu_bf16 else "without bfloat16 instructions"
    if row is None:
        return (f"time on this CPU: not measured for a {dtype} base on a CPU {kind} ({WHERE}); the step line gives "
                "the pace from the second step on")
    cores_note = "" if cores == row.cores else f"; measured with {row.cores} cores, this machine has {cores}"
    said = (f"time on this CPU: about {_duration(total_s(row, steps))} for {steps} steps (a first step of "
            f"{_duration(row.first_s)}, then {row.per_step_s:g} s a step), from the measured row")
    if short:
        return said + f" (--check --full says which){cores_note}"
    return said + f" for a {dtype} base on a CPU {kind}: {row.measured}; {WHERE}{cores_note}. A busier machine takes longer."


# The warm start's measured passes: bench/multi_call.py trains the shipped multi_call recipe's warm start (this model,
# LoRA r=16 in float32 over worked exchanges of ~610 tokens) and keeps how long each took, read here as it wrote it.
WARM_START_RESULTS = "bench/results/multi_call_warm_start.json"
TOKENS_WITHIN = 0.2  # a pass over exchanges this much longer or shorter than the measured ones is another shape


def warm_start_estimate(model: str, section: dict, lora_r: int, tokens_per_example: float, root) -> str:
    """`--check`'s line on the time the warm start's pass takes on this CPU: its steps at the per-step time bench measured
    for the same model, batch, LoRA rank, dtype and exchange length (`root`/WARM_START_RESULTS), said as measured where;
    else that it was not measured for this shape."""
    found = warm_start_measured(model, section, lora_r, tokens_per_example, root)
    if found is None:
        return f"not measured for this model and shape (bench/multi_call.py measures the shipped recipe's: {WARM_START_RESULTS})"
    per_step, where = found
    return f"~{_duration(per_step * section['steps'])} on {where}; slower CPUs take longer"


def warm_start_measured(model: str, section: dict, lora_r: int, tokens_per_example: float, root) -> tuple[float, str] | None:
    """(the seconds a step of the warm start's pass took where bench measured this shape, that place in words), or None:
    no measured pass of the same model, batch, LoRA rank, dtype and exchange length (within TOKENS_WITHIN)."""
    from pathlib import Path

    from grpokit import files

    tried, _ = files.try_json(Path(root) / WARM_START_RESULTS, dict)
    runs = [entry.get("made") for entry in ((tried or {}).get("warm_starts") or {}).values() if isinstance(entry, dict)]
    fits = [m for m in runs if isinstance(m, dict) and model == MODEL and section["dtype"] == "float32" and lora_r == 16
            and m.get("batch") == section["batch_size"] and isinstance(m.get("seconds"), (int, float))
            and isinstance(m.get("steps"), int) and m["steps"] > 0 and isinstance(m.get("tokens_per_example"), (int, float))
            and abs(m["tokens_per_example"] - tokens_per_example) <= TOKENS_WITHIN * m["tokens_per_example"]]
    if not fits:
        return None
    per_step = sum(m["seconds"] / m["steps"] for m in fits) / len(fits)
    return per_step, (f"{tried.get('machine', 'a CPU')} as bench measured ({per_step:.1f} s a step, {tried.get('when', '')}: "
                      f"{WARM_START_RESULTS})")
