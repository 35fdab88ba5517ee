"""A warm start before GRPO: a short supervised pass over worked exchanges, merged, then GRPO from it, in one run.

GRPO reinforces only what the policy samples: a model that never makes a second tool call gets groups that all score
alike and learns nothing. DeepSeek-R1 ("cold start", arXiv:2501.12948, sec. 2.3.1) and ReTool (arXiv:2504.11536,
sec. 3.1) start RL from a model first fine-tuned on a few worked examples. A recipe asks for it with::

    warm_start:
      from_task: {size: 40, seed: 100000}   # worked exchanges written for the task's own problems (or examples: FILE)
      steps: 10                             # optimizer steps of batch_size exchanges
      batch_size: 4
      learning_rate: 3.0e-4

The pass is TRL's `SFTTrainer` with a LoRA adapter, the loss on the assistant's turns only (the tool results are the
environment's, the prompt the user's), merged into the model and saved in the run folder (`FOLDER`); GRPO then loads
that folder as its model. `--resume` reuses it. This module is the section's face: its keys and rules (checked with
the recipe, before anything loads) and what `--check` says of it; `grpokit.warm_start.worked` writes the exchanges and `grpokit.run.supervised` trains: both
sit above the data and the models they use, so this section's rules stay below `config`, which reads them.
"""

from __future__ import annotations

from pathlib import Path

from grpokit import files
from grpokit.checkpoints import rundir
from grpokit.errors import Problems
from grpokit.fields import Field, validate_fields
from grpokit.planning.cpu_time import warm_start_estimate

ROOT = Path(__file__).resolve().parents[2]  # the project: bench's measured figures are read from it
KEY = "warm_start"
FOLDER = "warm_start"  # <output_dir>/warm_start: the merged model GRPO starts from
RECORD = "warm_start.json"  # inside it: what it was trained on, how, its losses (written last: the folder is whole)
# tasks whose worked exchanges grpokit writes -> the tools (of grpokit.tools.environments:Calculator) they call
WRITTEN_FOR = {"products": ("multiply",), "chain_sum": ("add", "subtract")}

WARM_START = {
    "examples": Field(str | None, None, "a JSONL file of worked exchanges, one {\"messages\": [...]} a line (chat "
                      "messages as TRL's tool loop writes them), relative to the recipe"),
    "from_task": Field(dict | None, None, "worked exchanges written for problems of the recipe's own reasoning-gym "
                       "task, on seeds apart from training's and the held-out set's: {size, seed}"),
    "steps": Field(int, 10, "optimizer steps of the supervised pass", min=1, max=100_000),
    "batch_size": Field(int, 4, "exchanges a step", min=1, max=4096),
    "learning_rate": Field(float, 3.0e-4, "constant (LoRA: large steps)", gt=0.0, max=1.0),
    "max_grad_norm": Field(float, 1.0, "gradient clipping (TrainingArguments'); 0: none", min=0.0),
    "seed": Field(int, 0, "the pass's shuffling and adapter initialisation", min=0, max=2**31),
    "lora": Field(dict | None, None, "the pass's LoRA (peft.LoraConfig fields); default: the recipe's lora section"),
    "dtype": Field(str, "float32", "the weights the pass trains and merges in", choices=("float32", "bfloat16", "float16")),
}
FROM_TASK = {
    "size": Field(int, 40, "worked exchanges: problem i from seed + i", min=1, max=100_000),
    "seed": Field(int | None, None, "their first seed; default: the first past training's and the held-out set's",
                  min=0, max=2**31),
}


