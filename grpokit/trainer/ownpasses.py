"""Where grpokit's own passes run in place of TRL's, and the check on a run's first step that they still agree.

grpokit computes two things another way than TRL: the loss pass with each prompt (and the lead all prompts share)
computed once (grpokit.trainer.shared_prompt), and generation from kept prefixes (grpokit.trainer.generation). Both stand in for
TRL's method only where that is proven, twice over:

- per family, by a test: `tests/trainer/test_ownpasses.py` runs both methods on a tiny random instance of each family
  in `PROVEN` and finds them equal (float32); a family not there, or a model whose generation cache holds anything but
  plain keys and values per token (Qwen3.5's linear-attention state, Gemma's sliding windows), runs TRL's method;
- per run, on its first step: the tests ran on a CPU in float32, a run computes on its own device, dtype and attention
  kernels (CUDA, bfloat16, SDPA or flash attention). The first micro-batch each pass serves is computed by TRL's
  method as well and compared (the loss pass: the log-probabilities of the completion's tokens; generation: the
  next-token distribution its prefill ends with); past `TOLERANCE` for the run's dtype, TRL's method runs for the
  rest of the run and the console says why in one line. The figures are logged (`own_passes/*` at step 1), and the
  run's report says them.

What the check costs: one more pass of TRL's own over that micro-batch, without gradient, once per run
(bench/own_pass_check.py measures it; bench/README.md has the figures).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from grpokit import trl_compat

# model_type -> the family whose tiny instance tests/trainer/test_ownpasses.py proves both passes on. A model_type
# absent here runs TRL's method: no test has compared them on it.
PROVEN = {"llama": "Llama 3.2", "qwen2": "Qwen2.5", "qwen3": "Qwen3", "smollm3": "SmolLM3"}

# How far our pass's log-probabilities may stray from TRL's method's on the same rows, by compute dtype: the mean
# absolute difference of the log-probabilities of the tokens drawn (see `disagreement`). Measured on a CPU
# (bench/own_pass_check.py, bench/README.md): rounding alone moves them by 3e-7 to 2e-6 in float32 and by up to 0.035
# in bfloat16 (SmolLM2-135M; two forwards of other shapes round each its own way), while a real fault -- rows reading
# another prompt's keys and values -- moves them by 0.45 to 0.76 in either dtype. Each bound sits between: float32's
# 50x over its rounding, bfloat16's ~3x over it and ~5x under the smallest fault seen; float16 (3 more mantissa bits
# than bfloat16) 5x tighter than bfloat16's. Not yet measured on a GPU's kernels, which is what the check is for.
TOLERANCE = {"float32": 1e-4, "bfloat16": 0.1, "float16": 0.02}
# Logged at step 1 ({} = loss or generation): the disagreement found, its tolerance, and 1.0 when TRL's method took over
METRIC, TOLERANCE_METRIC, FELL_BACK = "own_passes/{}_check", "own_passes/{}_tolerance", "own_passes/{}_fell_back"


@dataclass(frozen=True)
class Verdict:
    runs: bool
    why: str
    known: bool = True  # False: the model's config could not be read here (--check offline); the run decides


def verdict(config) -> Verdict:
    """Whether grpokit's own passes may run on a model with this transformers config, and why (for --check and
    the passes' `fits`)."""
    try:
        model_type = config.get_text_config(decoder=True).model_type
    except Exception:  # noqa: BLE001 - not a transformers config: nothing proven on it
        return Verdict(False, "not a transformers model config")
    if not trl_compat.plain_dynamic_cache(config):
        kinds = sorted({layer for layer in getattr(config.get_text_config(decoder=True), "layer_types", None) or []})
        return Verdict(False, f"layer kinds {', '.join(kinds) or 'not plain'}: its cache is not plain keys and values "
                       "per token in every layer, which grpokit's passes slice and join")
    if model_type not in PROVEN:
        return Verdict(False, f"no test compares them with TRL's method on model_type {model_type} (proven on: "
                       f"{', '.join(sorted(PROVEN))})")
    # named by the architecture the model shares with the test's instance: SmolLM2 is model_type llama, so the
    # proof on the tiny Llama 3.2 covers it
    return Verdict(True, f"proven equal to TRL's method on its architecture (model_type {model_type}), on a tiny "
                   f"{PROVEN[model_type]} (tests/trainer/test_ownpasses.py)")


def verdict_for(name_or_path: str) -> Verdict:
    """`verdict` for a recipe's model, from its config.json alone (no weights; --check)."""
    from transformers import AutoConfig

    from grpokit.planning.architecture import ConfigNotFound, load_model_config

    try:
        values, _ = load_model_config(name_or_path)
    except ConfigNotFound:
        return Verdict(False, "its config.json is not reachable offline", known=False)
    values = dict(values)
    try:
        config = AutoConfig.for_model(values.pop("model_type", None), **values)
    except Exception:  # noqa: BLE001 - a model_type this transformers does not know: nothing proven on it
        return Verdict(False, "its model_type is not one this transformers knows")
    return verdict(config)


