"""`--check`: validate, build everything that needs no weights, and explain it -- the decisions first (model, data,
rewards, tools and their limits), then what the recipe computes in GRPO's terms, its memory plan and the lint; with
`--full`, the resolved recipe (every value, defaults included) and the first formatted rows as they are. Loads no
weights, trains nothing.

The default view fits a screen: no line wider than WIDTH characters, at most 60 lines for a one-turn recipe and 80
with tools (tests/config/test_recipes.py holds every shipped recipe to it). An explanation longer than a line is cut at a
clause and ends in CUT (`--full` prints every line whole); a lint warning or a note, which asks the user to act, is
wrapped, never cut.
"""

from __future__ import annotations

import contextlib
import io
import sys
import textwrap

from grpokit import cpu
from grpokit.prompts import tasks
from grpokit.tools import tooluse
from grpokit.run.build import longest_prompt, planned_passes, prepare
from grpokit.config import Recipe, dump, lint
from grpokit.prompts.data import preparation_of, source_name
from grpokit.planning import memory, vllm_share
from grpokit.planning.architecture import ConfigNotFound
from grpokit.planning.cpu_time import SHAPE, estimate
from grpokit.reporting.explain import explain_table, reward_rows
from grpokit.reporting.messages import text
from rewards.tasks import audit

# torch is imported inside the functions that ask it about the GPU: --check's other work needs none.

WIDTH = 160  # the default view's widest line: a screen's width, so the report reads without scrolling sideways
CUT = " [...]"  # ends a line the default view cut; `--check --full` prints it whole
BOUNDARIES = ("; ", ": ", " (", ", ", " -- ")  # where a cut may fall, so what is kept ends at a clause


def fit(line: str, width: int = WIDTH) -> str:
    """`line` as the default view prints it: whole when it fits `width`, else cut at the last clause boundary that
    leaves room for CUT (at a space where no boundary falls in the line's second half) and ended by CUT.

    >>> fit("short stays whole")
    'short stays whole'
    >>> fit("first clause; a second one that does not fit", width=30)
    'first clause [...]'
    """
    if len(line) <= width:
        return line
    room = width - len(CUT)
    cut = max(line.rfind(mark, 0, room) for mark in BOUNDARIES)
    if cut < room // 2:
        cut = line.rfind(" ", 0, room)
    return line[:cut if cut > 0 else room].rstrip(" ,;:") + CUT


_MARK = "\x00"  # a line of its own opening (with a way: "wrap", "whole") or closing (alone) a `_kept` block


@contextlib.contextmanager
def _kept(way: str):
    """Lines printed in the block are not cut to the screen's width: "wrap" wraps them at WIDTH, "whole" leaves them
    as they are (a section whose owner keeps it within the width)."""
    print(_MARK + way)
    try:
        yield
    finally:
        print(_MARK)


def _on_screen(text: str, full: bool) -> str:
    """`text` as printed: `_kept` blocks' lines as their way says, every other line through `fit` (all whole when
    `full`)."""
    shown, way = [], "fit"
    for line in text.split("\n"):
        if line.startswith(_MARK):
            way = line[1:] or "fit"
        elif full or way == "whole":
            shown.append(line)
        elif way == "wrap":
            indent = " " * (len(line) - len(line.lstrip()))
            shown += textwrap.wrap(line, WIDTH, subsequent_indent=indent + "  ", break_long_words=False,
                                   break_on_hyphens=False) or [line]
        else:
            shown.append(fit(line))
    return "\n".join(shown)


@contextlib.contextmanager
def _screen(full: bool):
    """Print what the block prints as `_on_screen` shows it; what was printed before an error is printed too, then
    the error goes on."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        sys.stdout.write(_on_screen(printed.getvalue(), full))
        sys.stdout.flush()


def check(recipe: Recipe, gpu_memory_gb: float | None = None, full: bool = False) -> int:
    """Print --check's report for a validated recipe; returns the exit code (0). Problems raise `RecipeError`.

    The one place that orders the report's sections: a section of its own goes in here, where a reader looks for it
    (the decisions, the data, the tools, the objective, the plan, the lint). `full`: the resolved recipe, the
    first rows and every line whole (`--check --full`); else each line fits a screen's width (`fit`)."""
    with _screen(full):
        return _report(recipe, gpu_memory_gb, full)


