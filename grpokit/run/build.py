"""Prepare, then build: everything a run needs before it trains, with no run folder touched.

`prepare()` builds all that needs no weights (GRPOConfig, LoRA config, rewards, tokenizer, formatted
dataset) and is what `--check` runs; `make_trainer()` builds the trainer around the loaded weights. `--check`, a launch and a run go
through the same code, so a recipe that passes `--check` fails at training time only for reasons no check can
see before the weights load (out of memory, a reward raising on real completions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from grpokit.checkpoints import rundir
from grpokit.tools import toolchecks, tooluse
from grpokit.config import Recipe, engine
from grpokit.config.trainer_args import grpo_args
from grpokit.config.reward_entries import reward_column_problems
from grpokit.dist import say
from grpokit.errors import Problems, RecipeError
from grpokit.checkpoints.gguf import is_gguf_file
from grpokit.trainer.models import describe_error, load_tokenizer, model_source, not_cached
from grpokit.planning import proof
from grpokit.trl_compat import vllm_version

# Who prepares: `--check` (notes what it cannot reach offline), a run in this process, or the process about to
# launch several (training's rules, the batch rule for the processes it starts).
Purpose = Literal["check", "train", "launch"]
PURPOSES = get_args(Purpose)


@dataclass
class Prepared:
    recipe: Recipe
    args: Any  # trl.GRPOConfig
    lora: Any  # peft.LoraConfig | None
    reward_funcs: list
    tools: Any  # grpokit.tools.tooluse.Toolset | None: the recipe's tools section, resolved
    model_path: str | None  # local dir, or hub id; None when not reachable
    tokenizer: Any = None
    dataset: Any = None
    notes: list[str] = field(default_factory=list)
    # What tools cost in tokens, measured with the chat template (tooluse.schema_tokens, round_tokens): the schemas
    # every prompt carries, and one round of a call before any output; None without tools or a tokenizer.
    schema_tokens: int | None = None
    round_tokens: int | None = None
    warm_start: Any = None  # grpokit.warm_start.worked.Worked: the exchanges the warm start trains on, tokenized


def prepare(recipe: Recipe, log=say, mode: Purpose = "check") -> Prepared:
    """Everything but the weights. Raises `RecipeError` listing every problem.

    "check" (`--check`): a hub model or dataset that cannot be reached offline becomes a note, and the output
    folder is checked here. "train": it must load (from the cache, or downloaded where the hub is reachable); the
    batch rule is for the processes the launcher started. "launch": checked by the process that is about to start
    `recipe.num_processes` (grpokit.run.launcher), with training's rules and the batch rule for those processes.

    Each step below adds what it finds to one `_Findings`, so a recipe with several faults hears of them all at once.
    """
    if mode not in PURPOSES:
        raise ValueError(f"prepare: mode must be one of {', '.join(PURPOSES)} (got {mode!r})")
    import rewards
    from peft import LoraConfig

    if recipe.dataset.get("reasoning_gym"):  # its problems are made in a child process, started now to overlap this work
        from grpokit import taskgen

        taskgen.warm()
    found = _Findings(training=mode != "check", problems=Problems(file=str(recipe.path)))
    args = grpo_args(recipe, num_processes=None if mode == "train" else recipe.num_processes)
    lora = LoraConfig(**recipe.lora) if recipe.lora is not None else None
    reward_funcs = [rewards.build(r["name"], **r["args"]) for r in recipe.rewards]
    toolset = tooluse.resolve(recipe.tools) if recipe.tools else None
    model_path, readable = _model_path(recipe, found)
    readable = readable and _config_proven(recipe, found)  # a folder refused already is not read further
    tokenizer = _tokenizer(recipe, model_path, found, log) if readable else None
    schema, per_round = None, None
    if toolset is not None and tokenizer is None:
        # the model's tokenizer is not here (a hub model --check never downloads): a template named from TRL's is
        # still checked, read by a stand-in (grpokit.tools.templates.stand_in), so a template TRL cannot parse is refused now
        from grpokit.tools import templates

        reader = templates.stand_in(recipe.model)
        if reader is not None:
            found.problems.extend(tooluse.template_problems(reader, recipe.model, recipe.where_set("model")))
    if toolset is not None and tokenizer is not None:
        found.problems.extend(tooluse.template_problems(tokenizer, recipe.model, recipe.where_set("model")))
        schema, per_round = tooluse.schema_tokens(tokenizer, toolset), tooluse.round_tokens(tokenizer, toolset)
        found.problems.extend(toolchecks.round_problems(
            args.max_tool_calling_iterations, per_round, args.max_completion_length,
            recipe.where_set("trainer.max_tool_calling_iterations")))
        from grpokit.prompts.data import is_conversational

        if recipe.dataset and not is_conversational(recipe.dataset, tokenizer):  # TRL parses tool calls only from chat-format completions
            found.problems.add("dataset.conversational", "is false, and tools need chat-format prompts: TRL parses tool "
                               "calls only from conversational completions; set it to auto or true",
                               recipe.dataset.get("conversational"), file=recipe.where_set("dataset.conversational"))
    dataset = _dataset(recipe, model_path, tokenizer, args.max_completion_length, schema or 0, found, log)
    if toolset is not None and dataset is not None:
        found.problems.extend(tooluse.row_problems(toolset, dataset.column_names, recipe.where_set("tools.environment")))
    worked = _warm_start(recipe, tokenizer, toolset, dataset, found) if recipe.warm_start and tokenizer is not None else None
    _generation_engine(args, found)
    if not found.training:  # --check; a run finds out when it locks the folder (rundir.RunLock), before any weights load
        _output_folder(recipe, found)
    found.problems.raise_if_any()
    return Prepared(recipe, args, lora, reward_funcs, toolset, model_path, tokenizer, dataset, found.notes, schema,
                    per_round, worked)


@dataclass
class _Findings:
    """What the steps of `prepare` find: problems (all raised together once every step has run) and notes (what
    `--check` could not check, said in its report)."""

    training: bool  # a run or a launch: what --check notes as out of reach, a run must have
    problems: Problems
    notes: list[str] = field(default_factory=list)

    def out_of_reach(self, key: str, reason: str, unchecked: str) -> None:
        """A hub model or dataset neither cached nor fetchable: training cannot go on; --check notes it, and what
        it leaves unchecked for that."""
        if self.training:
            self.problems.add(key, reason)
        else:
            self.notes.append(f"{reason}; {unchecked}")


def _model_path(recipe: Recipe, found: _Findings) -> tuple[str | None, bool]:
    """Where the model loads from (`models.model_source`; None when it cannot), and whether its files can be read
    now, which a hub model neither cached nor fetchable cannot."""
    try:
        model_path, unreachable = model_source(recipe, convert=found.training)
    except RecipeError as err:
        found.problems.extend(err.problems)
        return None, False
    if is_gguf_file(model_path):
        found.notes.append(f"{Path(model_path).name}: tokenizer and context length read from the GGUF's metadata; its weights "
                           "are converted once (dequantized to float32, cached in ~/.cache/grpokit or $GRPOKIT_CACHE) by the "
                           "first run")
    if unreachable:
        found.out_of_reach("model.name_or_path", unreachable, "its tokenizer and prompt lengths are not checked")
    return model_path, bool(model_path) and not unreachable


def _config_proven(recipe: Recipe, found: _Findings) -> bool:
    """Whether the model's config.json is sound (`planning.proof`: its sizes in range, its architecture built on the
    meta device, counted by the plan); a fault is a problem, and nothing that reads the model folder runs after it."""
    if recipe.model.get("gguf_file"):  # a GGUF's config is its metadata, checked by grpokit.checkpoints.gguf
        return True
    faults = proof.problems(recipe.model["name_or_path"], bool(recipe.model.get("trust_remote_code")))
    found.problems.extend(faults)
    return not faults


def _tokenizer(recipe: Recipe, model_path: str, found: _Findings, log):
    """The model's tokenizer; None, with a problem, when it does not load."""
    log(f"loading tokenizer: {model_path}")
    try:
        return load_tokenizer(model_path, recipe, offline_only=not found.training)
    except Exception as err:  # noqa: BLE001 - a broken model dir is a recipe problem, said plainly
        found.problems.add("model.name_or_path", f"cannot load its tokenizer: {describe_error(err)}", recipe.model["name_or_path"])
        return None


