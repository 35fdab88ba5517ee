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

from grpokit.planning import gemma4
from grpokit.planning.architecture import dims, largest_linear, layer_groups, lora_targets, lora_tensors, param_counts
from grpokit.trl_compat import HEAD_TEMPORARIES, LOGPROB_TILE

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# A lead shorter than this is not worth a pass of its own (a forward's fixed cost against the tokens it saves):
# grpokit.trainer.shared_prompt and grpokit.trainer.generation compute none, and the plan plans none.
MIN_LEAD = 16
CHUNK = 64  # transformers' torch_chunk_gated_delta_rule: the sequence is cut (and padded) into 64-token chunks


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


@dataclass(frozen=True)
class Settings:
    """The run's knobs that move memory; `memory.plan_for` reads them from a resolved GRPOConfig. It lives here,
    below `memory`, because every moment reads it; `memory.Settings` is this class."""

    dtype: str = "bfloat16"
    quantization: str = "none"  # none | 8bit | 4bit
    lora: dict | None = None  # r, target_modules, lora_dropout, use_dora
    optim: str = "adamw_torch"
    beta: float = 0.0
    gradient_checkpointing: bool = True
    per_device_train_batch_size: int = 8
    num_generations: int = 8
    generation_batch_size: int | None = None  # per device; None = the micro-batch
    prompt_length: int = 256
    max_completion_length: int = 512
    gpu_memory_gb: float = 16.0
    card: str | None = None  # the card planned for, by name (memory.DEFAULT_CARD's when --gpu-memory is not given)
    device: str = "cuda"  # cuda | cpu: which kernels run (TRL's fused head, AdamW's default path)
    foreach: bool | None = None  # AdamW's multi-tensor step; None = torch's default (CUDA yes, CPU no)
    gradient_accumulation_steps: int = 1
    # grpokit's own passes (grpokit.trainer.shared_prompt, grpokit.trainer.generation) in place of TRL's: each distinct prompt of a
    # micro-batch computed once, the lead every prompt shares once, generation from kept prefixes across tool rounds
    own_passes: bool = False
    distinct_prompts: int | None = None  # per micro-batch; None = the micro-batch's prompts, B / num_generations
    lead: int = 0  # leading tokens every prompt shares (system text, tool schemas, a worked call)
    tool_rounds: int = 0  # tool results fed back within a rollout: each a turn generated from the kept states

    @property
    def gen_batch(self) -> int:
        return self.generation_batch_size or self.per_device_train_batch_size

    @property
    def distinct(self) -> int:
        """Distinct prompts in a training micro-batch (each `num_generations` rows of one prompt, at worst)."""
        B = self.per_device_train_batch_size
        return min(B, self.distinct_prompts or -(-B // max(1, self.num_generations)))

    @property
    def shared_lead(self) -> int:
        """The lead own passes compute once: 0 where it is under MIN_LEAD or leaves a prompt less than 2 of its own."""
        return self.lead if MIN_LEAD <= self.lead <= self.prompt_length - 2 else 0

    @property
    def shares_prompts(self) -> bool:
        """Whether the loss pass is grpokit's (`shared_prompt.logps_and_entropies`): prompts repeat, or share a lead."""
        return self.own_passes and self.prompt_length >= 2 and (self.distinct < self.per_device_train_batch_size
                                                               or self.shared_lead > 0)


def activation_bytes(settings: Settings) -> int:
    """Bytes of one activation: the model's dtype (a 4-bit base computes in it too)."""
    return DTYPE_BYTES[settings.dtype]


def adapter_bytes(settings: Settings) -> int:
    """LoRA parameters: bf16 under QLoRA (TRL casts them), else at least fp32 (PEFT's autocast_adapter_dtype)."""
    return 2 if settings.quantization != "none" else max(DTYPE_BYTES[settings.dtype], 4)


def autocast(settings: Settings) -> bool:
    """grpokit turns on bf16 / fp16 mixed precision on a GPU only (`trainer_args`); on CPU no autocast runs."""
    return settings.device == "cuda" and settings.dtype in ("bfloat16", "float16")


def layer_activations(config: dict, settings: Settings, S: int, kind: str = "full") -> tuple[int, str]:
    """Bytes one decoder layer of `kind` saves for backward, per token of a micro-batch (no checkpointing).

    Each RMSNorm keeps its fp32 input (4H) and 1/rms, and its output (a H); attention keeps q after RoPE,
    k and v expanded to all heads (transformers expands GQA when a padding mask is given), its output and
    o_proj's contiguous input (5 a q), the log-sum-exp (4 per head) and the float padding mask SDPA makes
    from the bool one (a S per token, per layer); the MLP keeps gate, up, silu(gate), their product (4 a I).
    Q/K norms (Qwen3, Qwen3.5) keep their fp32 inputs; Qwen3.5's output gate keeps sigmoid(gate) and the
    attention output it multiplies. A Gated DeltaNet layer: `linear_mixer_activations`. A full fine-tune keeps
    each norm's scaled output for the weight's gradient (+2 a H; Qwen3.5's (1 + w) norms their fp32 one, +2x4H).
    LoRA keeps each adapter's r-wide middle, and a copy of each adapted input in the adapter's dtype when it differs.
    """
    d = dims(config)
    H, I, q, kv, heads = d["H"], d["I"], d["q"], d["kv"], d["q"] // d["head_dim"]
    a = activation_bytes(settings)
    A = 2 * (4 * H + 4 + a * H) + 4 * a * I
    how = f"2(4H+4+{a}H) + 4x{a}I"
    if d["kind"] == "gemma4":  # its own norms, head sizes and per-layer inputs: gemma4.layer_activations
        A, how = gemma4.layer_activations(config, kind, a, S, full_finetune=settings.lora is None)
    elif kind == "linear":
        mixer, mixer_how = linear_mixer_activations(d, a, S)
        A, how = A + mixer, how + " + " + mixer_how
    else:
        A += 5 * a * q + 4 * heads + a * S
        how += f" + 5x{a}q + 4 heads + {a}S (float mask)"
        if d["kind"] in ("qwen3", "qwen3_5"):
            A += 4 * (q + kv) + 4 * (heads + kv // d["head_dim"])
            how += " + q/k norms' fp32 inputs"
        if d["gated"]:
            A += 2 * a * q
            how += f" + 2x{a}q (output gate)"
    lora = settings.lora
    if lora is None:
        if d["kind"] != "gemma4":  # gemma4.layer_activations counts its norms' outputs itself
            A += 2 * (4 if d["gated"] else a) * H
            how += f" + 2x{4 if d['gated'] else a}H (norm outputs)"
    else:
        pb = adapter_bytes(settings)
        # fp32 adapters: input cast to fp32 (autocast: back to bf16)
        cast = 0 if pb == a else (a if autocast(settings) else pb)
        dropout = float(lora.get("lora_dropout", 0) or 0) > 0
        per_feature = cast + ((a if not cast else 0) + 1 if dropout else 0)
        r = lora.get("r", 8)
        shapes = dict(next(s for k, _, s in layer_groups(config) if k == kind))
        extra = sum(shapes[name][0] * per_feature + r * (a if autocast(settings) else pb)
                    for name in lora_targets(config, lora.get("target_modules", "all-linear")) if name in shapes)
        A += extra
        how += f" + {extra} LoRA"
    return A, how


def linear_mixer_activations(d: dict, a: int, S: int) -> tuple[int, str]:
    """Per token, what a Gated DeltaNet mixer saves for backward on transformers' torch path
    (`torch_chunk_gated_delta_rule`, the path without flash-linear-attention, CPU's and a GPU's without it):
    the qkv projection, the conv's padded output (a x conv x (2 + (K-1)/S)), q, k, v in fp32 (q and k repeated to
    the value heads), head-width fp32 tensors of the chunked rule (6, on the sequence padded to 64-token chunks) and
    ones in the model's dtype after it (11), 5 fp32 64 x 64 per-chunk matrices per head, and one recurrent state
    (heads x dk x dv, fp32) per chunk. Counted from the code and checked against autograd's saved tensors of one layer (tests/planning/test_families.py):
    within 3 % at bfloat16 from one chunk up (1 % at 1280 tokens, Qwen3.5-0.8B's widths); at float32 it overstates
    sequences of one or two partly filled chunks (+19 % at 64 tokens) and is within 1 % from 128 tokens."""
    conv, lh, dk, dv, K = d["conv"], d["lh"], d["dk"], d["dv"], d["conv_kernel"]
    chunks = -(-S // CHUNK)
    pad = chunks * CHUNK / S
    A = (a * conv * (2 + (K - 1) / S) + 4 * (2 * lh * dk + lh * dv) + (24 * pad + 11 * a) * lh * dk + 20 * lh * CHUNK * pad
         + 4 * lh * dk * dv * chunks / S)
    return int(A), f"Gated DeltaNet {int(A)} B (conv, fp32 q/k/v, {chunks} chunk(s) of {CHUNK}: states and chunk matrices)"


def layer_backward(config: dict, settings: Settings) -> int:
    """Per token, what a layer's backward holds beyond its saved activations: the incoming and outgoing
    gradients of the residual stream, each norm's fp32 gradient, and the MLP's gradients (gate, up, product)."""
    d = dims(config)
    a = activation_bytes(settings)
    return (2 * a + 8) * d["H"] + 3 * a * d["I"]


def head_bytes(config: dict, settings: Settings, tokens: int, backward: bool) -> tuple[int, str]:
    """TRL's fused LM head (`ChunkedLogProbFunction`) on `tokens` scored positions, at its forward's or
    backward's peak: the hidden rows it was handed (copied), 7 fp32 per-token statistics (3 kept for the
    backward), one tile buffer of TOKEN_CHUNK_SIZE x _CHUNKED_LOGPROB_CHUNK_SIZE (the full width even when
    the vocabulary is narrower), on CPU the torch fold's fp32 temporaries of one tile, and in the backward
    the fp32 gradient of the hidden rows (and of the head's weight when it trains)."""
    d = dims(config)
    H, V = d["H"], d["V"]
    a = activation_bytes(settings)
    rows, width = min(tokens, LOGPROB_TILE[0]), min(V, LOGPROB_TILE[1])
    temps = HEAD_TEMPORARIES[settings.device]["backward" if backward else "forward"]
    if d["kind"] == "gemma4" and gemma4.text(config)["final_logit_softcapping"]:
        temps += gemma4.softcap_temporaries(settings.device)["backward" if backward else "forward"]
    # torch's fold and addmm work in fp32: a 16-bit tile (and weight) is copied up
    upcast = settings.device == "cpu" and a != 4
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
        how += f" + {temps} fp32 tile temporaries (torch fold, {settings.device})"
    if backward:
        total += tokens * H * 4
        how += " + fp32 grad of the hidden rows"
        if settings.lora is None:
            total += V * H * 4
            how += " + fp32 grad of the head's weight"
    how += f"; unfused log-softmax would hold N x V x 4 B = {tokens * V * 4 / 2**30:.2f} GiB"
    return int(total), how


def scored_positions(settings: Settings) -> int:
    """Positions the fused head scores per micro-batch: on CUDA (Triton) the B x C completion tokens; on CPU
    every position but the last, B x (P + C - 1) (`trl.trainer.utils.add_fused_lm_head`, `compact`); grpokit's loss
    pass hands the head each row's last prompt token and its completion, B x C positions scored on either device."""
    B, P, C = settings.per_device_train_batch_size, settings.prompt_length, settings.max_completion_length
    return B * C if settings.device == "cuda" or settings.shares_prompts else B * (P + C - 1)


def loss_passes(settings: Settings) -> list[tuple[int, int, int, bool]]:
    """The forwards one micro-batch's loss pass makes: (rows, query tokens a row, key tokens a row, padded).

    TRL's: every row from its first token, B x (P + C). grpokit's (`shared_prompt.logps_and_entropies`): the lead the
    prompts share, once (no padding: no mask); each distinct prompt's own tokens but its last, against the lead's keys
    and values (right-aligned, padded); then every row's last prompt token and completion against its prompt's keys
    and values. A prompt is planned at the longest prompt's P tokens, the lead at the one measured."""
    B, P, C = settings.per_device_train_batch_size, settings.prompt_length, settings.max_completion_length
    if not settings.shares_prompts:
        return [(B, P + C, P + C, True)]
    lead, n = settings.shared_lead, settings.distinct
    prompts = [(1, lead, lead, False), (n, P - lead - 1, P - 1, True)] if lead else [(n, P - 1, P - 1, True)]
    return prompts + [(B, 1 + C, P + C, True)]


def optimizer_step_bytes(settings: Settings, sizes: list[int], state_bytes: int) -> tuple[int, str]:
    """Temporaries of the optimizer step: AdamW's foreach path (CUDA's default) allocates sqrt(v) for every
    parameter at once; the single-tensor path (CPU's default) sqrt(v) and its quotient for one tensor."""
    if settings.optim not in ("adamw_torch", "adamw_torch_fused", "adamw_anyprecision"):
        return 0, "updated in place, block by block (bitsandbytes) or not modelled"
    if settings.optim == "adamw_torch_fused":
        return 0, "fused AdamW: in place"
    foreach = settings.foreach if settings.foreach is not None else settings.device == "cuda"
    if foreach:
        return sum(sizes) * state_bytes, f"foreach AdamW: sqrt(v) for all {sum(sizes):,} trainable values at once"
    return 2 * max(sizes) * state_bytes, "single-tensor AdamW: sqrt(v) and its quotient for the largest tensor"


def step_moments(config: dict, settings: Settings, static: list[Component], grads: Component, optim: Component,
                 dequant: int = 0) -> tuple[list[Phase], list[Phase]]:
    """(generation moments, training moments), each a full list of components (the static ones repeated);
    `dequant` is the largest dequantized weight a quantized base holds while one layer runs."""
    return (generation_moments(config, settings, static, optim),
            training_moments(config, settings, static, grads, optim, dequant))


def generation_moments(config: dict, settings: Settings, static: list[Component], optim: Component) -> list[Phase]:
    """The prefill, and the last decode step (the longest KV cache), of G = gen_batch sequences of P + C tokens.

    Only full-attention layers grow a KV cache (transformers' DynamicLayer, torch.cat per token); a Gated DeltaNet
    layer keeps a fixed state instead (`LinearAttentionLayer`): the conv's last K inputs in the model's dtype and the
    recurrent state, heads x dk x dv in fp32, per sequence, whatever the length."""
    d = dims(config)
    H, I, V, q, kv, n_full = d["H"], d["I"], d["V"], d["q"], d["kv"], d["n_full"]
    a = activation_bytes(settings)
    G, P = settings.gen_batch, settings.prompt_length
    S = P + settings.max_completion_length
    none_grads = Component("gradients", 0, "none yet: freed by zero_grad(set_to_none=True) after each optimizer step")
    if d["kind"] == "gemma4":
        return _gemma4_generation(config, settings, static + [none_grads, optim])
    kv_tok = n_full * 2 * kv * a
    mask_prefill = G * P * P * a  # the float padding mask of the prompt, one layer at a time
    # no dequantized weight without gradients: bitsandbytes' gemm_4bit reads the packed weight
    layer_ws = a * (2 * H + 2 * q + 2 * kv + 3 * I)
    state, state_how = 0, ""
    if d["n_linear"]:
        conv, lh, dk, dv = d["conv"], d["lh"], d["dk"], d["dv"]
        state = G * d["n_linear"] * (conv * d["conv_kernel"] * a + lh * dk * dv * 4)
        state_how = (f" + {d['n_linear']} Gated DeltaNet layers' fixed state, G x (conv {conv} x K {d['conv_kernel']} x {a} B"
                     f" + {lh} x {dk} x {dv} x 4 B)")
    per_sequence = P * layer_ws
    if d["n_linear"]:
        # the chunked rule without gradients, its transient peak measured on one layer (LiveTensors; Qwen3.5-0.8B's
        # widths and a 64-wide layer, 32-256 tokens) and fitted: 1.5 a (H + conv) per token, 4 (8 lh dk + 3.5 lh 64)
        # per token of the chunk-padded prompt, 13 fp32 state-sized temporaries; within 4 % of it at float32, and at
        # bfloat16 at 64 wide, while at Qwen3.5-0.8B's widths in bfloat16 it errs high by 10-25 % (short prompts most)
        padded = -(-P // CHUNK) * CHUNK
        chunked = 1.5 * a * (H + conv) * P + 4 * (8 * lh * dk + 3.5 * lh * CHUNK) * padded + 13 * lh * dk * dv * 4
        per_sequence = max(per_sequence, chunked)
    prefill_ws = int(G * per_sequence) + mask_prefill + G * V * (a + 4)
    cache = G * (S - 1) * kv_tok  # the last token is sampled, never fed back: P + C - 1 positions
    decode_ws = 2 * G * (S - 1) * kv * a + G * V * (a + 4 * 7)
    layers = f"{n_full} full-attention layers" if d["n_linear"] else "L"
    prefill_kv, prefill_how, turns, turns_how = G * P * kv_tok, f"G x P x {layers} x (k, v) x kv_dim x {a} B", 0, ""
    if settings.own_passes:  # grpokit.trainer.generation: each distinct prompt prefilled once, then copied into the batch's cache
        n, lead = -(-G // max(1, settings.num_generations)), settings.shared_lead
        prefill_ws = int(layer_ws * (lead + n * (P - lead))) + n * (P - lead) * P * a + G * V * (a + 4)
        prefill_kv += n * P * kv_tok
        prefill_how = f"G x P + {n} distinct prompts' kept states, x {layers} x (k, v) x kv_dim x {a} B (grpokit's prefill)"
        if settings.tool_rounds:  # a later turn copies the last turn's kept states into its cache, letting each layer
            turns = G * (S - 1) * 2 * kv * a  # go once copied: one layer of them beside the cache at most
            turns_how = " + one layer of the last turn's kept states (a tool round, grpokit's generation)"
    return [
        Phase("generation", "prefill", static + [none_grads, optim,
               Component("KV cache", prefill_kv + state, prefill_how + state_how),
               Component("generation workspace", prefill_ws, "one layer's no-grad activations of the prompts + float mask "
                    "+ last-position logits")]),
        Phase("generation", "last decode step", static + [none_grads, optim,
               Component("KV cache", cache + turns + state, f"G x (P + C - 1) x {layers} x (k, v) x kv_dim x {a} B = {G} x "
                         f"{S - 1} x {n_full} x 2 x {kv} x {a}" + turns_how + state_how),
               Component("generation workspace", decode_ws, "one layer's grown K/V (torch.cat copies) + logits and ~7 fp32 "
                    "G x V sampling tensors (GQA is packed, not expanded, for one query token)")]),
    ]


def _gemma4_generation(config: dict, settings: Settings, held: list[Component]) -> list[Phase]:
    """`generation_moments` of a Gemma 4 decoder: its cache by layer kind (`gemma4.kv_cache`), the prefill's
    workspace (`gemma4.prefill_workspace`); the logits of the last position, soft-capped out of place
    (`Gemma4ForCausalLM.forward`: / cap, tanh, * cap: two more G x V tensors at once)."""
    d, a = dims(config), activation_bytes(settings)
    G, P = settings.gen_batch, settings.prompt_length
    S = P + settings.max_completion_length
    cache_prefill, cache_last, cache_how = gemma4.kv_cache(config, G, P, S, a)
    ws, ws_how = gemma4.prefill_workspace(config, G, P, a)
    softcap = 2 * G * d["V"] * a if gemma4.text(config)["final_logit_softcapping"] else 0
    cat = 2 * G * max(min(S - 1, gemma4.text(config)["sliding_window"]) * gemma4.kind_dims(config, "sliding")["kv"],
                      (S - 1) * gemma4.kind_dims(config, "full")["kv"]) * a
    return [
        Phase("generation", "prefill", held + [Component("KV cache", cache_prefill, cache_how),
              Component("generation workspace", ws + G * d["V"] * (a + 4) + softcap,
                        ws_how + " + last-position logits (soft-capped)")]),
        Phase("generation", "last decode step", held + [Component("KV cache", cache_last, cache_how),
              Component("generation workspace", cat + G * d["V"] * (a + 4 * 7) + softcap,
                        "one layer's grown K/V (torch.cat) + logits (soft-capped) and ~7 fp32 G x V sampling tensors")]),
    ]


def training_moments(config: dict, settings: Settings, static: list[Component], grads: Component,
                     optim: Component, dequant: int = 0) -> list[Phase]:
    """One micro-batch of T = B x (P + C) tokens: the layers' forward, the fused head's forward and backward,
    the layers' backward, then the optimizer step."""
    d = dims(config)
    H, I = d["H"], d["I"]
    a = activation_bytes(settings)
    T = max(r * n for r, n, _, _ in loss_passes(settings))  # the largest forward's tokens
    held = _held_gradients(settings, grads)
    kept, kept_how, backward_acts, b_how = _saved_activations(config, settings)
    N = scored_positions(settings)
    hf, hf_how = head_bytes(config, settings, N, backward=False)
    hb, hb_how = head_bytes(config, settings, N, backward=True)
    if settings.shares_prompts and not settings.gradient_checkpointing:  # the prompts' caches live through the forward
        caches = prompt_caches(config, settings)
        hf, hf_how = hf + caches, hf_how + " + the prompts' keys and values (grpokit's pass, its forward)"
    # the layers' forward: what is kept so far, plus one layer's transient MLP and a dequantized weight (4/8-bit)
    transient = T * (4 * a * I + 2 * a * H) + dequant
    deq = " + one dequantized weight" if dequant else ""
    activations = Component("activations", backward_acts + dequant, b_how + deq)
    backward = _backward_peak(config, settings, held, grads, optim, activations)
    step, step_how = optimizer_step_bytes(settings, _trainable_sizes(config, settings), _state_bytes(settings))
    return [
        Phase("training", "forward", static + [held, optim, Component(
            "activations", kept + transient, kept_how + f" + one layer's transient T x (4x{a}I + 2x{a}H){deq}")]),
        Phase("training", "head forward", static + [held, optim, Component("activations", kept, kept_how),
                                                    Component("logits", hf, hf_how)]),
        Phase("training", "head backward", static + [held, optim, Component("activations", kept, kept_how),
                                                     Component("logits", hb, hb_how)]),
        Phase("training", "backward", static + backward),
        Phase("training", "optimizer step", static + [grads, optim, Component("optimizer step", step, step_how)]),
    ]


def _held_gradients(settings: Settings, grads: Component) -> Component:
    """Gradients of earlier micro-batches of the same optimizer step (gradient accumulation): alive throughout."""
    accumulating = settings.gradient_accumulation_steps > 1
    return Component("gradients", grads.bytes if accumulating else 0,
                     "earlier micro-batches' (gradient accumulation)" if accumulating
                     else "none yet (first micro-batch of the step)")


def _saved_activations(config: dict, settings: Settings) -> tuple[int, str, int, str]:
    """(bytes the layers keep for backward, how; bytes the layers' backward holds at its peak, how), per micro-batch.
    Layers of several kinds: without checkpointing each kind's layers keep their own; with it the largest kind's
    layer is the one recomputed at the backward's peak."""
    if settings.shares_prompts:
        return _own_saved_activations(config, settings)
    d = dims(config)
    H, L = d["H"], d["L"]
    a = activation_bytes(settings)
    B, S = settings.per_device_train_batch_size, settings.prompt_length + settings.max_completion_length
    T = B * S
    per_kind = [(kind, n, *layer_activations(config, settings, S, kind)) for kind, n, _ in layer_groups(config)]
    back = layer_backward(config, settings)
    mask = B * S * S  # the bool padding mask, made once per forward
    final = T * (4 * H + 4 + a * H)  # the final norm's saved input and output
    final_how = "final norm"
    if d["kind"] == "gemma4":  # a second mask for the sliding layers; the per-layer inputs live through the step
        mask *= gemma4.masks(config)
        ple, ple_how = gemma4.ple_activations(config, a)
        final, final_how = final + T * ple, final_how + " + " + ple_how
    if settings.gradient_checkpointing:
        kept = L * T * a * H + mask + final
        kept_how = f"checkpoints L x T x {a}H (T = {T} tokens) + {final_how}"
        kind, _, A, _ = max(per_kind, key=lambda k: k[2])
        recompute = T * (A + back)
        b_how = kept_how + f" + one {kind + ' ' if len(per_kind) > 1 else ''}layer recomputed and its backward, T x ({A} + {back}) B"
        return kept, kept_how, kept + recompute, b_how
    kept = sum(n * T * A for _, n, A, _ in per_kind) + mask + final
    kept_how = " + ".join(f"{n} x T x {A} B/token ({how})" for _, n, A, how in per_kind) + f" + {final_how}"
    return kept, kept_how, kept + T * back, kept_how + f" + backward T x {back} B"


def _own_saved_activations(config: dict, settings: Settings) -> tuple[int, str, int, str]:
    """`_saved_activations` of grpokit's loss pass (`loss_passes`: lead, distinct prompts, rows), whose families
    (grpokit.trainer.ownpasses.PROVEN) have full-attention layers only. Per layer and pass: each query token's activations
    (`layer_activations` but for its keys and values), the keys and values it attends to expanded to all heads (2 a q
    per key token), the float padding mask (a x query x key tokens); once a forward, the bool mask. Under gradient
    checkpointing the layers keep their inputs and the prompts' caches (a replay reads them): the lead's, the distinct
    prompts' and the rows' copies of them, each L x (k, v) x kv_dim."""
    d = dims(config)
    H, L, q = d["H"], d["L"], d["q"]
    a = activation_bytes(settings)
    A, how = layer_activations(config, settings, 0, "full")
    per_query = A - 2 * a * q
    passes = loss_passes(settings)
    tokens = sum(r * n for r, n, _, _ in passes)

    def layer(r: int, n: int, k: int, masked: bool) -> int:
        return r * n * per_query + r * k * 2 * a * q + (r * n * k * a if masked else 0)

    masks = sum(r * n * k for r, n, k, masked in passes if masked)
    final = tokens * (4 * H + 4 + a * H)
    back = layer_backward(config, settings)
    shape = " + ".join(f"{r}x{n}" for r, n, _, _ in passes)
    how_tokens = f"grpokit's pass, {shape} = {tokens} tokens (lead, prompts, rows)"
    if settings.gradient_checkpointing:
        kept = L * tokens * a * H + masks + final + prompt_caches(config, settings)
        kept_how = f"checkpoints L x {tokens} tokens x {a}H ({how_tokens}) + the prompts' caches + final norm"
        r, n, k, m = max(passes, key=lambda p: layer(*p))
        recompute = layer(r, n, k, m) + r * n * back
        return kept, kept_how, kept + recompute, kept_how + f" + the rows' layer recomputed and its backward ({r}x{n})"
    kept = L * sum(layer(*p) for p in passes) + masks + final
    kept_how = f"L x ({per_query} B/query token + {2 * a}q per key token + float masks), {how_tokens} + final norm"
    r, n, _, _ = passes[-1]
    return kept, kept_how, kept + r * n * back, kept_how + f" + backward {r}x{n} x {back} B"


def prompt_caches(config: dict, settings: Settings) -> int:
    """Keys and values of grpokit's loss pass's prompts, unexpanded (kv_dim wide): the lead's (one row), the distinct
    prompts' after it, and the rows' copies (`index_select`), alive while the pass's forward runs."""
    d = dims(config)
    P, lead = settings.prompt_length, settings.shared_lead
    tokens = lead + (settings.distinct + settings.per_device_train_batch_size) * (P - 1)
    return d["L"] * 2 * d["kv"] * activation_bytes(settings) * tokens


def _backward_peak(config: dict, settings: Settings, held: Component, grads: Component, optim: Component,
                   activations: Component) -> list[Component]:
    """The layers' backward at its peak, less the static components."""
    if settings.lora:  # the adapters' gradients are small: the backward peaks at its first recomputed layer
        return [grads, optim, activations]
    # a full fine-tune: the head's weight gradient from the start; at the end every gradient, and
    # with tied embeddings the head's gradient waits for the embedding's dense one, and their sum is a third
    d = dims(config)
    head_grad = d["V"] * d["H"] * activation_bytes(settings)
    start = [Component("gradients", head_grad + held.bytes, "the head's weight (V x H), from its backward"), optim,
             activations]
    tied = 2 * head_grad if d["tied"] else 0
    end = [grads, optim, Component("activations", tied, "tied embeddings: the embedding's dense gradient and its sum "
                                   "with the head's (V x H each)" if tied else "the last layers' gradients in flight")]
    return max(start, end, key=lambda parts: sum(c.bytes for c in parts))


def _trainable_sizes(config: dict, settings: Settings) -> list[int]:
    lora = settings.lora
    if lora:
        return lora_tensors(config, lora.get("r", 8), lora.get("target_modules", "all-linear"), bool(lora.get("use_dora")))
    c = param_counts(config)
    largest = largest_linear(config)
    # the total, split so that max() is the largest single tensor: embedding, head, one linear weight
    return [c["embedding"], c["lm_head"], largest, c["total"] - c["embedding"] - c["lm_head"] - largest]


def _state_bytes(settings: Settings) -> int:
    return adapter_bytes(settings) if settings.lora else DTYPE_BYTES[settings.dtype]
