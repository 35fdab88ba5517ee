"""Generation engines on one GPU capped at 16 GiB, next to the memory plan: transformers generate, transformers
continuous batching, vLLM colocated with sleep mode off and on.

    python bench/gpu_generation.py                      # every engine, under a 16 GiB cap; < 8 min on an H200
    python bench/gpu_generation.py --engines hf,vllm-sleep --out $OUT
    python bench/gpu_generation.py --dry-run            # CPU, tiny shape: the whole path but vLLM, measures no GPU
    python bench/gpu_generation.py --wheels             # the wheels a GPU machine without internet needs

One shipped recipe at its real shape (`--recipe`, default recipes/qwen2.5-1.5b/dapo-vllm.yaml): its
architecture from the shipped config.json with random bf16 weights (saved once to a temporary folder, since
vLLM loads from disk), a word-level tokenizer built here over the model's whole vocabulary (nothing is
downloaded), prompts of the recipe's `max_prompt_tokens`, and the recipe's GRPOConfig (generation batch,
`max_completion_length`, LoRA) with only the engine changed. Random weights almost never sample the end
token, so every completion runs to full length: the work is the planned batch's. Each engine runs in its own
process (vLLM cannot be torn down in-process), capped with `torch.cuda.set_per_process_memory_fraction`;
vLLM's `gpu_memory_utilization` is a share of the whole card, so the recipe's share of 16 GiB is rescaled to
the card's total. Per engine, for `--generations` generation batches of TRL's `GRPOTrainer` (the first is warm-up):
completion tokens per second of generation, step time, `max_memory_allocated` / `max_memory_reserved` and the
device's used memory (`mem_get_info`, which also sees vLLM's own allocations), next to the plan's figure for
the same engine (`memory.plan_for` for transformers, `vllm_share.plan_for` for vLLM). Results go to
`<out>/gpu_generation-<date>.json` and `.md` after every engine.

Running it on the device machine: its image lacks trl, datasets, bitsandbytes and vLLM (see
bench/gpu_memory.py for packing the first three into .benchsite). vLLM 0.31.0 and what it pins (`--wheels`) are
far larger than the 64 MiB a run can carry: without them the vLLM engines are recorded as skipped and the
transformers engines still run. `PYTHONPATH=.benchsite:. python3 bench/gpu_generation.py --out $OUT`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT)]

from grpokit import files  # noqa: E402
from labs.outputs import add_commit_flag, results_dir  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

GIB = 2**30
ENGINES = {  # name -> the GRPOConfig knobs that pick it
    "hf": {"use_vllm": False},
    "cb": {"use_vllm": False, "use_transformers_continuous_batching": True},
    "vllm": {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": False},
    "vllm-sleep": {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": True},
}
SECONDS_ESTIMATE = {"hf": 90, "cb": 90, "vllm": 150, "vllm-sleep": 160}  # on an H200, to skip what cannot finish
# What a GPU machine without internet needs beyond torch, transformers, accelerate and peft (the device image).
WHEELS = ["trl==1.16.0", "vllm==0.31.0", "datasets", "bitsandbytes", "transformers>=5.10.4,<5.18 (vLLM 0.31.0's pin)"]
DRY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           vocab_size=512, max_position_embeddings=512, bos_token_id=0, eos_token_id=0)


def build_model(recipe, folder: Path, dry: bool) -> tuple[Path, dict]:
    """The recipe's architecture with random weights and a word-level tokenizer over its whole vocabulary."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    from grpokit.planning.architecture import load_model_config

    raw, _ = load_model_config(recipe.model["name_or_path"])
    raw = {k: v for k, v in raw.items() if not k.startswith("_")} | (DRY if dry else {})
    config = AutoConfig.for_model(**{**raw, "torch_dtype": "float32" if dry else "bfloat16"})
    config.tie_word_embeddings = raw.get("tie_word_embeddings", False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32 if dry else torch.bfloat16)
    model.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t0", pad_token="t2", unk_token="t1")
    fast.save_pretrained(folder)
    return folder, raw