def _dataset(recipe: Recipe, model_path: str | None, tokenizer, completion_length: int, schema_length: int,
             found: _Findings, log):
    """The training prompts as TRL reads them (`data.prepare`), checked against the columns the rewards read; None
    when they cannot be read. `schema_length`: the tool schemas' tokens every prompt carries, which the model's
    context holds too."""
    from grpokit.prompts import data

    if not recipe.dataset:  # the tools.environment makes every prompt (reset): TRL feeds it empty rows
        return None
    try:
        log("loading dataset")
        set_in = recipe.blame(next((k for k in ("dataset.path", "dataset.reasoning_gym", "dataset.name")
                                    if recipe.dataset.get(k.partition(".")[2])), "dataset.name"))
        raw = data.load_raw(recipe.dataset, set_in=set_in)
        if recipe.dataset.get("reasoning_gym"):  # the tasks' gold answers against how task_score reads an answer
            from grpokit.prompts import tasks
            from rewards.tasks import extract

            problems, notes = tasks.answer_problems(recipe.dataset["reasoning_gym"], recipe.rewards, extract, set_in)
            found.problems.extend(problems)
            found.notes += notes
        target = data.TargetModel(tokenizer, data.is_conversational(recipe.dataset, tokenizer),
                                  data.context_length(model_path), completion_length, schema_length)
        if recipe.dataset.get("few_shot") and not target.conversational:
            found.problems.add("dataset.few_shot", "are chat messages, and the prompts are plain text (dataset.conversational "
                               "false, or the tokenizer has no chat template)", file=recipe.where_set("dataset.few_shot"))
        dataset = data.prepare(raw, recipe.dataset, target, log=log, set_in=set_in)
        found.problems.extend(reward_column_problems(recipe.rewards, dataset.column_names, str(recipe.path)))
        return dataset
    except data.NotReachable:
        found.out_of_reach("dataset.name", not_cached("dataset", recipe.dataset["name"]), "its columns are not checked")
    except RecipeError as err:
        found.problems.extend(err.problems)
    return None


