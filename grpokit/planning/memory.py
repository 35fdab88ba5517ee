"""Where the memory of one GRPO step goes, planned from the model's architecture before any weight loads.

    >>> config, source = load_model_config("Qwen/Qwen2.5-3B-Instruct")
    >>> p = plan(config, lora={"r": 16, "target_modules": "all-linear"}, optim="adamw_bnb_8bit",
    ...          per_device_train_batch_size=8, generation_batch_size=32, max_completion_length=1024)
    >>> p.fits, p.peak.name, p.peak.moment
    (True, 'training', 'backward')

Units are GiB (2**30 bytes). The card planned for, unless `--gpu-memory` says another, is the smallest common 16 GB
one, a T4: 15 GiB usable and no bfloat16 (`DEFAULT_CARD`). The passes planned are the ones that run: grpokit's own
(each distinct prompt once, the lead all prompts share once, tool rounds from kept keys and values:
`moments.loss_passes`) where they run, else TRL's. A step on TRL 1.16 (`GRPOTrainer`, transformers
generation, one process) is a sequence of moments (`grpokit.planning.moments`: prefill and last decode step;
layers forward, LM head forward and backward, layers backward, optimizer step); a phase's figure is the
highest of its moments and the peak the higher phase, never a sum of things that do not coexist.

How the figures were checked: `bench/plan_vs_measured.py` runs real GRPOTrainer steps on CPU under a
live-tensor counter (`grpokit.planning.measure`) and compares every phase with this plan for the same
settings; `validation_note()` quotes its committed result. What that cannot check -- the GPU's own kernels
(TRL's Triton head scores only completion tokens, in place), the CUDA caching allocator and context -- is
planned from the sources and stays labelled unmeasured until `bench/gpu_memory.py` has run on a GPU.

Assumptions, each checked against the TRL 1.16 / transformers 5 / PEFT / bitsandbytes sources:
- dtype `auto` plans as bfloat16 (what a GPU run uses). 4-bit is NF4 with double quantisation (as
  `grpokit.trainer.models.load_model` asks): 0.5 B/param + ~0.016 B/param of quant state for the decoder's linear
  layers; embeddings, lm_head, norms and biases stay 16-bit. 8-bit (LLM.int8) is 1 B/param + one fp32 scale
  per output row.
- LoRA adapters are fp32 on a bf16 base (PEFT's `autocast_adapter_dtype`), bf16 under QLoRA (TRL casts them).
- Optimizer states: torch AdamW keeps two states in the parameter's dtype; bitsandbytes 32-bit ones keep
  fp32 states (8 B/param for Adam); 8-bit ones 2 B/param plus a block scale per 256 values, except tensors
  under 4096 values (fp32, bnb's `min_8bit_size`) and `nn.Embedding`s, which HF Trainer overrides to 32-bit.
  No separate fp32 master copy: HF Trainer without DeepSpeed updates the parameters in their own dtype.
- The LM head is TRL 1.16's fused one (`add_fused_lm_head`): log-probs are computed in tiles of
  4096 tokens x 32768 vocab entries, so the full (tokens x vocab) logits -- the classic GRPO peak -- never
  exist; the unfused size is still printed, for comparison.
- `device`: cuda (the default: what the plan is for) or cpu, which runs other kernels -- the fused head
  without Triton scores every position and folds each tile with fp32 temporaries; AdamW defaults to its
  single-tensor path (foreach on CUDA).
- Runtime overhead on a GPU: 0.5 GiB of CUDA context (outside PyTorch's counters) + 10 % of the peak for
  the caching allocator's fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from grpokit import files
from grpokit.cpu import cpu_dtype
from grpokit.planning.architecture import largest_linear, layer_groups, load_model_config, lora_tensors, param_counts
from grpokit.planning.moments import DTYPE_BYTES, Component, Phase, Settings, adapter_bytes, step_moments

GIB = 1024**3
CONTEXT_BYTES = int(0.5 * GIB)  # CUDA context + cuBLAS/cuDNN handles: 0.3-0.6 GiB depending on card and driver
FRAGMENTATION = 0.10  # reserved-but-unused share of the caching allocator at peak
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit codes + 8-bit absmax per 64 + fp32 absmax per 256 absmax
BNB_8BIT_STATE = 1 + 4 / 256  # one byte per value + an fp32 block scale per 256 values
# optimizer name -> (states per param, bytes per state: "param" = the param's dtype), after TRL/transformers
_OPTIM = {
    **dict.fromkeys(("adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused",
                     "adamw_anyprecision", "stable_adamw", "grokadamw", "schedule_free_adamw",
                     "schedule_free_radam"), (2, "param")),
    **dict.fromkeys(("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit"), (2, "8bit")),
    **dict.fromkeys(("ademamix_8bit", "paged_ademamix_8bit"), (3, "8bit")),
    **dict.fromkeys(("lion_8bit", "paged_lion_8bit", "rmsprop_bnb_8bit"), (1, "8bit")),
    "paged_adamw_32bit": (2, 4), "ademamix": (3, 4), "paged_ademamix_32bit": (3, 4),
    **dict.fromkeys(("lion_32bit", "paged_lion_32bit", "rmsprop_bnb", "rmsprop_bnb_32bit"), (1, 4)),
    "adamw_torch_8bit": (2, 1), "adamw_torch_4bit": (2, 0.5),
    **dict.fromkeys(("adagrad", "rmsprop"), (1, "param")),
    **dict.fromkeys(("sgd", "schedule_free_sgd", "lomo", "adalomo", "adafactor"), (0, 4)),
}
_OPTIM_UNKNOWN = (2, 4)  # an optimizer not in the table is planned as AdamW-like with fp32 states


@dataclass(frozen=True)
class Card:
    """A GPU as the plan reads it: what it is called, the GiB a run can use on it, whether it computes bfloat16."""

    name: str
    gib: float
    bf16: bool


# The smallest common 16 GB card: a T4 (Colab's free GPU) shows 15 GiB with ECC on (nvidia-smi: 15360 MiB) and computes
# no bfloat16, so `auto` runs float16 there. The larger cards, by the memory their specifications give, less the same
# ~6 % a driver and ECC keep: figures to compare a plan with, not measurements.
DEFAULT_CARD = Card("T4 (16 GB, 15 GiB usable, float16)", 15.0, False)
CARDS = (DEFAULT_CARD, Card("L4 / A10G (24 GB)", 22.0, True), Card("A100 (40 GB)", 37.5, True),
         Card("A100 / H100 (80 GB)", 75.0, True))


def cards_that_fit(total_gib: float) -> str:
    """The smallest common card a plan of `total_gib` fits (with its name), or that none of them does."""
    fit = next((c for c in CARDS if c.gib >= total_gib), None)
    return f"fits a {fit.name} and larger" if fit else f"needs more than {CARDS[-1].name} offers"


# --------------------------------------------------------------------------------------------------
# The plan


@dataclass
class Plan:
    """Peak GPU memory of a GRPO step, by component and phase, with a verdict for the card."""

    model: str
    source: str
    settings: Settings
    phases: list[Phase]  # generation, training: each the highest of its moments
    moments: list[Phase] = field(default_factory=list)  # every moment planned, in step order
    suggestion: str | None = None
    notes: list[str] = field(default_factory=list)
    engine: object | None = None  # vllm_share.Share when vLLM generates in this process: its lines and start-up verdict

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def allocated_gb(self) -> float:
        """Peak of live tensors: comparable to `torch.cuda.max_memory_allocated`."""
        return self.peak.bytes / GIB

    @property
    def overhead_bytes(self) -> int:
        if self.settings.device == "cpu":  # host memory: no CUDA context, no caching allocator
            return 0
        # vLLM allocates its share in one piece (its KV cache is one tensor): fragmentation is the trainer's
        trainer = sum(c.bytes for c in self.peak.components if not c.vllm)
        return CONTEXT_BYTES + int(FRAGMENTATION * trainer)

    @property
    def total_gb(self) -> float:
        return (self.peak.bytes + self.overhead_bytes) / GIB

    @property
    def headroom_gb(self) -> float:
        return self.settings.gpu_memory_gb - self.total_gb

    @property
    def fits(self) -> bool:
        return self.headroom_gb >= 0 and not (self.engine is not None and self.engine.blocking())

    def as_dict(self) -> dict:
        return {"model": self.model, "source": self.source, "settings": self.settings.__dict__,
                "phases": {p.name: {"moment": p.moment, "gib": p.bytes / GIB,
                                    "components": {c.name: c.bytes / GIB for c in p.components}} for p in self.phases},
                "peak_phase": self.peak.name, "allocated_gib": self.allocated_gb, "total_gib": self.total_gb,
                "fits": self.fits, "headroom_gib": self.headroom_gb, "suggestion": self.suggestion}

    def render(self, full: bool = False) -> list[str]:
        """Lines of the plan: what it was planned for, the path planned, each phase with its largest components, the
        verdict; `full` adds the table (one row per component, one column per phase, how each was derived)."""
        s = self.settings
        base = {"4bit": f"4-bit NF4 base ({s.dtype} compute)", "8bit": f"8-bit base ({s.dtype} compute)"}.get(
            s.quantization, f"{s.dtype} base")
        how = (f"LoRA r={s.lora.get('r')} ({_targets_text(s.lora)})" if s.lora else "full fine-tune") + f" on a {base}"
        where = (f"a {s.card}" if s.card else f"a {s.gpu_memory_gb:g} GiB GPU") if s.device == "cuda" else \
            f"CPU (host memory; {s.gpu_memory_gb:g} GiB budget)"
        lines = [f"Memory plan: {self.model} on {where} -- from the architecture, not measured",
                 f"  {how}; {s.optim}; beta {s.beta:g}; checkpointing {'on' if s.gradient_checkpointing else 'off'}; "
                 f"B {s.per_device_train_batch_size} x (P {s.prompt_length} + C {s.max_completion_length}); generation "
                 f"{s.gen_batch} ({s.gen_batch // s.num_generations} x {s.num_generations})",
                 f"  path planned: {path_text(s)}"]
        weights = next((c for c in self.peak.components if c.name == "weights"), None)
        if self.source or weights is not None:
            size = weights.how.split(" x ")[0].split(" (")[0] if weights is not None else ""
            lines.append(f"  counted from {self.source or 'the given config'}" + (f": {size}" if size else ""))
        if full:
            lines += [f"  validation: {validation_note()}", *self._table()]
        else:
            for phase in self.phases:
                top = sorted((c for c in phase.components if c.bytes), key=lambda c: -c.bytes)[:3]
                lines.append(f"  {phase.name:<10} {_gib(phase.bytes):>9} at its {phase.moment}: "
                             + ", ".join(f"{c.name} {_gib(c.bytes)}" for c in top))
        blocked = self.engine.blocking() if self.engine is not None else None
        if self.engine is not None:
            lines += self.engine.render()
        verdict = (f"fits, headroom {self.headroom_gb:.1f} GiB" if self.fits else
                   f"does NOT fit: {blocked}; first knob to turn: {self.suggestion}" if blocked else
                   f"does NOT fit: {-self.headroom_gb:.1f} GiB short; first knob to turn: {self.suggestion}")
        overhead = " with CUDA's context and fragmentation" if s.device == "cuda" else ""
        lines.append(f"  peak {_gib(self.total_gb * GIB)}{overhead}, {self.peak.name} phase -> {verdict}")
        if s.device == "cuda" and s.card and not self.fits:
            lines.append(f"  on other cards: {cards_that_fit(self.total_gb)}")
        return lines + [f"  note: {n}" for n in self.notes]

    def _table(self) -> list[str]:
        """One row per component, one column per phase, and how each was derived (`--check --full`)."""
        lines = []
        names = list(dict.fromkeys(c.name for p in self.phases for c in p.components))
        lines.append(f"  {'component':<20}" + "".join(f"{p.name:>12}" for p in self.phases) + "   how")
        for name in names:
            cells = [next((c for c in p.components if c.name == name), None) for p in self.phases]
            hows = list(dict.fromkeys(c.how for c in cells if c is not None))
            lines.append(f"  {name:<20}" + "".join(f"{_gib(c.bytes) if c else '-':>12}" for c in cells)
                         + "   " + " | ".join(hows))
        lines.append(f"  {'phase total':<20}" + "".join(f"{_gib(p.bytes):>12}" for p in self.phases)
                     + "   peak within each phase: " + "; ".join(f"{p.name}: {p.moment}" for p in self.phases))
        if self.settings.device == "cuda":
            lines.append(f"  {'overhead':<20}{_gib(self.overhead_bytes):>12}   CUDA context {CONTEXT_BYTES / GIB:.1f} GiB"
                         f" + allocator fragmentation {FRAGMENTATION:.0%} of the peak phase")
        return lines


def path_text(s: Settings) -> str:
    """Which passes the plan describes, in a few words."""
    if not s.own_passes:
        return "TRL's passes (every copy of a prompt computed, in the loss pass and in generation)"
    lead = f", the {s.lead}-token lead once" if s.shared_lead else ""
    rounds = ", tool rounds from kept keys and values" if s.tool_rounds else ""
    return f"grpokit's passes: each distinct prompt once{lead}{rounds}"


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= 0.1 * GIB or n == 0 else f"{n / 2**20:.1f} MiB"


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} bn" if n >= 1e9 else f"{n / 1e6:.1f} M"


def _targets_text(lora: dict) -> str:
    t = lora.get("target_modules", "all-linear")
    return t if isinstance(t, str) else ",".join(t)


def _optimizer(s: Settings, tensors: list[tuple[int, bool]], param_bytes: int) -> tuple[int, str]:
    """Bytes of optimizer state for trainable tensors given as (numel, is_embedding)."""
    known = s.optim in _OPTIM
    states, per = _OPTIM.get(s.optim, _OPTIM_UNKNOWN)
    total = 0
    for numel, is_embedding in tensors:
        if per == "8bit":  # bnb: small tensors and (HF Trainer) embeddings get 32-bit states
            total += states * numel * (4 if numel < 4096 or is_embedding else BNB_8BIT_STATE)
        else:
            total += states * numel * (param_bytes if per == "param" else per)
    desc = {"param": f"{param_bytes} B", "8bit": "1 B (+block scales; fp32 for tensors <4096 and embeddings)"}
    how = f"{s.optim}: {states} state(s) x {desc[per] if per in desc else f'{per:g} B'} per trainable param"
    if not known:
        how = f"unknown optimizer {s.optim!r}: assumed AdamW-like, 2 fp32 states"
    if s.optim.startswith("paged_"):
        how += "; paged: CUDA unified memory outside PyTorch's counters, evictable to CPU RAM"
    return int(total), how


def planned_dtype(model: dict, device: str = "cuda", lora: bool = False) -> str:
    """The model section's dtype as planned: `auto` is bfloat16 on a GPU; on CPU, what it resolves to there
    (`cpu.cpu_dtype`: bfloat16 for LoRA on a CPU with bfloat16 instructions, else float32)."""
    dtype = model.get("dtype", "auto")
    if dtype != "auto":
        return dtype
    return "bfloat16" if device == "cuda" else cpu_dtype(model, lora)


def weight_bytes(config: dict, dtype: str, quantization: str = "none") -> tuple[float, str]:
    """(bytes of the model's weights in `dtype` / `quantization`, how that was counted)."""
    counts = param_counts(config)
    b = DTYPE_BYTES[dtype]
    total, linear = counts["total"], counts["linear_weights"]
    if quantization == "4bit":
        return (linear * NF4_BYTES + (total - linear) * b,
                f"{_count(linear)} linear params x {NF4_BYTES:.3f} B (NF4, double quant) + {_count(total - linear)} x {b} B")
    if quantization == "8bit":
        rows = sum(n * sum(o for _, o, _ in shapes.values()) for _, n, shapes in layer_groups(config))
        return (linear + rows * 4 + (total - linear) * b,
                f"{_count(linear)} linear params x 1 B (int8) + row scales + {_count(total - linear)} x {b} B")
    return total * b, f"{_count(total)} params x {b} B ({dtype})"


def _compute(config: dict, s: Settings) -> tuple[list[Phase], list[Phase]]:
    """(the two phases, every moment): the moments from `moments.step_moments`, each phase their max."""
    counts = param_counts(config)
    b, total = DTYPE_BYTES[s.dtype], counts["total"]
    weights, w_how = weight_bytes(config, s.dtype, s.quantization)
    # a quantized layer's matmul with gradients: bitsandbytes dequantizes the weight to the compute dtype on CUDA;
    # on CPU the largest temporary bench/plan_vs_measured.py sees is the packed size (0.5 B per value, 4-bit)
    largest = largest_linear(config)
    dequant = 0 if s.quantization == "none" else int(largest * (b if s.device == "cuda" or s.quantization == "8bit" else 0.5))
    if s.lora:
        sizes = lora_tensors(config, s.lora.get("r", 8), s.lora.get("target_modules", "all-linear"),
                             bool(s.lora.get("use_dora")))
        pb, n = adapter_bytes(s), sum(sizes)
        trainable = Component("trainable params", n * pb, f"LoRA {_count(n)} params x {pb} B")
        grads = Component("gradients", n * pb, f"{_count(n)} x {pb} B")
        opt_bytes, opt_how = _optimizer(s, [(x, False) for x in sizes], pb)
    else:
        trainable = Component("trainable params", 0, "the weights themselves (full fine-tune)")
        grads = Component("gradients", total * b, f"{_count(total)} x {b} B")
        tensors = [(counts["embedding"], True), (counts["lm_head"], False), (counts["layers"] + counts["final_norm"], False)]
        opt_bytes, opt_how = _optimizer(s, tensors, b)
    optim = Component("optimizer states", opt_bytes, opt_how)
    if s.beta == 0:
        ref = Component("reference model", 0, "none: beta = 0, TRL loads no reference")
    elif s.lora:
        ref = Component("reference model", 0, "shared: the base with the adapter disabled")
    else:
        ref = Component("reference model", int(weights), "a full second copy of the weights")
    static = [Component("weights", int(weights), w_how), ref, trainable]
    gen, train = step_moments(config, s, static, grads, optim, dequant)
    phases = [replace(max(ms, key=lambda m: m.bytes), name=name) for name, ms in (("generation", gen), ("training", train))]
    return phases, gen + train


def plan(config: dict, *, model: str = "", source: str = "", suggest: bool = True, **knobs) -> Plan:
    """Plan one GRPO step; `knobs` are `Settings` fields (dtype, quantization, lora, optim, beta, ...)."""
    s = Settings(**knobs)
    if s.dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {s.dtype!r} is not planned; use one of {', '.join(DTYPE_BYTES)}")
    if s.quantization not in ("none", "8bit", "4bit"):
        raise ValueError(f"quantization {s.quantization!r}: use none, 8bit or 4bit")
    if s.device not in ("cuda", "cpu"):
        raise ValueError(f"device {s.device!r} is not planned; use cuda or cpu")
    phases, moments = _compute(config, s)
    result = Plan(model or config.get("_name_or_path", config.get("model_type", "")), source, s, phases, moments)
    if s.optim not in _OPTIM:
        result.notes.append(f"optimizer {s.optim!r} is not in the planner's table: assumed 2 fp32 states per param")
    if s.lora and s.lora.get("modules_to_save"):
        result.notes.append("lora.modules_to_save is not planned: add a trainable copy of those modules yourself")
    if suggest and not result.fits:
        result.suggestion = _suggest(config, s, result)
    return result


def _changes(s: Settings, peak_phase: str) -> list[tuple[str, dict]]:
    """The knobs a plan can turn to need less memory, in the order `_suggest` tries them: (the recipe's change, the
    `Settings` fields it changes)."""
    B = s.per_device_train_batch_size
    smaller_b = [b for b in (B // 2, B // 4, B // 8, 1) if 1 <= b < B]
    steps = []
    if not s.gradient_checkpointing:
        steps.append(("trainer.gradient_checkpointing: true", dict(gradient_checkpointing=True)))
    if peak_phase == "generation" and s.gen_batch > s.num_generations:
        steps.append((f"fewer prompts per generation (generation batch {s.gen_batch} -> {s.num_generations})",
                      dict(generation_batch_size=s.num_generations)))
    if s.lora is None:
        steps.append(("a lora section (r: 16, target_modules: all-linear)", dict(lora={"r": 16, "target_modules": "all-linear"})))
    if _OPTIM.get(s.optim, _OPTIM_UNKNOWN)[1] != "8bit":
        steps.append(("trainer.optim: adamw_bnb_8bit", dict(optim="adamw_bnb_8bit")))
    for b in dict.fromkeys(smaller_b):
        steps.append((f"trainer.per_device_train_batch_size: {b} (raise gradient_accumulation_steps x{B // b} "
                      "to keep the batch)", dict(per_device_train_batch_size=b)))
    if s.quantization == "none":
        steps.append(("model.quantization: 4bit (QLoRA)", dict(quantization="4bit", lora=s.lora or {"r": 16})))
    if s.max_completion_length > 1:
        steps.append((f"trainer.max_completion_length: {s.max_completion_length // 2}",
                      dict(max_completion_length=s.max_completion_length // 2)))
    return steps


def _trial(s: Settings, change: dict) -> Settings:
    """`s` with one change; a smaller micro-batch keeps the generation batch (the accumulation steps rise)."""
    trial = replace(s, **change)
    if "per_device_train_batch_size" in change and s.generation_batch_size is None:
        trial = replace(trial, generation_batch_size=s.gen_batch)
    if "per_device_train_batch_size" in change and s.distinct_prompts:
        trial = replace(trial, distinct_prompts=min(s.distinct_prompts, change["per_device_train_batch_size"]))
    return trial


def ranked_changes(config: dict, s: Settings, capacity: int, held: int = 0) -> list[tuple[str, int, int, bool]]:
    """Each change alone, planned at `s`'s shapes: (the change, bytes it saves, the peak after it, whether that fits
    `capacity`), where `held` is what the device holds beyond the plan's tensors (a CPU process's libraries). Ranked:
    the changes that fit first, the one that saves least (the smallest change enough) first; then the others, the
    one that saves most first."""
    now = Plan("", "", s, _compute(config, s)[0])
    rows = []
    for text, change in _changes(s, now.peak.name):
        after = Plan("", "", _trial(s, change), _compute(config, _trial(s, change))[0])
        total = int(after.total_gb * GIB) + held
        rows.append((text, int((now.total_gb - after.total_gb) * GIB), total, total <= capacity))
    rows = [r for r in rows if r[1] > 0]
    return sorted((r for r in rows if r[3]), key=lambda r: r[1]) + sorted((r for r in rows if not r[3]), key=lambda r: -r[1])


def _suggest(config: dict, s: Settings, current: Plan) -> str:
    """The first knob (then the next ones, if one is not enough) that brings the plan under the card."""
    steps = _changes(s, current.peak.name)
    taken, settings, best = [], s, current.total_gb
    for text, change in steps:
        trial = _trial(settings, change)
        after = Plan("", "", trial, _compute(config, trial)[0])
        if after.total_gb < best:
            if "per_device_train_batch_size" in change and taken and taken[-1].startswith("trainer.per_device"):
                taken.pop()  # a smaller micro-batch replaces the previous one, not adds to it
            taken.append(text)
            settings, best = trial, after.total_gb
            if after.fits:
                return taken[0] + ("" if len(taken) == 1 else " (then " + "; ".join(taken[1:]) + ")")
    return (taken[0] + " -- even with " + "; ".join(taken) + " it does not fit") if taken else "none found"


def plan_for(args, *, model: dict, lora: dict | None, prompt_length: int | None = None,
             gpu_memory_gb: float | None = None, config: dict | None = None, device: str = "cuda",
             **passes) -> Plan:
    """Plan a resolved recipe: `args` is its real `trl.GRPOConfig`, `model` / `lora` its sections; `device`
    the kernels that will run (`--check` passes the machine's: cpu where there is no CUDA); `passes`: own_passes,
    lead, tool_rounds (`Settings`), the path that will run. `gpu_memory_gb` None: the default card (`DEFAULT_CARD`).

    Raises `ConfigNotFound` when the model's config.json is not reachable offline.
    """
    config, knobs = plan_knobs(args, model=model, lora=lora, prompt_length=prompt_length, gpu_memory_gb=gpu_memory_gb,
                               config=config, device=device, **passes)
    return plan(config, **knobs)


def plan_knobs(args, *, model: dict, lora: dict | None, prompt_length: int | None = None,
               gpu_memory_gb: float | None = None, config: dict | None = None, device: str = "cuda",
               **passes) -> tuple[dict, dict]:
    """(the model's config, the `plan` keyword arguments) for a resolved recipe, as `plan_for` plans it."""
    source = "given config"
    if config is None:
        config, source = load_model_config(model["name_or_path"])
    optim = getattr(args.optim, "value", args.optim)
    world = max(1, getattr(args, "world_size", 1) or 1)
    card = DEFAULT_CARD if gpu_memory_gb is None else None
    dtype = planned_dtype(model, device, lora=lora is not None)
    if card is not None and device == "cuda" and not card.bf16 and dtype == "bfloat16" and model.get("dtype", "auto") == "auto":
        dtype = "float16"  # what `auto` resolves to on a card without bfloat16 (config.trainer_args.resolved_dtype)
    return config, dict(
        model=model["name_or_path"], source=source, **passes,
        dtype=dtype, device=device, card=card.name if card else None,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        quantization=model.get("quantization", "none"), lora=lora, optim=str(optim), beta=float(args.beta),
        gradient_checkpointing=bool(args.gradient_checkpointing),
        per_device_train_batch_size=args.per_device_train_batch_size, num_generations=args.num_generations,
        generation_batch_size=args.generation_batch_size // world, prompt_length=prompt_length or 256,
        max_completion_length=args.max_completion_length,
        gpu_memory_gb=card.gib if card is not None else gpu_memory_gb,
    )


RESULTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "results"


def validation_note(results_dir: Path = RESULTS_DIR) -> str:
    """What the plan's figures rest on, read from the committed benchmark results (never hard-coded).

    The CPU part from bench/plan_vs_measured.py's results file; the GPU part stays "not yet measured" until a
    non-dry run of bench/gpu_memory.py has left its results there.
    """
    cpu_file = results_dir / "plan_vs_measured_cpu.json"
    try:
        summary = files.try_json(cpu_file)[0]["summary"]
        cpu = (f"checked against measured tensors on CPU within {summary['worst_abs_error']:.1%} over "
               f"{summary['settings']} settings (bench/plan_vs_measured.py)")
    except (OSError, ValueError, KeyError, TypeError):
        cpu = "not checked against measurement here (bench/results/plan_vs_measured_cpu.json not found)"
    gpu_runs = sorted(p for p in results_dir.glob("gpu_memory-*.json") if not p.stem.endswith("dry-run"))
    if not gpu_runs:
        return cpu + "; GPU allocator and kernels not yet measured (bench/gpu_memory.py)"
    gpu = files.try_json(gpu_runs[-1])[0] or {}
    return cpu + f"; on a GPU: {gpu.get('summary_line', 'measured, see ' + gpu_runs[-1].name)}"
