"""Merge a run's LoRA adapter into its base model and save a plain model (`launch.py --merge RUN_DIR`).

The merged directory loads with `AutoModelForCausalLM.from_pretrained` alone (no PEFT), which is what
serving stacks (vLLM, TGI, llama.cpp converters) expect. W' = W + (alpha / r) * B @ A for every adapted
layer (Hu et al. 2021, LoRA, eq. 3), so the merged model's logits equal the adapter model's.

The base model comes from the run's `recipe.yaml` (the resolved recipe saved next to the run), so
`builtin:tiny-llama`, dtype, revision and trust_remote_code are as trained; a run without one falls back
to the adapter's own `base_model_name_or_path`. A quantized (QLoRA) base is merged unquantized, in the
base checkpoint's dtype: merging into 4-bit weights would round the adapter away.

    python launch.py --merge runs/smoke                       # -> runs/smoke/merged
    python launch.py --merge runs/smoke/checkpoint-20 --merge-out /tmp/smoke-merged
"""

from __future__ import annotations

from pathlib import Path

from grpokit import files
from grpokit.warm_start import section as warmstart
from grpokit.files import ownership
from grpokit.errors import Problem, RecipeError
from grpokit.checkpoints.rundir import RECIPE_FILE

ADAPTER_CONFIG = "adapter_config.json"


def _fail(message: str, value, path: str = "--merge") -> RecipeError:
    return RecipeError([Problem(path, message, value)])


def adapter_config_problem(run_dir: Path) -> str | None:
    """What is wrong with RUN_DIR's adapter_config.json (not JSON, not a mapping), or None. Read before any
    weights load: PEFT parses it only after the base model is built (a JSONDecodeError traceback)."""
    path = run_dir / ADAPTER_CONFIG
    try:
        files.parse_json(files.read_bytes(path), dict)
    except RecipeError as err:
        return f"cannot read {path}: {err.problems[0].message}"
    except files.Unreadable as err:
        return f"{path} {err}{'; the adapter was not saved whole' if str(err).startswith('is not valid JSON') else ''}"
    return None


