"""What a recipe actually computes, in the terms of the papers it follows, read from its resolved `GRPOConfig`.

    >>> from trl import GRPOConfig
    >>> args = GRPOConfig(output_dir="/tmp/x", use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=8,
    ...                   loss_type="dapo", epsilon_high=0.28)
    >>> dict(explain(args, rewards=[], sampling={}, lora=None, model={}))["clip range"]
    '[1 - ε, 1 + ε_high] = [0.8, 1.28]: clip-higher (DAPO), ε_high 0.28 > ε 0.2'

Every row is built from the config's values, never from the recipe's name, so it stays true when a knob
is overridden on the command line. The semantics are TRL 1.16's (`GRPOTrainer._compute_loss` and
`_generate_and_score_completions`); the papers are named where a row follows one (DeepSeekMath's GRPO objective,
DAPO, Dr. GRPO, GSPO). The labels eq. 8.1 (group-relative advantage), 8.2 (clipped objective) and 8.3 (k3 KL
estimator) are defined in docs/grpo.md, "GRPO in one screen", where a user can look them up.
"""

from __future__ import annotations

OVERLONG = "overlong_penalty"


def _g(x) -> str:
    return f"{x:g}"


def advantage(args) -> str:
    g = args.num_generations
    if args.multi_objective_aggregation == "normalize_then_sum":
        return (f"each reward normalised per group first, (r_k - mean) / (std + 1e-4) over the {g} completions "
                "of a prompt (eq. 8.1 per reward), then the weighted sum re-normalised over the whole batch "
                "(multi_objective_aggregation=normalize_then_sum, GDPO); scale_rewards is not used")
    base = f"over the {g} completions of each prompt, r = weighted sum of the rewards"
    return {
        "group": f"GRPO (DeepSeekMath), eq. 8.1: A_i = (r_i - mean(r)) / (std(r) + 1e-4) {base} (scale_rewards=group)",
        "none": f"Dr. GRPO: A_i = r_i - mean(r), no division by std {base} (scale_rewards=none): "
                "no up-weighting of near-unanimous groups",
        "batch": f"A_i = (r_i - mean(r)) / std of r over the whole batch, mean per group {base} "
                 "(scale_rewards=batch, PPO-Lite)",
    }[args.scale_rewards]


def aggregation(args) -> str:
    t = args.loss_type
    return {
        "grpo": "per sequence: mean over each completion's tokens, then over completions (loss_type=grpo); "
                "length bias: a token of a short completion weighs more than one of a long completion",
        "bnpo": "per token over the local micro-batch: sum of token losses / completion tokens in that "
                "micro-batch (loss_type=bnpo)",
        "dapo": "per token over the global accumulated batch: sum of token losses / completion tokens in the "
                "whole generation batch (loss_type=dapo); no length bias",
        "dr_grpo": f"sum of token losses / (completions x {args.max_completion_length}), a constant "
                   "max_completion_length (loss_type=dr_grpo, Dr. GRPO); no length bias",
        "cispo": "CISPO: -clip(ratio, max=ε_high).detach() x A x log π_θ per token, over the global batch "
                 "(loss_type=cispo, MiniMax-M1)",
        "sapo": f"SAPO: a sigmoid gate on the ratio instead of a clip (τ+ {_g(args.sapo_temperature_pos)}, "
                f"τ- {_g(args.sapo_temperature_neg)}), then per-sequence mean like grpo (loss_type=sapo)",
        "luspo": "LUSPO: each sequence's loss summed over its tokens (scaled by its length), mean over "
                 "sequences (loss_type=luspo, a length-unbiased GSPO)",
        "vespo": f"VESPO: Gamma-shaped weights of the sequence ratio in place of clipping (k+ "
                 f"{_g(args.vespo_k_pos)}, λ+ {_g(args.vespo_lambda_pos)}, k- {_g(args.vespo_k_neg)}, "
                 f"λ- {_g(args.vespo_lambda_neg)}), per token over the global batch (loss_type=vespo)",
    }.get(t, f"loss_type={t} (not described by grpokit)")


