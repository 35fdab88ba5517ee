"""Dynamic sampling on the smoke task: steps to a reward threshold, and what the extra rounds cost.

    .venv/bin/python bench/dynamic_sampling.py            # one run with, one without; about a minute on a CPU

The smoke task (fraction of 'a' in the completion, tiny random Llama, LoRA) with half of the prompts made
degenerate: their reward is 0.0 whatever the model says, like a binary verifier on a prompt the model
never solves. Without dynamic sampling those groups take half of each batch and teach nothing; with it
they are dropped and replaced. Skill is measured on the live prompts only: the mean reward of every
live-prompt completion generated at a step (all rounds). One run per setting, one seed: a single
sample, not an estimate of the spread.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict

import offline  # noqa: F401  (before grpokit: no hub, grpokit from this checkout)

WORDS = ["apple", "banana", "cherry", "date", "egg", "fig", "grape", "ham"]


class LiveFractionA:
    """Fraction of 'a' for live prompts, 0.0 for degenerate ones; records live-prompt skill per step."""

    __name__ = "live_frac_a"

    def __init__(self):
        from rewards.toy import CharFraction

        self.score = CharFraction("a")
        self.live_by_step = defaultdict(list)

    def __call__(self, completions, kind, trainer_state, **kwargs):
        scores = self.score(completions=completions)
        for s, k in zip(scores, kind):
            if k == "live":
                self.live_by_step[trainer_state.global_step + 1].append(s)
        return [s if k == "live" else 0.0 for s, k in zip(scores, kind)]


def run(dynamic: bool, steps: int, seed: int, max_rounds: int, out_dir: str) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig

    from grpokit.trainer.dynamic_sampling import DynamicSamplingGRPOTrainer
    from grpokit.checkpoints.tiny import ensure_tiny_model

    path = ensure_tiny_model()
    kinds = ["live", "degenerate"] * (len(WORDS) // 2)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say {w}"}], "kind": k}
                              for w, k in zip(WORDS, kinds)])
    reward = LiveFractionA()
    args = GRPOConfig(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=16, learning_rate=1e-2, lr_scheduler_type="constant", logging_steps=1,
                      report_to=[], use_cpu=True, save_strategy="no", bf16=False, seed=seed, disable_tqdm=True,
                      log_level="error")
    trainer = DynamicSamplingGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path, dtype="float32"),
        reward_funcs=[reward],
        args=args,
        train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(path),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
        sampling={"dynamic": dynamic, "max_rounds": max_rounds, "metric": "reward"},
    )
    trainer.remove_callback(PrinterCallback)  # the table below is the output
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    logs = [h for h in trainer.state.log_history if "reward" in h]
    rounds = [h.get("sampling/rounds", 1.0) for h in logs]
    skill = {step: sum(v) / len(v) for step, v in sorted(reward.live_by_step.items())}
    return {"skill": skill, "rounds": rounds, "seconds": seconds,
            "filled": sum(h.get("sampling/filled_short", 0.0) for h in logs),
            "groups_per_round": args.generation_batch_size // args.num_generations}


def first_step_at(skill: dict, threshold: float):
    return next((step for step, value in skill.items() if value >= threshold), None)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threshold", type=float, default=0.5, help="live-prompt mean reward to reach")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads; 1 is fastest on a shared small CPU")
    opts = parser.parse_args(argv)

    import logging

    import torch

    torch.set_num_threads(opts.threads)
    # Each filled step is counted in the table; its log line would only repeat that here.
    logging.getLogger("grpokit.trainer.dynamic_sampling").setLevel(logging.ERROR)
    results = {}
    for dynamic in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            results[dynamic] = run(dynamic, opts.steps, opts.seed, opts.max_rounds, tmp)

    print(f"\nSmoke task, half the prompts degenerate; ONE run per setting (seed {opts.seed}), {opts.steps} steps, "
          f"threshold: live-prompt mean reward >= {opts.threshold}")
    header = f"{'dynamic sampling':<18}{'steps to threshold':>20}{'generation rounds':>19}{'prompts generated':>19}" \
             f"{'steps filled short':>20}{'train seconds':>15}"
    print(header)
    for dynamic, r in results.items():
        reached = first_step_at(r["skill"], opts.threshold)
        upto = len(r["rounds"]) if reached is None else reached
        rounds_to, rounds_all = int(sum(r["rounds"][:upto])), int(sum(r["rounds"]))
        rounds = f"{rounds_to} ({rounds_all})"
        prompts = f"{rounds_to * r['groups_per_round']} ({rounds_all * r['groups_per_round']})"
        reached = str(reached) if reached else "not reached"
        print(f"{'on' if dynamic else 'off':<18}{reached:>20}{rounds:>19}{prompts:>19}{int(r['filled']):>20}"
              f"{r['seconds']:>15.1f}")
    print("generation rounds / prompts generated: up to the threshold step (in brackets: whole run). "
          "Seconds are wall time on whatever CPU ran this, shared or not.")
    print("live-prompt reward per step (-: no live prompt generated that step):")
    for dynamic, r in results.items():
        curve = " ".join(f"{r['skill'][s]:.2f}" if s in r["skill"] else "-" for s in range(1, opts.steps + 1))
        print(f"  dynamic {'on ' if dynamic else 'off'}: {curve}")


if __name__ == "__main__":
    main()