def run_engine(engine: str, recipe_path: str, model_dir: str, generations: int, cap_gib: float, dry: bool) -> dict:
    """One engine in this process: the recipe's trainer on the random model, timed and measured."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpokit.config import load, validate
    from grpokit.config.trainer_args import grpo_args
    from grpokit.planning import memory, vllm_share

    cuda = torch.cuda.is_available() and not dry
    total = torch.cuda.get_device_properties(0).total_memory if cuda else 16 * GIB
    if cuda:
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GIB / total))
    recipe = validate(load(Path(recipe_path), ["sampling.dynamic=false"]))
    args = grpo_args(recipe)
    P = recipe.dataset.get("max_prompt_tokens") or 256
    knobs = dict(recipe.trainer) | ENGINES[engine] | dict(output_dir=tempfile.mkdtemp(prefix="gpu_generation-"),
                                    report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
                                    gradient_checkpointing=True, use_cpu=not cuda, bf16=cuda, fp16=False,
                                    lr_scheduler_type="constant", warmup_steps=0)
    if dry:
        P = 16
        knobs |= dict(max_completion_length=16, per_device_train_batch_size=4, gradient_accumulation_steps=1,
                      steps_per_generation=2, num_generations=4, optim="adamw_torch", vllm_max_model_length=32)
    updates = knobs.get("steps_per_generation") or knobs["gradient_accumulation_steps"]
    steps = max(1, generations * updates // knobs["gradient_accumulation_steps"])  # optimizer steps for the generations
    knobs["max_steps"] = steps
    if engine.startswith("vllm"):  # the recipe's share of a 16 GiB card, as a share of this card
        knobs["vllm_gpu_memory_utilization"] = args.vllm_gpu_memory_utilization * cap_gib * GIB / total
    plan_args = GRPOConfig(**{**knobs, "use_vllm": engine.startswith("vllm"),
                              "vllm_gpu_memory_utilization": args.vllm_gpu_memory_utilization, "use_cpu": True,
                              "bf16": False})
    model = {"name_or_path": model_dir if dry else recipe.model["name_or_path"], **{
        k: v for k, v in recipe.model.items() if k != "name_or_path"}}
    planner = vllm_share.plan_for if engine.startswith("vllm") else memory.plan_for
    plan = planner(plan_args, model=model, lora=recipe.lora, prompt_length=P, gpu_memory_gb=cap_gib)
    rng = __import__("random").Random(0)
    n_prompts = knobs["per_device_train_batch_size"] * updates // knobs["num_generations"] * (generations + 1)
    prompts = [" ".join(f"t{rng.randrange(3, 500 if dry else 150000)}" for _ in range(P)) for _ in range(n_prompts)]
    record = {"engine": engine, "knobs": {k: knobs[k] for k in ENGINES[engine] | {"vllm_gpu_memory_utilization": 0}
                                         if k in knobs},
              "plan": {"peak_gib": plan.total_gb, "allocated_gib": plan.allocated_gb, "phase": plan.peak.name,
                       "fits": plan.fits, "kv_capacity_tokens": plan.engine.capacity_tokens if plan.engine else None}}
    if engine.startswith("vllm"):
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            return record | {"status": f"skipped: vLLM is not importable here ({e}); {', '.join(WHEELS)}"}
    from peft import LoraConfig

    trainer = GRPOTrainer(model=model_dir, reward_funcs=[lambda completions, **kw: [rng.random() for _ in completions]],
                          args=GRPOConfig(**knobs), train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
                          processing_class=__import__("transformers").AutoTokenizer.from_pretrained(model_dir),
                          peft_config=LoraConfig(**{k: v for k, v in recipe.lora.items()}) if recipe.lora else None)
    gen, steps_t = [], []
    original = trainer._generate

    def timed_generate(prompts_):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = original(prompts_)
        if cuda:
            torch.cuda.synchronize()
        gen.append((time.perf_counter() - t, sum(len(ids) for ids in out[1])))
        return out

    trainer._generate = timed_generate
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            steps_t.append(time.perf_counter() - self.t)

    trainer.add_callback(Clock())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    status = "ok"
    try:
        trainer.train()
    except torch.OutOfMemoryError as e:
        status = f"OOM under the {cap_gib:g} GiB cap: {str(e).splitlines()[0][:200]}"
    measured = {"generation_calls": [{"seconds": s, "completion_tokens": n} for s, n in gen], "step_seconds": steps_t}
    warm = gen[1:] or gen
    if warm:
        measured["completion_tokens_per_s"] = sum(n for _, n in warm) / sum(s for s, _ in warm)
    after = steps_t[steps // generations:] or steps_t  # the steps of the generations after the warm-up one
    if after:
        measured["step_s"] = sum(after) / len(after)
    if cuda:
        free, card = torch.cuda.mem_get_info()
        measured |= {"max_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
                     "max_reserved_gib": torch.cuda.max_memory_reserved() / GIB, "device_used_gib": (card - free) / GIB}
    return record | {"status": status, "measured": measured}


def versions() -> dict:
    import torch
    import transformers
    import trl

    v = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    try:
        from importlib.metadata import version

        v["vllm"] = version("vllm")
    except Exception:  # noqa: BLE001 - absent is a fact to record
        v["vllm"] = None
    if torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name(0)
    return v


def outputs(out: Path, stem: str) -> list[Path]:
    """The results files a run writes: `<stem>.json` and `<stem>.md` in `out`."""
    return [out / f"{stem}.json", out / f"{stem}.md"]


def write(results: dict, out: Path, stem: str) -> None:
    check_outputs(outputs(out, stem))  # both, before either is written
    files.write_text(out / f"{stem}.json", json.dumps(results, indent=1, default=str) + "\n", key="--out")
    lines = [f"# Generation engines on {results['versions'].get('gpu', 'CPU (dry run)')}, capped at {results['cap_gib']:g} GiB "
             f"({results['date']}, {results['recipe']})", "", results["note"], "",
             "| engine | status | completion tok/s | step s | max allocated GiB | max reserved GiB | device used GiB | "
             "planned peak GiB (phase) | planned KV tokens |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results["engines"]:
        m, p = r.get("measured", {}), r["plan"]
        cell = lambda k, f="{:.2f}": f.format(m[k]) if k in m else "-"  # noqa: E731
        lines.append(f"| {r['engine']} | {r['status'][:60]} | {cell('completion_tokens_per_s', '{:.0f}')} | {cell('step_s')} | "
                     f"{cell('max_allocated_gib')} | {cell('max_reserved_gib')} | {cell('device_used_gib')} | "
                     f"{p['peak_gib']:.2f} ({p['phase']}) | {p['kv_capacity_tokens'] or '-'} |")
    files.write_text(out / f"{stem}.md", "\n".join(lines) + "\n", key="--out")


@one_line_exit
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "qwen2.5-1.5b" / "dapo-vllm.yaml"))
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--generations", type=int, default=2, help="generation batches per engine; the first is warm-up")
    ap.add_argument("--cap-gib", type=float, default=16.0)
    ap.add_argument("--budget-s", type=float, default=450, help="skip an engine that would end past this")
    ap.add_argument("--out", help="results folder (default runs/bench, bench/results with --commit-results; a temporary "
                                  "one for --dry-run)")
    add_commit_flag(ap)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape: the path of every engine but vLLM's run")
    ap.add_argument("--wheels", action="store_true", help="print what a GPU machine without internet must carry")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one engine in this process
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.wheels:
        print("\n".join(WHEELS))
        return 0
    if a.one:
        print("RESULT " + json.dumps(run_engine(a.one, a.recipe, a.model_dir, a.generations, a.cap_gib, a.dry_run), default=str))
        return 0
    import torch

    if not a.dry_run and not torch.cuda.is_available():
        ap.error("no CUDA device: run on a GPU, or pass --dry-run for the CPU path check")
    engines = [e for e in a.engines.split(",") if e]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        ap.error(f"unknown engine(s) {unknown}; choose from {', '.join(ENGINES)}")
    out = Path(a.out) if a.out else (Path(tempfile.mkdtemp(prefix="gpu_generation-dry-")) if a.dry_run else results_dir(a))
    stem = f"gpu_generation-{date.today().isoformat()}" + ("-dry-run" if a.dry_run else "")
    check_outputs(outputs(out, stem))  # before the model is built and any engine runs
    note = ("DRY RUN on CPU with a tiny shape: the path is exercised, nothing on a GPU is measured." if a.dry_run else
            f"Random weights of the recipe's architecture; {a.generations} generation batches per engine, the first warm-up.")
    from grpokit.config import load, validate

    recipe = validate(load(Path(a.recipe), ["sampling.dynamic=false"]))
    results = {"date": date.today().isoformat(), "versions": versions(), "cap_gib": a.cap_gib, "recipe": a.recipe,
               "note": note, "engines": []}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="gpu_generation-model-") as folder:
        model_dir, _ = build_model(recipe, Path(folder), a.dry_run)
        for engine in engines:
            if time.time() - t0 + (0 if a.dry_run else SECONDS_ESTIMATE[engine]) > a.budget_s:
                results["engines"].append({"engine": engine, "status": f"skipped: would not end within --budget-s {a.budget_s:g}",
                                           "plan": {"peak_gib": 0, "phase": "-", "kv_capacity_tokens": None}})
                continue
            cmd = [sys.executable, __file__, "--one", engine, "--recipe", a.recipe, "--model-dir", str(model_dir),
                   "--generations", str(a.generations), "--cap-gib", str(a.cap_gib)] + (["--dry-run"] if a.dry_run else [])
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            found = [line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            record = files.parse_json(found[-1], dict) if found else {  # the child's RESULT line
                "engine": engine, "status": f"failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}",
                "plan": {"peak_gib": 0, "phase": "-", "kv_capacity_tokens": None}}
            print(f"{engine}: {record['status']} {json.dumps(record.get('measured', {}), default=str)[:300]}", flush=True)
            results["engines"].append(record)
            write(results, out, stem)
    print(f"results: {out / stem}.json and .md")
    failed = [r for r in results["engines"] if not (r["status"] == "ok" or r["status"].startswith(("skipped", "OOM")))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
