"""`--eval`: score a recipe's base model, or a trained run, on the recipe's held-out split with its own rewards.

    python launch.py --recipe recipes/smollm2-135m/arithmetic.yaml --eval                  # the base model
    python launch.py --recipe recipes/smollm2-135m/arithmetic.yaml --eval runs/arithmetic  # adapter applied

Figures, all over the held-out prompts (`dataset.eval_path` or `dataset.eval_split`, first `eval_limit`):
- greedy pass@1: the share of prompts whose greedy completion *passes*. A completion passes when the
  recipe's `accuracy` reward (its first reward if it has none) is positive: 1.0 from a verifier, or the
  positive half of a shaped reward such as `cosine_scaled`; by `task_score` (a reasoning-gym task, when there is
  no `accuracy`) only at full credit, since its tasks pay partial credit for wrong answers.
- with `samples=K`: K completions per prompt sampled as training samples them (the recipe's temperature,
  top_p, top_k, min_p); pass@K is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
  Models Trained on Code", eq. 1) with n = k = K, i.e. the share of prompts with at least one passing
  sample; mean@K is the share of all samples that pass.
- the mean of each reward function, and of their weighted sum, over the greedy (and sampled) completions.
Completions are generated the way TRL's GRPOTrainer generates them (chat template with the generation
prompt, at most `trainer.max_completion_length` new tokens), so eval and training see the same prompts.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from grpokit import files
from grpokit.files import ownership
from grpokit.config import Recipe
from grpokit.dist import say
from grpokit.errors import Problem, RecipeError
from grpokit.checkpoints.rundir import BASE_EVAL_FILE, EVAL_FILE, WARM_EVAL_FILE

EXAMPLES = 4
PROMPTS_PER_BATCH = 16
# The K samples of one prompt are generated as one batch (`num_return_sequences=K`), so K bounds memory; pass@K is
# read at K up to ~100 (Chen et al. 2021 report pass@100), and 1,024 leaves room for more.
MAX_SAMPLES = 1024


def default_out(recipe: Recipe, run_dir: str | None) -> Path:
    """eval.json in the run directory; for a run's warm start (`RUN_DIR/warm_start`), eval-warm-start.json beside it in
    the run; for the base model, eval-base.json in the recipe's output_dir."""
    if run_dir and is_warm_start(run_dir):
        return Path(run_dir).parent / WARM_EVAL_FILE
    if run_dir:
        return Path(run_dir) / EVAL_FILE
    return Path(recipe.trainer["output_dir"]) / BASE_EVAL_FILE


def evaluate(recipe: Recipe, run_dir: str | None = None, samples: int = 0, out: str | None = None, log=say) -> dict:
    """Score the base model (no `run_dir`) or a trained run / checkpoint; write the figures as JSON.

    Returns the same dict that it writes. Raises `RecipeError` for a recipe without held-out data or a
    run directory that holds no trained model.
    """
    import rewards as registry

    from grpokit.config.trainer_args import grpo_args
    from grpokit.prompts.data import heldout_dataset
    from grpokit.trainer.models import load_tokenizer, model_source

    start = time.time()
    recipe_path = str(recipe.path)
    path = Path(out) if out else default_out(recipe, run_dir)
    trained = _check_inputs(recipe, run_dir, samples, path, chosen=bool(out))
    ownership.refuse_unless_replaceable([path], key="--eval-out" if out else str(path), recipe_path=recipe_path)  # before the work
    args = grpo_args(recipe)
    model_path, _ = model_source(recipe)
    warm = _warm_start(recipe, run_dir)
    model_path = str(warm) if warm else model_path
    tokenizer = load_tokenizer(run_dir if trained else model_path, recipe)
    prompts = heldout_dataset(recipe, tokenizer, log)
    names = [r["name"] for r in recipe.rewards]
    weights = [r["weight"] for r in recipe.rewards]
    funcs = [registry.build(r["name"], **r["args"]) for r in recipe.rewards]
    pass_index = next((names.index(n) for n in PASS_REWARDS if n in names), 0 if names else None)
    model = _load(model_path, run_dir, trained, recipe, log)

    rows = [dict(row) for row in prompts]
    log(f"eval: {len(rows)} held-out prompts, greedy" + (f", then {samples} samples each" if samples else "")
        + f"; at most {args.max_completion_length} new tokens" + (", tool calls run (TRL's loop)" if recipe.tools else ""))
    greedy, pass_name = _greedy(recipe, model, tokenizer, rows, funcs, names, weights, pass_index, args, str(path.parent), log)
    result: dict[str, Any] = {
        "recipe": recipe_path,
        "model": recipe.model["name_or_path"],
        **({"warm_start": str(warm)} if warm else {}),
        "run_dir": str(run_dir) if run_dir else None,
        "heldout": _heldout_name(recipe.dataset),
        "prompts": len(rows),
        "pass_reward": pass_name,
        "max_new_tokens": args.max_completion_length,
        "steps": run_steps(recipe, run_dir) if trained else None,
        "greedy": {"pass@1": greedy["pass@k"], "passed": greedy["passed_prompts"], "rewards": greedy["rewards"]},
        "measured": (f"greedy decoding of each held-out prompt; a completion passes when reward {pass_name!r} is "
                     f"{_pass_rule(pass_name)}; rewards are the recipe's own, unweighted means (reward = weighted sum)"),
    }
    if greedy.get("tools"):
        result["tools"] = greedy["tools"]
    if samples:
        result["sampled"] = _sampled_figures(recipe, model, tokenizer, rows, funcs, names, weights, pass_index, args,
                                             samples, str(path.parent), log)
    result["examples"] = greedy["examples"]
    result["seconds"] = round(time.time() - start, 1)
    files.write_text(path, json.dumps(result, indent=2) + "\n", key="--eval-out" if out else "", recipe_path=recipe_path)
    log(f"wrote {path}")
    return result


