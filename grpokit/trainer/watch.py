"""A run measuring its own memory, phase by phase, beside its plan evaluated at the shapes each step really had.

A step has two phases: generation (TRL's `_generate_and_score_completions`: the rollouts, their tool rounds, the
rewards) and training (the loss passes, the backward and the optimizer step, to the step's end). The device's peak is
reset as a phase starts and read as it ends:

- on CUDA, `torch.cuda.max_memory_allocated` (live tensors: what the plan counts) and `max_memory_reserved` (what the
  caching allocator held, fragmentation included);
- on a CPU, the process's peak resident memory (Linux's VmHWM, reset through /proc/self/clear_refs), set beside the
  plan plus what the process held apart from tensors as training began: the interpreter and its libraries, its
  resident memory then less the model's tensors (measured, not assumed). Tool workers are processes of their own and
  count in neither.

Beside each measurement, `memory.plan` at that step's shapes: its widest prompt and completion (tool results
included), its rows, the distinct prompts and the lead they share, its tool rounds. So a ratio compares like with like;
the recipe's bound (its worst case) is said beside it. The console has one line after the first step and one whenever
a later step sets a new peak; each step logs `memory/*` metrics; report.md has a section (grpokit.reporting.report).
A ratio outside RATIO_BAND is said, with what the plan leaves out on that device.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field, replace
from pathlib import Path

from grpokit import files, trl_compat
from grpokit.planning import memory

GIB = memory.GIB
RATIO_BAND = (0.85, 1.15)  # measured / planned at the step's shapes: outside it, the run says so
PHASES = ("generation", "training")
METRIC = "memory/{phase}_{what}_gib"  # what: measured, planned, reserved (CUDA), bound
LEFT_OUT = {
    "cpu": ("memory the process holds beside its tensors within a phase (the allocator's free blocks, kernels' "
            "scratch; the tensors themselves are planned within 3 %: bench/README.md)"),
    "cuda": "kernel workspaces (cuBLAS, Triton's scratch) and the caching allocator's rounding",
}


@dataclass(frozen=True)
class Shapes:
    """What a step's memory depends on, as the step had it: rows generated (G), the widest prompt (P) and completion
    (C, tool results included), training rows a micro-batch (B), distinct prompts a micro-batch, the lead every prompt
    shares, and tool rounds (results fed back within a rollout, at most)."""

    rows: int
    prompt: int
    completion: int
    micro_batch: int
    distinct: int
    lead: int = 0
    tool_rounds: int = 0

    def text(self) -> str:
        """>>> Shapes(16, 469, 192, 16, 4, 400, 2).text()
        'G 16, P 469, C 192, B 16 (4 distinct prompts, lead 400), 2 tool rounds'"""
        lead = f", lead {self.lead}" if self.lead else ""
        rounds = f", {self.tool_rounds} tool round{'s' * (self.tool_rounds != 1)}" if self.tool_rounds else ""
        return (f"G {self.rows}, P {self.prompt}, C {self.completion}, B {self.micro_batch} ({self.distinct} distinct "
                f"prompt{'s' * (self.distinct != 1)}{lead}){rounds}")

    def size(self) -> int:
        """Tokens of the step's largest pass, to pick the largest step (ties: the later)."""
        return self.rows * (self.prompt + self.completion)