def _warm_start(recipe: Recipe, tokenizer, toolset, dataset, found: _Findings):
    """The warm start's worked exchanges, tokenized as the run trains on them (`grpokit.warm_start.worked.prepare`); None,
    with the problems, when they cannot be made."""
    from grpokit.warm_start import worked

    try:
        return worked.prepare(recipe, tokenizer, toolset, dataset)
    except RecipeError as err:
        for problem in err.problems:
            problem.file = problem.file or recipe.where_set(problem.path)
        found.problems.extend(err.problems)
        return None


def _generation_engine(args, found: _Findings) -> None:
    """What `trainer.use_vllm` needs of this machine (`engine.environment`)."""
    problems, notes = engine.environment(bool(args.use_vllm), _cuda(), vllm_version(), found.training)
    for message in problems:
        found.problems.add("trainer.use_vllm", message)
    found.notes += notes


def _output_folder(recipe: Recipe, found: _Findings) -> None:
    """`trainer.output_dir` may hold a run (`rundir.forbidden_problems`) and can be written."""
    output_dir = Path(recipe.trainer["output_dir"])
    found.problems.extend(rundir.forbidden_problems(output_dir, recipe.path, str(recipe.path)))
    found.problems.extend(rundir.writable_problems(output_dir, str(recipe.path)))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def make_trainer(prep: Prepared, model):
    """The GRPOTrainer (or its dynamic-sampling subclass), generating from kept prefixes (grpokit.trainer.generation), exactly
    as `training.train()` uses it; tests call this too."""
    from grpokit.tools import toolguard
    from grpokit import trl_compat

    tally = toolguard.Tally()  # the calls a tool limit cut, logged beside TRL's tool metrics
    kwargs = dict(model=model, reward_funcs=prep.reward_funcs, args=prep.args, train_dataset=prep.dataset,
                  processing_class=prep.tokenizer, peft_config=prep.lora,
                  **(prep.tools.trainer_kwargs(tally) if prep.tools else {}))
    if str(getattr(prep.args.eval_strategy, "value", prep.args.eval_strategy)) != "no":  # TRL's own periodic eval
        from grpokit.prompts.data import heldout_dataset

        kwargs["eval_dataset"] = heldout_dataset(prep.recipe, prep.tokenizer, log=say)
    from grpokit.trainer.generation import PrefixReuseGRPOTrainer, PrefixReuseSamplingTrainer

    kwargs["reuse_prefix"] = prep.recipe.sampling.get("reuse_prefix", True)
    if prep.recipe.sampling.get("dynamic"):
        trainer = PrefixReuseSamplingTrainer(sampling=prep.recipe.sampling, **kwargs)
    else:
        trainer = PrefixReuseGRPOTrainer(**kwargs)
    tally.sink = trl_compat.metric_sink(trainer)
    if prep.tools:  # each logged step's failed calls, for report.md, with what a tool's own exception tells its author
        from grpokit.reporting.failed_calls import keep_failed_calls

        keep_failed_calls(trainer, tally.faults)
    return trainer


