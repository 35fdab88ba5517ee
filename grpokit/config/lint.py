"""Knobs that cannot act, or that work against each other: warnings printed by `--check`, never errors.

A recipe can be valid and still set a knob that has no effect in the update structure it describes
(`epsilon_high: 0.28` while every optimizer step is on-policy), or pair knobs whose combination undoes
what one of them is for (`loss_type: dr_grpo` with std-scaled advantages). Each rule below looks at the
validated `Recipe` and its real `GRPOConfig` (plus, where the cost is the point, the memory planner's weight
estimate and, when `--check` could measure them, the token lengths of the dataset's reference answers), and
says what will happen and the knob to turn. A recipe that means it silences a rule by name:

    lint:
      ignore: [beta-full-copy]     # validated: an unknown rule name is an error with the nearest name

    >>> from types import SimpleNamespace as NS
    >>> args = NS(gradient_accumulation_steps=8, steps_per_generation=8, num_iterations=1)
    >>> on_policy(args), on_policy(NS(gradient_accumulation_steps=2, steps_per_generation=8, num_iterations=1))
    (True, False)
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from grpokit.planning import memory
from grpokit.planning.architecture import ConfigNotFound, load_model_config

OVERLONG = "overlong_penalty"
# Loss types whose PPO clip (epsilon, epsilon_high, delta) is applied to the importance ratio; CISPO caps the
# ratio at epsilon_high instead, which is just as inert when the ratio is 1.
CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo")
# Below this sampling temperature a group's completions are mostly the same text (see `low-temperature`).
LOW_TEMPERATURE = 0.3


@dataclass(frozen=True)
class LintWarning:
    """One knob that will not do what its name says, with what happens and what to change."""

    rule: str
    knobs: tuple[str, ...]  # key paths, e.g. ("trainer.epsilon_high",)
    message: str

    def format(self) -> str:
        return (f"warning [{self.rule}] {', '.join(self.knobs)}: {self.message} "
                f"(meant? silence it with lint: {{ignore: [{self.rule}]}})")


@dataclass(frozen=True)
class Rule:
    name: str
    summary: str
    check: Callable  # (recipe, args, facts) -> LintWarning | None


RULES: dict[str, Rule] = {}


def rule(name: str, summary: str):
    def register(fn):
        RULES[name] = Rule(name, summary, fn)
        return fn

    return register


def on_policy(args) -> bool:
    """TRL's own test (`_generate_and_score_completions`): every optimizer step sees a fresh generation, so
    pi_old = pi_theta and the importance ratio is exactly 1."""
    return args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) == 0


def lint(recipe, args, *, answer_lengths: list[int] | None = None, gpu: dict | None = None,
         prompt_length: int | None = None, vllm_plan=None, vllm_plan_asleep=None,
         tool_round_tokens: int | None = None, cpu_bf16: bool | None = None,
         task_audit: dict | None = None, thinking_template: str | None = None) -> list[LintWarning]:
    """The warnings for a validated `Recipe` and its `GRPOConfig`, minus the rules its `lint.ignore` names.

    Facts, each optional (rules that need one stay silent without it): `answer_lengths`, token lengths of the
    dataset's reference answers (see `answer_lengths`); `gpu`, the visible GPU (`{"name", "bf16"}`);
    `prompt_length`, the longest prompt the plan assumes; `vllm_plan`, the memory plan with vLLM colocated
    (`grpokit.planning.vllm_share.plan_for`), and `vllm_plan_asleep`, the same with sleep mode on; `tool_round_tokens`,
    the tokens one round of tool use costs in the chat template before any output (`grpokit.tools.tooluse.round_tokens`);
    `cpu_bf16`, whether this CPU has bfloat16 instructions (`cpu.cpu_computes_bf16`), for a run on the CPU;
    `task_audit`, how each reasoning-gym task's scorer treats its own gold answers and a nonsense one
    (`rewards.tasks.audit`); `thinking_template`, the chat template when the model writes a thinking block before
    its answer under it (`grpokit.tools.templates.thinks`).
    """
    facts = {"answer_lengths": answer_lengths or None, "gpu": gpu, "prompt_length": prompt_length,
             "vllm_plan": vllm_plan, "vllm_plan_asleep": vllm_plan_asleep, "tool_round_tokens": tool_round_tokens,
             "cpu_bf16": cpu_bf16, "task_audit": task_audit, "thinking_template": thinking_template}
    ignored = set((getattr(recipe, "lint", None) or {}).get("ignore", ()))
    found = (r.check(recipe, args, facts) for name, r in RULES.items() if name not in ignored)
    return [w for w in found if w is not None]


def answer_lengths(prep, sample: int = 2000) -> list[int] | None:
    """Tokens of each reference answer (over at most `sample` rows) of a prepared dataset, or None when there is
    no tokenizer, no dataset or no `answer` column (the hub was not reachable, or the recipe sets no answer_column)."""
    if prep.tokenizer is None or prep.dataset is None or "answer" not in prep.dataset.column_names:
        return None
    rows = prep.dataset.select(range(min(sample, len(prep.dataset))))["answer"]
    return [len(ids) for ids in prep.tokenizer(list(rows), add_special_tokens=False)["input_ids"]] or None


def _set(recipe, *keys) -> list[str]:
    """The trainer keys among `keys` the recipe (or a base it extends, or an override) sets itself."""
    return [k for k in keys if k in recipe.trainer]


def _claims_dapo(recipe, args) -> bool:
    """A recipe named after DAPO, or using one of its two signature knobs (clip-higher, dynamic sampling)."""
    high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    return "dapo" in recipe.name.split("/")[-1] or high > args.epsilon or bool(recipe.sampling.get("dynamic"))


@rule("clip-on-policy", "epsilon / epsilon_high / delta / sequence-level ratios set while every step is on-policy")
def _clip_on_policy(recipe, args, facts):
    if args.loss_type not in CLIPPED or not on_policy(args):
        return None
    knobs = _set(recipe, "epsilon", "epsilon_high", "delta")
    if args.importance_sampling_level == "sequence" and "importance_sampling_level" in recipe.trainer:
        knobs.append("importance_sampling_level")
    if not knobs:
        return None
    gspo = " (GSPO's sequence ratio is 1 too: the loss is loss_type's own)" if "importance_sampling_level" in knobs else ""
    return LintWarning("clip-on-policy", tuple(f"trainer.{k}" for k in knobs), (
        f"cannot act: every optimizer step is on-policy (gradient_accumulation_steps {args.gradient_accumulation_steps} "
        f"is a multiple of steps_per_generation {args.steps_per_generation} x num_iterations {args.num_iterations}), "
        f"so pi_old = pi_theta, the ratio is 1 and the clip never binds{gspo}; to take several optimizer steps per "
        "generation set trainer.steps_per_generation to k x gradient_accumulation_steps (k > 1, as DAPO's "
        "mini-batches do) or trainer.num_iterations > 1 (DeepSeekMath's mu)"))


@rule("beta-full-copy", "beta > 0 without LoRA: a second full copy of the weights as the reference model")
def _beta_full_copy(recipe, args, facts):
    if not args.beta or recipe.lora is not None:
        return None
    return LintWarning("beta-full-copy", ("trainer.beta",), (
        f"beta {args.beta:g} on a full fine-tune makes TRL load a second full copy of the weights as the frozen "
        f"reference model{_reference_cost(recipe.model)}, and run it forward on every micro-batch; add a lora "
        "section (the reference is then the base with the adapter disabled: no extra memory) or set "
        "trainer.beta: 0 (DAPO, Dr. GRPO and GSPO drop the KL term)"))


def _reference_cost(model: dict) -> str:
    """', 5.75 GiB more GPU memory (...)' from the memory planner, or why its size is unknown offline."""
    try:
        config, _ = load_model_config(model["name_or_path"])
        dtype = memory.planned_dtype(model)
        weights, _ = memory.weight_bytes(config, dtype, model.get("quantization", "none"))
    except (ConfigNotFound, ValueError, KeyError) as err:
        return f" (its size is unknown offline: {str(err).split(';')[0]})"
    return (f": {weights / memory.GIB:.2f} GiB more GPU memory ({dtype} weights, estimated from the architecture "
            "by the memory planner)")


@rule("dr-grpo-scaled", "loss_type dr_grpo with std-scaled advantages (scale_rewards group or batch)")
def _dr_grpo_scaled(recipe, args, facts):
    if args.loss_type != "dr_grpo" or args.scale_rewards in ("none", False):
        return None
    return LintWarning("dr-grpo-scaled", ("trainer.scale_rewards",), (
        f"is {args.scale_rewards!r} with loss_type dr_grpo (TRL's default is 'group'): advantages are divided by "
        "a reward std again, which brings back the question-difficulty bias Dr. GRPO removes (near-unanimous "
        "groups, too easy or too hard, get their small differences blown up); Dr. GRPO's unbiased objective "
        "needs trainer.scale_rewards: none"))


@rule("mask-most-truncated", "mask_truncated_completions with a completion budget most answers do not fit")
def _mask_most_truncated(recipe, args, facts):
    lengths = facts.get("answer_lengths")
    if not args.mask_truncated_completions or not lengths:
        return None
    median = statistics.median(lengths)
    if median < args.max_completion_length:
        return None
    p90 = sorted(lengths)[min(len(lengths) - 1, int(0.9 * len(lengths)))]
    return LintWarning("mask-most-truncated", ("trainer.mask_truncated_completions", "trainer.max_completion_length"), (
        f"the dataset's reference answers run {median:g} tokens at the median (measured on {len(lengths)} rows with "
        f"the model's tokenizer), at or past max_completion_length {args.max_completion_length}: most completions "
        "will be cut, and every cut one is dropped from the loss, so a step trains on the few that end early (a "
        "pull toward short answers) or on nothing; raise trainer.max_completion_length (the references' 90th "
        f"percentile is {p90} tokens) or set trainer.mask_truncated_completions: false"))


@rule("group-collapse", "fewer than 2 distinct completions per group (greedy decoding or num_generations < 2)")
def _group_collapse(recipe, args, facts):
    greedy = (args.generation_kwargs or {}).get("do_sample") is False
    if args.num_generations >= 2 and not greedy:
        return None
    why = ("generation_kwargs do_sample: false decodes greedily, so all completions of a prompt are the same text"
           if greedy else f"num_generations {args.num_generations} leaves one completion per prompt")
    after = (" dynamic sampling drops every such group, so each batch is filled short after "
             f"{recipe.sampling.get('max_rounds')} rounds;" if recipe.sampling.get("dynamic") else "")
    return LintWarning("group-collapse", ("trainer.generation_kwargs" if greedy else "trainer.num_generations",), (
        f"{why}: the group's rewards have no spread, every advantage (eq. 8.1) is 0 and nothing is learned;{after} "
        "sample (drop do_sample: false) and set trainer.num_generations >= 2 (8 in the shipped recipes)"))


@rule("low-temperature", f"temperature <= {LOW_TEMPERATURE}: a group's samples are nearly identical")
def _low_temperature(recipe, args, facts):
    if args.temperature > LOW_TEMPERATURE:
        return None
    return LintWarning("low-temperature", ("trainer.temperature",), (
        f"{args.temperature:g} makes a prompt's {args.num_generations} completions nearly identical: the group's "
        "reward std collapses to 0 for most prompts, so their advantages are 0 (no gradient), and where one "
        "completion differs, eq. 8.1 divides by a tiny std and that one sample dominates the step; raise "
        "trainer.temperature (TRL's default, 1.0, is what DAPO samples with)"))


def _overlong(recipe):
    return [r for r in recipe.rewards if r["name"] == OVERLONG]


@rule("overlong-window", "the overlong penalty's window is larger than the completion budget")
def _overlong_window(recipe, args, facts):
    budget = args.max_completion_length
    for i, r in enumerate(recipe.rewards):
        if r["name"] != OVERLONG:
            continue
        a = r.get("args") or {}
        m, buf, p = a.get("max_length") or budget, a.get("buffer"), a.get("penalty_factor", 1.0)
        if buf is None:
            continue
        start = m - buf
        if start >= budget:
            what = (f"its window ({start}, {m}] starts at or past max_completion_length {budget}, where TRL cuts "
                    "every completion: the penalty never fires")
        elif m > budget:
            what = (f"its window ({start}, {m}] runs past max_completion_length {budget}, where TRL cuts every "
                    f"completion: the ramp never reaches -{p:g} (at most -{p * (budget - start) / buf:.2g})")
        elif buf >= budget:
            what = (f"its buffer {buf} covers the whole completion budget ({budget} tokens): every completion is "
                    "penalised for its length from the first token, a length penalty rather than DAPO's overlong shaping")
        else:
            continue
        return LintWarning("overlong-window", (f"rewards[{i}].args",), (
            f"{what}; leave args.max_length unset (it follows trainer.max_completion_length) and keep args.buffer "
            "a fraction of it (DAPO: 4,096 of 20,480 tokens)"))
    return None


@rule("overlong-unmasked", "a DAPO recipe with the overlong penalty but mask_truncated_completions false")
def _overlong_unmasked(recipe, args, facts):
    if not _overlong(recipe) or args.mask_truncated_completions or not _claims_dapo(recipe, args):
        return None
    return LintWarning("overlong-unmasked", ("trainer.mask_truncated_completions",), (
        "is false in a DAPO recipe with the overlong penalty: a completion cut at max_completion_length is trained "
        "on with a reward computed from an unfinished answer (and the full -penalty), the noise DAPO's overlong "
        "filtering removes; set trainer.mask_truncated_completions: true (DAPO pairs the soft penalty with it)"))


# -- the generation engine (trainer.use_vllm): each figure from the vLLM plan, modelled from TRL's and vLLM's code

VLLM_KNOB_PREFIX = "vllm_"


@rule("vllm-knobs-off", "vllm_* knobs set while trainer.use_vllm is false")
def _vllm_knobs_off(recipe, args, facts):
    knobs = [k for k in recipe.trainer if k.startswith(VLLM_KNOB_PREFIX)]
    if args.use_vllm or not knobs:
        return None
    return LintWarning("vllm-knobs-off", tuple(f"trainer.{k}" for k in knobs), (
        "cannot act: trainer.use_vllm is false, so TRL generates with transformers and reads no vllm_* knob; set "
        "trainer.use_vllm: true (vllm_mode colocate runs vLLM on this GPU) or drop them"))


def _training_total(plan) -> int:
    """The training phase as the card sees it: tensors + CUDA context + fragmentation of the trainer's part."""
    phase = plan.phases[-1]
    trainer = sum(c.bytes for c in phase.components if not c.vllm)
    return phase.bytes + memory.CONTEXT_BYTES + int(memory.FRAGMENTATION * trainer)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


