"""The bytes live at each moment of one GRPO step, from the architecture: what `memory.plan` takes the max of.

    >>> from grpokit.planning.architecture import load_model_config
    >>> from grpokit.planning.memory import plan
    >>> p = plan(load_model_config("Qwen/Qwen2.5-0.5B-Instruct")[0], lora={"r": 16})
    >>> [m.moment for m in p.moments]
    ['prefill', 'last decode step', 'forward', 'head forward', 'head backward', 'backward', 'optimizer step']

A step on TRL 1.16 (`GRPOTrainer`, transformers generation, one process) is a sequence of moments; tensors
that never coexist are never summed. Generation: the prefill, then decode steps until the last, whose KV
cache is the longest. Training, per micro-batch: the layers' forward, the fused LM head's forward and
backward, the layers' backward (recomputing one layer at a time under gradient checkpointing), then the
optimizer step. A scoring pass (reference or old log-probs, under no_grad) holds less than the forward with
gradients and is not planned separately.

Every term below is a tensor the code of TRL 1.16 / transformers 5.24 / PEFT / torch 2.13 allocates, named
where it is counted; `bench/plan_vs_measured.py` checks the totals against live tensors of real steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.planning.architecture import ALL_LINEAR, dims, linear_shapes, lora_targets, lora_tensors, param_counts
from grpokit.trl_compat import HEAD_TEMPORARIES, LOGPROB_TILE

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass
class Component:
    """Bytes of one kind of tensor at one moment, and how they were counted; `vllm`: held by vLLM, which allocates
    its share in one piece (so the trainer's fragmentation does not apply to it)."""

    name: str
    bytes: int
    how: str
    vllm: bool = False

    def __post_init__(self):
        self.bytes = int(self.bytes)


@dataclass
class Phase:
    """One moment of the step (or a phase: the highest of its moments): its components, which sum to it."""

    name: str
    moment: str
    components: list[Component]

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.components)


def activation_bytes(s) -> int:
    """Bytes of one activation: the model's dtype (a 4-bit base computes in it too)."""
    return DTYPE_BYTES[s.dtype]


def adapter_bytes(s) -> int:
    """LoRA parameters: bf16 under QLoRA (TRL casts them), else at least fp32 (PEFT's autocast_adapter_dtype)."""
    return 2 if s.quantization != "none" else max(DTYPE_BYTES[s.dtype], 4)


def autocast(s) -> bool:
    """grpokit turns on bf16 / fp16 mixed precision on a GPU only (`trainer_args`); on CPU no autocast runs."""
    return s.device == "cuda" and s.dtype in ("bfloat16", "float16")


def layer_activations(config: dict, s, S: int) -> tuple[int, str]:
    """Bytes one decoder layer saves for backward, per token of a micro-batch (no checkpointing).

    Each RMSNorm keeps its fp32 input (4H) and 1/rms, and its output (a H); attention keeps q after RoPE,
    k and v expanded to all heads (transformers expands GQA when a padding mask is given), its output and
    o_proj's contiguous input (5 a q), the log-sum-exp (4 per head) and the float padding mask SDPA makes
    from the bool one (a S per token, per layer); the MLP keeps gate, up, silu(gate), their product (4 a I).
    A full fine-tune keeps each norm's scaled output for the weight's gradient (+2 a H). LoRA keeps each
    adapter's r-wide middle, and a copy of each adapted input in the adapter's dtype when it differs.
    """
    d = dims(config)
    H, I, q, heads = d["H"], d["I"], d["q"], d["q"] // d["head_dim"]
    a = activation_bytes(s)
    A = 2 * (4 * H + 4 + a * H) + 5 * a * q + 4 * heads + a * S + 4 * a * I
    how = f"2(4H+4+{a}H) + 5x{a}q + 4 heads + {a}S (float mask) + 4x{a}I"
    if s.lora is None:
        A += 2 * a * H
        how += f" + 2x{a}H (norm outputs)"
    else:
        pb = adapter_bytes(s)
        cast = 0 if pb == a else (a if autocast(s) else pb)  # fp32 adapters: input cast to fp32 (autocast: back to bf16)
        dropout = float(s.lora.get("lora_dropout", 0) or 0) > 0
        per_feature = cast + ((a if not cast else 0) + 1 if dropout else 0)
        r = s.lora.get("r", 8)
        extra = 0
        for name, (i, _) in lora_targets(config, s.lora.get("target_modules", "all-linear")).items():
            if name in ALL_LINEAR:
                extra += i * per_feature + r * (a if autocast(s) else pb)
        A += extra
        how += f" + {extra} LoRA"
    return A, how


def layer_backward(config: dict, s) -> int:
    """Per token, what a layer's backward holds beyond its saved activations: the incoming and outgoing
    gradients of the residual stream, each norm's fp32 gradient, and the MLP's gradients (gate, up, product)."""
    d = dims(config)
    a = activation_bytes(s)
    return (2 * a + 8) * d["H"] + 3 * a * d["I"]


