"""What the first-step check of grpokit's own passes found (grpokit.trainer.ownpasses), for report.md: per pass, how far it
stood from TRL's method on step 1's first micro-batch, against what tolerance, and whether TRL's method took over.

    from grpokit.reporting.own_passes import own_passes_section
    lines = own_passes_section(state["log_history"])   # [] for a run where neither of grpokit's passes ran
"""

from __future__ import annotations

PASSES = {"loss": "the loss pass (each prompt computed once for its copies)",
          "generation": "generation (prefill from kept prefixes)"}


def own_passes_section(history: list[dict]) -> list[str]:
    """report.md's lines on the check, from the metrics it logged at step 1 (`own_passes/*`)."""
    lines = []
    for which, what in PASSES.items():
        logged = next((h for h in history if f"own_passes/{which}_check" in h), None)
        if logged is None:
            continue
        found, tolerance = logged[f"own_passes/{which}_check"], logged.get(f"own_passes/{which}_tolerance", float("nan"))
        step = logged.get("step", 1)
        if logged.get(f"own_passes/{which}_fell_back"):
            lines.append(f"- {what}: {found:.3g} mean |Δ log-prob| from TRL's method on step {step}'s first "
                         f"micro-batch, past the tolerance {tolerance:g}: TRL's method ran from then on")
        else:
            lines.append(f"- {what}: {found:.3g} mean |Δ log-prob| from TRL's method on step {step}'s first "
                         f"micro-batch, within the tolerance {tolerance:g}: grpokit's pass ran")
    if not lines:
        return []
    return ["", "## grpokit's own passes", "", "Checked against TRL's own method on the run's device, dtype and attention "
            "(grpokit/trainer/ownpasses.py):", ""] + lines
