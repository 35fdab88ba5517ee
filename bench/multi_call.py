"""Several tool calls a rollout, learned by GRPO from a warm start: recipes/smollm2-135m/multi_call.yaml (issue 39).

    nice -n 10 .venv/bin/python bench/multi_call.py --warm-start --threads 2    # the warm start, and its sampled calls
    nice -n 10 .venv/bin/python bench/multi_call.py --seeds 0 1 2 --threads 2   # GRPO from it, 3 seeds, scored
    .venv/bin/python bench/multi_call.py --report-only                          # the page from results/multi_call.json

SmolLM2-135M-Instruct never makes a second tool call when sampled (results/sampled_calls.json: 0 in 192 rollouts),
so GRPO on problems that want two gets groups that all score alike and learns nothing. The warm start -- what ReTool
and DeepSeek-R1 run before RL -- is a short supervised pass over worked exchanges: the recipe's own system prompt and
tools, a problem, `multiply(a, b)`, its result, `multiply(result, c)`, its result, the answer; rendered by the recipe's
chat template exactly as TRL's tool loop renders a rollout, with the loss on the assistant's turns only (the tool
results are the environment's, as GRPO masks them). Its problems are reasoning-gym's `products` from seeds
WARM_SEED.. -- apart from training's and the held-out set's, checked question by question. The warm start is kept
light (few examples, few steps): it shows the format, and GRPO has what it samples to sharpen.

`--warm-start` trains a LoRA adapter on those exchanges (float32), merges it and saves a plain model to
results/multi_call_runs/warm_start-<settings>/ (made whole or not at all; an existing one is reused), then samples
its calls as `bench/sampled_calls.py` does. The seeds then run `bench/tool_use.py --recipe multi_call`: the shipped
recipe with `model.name_or_path` set to the warm start (a copy in results/multi_call_runs/, the only change),
trained and scored by `bench/real_model.py --once`; the "base" row is the warm start. Writes
results/multi_call.json (the seeds'), results/multi_call_warm_start.json (the warm start: how it was made and its
sampled calls) and bench/README.md's section.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import yaml

from offline import ROOT  # noqa: E402  (before grpokit: no hub, grpokit from this checkout)

from grpokit import files  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

RECIPE = ROOT / "recipes" / "smollm2-135m" / "multi_call.yaml"
RESULTS = ROOT / "bench" / "results"
RUNS = RESULTS / "multi_call_runs"
WARM_RESULTS = RESULTS / "multi_call_warm_start.json"
README = ROOT / "bench" / "README.md"
WARM_BEGIN = "<!-- multi_call.py writes this table from results/multi_call_warm_start.json -->"
WARM_END = "<!-- end of multi_call.py's table -->"
WARMED_RECIPE = RUNS / "multi_call.yaml"  # the shipped recipe, model.name_or_path set to the warm start
WARM_SEED = 100_000  # the warm start's problems: seeds WARM_SEED.., far from training's 1..400 and held-out 401..464
TUNE_SEED = 200_000  # the problems a warm start's sampled calls are counted on: neither training's nor held-out
FACTORS = re.compile(r"(\d+) \* (\d+) \* (\d+)")


def recipe_with(overrides: list[str]):
    from grpokit.config import load, validate

    return validate(load(str(RECIPE), overrides))


def problems(source: dict, seed: int, size: int) -> list[dict]:
    """reasoning-gym's problems of the recipe's task (problem i from seed + i, as grpokit draws them)."""
    import reasoning_gym

    (task,) = source["tasks"]
    return list(reasoning_gym.create_dataset(task["name"], **task.get("config", {}), seed=seed, size=size))


def exchange(system: str, question: str) -> list[dict]:
    """A worked rollout in TRL's message form: two multiply calls, their results (what the Calculator returns, as TRL
    writes a result: str), the answer."""
    a, b, c = map(int, FACTORS.search(question).groups())

    def call(x: int, y: int) -> dict:
        return {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": x, "b": y}}}]}

    return [{"role": "system", "content": system}, {"role": "user", "content": question},
            call(a, b), {"role": "tool", "name": "multiply", "content": str(a * b)},
            call(a * b, c), {"role": "tool", "name": "multiply", "content": str(a * b * c)},
            {"role": "assistant", "content": str(a * b * c)}]


def tokens_and_labels(tokenizer, messages: list[dict], tools: list) -> tuple[list[int], list[int]]:
    """The conversation's tokens as the chat template renders it, and labels: the assistant turns' own tokens (their
    role header excluded, their end marker included), -100 elsewhere. Each turn's span is the difference between
    renderings of the conversation up to it, which must extend one another (checked)."""
    def render(upto: int, prompt: bool) -> list[int]:
        return tokenizer.apply_chat_template(messages[:upto], tools=tools, tokenize=True, return_dict=False,
                                             add_generation_prompt=prompt)

    ids = render(len(messages), False)
    labels = [-100] * len(ids)
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start, end = len(render(k, True)), len(render(k + 1, False))
        if ids[:end] != render(k + 1, False):
            raise ValueError("the chat template renders a conversation's start differently from its whole: the "
                             "turns' spans cannot be found")
        labels[start:end] = ids[start:end]
    return ids, labels


def warm_start_dir(opts) -> Path:
    lr = f"{opts.warm_lr:g}"
    return RUNS / f"warm_start-n{opts.warm_examples}-steps{opts.warm_steps}-lr{lr}-seed{opts.warm_seed}"


def make_warm_start(opts, target: Path) -> dict:
    """Train, merge and save the warm start into `target` (whole or not at all); what was done, for the results."""
    import torch
    from peft import LoraConfig, get_peft_model

    from grpokit import models, tooluse

    recipe = recipe_with(["model.dtype=float32"])
    path, _ = models.model_source(recipe)
    tokenizer = models.load_tokenizer(path, recipe)
    model = models.load_model(path, recipe)
    toolset = tooluse.resolve(recipe.tools)
    tools = [tooluse.tool_view(toolset.environment, name) for name in toolset.methods()]
    source = recipe.dataset["reasoning_gym"]
    made = problems(source, WARM_SEED, opts.warm_examples)
    seen = {p["question"] for p in problems(source, source["seed"], source["size"])}
    seen |= {p["question"] for p in problems(source, source["seed"] + source["size"], source["eval_size"])}
    overlap = [p["question"] for p in made if p["question"] in seen]
    if overlap:
        raise SystemExit(f"warm start: {len(overlap)} of its problems are training's or held-out ones, e.g. {overlap[0]!r}")
    rows = [tokens_and_labels(tokenizer, exchange(recipe.dataset["system_prompt"], p["question"]), tools) for p in made]
    torch.manual_seed(opts.warm_seed)
    lora = recipe.lora
    model = get_peft_model(model, LoraConfig(r=lora["r"], lora_alpha=lora["lora_alpha"], lora_dropout=0.0,
                                             target_modules=lora["target_modules"], task_type="CAUSAL_LM"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=opts.warm_lr)
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(opts.warm_seed)).tolist()
    losses, started = [], time.perf_counter()
    model.train()
    for step in range(opts.warm_steps):
        batch = [rows[order[(step * opts.warm_batch + j) % len(rows)]] for j in range(opts.warm_batch)]
        width = max(len(ids) for ids, _ in batch)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch])
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 4))
        print(f"warm start step {step + 1}/{opts.warm_steps}: loss {losses[-1]:.3f}", flush=True)
    merged = model.merge_and_unload()

    def save(tmp: Path) -> None:
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    files.build_folder(target, save)
    return {"examples": opts.warm_examples, "problems": f"reasoning-gym products, seeds {WARM_SEED}.."
            f"{WARM_SEED + opts.warm_examples - 1} (none of training's or the held-out set's)",
            "steps": opts.warm_steps, "batch": opts.warm_batch, "learning_rate": opts.warm_lr, "seed": opts.warm_seed,
            "adapter": f"LoRA r={lora['r']}, alpha {lora['lora_alpha']}, {lora['target_modules']}, float32, merged",
            "loss": losses, "seconds": round(time.perf_counter() - started, 1),
            "tokens_per_example": round(sum(len(ids) for ids, _ in rows) / len(rows)),
            "trained_tokens_per_example": round(sum(sum(1 for x in lab if x != -100) for _, lab in rows) / len(rows))}


def record(name: str, model: str, made: dict | None, opts) -> None:
    """Sample `model`'s calls on the recipe's tuning prompts and keep them, with how it was made, under `name`."""
    import sampled_calls

    row = sampled_calls.sample(RECIPE, [f"model.name_or_path={model}", f"dataset.reasoning_gym.eval_seed={TUNE_SEED}"],
                               opts.prompts, opts.samples, opts.threads)
    print(f"{name}, sampled: {sampled_calls.described(row)}", flush=True)
    tried = files.try_json(WARM_RESULTS, dict)[0] or {}
    tried.setdefault("warm_starts", {})
    tried["machine"], tried["when"] = f"{platform.machine()}, {os.cpu_count()} CPUs", time.strftime("%Y-%m-%d")
    tried["warm_starts"][name] = {
        "made": made or tried["warm_starts"].get(name, {}).get("made"),
        "sampled": {"measured": f"launch.py --eval --eval-samples {opts.samples} on {opts.prompts} tuning prompts "
                                f"(seeds {TUNE_SEED}.., neither training's nor held-out), model.name_or_path = {model}",
                    "when": time.strftime("%Y-%m-%d"), **row}}
    files.write_text(WARM_RESULTS, json.dumps(tried, indent=2) + "\n")
    files.replace_section(README, WARM_BEGIN, WARM_END, warm_markdown(tried))


def warm_markdown(tried: dict) -> str:
    """The warm starts tried (and the base), each with its sampled calls on the tuning prompts."""
    rows = ["| model | worked exchanges seen: steps x batch, learning rate | last loss | sampled rollouts with 0 / 1 / 2 / "
            "3+ calls | right (mean@K) | pass@K | greedy pass@1 | measured |", "|---|---|---:|---|---:|---:|---:|---|"]
    sampled = {name: entry for name, entry in tried["warm_starts"].items() if entry.get("sampled")}

    def order(name: str) -> tuple[bool, int]:  # the recipe's own model first, then the warm starts by their steps
        steps = re.search(r"-steps(\d+)-", name)
        return name != "base", int(steps.group(1)) if steps else 0

    for name, entry in sorted(sampled.items(), key=lambda kv: order(kv[0])):
        made, got = entry.get("made"), entry["sampled"]
        k = next(key.split("@")[1] for key in got if key.startswith("pass@"))
        how = (f"{made['steps']} x {made['batch']}, {made['learning_rate']:g}" if made else
               "- (the recipe's own model)" if name == "base" else "- (made before its record was kept)")
        loss = f"{made['loss'][-1]:.3f}" if made else "-"
        dist = " / ".join(f"{got['calls_distribution'][c]:.2f}" for c in ("0", "1", "2", "3+"))
        rows.append(f"| {name} | {how} | {loss} | {dist} | {got['right']:.3f} | {got[f'pass@{k}']:.3f} | "
                    f"{got['greedy']['pass@1']:.3f} | {got.get('when', tried['when'])} |")
    first = next(iter(sampled.values()))["sampled"]
    k = int(next(key.split("@")[1] for key in first if key.startswith("pass@")))
    return "\n".join([f"Each model's calls, sampled as training samples them: `launch.py --eval --eval-samples {k}` on "
                       f"{first['completions'] // k} tuning prompts (reasoning-gym seeds {TUNE_SEED}.., neither training's "
                       f"nor held-out), {first['completions']} sampled rollouts a model, and its greedy pass@1 on the "
                       f"same prompts; {tried['machine']}:", "", *rows])


def write_warmed_recipe(warm: Path) -> None:
    """The shipped recipe with `model.name_or_path` set to the warm start: the only change."""
    data = yaml.safe_load(RECIPE.read_text())
    data["model"]["name_or_path"] = str(warm)
    text = (f"# {RECIPE.relative_to(ROOT)} as shipped, but model.name_or_path: the warm start "
            f"(bench/multi_call.py writes this copy)\n" + yaml.safe_dump(data, sort_keys=False))
    files.write_text(WARMED_RECIPE, text)


@one_line_exit
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warm-start", action="store_true", help="make the warm start and sample its calls")
    parser.add_argument("--base", action="store_true", help="sample the calls of the recipe's own model (no warm start)")
    parser.add_argument("--warm-examples", type=int, default=40, help="worked exchanges the warm start sees (cycled)")
    parser.add_argument("--warm-steps", type=int, default=10, help="its optimizer steps")
    parser.add_argument("--warm-batch", type=int, default=4, help="exchanges a step")
    parser.add_argument("--warm-lr", type=float, default=3e-4)
    parser.add_argument("--warm-seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=8, help="tuning prompts whose sampled calls are counted")
    parser.add_argument("--samples", type=int, default=8, help="sampled rollouts a prompt")
    parser.add_argument("--seeds", type=int, nargs="*", default=[], help="GRPO seeds to train from the warm start")
    parser.add_argument("--report-only", action="store_true", help="the page from results/multi_call.json")
    parser.add_argument("--threads", type=int, default=None)
    opts = parser.parse_args(argv)
    warm = warm_start_dir(opts)
    if opts.report_only:
        tried = files.read_json(WARM_RESULTS, dict)
        files.replace_section(README, WARM_BEGIN, WARM_END, warm_markdown(tried))
    if opts.warm_start or opts.base:
        check_outputs([WARM_RESULTS])
    if opts.base:
        record("base", yaml.safe_load(RECIPE.read_text())["model"]["name_or_path"], None, opts)
    if opts.warm_start:
        made = None
        if (warm / "config.json").is_file():
            print(f"warm start: reusing {warm.relative_to(ROOT)}", flush=True)
        else:
            made = make_warm_start(opts, warm)
        record(warm.name, str(warm), made, opts)
    if opts.seeds or opts.report_only:
        if not opts.report_only:
            if not (warm / "config.json").is_file():
                raise SystemExit(f"no warm start at {warm}: run with --warm-start first (same --warm-* settings)")
            write_warmed_recipe(warm)
        import tool_use

        return tool_use.main(["--recipe", "multi_call", *(["--report-only"] if opts.report_only else
                                                           ["--seeds", *map(str, opts.seeds)]),
                              *(["--threads", str(opts.threads)] if opts.threads else []),
                              "--how", f"GRPO from the warm start {warm.name} (results/{WARM_RESULTS.name})"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
