"""`--eval` of a recipe with tools: greedy multi-turn rollouts of the held-out prompts through TRL's own loop.

A tool rollout is TRL's (`GRPOTrainer`'s generation, tool-call parsing, environment resets and `get_reward`), so
`--eval` runs the very same code on the held-out rows rather than a copy of it: a trainer is built around the
loaded model with greedy decoding (`generation_kwargs: do_sample false`), one completion per prompt, no reference
model, and asked to generate and score each batch (TRL internals, fenced in `grpokit.trl_compat`). What it
scored is read back per sample: the rewards (the environment's own among them), and the tool calls each
completion made (its `tool` messages).
"""

from __future__ import annotations

from dataclasses import replace



def score(recipe, model, tokenizer, rows: list[dict], funcs: list, names: list[str], weights: list[float],
          pass_index: int | None, out_dir: str, log, *, passes, user_text, examples_kept: int) -> dict:
    """Greedy rollouts of `rows` with the recipe's tools, scored by the recipe's reward functions `funcs` (and the
    environment's `get_reward`); the same figures as `grpokit.evaluate`'s single-turn scoring, plus tool use.
    `passes(name, value)` decides a pass, `user_text(prompt)` shows a prompt: evaluate's own rules, handed down."""
    from grpokit import trl_compat
    from rewards.tools import tool_results

    trainer = _trainer(recipe, model, tokenizer, rows, funcs, out_dir)
    logged = trainer.reward_func_names  # the recipe's rewards as TRL names them, then the environment's (weight 1)
    weight_of = dict(zip(logged, list(weights) + [1.0] * (len(logged) - len(weights))))
    pass_name = logged[pass_index] if pass_index is not None else logged[-1]
    pass_rule = names[pass_index] if pass_index is not None else pass_name
    per_reward = {n: [] for n in logged}
    totals, calls, passed, examples, failed, kinds = [], [], 0, [], 0.0, {}
    size = trainer.args.generation_batch_size  # the logs TRL keeps hold one generation batch
    for first in range(0, len(rows), size):
        batch = rows[first: first + size]
        samples, failure_share = trl_compat.generate_and_score(trainer, batch)
        batch_calls = [tool_results(sample["completion"])[0] for sample in samples]
        failed += failure_share * sum(batch_calls)
        for sample, made in zip(samples, batch_calls):
            for kind in call_kinds(sample):
                kinds[kind] = kinds.get(kind, 0) + 1
            values = sample["rewards"]
            for n in logged:
                if values.get(n) is not None:
                    per_reward[n].append(values[n])
            totals.append(sum(weight_of[n] * (values.get(n) or 0.0) for n in logged))
            calls.append(made)
            ok = passes(pass_rule, values.get(pass_name))
            passed += ok
            if len(examples) < examples_kept:
                examples.append({"prompt": user_text(sample["prompt"]), "answer": sample["row"].get("answer"),
                                 "completion": sample["completion"], "rewards": values, "tool_calls": calls[-1]})
        log(f"eval (greedy, with tools): {min(first + len(batch), len(rows))}/{len(rows)} prompts")
    n = len(rows)
    rewards = {name: (sum(v) / len(v) if v else None) for name, v in per_reward.items()}
    rewards["reward"] = sum(totals) / len(totals) if totals else None
    tools = {"calls_per_completion": sum(calls) / n, "completions_calling": sum(1 for c in calls if c) / n,
             "failures_per_call": failed / sum(calls) if sum(calls) else None,
             "calls_distribution": {k: sum(1 for c in calls if _bucket(c) == k) / n for k in ("0", "1", "2", "3+")},
             "call_outcomes": kinds}
    return {"pass@k": passed / n, "passed_prompts": passed, "mean": passed / n, "rewards": rewards,
            "examples": examples, "tools": tools, "pass_reward": pass_name}


def _trainer(recipe, model, tokenizer, rows: list[dict], funcs: list, out_dir: str):
    """A GRPOTrainer that only generates: greedy, one completion per prompt, no reference model, no logging; its
    generation as a run's (grpokit.generation)."""
    from datasets import Dataset

    from grpokit.config.trainer_args import grpo_args
    from grpokit.generation import PrefixReuseGRPOTrainer
    from grpokit.tooluse import resolve

    greedy = {**(recipe.trainer.get("generation_kwargs") or {}), "do_sample": False, "temperature": None, "top_p": None,
              "top_k": None}
    knobs = {**recipe.trainer, "output_dir": out_dir, "beta": 0.0, "num_generations_eval": 1,
             "generation_kwargs": greedy, "report_to": [], "eval_strategy": "no", "use_vllm": False}
    args = grpo_args(replace(recipe, trainer=knobs))
    toolset = resolve(recipe.tools)
    trainer = PrefixReuseGRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=Dataset.from_list(rows),
                                     processing_class=tokenizer, reuse_prefix=recipe.sampling.get("reuse_prefix", True),
                                     **toolset.trainer_kwargs())
    trainer.model.eval()  # TRL reads the mode from the model: eval uses num_generations_eval
    return trainer


def _bucket(calls: int) -> str:
    return str(calls) if calls < 3 else "3+"


def call_kinds(sample: dict) -> list[str]:
    """How each call of a rollout ended, as its environment recorded them (`calls`, e.g. the Python tool's "ok",
    "error", "timeout", "crash"), plus "unparseable" when the model's last turn still holds a `<tool_call>` TRL could
    not parse (a call the model meant, never run). An environment that records nothing adds nothing.

    >>> call_kinds({"environment": None, "completion": [{"role": "assistant", "content": "<tool_call>{bad</tool_call>"}]})
    ['unparseable']
    """
    env = sample.get("environment")
    recorded = getattr(env, "calls", None)
    kinds = [k for k in recorded if isinstance(k, str)] if isinstance(recorded, list) else []
    completion = sample.get("completion")
    last = completion[-1] if isinstance(completion, list) and completion else None
    if isinstance(last, dict) and isinstance(last.get("content"), str) and "<tool_call>" in last["content"]:
        kinds.append("unparseable")
    return kinds