def output_path_problem(out: Path, kind: str) -> str | None:
    """Why `out` cannot be written as a `kind` ("directory" or "file"), or None: checked before the work starts."""
    if kind == "directory" and out.exists() and not out.is_dir():
        return "names an existing file; the merged model is a directory: choose a directory path"
    if kind == "file" and out.is_dir():
        return "names a directory; give a file path (e.g. DIR/eval.json)"
    parent = next((p for p in out.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        return f"cannot be created: {parent} is a file"
    return None


def _check_inputs(run_dir: Path, out: Path, overwrite: bool) -> list[str]:
    """Every input and output of a merge, before anything is loaded, written or removed; returns the entries of a
    previous merge in `out` that `overwrite` will replace (`_previous_merge`)."""
    problem = adapter_config_problem(run_dir)
    if problem:
        raise _fail(problem, str(run_dir))
    problem = output_path_problem(out, "directory")
    if problem:
        raise _fail(problem, str(out), "--merge-out")
    return _previous_merge(run_dir, out, overwrite)


def find_recipe(run_dir: Path) -> Path | None:
    """The run's resolved recipe: in RUN_DIR, or its parent when RUN_DIR is a checkpoint."""
    for folder in (run_dir, run_dir.parent):
        if (folder / RECIPE_FILE).is_file():
            return folder / RECIPE_FILE
    return None


def base_model(run_dir: Path) -> tuple[str, dict]:
    """(what from_pretrained gets for the base, the recipe's model section or {}) for a run with an adapter."""
    from grpokit.checkpoints import tiny
    from grpokit.config.loader import read_yaml

    recipe_path = find_recipe(run_dir)
    data = read_yaml(recipe_path) if recipe_path is not None else None
    model = data.get("model") if isinstance(data, dict) else None
    model = model if isinstance(model, dict) else {}
    warm = warmstart.of_run(run_dir)
    if warm is not None:  # the run trained its adapter on its warm start (grpokit.warm_start.section), not on the recipe's model
        return str(warm), model
    name = model.get("name_or_path")
    if not name:
        config = files.read_json(run_dir / ADAPTER_CONFIG, dict, key="--merge")
        name = config.get("base_model_name_or_path")
        model = {}
    if not name:
        raise _fail(f"cannot tell the base model: no recipe.yaml with model.name_or_path and no base_model_name_or_path in {ADAPTER_CONFIG}",
                    str(run_dir))
    try:
        return tiny.resolve(name), model
    except ValueError as err:
        raise _fail(str(err), name, "model.name_or_path") from None


def merge(run_dir: str | Path, out_dir: str | Path | None = None, overwrite: bool = False, log=print) -> Path:
    """Merge RUN_DIR's adapter into its base; save model and tokenizer to `out_dir` (default RUN_DIR/merged).

    Raises `RecipeError` (exit 2) when RUN_DIR holds no adapter, the base cannot be loaded, or `out_dir` is not a
    folder a merge may write (`_previous_merge`); all of that before anything is removed or written.

    >>> merge("runs/smoke")  # doctest: +SKIP
    PosixPath('runs/smoke/merged')
    """
    run_dir = Path(run_dir).expanduser()
    if not run_dir.is_dir():
        raise _fail("run directory does not exist", str(run_dir))
    if not (run_dir / ADAPTER_CONFIG).is_file():
        full = (run_dir / "config.json").is_file()
        raise _fail(f"no LoRA adapter here ({ADAPTER_CONFIG} missing)"
                    + ("; this run is a full fine-tune: its directory already loads as a model, nothing to merge" if full
                       else "; give a run directory or checkpoint trained with a lora section"), str(run_dir))
    out = Path(out_dir).expanduser() if out_dir is not None else run_dir / "merged"
    previous = _check_inputs(run_dir, out, overwrite)

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_path, model = base_model(run_dir)
    # The recipe's dtype when it names one; else the base checkpoint's own (bf16 for the Qwen models),
    # so a merge on a CPU machine does not double the size of a bf16 model.
    dtype_name = model.get("dtype", "auto")
    dtype = "auto" if dtype_name == "auto" else getattr(torch, dtype_name)
    kwargs = dict(dtype=dtype, trust_remote_code=model.get("trust_remote_code", False), revision=model.get("revision"))
    log(f"[grpokit] merging {run_dir} into {base_path} (dtype {dtype_name})")
    try:
        base = AutoModelForCausalLM.from_pretrained(base_path, **kwargs)
    except (OSError, ValueError) as err:
        raise _fail(f"cannot load the base model: {type(err).__name__}: {str(err)[:300]}", base_path, "model.name_or_path") from None
    merged = PeftModel.from_pretrained(base, str(run_dir)).merge_and_unload()
    tok_source = run_dir if (run_dir / "tokenizer_config.json").is_file() else base_path
    tokenizer = AutoTokenizer.from_pretrained(str(tok_source), trust_remote_code=kwargs["trust_remote_code"])
    # The merge has worked: only now is a previous merge (and only what grpokit wrote of it) removed.
    ownership.remove(out, previous, "--merge-out")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    recorder = ownership.Recorder(out)
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
    recorder.record()
    if created:
        ownership.claim_file(out)  # RUN_DIR/merged is part of the run: it goes with the run
    log(f"[grpokit] merged model and tokenizer -> {out}")
    return out


def _previous_merge(run_dir: Path, out: Path, overwrite: bool) -> list[str]:
    """Check `--merge-out` before any work: the entries of a previous merge that `overwrite` will replace.

    The output is never the run itself or a folder holding it, `/` or the home directory; a folder holding
    anything grpokit did not write is refused, with or without --overwrite.
    """
    target, run = out.resolve(), run_dir.resolve()
    if target == run or target in run.parents:
        raise _fail("is the run being merged, or a folder holding it: a merge never writes over its own run; "
                    "choose another --merge-out (default: RUN_DIR/merged)", str(out), "--merge-out")
    if ownership.holds_run(out.resolve()):  # through a link too (runs/latest -> runs/exp7)
        raise _fail("is (or holds) the folder of a training run, not a merge's: a merge goes to a folder of its own",
                    str(out), "--merge-out")
    reason = ownership.forbidden_reason(out)
    if reason:
        raise _fail(f"{reason}; choose a folder of its own", str(out), "--merge-out")
    others = ownership.foreign(out) + ownership.unknown_inside(out)
    if others:
        raise RecipeError([ownership.foreign_problem(out, "--merge-out", others, "choose a new or empty --merge-out")])
    previous = ownership.entries(out)
    if previous and not overwrite:
        raise _fail("holds a previous merge; pass --overwrite to replace it or choose another --merge-out", str(out), "--merge-out")
    return previous
