"""Measure the peak GPU memory of real GRPO steps next to what `grpokit.planning.memory` plans for them.

    python bench/gpu_memory.py                          # every case, under a 16 GiB cap; ~8 min on an H200
    python bench/gpu_memory.py --cases 3b-lora,7b-qlora --out $OUT
    python bench/gpu_memory.py --dry-run                # CPU, tiny config: checks the logic, measures nothing

For each case: a random-weight model of a shipped architecture (the shipped config.json, bf16 on the GPU;
4-bit NF4 loaded through `from_pretrained` with the same BitsAndBytesConfig as `grpokit.models.load_model`),
the process capped at 16 GiB with `torch.cuda.set_per_process_memory_fraction`, and `--steps` real
optimizer steps of TRL's `GRPOTrainer` with completions forced to full length (`min_new_tokens` =
`max_completion_length`). `max_memory_allocated` / `max_memory_reserved` are read separately for the
generation phase (around `generate`) and the training phase (from the end of one generation to the next),
and written next to the plan's figures to `<out>/gpu_memory-<date>.json` and `.md` after every case, so a
run cut short still leaves its results.

Why a synthetic tokenizer: the model's vocabulary is the real one (151936 / 152064 rows), so the LM head
and the logits are the real size; a word-level tokenizer with one entry per row (`w<id>`) makes every
sampled id decodable, and prompts of exactly `prompt_length` tokens (less a few on some prompts, so the
batch is left-padded and attention runs with a padding mask, as with real data).

Running it on the device machine (its image has torch, transformers, accelerate and peft, but not trl,
datasets or bitsandbytes): here, once, `echo /.benchsite/ >> .git/info/exclude` and
`python bench/gpu_memory.py --pack-deps .benchsite`, which copies trl, datasets, dill and bitsandbytes (its
CUDA 13.0 library only) from this venv. multiprocess is version-specific: add the cp312 wheel's contents
(`pip download --no-deps --python-version 3.12 --only-binary=:all: multiprocess==0.70.18 -d /tmp/w` and
unzip it into .benchsite). Then run with carry [".benchsite"] and
`PYTHONPATH=.benchsite:. PYTHONUNBUFFERED=1 python3 bench/gpu_memory.py --out $OUT`, timeout_s 560.
If datasets refuses the image's pyarrow, pack an older datasets (TRL 1.16 needs >= 4.7).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere: grpokit is the repo's
from grpokit.config.sections import LORA_DEFAULTS  # noqa: E402
from grpokit.models import quantization_config  # noqa: E402
from grpokit.planning import architecture, memory  # noqa: E402

GIB = memory.GIB
LORA = {k: v for k, v in LORA_DEFAULTS.items() if k != "task_type"}  # a recipe's `lora:` with grpokit's defaults
TINY = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False)


@dataclass
class Case:
    name: str
    model: str
    quantization: str = "none"
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 4  # one generation batch (B x 4 = 32 = 4 prompts x 8) per optimizer step
    num_generations: int = 8
    max_completion_length: int = 1024
    prompt_length: int = 256
    optim: str = "adamw_bnb_8bit"
    lora: dict = field(default_factory=lambda: dict(LORA))
    seconds_estimate: int = 120  # to skip a case that cannot finish inside --budget-s

    @property
    def generation_batch(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps


# Most important first: a run cut short by the time budget still answers "do 3B LoRA and 7B QLoRA fit".
CASES = [
    Case("3b-lora", "Qwen/Qwen2.5-3B-Instruct", seconds_estimate=140),
    Case("7b-qlora", "Qwen/Qwen2.5-7B-Instruct", quantization="4bit", per_device_train_batch_size=4,
         gradient_accumulation_steps=8, seconds_estimate=220),
    Case("1.5b-lora", "Qwen/Qwen2.5-1.5B-Instruct", seconds_estimate=90),
    Case("0.5b-lora", "Qwen/Qwen2.5-0.5B-Instruct", seconds_estimate=70),
]


class Meter:
    """Peak memory per phase on CUDA; on CPU (dry run) the same calls, recording zeros."""

    def __init__(self, cap_gib: float):
        import torch

        self.torch, self.cuda = torch, torch.cuda.is_available()
        self.cap = cap_gib * GIB
        self.marks: list[dict] = []
        self.context = 0

    def start(self):
        """Cap the allocator and forget earlier peaks; the CUDA context is what the driver uses beyond it."""
        self.marks = []
        if self.cuda:
            t = self.torch
            gc.collect()
            t.cuda.empty_cache()
            t.cuda.synchronize()
            free, total = t.cuda.mem_get_info()
            self.context = (total - free) - t.cuda.memory_reserved()
            t.cuda.set_per_process_memory_fraction(min(1.0, self.cap / total))
            t.cuda.reset_peak_memory_stats()

    def mark(self, phase: str):
        """Close the phase that just ended: record its peaks, start the next from zero."""
        alloc = reserved = 0
        if self.cuda:
            self.torch.cuda.synchronize()
            alloc, reserved = self.torch.cuda.max_memory_allocated(), self.torch.cuda.max_memory_reserved()
            self.torch.cuda.reset_peak_memory_stats()
        self.marks.append({"phase": phase, "allocated": alloc, "reserved": reserved})

    def stop(self):
        if self.cuda:
            self.torch.cuda.set_per_process_memory_fraction(1.0)


def build_tokenizer(vocab_size: int):
    """A word-level tokenizer with one token per model row: `<pad>` = 0, `<eos>` = 1, `w<i>` for the rest."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<pad>")


