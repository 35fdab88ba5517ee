"""Command-line entry: argument parsing, the one `Request` it makes, and the top-level story of `launch.py`.

Heavy libraries (torch, transformers, trl) are imported only after the arguments are read, so `--help`
answers at once. A user's mistake ends in one message per problem and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import warnings
from pathlib import Path

from grpokit.trainer import models
from grpokit.errors import EXIT_USAGE, Problem, RecipeError
from grpokit.run.request import DEFAULT_RECIPE, Request
from grpokit.checkpoints.rundir import resume_command

EVAL_BASE = ""  # `--eval` with no RUN_DIR: the recipe's base model
EXIT_INTERRUPTED = 130  # the shell's 128 + SIGINT
CHECKPOINT = re.compile(r"checkpoint-\d+")  # the trainer's checkpoint folders, as --eval RUN_DIR/checkpoint-N names them

EPILOG = """\
overrides:
  Trailing section.key=value pairs change the recipe, validated like keys in the file;
  the value is read as YAML:  trainer.max_steps=5  trainer.beta=0.04  lora.target_modules=[q_proj,v_proj]

examples:
  python launch.py                                   # the offline smoke recipe (tiny model, ~1 min on CPU)
  python launch.py --recipe recipes/smoke.yaml --check
  python launch.py --recipe recipes/smoke.yaml --probe    # one step at the largest shapes: fits, or what to change
  python launch.py --merge runs/smoke                 # LoRA adapter + base -> runs/smoke/merged
  python launch.py --recipe recipes/smollm2-135m/arithmetic.yaml --eval runs/smollm2-135m/arithmetic   # held-out pass@1
  python launch.py --recipe recipes/qwen2.5-1.5b/dapo.yaml --num-processes 4   # DDP on 4 GPUs, via accelerate
"""


def _gigabytes(text: str) -> float:
    """`--gpu-memory`: float() takes 'nan' and 'inf', which planned for 'a nan GiB GPU' and said the recipe fits."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of GB > 0 (got {text!r})")
    return value


def _processes(text: str) -> int:
    """`--num-processes N`: int() took 0 and -3, and --check planned "generation batch -24 (-6 prompts x 4)"."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of processes, 1 or more (got {text!r})")
    return value


def _threads(text: str) -> int:
    """`--threads N`: torch's intra-op threads on CPU, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"must be a whole number of threads, 1 or more (got {text!r})")
    return value


