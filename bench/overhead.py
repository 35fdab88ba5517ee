"""Per-step overhead of grpokit over calling TRL directly with the same config (target: <= 2 %).

Both sides train the same tiny model on the same data with the same GRPOConfig; the grpokit side is
built by `grpokit.run.build.make_trainer` from the smoke recipe, with the reward guard and the callbacks a
run adds to every step (`training.add_run_callbacks`: progress lines, first completions kept, stop on a
signal), the TRL side by hand. Runs alternate to share the machine's noise; the median of the per-step
times of each side is reported. Prints figures; not a test.

    python bench/overhead.py [--steps 40] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def step_times(trainer) -> list[float]:
    """Per-step wall times from a callback (the first two steps are warm-up and dropped)."""
    from transformers import TrainerCallback

    stamps = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    trainer.add_callback(Stamp())
    trainer.train()
    return [b - a for a, b in zip(stamps[2:], stamps[3:])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    opts = ap.parse_args()

    import tempfile

    import torch
    import trl
    from trl import GRPOTrainer

    from grpokit.run import build, training
    from grpokit.config import load, validate
    from grpokit.lifecycle import StopOnSignal
    from grpokit.trainer.models import load_model

    def prepared(out):
        recipe = validate(load(ROOT / "recipes" / "smoke.yaml", [
            f"trainer.output_dir={out}", f"trainer.max_steps={opts.steps}", "trainer.save_strategy=no",
            "trainer.disable_tqdm=true", "trainer.logging_steps=1000"]))
        return build.prepare(recipe, log=lambda m: None), recipe

    def grpokit_trainer(out):
        # Built and instrumented as a run is: make_trainer, then the callbacks train() adds to every step.
        prep, recipe = prepared(out)
        trainer = build.make_trainer(prep, load_model(prep.model_path, recipe))
        training.add_run_callbacks(trainer, StopOnSignal())
        return trainer

    def trl_trainer(out):
        # The same objects grpokit hands TRL, minus grpokit: the raw reward function, no guard.
        prep, recipe = prepared(out)
        raw_rewards = [f.fn for f in prep.reward_funcs]
        return GRPOTrainer(model=load_model(prep.model_path, recipe), reward_funcs=raw_rewards, args=prep.args,
                           train_dataset=prep.dataset, processing_class=prep.tokenizer, peft_config=prep.lora)

    sides = {"trl": [], "grpokit": []}
    for i in range(opts.repeats):
        for side, build in (("trl", trl_trainer), ("grpokit", grpokit_trainer)):
            with tempfile.TemporaryDirectory() as out:
                sides[side] += step_times(build(out))
        print(f"repeat {i + 1}/{opts.repeats}: median step trl {statistics.median(sides['trl']) * 1e3:.2f} ms, "
              f"grpokit {statistics.median(sides['grpokit']) * 1e3:.2f} ms", flush=True)
    t, g = statistics.median(sides["trl"]), statistics.median(sides["grpokit"])
    print(f"\nmeasured: median per-step wall time over {len(sides['trl'])} steps per side, tiny model, smoke recipe, "
          f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads), torch {torch.__version__}, trl {trl.__version__}")
    print(f"  trl direct  {t * 1e3:8.2f} ms/step")
    print(f"  grpokit     {g * 1e3:8.2f} ms/step")
    print(f"  overhead    {100 * (g - t) / t:+8.2f} %   (target <= 2 %; on a real model the step is far longer and the"
          " guard's cost, one list check per reward call, the same)")


if __name__ == "__main__":
    main()