@rule("vllm-kv-preempt", "vLLM's KV cache cannot hold one generation batch: vLLM preempts and recomputes")
def _vllm_kv_preempt(recipe, args, facts):
    plan = facts.get("vllm_plan")
    if plan is None or plan.engine.blocker() or plan.engine.holds_batch:
        return None
    v = plan.engine
    return LintWarning("vllm-kv-preempt", ("trainer.vllm_gpu_memory_utilization",), (
        f"{v.utilization:g} of {_gib(v.card)} leaves vLLM a KV cache of {v.capacity_tokens:,} tokens, and one generation "
        f"batch needs {v.needed_tokens:,} ({v.sequences} sequences x {v.sequence_tokens} tokens): vLLM schedules what "
        "fits and preempts the rest, recomputing their prompts, so generation slows (the plan is modelled, not "
        f"measured); raise trainer.vllm_gpu_memory_utilization to {v.min_utilization:g} or generate fewer completions "
        "per generation (trainer.steps_per_generation)"))


@rule("vllm-no-training-room", "vLLM's utilization leaves the trainer no room (at start-up or in the training phase)")
def _vllm_no_training_room(recipe, args, facts):
    plan, asleep = facts.get("vllm_plan"), facts.get("vllm_plan_asleep")
    if plan is None:
        return None
    v = plan.engine
    kind, why = v.blocker() or ("", "")
    if kind in ("startup", "no-kv"):
        fix = (f"lower trainer.vllm_gpu_memory_utilization to at most {v.max_startup_utilization:g}" if kind == "startup"
               else f"raise trainer.vllm_gpu_memory_utilization to {v.min_utilization:g}")
        return LintWarning("vllm-no-training-room", ("trainer.vllm_gpu_memory_utilization",), f"{why}; {fix}")
    total, card = _training_total(plan), v.card
    if total <= card or (not v.sleep and asleep is not None and _training_total(asleep) <= card):
        return None  # fits, or sleep mode alone fixes it (vllm-needs-sleep says so)
    held = v.held_while_training
    return LintWarning("vllm-no-training-room", ("trainer.vllm_gpu_memory_utilization",), (
        f"the training phase needs {_gib(total)} of {_gib(card)}, {_gib(held)} of it held by vLLM while the trainer "
        f"trains ({'asleep' if v.sleep else 'its whole share, no sleep mode'}): the backward pass would run out of "
        "memory (modelled, not measured); lower trainer.per_device_train_batch_size or "
        + ("set trainer.vllm_enable_sleep_mode: true" if not v.sleep else "use a smaller model or 4-bit")))


