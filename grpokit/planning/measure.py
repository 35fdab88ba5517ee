"""Bytes of live tensors, by component and by moment of a GRPO step: what the memory plan is checked against.

    >>> import torch
    >>> with LiveTensors() as live:
    ...     a = torch.zeros(256)                      # 1 KiB, tagged with the current region
    ...     with live.region("logits"):
    ...         b = torch.ones(512)                   # 2 KiB
    ...     del b
    ...     _ = live.moment("optimizer step")
    ...     c = a + 1                                 # another 1 KiB while a lives
    >>> live.peaks["default"].total, live.peaks["default"].parts["logits"]
    (3072, 2048)
    >>> live.peaks["optimizer step"].total
    2048

A `TorchDispatchMode` sees every tensor an operator returns, on any device. Each new storage is counted
once (views share it) until the storage is freed, which a weak reference's callback reports; its bytes go
to a *tag* (the component the plan names: weights, gradients, KV cache, ...). The tag is the current
region when the storage appears, and can be changed later (`retag`): a gradient is made by the backward
as an ordinary tensor and becomes "gradients" when autograd accumulates it into `.grad`.

What this counts is what `torch.cuda.max_memory_allocated` would count on a GPU for the same program, less
two things it cannot see: memory a kernel takes for itself inside one operator (cuBLAS workspaces, a
Triton kernel's scratch) and the caching allocator's rounding (512-byte blocks) and fragmentation. Those
are what a GPU run measures on top (`bench/gpu_memory.py`).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from grpokit import trl_compat

TorchDispatchMode, tree_map_only = trl_compat.torch_dispatch()  # torch internals, checked in trl_compat
storage_key = trl_compat.storage_key

DEFAULT_TAG = "activations"


@dataclass
class Peak:
    """The most live bytes seen within one moment, and how they split by tag at that instant."""

    total: int = 0
    parts: dict[str, int] = field(default_factory=dict)


class LiveTensors(TorchDispatchMode):
    """Counts live tensor storages; keeps each moment's peak with its split by tag.

    `moment(name)` starts a moment (the previous one ends); `region(tag)` tags what is allocated inside
    it; `track(tensor, tag)` counts a tensor made before the counter started (weights, say).
    """

    def __init__(self, moment: str = "default", on_moment=None):
        super().__init__()
        self.on_moment = on_moment  # called (ending, starting) at each moment change: a GPU run reads its allocator there
        self._live: dict[int, list] = {}  # storage key -> [nbytes, tag, weakref]
        self.by_tag: dict[str, int] = {}
        self.total = 0
        self.tag = DEFAULT_TAG
        self.current = moment
        self.peaks: dict[str, Peak] = {moment: Peak()}

    # -- counting ------------------------------------------------------------------------------------

    def _add(self, st: torch.UntypedStorage, tag: str) -> None:
        key = storage_key(st)
        entry = self._live.get(key)
        n = st.nbytes()
        if entry is not None:
            if entry[0] != n:  # resized in place (an out= argument): count the new size
                self._move(entry, n, entry[1])
            return
        entry = [0, tag, weakref.ref(st, lambda _ref, k=key: self._drop(k))]
        self._live[key] = entry
        self._move(entry, n, tag)

    def _move(self, entry: list, nbytes: int, tag: str) -> None:
        self.by_tag[entry[1]] = self.by_tag.get(entry[1], 0) - entry[0]
        self.by_tag[tag] = self.by_tag.get(tag, 0) + nbytes
        self.total += nbytes - entry[0]
        entry[0], entry[1] = nbytes, tag

    def _drop(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self._move(entry, 0, entry[1])

    def _storages(self, tensor: torch.Tensor):
        if tensor.device.type == "meta" or not hasattr(tensor, "untyped_storage"):
            return
        try:
            yield tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, a subclass)
            return

    def _note_peak(self) -> None:
        peak = self.peaks[self.current]
        if self.total > peak.total:
            peak.total = self.total
            peak.parts = {k: v for k, v in self.by_tag.items() if v}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, lambda t: [self._add(st, self.tag) for st in self._storages(t)], out)
        self._note_peak()
        return out

    # -- telling it what things are ------------------------------------------------------------------

    def track(self, tensor: torch.Tensor, tag: str) -> None:
        """Count a tensor under `tag`, or move it there if already counted (a gradient, an optimizer state)."""
        for st in self._storages(tensor):
            entry = self._live.get(storage_key(st))
            if entry is None:
                self._add(st, tag)
            elif entry[1] != tag:
                self._move(entry, entry[0], tag)
        self._note_peak()

    @contextmanager
    def region(self, tag: str):
        """Tag what is allocated inside the block with `tag` (nested regions restore the outer one)."""
        outer, self.tag = self.tag, tag
        try:
            yield
        finally:
            self.tag = outer

    def moment(self, name: str) -> str:
        """Start moment `name` (a peak is kept per moment name, over all its occurrences); returns the previous."""
        previous, self.current = self.current, name
        if self.on_moment is not None and previous != name:
            self.on_moment(previous, name)
        self.peaks.setdefault(name, Peak())
        self._note_peak()
        return previous

    def reset_peaks(self) -> None:
        """Forget the peaks so far (a warm-up step): moments start again from what is live now."""
        self.peaks = {self.current: Peak()}
        self._note_peak()

    def phase_peak(self, moments) -> tuple[str, Peak]:
        """The highest of the named moments: (its name, its peak)."""
        seen = [(m, self.peaks[m]) for m in moments if m in self.peaks]
        return max(seen, key=lambda mp: mp[1].total, default=("none", Peak()))


# --------------------------------------------------------------------------------------------------
# Wiring a GRPOTrainer to the counter

GENERATION = "generation"
# The moments of a training step, in order (a step is generation, then these); the plan models the same ones.
TRAINING_MOMENTS = ("scoring", "forward", "head forward", "head backward", "backward", "optimizer step", "other")


@contextmanager
def instrument(trainer, live: LiveTensors, warmup_steps: int = 0):
    """Tell `live` what a GRPOTrainer's tensors are and which moment of the step is running.

    Counts the weights, trainable parameters, quantization states and reference model present before
    training; tags gradients as autograd accumulates them, optimizer states after each step, the KV cache
    as generation grows it, and the fused LM head's tensors as "logits". Moments: generation, then scoring
    (old / reference log-probs, rewards), forward, head forward, head backward, backward, optimizer step.
    Peaks are forgotten after `warmup_steps` optimizer steps (a run's first step creates the optimizer states).
    """
    trl_compat.check_library_internals(("transformers.cache_utils:DynamicLayer.update",))
    cache_layer = trl_compat.dynamic_cache_layer()
    head = trl_compat.fused_head_function()
    params = list(trainer.model.parameters())
    _track_before_training(trainer, params, live)
    hooks = _gradient_hooks(params, live)
    callback = _retag_states_on_train_begin(trainer, live)
    trainer.add_callback(callback)
    if trainer.optimizer is not None:  # created (and stepped) before: its states exist already
        _tag_optimizer_states(trainer.optimizer, live)
    hooks += _OptimizerStepMoment(live, warmup_steps).register()
    methods = _wrap_step_methods(trainer, live)
    kernels = _wrap_kernels(head, cache_layer, live)
    try:
        yield live
    finally:
        _restore_kernels(head, cache_layer, kernels)
        _restore_methods(methods)
        for h in hooks:
            h.remove()
        trainer.remove_callback(callback)


def _track_before_training(trainer, params: list, live: LiveTensors) -> None:
    """Count what exists before the first step: weights (with their quantization states), buffers, the reference."""
    frozen = any(not p.requires_grad for p in params)  # LoRA / QLoRA: the base is frozen
    for p in params:
        live.track(p, "trainable params" if p.requires_grad and frozen else "weights")
        for t in _quant_tensors(p):
            live.track(t, "weights")
    for b in trainer.model.buffers():
        live.track(b, "weights")
    if getattr(trainer, "ref_model", None) is not None:
        for t in list(trainer.ref_model.parameters()) + list(trainer.ref_model.buffers()):
            live.track(t, "reference model")


def _gradient_hooks(params: list, live: LiveTensors) -> list:
    """Tag each trainable parameter's `.grad` as "gradients" when autograd accumulates into it; the hook handles."""
    return [p.register_post_accumulate_grad_hook(lambda p: live.track(p.grad, "gradients"))
            for p in params if p.requires_grad]


def _tag_optimizer_states(optimizer, live: LiveTensors) -> None:
    for state in optimizer.state.values():
        for t in state.values():
            if isinstance(t, torch.Tensor):
                live.track(t, "optimizer states")


def _retag_states_on_train_begin(trainer, live: LiveTensors):
    """A trainer callback tagging the optimizer's states again when training begins: accelerate's prepare()
    reloads the optimizer's state dict (bitsandbytes copies its states)."""
    from transformers import TrainerCallback  # deferred: importing this module does not load transformers

    class RetagStates(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if trainer.optimizer is not None:
                _tag_optimizer_states(trainer.optimizer, live)

    return RetagStates()


class _OptimizerStepMoment:
    """The optimizer step as moment "optimizer step" (its temporaries tagged so), the states it made tagged after
    it, then moment "other"; the peaks are forgotten after `warmup_steps` steps."""

    def __init__(self, live: LiveTensors, warmup_steps: int):
        self.live, self.warmup_steps = live, warmup_steps
        self.steps = 0
        self.outer_tags: list[str] = []

    def register(self) -> list:
        """Install the step's pre and post hooks on every optimizer; their handles."""
        return [register_optimizer_step_pre_hook(self.pre), register_optimizer_step_post_hook(self.post)]

    def pre(self, optimizer, args, kwargs) -> None:
        self.live.moment("optimizer step")
        self.outer_tags.append(self.live.tag)
        self.live.tag = "optimizer step"  # what the step allocates and frees again: its temporaries

    def post(self, optimizer, args, kwargs) -> None:
        _tag_optimizer_states(optimizer, self.live)
        self.live.tag = self.outer_tags.pop()
        self.live.moment("other")
        self.steps += 1
        if self.steps == self.warmup_steps:
            self.live.reset_peaks()


def _in_moment(live: LiveTensors, fn, moment: str, after: str, tag: str | None = None):
    """`fn` running as moment `moment`, what it allocates tagged `tag` (default: the tag around it); then `after`."""
    def wrapped(*a, **k):
        live.moment(moment)
        outer = live.tag
        live.tag = tag or outer
        try:
            return fn(*a, **k)
        finally:
            live.tag = outer
            live.moment(after)
    return wrapped


def _wrap_step_methods(trainer, live: LiveTensors) -> list[tuple]:
    """Run generation, the loss and the backward as moments; returns (object, name, its own attribute or None),
    what `_restore_methods` puts back."""
    target = trainer.accelerator.unwrap_model(trainer.model_wrapped)  # what TRL calls generate on
    patched = [(obj, name, vars(obj).get(name)) for obj, name in
               ((target, "generate"), (trainer, "compute_loss"), (trainer.accelerator, "backward"))]
    target.generate = _in_moment(live, target.generate, GENERATION, "scoring", tag="generation workspace")
    trainer.compute_loss = _in_moment(live, trainer.compute_loss, "forward", "other")
    trainer.accelerator.backward = _in_moment(live, trainer.accelerator.backward, "backward", "other")
    return patched


def _restore_methods(patched: list[tuple]) -> None:
    for obj, name, own in patched:  # back to the instance's own attribute, or to the class's method
        if own is None:
            vars(obj).pop(name, None)
        else:
            setattr(obj, name, own)


def _wrap_kernels(head, cache_layer, live: LiveTensors) -> tuple:
    """Patch the fused LM head's forward and backward and the KV cache layer's update; returns the originals."""
    originals = head.forward, head.backward, cache_layer.update
    forward, backward, update = originals
    head.forward = staticmethod(_head_forward(live, forward))
    head.backward = staticmethod(_head_backward(live, backward))
    cache_layer.update = _kv_cache_update(live, update)
    return originals


def _restore_kernels(head, cache_layer, originals: tuple) -> None:
    forward, backward, update = originals
    head.forward, head.backward, cache_layer.update = staticmethod(forward), staticmethod(backward), update


def _head_forward(live: LiveTensors, forward):
    """The fused head's forward as moment "head forward", its tensors tagged "logits"."""
    def wrapped(ctx, *a, **k):
        with live.region("logits"):
            if not torch.is_grad_enabled() and live.current != "forward":
                return forward(ctx, *a, **k)  # a scoring pass: stays in its moment
            previous = live.moment("head forward")
            try:
                return forward(ctx, *a, **k)
            finally:
                live.moment(previous)
    return wrapped


def _head_backward(live: LiveTensors, backward):
    """The fused head's backward as moment "head backward", its tensors tagged "logits"."""
    def wrapped(ctx, *a):
        previous = live.moment("head backward")
        try:
            with live.region("logits"):
                return backward(ctx, *a)
        finally:
            live.moment(previous)
    return wrapped


def _kv_cache_update(live: LiveTensors, update):
    """transformers' KV cache layer update, the whole cache tagged "KV cache" after it (each decode step
    concatenates onto it)."""
    def wrapped(layer, *a, **k):
        out = update(layer, *a, **k)
        live.track(layer.keys, "KV cache")
        live.track(layer.values, "KV cache")
        return out
    return wrapped


def _quant_tensors(p) -> list:
    """The tensors bitsandbytes keeps beside a quantized weight: 4-bit absmax and code (nested too), 8-bit row scales."""
    out = []
    state = getattr(p, "quant_state", None)
    while state is not None:
        out += [t for t in (getattr(state, "absmax", None), getattr(state, "code", None)) if isinstance(t, torch.Tensor)]
        state = getattr(state, "state2", None)
    scb = getattr(p, "SCB", None)
    return out + ([scb] if isinstance(scb, torch.Tensor) else [])