def clip_range(args) -> str:
    eps = args.epsilon
    high = args.epsilon_high if args.epsilon_high is not None else eps
    if args.loss_type == "cispo":
        return f"no PPO clip: the importance weight is capped at ε_high = {_g(high)} (CISPO)"
    if args.loss_type in ("sapo", "vespo"):
        return f"no hard clip ({args.loss_type} weights the ratio smoothly instead)"
    lo, hi = round(1 - eps, 6), round(1 + high, 6)
    text = f"[1 - ε, 1 + ε_high] = [{_g(lo)}, {_g(hi)}]"
    if high > eps:
        text += f": clip-higher (DAPO), ε_high {_g(high)} > ε {_g(eps)}"
    elif high < eps:
        text += f": asymmetric, ε_high {_g(high)} < ε {_g(eps)}"
    else:
        text += f": symmetric, ε = {_g(eps)}"
    if args.delta is not None:
        text += f"; two-sided: the ratio is also capped at δ = {_g(args.delta)} (INTELLECT-2)"
    return text


def kl(args, lora, model) -> str:
    if args.beta == 0:
        return "none: β = 0, so no KL term and no reference model is loaded"
    text = (f"β = {_g(args.beta)} x k3 (eq. 8.3, the estimator DeepSeekMath's GRPO uses) = ρ - 1 - log ρ per token, "
            "ρ = π_ref / π_θ")
    if args.use_bias_correction_kl:
        text += ", times the importance ratio (use_bias_correction_kl)"
    if lora:
        return text + "; reference: the base model with the LoRA adapter disabled (no extra memory)"
    return text + f"; reference: a full second copy of the policy{_copy_cost(model)}" + (
        f", pulled toward the policy every {args.ref_model_sync_steps} steps (α {_g(args.ref_model_mixup_alpha)}, "
        "TR-DPO)" if args.sync_ref_model else "")


def _copy_cost(model) -> str:
    """' (5.75 GiB of weights)' from the memory planner, or '' when the architecture is not reachable offline."""
    from grpokit.planning import memory
    from grpokit.planning.architecture import ConfigNotFound, load_model_config

    if not model or not model.get("name_or_path"):
        return ""
    try:
        config, _ = load_model_config(model["name_or_path"])
        weights, _ = memory.weight_bytes(config, memory.planned_dtype(model), model.get("quantization", "none"))
    except (ConfigNotFound, ValueError) as e:
        return f" (its size is unknown: {str(e).split(';')[0]})"
    return f", {weights / memory.GIB:.2f} GiB more GPU memory (estimated from the architecture)"


def updates_per_generation(args) -> float:
    """Optimizer steps taken on one generation batch: TRL generates every steps_per_generation x num_iterations
    micro-steps and steps the optimizer every gradient_accumulation_steps (below 1: several generations per step).

    >>> from types import SimpleNamespace as NS
    >>> updates_per_generation(NS(steps_per_generation=8, num_iterations=1, gradient_accumulation_steps=2))
    4.0
    """
    return args.steps_per_generation * args.num_iterations / args.gradient_accumulation_steps


def importance_sampling(args) -> str:
    # TRL's own test (`_generate_and_score_completions`): old log-probs are needed only when a generation
    # batch outlives one optimizer step
    on_policy = args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) == 0
    # the verdict (whether the clip binds) leads, so a line cut to the screen's width keeps it (grpokit.run.check.fit)
    where = ("on-policy here, the clip never binds: π_old = π_θ, the ratio is 1 in value (gradient_accumulation_steps "
             f"{args.gradient_accumulation_steps} is a multiple of steps_per_generation {args.steps_per_generation} x "
             f"num_iterations {args.num_iterations})"
             if on_policy else
             f"off-policy here, the clip range binds: {_g(round(updates_per_generation(args), 3))} optimizer steps per "
             f"generation batch (steps_per_generation {args.steps_per_generation} x num_iterations "
             f"{args.num_iterations} / gradient_accumulation_steps {args.gradient_accumulation_steps}); after the "
             "first, π_θ has moved away from π_old (the policy that sampled), so the ratio leaves 1")
    if args.importance_sampling_level == "sequence":
        return f"per sequence (GSPO), {where}; ρ = exp(mean over tokens of log π_θ/π_old), one ratio per completion"
    return f"per token, {where}; ρ_t = π_θ(o_t) / π_old(o_t)"


def truncation(args) -> str:
    if args.mask_truncated_completions:
        return (f"masked: completions cut at {args.max_completion_length} tokens without EOS add no loss "
                "(DAPO), though their rewards still enter their group's mean and std")
    return f"kept: completions cut at {args.max_completion_length} tokens are trained on like any other"