@rule("vllm-needs-sleep", "vLLM colocated without sleep mode, which the memory plan needs to fit")
def _vllm_needs_sleep(recipe, args, facts):
    plan, asleep = facts.get("vllm_plan"), facts.get("vllm_plan_asleep")
    if plan is None or asleep is None or plan.engine.sleep or plan.fits or not asleep.fits:
        return None
    v = plan.engine
    return LintWarning("vllm-needs-sleep", ("trainer.vllm_enable_sleep_mode",), (
        f"is off: vLLM keeps its whole share ({_gib(v.bytes)}) while the trainer trains, and the plan needs "
        f"{plan.total_gb:.2f} GiB of {v.card / 2**30:g}; with sleep mode vLLM frees its weights and KV cache after each "
        f"generation and the plan peaks at {asleep.total_gb:.2f} GiB (modelled, not measured); set "
        "trainer.vllm_enable_sleep_mode: true (the price: the weights are re-pushed to vLLM at every generation)"))


@rule("vllm-max-model-len", "vLLM's max_model_len: unset with a KV cache below the model's context, or below prompt + completion")
def _vllm_max_model_len(recipe, args, facts):
    plan, P = facts.get("vllm_plan"), facts.get("prompt_length")
    given = args.vllm_max_model_length if args.use_vllm else None
    if given is not None and P is not None and given < P + args.max_completion_length:
        return LintWarning("vllm-max-model-len", ("trainer.vllm_max_model_length",), (
            f"{given} is below the longest prompt ({P} tokens) + max_completion_length {args.max_completion_length}: "
            "vLLM refuses a request whose prompt plus completion budget exceeds max_model_len; set "
            f"trainer.vllm_max_model_length: {P + args.max_completion_length}"))
    if plan is None or (plan.engine.blocker() or ("",))[0] != "max-model-len":
        return None
    v = plan.engine
    fix = (f"raise trainer.vllm_gpu_memory_utilization to {v.min_utilization:g}" if v.max_model_len_given else
           f"set trainer.vllm_max_model_length: {v.sequence_tokens} (prompt + completion), or raise "
           f"trainer.vllm_gpu_memory_utilization to {v.min_utilization:g}")
    knob = "trainer.vllm_gpu_memory_utilization" if v.max_model_len_given else "trainer.vllm_max_model_length"
    return LintWarning("vllm-max-model-len", (knob,), f"{plan.engine.blocking()}; {fix}")