def _eval_samples(text: str) -> int:
    """`--eval-samples K`: 0 to evaluate.MAX_SAMPLES; 100000000 was taken and ended in an allocation traceback."""
    from grpokit.run.evaluate import MAX_SAMPLES

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_SAMPLES:
        raise argparse.ArgumentTypeError(f"must be a whole number of samples per prompt from 0 (greedy only) to "
                                         f"{MAX_SAMPLES} (got {text!r})")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="launch.py",
        description="Run a GRPO recipe (YAML) on TRL's GRPOTrainer.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--recipe", type=Path, default=DEFAULT_RECIPE, help="recipe YAML (default: recipes/smoke.yaml)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="recipe overrides")
    p.add_argument("--check", action="store_true", help="validate and explain the recipe, plan its memory; load no weights")
    p.add_argument("--full", action="store_true", help="with --check: also the resolved recipe (every value, defaults "
                   "included) and the first formatted rows as they are")
    p.add_argument("--num-processes", type=_processes, default=None, metavar="N",
                   help="processes for the run: N > 1 checks the recipe here, then starts N through accelerate "
                        "(DDP, recipes/accelerate/multi_gpu.yaml); with --check, the batch rule for N "
                        "(default: from the launcher, else 1)")
    p.add_argument("--accelerate-config", type=Path, metavar="FILE",
                   help="start the run through accelerate with this config (e.g. recipes/accelerate/zero2.yaml)")
    p.add_argument("--threads", type=_threads, default=None, metavar="N",
                   help="torch threads on CPU (default: OMP_NUM_THREADS if set, else every core; idle OpenMP threads "
                        "sleep rather than spin: see bench/README.md, CPU speed)")
    p.add_argument("--gpu-memory", type=_gigabytes, default=None, metavar="GB",
                   help="GPU memory (GiB) for --check's plan (default: a T4's 15 GiB usable, float16)")
    # --resume takes no value: an optional one swallowed the next argument (`--resume trainer.max_steps=40`).
    p.add_argument("--resume", action="store_true", help="continue the run in output_dir from its latest complete checkpoint")
    p.add_argument("--resume-from", metavar="CHECKPOINT", help="continue the run from this checkpoint directory")
    p.add_argument("--overwrite", action="store_true", help="replace the previous run in output_dir (or a previous --merge-out): only files grpokit wrote, after the new checks pass")
    p.add_argument("--list-rewards", action="store_true", help="list the registered rewards with their arguments")
    p.add_argument("--plot", type=Path, metavar="RUN_DIR", help="write the PNG curves and report.md for an existing run")
    p.add_argument("--compare", type=Path, nargs="+", metavar="RUN_DIR",
                   help="with --plot RUN_DIR: other runs on shared axes (RUN_DIR/plots/compare.png) and in a table in its report.md")
    p.add_argument("--merge", type=Path, metavar="RUN_DIR",
                   help="merge the LoRA adapter of a run (or checkpoint) into its base model; save model + tokenizer")
    p.add_argument("--merge-out", type=Path, metavar="DIR", help="where --merge saves (default: RUN_DIR/merged)")
    p.add_argument("--probe", action="store_true",
                   help="one real step at the recipe's largest shapes on this device, in a scratch folder removed "
                        "after: fits (the measured peak and headroom), or the phase that does not and what to change")
    p.add_argument("--eval", nargs="?", const=EVAL_BASE, default=None, metavar="RUN_DIR",
                   help="score the recipe's base model (or a trained run / checkpoint / RUN_DIR/warm_start) on its held-out "
                        "split: greedy pass@1, each reward's mean; writes eval.json (base model: output_dir/eval-base.json; "
                        "a warm start: RUN_DIR/eval-warm-start.json)")
    p.add_argument("--eval-samples", type=_eval_samples, default=0, metavar="K", help="with --eval: also K sampled completions per prompt (pass@K, mean@K)")
    p.add_argument("--eval-out", type=Path, metavar="FILE", help="where --eval writes its JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_intermixed_args(argv)  # flags and overrides in any order
    bars_only_on_a_terminal()
    quiet_known_noise()
    try:
        req = request(args, argv)
        if req.mode in ("train", "eval", "launch", "probe"):  # before torch is imported: its thread pool reads the environment
            from grpokit import cpu
            from grpokit.dist import say

            say(cpu.configure(args.threads))
        if req.mode == "list-rewards":
            return list_rewards()
        if req.mode == "plot":
            return plot(req.run_dir, list(req.compare))
        if req.mode == "merge":
            from grpokit.run.merge import merge

            merge(req.run_dir, req.merge_out, overwrite=req.overwrite)
            return 0
        return run(req)
    except RecipeError as err:
        print(err.render(), file=sys.stderr)
        if under_plain_accelerate_launch():
            print(ACCELERATE_NOTE, file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as err:  # Ctrl-C outside training (which says where it can resume): one line, no traceback
        print("launch.py: interrupted (Ctrl-C)", file=sys.stderr)
        return getattr(err, "exit_code", EXIT_INTERRUPTED)


# `accelerate launch launch.py` re-raises any non-zero exit of its processes as CalledProcessError (or torch's
# ChildFailedError), and nothing in the script can stop it: say once what that traceback is, and the command without it.
ACCELERATE_NOTE = ("(accelerate launch follows this with a traceback of its own, as it does after any run that exits "
                   "non-zero; it adds nothing to the above. `python launch.py ... --num-processes N` checks the recipe "
                   "before starting the processes and ends without it.)")


def under_plain_accelerate_launch() -> bool:
    """In the main process started by `accelerate launch` itself, not by grpokit's launcher."""
    from grpokit.dist import is_main_process
    from grpokit.run.launcher import LAUNCHED

    return "ACCELERATE_MIXED_PRECISION" in os.environ and not os.environ.get(LAUNCHED) and is_main_process()


def bars_only_on_a_terminal() -> None:
    """No tqdm progress bars where the console is not a terminal (a log file, a pipe): each redraw of a bar (GGUF
    conversion, shard writing, dataset maps, downloads) became a line of the saved log. tqdm reads TQDM_DISABLE when it
    is first imported, so this runs before anything imports it; the processes a launch starts inherit it. The step
    lines say the run's progress there (grpokit.run.progress prints them without a bar)."""
    if not sys.stderr.isatty():
        os.environ.setdefault("TQDM_DISABLE", "1")


def quiet_known_noise() -> None:
    """Silence third-party warnings a user can do nothing about, so the run's own lines stay readable.

    Each is exact to its message: TRL 1.16 calls transformers 5's deprecated `gradient_checkpointing_*`
    names (a FutureWarning per call site, repeated through the run); torch's DataLoader warns that
    `pin_memory` does nothing without an accelerator (every CPU run); bitsandbytes warns on every CPU
    start that an optional hub kernel is missing, and where it fetches its CPU kernel through the `kernels` package
    (a CPU with AVX512-BF16) offline (every --check, every run without a hub), `kernels` says it skips the kernel's
    publisher trust check: bitsandbytes asks at import, whatever `model.quantization` says, so the line speaks of
    nothing the recipe does. (TRL's "environment_factory is experimental" warning is silenced where grpokit builds its
    trainer, grpokit.trainer.generation, so a test sees what a user sees.) transformers says once a run that it sets
    `use_cache=False` for a training forward under gradient checkpointing (TRL's default, and every memory plan's): a
    forward whose activations are recomputed keeps no cache, by design; generation, without gradients, keeps its own.
    """
    warnings.filterwarnings("ignore", message=r"`(is_gradient_checkpointing|gradient_checkpointing_\w+)` is deprecated",
                            category=FutureWarning)
    warnings.filterwarnings("ignore", message=r"'pin_memory' argument is set as true but no accelerator", category=UserWarning)
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    logging.getLogger("kernels._internals.hf_hub").addFilter(_not_trust_check_skipped)
    logging.getLogger("transformers.utils.generic").addFilter(_not_cache_off_for_checkpointing)


def _not_cache_off_for_checkpointing(record: logging.LogRecord) -> bool:
    """False for transformers' one line that a checkpointed training forward runs without a cache (its others pass)."""
    return not str(record.msg).startswith("`use_cache=True` is incompatible with gradient checkpointing.")


def _not_trust_check_skipped(record: logging.LogRecord) -> bool:
    """False for `kernels`' one line that it skips a publisher trust check offline (its other warnings pass)."""
    return not str(record.msg).startswith("Skipping publisher trust check for ")


def list_rewards() -> int:
    import rewards

    rows = rewards.describe()
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['summary']}")
        if r["args"]:
            print(f"{'':<{width}}    args: {', '.join(r['args'])}")
    print("\nA user reward: path/to/file.py:function or package.module:function (see rewards/README.md, \"Add a reward\").")
    return 0


def plot(run_dir: Path, compare: list[Path] = ()) -> int:
    """Curves and report.md for an existing run directory (its recipe.yaml supplies the explain summary); with
    `compare`, other runs beside it in plots/compare.png and a table (written into `run_dir` only)."""
    from grpokit.files import ownership
    from grpokit.config import load, validate
    from grpokit.config.trainer_args import grpo_args
    from grpokit.dist import say
    from grpokit.reporting.compare import COMPARE_FILE, load_runs
    from grpokit.reporting.plots import PLOT_FILE, PLOTS_DIR, plot_run
    from grpokit.reporting.report import REPORT_FILE, write_report
    from grpokit.checkpoints.rundir import RECIPE_FILE
    from grpokit.run.runfiles import finish_run

    # Every run it reads, checked before anything is written: a compared run without trainer_state.json ends here.
    runs = load_runs(run_dir, list(compare)) if compare else None
    written = [PLOT_FILE] + ([COMPARE_FILE] if compare else [])
    # It replaces only a report and curves it wrote itself: a folder's own report.md stays (ownership).
    ownership.refuse_unless_replaceable([run_dir / REPORT_FILE] + [run_dir / PLOTS_DIR / n for n in written], root=run_dir,
                                        key="--plot")
    plots_existed = (run_dir / PLOTS_DIR).exists()
    try:
        saved = run_dir / RECIPE_FILE
        if saved.is_file():
            recipe = validate(load(saved), data_files=False)  # a report reads the run, not its data
            paths = finish_run(run_dir, recipe, grpo_args(recipe), compare=runs)
        else:
            paths = plot_run(run_dir)
            paths.append(write_report(run_dir, recipe_name=run_dir.name, plots=list(paths), compare=runs))
            for path in paths:  # finish_run says what it wrote; this branch says it here, once each
                say(f"wrote {path}")
    except ValueError as err:
        raise RecipeError([Problem("--plot", str(err), str(run_dir))]) from None
    ownership.claim_file(run_dir / REPORT_FILE)
    if plots_existed:
        for name in written:
            ownership.claim_file(run_dir / PLOTS_DIR / name)
    else:
        ownership.claim_file(run_dir / PLOTS_DIR)
    if compare:
        say(f"wrote {run_dir / PLOTS_DIR / COMPARE_FILE}")
    from grpokit.reporting.compare import different_rewards

    for line in different_rewards(runs or []):  # said here too: the shared axes alone do not show it
        print(f"--compare: {line.replace('**', '')}", file=sys.stderr)
    return 0


def request(args: argparse.Namespace, argv: list[str]) -> Request:
    """The one `Request` the command makes, read from the parsed command line; its mistakes are caught here."""
    if args.list_rewards:
        return Request(mode="list-rewards")
    if args.compare and not args.plot:
        raise RecipeError([Problem("--compare", "compares other runs with the one --plot reports on: "
                                   "python launch.py --plot RUN_DIR --compare RUN2 [RUN3 ...]")])
    if args.full and not args.check:
        raise RecipeError([Problem("--full", "adds the resolved recipe to --check's report: python launch.py --recipe "
                                   "RECIPE --check --full")])
    if args.probe:
        clash = [flag for flag, given in (("--check", args.check), ("--resume", args.resume),
                                          ("--resume-from", args.resume_from), ("--eval", args.eval is not None),
                                          ("--merge", args.merge), ("--plot", args.plot)) if given]
        if clash:
            raise RecipeError([Problem("--probe", f"runs one step of a new run in a scratch folder and keeps nothing: "
                                       f"it does not combine with {', '.join(clash)}. Probe first: python launch.py "
                                       "--recipe RECIPE --probe")])
    if args.plot:
        return Request(mode="plot", run_dir=args.plot, compare=tuple(args.compare or ()))
    if args.merge:
        return Request(mode="merge", run_dir=args.merge, merge_out=args.merge_out, overwrite=args.overwrite)
    overrides, evaluated = list(args.overrides), args.eval
    if evaluated and "=" in evaluated and not Path(evaluated).exists():  # `--eval trainer.x=1`: an override, not a RUN_DIR
        overrides, evaluated = [evaluated, *overrides], EVAL_BASE
    from grpokit.run import launcher

    if args.check:
        mode = "check"
    elif args.probe:
        mode = "probe"
    elif evaluated is not None:
        mode = "eval"
    else:
        mode = "launch" if launcher.wanted(args.num_processes, args.accelerate_config) else "train"
    resume = None
    if mode == "train":  # a launch hands its whole command line to the processes it starts: each reads these there
        if args.resume and args.resume_from:
            raise RecipeError([Problem("--resume-from", "give either --resume (the latest checkpoint) or --resume-from PATH, "
                                       "not both", args.resume_from)])
        resume = "latest" if args.resume else (str(args.resume_from) if args.resume_from else None)
    return Request(mode=mode, recipe=args.recipe, overrides=tuple(overrides), argv=tuple(argv), resume=resume,
                   overwrite=args.overwrite, continue_with=resume_command(argv), num_processes=args.num_processes,
                   accelerate_config=args.accelerate_config, gpu_memory=args.gpu_memory, full=args.full,
                   eval_run=evaluated or None, eval_samples=args.eval_samples, eval_out=args.eval_out)


def run(req: Request) -> int:
    """Read and validate the recipe; then --check's report, --eval's figures, a launch of several processes, or
    training in this one."""
    if req.mode == "check":
        # --check never touches the network: a hub model or dataset is checked from the local cache, or
        # reported as not checked. Set before the Hugging Face libraries are imported (they read it then).
        if "HF_HUB_OFFLINE" not in os.environ:
            os.environ[models.OFFLINE_REASON] = "--check never downloads"
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from grpokit.config import load, validate
    from grpokit.dist import say

    loaded = load(req.recipe, list(req.overrides))
    if isinstance(loaded.data.get("dataset"), dict) and loaded.data["dataset"].get("reasoning_gym"):
        from grpokit import taskgen  # its problems are made in a child process: start it beside the validation

        taskgen.warm()
    if req.mode != "check":
        models.offline_unless_hub_reachable(loaded.data)  # fail fast, not after minutes of retries
    say(f"recipe: {loaded.path.resolve()}" + (f" (+ {len(req.overrides)} override(s))" if req.overrides else ""))  # as messages name it
    recipe = validate(loaded, num_processes=req.num_processes)
    if req.mode == "check":
        from grpokit.run.check import check

        return check(recipe, gpu_memory_gb=req.gpu_memory, full=req.full)
    if req.mode == "eval":
        return _evaluate(req, recipe)
    if req.mode == "probe":
        from grpokit.run.probe import probe

        return probe(recipe)
    if req.mode == "launch":
        from grpokit.run import launcher
        from grpokit.run.build import prepare

        # everything that needs no weights, checked here: a mistake ends before any process starts
        prepare(recipe, log=lambda m: None, mode="launch")
        return launcher.launch(list(req.argv), req.num_processes, req.accelerate_config)
    from grpokit.run import training

    return training.run(recipe, req)


def _evaluate(req: Request, recipe) -> int:
    """--eval: the held-out figures of the recipe's model or a run, and that run's report refreshed where grpokit wrote
    it."""
    from grpokit.run import evaluate
    from grpokit.dist import say
    from grpokit.tools.toolguard import EnvironmentFailure

    try:
        result = evaluate.evaluate(recipe, req.eval_run, samples=req.eval_samples, out=req.eval_out)
    except EnvironmentFailure as err:  # the recipe's environment failed on a held-out row: one line, as in training
        print(f"eval stopped: {err}", file=sys.stderr)
        return 1
    run_dir = Path(req.eval_run or recipe.trainer["output_dir"])
    if CHECKPOINT.fullmatch(run_dir.name) or evaluate.is_warm_start(run_dir):  # a row of its run's report
        run_dir = run_dir.parent
    if not req.eval_out and (run_dir / "report.md").is_file():  # a finished run: its report gains before/after
        from grpokit.files import ownership

        if ownership.replaceable(run_dir / "report.md"):
            plot(run_dir)
        else:
            say(f"{run_dir / 'report.md'} not refreshed: grpokit did not write it (it replaces only its own files)")
    print(evaluate.summary(result))
    return 0