def reward_rows(rewards: list[dict]) -> list[tuple[str, str]]:
    def show(r):
        args = ", ".join(f"{k}={v}" for k, v in sorted((r.get("args") or {}).items()))
        where, sep, fn = r["name"].rpartition(":")  # a user reward file: its name, not this machine's absolute path
        name = f"{where.rsplit('/', 1)[-1]}:{fn}" if sep and where.endswith(".py") else r["name"]
        return f"{_g(float(r.get('weight', 1.0)))} x {name}" + (f" ({args})" if args else "")

    rows = [("rewards", " + ".join(show(r) for r in rewards) if rewards else "none")]
    for r in rewards:
        if r["name"] == OVERLONG:
            a = r.get("args") or {}
            m, buf, p = a.get("max_length"), a.get("buffer"), a.get("penalty_factor", 1.0)
            if m is not None and buf is not None:
                rows.append(("overlong penalty", f"window ({m - buf}, {m}] tokens: 0 up to {m - buf}, then a linear "
                                                 f"ramp down to -{_g(p)} at {m} (DAPO eq. 13)"))
    return rows


def dynamic_sampling(sampling: dict) -> str:
    if not sampling or not sampling.get("dynamic"):
        return "off: a group whose completions all score the same gets A = 0 (no gradient) and keeps its slot"
    return (f"on (DAPO): groups with zero spread of {sampling.get('metric', 'reward')!r} are dropped and more prompts "
            f"generated, up to {sampling.get('max_rounds', 4)} rounds per batch")


def generation_engine(args) -> str:
    """Which code generates the completions (TRL 1.16's `_generate_single_turn`)."""
    if args.use_vllm and args.vllm_mode == "colocate":
        return (f"vLLM, colocated: started in this training process on this GPU, inside vllm_gpu_memory_utilization "
                f"{_g(args.vllm_gpu_memory_utilization)} of the card (its own weight copy, workspace and paged KV "
                f"cache); it schedules up to 4096 tokens per engine step and all {args.per_device_train_batch_size * args.steps_per_generation} "
                "sequences of a generation batch at once (max_num_seqs), max_model_len "
                + (str(args.vllm_max_model_length) if args.vllm_max_model_length else "the model's context"))
    if args.use_vllm:
        where = args.vllm_server_base_url or f"{args.vllm_server_host}:{args.vllm_server_port}"
        return f"vLLM server at {where} (trl vllm-serve on another GPU): prompts go out, completions come back"
    if args.use_transformers_continuous_batching:
        return "transformers continuous batching (paged KV cache, sequences join and leave the batch as they finish)"
    return ("transformers generate: the generation batch decoded together, its KV cache growing to prompt + "
            "completion for every sequence until the longest finishes")


def own_passes_rows(args, sampling: dict, model: dict) -> list[tuple[str, str]]:
    """Which method computes the loss pass and generation for this model (grpokit.trainer.ownpasses), when a model is named."""
    if not (model or {}).get("name_or_path"):
        return []
    from grpokit.trainer import ownpasses

    return [("own passes", ownpasses.explain(args, sampling or {}, model))]


def engine_rows(args, lora, model) -> list[tuple[str, str]]:
    """Sleep mode, weight sync and TRL's importance-sampling correction, for a recipe that generates with vLLM."""
    if not args.use_vllm:
        return []
    rows = []
    colocate = args.vllm_mode == "colocate"
    if colocate:
        rows.append(("vLLM sleep mode", (
            "on (level 2): after start-up and after every generation vLLM frees its weights and KV cache, so training "
            "has the memory; before each generation the weights are woken and re-pushed, then the KV cache woken"
            if args.vllm_enable_sleep_mode else
            "off: vLLM keeps its weights and KV cache on the GPU while the trainer trains")))
    merge = ("the LoRA adapter is merged into the base weights, every weight is pushed to vLLM, then unmerged"
             + (" (PEFT dequantizes and re-quantizes a 4-bit base to merge: it warns of rounding)" if lora and
                (model or {}).get("quantization") == "4bit" else "")
             if lora else "every weight is pushed to vLLM")
    per = updates_per_generation(args)
    when = ("every generation here (at least one optimizer step between two generations)" if per >= 1 else
            f"one generation in {_g(round(1 / per, 3))} here (several generations per optimizer step)")
    rows.append(("weight sync", (
        f"at the first generation after each optimizer step, {when}: {merge}, "
        + ("in place on this GPU" if colocate else "over NCCL to the server"))))
    if args.vllm_importance_sampling_correction:
        mode = args.vllm_importance_sampling_mode
        level = "per sequence (the product of its token ratios)" if mode.startswith("sequence") else "per token"
        lo, hi = args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max
        bounds = f"[{_g(lo) if lo is not None else '-inf'}, {_g(hi) if hi is not None else 'inf'}]"
        act = (f"masked out of the loss outside {bounds}" if mode.endswith("mask") else f"clipped to {bounds}")
        rows.append(("vLLM importance sampling", (
            "corrects for vLLM sampling from slightly different probabilities than the trainer computes (other "
            "kernels, its own numerics): TRL re-scores each completion with the trainer (a no-grad forward of the "
            f"generation batch) and weights its loss by π_θ / π_vLLM {level}, {act} ({mode})")))
    else:
        rows.append(("vLLM importance sampling", "off: completions are trained on as if the trainer had sampled them, "
                                                 "though vLLM's probabilities differ slightly from the trainer's"))
    return rows