def shapes_of(output: dict, micro_batch: int) -> Shapes:
    """The shapes of one generation batch, from what `_generate_and_score_completions` returns (left-padded prompt ids
    and mask, right-padded completion ids and mask, the tool mask where tools ran)."""
    import torch

    from grpokit.trainer.shared_prompt import common_prefix

    prompt_mask, completion_mask = output["prompt_mask"], output["completion_mask"]
    lengths = prompt_mask.sum(dim=1)
    ids = output["prompt_ids"]
    prompts = [ids[i, ids.size(1) - int(n):] for i, n in enumerate(lengths.tolist())]
    distinct = 0
    for start in range(0, len(prompts), micro_batch):
        chunk = {tuple(p.tolist()) for p in prompts[start:start + micro_batch]}
        distinct = max(distinct, len(chunk))
    unique = list({tuple(p.tolist()): p for p in prompts}.values())
    rounds = 0
    if output.get("tool_mask") is not None:  # a tool result is a run of 0s inside the completion
        mask = output["tool_mask"] * completion_mask
        starts = (mask[:, 1:] == 0) & (mask[:, :-1] == 1) & (completion_mask[:, 1:] == 1)
        rounds = int(starts.sum(dim=1).max()) if starts.numel() else 0
    return Shapes(rows=int(ids.size(0)), prompt=int(lengths.max()), completion=int(completion_mask.sum(dim=1).max()),
                  micro_batch=micro_batch, distinct=distinct, lead=common_prefix(unique) if len(unique) > 1 else 0,
                  tool_rounds=rounds)


# --------------------------------------------------------------------------------------------------
# The device's peak


def device_of(model) -> str:
    """"cuda" where the model's weights are on a GPU, else "cpu"."""
    first = next(model.parameters(), None)
    return "cuda" if first is not None and first.device.type == "cuda" else "cpu"


def _kib_figure(path: str, key: str) -> int | None:
    """A `key: N kB` figure of a /proc file, in bytes, or None where there is none."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _status(key: str) -> int | None:
    """A byte figure of /proc/self/status (VmRSS, VmHWM, VmSize), or None where there is none."""
    return _kib_figure("/proc/self/status", key)


def resident() -> int:
    """This process's resident memory now, in bytes (0 where /proc is not there)."""
    return _status("VmRSS") or 0


class Peak:
    """The device's peak since the last `reset`: CUDA's allocator counters, or the process's peak resident memory.
    `resettable`: False where the CPU's peak cannot be reset (no writable /proc/self/clear_refs): it is then the peak
    since the process started, said so."""

    def __init__(self, device: str):
        self.device = device
        self.resettable = device == "cuda" or self._clear_refs()

    @staticmethod
    def _clear_refs() -> bool:
        # "5": the kernel resets the peak resident set size (VmHWM) to the current one
        return files.tell_kernel("/proc/self/clear_refs", "5") and _status("VmHWM") is not None

    def reset(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        elif self.resettable:
            give_back_free_memory()  # else the phase's peak starts from what the last phase's freed tensors left held
            self._clear_refs()

    def read(self) -> tuple[int, int | None]:
        """(peak bytes, CUDA's peak reserved bytes or None)."""
        if self.device == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())
        hwm = _status("VmHWM")
        if hwm is None:
            hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return hwm, None

    def how(self) -> str:
        if self.device == "cuda":
            return "torch.cuda.max_memory_allocated, reset at each phase"
        if self.resettable:
            return "peak resident memory (VmHWM), reset at each phase"
        return "peak resident memory since the process started (ru_maxrss: /proc/self/clear_refs is not writable here)"


