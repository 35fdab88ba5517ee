"""The memory plan of a step that generates with vLLM colocated in the training process (`trainer.use_vllm`,
`vllm_mode: colocate`), from the architecture, before any weight loads.

    >>> from grpokit.planning.architecture import load_model_config
    >>> config, _ = load_model_config("Qwen/Qwen2.5-1.5B-Instruct")
    >>> p = plan_colocate(config, utilization=0.4, sleep=True, max_model_len=1280, lora={"r": 16},
    ...                   optim="adamw_bnb_8bit", per_device_train_batch_size=8, generation_batch_size=64,
    ...                   max_completion_length=1024)
    >>> p.engine.holds_batch, p.fits
    (True, True)

**Modelled from TRL's and vLLM's code, not measured** (bench/gpu_generation.py measures it on a GPU). What the
model follows:
- TRL 1.16 (`VLLMGeneration._init_vllm`) starts `vllm.LLM` once the trainer's model is on the GPU, with
  `gpu_memory_utilization = vllm_gpu_memory_utilization` (the share of the *whole card* vLLM may fill),
  `max_num_batched_tokens = 4096`, `max_num_seqs` = the generation batch, `max_model_len =
  vllm_max_model_length` (None: the model's context), a 4-bit bitsandbytes base as `quantization="bitsandbytes"`.
- vLLM (v1 engine) refuses to start when less than `utilization x card` is free at that moment; inside its
  share it holds its own weight copy, the activations of a profiling pass of 4096 tokens, memory outside
  PyTorch (CUDA graphs), and gives the rest to the KV cache, in blocks of 16 tokens; it refuses to start
  when that cache cannot hold one `max_model_len` sequence, and preempts (recomputes) sequences when a
  batch outgrows it.
- Sleep mode (`vllm_enable_sleep_mode`; TRL uses level 2): after start-up and after every generation vLLM
  frees its weights and KV cache (level 1 would copy the weights to host memory first; TRL re-pushes them
  anyway); the weights are woken for the sync, the KV cache for generation. Without it vLLM keeps its whole
  share while the trainer trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from grpokit.planning.architecture import HYBRID, NotModelled, dims, largest_linear
from grpokit.planning.memory import CONTEXT_BYTES, GIB, Plan, _gib, plan, weight_bytes
from grpokit.planning.memory import plan_knobs as memory_plan_knobs
from grpokit.planning.moments import DTYPE_BYTES, Component, Phase
from grpokit.trl_compat import VLLM_MAX_NUM_BATCHED_TOKENS, VLLM_SLEEP_LEVEL

BLOCK_TOKENS = 16  # vLLM's default KV block size on CUDA
# Memory vLLM allocates outside PyTorch's tensors inside its share (CUDA graphs captured for up to max_num_seqs
# sequences, NCCL and cuBLAS workspaces): an assumption (0.1-0.5 GiB in vLLM's start-up logs), kept while asleep.
NON_TORCH_BYTES = int(0.25 * GIB)
MODELLED = ("the vLLM part is modelled from TRL's and vLLM's code, not measured, until bench/gpu_generation.py "
            "has run on a GPU")


@dataclass
class Share:
    """vLLM's part of the card: what its `utilization x card` holds, and what it keeps while the trainer trains."""

    utilization: float
    card: int  # bytes
    weights: int
    weights_how: str
    workspace: int
    kv_token_bytes: int
    needed_tokens: int  # one generation batch, each sequence rounded up to whole blocks
    sequences: int
    sequence_tokens: int  # P + C
    max_model_len: int
    max_model_len_given: bool
    sleep: bool
    startup_resident: int  # what the trainer holds when vLLM starts: weights, adapters, CUDA context

    @property
    def bytes(self) -> int:
        return int(self.utilization * self.card)

    @property
    def kv_bytes(self) -> int:
        return self.bytes - self.weights - self.workspace - NON_TORCH_BYTES

    @property
    def capacity_tokens(self) -> int:
        return max(0, self.kv_bytes) // (BLOCK_TOKENS * self.kv_token_bytes) * BLOCK_TOKENS

    @property
    def holds_batch(self) -> bool:
        return self.capacity_tokens >= self.needed_tokens

    @property
    def min_utilization(self) -> float:
        """The smallest utilization whose KV cache holds one generation batch (and one max_model_len sequence)."""
        tokens = max(self.needed_tokens, _blocks(self.max_model_len) * BLOCK_TOKENS)
        need = self.weights + self.workspace + NON_TORCH_BYTES + tokens * self.kv_token_bytes
        return math.ceil(need / self.card * 100) / 100

    @property
    def held_while_training(self) -> int:
        return NON_TORCH_BYTES if self.sleep else self.bytes

    def blocker(self) -> tuple[str, str] | None:
        """(kind, why) vLLM would refuse to start -- kind `startup` (not enough free memory when it starts),
        `no-kv` (the share does not cover its weights and workspace) or `max-model-len` (the KV cache holds less than
        one max_model_len sequence) -- or None."""
        free = self.card - self.startup_resident
        if self.bytes > free:
            return "startup", (f"vLLM refuses to start: utilization {self.utilization:g} asks {_gib(self.bytes)} free, and "
                               f"the trainer already holds {_gib(self.startup_resident)} (weights, adapters, CUDA context) "
                               f"of {_gib(self.card)}; at most {self.max_startup_utilization:g}")
        if self.kv_bytes <= 0:
            return "no-kv", (f"vLLM refuses to start: utilization {self.utilization:g} ({_gib(self.bytes)}) does not cover "
                             f"its weights and workspace ({_gib(self.weights + self.workspace + NON_TORCH_BYTES)}), no room "
                             "for a KV cache")
        if self.capacity_tokens < self.max_model_len:
            return "max-model-len", (
                f"vLLM refuses to start: its KV cache holds {self.capacity_tokens:,} tokens, less than one max_model_len "
                f"sequence ({self.max_model_len:,}"
                + ("" if self.max_model_len_given else ", the model's context: trainer.vllm_max_model_length is unset") + ")")
        return None

    def blocking(self) -> str | None:
        """Why vLLM would refuse to start, or None."""
        found = self.blocker()
        return found[1] if found else None

    @property
    def max_startup_utilization(self) -> float:
        """The largest utilization vLLM can ask for when it starts next to the trainer's resident tensors."""
        return math.floor((self.card - self.startup_resident) / self.card * 100) / 100

    def render(self) -> list[str]:
        sleep = (f"on (level {VLLM_SLEEP_LEVEL}): while the trainer trains vLLM keeps {_gib(NON_TORCH_BYTES)} "
                 "(outside PyTorch); weights and KV cache are freed and woken per generation"
                 if self.sleep else f"off: vLLM keeps its whole share ({_gib(self.bytes)}) while the trainer trains")
        verdict = (f"holds one generation batch ({self.sequences} x {self.sequence_tokens} = "
                   f"{self.needed_tokens:,} in blocks of {BLOCK_TOKENS})" if self.holds_batch else
                   f"does NOT hold one generation batch ({self.needed_tokens:,} tokens): vLLM would preempt and "
                   "recompute sequences")
        return [f"  vLLM colocate: utilization {self.utilization:g} x {_gib(self.card)} = {_gib(self.bytes)}: weights "
                f"{_gib(self.weights)} + workspace {_gib(self.workspace)} + outside PyTorch {_gib(NON_TORCH_BYTES)} + "
                f"KV cache {_gib(max(0, self.kv_bytes))}",
                f"  vLLM KV capacity: {self.capacity_tokens:,} tokens ({_gib(self.kv_token_bytes * 1024)} per 1k) "
                f"-> {verdict}; least utilization that does: {self.min_utilization:g}",
                f"  vLLM sleep mode {sleep}",
                f"  note: {MODELLED}"]


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_TOKENS)