@rule("bf16-unsupported", "bfloat16 asked for on a GPU without bfloat16 (T4, V100), or on a CPU without its instructions")
def _bf16_unsupported(recipe, args, facts):
    gpu = facts.get("gpu")
    if gpu is None and facts.get("cpu_bf16") is False and recipe.model.get("dtype") == "bfloat16":
        # x86 without AVX512-BF16 or AMX: PyTorch converts to float32 and back around each product, in software
        return LintWarning("bf16-unsupported", ("model.dtype",), (
            "bfloat16 on this CPU, which has no bfloat16 instructions (avx512_bf16, amx_bf16): PyTorch emulates it, "
            "slowly (SmolLM2-135M's 576x1536 product took 6-8x float32's time on an AVX2-only CPU); set model.dtype: "
            "auto (float32 on this CPU)"))
    knobs = (["model.dtype"] if recipe.model.get("dtype") == "bfloat16" else []) + (
        ["trainer.bf16"] if recipe.trainer.get("bf16") is True else [])
    if gpu is None or gpu.get("bf16", True) or not knobs:
        return None
    engine = " and vLLM refuses bfloat16 below compute capability 8.0" if args.use_vllm else ""
    return LintWarning("bf16-unsupported", tuple(knobs), (
        f"bfloat16 on {gpu.get('name', 'this GPU')}, which has no bfloat16 arithmetic: PyTorch emulates it slowly or "
        f"fails{engine}; set model.dtype: auto (float16 here, with loss scaling) and drop trainer.bf16"))


