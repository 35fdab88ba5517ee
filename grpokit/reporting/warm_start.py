"""A warm-started run's papers name its warm start: the supervised pass GRPO started from (grpokit.run.supervised), read
back from the record it left in the run folder (`warm_start/warm_start.json`), for report.md, the model card and the
held-out table.

    from grpokit.reporting.warm_start import read, section
    made = read(run_dir)        # None for a run without a warm start
    lines = section(run_dir)    # report.md's "Warm start" section; [] without one
"""

from __future__ import annotations


from grpokit import files
from grpokit.warm_start import section as warmstart


def read(run_dir) -> dict | None:
    """The record of the warm start a run (or a checkpoint of it) trained from, or None: no warm start, or one whose
    record cannot be read (then its papers say no more than the folder does)."""
    found = warmstart.of_run(run_dir)
    if found is None:
        return None
    made, _ = files.try_json(found / warmstart.RECORD, dict)
    return made


def made_by(made: dict) -> str:
    """What made the warm start from its model, in a few words.

    >>> made_by({"steps": 10, "examples": 40})
    '10 supervised steps on 40 worked exchanges'
    """
    return f"{made.get('steps', '?')} supervised steps on {made.get('examples', '?')} worked exchanges"


def origin(made: dict) -> str:
    """The warm start in a few words: what it was made from, and by what.

    >>> origin({"from_model": "builtin:smollm2-135m-instruct", "steps": 10, "examples": 40})
    'builtin:smollm2-135m-instruct after 10 supervised steps on 40 worked exchanges'
    """
    return f"{made.get('from_model', 'the recipe model')} after {made_by(made)}"


def section(run_dir) -> list[str]:
    """report.md's account of the warm start: what it trained on and how, its loss, its time, where it is kept."""
    made = read(run_dir)
    if made is None:
        return []
    loss = [v for v in made.get("loss") or [] if isinstance(v, (int, float))]
    lora = made.get("lora") or {}
    lines = ["", "## Warm start", "",
             f"GRPO trained from a warm start this run made first (`{warmstart.FOLDER}/`): "
             f"{made.get('trained', 'a supervised pass')}.", "",
             f"- From: `{made.get('from_model', '?')}`",
             f"- Trained on: {made.get('examples', '?')} worked exchanges ({made.get('source', '?')}), "
             f"~{made.get('tokens_per_example', '?')} tokens each, ~{made.get('trained_tokens_per_example', '?')} of them "
             "the assistant's (the only ones with a loss)",
             f"- Steps: {made.get('steps', '?')} of {made.get('batch_size', '?')} exchanges, learning rate "
             f"{made.get('learning_rate', '?')}, LoRA r={lora.get('r', '?')} ({made.get('dtype', '?')}), merged"]
    if loss:
        lines.append(f"- Loss: {loss[0]:.4g} at its first step, {loss[-1]:.4g} at its last" if len(loss) > 1 else
                     f"- Loss: {loss[0]:.4g} at its first step, its only one")
    if isinstance(made.get("seconds"), (int, float)):
        lines.append(f"- Time: {made['seconds']:.0f} s")
    lines += ["", "Held-out figures of the warm start itself: `python launch.py --recipe ... --eval "
              f"RUN_DIR/{warmstart.FOLDER}` (a column of its own under \"Held-out eval\")."]
    return lines