def explain(args, sampling: dict, model: dict) -> str:
    """--check's and the report's row: which method computes the loss pass and generation, and why."""
    if not sampling.get("reuse_prefix", True):
        return "TRL's own loss pass and generation (sampling.reuse_prefix: false)"
    found = verdict_for(model["name_or_path"])
    if not found.known:
        return f"decided when the run reads the model's config ({found.why}): {', '.join(sorted(PROVEN))} run grpokit's"
    if not found.runs:
        return f"TRL's own passes: {found.why}"
    where = "the loss pass" if args.use_vllm else "the loss pass and generation"
    bounds = ", ".join(f"{v:g} in {k}" for k, v in TOLERANCE.items())
    tools = "" if args.use_vllm else ", a tool round from kept keys and values"
    return (f"grpokit's in {where}, {found.why}; each prompt computed once for its copies{tools}; on the first step "
            f"each is compared with TRL's method on its first micro-batch (mean |Δ log-prob| within {bounds}, else "
            "TRL's method for the rest of the run), at the cost of one more no-grad pass, once (bench/README.md)")


def compute_dtype(trainer, model) -> str:
    """The dtype the forward computes in: autocast's when the run sets bf16 or fp16, else the coarsest of the model's
    floating weights (a bfloat16 base under float32 LoRA computes in bfloat16)."""
    import torch

    if getattr(trainer.args, "bf16", False):
        return "bfloat16"
    if getattr(trainer.args, "fp16", False):
        return "float16"
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    coarsest = max(dtypes, key=lambda d: torch.finfo(d).eps, default=torch.float32)
    return str(coarsest).removeprefix("torch.")


def disagreement(ours, theirs, mask) -> float:
    """Mean |ours - theirs| over the positions `mask` keeps: log-probabilities of the tokens drawn, per position."""
    mask = mask.to(ours.dtype)
    return float(((ours.float() - theirs.float()).abs() * mask).sum() / mask.sum().clamp(min=1))


def expected_disagreement(our_logits, their_logits) -> float:
    """How far two next-token distributions' log-probabilities differ where it counts: the mean |Δ log p| of the token
    drawn, expected under TRL's distribution (sum_v p(v) |Δ log p(v)|), averaged over rows."""
    import torch

    ours, theirs = torch.log_softmax(our_logits.float(), -1), torch.log_softmax(their_logits.float(), -1)
    return float((theirs.exp() * (ours - theirs).abs()).sum(-1).mean())


def draws_dropout(model) -> bool:
    """Whether a forward of `model` now draws dropout masks (training, and a dropout of p > 0 in it)."""
    import torch

    if not model.training:
        return False
    attention = getattr(getattr(model, "config", None), "attention_dropout", 0) or 0
    return attention > 0 or any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


@contextmanager
def dropout_off(model):
    """Dropout off for the forwards inside (two passes compared draw no masks of their own); the model's training flag
    back after."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


class FirstStepCheck:
    """A trainer's check of its own passes on the first micro-batch each serves: `pending(which)` until judged."""

    def __init__(self, say=None):
        from grpokit.dist import say as default

        self.say = say or default
        self.judged: dict[str, tuple[float, float, str]] = {}  # which -> (disagreement, tolerance, dtype)

    def pending(self, which: str) -> bool:
        return which not in self.judged

    def judge(self, trainer, which: str, found: float, dtype: str, attention: str | None) -> bool:
        """Record the disagreement `found` for `which` ("loss" or "generation"); False (said in one line) past the
        tolerance for `dtype`, when TRL's method is to run for the rest of the run."""
        tolerance = TOLERANCE.get(dtype, TOLERANCE["float32"])
        self.judged[which] = (found, tolerance, dtype)
        sink = trl_compat.metric_sink(trainer)
        sink(METRIC.format(which), found)
        sink(TOLERANCE_METRIC.format(which), tolerance)
        agrees = found <= tolerance
        sink(FELL_BACK.format(which), float(not agrees))
        if not agrees:
            what = "the loss pass's shared prompts" if which == "loss" else "generation's kept prefixes"
            self.say(f"first-step check: {what} differ from TRL's method by {found:.3g} (mean |Δ log-prob|, tolerance "
                     f"{tolerance:g} in {dtype}, attention {attention or 'default'}): TRL's method runs for the rest "
                     "of the run")
        return agrees


def attention_of(model) -> str | None:
    return getattr(getattr(model, "config", None), "_attn_implementation", None)