MEASURED_ROWS = 200_000  # every row up to this; beyond it an evenly spaced sample of this many (said so)


def longest_prompt(prep, limit: int = MEASURED_ROWS) -> tuple[int, str] | None:
    """(tokens of the longest formatted prompt, how it was measured), tokenized as TRL does, in batches."""
    from grpokit.prompts.data import prompt_lengths

    if prep.tokenizer is None or prep.dataset is None or not len(prep.dataset):
        return None
    n = len(prep.dataset)
    rows = None if n <= limit else [i * n // limit for i in range(limit)]
    longest = max(prompt_lengths(prep.tokenizer, prep.dataset, rows=rows))
    how = f"all {n:,} rows" if rows is None else f"an evenly spaced sample of {limit:,} of {n:,} rows"
    return longest, f"the longest formatted prompt ({how}, chat template included)"


def planned_passes(prep, recipe: Recipe) -> dict:
    """The passes a run of this recipe takes, as `memory.plan` reads them: whether grpokit's own passes run
    (grpokit.trainer.ownpasses, one process, no vLLM, non-reentrant checkpointing, `sampling.reuse_prefix`), the lead every
    prompt shares (measured on the rows, tool schemas included), the tool rounds a rollout may take."""
    from grpokit.trainer import ownpasses
    from grpokit.prompts.data import prompt_lead

    args = prep.args
    reentrant = bool((args.gradient_checkpointing_kwargs or {}).get("use_reentrant")) and args.gradient_checkpointing
    own = (recipe.sampling.get("reuse_prefix", True) and not args.use_vllm and not reentrant
           and max(1, getattr(args, "world_size", 1) or 1) == 1
           and ownpasses.verdict_for(recipe.model["name_or_path"]).runs)
    lead = 0
    if own and prep.tokenizer is not None and prep.dataset is not None:
        lead = prompt_lead(prep.tokenizer, prep.dataset)
        if prep.tools is not None and lead and prep.schema_tokens:  # the schemas ride in the shared system turn
            lead += prep.schema_tokens
    rounds = int(getattr(args, "max_tool_calling_iterations", 0) or 0) if prep.tools is not None else 0
    return dict(own_passes=bool(own), lead=lead, tool_rounds=rounds)


def planned_shapes(prep, recipe: Recipe) -> dict:
    """The `memory.plan_for` keywords a run of this recipe is planned at, its worst case: the longest formatted prompt
    (tool schemas included; else dataset.max_prompt_tokens), the passes that run, the lead, the tool rounds."""
    measured = longest_prompt(prep)
    prompt = measured[0] if measured else recipe.dataset.get("max_prompt_tokens")
    if prompt is not None and prep.tools is not None and prep.schema_tokens:
        prompt += prep.schema_tokens
    return dict(prompt_length=prompt, **planned_passes(prep, recipe))