def _report(recipe: Recipe, gpu_memory_gb: float, full: bool) -> int:
    """--check's sections, in order (see `check`)."""
    prep = prepare(recipe, log=lambda _line: None)  # quiet: what it dropped and why is printed below, from the dataset
    _decisions(recipe, prep, full)
    prompt_length, prompt_how = _formatted_rows(prep, recipe, full)
    if recipe.dataset.get("reasoning_gym"):
        print()
        print("\n".join(tasks.explain(recipe.dataset["reasoning_gym"], recipe.rewards)))
    if recipe.warm_start:
        from grpokit.warm_start import section as warmstart
        from grpokit.run.supervised import adapter

        print()
        print("\n".join(warmstart.explain(recipe.warm_start, prep.warm_start, recipe.trainer["output_dir"],
                                          recipe.model["name_or_path"], adapter(recipe.warm_start, recipe.lora),
                                          on_cpu=gpu_facts() is None)))
    facts = {"gpu": gpu_facts()}
    if facts["gpu"] is None:  # the run takes the CPU path: whether it computes bfloat16 or emulates it
        facts["cpu_bf16"] = cpu.cpu_computes_bf16()
    if prep.tools is not None:
        prompt_length, prompt_how = _tool_use(prep, recipe, prompt_length, prompt_how, facts)
    print("\n# what this recipe computes, from the resolved GRPOConfig, in the terms of DeepSeekMath's GRPO objective,"
          "\n# DAPO and Dr. GRPO (eq. 8.1-8.3 and each knob: docs/grpo.md, \"GRPO in one screen\")")
    print("\n".join(explain_table(recipe, prep.args)))
    print()
    facts["prompt_length"] = prompt_length
    reader = template_reader(prep, recipe)
    if reader is not None:
        from grpokit.tools import templates

        if templates.thinks(reader, prep.args.chat_template_kwargs):
            facts["thinking_template"] = templates.shown(recipe.model)
    facts["task_audit"] = _task_audit(prep, recipe)
    with _kept("whole"):  # the plan's renderer keeps its lines within the width
        _memory_plan(prep, recipe, prompt_length, prompt_how, gpu_memory_gb, facts, full)
    warnings = lint.lint(recipe, prep.args, answer_lengths=lint.answer_lengths(prep), **facts)
    with _kept("wrap"):
        if warnings:
            print("\n# lint: knobs that cannot act or work against each other (grpokit/config/lint.py)")
            print("\n".join(w.format() for w in warnings))
        for note in prep.notes:
            print(f"\nnote: {note}")
    print("\ncheck passed: no weights loaded, nothing trained.")
    return 0


def _decisions(recipe: Recipe, prep, full: bool) -> None:
    """What the recipe decided, one line each (model, rewards, tools, the run's length and batch); with `full`, the
    resolved recipe after them, every value and default, as a run saves it."""
    print(f"# {recipe.name} ({recipe.path})")
    print("\n".join(f"  {label:<10} {value}" for label, value in decision_rows(recipe, prep.args)))
    if full:
        print("\n# resolved recipe: every value, defaults included (what a run saves as recipe.yaml)")
        print(dump(recipe.as_dict()).rstrip())
    else:
        print("  (every resolved value, defaults included, the first rows and each line cut [...] whole: --check --full)")


def decision_rows(recipe: Recipe, args) -> list[tuple[str, str]]:
    """(label, value) rows of what a recipe decided, as --check opens with them.

    >>> from types import SimpleNamespace as S
    >>> r = S(model={"name_or_path": "builtin:tiny-llama", "quantization": "none", "chat_template": None}, lora=None,
    ...       dataset={"path": "data.jsonl"}, rewards=[{"name": "accuracy", "weight": 1.0}], tools=None,
    ...       trainer={"output_dir": "runs/x"})
    >>> a = S(max_steps=30, per_device_train_batch_size=8, gradient_accumulation_steps=1, num_generations=4,
    ...       learning_rate=1e-4, max_completion_length=64)
    >>> [label for label, _ in decision_rows(r, a)]
    ['model', 'data', 'rewards', 'training']
    """
    model = recipe.model
    said = [model["name_or_path"]]
    if model.get("chat_template"):
        said.append(f"chat template {model['chat_template']}")
    if model.get("quantization", "none") != "none":
        said.append(f"quantized {model['quantization']}")
    lora = recipe.lora
    said.append(f"LoRA r={lora.get('r')} on {lora.get('target_modules')}" if lora else "full fine-tuning")
    rows = [("model", ", ".join(said)), ("data", source_name(recipe.dataset)), *reward_rows(recipe.rewards)[:1]]
    if recipe.tools:
        rows.append(("tools", _tools_row(recipe.tools)))
    batch = args.per_device_train_batch_size * args.gradient_accumulation_steps
    rows.append(("training", f"{args.max_steps} steps of {batch} completions ({batch // args.num_generations} prompts x "
                 f"{args.num_generations}), learning rate {args.learning_rate:g}, completions up to "
                 f"{args.max_completion_length} tokens; into {recipe.trainer.get('output_dir')}"))
    return rows