def vllm_dtype(config: dict, dtype: str) -> str:
    """vLLM loads the checkpoint's own dtype (TRL passes none); a GPU without bfloat16 runs float16."""
    if dtype in ("bfloat16", "float16"):
        return dtype
    own = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return own if own in DTYPE_BYTES else "bfloat16"


def share(config: dict, s, *, utilization: float, sleep: bool, max_model_len: int | None, startup_resident: int) -> Share:
    """vLLM's share for the plan `Settings` `s` (generation batch, prompt and completion lengths, quantization)."""
    d = dims(config)
    if d["kind"] in HYBRID:  # vLLM's paged cache for linear-attention state is its own allocator: not counted here
        raise NotModelled(d["kind"], "vLLM's share for Gated DeltaNet layers (its mamba-style state cache) is")
    if d["kind"] == "gemma4":  # vLLM's cache groups for sliding, full and shared-KV layers are its own: not read here
        raise NotModelled(d["kind"], "vLLM's share for Gemma 4 (its per-kind KV cache groups, the towers it loads) is")
    dtype = vllm_dtype(config, s.dtype)
    a = DTYPE_BYTES[dtype]
    quant = "4bit" if s.quantization == "4bit" else "none"
    weights, how = weight_bytes(config, dtype, quant)
    T = VLLM_MAX_NUM_BATCHED_TOKENS
    # the profiling pass vLLM sizes its workspace with: one layer's activations for T tokens (qkv, attention output,
    # gate_up, the activation's output, residual and normed hidden), fp32 logits and probabilities for every
    # sequence's last position; a 4-bit layer is dequantized to the compute dtype for it
    workspace = T * a * (d["q"] + 2 * d["kv"] + d["q"] + 3 * d["I"] + 2 * d["H"]) + s.gen_batch * d["V"] * 4 * 2
    if quant == "4bit":
        workspace += largest_linear(config) * a
    S = s.prompt_length + s.max_completion_length
    return Share(utilization, int(s.gpu_memory_gb * GIB), int(weights), how, int(workspace), d["L"] * 2 * d["kv"] * a,
                 s.gen_batch * _blocks(S) * BLOCK_TOKENS, s.gen_batch, S, max_model_len or config.get("max_position_embeddings", S),
                 max_model_len is not None, sleep, startup_resident)