@rule("task-answer-not-asked", "task_score reads an answer tag the prompt never asks for")
def _task_answer_not_asked(recipe, args, facts):
    asked = (recipe.dataset.get("template") or "") + (recipe.dataset.get("system_prompt") or "")
    for i, r in enumerate(recipe.rewards):
        tag = r["args"].get("tag", "answer")
        if r["name"] != "task_score" or r["args"].get("answer_from", "tag") != "tag" or f"<{tag}>" in asked:
            continue
        return LintWarning("task-answer-not-asked", (f"rewards[{i}].args", "dataset.template", "dataset.system_prompt"), (
            f"task_score reads the answer from <{tag}>...</{tag}>, which neither dataset.template nor "
            "dataset.system_prompt asks for: a model that does not write the tag scores as if it gave no answer "
            f"(0 for most tasks), every group alike, and learns nothing; ask for it (\"... as <{tag}>...</{tag}>\") or "
            "set the reward's answer_from to what the prompt asks (last_line, last_number, whole)"))
    return None


@rule("task-gold-cannot-score", "a task's own gold answers do not score 1.0 as task_score reads them")
def _task_gold_cannot_score(recipe, args, facts):
    audit = facts.get("task_audit") or {}
    short = {task: a for task, a in audit.items() if a["gold_full"] < a["checked"]}
    if not short:
        return None
    said = "; ".join(f"{task}: {a['gold_full']} of {a['checked']} problems checked"
                     + (f" ({a['checked'] - a['gold']} carry no gold answer: the task's scorer checks a solution, of "
                        "which there are many)" if a["gold"] < a["checked"] else "") for task, a in sorted(short.items()))
    return LintWarning("task-gold-cannot-score", ("dataset.reasoning_gym.tasks", "rewards"), (
        f"the task's own gold answers, written as the prompt asks and scored by task_score in its cage, score 1.0 on "
        f"{said}; a right answer the scorer cannot recognize earns what a wrong one does, so the reward says little "
        "about being right there (docs/troubleshooting.md, 'What runs caged')"))