def _tools_row(section: dict) -> str:
    """The tools a recipe gives and the limits on each call."""
    named = ([f"environment {section['environment']}"] if section.get("environment") else []) + list(section.get("functions") or [])
    args = ", ".join(f"{k}={v}" for k, v in (section.get("environment_args") or {}).items())
    limits = {k: section.get(k, tooluse.TOOLS[k].default) for k in ("timeout_seconds", "max_result_chars")}
    return (", ".join(named) + (f" ({args})" if args else "") + f"; each call within {limits['timeout_seconds']:g} s "
            f"and {limits['max_result_chars']} characters of result")


def _task_audit(prep, recipe: Recipe) -> dict | None:
    """How each task's scorer treats its own gold answers, as the recipe's first `task_score` reads answers
    (rewards.tasks.audit; for the lint), or None for a recipe without both a task source and that reward."""
    scorers = [f for r, f in zip(recipe.rewards, prep.reward_funcs) if r["name"] == "task_score"]
    if not recipe.dataset.get("reasoning_gym") or not scorers or prep.dataset is None:
        return None
    columns = [c for c in ("task_item", "answer", "task") if c in prep.dataset.column_names]
    return audit(getattr(scorers[0], "fn", scorers[0]), list(prep.dataset.select_columns(columns)))


def _formatted_rows(prep, recipe: Recipe, full: bool = False) -> tuple[int | None, str]:
    """Print the first formatted row as the model reads it (`full`: the first two as they are) and what preparation
    dropped; (the prompt length the plan assumes, how it was found): measured on the rows when they could be read,
    else dataset.max_prompt_tokens."""
    prompt_length, prompt_how = recipe.dataset.get("max_prompt_tokens"), "dataset.max_prompt_tokens, the longest a prompt may be"
    if prep.dataset is not None:
        print(f"\n# first formatted rows ({len(prep.dataset)} prompts)" if full else
              "\n# data: the first prompt, as the model reads it")
        print("\n".join(preparation_of(prep.dataset).lines))  # a user must see what was dropped before training
        for row in prep.dataset.select(range(min(2 if full else 1, len(prep.dataset)))):
            print(f"- {shorten(row)}" if full else "\n".join(readable(row)))
        measured = longest_prompt(prep)
        if measured is not None:
            prompt_length, prompt_how = measured
    return prompt_length, prompt_how


def template_reader(prep, recipe: Recipe):
    """What reads the recipe's chat template: the model's tokenizer, or -- where it is not here and the recipe names
    one of TRL's templates -- a stand-in carrying that template (grpokit.tools.templates.stand_in); None otherwise."""
    from grpokit.tools import templates

    return prep.tokenizer if prep.tokenizer is not None else templates.stand_in(recipe.model)


def _tool_use(prep, recipe: Recipe, prompt_length: int | None, prompt_how: str, facts: dict) -> tuple[int | None, str]:
    """Print how a rollout goes; add what tools cost in tokens, measured with the chat template: the schemas every
    prompt carries (to the plan's prompt length, returned) and one round of a call (to the lint's `facts`)."""
    print()
    print("\n".join(tooluse.explain(prep.tools, recipe, prep.args, template_reader(prep, recipe))))
    if prep.round_tokens is None:  # no tokenizer to measure with
        return prompt_length, prompt_how
    facts["tool_round_tokens"] = prep.round_tokens
    if prompt_length is None:
        return prompt_length, prompt_how
    schema = prep.schema_tokens
    return prompt_length + schema, f"{prompt_how} + {schema} of tool schemas every prompt carries"


def _memory_plan(prep, recipe: Recipe, prompt_length: int | None, prompt_how: str, gpu_memory_gb: float | None,
                 facts: dict, full: bool = False) -> None:
    """Print the memory plan (vLLM's share when it generates, the CPU path on a machine without CUDA) and keep in
    `facts` the plans the lint reads."""
    try:
        import torch

        passes = planned_passes(prep, recipe)
        if prep.args.use_vllm:
            plan = vllm_share.plan_for(prep.args, model=recipe.model, lora=recipe.lora, prompt_length=prompt_length,
                                       gpu_memory_gb=gpu_memory_gb)
        else:
            plan = memory.plan_for(prep.args, model=recipe.model, lora=recipe.lora, prompt_length=prompt_length,
                                   gpu_memory_gb=gpu_memory_gb, **passes)
        print("\n".join(plan.render(full=full)))
        facts["vllm_plan"] = plan if plan.engine is not None else None
        if plan.engine is not None and not plan.engine.sleep:  # what sleep mode would change, for the lint
            facts["vllm_plan_asleep"] = vllm_share.plan_for(prep.args, model=recipe.model, lora=recipe.lora,
                                                            prompt_length=prompt_length, gpu_memory_gb=gpu_memory_gb,
                                                            sleep=True)
        if not prep.args.use_vllm and (prep.args.use_cpu or not torch.cuda.is_available()):
            _host_plan(prep, recipe, prompt_length, passes, full)
        else:
            print(f"  CUDA: {alloc_conf_note()}")
        if prompt_length is None:
            why = "the environment's reset() makes each prompt" if not recipe.dataset else "dataset not reachable"
            print(f"  note: prompt length not measured ({why}) and not bounded: assumed 256 tokens")
        else:
            print(f"  prompt length {prompt_length} tokens: {prompt_how}")
        if prep.tools is not None:
            print(f"  completion: every turn and tool result of a rollout, within max_completion_length "
                  f"({prep.args.max_completion_length}): the plan's bound holds for tool use")
    except (ConfigNotFound, ValueError) as err:
        print(f"Memory plan: not available -- {err}")