def give_back_free_memory() -> bool:
    """Hand the memory glibc's allocator keeps free (tensors freed, kept for reuse) back to the system: a CPU run's
    resident memory is then what it holds live, and a phase's peak is its own. False where this is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0) >= 0)
    except (OSError, AttributeError):
        return False


def capacity(device: str) -> tuple[int | None, str]:
    """(bytes this run may hold on `device`, where that figure comes from): the GPU's total memory; on a CPU the
    smallest of the machine's memory, a cgroup's limit and an address-space limit (`ulimit -v`, counted as what this
    process's resident memory could still grow to)."""
    if device == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info()
        return int(total), f"{torch.cuda.get_device_name(0)}, {total / GIB:.1f} GiB"
    limits = []
    total = _kib_figure("/proc/meminfo", "MemTotal")
    if total:
        limits.append((total, "the machine's memory"))
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < (total or 2**62):
            limits.append((int(value), "a cgroup's memory limit"))
    left = trl_compat.address_space_left()
    if left != float("inf"):
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        limits.append((max(0, int(left) + resident()), f"an address-space limit (ulimit -v {soft // 1024})"))
    if not limits:
        return None, "not known here"
    value, how = min(limits)
    return value, f"{how}, {value / GIB:.1f} GiB"


def tensor_bytes(*modules) -> int:
    """Bytes of the parameters and buffers of `modules` (each storage once)."""
    seen, total = set(), 0
    for module in modules:
        if module is None:
            continue
        for t in list(module.parameters()) + list(module.buffers()):
            key = trl_compat.storage_key(t.untyped_storage())
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


# --------------------------------------------------------------------------------------------------
# The watch


@dataclass
class Reading:
    """One phase of one step: measured against planned at the step's shapes (both in bytes)."""

    phase: str
    step: int
    measured: int
    planned: int
    shapes: Shapes
    reserved: int | None = None

    @property
    def ratio(self) -> float:
        return self.measured / self.planned if self.planned else float("nan")


@dataclass
class Watch:
    """What one run measures of itself; `config` and `knobs` are `memory.plan_knobs`' for the run's model and recipe,
    `bound` the plan at the recipe's worst-case shapes."""

    config: dict
    knobs: dict
    device: str
    bound: memory.Plan
    peak: Peak
    baseline: int = 0  # CPU: resident bytes that are not tensors the plan counts
    phase: str | None = None
    step: int = 0
    shapes: Shapes | None = None
    largest: dict = field(default_factory=dict)  # phase -> the Reading at the largest peak so far
    pending: list = field(default_factory=list)  # this step's generation reading, until the step ends
    readings_logged: bool = False
    own: object = None  # () -> whether grpokit's passes run now (TRL's method takes over if the first step's check fails)

    def plan_at(self, shapes: Shapes) -> memory.Plan:
        """The plan at `shapes` (the recipe's other knobs as they are)."""
        knobs = dict(self.knobs, prompt_length=max(2, shapes.prompt), max_completion_length=max(1, shapes.completion),
                     generation_batch_size=shapes.rows, distinct_prompts=shapes.distinct, lead=shapes.lead,
                     tool_rounds=shapes.tool_rounds, suggest=False)
        if self.own is not None:
            knobs["own_passes"] = bool(self.own())
        return memory.plan(self.config, **knobs)

    def planned_bytes(self, plan: memory.Plan, phase: str) -> int:
        """What the device's counter should read for `phase` under `plan`: live tensors on CUDA, plus what the process
        holds apart from them on a CPU."""
        return next(p.bytes for p in plan.phases if p.name == phase) + (self.baseline if self.device == "cpu" else 0)

    def begin(self, phase: str) -> None:
        self.phase = phase
        self.peak.reset()

    def end(self, phase: str) -> Reading | None:
        """The phase's reading (None before the step's shapes are known)."""
        measured, reserved = self.peak.read()
        if self.shapes is None:
            return None
        return Reading(phase, self.step, measured, self.planned_bytes(self.plan_at(self.shapes), phase), self.shapes,
                       reserved)

    def record(self, reading: Reading) -> bool:
        """Keep `reading` if it is its phase's largest peak yet; True when it is."""
        best = self.largest.get(reading.phase)
        if best is None or reading.measured > best.measured:
            self.largest[reading.phase] = reading
            return True
        return False

    def metrics(self, readings: list[Reading], first: bool) -> dict[str, float]:
        """`memory/*` metrics of one step's readings (the bound once, with the first)."""
        out = {}
        for r in readings:
            out[METRIC.format(phase=r.phase, what="measured")] = r.measured / GIB
            out[METRIC.format(phase=r.phase, what="planned")] = r.planned / GIB
            if r.reserved is not None:
                out[METRIC.format(phase=r.phase, what="reserved")] = r.reserved / GIB
            if first:
                out[METRIC.format(phase=r.phase, what="bound")] = self.planned_bytes(self.bound, r.phase) / GIB
                out["memory/on_cuda"] = float(self.device == "cuda")
        return out

    def line(self, readings: list[Reading], new_peak: bool) -> list[str]:
        """The console's lines for one step: its figures, and what a ratio outside RATIO_BAND leaves out."""
        parts = [f"{r.phase} {r.measured / GIB:.2f} GiB (planned {r.planned / GIB:.2f}, {r.ratio:.2f}x)" for r in readings]
        bound = self.bound.total_gb + (self.baseline / GIB if self.device == "cpu" else 0)
        what = "new peak, " if new_peak and self.step > 1 else ""
        lines = [f"memory, step {self.step} ({what}{readings[0].shapes.text()}): " + ", ".join(parts)
                 + f"; the recipe's worst case {bound:.2f} GiB"]
        for r in readings:
            if not RATIO_BAND[0] <= r.ratio <= RATIO_BAND[1]:
                lines.append(f"memory: {r.phase} measured {r.ratio:.2f}x its plan at this step's shapes (outside "
                             f"{RATIO_BAND[0]}-{RATIO_BAND[1]}); the plan leaves out {LEFT_OUT[self.device]}")
        return lines


_ACTIVE: list[Watch] = []  # the watch of the run training in this process (one at a time), for an out-of-memory error


def active() -> Watch | None:
    return _ACTIVE[-1] if _ACTIVE else None


def install(trainer, recipe, args, say, bound: dict) -> Watch:
    """Watch `trainer`'s memory: wrap its generation batch, add a callback that reads each phase, prints and logs.
    `say` prints a console line; `bound`: the `memory.plan_for` keywords of the recipe's worst case
    (`build.planned_shapes`). The watch is `active()` while training runs (for an out-of-memory error)."""
    from transformers import TrainerCallback

    device = device_of(trainer.model)
    config, knobs = memory.plan_knobs(args, model=recipe.model, lora=recipe.lora, config=trainer.model.config.to_dict(),
                                      device=device, gpu_memory_gb=capacity(device)[0] / GIB if device == "cuda" else None,
                                      **dict(bound, own_passes=own_passes_run(trainer)))
    watch = Watch(config, knobs, device, memory.plan(config, **dict(knobs, suggest=False)), Peak(device))
    watch.own = lambda: own_passes_run(trainer)
    metric = trl_compat.metric_sink(trainer)
    original = trainer._generate_and_score_completions

    def generation(*a, **k):
        if not trainer.model.training:  # --eval's and TRL's periodic eval: not a step's phase
            return original(*a, **k)
        watch.begin("generation")
        output = original(*a, **k)
        watch.shapes = shapes_of(output, args.per_device_train_batch_size)
        reading = watch.end("generation")
        if reading is not None:  # dynamic sampling generates several batches a step: the largest counts
            watch.pending = [r for r in watch.pending if r.measured >= reading.measured] or [reading]
        watch.begin("training")
        return output

    trainer._generate_and_score_completions = generation

    class ReadEachStep(TrainerCallback):
        def on_train_begin(self, args_, state, control, **kwargs):
            _ACTIVE.append(watch)
            if device == "cpu":  # what the process holds beyond the tensors the plan counts
                watch.baseline = max(0, resident() - tensor_bytes(trainer.model, getattr(trainer, "ref_model", None)))
            watch.begin("training")

        def on_step_end(self, args_, state, control, **kwargs):
            watch.step = state.global_step
            readings = [*watch.pending, watch.end("training")]
            watch.pending = []
            readings = [replace(r, step=watch.step) for r in readings if r is not None]
            if readings:
                first = not watch.readings_logged
                watch.readings_logged = True
                new = [watch.record(r) for r in readings]
                for key, value in watch.metrics(readings, first=first).items():
                    metric(key, value)
                if first or any(new):
                    for line in watch.line(readings, any(new) and not first):
                        say(line)
            watch.begin("training")

        def on_train_end(self, args_, state, control, **kwargs):
            if watch in _ACTIVE:
                _ACTIVE.remove(watch)

    trainer.add_callback(ReadEachStep())
    return watch


def own_passes_run(trainer) -> bool:
    """Whether grpokit's loss pass (and generation, where it stands in) runs in this trainer."""
    return bool(getattr(trainer, "_share_prompts", False) or getattr(trainer, "_own_generation", False))


# --------------------------------------------------------------------------------------------------
# Out of memory


EXIT_OUT_OF_MEMORY = 3  # a run or a probe that ran out of memory: apart from 1 (a failure) and 2 (a recipe's mistake)


def explain(watch: Watch | None, capacity_of=capacity) -> list[str]:
    """The lines that explain an out-of-memory error while `watch`'s run trained: the phase and step, the shapes
    (this step's, else the last step's, else the recipe's worst case, said which), the plan at them against the
    device's capacity, and the changes ranked by what the plan says each saves (the smallest that fits first)."""
    if watch is None:
        return ["out of memory before the first step began (the weights, the optimizer's creation): "
                "`python launch.py --recipe RECIPE --check` plans the recipe"]
    device = watch.device
    room, where = capacity_of(device)
    phase = watch.phase or "training"
    if watch.shapes is not None:
        shapes, which = watch.shapes, "this step's" if phase == "training" else "the last step's (this one's were not known yet)"
        plan = watch.plan_at(shapes)
        shown = shapes.text()
    else:
        plan, which, shown = watch.bound, "the recipe's worst case", _settings_text(watch.bound.settings)
    held = watch.baseline if device == "cpu" else 0
    planned = (plan.peak.bytes + held) if device == "cpu" else int(plan.total_gb * GIB)
    lines = [f"out of memory in the {phase} phase of step {watch.step + 1} (on {device})",
             f"  shapes: {shown} ({which})",
             f"  planned at them: {planned / GIB:.2f} GiB, peak in the {plan.peak.name} phase; the device: "
             + (where if room is not None else "its capacity is not known here")]
    if room is not None:
        ranked = [r for r in memory.ranked_changes(watch.config, plan.settings, room, held) if r[1] >= 2**20]
        if planned <= room:  # the plan puts the phase under the device: it took more than planned, by how much unknown
            lines.append(f"  the plan puts this under the device's memory: the {phase} phase held more than planned "
                         f"(the plan leaves out {LEFT_OUT[device]})")
            ranked.sort(key=lambda r: -r[1])
            head = "  what the plan says each change saves, alone (the most first):"
        else:
            head = "  what the plan says each change saves, alone (those that fit first, the smallest first):"
        if ranked:
            lines.append(head)
            lines += [f"    {i}. {text}: -{_size(saved)} -> {_size(after)}"
                      + ("" if planned <= room else ", fits" if fits else ", not enough alone")
                      for i, (text, saved, after, fits) in enumerate(ranked[:6], 1)]
    if device == "cuda":
        from grpokit.cpu import ALLOC_CONF

        lines.append(f"  {ALLOC_CONF}={os.environ.get(ALLOC_CONF, 'not set')} in this run")
    return lines


def _size(n: int) -> str:
    """Bytes as the message says them: GiB, or MiB under a tenth of one."""
    return f"{n / GIB:.2f} GiB" if n >= 0.1 * GIB else f"{n / 2**20:.0f} MiB"


def _settings_text(s: memory.Settings) -> str:
    return (f"G {s.gen_batch}, P {s.prompt_length}, C {s.max_completion_length}, B {s.per_device_train_batch_size}"
            + (f", {s.tool_rounds} tool rounds" if s.tool_rounds else ""))


def forget() -> None:
    """No run trains in this process any more (a probe's step ended, however it ended)."""
    _ACTIVE.clear()