@rule("task-pays-any-text", "a task's scorer pays an answer that answers nothing")
def _task_pays_any_text(recipe, args, facts):
    from_audit = {task: a["nonsense"] for task, a in (facts.get("task_audit") or {}).items() if a["nonsense"] >= 0.5}
    if not from_audit:
        return None
    said = ", ".join(f"{task} ({score:g})" for task, score in sorted(from_audit.items()))
    return LintWarning("task-pays-any-text", ("dataset.reasoning_gym.tasks",), (
        f"the task's own scorer pays the answer 'I do not know': {said}; a policy learns to write anything there "
        "(game_of_life_halting compares bool(answer) with bool(gold), and any text is true): leave the task out"))


# -- multi-turn tool use (the recipe's tools section, grpokit/tools/tooluse.py)


@rule("tool-budget", "tool-calling rounds leave little of max_completion_length for the answer, or are unbounded")
def _tool_budget(recipe, args, facts):
    per_round = facts.get("tool_round_tokens")
    if not getattr(recipe, "tools", None) or per_round is None:
        return None
    budget, rounds = args.max_completion_length, args.max_tool_calling_iterations
    if rounds is None:
        return LintWarning("tool-budget", ("trainer.max_tool_calling_iterations",), (
            f"is unset: rounds of tool calls stop only when the model stops calling or the {budget}-token "
            f"max_completion_length is used up, each round taking at least {per_round} tokens of it (a call and its "
            "result's wrapping in this chat template, measured, before the tool's own output); set it (1-3 for a "
            "single-tool task) so a model that loops on calls is cut off early"))
    used = rounds * per_round
    if used * 2 <= budget:
        return None
    return LintWarning("tool-budget", ("trainer.max_tool_calling_iterations", "trainer.max_completion_length"), (
        f"{rounds} round(s) of tool calls take at least {used} of the {budget}-token max_completion_length ({per_round} "
        "per round: a call and its result's wrapping in this chat template, measured, before the tool's own output "
        "and the model's own words), which bounds the whole exchange: the answer after the last result may be cut "
        f"off; raise max_completion_length to at least {used * 2} or allow fewer rounds"))


