"""`--probe`: one real step of a recipe at its largest shapes, on this device, in a scratch folder grpokit makes and
removes; it says in minutes what a run would learn at hour three: fits (the peak measured per phase, the headroom on
this device), or the phase that does not, with what the plan says to change.

The largest shapes: the longest prompts first (the dataset ordered by tokens, unshuffled), every completion forced to
`max_completion_length` (`min_new_tokens`), the recipe's batch and generation batch. A completion forced to its full
length in its first turn is the training pass's largest shape whatever the tool rounds; the rounds themselves are
taken as the model takes them (a forced length leaves no room for one), and their kept keys and values are what the
plan adds (grpokit.planning.moments). A recipe's warm start is not run: the probe is of GRPO's step, from the recipe's
model. Nothing is saved: no checkpoint, no report; the scratch folder goes whatever happens.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from grpokit.config import Recipe
from grpokit.dist import say

EXIT_FITS = 0


def probe(recipe: Recipe) -> int:
    """Run the probe; returns its exit code: 0 fits, `watch.EXIT_OUT_OF_MEMORY` where a phase ran out of memory."""
    from grpokit import files, trl_compat
    from grpokit.trainer import watch

    with files.scratch("grpokit-probe-") as scratch:  # ours whole: made here, removed here
        say(f"probe: one step at the recipe's largest shapes, in {scratch} (removed after)")
        try:
            found = _one_step(recipe, scratch)
        except (RuntimeError, MemoryError) as err:
            if not trl_compat.out_of_memory(err):
                raise
            print("probe: does NOT fit -- " + "\n".join(watch.explain(watch.active())), file=sys.stderr)
            return watch.EXIT_OUT_OF_MEMORY
        finally:
            watch.forget()
    for line in verdict(found):
        print(line)
    return EXIT_FITS


def _one_step(recipe: Recipe, scratch: Path):
    """Train one step of `recipe` at its largest shapes into `scratch`; the watch that measured it."""
    from grpokit.run.build import make_trainer, planned_shapes, prepare
    from grpokit.trainer.models import load_model
    from grpokit.trainer import watch

    trainer_section = dict(recipe.trainer, output_dir=str(scratch), max_steps=1, save_strategy="no", report_to=[],
                           logging_steps=1)
    probed = replace(recipe, trainer=trainer_section, warm_start=None)
    prep = prepare(probed, mode="train")
    longest_first(prep)
    args = prep.args
    args.generation_kwargs = {**(args.generation_kwargs or {}), "min_new_tokens": args.max_completion_length}
    model = load_model(str(prep.model_path), probed)
    trainer = make_trainer(prep, model)
    found = watch.install(trainer, probed, args, say, planned_shapes(prep, probed))
    trainer.train()
    return found


def longest_first(prep) -> None:
    """`prep`'s dataset ordered by prompt tokens, longest first, and read in that order (no shuffle)."""
    from grpokit.prompts.data import prompt_lengths

    if prep.dataset is None or prep.tokenizer is None or not len(prep.dataset):
        return
    lengths = prompt_lengths(prep.tokenizer, prep.dataset)
    prep.dataset = prep.dataset.select(sorted(range(len(lengths)), key=lambda i: -lengths[i]))
    prep.args.shuffle_dataset = False


def verdict(found) -> list[str]:
    """The probe's lines: per phase, measured against planned; the peak against this device's capacity."""
    from grpokit.trainer import watch

    room, where = watch.capacity(found.device)
    lines = [f"probe: {r.phase} {r.measured / watch.GIB:.2f} GiB measured, planned {r.planned / watch.GIB:.2f} at "
             f"these shapes ({r.ratio:.2f}x)" for r in found.largest.values()]
    peak = max((r.measured for r in found.largest.values()), default=0)
    shapes = next(iter(found.largest.values())).shapes.text() if found.largest else "none measured"
    lines.append(f"probe: shapes {shapes}; measured as {found.peak.how()}")
    if room is None:
        return lines + [f"probe: ran whole, peak {peak / watch.GIB:.2f} GiB (this device's capacity is not known here)"]
    return lines + [f"probe: fits -- peak {peak / watch.GIB:.2f} GiB of {where}, headroom "
                    f"{(room - peak) / watch.GIB:.2f} GiB"]
