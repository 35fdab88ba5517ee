"""`--eval` of a recipe with tools: multi-turn rollouts of the held-out prompts through TRL's own loop, greedy (and,
with `--eval-samples K`, K sampled rollouts of each prompt).

A tool rollout is TRL's (`GRPOTrainer`'s generation, tool-call parsing, environment resets and `get_reward`), so
`--eval` runs the very same code on the held-out rows rather than a copy of it: a trainer is built around the
loaded model with greedy decoding (`generation_kwargs: do_sample false`) or the recipe's sampling, one completion
per row (a prompt's K samples are K rows side by side), no reference model, and asked to generate and score each
batch (TRL internals, fenced in `grpokit.trl_compat`). What it scored is read back per sample: the rewards (the
environment's own among them), and the tool calls each completion made (its `tool` messages).
"""

from __future__ import annotations

from dataclasses import replace



def score(recipe, model, tokenizer, rows: list[dict], funcs: list, names: list[str], weights: list[float],
          pass_index: int | None, out_dir: str, log, *, passes, user_text, examples_kept: int, k: int = 1,
          sample: bool = False) -> dict:
    """Rollouts of `rows` with the recipe's tools -- one greedy each, or (`sample`) `k` each, sampled as training
    samples them -- scored by the recipe's reward functions `funcs` (and the environment's `get_reward`); the same
    figures as `grpokit.run.evaluate`'s single-turn scoring (pass@k: a prompt with a passing rollout; mean: the share of
    rollouts that pass), plus tool use over every rollout. `passes(name, value)` decides a pass, `user_text(prompt)`
    shows a prompt: evaluate's own rules, handed down."""
    from grpokit import trl_compat
    from rewards.tools import tool_results

    mode = f"{k} samples" if sample else "greedy"
    prompts, rows = len(rows), [row for row in rows for _ in range(k)]  # a prompt's k rollouts side by side
    trainer = _trainer(recipe, model, tokenizer, rows, funcs, out_dir, sample=sample)
    logged = trainer.reward_func_names  # the recipe's rewards as TRL names them, then the environment's (weight 1)
    weight_of = dict(zip(logged, list(weights) + [1.0] * (len(logged) - len(weights))))
    pass_name = logged[pass_index] if pass_index is not None else logged[-1]
    pass_rule = names[pass_index] if pass_index is not None else pass_name
    per_reward = {n: [] for n in logged}
    totals, calls, passed, examples, failed, kinds = [], [], [], [], 0.0, {}
    size = trainer.args.generation_batch_size  # the logs TRL keeps hold one generation batch
    for first in range(0, len(rows), size):
        batch = rows[first: first + size]
        scored, failure_share = trl_compat.generate_and_score(trainer, batch)
        batch_calls = [tool_results(rollout["completion"])[0] for rollout in scored]
        failed += failure_share * sum(batch_calls)
        for rollout, made in zip(scored, batch_calls):
            for kind in call_kinds(rollout):
                kinds[kind] = kinds.get(kind, 0) + 1
            values = rollout["rewards"]
            for n in logged:
                if values.get(n) is not None:
                    per_reward[n].append(values[n])
            totals.append(sum(weight_of[n] * (values.get(n) or 0.0) for n in logged))
            calls.append(made)
            passed.append(bool(passes(pass_rule, values.get(pass_name))))
            if len(examples) < examples_kept:
                examples.append({"prompt": user_text(rollout["prompt"]), "answer": rollout["row"].get("answer"),
                                 "completion": rollout["completion"], "rewards": values, "tool_calls": calls[-1]})
        log(f"eval ({mode}, with tools): {min(first + len(batch), len(rows)) // k}/{prompts} prompts")
    n = len(rows)
    passed_prompts = sum(any(passed[i:i + k]) for i in range(0, n, k))
    rewards = {name: (sum(v) / len(v) if v else None) for name, v in per_reward.items()}
    rewards["reward"] = sum(totals) / len(totals) if totals else None
    tools = {"calls_per_completion": sum(calls) / n, "completions_calling": sum(1 for c in calls if c) / n,
             "failures_per_call": failed / sum(calls) if sum(calls) else None,
             "calls_distribution": {k: sum(1 for c in calls if _bucket(c) == k) / n for k in ("0", "1", "2", "3+")},
             "call_outcomes": outcomes(kinds, sum(calls), failed)}
    return {"pass@k": passed_prompts / prompts, "passed_prompts": passed_prompts, "mean": sum(passed) / n, "rewards": rewards,
            "examples": examples, "tools": tools, "pass_reward": pass_name}


def _trainer(recipe, model, tokenizer, rows: list[dict], funcs: list, out_dir: str, sample: bool = False):
    """A GRPOTrainer that only generates: greedy (or sampled as training samples: the recipe's temperature, top_p,
    top_k, min_p), one completion per row, no reference model, no logging; its generation as a run's
    (grpokit.trainer.generation)."""
    from datasets import Dataset

    from grpokit.config.trainer_args import grpo_args
    from grpokit.trainer.generation import PrefixReuseGRPOTrainer
    from grpokit.tools.tooluse import resolve

    decoding = {**(recipe.trainer.get("generation_kwargs") or {})}
    if not sample:
        decoding.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    knobs = {**recipe.trainer, "output_dir": out_dir, "beta": 0.0, "num_generations_eval": 1,
             "generation_kwargs": decoding, "report_to": [], "eval_strategy": "no", "use_vllm": False}
    args = grpo_args(replace(recipe, trainer=knobs))
    toolset = resolve(recipe.tools)
    trainer = PrefixReuseGRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=Dataset.from_list(rows),
                                     processing_class=tokenizer, reuse_prefix=recipe.sampling.get("reuse_prefix", True),
                                     **toolset.trainer_kwargs())
    trainer.model.eval()  # TRL reads the mode from the model: eval uses num_generations_eval
    return trainer


def _bucket(calls: int) -> str:
    return str(calls) if calls < 3 else "3+"


# How a call ended, in the order `--eval` prints them: an environment's own record (the Python tool's), or, for one
# that keeps none, TRL's count of failed calls; then the calls the model wrote that TRL could not parse.
OUTCOMES = {"ok": "ok", "error": "code error", "timeout": "timeout", "crash": "crash", "failed": "failed",
            "unparseable": "unparseable"}


def outcomes(kinds: dict, calls: int, failed: float) -> dict:
    """Calls by how they ended: `kinds` as the environments recorded them (`call_kinds`), or, where they recorded no
    call of the `calls` TRL ran, "ok" and "failed" from TRL's failed calls (`failed`, summed over the batches).

    >>> outcomes({"unparseable": 1}, 4, 1.0), outcomes({"ok": 2, "timeout": 1}, 3, 1.0)
    ({'ok': 3, 'failed': 1, 'unparseable': 1}, {'ok': 2, 'timeout': 1})
    """
    if calls and not any(k != "unparseable" for k in kinds):
        kinds = {"ok": calls - round(failed), "failed": round(failed), **kinds}
    return {k: kinds[k] for k in [*OUTCOMES, *kinds] if kinds.get(k)}


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