def check(raw, data: dict, problems: Problems, where_set, check_lora) -> dict | None:
    """The `warm_start` section with its defaults filled (None without one), every problem added to `problems`: its
    keys, one source of examples, a task grpokit can write worked exchanges for, seeds apart from both sets, a model it
    can merge into. Reads no file but to see it is there (its exchanges are read by `grpokit.warm_start.worked`, at --check too).
    `check_lora(raw, key)`: the `lora` section's own check (grpokit.config), applied to `warm_start.lora`."""
    if raw is None:
        return None
    section = validate_fields(raw, WARM_START, KEY, problems, where_set)
    if not section:
        return None
    given = [k for k in ("examples", "from_task") if section.get(k) is not None]
    if len(given) != 1:
        problems.add(KEY, "give exactly one source of worked exchanges: warm_start.examples (a JSONL file) or "
                     "warm_start.from_task ({size, seed}: written for the recipe's own task)",
                     {k: section[k] for k in given} or None, file=where_set(KEY))
    if section.get("from_task") is not None:
        section["from_task"] = _check_from_task(section["from_task"], data, problems, where_set)
    if isinstance(section.get("examples"), str) and not Path(section["examples"]).is_file():
        problems.add(f"{KEY}.examples", "is not a file; a relative path is read from the folder of the recipe that sets "
                     "it", section["examples"], file=where_set(f"{KEY}.examples"))
    if section.get("lora") is not None:
        section["lora"] = check_lora(section["lora"], f"{KEY}.lora")
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    if model.get("quantization", "none") != "none":
        problems.add(KEY, "merges its adapter into the model's weights, which a quantized model (model.quantization) "
                     "does not hold whole; warm-start an unquantized model", model.get("quantization"),
                     file=where_set("model.quantization"))
    return section


def _check_from_task(raw, data: dict, problems: Problems, where_set) -> dict:
    """`from_task`: the recipe's task source is reasoning-gym, every task one grpokit writes worked exchanges for
    (`WRITTEN_FOR`), with a tools.environment to call; the seeds miss training's and the held-out set's."""
    from grpokit.prompts import tasks

    key = f"{KEY}.from_task"
    spec = validate_fields(raw, FROM_TASK, key, problems, where_set)
    dataset = data.get("dataset") if isinstance(data.get("dataset"), dict) else {}
    source = dataset.get("reasoning_gym")
    if not isinstance(source, dict):
        problems.add(key, "writes worked exchanges for the recipe's reasoning-gym task, and the recipe has no "
                     "dataset.reasoning_gym; give warm_start.examples: a JSONL file of worked exchanges",
                     file=where_set(key))
        return spec
    names = [t.get("name") if isinstance(t, dict) else t for t in source.get("tasks") or []]
    unwritten = [n for n in names if n not in WRITTEN_FOR]
    if unwritten:
        written = ", ".join(f"{task} (with {' and '.join(tools)})" for task, tools in WRITTEN_FOR.items())
        problems.add(key, f"grpokit writes worked exchanges only for {written}; for {', '.join(map(str, unwritten))} "
                     "give warm_start.examples: a JSONL file of worked exchanges, one {\"messages\": [...]} a line",
                     unwritten, file=where_set(key))
    tools = data.get("tools") if isinstance(data.get("tools"), dict) else {}
    if not tools.get("environment"):
        problems.add(key, "writes exchanges that call the recipe's tools.environment (its calculator's tools), and "
                     "the recipe names none; give warm_start.examples instead", file=where_set(key))
    if not all(isinstance(source.get(k, d), int) for k, d in (("seed", 1), ("size", 1000), ("eval_size", 100))):
        return spec
    train = (source.get("seed", 1), source.get("size", 1000))
    held = (tasks.eval_seed({"seed": train[0], "size": train[1], "eval_seed": source.get("eval_seed")}),
            source.get("eval_size", 100))
    if spec.get("seed") is None:
        spec["seed"] = max(train[0] + train[1], held[0] + held[1])
    start, n = spec.get("seed"), spec.get("size")
    if isinstance(start, int) and isinstance(n, int):
        for (first, count), which in ((train, "training's"), (held, "the held-out set's")):
            if start < first + count and first < start + n:
                problems.add(f"{key}.seed", f"its problems come from seeds {start}..{start + n - 1}, which meet {which} "
                             f"{first}..{first + count - 1}: the warm start would show the model problems it is then "
                             "trained or scored on", start, f"a seed >= {max(train[0] + train[1], held[0] + held[1])} "
                             "(or leave it out)", file=where_set(f"{key}.seed"))
    return spec


