"""What a run measured of its own memory (grpokit.trainer.watch), for report.md: per phase, the recipe's bound (its
worst case, planned), the plan at the shapes of the step that peaked, what that step measured, and their ratio.

    from grpokit.reporting.memory_use import memory_section
    lines = memory_section(state["log_history"])   # [] for a run that logged no memory figures
"""

from __future__ import annotations

PHASES = ("generation", "training")
BAND = (0.85, 1.15)  # grpokit.trainer.watch.RATIO_BAND (a test holds the two equal): outside it, the report says so
HOW = {1.0: "on CUDA: torch.cuda.max_memory_allocated (live tensors), reset at each phase; reserved beside it",
       0.0: "on the CPU: the process's peak resident memory, reset at each phase, against the plan plus what the "
            "process held apart from tensors when training began (its libraries)"}


def memory_section(history: list[dict]) -> list[str]:
    """report.md's lines: a table of the phases' figures from the `memory/*` metrics every step logged."""
    rows, notes = [], []
    for phase in PHASES:
        logged = [h for h in history if f"memory/{phase}_measured_gib" in h]
        if not logged:
            continue
        peak = max(logged, key=lambda h: h[f"memory/{phase}_measured_gib"])
        bound = next((h[f"memory/{phase}_bound_gib"] for h in logged if f"memory/{phase}_bound_gib" in h), float("nan"))
        measured, planned = peak[f"memory/{phase}_measured_gib"], peak[f"memory/{phase}_planned_gib"]
        ratio = measured / planned if planned else float("nan")
        reserved = peak.get(f"memory/{phase}_reserved_gib")
        rows.append(f"| {phase} | {bound:.2f} | {planned:.2f} (step {peak.get('step', '?')}) | {measured:.2f}"
                    + (f" ({reserved:.2f} reserved)" if reserved is not None else "") + f" | {ratio:.2f} |")
        if not BAND[0] <= ratio <= BAND[1]:
            notes.append(f"- {phase}: measured {ratio:.2f}x the plan at its step's shapes, outside {BAND[0]}-{BAND[1]}")
    if not rows:
        return []
    cuda = next((h["memory/on_cuda"] for h in history if "memory/on_cuda" in h), 0.0)
    return (["", "## Memory", "", f"Measured by the run itself ({HOW[float(cuda)]}), beside the memory plan at the "
             "shapes of the step that peaked (its prompt, completion, rows and tool rounds) and the recipe's bound, "
             "its worst case (grpokit/planning/memory.py). GiB.", "",
             "| phase | bound (worst case) | planned at the step's shapes | measured | measured / planned |",
             "|---|---:|---:|---:|---:|"] + rows + ([""] + notes if notes else []))