def head_bytes(config: dict, s, tokens: int, backward: bool) -> tuple[int, str]:
    """TRL's fused LM head (`ChunkedLogProbFunction`) on `tokens` scored positions, at its forward's or
    backward's peak: the hidden rows it was handed (copied), 7 fp32 per-token statistics (3 kept for the
    backward), one tile buffer of TOKEN_CHUNK_SIZE x _CHUNKED_LOGPROB_CHUNK_SIZE (the full width even when
    the vocabulary is narrower), on CPU the torch fold's fp32 temporaries of one tile, and in the backward
    the fp32 gradient of the hidden rows (and of the head's weight when it trains)."""
    d = dims(config)
    H, V = d["H"], d["V"]
    a = activation_bytes(s)
    rows, width = min(tokens, LOGPROB_TILE[0]), min(V, LOGPROB_TILE[1])
    temps = HEAD_TEMPORARIES[s.device]["backward" if backward else "forward"]
    upcast = s.device == "cpu" and a != 4  # torch's fold and addmm work in fp32: a 16-bit tile (and weight) is copied up
    if upcast and not backward:
        temps += 1
    total = tokens * H * a + tokens * 4 * (3 if backward else 7) + rows * LOGPROB_TILE[1] * a
    how = f"{tokens} positions x H x {a} B + one {rows}x{LOGPROB_TILE[1]} tile"
    fold = temps * rows * width * 4
    if upcast and backward:  # the gradient GEMMs upcast the tile and the weight chunk, after the fold has freed its own
        total += max(fold, rows * width * 4 + width * H * 4)
        how += f" + the larger of {temps} fp32 tile temporaries and the fp32 copies of a tile and a weight chunk (CPU)"
    elif temps:
        total += fold
        how += f" + {temps} fp32 tile temporaries (torch fold, {s.device})"
    if backward:
        total += tokens * H * 4
        how += " + fp32 grad of the hidden rows"
        if s.lora is None:
            total += V * H * 4
            how += " + fp32 grad of the head's weight"
    how += f"; unfused log-softmax would hold N x V x 4 B = {tokens * V * 4 / 2**30:.2f} GiB"
    return int(total), how


def scored_positions(s) -> int:
    """Positions the fused head scores per micro-batch: on CUDA (Triton) the B x C completion tokens; on CPU
    every position but the last, B x (P + C - 1) (`trl.trainer.utils.add_fused_lm_head`, `compact`)."""
    B, P, C = s.per_device_train_batch_size, s.prompt_length, s.max_completion_length
    return B * C if s.device == "cuda" else B * (P + C - 1)


def optimizer_step_bytes(s, sizes: list[int], state_bytes: int) -> tuple[int, str]:
    """Temporaries of the optimizer step: AdamW's foreach path (CUDA's default) allocates sqrt(v) for every
    parameter at once; the single-tensor path (CPU's default) sqrt(v) and its quotient for one tensor."""
    if s.optim not in ("adamw_torch", "adamw_torch_fused", "adamw_anyprecision"):
        return 0, "updated in place, block by block (bitsandbytes) or not modelled"
    if s.optim == "adamw_torch_fused":
        return 0, "fused AdamW: in place"
    foreach = s.foreach if s.foreach is not None else s.device == "cuda"
    if foreach:
        return sum(sizes) * state_bytes, f"foreach AdamW: sqrt(v) for all {sum(sizes):,} trainable values at once"
    return 2 * max(sizes) * state_bytes, "single-tensor AdamW: sqrt(v) and its quotient for the largest tensor"


