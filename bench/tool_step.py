"""Where a tool step's time goes: the prompt's tokens by part, and one real GRPO step's phases, tool recipe vs single-turn.

    nice -n 10 .venv/bin/python bench/tool_step.py --threads 2                 # calculator vs chain_sum, 2 steps each
    nice -n 10 .venv/bin/python bench/tool_step.py --recipes calculator --set trainer.per_device_train_batch_size=16 \
        trainer.gradient_accumulation_steps=1                                 # one recipe, with overrides
    nice -n 10 .venv/bin/python bench/tool_step.py --recipes calculator --loss-pass trl   # TRL's own loss pass, beside

For each recipe: the tokens its prompt holds by part (the user's question alone, the system text, the tool schemas as
the chat template renders them, the few-shot exchange), counted with the tokenizer's own chat template and `tools=` as
TRL renders each prompt; then `trainer.max_steps` steps (2 by default) of the recipe's own trainer (grpokit's
`prepare` + `make_trainer`, the run's code path), with a timer around each of TRL's phases:

- `generate`: `GRPOTrainer._generate_single_turn`, the first turn of every completion (prefill of the whole prompt, then
  decoding); `generate after tools`: the same method called from `_tool_call_loop`, the turn after the tool results,
  which TRL starts again from the whole prompt + completion + tool result (no KV cache is kept between rounds);
  `tool calls`: the rest of `_tool_call_loop` (running the tools, building the next prompts);
- `rewards`: `_calculate_rewards`; `logprob forwards`: `_get_per_token_logps_and_entropies` (the training forward, and
  the reference / old-policy forwards when beta > 0 or the batch is reused);
- `backward`: `accelerator.backward`; `rest`: the step's time minus the above (optimizer, padding, bookkeeping).

A step's time runs from the trainer's `on_step_begin` to its `on_step_end`: generation, every micro-batch, the optimizer.
Prints figures; nothing here is a test. The second step is the one to read (the first warms kernels and caches).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

from offline import ROOT  # noqa: E402  (before grpokit: no hub, grpokit from this checkout)

RECIPES = {"calculator": ROOT / "recipes/smollm2-135m/calculator.yaml",
           "chain_sum": ROOT / "recipes/smollm2-135m/chain_sum.yaml",
           "basic_arithmetic": ROOT / "recipes/smollm2-135m/basic_arithmetic.yaml",
           "python_tool": ROOT / "recipes/smollm2-135m/python_tool.yaml"}
PHASES = ("generate", "tool calls", "generate after tools", "rewards", "logprob forwards", "backward")


def prompt_parts(prep) -> dict:
    """Tokens of the first prompt by part, each counted as the difference the part makes to the rendered prompt."""
    from grpokit.tools import tooluse

    tok, messages = prep.tokenizer, prep.dataset[0]["prompt"]
    if isinstance(messages, str):
        return {"whole prompt (plain text)": len(tok(messages)["input_ids"])}
    tools = tooluse.template_tools(prep.tools) if prep.tools else None

    def length(msgs, **kw):
        return len(tok.apply_chat_template(msgs, tokenize=True, return_dict=False, add_generation_prompt=True, **kw))

    user, system = messages[-1:], [m for m in messages if m["role"] == "system"]
    parts = {"question (with the template's default system turn)": length(user)}
    parts["system text (replacing the default)"] = length(system + user) - length(user)
    if tools:
        parts["tool schemas and the template's tool preamble"] = length(system + user, tools=tools) - length(system + user)
    parts["few-shot exchange"] = length(messages, tools=tools) - length(system + user, tools=tools)
    parts["whole prompt"] = length(messages, tools=tools)
    return parts


class Timers:
    """Seconds per phase per optimizer step, from wrappers around the trainer's methods. A phase called inside another
    (the generation TRL runs inside its tool loop) is counted as its own and taken out of the outer one."""

    def __init__(self, trainer=None):
        self.steps, self.stack = [], []
        self.seconds = defaultdict(float)
        self.shapes = defaultdict(list)
        self.trainer, self.counted = trainer, (0, 0)

    def wrap(self, obj, name: str, phase: str, shape=None, inside: dict | None = None):
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            outer = self.stack[-1] if self.stack else None
            own = (inside or {}).get(outer, phase)
            self.stack.append(own)
            start = time.perf_counter()
            try:
                out = original(*args, **kwargs)
            finally:
                took = time.perf_counter() - start
                self.stack.pop()
            self.seconds[own] += took
            if outer is not None:
                self.seconds[outer] -= took
            if shape is not None:
                self.shapes[own].append({**shape(args, kwargs, out), "s": round(took, 1)})
            return out

        setattr(obj, name, timed)

    def close_step(self, step_time: float):
        self.steps.append({"step_time": step_time, **{p: self.seconds.get(p, 0.0) for p in PHASES},
                           "shapes": dict(self.shapes), **self.prompt_tokens()})
        self.seconds, self.shapes = defaultdict(float), defaultdict(list)

    def prompt_tokens(self) -> dict:
        """The step's prompt tokens the loss pass computed and took from another copy (grpokit.trainer.shared_prompt's
        tally), where the trainer keeps one."""
        tally = getattr(self.trainer, "shared_prompt_tally", None)
        if tally is None:
            return {}
        before, self.counted = self.counted, (tally.computed, tally.shared)
        return {"loss pass prompt tokens": {"computed": tally.computed - before[0], "shared": tally.shared - before[1]}}


def _generated(args, kwargs, out):
    prompt_ids = args[0]
    return {"sequences": len(prompt_ids), "longest prompt": max(len(p) for p in prompt_ids),
            "mean prompt": round(sum(len(p) for p in prompt_ids) / len(prompt_ids)),
            "longest new": max((len(c) for c in out[0]), default=0)}


def _forward(args, kwargs, out):
    ids = args[1] if len(args) > 1 else kwargs["input_ids"]
    return {"shape": list(ids.shape)}


def measure(name: str, overrides: list[str], steps: int, loss_pass: str = "shared") -> dict:
    from transformers import TrainerCallback

    from grpokit.run.build import make_trainer, prepare
    from grpokit.config import load, validate
    from grpokit.trainer.models import load_model

    out_dir = Path("/tmp") / f"tool_step-{name}-{os.getpid()}"
    recipe = validate(load(str(RECIPES[name]), [f"trainer.max_steps={steps}", "trainer.save_strategy=no",
                                                 f"trainer.output_dir={out_dir}", "trainer.report_to=none", *overrides]))
    prep = prepare(recipe, mode="train", log=lambda m: None)
    parts = prompt_parts(prep)
    trainer = make_trainer(prep, load_model(prep.model_path, recipe))
    if loss_pass == "trl":  # TRL's own log-probability pass: every copy of a prompt computed (generation unchanged)
        trainer._share_prompts = False
    timers = Timers(trainer)
    timers.wrap(trainer, "_generate_single_turn", "generate", _generated, inside={"tool calls": "generate after tools"})
    timers.wrap(trainer, "_tool_call_loop", "tool calls")
    timers.wrap(trainer, "_calculate_rewards", "rewards")
    timers.wrap(trainer, "_get_per_token_logps_and_entropies", "logprob forwards", _forward)
    timers.wrap(trainer.accelerator, "backward", "backward")

    class StepEnd(TrainerCallback):
        started = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            StepEnd.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            timers.close_step(time.perf_counter() - StepEnd.started)

    trainer.add_callback(StepEnd())  # TRL generates inside the step's first training_step: within begin..end
    trainer.train()
    a = prep.args
    return {"recipe": name, "overrides": overrides, "loss pass": loss_pass, "dtype": str(trainer.model.dtype),
            "prompt tokens": parts,
            "batch": {"completions per step": a.per_device_train_batch_size * a.gradient_accumulation_steps,
                      "micro-batch": a.per_device_train_batch_size, "num_generations": a.num_generations,
                      "max_completion_length": a.max_completion_length, "beta": a.beta,
                      "max_tool_calling_iterations": a.max_tool_calling_iterations},
            "steps": timers.steps}


def show(result: dict) -> None:
    print(f"\n== {result['recipe']} {' '.join(result['overrides'])} (loss pass: {result['loss pass']}, lead: "
          f"{result.get('lead', 'shared')}, {result['dtype']})")
    for part, n in result["prompt tokens"].items():
        print(f"  prompt tokens, {part}: {n}")
    print(f"  batch: {result['batch']}")
    for i, step in enumerate(result["steps"], 1):
        known = sum(step[p] for p in PHASES)
        cells = "  ".join(f"{p} {step[p]:.1f}" for p in PHASES)
        print(f"  step {i}: {step['step_time']:.1f} s = {cells}  rest {step['step_time'] - known:.1f}")
        for phase, shapes in step["shapes"].items():
            print(f"    {phase}: {shapes}")
        if "loss pass prompt tokens" in step:
            print(f"    loss pass prompt tokens: {step['loss pass prompt tokens']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="+", default=["calculator", "chain_sum"], choices=sorted(RECIPES))
    parser.add_argument("--set", nargs="*", default=[], help="recipe overrides, key=value, for every recipe")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--loss-pass", choices=("shared", "trl"), default="shared",
                        help="shared: each prompt once for its copies (grpokit.trainer.shared_prompt, as a run does); trl: TRL's "
                             "own pass, every copy computed")
    parser.add_argument("--no-lead", action="store_true",
                        help="compute the lead the distinct prompts share (system text, tool schemas) once per prompt, "
                             "as before grpokit shared it (grpokit.trainer.shared_prompt.MIN_LEAD out of reach)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.no_lead:
        from grpokit.trainer import shared_prompt

        shared_prompt.MIN_LEAD = sys.maxsize
    results = []
    for name in args.recipes:
        load = os.getloadavg()
        result = measure(name, args.set, args.steps, args.loss_pass)
        result["lead"] = "each prompt's own" if args.no_lead else "shared"
        result["machine"] = {"threads": torch.get_num_threads(), "load before": [round(x, 2) for x in load],
                             "load after": [round(x, 2) for x in os.getloadavg()], "cpu capability": torch.backends.cpu.get_cpu_capability()}
        show(result)
        results.append(result)
    if args.json:
        import json

        from grpokit import files

        files.write_text(args.json, json.dumps(results, indent=1), key="--json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