def check_processes(n_proc: int, problems: Problems, where_set) -> None:
    """The pass runs in the run's one process: under several, each would train it on its own share of the exchanges
    (a batch per process), which is not the pass the section describes; refused rather than made otherwise."""
    if n_proc > 1:
        problems.add(KEY, f"runs its supervised pass in one process, and this run has {n_proc} (--num-processes or the "
                     "launcher's): run a recipe with a warm_start in one process", n_proc, file=where_set(KEY))


def folder(output_dir) -> Path:
    return Path(output_dir) / FOLDER


def made(output_dir) -> Path | None:
    """The warm start the run folder `output_dir` holds, whole, or None: whole is its record there and readable (it
    is written last), its config.json and every weight file it names (`rundir.missing_weights`). A folder short of
    any is half-made, never loaded: `supervised.ensure` removes it (when grpokit made it) and makes it again."""
    path = folder(output_dir)
    whole = (files.try_json(path / RECORD)[0] is not None and (path / "config.json").is_file()
             and rundir.missing_weights(path) is None)
    return path if whole else None


def of_run(run_dir) -> Path | None:
    """The warm start a run or checkpoint (`run_dir`, whose run is its parent) trained from, or None: `--eval` and
    `--merge` put its adapter on this model, as the run trained it."""
    return made(run_dir) or (made(Path(run_dir).parent) if Path(run_dir).name.startswith("checkpoint-") else None)


def explain(section: dict, worked, output_dir, model: str, lora: dict, on_cpu: bool = True) -> list[str]:
    """--check's account of the warm start: what it trains on, how long (on a CPU, `on_cpu`: the time bench measured
    for its shape), how, where it goes, and why."""
    lines = ["# warm start (warm_start): a supervised pass before GRPO, in the same run"]
    if worked is None:
        return lines + ["  its exchanges were not read: there is no tokenizer here to render them with (see the notes)"]
    n, seen = len(worked.exchanges), section["steps"] * section["batch_size"]
    rows = worked.rows or [((), ())]
    tokens = sum(len(ids) for ids, _ in rows) / len(rows)
    lines += [f"  trains on     {worked.source}: none of them a training or held-out question (checked question by "
              "question)",
              f"  an exchange   {_shape(worked.exchanges[0])}; ~{tokens:.0f} tokens, ~{worked.trained_tokens / len(rows):.0f} "
              "of them the assistant's, the only ones with a loss (the prompt, role headers and tool results are not "
              "the model's to learn; GRPO masks tool results too)",
              f"  how long      {section['steps']} steps of {section['batch_size']} exchanges: {seen} seen, "
              f"{seen / n:.2g} pass(es) over the {n}",
              *([f"  time          {warm_start_estimate(model, section, lora['r'], tokens, ROOT)}"] if on_cpu else []),
              f"  how           TRL's SFTTrainer, LoRA r={lora['r']} alpha {lora['lora_alpha']} on {lora['target_modules']} "
              f"({section['dtype']}), learning rate {section['learning_rate']:g} constant, max_grad_norm "
              f"{section['max_grad_norm']:g}, seed {section['seed']}; then merged into {model}",
              f"  kept in       {folder(output_dir)} (a model GRPO loads as its own; --resume uses it and never trains "
              "it again; --eval and --merge put the run's adapter on it)",
              "  why           GRPO reinforces only what the policy samples: a behaviour the model never shows (a second "
              "tool call) gives groups that all score alike and no gradient; as DeepSeek-R1 and ReTool do, a few worked "
              "exchanges first make it likely enough to be sampled, and GRPO sharpens it"]
    return lines


def _shape(messages: list[dict]) -> str:
    """An exchange's turns in a few words: `user -> assistant calls multiply -> tool -> ... -> assistant (answer)`."""
    parts = []
    for m in messages:
        if m["role"] == "system":
            continue
        calls = [c["function"]["name"] for c in m.get("tool_calls") or []]
        parts.append(f"assistant calls {', '.join(calls)}" if calls else
                     "assistant answers" if m["role"] == "assistant" else m["role"])
    return " -> ".join(parts)