@rule("overlong-counts-tools", "the overlong penalty counts tool results' tokens as the model's length")
def _overlong_counts_tools(recipe, args, facts):
    found = _overlong(recipe)
    if not found or not getattr(recipe, "tools", None):
        return None
    i = recipe.rewards.index(found[0])
    return LintWarning("overlong-counts-tools", (f"rewards[{i}]",), (
        "with tools, TRL passes a reward the ids of the whole exchange: the overlong penalty counts the tool results' "
        "tokens (masked out of the loss, yet part of the length) as if the model wrote them, so a rollout that called "
        "a tool with a long result is punished for it; size args.buffer and max_completion_length for the results, "
        "or drop the penalty"))


# Below this many completion tokens a thinking template's block crowds out the answer. A floor, not a fit: Qwen3's
# model card advises 32,768 output tokens for thinking mode ("for most queries"), and a thinking block on a
# grade-school problem commonly runs to several hundred tokens; a completion cut inside it has no answer to score.
THINKING_ROOM = 1024


@rule("thinking-room", "a thinking template with a completion too short for its thinking block and an answer")
def _thinking_room(recipe, args, facts):
    template = facts.get("thinking_template")
    if not template or args.max_completion_length >= THINKING_ROOM:
        return None
    return LintWarning("thinking-room", ("trainer.max_completion_length",), (
        f"is {args.max_completion_length} tokens, and under {template} the model writes a thinking block before "
        f"its answer (and before each tool call): a thinking model's block commonly runs to hundreds of tokens or "
        f"more (Qwen3's model card advises 32,768 output tokens for thinking mode), and a completion cut inside it has "
        f"no answer for the rewards to score; raise max_completion_length to at least {THINKING_ROOM}, or turn "
        "thinking off: qwen3_5_nothink for Qwen3.5, trainer.chat_template_kwargs {enable_thinking: false} for Qwen3 "
        "and SmolLM3"))


RULE_NAMES = tuple(RULES)