def plan_colocate(config: dict, *, utilization: float, sleep: bool, max_model_len: int | None = None, **knobs) -> Plan:
    """The plan of `memory.plan` with generation by vLLM: the generation phase is the trainer's resident tensors
    plus vLLM's share (no transformers KV cache); the training phase the trainer's moments plus what vLLM keeps."""
    base = plan(config, suggest=False, **knobs)
    s = base.settings
    gen_static = [c for c in base.moments[0].components if c.name not in ("KV cache", "generation workspace")]
    resident = sum(c.bytes for c in gen_static if c.name in ("weights", "reference model", "trainable params"))
    v = share(config, s, utilization=utilization, sleep=sleep, max_model_len=max_model_len,
              startup_resident=resident + CONTEXT_BYTES)
    kv = max(0, v.kv_bytes)
    gen = Phase("generation", "vLLM generate", gen_static + [
        Component("vLLM weights", v.weights, f"vLLM's own copy: {v.weights_how}", vllm=True),
        Component("vLLM workspace", v.workspace + NON_TORCH_BYTES,
                  f"a profiling pass of {VLLM_MAX_NUM_BATCHED_TOKENS} tokens + {_gib(NON_TORCH_BYTES)} outside PyTorch", vllm=True),
        Component("vLLM KV cache", kv, f"the rest of utilization x card: {v.capacity_tokens:,} tokens", vllm=True),
    ])
    held = Component("vLLM asleep" if sleep else "vLLM share", v.held_while_training,
                     f"sleep level {VLLM_SLEEP_LEVEL}: only memory outside PyTorch" if sleep
                     else "the whole share: no sleep mode", vllm=True)
    train = [replace(m, components=m.components + [held]) for m in base.moments if m.name == "training"]
    phases = [gen, replace(max(train, key=lambda m: m.bytes), name="training")]
    result = Plan(base.model, base.source, s, phases, [gen] + train, notes=list(base.notes))
    result.engine = v
    return result


def plan_for(args, *, model: dict, lora: dict | None, prompt_length: int | None = None, gpu_memory_gb: float | None = None,
             config: dict | None = None, sleep: bool | None = None, utilization: float | None = None) -> Plan:
    """The plan of a resolved recipe whose `args` (its `GRPOConfig`) set `use_vllm`: colocate adds vLLM's share
    (`sleep` / `utilization` override the recipe's, for --check's comparisons); server mode generates on another
    GPU, so this card holds the trainer's side only."""
    config, knobs = memory_plan_knobs(args, model=model, lora=lora, prompt_length=prompt_length,
                                      gpu_memory_gb=gpu_memory_gb, config=config)
    if args.vllm_mode != "colocate":
        base = plan(config, suggest=False, **knobs)
        gen = [c for c in base.moments[0].components if c.name not in ("KV cache", "generation workspace")]
        result = Plan(base.model, base.source, base.settings,
                      [Phase("generation", "vLLM server (another GPU)", gen), base.phases[1]], base.moments, notes=base.notes)
        result.notes.append("vllm_mode server: vLLM's weights and KV cache live on the server's GPU, not in this plan")
        return result
    result = plan_colocate(config, utilization=args.vllm_gpu_memory_utilization if utilization is None else utilization,
                           sleep=args.vllm_enable_sleep_mode if sleep is None else sleep,
                           max_model_len=args.vllm_max_model_length, **knobs)
    if not result.fits:
        result.suggestion = _suggest(result)
    return result


def _suggest(p: Plan) -> str:
    v = p.engine
    kind = (v.blocker() or ("", ""))[0]
    if kind == "max-model-len" and not v.max_model_len_given:
        return f"trainer.vllm_max_model_length: {v.sequence_tokens} (prompt + completion)"
    if kind == "startup":
        return f"trainer.vllm_gpu_memory_utilization: {v.max_startup_utilization:g}"
    if kind:
        return f"trainer.vllm_gpu_memory_utilization: {v.min_utilization:g}"
    if not v.sleep and p.peak.name == "training":
        return "trainer.vllm_enable_sleep_mode: true"
    return "a smaller generation batch (trainer.steps_per_generation) or a lower trainer.vllm_gpu_memory_utilization"