def _sampled_figures(recipe: Recipe, model, tokenizer, rows, funcs, names, weights, pass_index, args, samples: int,
                     out_dir: str, log) -> dict:
    """`samples` sampled completions of every held-out row at the run's sampling settings (seeded), scored: pass@k,
    mean@k, each reward's mean and, for a recipe with tools, how the calls of all k x prompts rollouts ended."""
    _seed(args.seed)
    sampled = _sampled(recipe, model, tokenizer, rows, funcs, names, weights, pass_index, args, samples, out_dir, log)
    figures = {"k": samples, f"pass@{samples}": sampled["pass@k"], f"mean@{samples}": sampled["mean"],
               "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "rewards": sampled["rewards"]}
    if sampled.get("tools"):  # over all K x prompts rollouts: does the policy ever call twice, fail, ...
        figures["tools"] = sampled["tools"]
    return figures


def _greedy(recipe: Recipe, model, tokenizer, rows, funcs, names, weights, pass_index, args, out_dir: str, log) -> tuple[dict, str]:
    """The greedy completion of every held-out row, scored, and the name of the reward that decides a pass. A recipe
    with tools rolls out through TRL's own multi-turn loop (grpokit.trainer.rollouts), where the environment's get_reward
    may decide the pass."""
    if not recipe.tools:
        return _score(model, tokenizer, rows, funcs, names, weights, pass_index, args, k=1, sample=False, log=log), names[pass_index]
    from grpokit.trainer import rollouts

    greedy = rollouts.score(recipe, model, tokenizer, rows, funcs, names, weights, pass_index, out_dir, log,
                            passes=passes, user_text=_user_text, examples_kept=EXAMPLES)
    return greedy, greedy["pass_reward"]


def _sampled(recipe: Recipe, model, tokenizer, rows, funcs, names, weights, pass_index, args, k: int, out_dir: str,
             log) -> dict:
    """K sampled completions of every held-out row, scored; a recipe with tools rolls each out through TRL's loop."""
    if not recipe.tools:
        return _score(model, tokenizer, rows, funcs, names, weights, pass_index, args, k=k, sample=True, log=log)
    from grpokit.trainer import rollouts

    return rollouts.score(recipe, model, tokenizer, rows, funcs, names, weights, pass_index, out_dir, log,
                          passes=passes, user_text=_user_text, examples_kept=0, k=k, sample=True)


# The reward that decides a pass, first found first: a verifier's 1.0, or a task's own full score.
PASS_REWARDS = ("accuracy", "task_score")


def passes(name: str, value) -> bool:
    """Whether one completion passes by reward `name`'s score: above 0, or for `task_score` full credit (its tasks pay
    partial credit for wrong answers: countdown 0.01 for any expression).

    >>> passes("accuracy", 1.0), passes("task_score", 0.43), passes("task_score", 1.0), passes("accuracy", None)
    (True, False, True, False)
    """
    return (value or 0) >= 1.0 if name == "task_score" else (value or 0) > 0


def _pass_rule(name: str) -> str:
    return "1.0 (full credit: its tasks pay partial credit for wrong answers)" if name == "task_score" else "positive"


def _heldout_name(dataset: dict) -> str:
    """How eval.json names the held-out data: its file, hub split, or generated tasks."""
    if dataset.get("reasoning_gym"):
        from grpokit.prompts import tasks

        source = dataset["reasoning_gym"]
        return f"{tasks.describe({**source, 'size': source['eval_size'], 'seed': tasks.eval_seed(source)})}, held out"
    return dataset.get("eval_path") or f"{dataset.get('name')}:{dataset.get('eval_split')}"


def summary(result: dict) -> str:
    """The last line `--eval` prints.

    >>> summary({"greedy": {"pass@1": 0.5, "passed": 24}, "prompts": 48, "pass_reward": "accuracy"})
    'pass@1 0.500 (24/48 held-out prompts, greedy; passes: accuracy > 0)'
    """
    g = result["greedy"]
    rule = ">= 1 (full credit)" if result["pass_reward"] == "task_score" else "> 0"
    line = f"pass@1 {g['pass@1']:.3f} ({g['passed']}/{result['prompts']} held-out prompts, greedy; passes: {result['pass_reward']} {rule})"
    tools = result.get("tools")
    if tools:
        line += (f"; tool calls per completion {tools['calls_per_completion']:.2f}, "
                 f"{tools['completions_calling']:.0%} of completions called a tool")
        line += "; " + outcomes_text(tools.get("call_outcomes") or {})
    s = result.get("sampled")
    if s:
        k = s["k"]
        line += f"; pass@{k} {s[f'pass@{k}']:.3f}, mean@{k} {s[f'mean@{k}']:.3f} (temperature {s['temperature']})"
        if s[f"pass@{k}"] < g["pass@1"]:  # not a fault: sampling can miss what the most likely tokens solve
            line += (f" -- pass@{k} under greedy pass@1: at temperature {s['temperature']} each token is drawn at random, "
                     f"so {k} samples can all miss a problem greedy decoding's most likely tokens solve")
        if s.get("tools"):
            share = s["tools"]["calls_distribution"]
            line += f"; sampled rollouts with 0/1/2/3+ calls {share['0']:.2f}/{share['1']:.2f}/{share['2']:.2f}/{share['3+']:.2f}"
            line += "; sampled " + outcomes_text(s["tools"].get("call_outcomes") or {})
    from grpokit.reporting.verdict import cut_short

    short = cut_short(result.get("steps"))
    return line + (f"; {short}" if short else "")


def outcomes_text(counts: dict) -> str:
    """Calls by how they ended (`rollouts.outcomes`), as `--eval` prints them.

    >>> outcomes_text({"ok": 5, "error": 2, "unparseable": 1}), outcomes_text({})
    ('calls by outcome: 5 ok, 2 code error, 1 unparseable', 'calls by outcome: none made')
    """
    from grpokit.trainer.rollouts import OUTCOMES

    said = [f"{n} {OUTCOMES.get(kind, kind)}" for kind, n in counts.items() if n]
    return "calls by outcome: " + (", ".join(said) or "none made")


def run_steps(recipe: Recipe, run_dir: str) -> dict | None:
    """The steps the scored model trained, the steps its run was to train (the larger of the state's own `max_steps` and
    the recipe's `trainer.max_steps`), the steps the run itself was set to (its state's `max_steps`: fewer than the
    recipe's after a `trainer.max_steps=N` override), and whether its run reached the planned ones:
    {"trained", "planned", "set", "run_finished"}; None
    when the folder holds no readable trainer state. A checkpoint's run is the folder above it: a checkpoint of a
    finished run is a point of it, one of a run that stopped early is the most that run reached."""
    from grpokit.checkpoints.rundir import STATE_FILE, read_state

    folder = Path(run_dir)
    state, _ = read_state(folder / STATE_FILE)
    if state is None:
        return None
    given = [n for n in (state.get("max_steps"), recipe.trainer.get("max_steps"))
             if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    planned = max(given) if given else None
    whole = read_state(folder.parent / STATE_FILE)[0] if folder.name.startswith("checkpoint-") else state
    finished = planned is None or (whole is not None and whole["global_step"] >= planned)
    own = state.get("max_steps")
    return {"trained": state["global_step"], "planned": planned,
            "set": own if isinstance(own, int) and not isinstance(own, bool) and own > 0 else None, "run_finished": finished}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c pass (Chen et al. 2021, eq. 1): 1 - C(n-c, k) / C(n, k).

    >>> pass_at_k(4, 0, 1), pass_at_k(4, 1, 1), pass_at_k(4, 1, 4)
    (0.0, 0.25, 1.0)
    """
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _seed(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def _warm_start(recipe: Recipe, run_dir: str | None):
    """The model a warm-start recipe's run trained from (grpokit.warm_start.section), which the run's adapter goes on; None
    without a warm start, and for the base model: its figures are the recipe's own model's, before any training (the
    warm start's are its own, `--eval RUN_DIR/warm_start`)."""
    from grpokit.warm_start import section as warmstart

    if not recipe.warm_start or not run_dir:
        return None
    return warmstart.of_run(run_dir)


def is_warm_start(run_dir) -> bool:
    """Whether `run_dir` is the warm start a run made (`RUN_DIR/warm_start`, whole): scored as a model of its own."""
    from grpokit.warm_start import section as warmstart

    return warmstart.made(Path(run_dir).parent) == Path(run_dir)


def _check_inputs(recipe: Recipe, run_dir: str | None, samples: int, out: Path, chosen: bool) -> str | None:
    """The run's kind ("adapter", "full", or None for the base model), after checking every input and output that can
    be checked without a model: a mistake found after the whole evaluation would throw its work away. The figures'
    own folder (`out` not `chosen` by --eval-out) is held to a run folder's rule: never `/`, the home directory or
    the recipe's folder."""
    from grpokit.run.merge import adapter_config_problem, output_path_problem
    from grpokit.checkpoints.rundir import forbidden_problems

    recipe_path = str(recipe.path)
    if not 0 <= samples <= MAX_SAMPLES:
        raise RecipeError([Problem("--eval-samples", "must be 0 (greedy only) or a number of samples per prompt",
                                   samples, f"0 to {MAX_SAMPLES}", file=recipe_path)])
    problems = [] if chosen else forbidden_problems(out.parent, recipe.path, recipe_path)
    if not recipe.dataset:
        problems.append(Problem("dataset", "--eval needs held-out prompts, and this recipe has no dataset (its "
                                "tools.environment makes the prompts); add a dataset section with held-out data "
                                "(dataset.path and dataset.eval_path)", file=recipe_path))
    if not chosen and run_dir:
        problems = [Problem("--eval", p.message, run_dir, file=recipe_path) for p in problems]
    problem = output_path_problem(out, "file")
    if problem:
        problems.append(Problem("--eval-out", problem, str(out), file=recipe_path))
    trained = _trained_kind(run_dir, recipe_path) if run_dir else None
    if trained == "adapter":
        problem = adapter_config_problem(Path(run_dir))
        if problem:
            problems.append(Problem("--eval", problem, run_dir, file=recipe_path))
    if problems:
        raise RecipeError(problems)
    return trained


def _trained_kind(run_dir: str, recipe_path: str) -> str:
    path = Path(run_dir)
    if (path / "adapter_config.json").is_file():
        return "adapter"
    if (path / "config.json").is_file():
        return "full"
    raise RecipeError([Problem("--eval", "is not a trained run or checkpoint (it has no adapter_config.json or config.json)",
                               run_dir, file=recipe_path)])


def _load(model_path: str, run_dir: str | None, trained: str | None, recipe: Recipe, log):
    """The base model, with the run's LoRA adapter applied (or the run's full weights), in eval mode."""
    import torch

    from grpokit.trainer.models import load_model

    log(f"loading model: {run_dir if trained == 'full' else model_path}" + (f" + adapter {run_dir}" if trained == "adapter" else ""))
    model = load_model(run_dir if trained == "full" else model_path, recipe)
    if trained == "adapter":
        model = _with_adapter(model, run_dir, quantized=recipe.model.get("quantization", "none") != "none")
    if torch.cuda.is_available() and recipe.model.get("quantization", "none") == "none":
        model = model.to("cuda")
    return model.eval()


def _with_adapter(model, run_dir: str, quantized: bool):
    """The base with the run's LoRA adapter: merged into the weights when the base is not quantized, so generation
    runs plain matmuls instead of every adapted layer's base + dropout + A + B each decode step (the same outputs up
    to rounding); a quantized base keeps the adapter apart (merging into 4/8-bit weights re-quantizes them)."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(model, run_dir)
    return model if quantized else model.merge_and_unload()


def prompt_text(tokenizer, prompt) -> str:
    """The prompt as the trainer feeds it: chat template plus the assistant's generation prompt."""
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return prompt


def generate_ids(model, tokenizer, rows: list[dict], args, k: int, sample: bool) -> list[list[list[int]]]:
    """For each row, k completions as token ids, each cut after its first end-of-sequence token."""
    import torch

    texts = [prompt_text(tokenizer, row["prompt"]) for row in rows]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    finally:
        tokenizer.padding_side = side
    kwargs: dict[str, Any] = dict(max_new_tokens=args.max_completion_length, pad_token_id=tokenizer.pad_token_id,
                                  num_return_sequences=k, do_sample=sample)
    if sample:
        kwargs.update(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k or None, min_p=args.min_p,
                      repetition_penalty=args.repetition_penalty)
    else:  # greedy: drop the sampling knobs a model's generation_config may carry, or generate warns
        kwargs.update(temperature=None, top_p=None, top_k=None)
    with torch.no_grad():
        out = model.generate(**enc, **kwargs)
    new = out[:, enc["input_ids"].shape[1]:].tolist()
    eos = _eos_ids(model, tokenizer)
    cut = []
    for ids in new:
        end = next((i for i, t in enumerate(ids) if t in eos), None)
        cut.append(ids if end is None else ids[: end + 1])
    return [cut[i * k : (i + 1) * k] for i in range(len(rows))]


def _eos_ids(model, tokenizer) -> set[int]:
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _score(model, tokenizer, rows, funcs, names, weights, pass_index, args, k: int, sample: bool, log) -> dict:
    """Generate k completions per row, reward them all with the recipe's rewards (TRL's calling convention)."""
    per_reward: list[list[float]] = [[] for _ in names]
    totals: list[float] = []
    passed_prompts, passed_samples, examples = 0, 0, []
    mode = f"{k} samples" if sample else "greedy"
    for first in range(0, len(rows), max(1, PROMPTS_PER_BATCH // k)):
        batch = rows[first : first + max(1, PROMPTS_PER_BATCH // k)]
        ids = generate_ids(model, tokenizer, batch, args, k, sample)
        flat_rows = [row for row in batch for _ in range(k)]
        flat_ids = [c for group in ids for c in group]
        texts = tokenizer.batch_decode(flat_ids, skip_special_tokens=True)
        conversational = isinstance(batch[0]["prompt"], list)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        columns = {key: [row[key] for row in flat_rows] for key in flat_rows[0] if key != "prompt"}
        scores = [f(prompts=[row["prompt"] for row in flat_rows], completions=completions, completion_ids=flat_ids,
                    trainer_state=None, **columns) for f in funcs]
        for j, values in enumerate(scores):
            per_reward[j] += [v for v in values if v is not None]
        for i in range(len(flat_rows)):
            totals.append(sum(w * s[i] for w, s in zip(weights, scores) if s[i] is not None))
        for p in range(len(batch)):
            c = sum(1 for i in range(p * k, (p + 1) * k) if passes(names[pass_index], scores[pass_index][i]))
            passed_samples += c
            passed_prompts += pass_at_k(k, c, k) == 1.0
            if len(examples) < EXAMPLES:
                examples.append({"prompt": _user_text(batch[p]["prompt"]), "answer": batch[p].get("answer"),
                                 "completion": texts[p * k], "rewards": {n: s[p * k] for n, s in zip(names, scores)}})
        log(f"eval ({mode}): {min(first + len(batch), len(rows))}/{len(rows)} prompts")
    n = len(rows)
    rewards = {name: (sum(v) / len(v) if v else None) for name, v in zip(names, per_reward)}
    rewards["reward"] = sum(totals) / len(totals) if totals else None
    return {"pass@k": passed_prompts / n, "passed_prompts": passed_prompts, "mean": passed_samples / (n * k),
            "rewards": rewards, "examples": examples}


def _user_text(prompt) -> str:
    if isinstance(prompt, list):
        return next((m["content"] for m in reversed(prompt) if m.get("role") == "user"), str(prompt))
    return prompt