def build_dataset(case: Case, steps: int, vocab_size: int, seed: int = 0):
    """Prompts of prompt_length tokens and a few shorter, so each batch is left-padded to prompt_length."""
    import random

    from datasets import Dataset

    rng = random.Random(seed)
    n = steps * case.generation_batch // case.num_generations + 4
    lengths = [max(1, case.prompt_length - 8 * (i % 4)) for i in range(n)]  # every 4 prompts hold a full one
    return Dataset.from_dict({"prompt": [" ".join(f"w{rng.randrange(2, vocab_size)}" for _ in range(k)) for k in lengths]})


def noisy_reward(completions, **kwargs) -> list[float]:
    """A reward with some spread, so advantages are not all zero; its value does not move memory."""
    import random

    return [random.random() for _ in completions]


def build_model(config: dict, case: Case, workdir: Path):
    """Random weights of the architecture; 4-bit goes through save + from_pretrained, as a real QLoRA load."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    cfg = AutoConfig.for_model(**{**config, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": None})
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    if case.quantization != "none":
        path = workdir / "random-model"
        model.save_pretrained(path)
        del model
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            quant = quantization_config(case.quantization, dtype)  # exactly what a grpokit run loads
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, quantization_config=quant, device_map={"": 0})
        else:  # the dry run exercises the same save/load path without bitsandbytes
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        shutil.rmtree(path, ignore_errors=True)
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    model.generation_config.bos_token_id = None
    return model


def run_case(case: Case, config: dict, steps: int, meter: Meter, workdir: Path) -> dict:
    import torch
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    cuda = torch.cuda.is_available()
    started = time.time()
    model = build_model(config, case, workdir)
    tokenizer = build_tokenizer(config["vocab_size"])
    args = GRPOConfig(
        output_dir=str(workdir / "out"), max_steps=steps, per_device_train_batch_size=case.per_device_train_batch_size,
        gradient_accumulation_steps=case.gradient_accumulation_steps, num_generations=case.num_generations,
        max_completion_length=case.max_completion_length,
        generation_kwargs={"min_new_tokens": case.max_completion_length},  # every completion is full length
        optim=case.optim, learning_rate=1e-5, beta=0.0, gradient_checkpointing=True,
        bf16=cuda, use_cpu=not cuda, logging_steps=1, save_strategy="no", report_to=[], shuffle_dataset=False,
        seed=0, disable_tqdm=True,
    )
    meter.start()
    trainer = GRPOTrainer(model=model, reward_funcs=[noisy_reward], args=args,
                          train_dataset=build_dataset(case, steps, config["vocab_size"]), processing_class=tokenizer,
                          peft_config=LoraConfig(task_type="CAUSAL_LM", **case.lora) if case.lora else None)
    # TRL generates with accelerator.unwrap_model(model_wrapped), which on one process is trainer.model itself
    target = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    original = target.generate
    lengths = []

    def generate(*a, **k):
        meter.mark("training" if meter.marks else "setup")
        out = original(*a, **k)
        meter.mark("generation")
        lengths.append(out.shape[1] - k["input_ids"].shape[1])
        return out

    target.generate = generate
    status = "ok"
    try:
        trainer.train()
        meter.mark("training")
    except torch.OutOfMemoryError as e:  # under the cap: the verdict the plan should have given
        meter.mark("oom")
        status = f"OOM under the {meter.cap / GIB:g} GiB cap: {str(e).splitlines()[0][:200]}"
    finally:
        target.generate = original
        del trainer, model
        gc.collect()
        meter.stop()
    generations = sum(m["phase"] == "generation" for m in meter.marks)
    if status == "ok" and generations != steps:
        status = f"logic error: {generations} generations for {steps} steps"
    if status == "ok" and any(n != case.max_completion_length for n in lengths):
        status = f"completions not full length: {sorted(set(lengths))}"
    return {"status": status, "seconds": round(time.time() - started, 1), "context_bytes": meter.context,
            "marks": meter.marks, "completion_lengths": sorted(set(lengths))}


def compare(case: Case, config: dict, measured: dict, cap_gib: float) -> dict:
    """The plan for the same settings, and its error against the measurement, per phase and at the peak."""
    p = memory.plan(config, model=case.model, dtype="bfloat16", quantization=case.quantization, lora=case.lora,
                    optim=case.optim, beta=0.0, gradient_checkpointing=True,
                    per_device_train_batch_size=case.per_device_train_batch_size,
                    num_generations=case.num_generations, generation_batch_size=case.generation_batch,
                    prompt_length=case.prompt_length, max_completion_length=case.max_completion_length,
                    gpu_memory_gb=cap_gib)
    marks = measured["marks"]

    def peak(phase, key):  # the phase's highest mark over the measured steps
        return max((m[key] for m in marks if m["phase"] == phase), default=0)

    out = {"plan": p.as_dict(), "phases": {}}
    for phase in p.phases:
        alloc = peak(phase.name, "allocated")
        out["phases"][phase.name] = {
            "plan_gib": phase.bytes / GIB, "allocated_gib": alloc / GIB, "reserved_gib": peak(phase.name, "reserved") / GIB,
            "error": (phase.bytes - alloc) / alloc if alloc else None}
    alloc = max(m["allocated"] for m in marks) if marks else 0
    reserved = max(m["reserved"] for m in marks) if marks else 0
    out["peak"] = {"plan_allocated_gib": p.allocated_gb, "allocated_gib": alloc / GIB,
                   "error": (p.allocated_gb * GIB - alloc) / alloc if alloc else None,
                   "plan_total_gib": p.total_gb, "reserved_plus_context_gib": (reserved + measured["context_bytes"]) / GIB,
                   "plan_fits": p.fits, "fits_under_cap": measured["status"] == "ok"}
    return out


def versions() -> dict:
    import importlib.metadata as md

    import torch

    v = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for pkg in ("transformers", "trl", "peft", "accelerate", "bitsandbytes", "datasets"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            v[pkg] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        v["gpu"], v["gpu_memory_gib"] = props.name, round(props.total_memory / GIB, 1)
    return v


def write(results: dict, out: Path, stem: str):
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    lines = [f"# GPU memory of GRPO steps vs grpokit.planning.memory's plan ({results['date']})", "",
             f"{results['note']}", "", "Versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()), "",
             "| case | settings | status | plan gen / train (GiB) | measured alloc gen / train (GiB) | peak error | "
             "reserved + context vs plan total (GiB) |", "|---|---|---|---|---|---|---|"]
    for r in results["cases"]:
        c = r["case"]
        settings = (f"{c['quantization']}, LoRA r{c['lora']['r']}, {c['optim']}, B {c['per_device_train_batch_size']}, "
                    f"G {c['per_device_train_batch_size'] * c['gradient_accumulation_steps']}, "
                    f"{c['prompt_length']}+{c['max_completion_length']} tok")
        if "comparison" not in r:
            lines.append(f"| {c['name']} | {settings} | {r['status']} | | | | |")
            continue
        ph, pk = r["comparison"]["phases"], r["comparison"]["peak"]
        err = f"{pk['error']:+.0%}" if pk["error"] is not None else "n/a"
        lines.append(f"| {c['name']} | {settings} | {r['status']} | {ph['generation']['plan_gib']:.2f} / "
                     f"{ph['training']['plan_gib']:.2f} | {ph['generation']['allocated_gib']:.2f} / "
                     f"{ph['training']['allocated_gib']:.2f} | {err} | {pk['reserved_plus_context_gib']:.2f} vs "
                     f"{pk['plan_total_gib']:.2f} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def pack_deps(target: Path):
    """Copy what the device image lacks (trl, datasets, dill, bitsandbytes for CUDA 13.0) into `target`."""
    import importlib.util

    target.mkdir(parents=True, exist_ok=True)
    for name in ("trl", "datasets", "dill", "bitsandbytes"):
        src = Path(importlib.util.find_spec(name).origin).parent
        dst = target / name
        shutil.rmtree(dst, ignore_errors=True)
        keep_so = ("libbitsandbytes_cuda130.so", "libbitsandbytes_cpu.so")
        shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n == "__pycache__" or (
            n.startswith("libbitsandbytes_") and n not in keep_so)])
        for info in src.parent.glob(f"{name}-*.dist-info"):  # so importlib.metadata reports the version
            shutil.copytree(info, target / info.name, dirs_exist_ok=True)
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    print(f"packed into {target}: {size / 2**20:.0f} MiB; add multiprocess for Python 3.12 (see the docstring)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(c.name for c in CASES), help="comma-separated, from: "
                    + ", ".join(c.name for c in CASES))
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per case (one generation each)")
    ap.add_argument("--cap-gib", type=float, default=16.0, help="the card to emulate")
    ap.add_argument("--budget-s", type=float, default=470, help="start no case that cannot end within this")
    ap.add_argument("--out", help="results folder (default bench/results; a temporary one for --dry-run)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny config, short sequences: logic only")
    ap.add_argument("--pack-deps", metavar="DIR", help="copy the packages the device image lacks into DIR, and stop")
    a = ap.parse_args(argv)
    if a.pack_deps:
        pack_deps(Path(a.pack_deps))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here downloads: random weights, shipped configs
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    names = a.cases.split(",")
    unknown = [n for n in names if n not in {c.name for c in CASES}]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(c.name for c in CASES)}")
    if not a.dry_run and not torch.cuda.is_available():
        ap.error("no CUDA device: run on a GPU, or pass --dry-run for the CPU logic check")
    out = Path(a.out) if a.out else (Path(tempfile.mkdtemp(prefix="gpu_memory-dry-")) if a.dry_run
                                    else Path(__file__).parent / "results")
    stem = f"gpu_memory-{date.today().isoformat()}" + ("-dry-run" if a.dry_run else "")
    note = ("DRY RUN on CPU with a tiny config: logic check only, no memory measured." if a.dry_run else
            f"Measured with random weights under a {a.cap_gib:g} GiB cap (set_per_process_memory_fraction); "
            "completions forced to max_completion_length; plan = grpokit.planning.memory for the same settings.")
    results = {"date": date.today().isoformat(), "versions": versions(), "cap_gib": a.cap_gib, "steps": a.steps,
               "note": note, "cases": []}
    meter, t0 = Meter(a.cap_gib), time.time()
    for case in (c for c in CASES if c.name in names):
        config, _ = architecture.load_model_config(case.model)
        if a.dry_run:
            config = dict(TINY)
            case = replace(case, max_completion_length=16, prompt_length=16, seconds_estimate=0, optim="adamw_torch")
        record = {"case": asdict(case)}
        if time.time() - t0 + case.seconds_estimate > a.budget_s:
            record["status"] = f"skipped: would not end within --budget-s {a.budget_s:g}"
        else:
            print(f"[{time.time() - t0:5.0f}s] {case.name}: {case.model} ({case.quantization}), "
                  f"B {case.per_device_train_batch_size}, G {case.generation_batch}", flush=True)
            with tempfile.TemporaryDirectory(prefix=f"bench-{case.name}-") as tmp:
                try:
                    measured = run_case(case, config, a.steps, meter, Path(tmp))
                except Exception as e:  # record and go on: one broken case must not lose the others
                    measured = {"status": f"error: {type(e).__name__}: {e}"[:400], "marks": [], "context_bytes": 0}
            record.update(measured)
            if measured["marks"]:
                record["comparison"] = compare(case, config, measured, a.cap_gib)
            print(f"         {record['status']}; " + (json.dumps(record["comparison"]["peak"]) if "comparison" in record else ""),
                  flush=True)
        results["cases"].append(record)
        write(results, out, stem)
    print(f"results: {out / stem}.json and .md")
    bad = [r for r in results["cases"] if not (r["status"] == "ok" or r["status"].startswith(("skipped", "OOM")))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