def step_moments(config: dict, s, static: list[Component], grads: Component, optim: Component,
                 dequant: int = 0) -> tuple[list[Phase], list[Phase]]:
    """(generation moments, training moments), each a full list of components (the static ones repeated);
    `dequant` is the largest dequantized weight a quantized base holds while one layer runs."""
    d = dims(config)
    H, I, L, V, q, kv = d["H"], d["I"], d["L"], d["V"], d["q"], d["kv"]
    a = activation_bytes(s)
    B, C, P, G = s.per_device_train_batch_size, s.max_completion_length, s.prompt_length, s.gen_batch
    S = P + C
    T = B * S
    none_grads = Component("gradients", 0, "none yet: freed by zero_grad(set_to_none=True) after each optimizer step")
    # gradients of earlier micro-batches of the same optimizer step (gradient accumulation) are alive throughout
    held = Component("gradients", grads.bytes if s.gradient_accumulation_steps > 1 else 0,
                "earlier micro-batches' (gradient accumulation)" if s.gradient_accumulation_steps > 1
                else "none yet (first micro-batch of the step)")

    # -- generation: the prefill, and the last decode step (longest cache)
    kv_tok = L * 2 * kv * a
    mask_prefill = G * P * P * a  # the float padding mask of the prompt, one layer at a time
    # no dequantized weight without gradients: bitsandbytes' gemm_4bit reads the packed weight
    prefill_ws = G * P * a * (2 * H + 2 * q + 2 * kv + 3 * I) + mask_prefill + G * V * (a + 4)
    cache = G * (S - 1) * kv_tok  # the last token is sampled, never fed back: P + C - 1 positions
    decode_ws = 2 * G * (S - 1) * kv * a + G * V * (a + 4 * 7)
    gen = [
        Phase("generation", "prefill", static + [none_grads, optim,
               Component("KV cache", G * P * kv_tok, f"G x P x L x (k, v) x kv_dim x {a} B"),
               Component("generation workspace", prefill_ws, "one layer's no-grad activations of the prompts + float mask "
                    "+ last-position logits")]),
        Phase("generation", "last decode step", static + [none_grads, optim,
               Component("KV cache", cache, f"G x (P + C - 1) x L x (k, v) x kv_dim x {a} B = {G} x {S - 1} x {L} x 2 x {kv} x {a}"),
               Component("generation workspace", decode_ws, "one layer's grown K/V (torch.cat copies) + logits and ~7 fp32 "
                    "G x V sampling tensors (GQA is packed, not expanded, for one query token)")]),
    ]

    # -- training, one micro-batch of T = B x (P + C) tokens
    A, a_how = layer_activations(config, s, S)
    back = layer_backward(config, s)
    mask = B * S * S  # the bool padding mask, made once per forward
    final = T * (4 * H + 4 + a * H)  # the final norm's saved input and output
    if s.gradient_checkpointing:
        kept = L * T * a * H + mask + final
        kept_how = f"checkpoints L x T x {a}H (T = {T} tokens) + final norm"
        recompute = T * (A + back)
        backward_acts = kept + recompute
        b_how = kept_how + f" + one layer recomputed and its backward, T x ({A} + {back}) B"
    else:
        kept = L * T * A + mask + final
        kept_how = f"L x T x {A} B/token ({a_how}) + final norm"
        backward_acts = kept + T * back
        b_how = kept_how + f" + backward T x {back} B"
    N = scored_positions(s)
    hf, hf_how = head_bytes(config, s, N, backward=False)
    hb, hb_how = head_bytes(config, s, N, backward=True)
    # the layers' forward: what is kept so far, plus one layer's transient MLP and a dequantized weight (4/8-bit)
    transient = T * (4 * a * I + 2 * a * H) + dequant
    deq = " + one dequantized weight" if dequant else ""
    train = [
        Phase("training", "forward", static + [held, optim, Component(
            "activations", kept + transient, kept_how + f" + one layer's transient T x (4x{a}I + 2x{a}H){deq}")]),
        Phase("training", "head forward", static + [held, optim, Component("activations", kept, kept_how),
                                                    Component("logits", hf, hf_how)]),
        Phase("training", "head backward", static + [held, optim, Component("activations", kept, kept_how),
                                                     Component("logits", hb, hb_how)]),
    ]
    if s.lora:  # the adapters' gradients are small: the backward peaks at its first recomputed layer
        train.append(Phase("training", "backward", static + [grads, optim, Component(
            "activations", backward_acts + dequant, b_how + deq)]))
    else:  # a full fine-tune: the head's weight gradient from the start; at the end every gradient, and
        # with tied embeddings the head's gradient waits for the embedding's dense one, and their sum is a third
        head_grad = V * H * activation_bytes(s)
        start = [Component("gradients", head_grad + held.bytes, "the head's weight (V x H), from its backward"),
                 optim, Component("activations", backward_acts + dequant, b_how + deq)]
        tied = 2 * head_grad if d["tied"] else 0
        end = [grads, optim, Component("activations", tied, "tied embeddings: the embedding's dense gradient and its sum "
                                       "with the head's (V x H each)" if tied else "the last layers' gradients in flight")]
        train.append(Phase("training", "backward", static + max(start, end, key=lambda parts: sum(c.bytes for c in parts))))
    step, step_how = optimizer_step_bytes(s, _trainable_sizes(config, s), _state_bytes(s))
    train.append(Phase("training", "optimizer step", static + [grads, optim, Component("optimizer step", step, step_how)]))
    return gen, train


def _trainable_sizes(config: dict, s) -> list[int]:
    if s.lora:
        return lora_tensors(config, s.lora.get("r", 8), s.lora.get("target_modules", "all-linear"), bool(s.lora.get("use_dora")))
    c = param_counts(config)
    largest = max(i * o for i, o, _ in linear_shapes(config).values())
    # the total, split so that max() is the largest single tensor: embedding, head, one linear weight
    return [c["embedding"], c["lm_head"], largest, c["total"] - c["embedding"] - c["lm_head"] - largest]


def _state_bytes(s) -> int:
    return adapter_bytes(s) if s.lora else DTYPE_BYTES[s.dtype]