def explain(args, *, rewards: list[dict], sampling: dict, lora: dict | None, model: dict) -> list[tuple[str, str]]:
    """(term, what the resolved config computes) rows; `args` is a real `trl.GRPOConfig`."""
    rows = [
        ("advantage", advantage(args)),
        ("aggregation", aggregation(args)),
        ("clip range", clip_range(args)),
        ("KL", kl(args, lora, model)),
        ("importance sampling", importance_sampling(args)),
        ("truncated completions", truncation(args)),
        *reward_rows(rewards),
        ("dynamic sampling", dynamic_sampling(sampling)),
        ("generation engine", generation_engine(args)),
        *engine_rows(args, lora, model),
        *own_passes_rows(args, sampling, model),
    ]
    if args.top_entropy_quantile < 1.0:
        rows.append(("entropy mask", f"only the top {_g(args.top_entropy_quantile)} of tokens by entropy carry the "
                                     "policy loss (80/20 rule)"))
    if args.entropy_coef or args.use_adaptive_entropy:
        rows.append(("entropy bonus", f"- {_g(args.entropy_coef)} x mean token entropy"
                                      + (" (adaptive)" if args.use_adaptive_entropy else "")))
    return rows


def render(rows: list[tuple[str, str]]) -> list[str]:
    """Lines of a two-column table."""
    width = max(len(term) for term, _ in rows)
    return [f"  {term:<{width}}  {text}" for term, text in rows]


def explain_table(recipe, args) -> list[str]:
    """What a validated recipe computes, from its real `GRPOConfig` `args`, as table lines (--check and report.md)."""
    rows = explain(args, rewards=recipe.rewards, sampling=recipe.sampling, lora=recipe.lora, model=recipe.model)
    if (getattr(recipe, "tools", None) or {}).get("environment"):  # TRL adds the environment's own reward to the list (grpokit/tools/tooluse.py)
        rows = [(term, f"{text}; plus the environment's get_reward() where it defines one (weight 1: see tool use)")
                if term == "rewards" else (term, text) for term, text in rows]
    return render(rows)


def what_it_learns(rewards: list[dict], source: str, args, environment: str | None = None) -> str:
    """One sentence for the console as training starts: what the model is trained to do, in the rewards' own words
    (each registered reward's summary), and what one step does with them.

    >>> from types import SimpleNamespace as S
    >>> print(what_it_learns([{"name": "char_fraction", "args": {"char": "a"}}], "smoke.jsonl",
    ...                      S(per_device_train_batch_size=8, gradient_accumulation_steps=1, num_generations=4)))
    what it learns: to write completions for the prompts of smoke.jsonl that score high on char_fraction (char=a: fraction of the completion's characters equal to `char` (0.0 for an empty completion)). Each step samples 4 completions for each of 2 prompts, scores them, and moves the model towards the better ones of each group (GRPO)
    """
    import rewards as registry

    def said(r: dict) -> str:
        name = r["name"].rpartition(":")[2]  # a user reward's function, not its file's path
        args = ", ".join(f"{k}={v}" for k, v in sorted((r.get("args") or {}).items()))
        try:
            summary = registry.entry(r["name"]).summary.rstrip(".")
            if summary[1:2].islower():  # "Fraction of ..." reads on in a sentence; "DAPO's ..." keeps its capitals
                summary = summary[0].lower() + summary[1:]
        except registry.RewardNameError:  # a user's reward: its name is what the recipe says of it
            summary = ""
        detail = f"{args}: {summary}" if args and summary else args or summary
        return f"{name} ({detail})" if detail else name

    scored = [said(r) for r in rewards] + ([f"{environment}'s get_reward()"] if environment else [])
    batch = args.per_device_train_batch_size * args.gradient_accumulation_steps
    return (f"what it learns: to write completions for the prompts of {source} that score high on "
            f"{' + '.join(scored) or 'its rewards'}. Each step samples {args.num_generations} completions for each of "
            f"{batch // args.num_generations} prompts, scores them, and moves the model towards the better ones of "
            "each group (GRPO)")