def _host_plan(prep, recipe: Recipe, prompt_length: int | None, passes: dict, full: bool) -> None:
    """On a machine without CUDA a run takes the CPU path: its plan in host memory, with what this process holds now
    apart from tensors (its libraries), as the run compares its own peak resident memory (grpokit.trainer.watch)."""
    from grpokit.trainer import watch

    cpu_plan = memory.plan_for(prep.args, model=recipe.model, lora=recipe.lora, prompt_length=prompt_length,
                               gpu_memory_gb=None, device="cpu", **passes)
    held = watch.resident()
    total = cpu_plan.peak.bytes + held
    room, where = watch.capacity("cpu")
    verdict = "" if room is None else (f"; fits {where}" if total <= room else f"; does NOT fit {where}")
    print(f"  this machine (no CUDA): host memory <= {total / memory.GIB:.2f} GiB: {cpu_plan.allocated_gb:.2f} planned "
          f"(CPU path, {cpu_plan.settings.dtype}) + {held / memory.GIB:.2f} held now (libraries){verdict}")
    resolved = {k: getattr(prep.args, k, None) for k in ("max_steps", *SHAPE)}  # the GRPOConfig a run gets
    print("  " + estimate(recipe.model["name_or_path"], resolved, cpu_plan.settings.dtype, cpu.cpu_computes_bf16(),
                          cpu.default_threads(), short=not full))


def alloc_conf_note() -> str:
    """What --check says of PyTorch's CUDA allocator setting, which a run sets (grpokit.cpu.cuda_allocator)."""
    import os

    from grpokit.cpu import ALLOC_CONF, ALLOC_CONF_VALUE

    for name in (ALLOC_CONF, "PYTORCH_ALLOC_CONF"):
        if name in os.environ:
            return f"{name}={os.environ[name]} (yours, kept)"
    return (f"a run sets {ALLOC_CONF}={ALLOC_CONF_VALUE} (segments that grow: less lost to fragmentation as shapes "
            "change), unless you set it")


def gpu_facts() -> dict | None:
    """The visible GPU as the lint reads it (name, bfloat16 support), or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    return {"name": torch.cuda.get_device_name(0), "bf16": bool(torch.cuda.is_bf16_supported())}


PROMPT_LINES = 12  # of the first prompt, by default: the start of a long prompt shows its shape
PROMPT_WIDTH = 120  # characters of each of its lines, by default: with the length said, within the screen's WIDTH


def readable(row: dict, limit: int = 60) -> list[str]:
    """A formatted row as --check shows it by default: its prompt's messages as the model reads them, one line each,
    then its other columns cut to `limit` characters.

    >>> readable({"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    ...           "answer": "4", "task_item": "x" * 500})
    ['  system: Be brief.', '  user: 2+2?', "  columns: answer '4', task_item [500 characters]"]
    """
    said = text(row.get("prompt")).splitlines() or [""]
    lines = [f"  {shorten(line, PROMPT_WIDTH)}" for line in said[:PROMPT_LINES]]
    if len(said) > PROMPT_LINES:
        lines.append(f"  ... [{len(said) - PROMPT_LINES} more lines]")
    columns = []
    for key, value in row.items():
        if key == "prompt":
            continue
        shown = repr(value)
        columns.append(f"{key} {shown}" if len(shown) <= limit else f"{key} [{len(str(value)):,} characters]")
    return lines + ([f"  columns: {', '.join(columns)}"] if columns else [])


def shorten(value, limit: int = 200):
    """A row as printed by --check: long text cut to `limit` characters, saying how long it was."""
    if isinstance(value, str):
        return value if len(value) <= limit else f"{value[:limit]}... [{len(value):,} characters]"
    if isinstance(value, dict):
        return {k: shorten(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [shorten(v, limit) for v in value[:20]] + ([f"... [{len(value)} items]"] if len(value) > 20 else [])
    return value
