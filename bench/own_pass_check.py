"""What the first-step check of grpokit's own passes costs, and how far the passes stray from TRL's by dtype.

    nice -n 10 .venv/bin/python bench/own_pass_check.py                      # tiny model and SmolLM2-135M, fp32 + bf16
    nice -n 10 .venv/bin/python bench/own_pass_check.py --models tiny --dtypes float32

On a run's first step grpokit computes the first micro-batch each of its passes serves by TRL's method too and
compares (grpokit/trainer/ownpasses.py): the loss pass's log-probabilities, generation's last-position next-token
distribution. Here: one real step of `recipes/smollm2-135m/python_tool.yaml` at a reduced shape (a tool recipe: a
shared lead of system text, tool schemas and a worked call before every question; `--set` changes it), through the
run's own code (`prepare` + `make_trainer` + `train`), on the embedded tiny model and on SmolLM2-135M-Instruct, per
dtype; timers around the check's two calls and around the step. Then the same rows with a fault put in our pass
(each row given the keys and values of another prompt), for the size of a real fault beside rounding.

Prints figures and writes bench/results/own_pass_check.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from offline import ROOT  # noqa: E402  (before grpokit: no hub, grpokit from this checkout)
from labs.outputs import add_commit_flag, out_path  # noqa: E402

RECIPE = ROOT / "recipes" / "smollm2-135m" / "python_tool.yaml"
MODELS = {"tiny": "builtin:tiny-llama", "smollm2-135m": "builtin:smollm2-135m-instruct"}
SHAPE = ["trainer.max_steps=1", "trainer.per_device_train_batch_size=8", "trainer.num_generations=4",
         "trainer.max_completion_length=192", "trainer.max_tool_calling_iterations=1",
         "trainer.logging_steps=1", "trainer.save_strategy=no",
         "trainer.report_to=[]", "trainer.gradient_checkpointing=false"]


def one_step(model: str, dtype: str, extra: list[str], folder: Path) -> dict:
    """One real step; the seconds the check took (per pass), the step's, and what the check found."""
    from grpokit.trainer import generation, shared_prompt
    from grpokit.run.build import make_trainer, prepare
    from grpokit.config import load, validate
    from grpokit.trainer.models import load_model

    overrides = [f"model.name_or_path={model}", f"model.dtype={dtype}", f"trainer.output_dir={folder}", *SHAPE, *extra]
    if model == MODELS["tiny"]:  # the tiny model's own template cannot render calls: TRL's qwen2_5 (as the tests)
        overrides.append("model.chat_template=qwen2_5")
    recipe = validate(load(str(RECIPE), overrides))
    prep = prepare(recipe, mode="train", log=lambda m: None)
    trainer = make_trainer(prep, load_model(prep.model_path, recipe))
    spent = {"loss": 0.0, "generation": 0.0}

    def timed(which, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[which] += time.perf_counter() - start
        return wrapper

    loss_check, generation_check = shared_prompt.SharedPromptMixin._agrees, generation._agrees
    shared_prompt.SharedPromptMixin._agrees = timed("loss", loss_check)
    generation._agrees = timed("generation", generation_check)
    try:
        start = time.perf_counter()
        trainer.train()
        step = time.perf_counter() - start
    finally:
        shared_prompt.SharedPromptMixin._agrees, generation._agrees = loss_check, generation_check
    judged = {k: {"disagreement": v[0], "tolerance": v[1], "dtype": v[2]} for k, v in trainer.own_pass_check.judged.items()}
    return {"step_s": step, "check_s": spent, "judged": judged, "fault": fault(trainer),
            "prompt_tokens": trainer.shared_prompt_tally.computed + trainer.shared_prompt_tally.shared}


def fault(trainer) -> float:
    """The loss pass's disagreement with TRL's when each row reads another prompt's keys and values: rows of two
    prompts, two copies each, the second prompt's rows given the first's (what a wrong row index would do)."""
    import torch
    from trl import GRPOTrainer

    from grpokit.trainer import ownpasses, shared_prompt

    tok = trainer.processing_class
    rows = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False)
            for q in ("What is 731 * 64 * 27?", "Solve 12 * 30 * 4, then add 7.")]
    width, gen = max(map(len, rows)), torch.Generator().manual_seed(0)
    ids, mask = [], []
    for r in [r for r in rows for _ in range(2)]:
        completion = torch.randint(10, len(tok), (8,), generator=gen).tolist()
        ids.append([tok.pad_token_id] * (width - len(r)) + r + completion)
        mask.append([0] * (width - len(r)) + [1] * (len(r) + 8))
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    real_unique = torch.unique

    def swapped(x, dim=None, return_inverse=False, **kw):  # every row reads the first distinct prompt
        out, inverse = real_unique(x, dim=dim, return_inverse=True, **kw)
        return (out, torch.zeros_like(inverse)) if return_inverse else out

    with torch.no_grad():
        theirs = GRPOTrainer._get_per_token_logps_and_entropies(trainer, trainer.model, ids, mask, 8)[0]
        shared_prompt.torch.unique = swapped
        try:
            ours = shared_prompt.logps_and_entropies(trainer, trainer.model, ids, mask, 8, False, shared_prompt.Tally())[0]
        finally:
            shared_prompt.torch.unique = real_unique
    return ownpasses.disagreement(ours, theirs, mask[:, -8:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--set", nargs="*", default=[], help="recipe overrides, key=value")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="results file (default runs/bench/own_pass_check.json; labs/outputs.py)")
    add_commit_flag(parser)
    args = parser.parse_args()
    import tempfile

    import torch

    torch.set_num_threads(args.threads)
    results = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{os.cpu_count()}-core "
               f"{platform.machine()} CPU, torch {torch.__version__}, {args.threads} threads, load average "
               f"{os.getloadavg()[0]:.1f} at start", "recipe": str(RECIPE.relative_to(ROOT)), "shape": SHAPE + args.set,
               "runs": []}
    from grpokit import files

    out = out_path(args, "own_pass_check.json")
    for name in args.models:
        for dtype in args.dtypes:
            with tempfile.TemporaryDirectory() as folder:
                found = one_step(MODELS[name], dtype, args.set, Path(folder))
            found.update(model=name, dtype=dtype)
            results["runs"].append(found)
            check = sum(found["check_s"].values())
            print(f"{name} {dtype}: step {found['step_s']:.2f} s, the check {check:.2f} s ({100 * check / found['step_s']:.1f} %:"
                  f" loss {found['check_s']['loss']:.2f} s, generation {found['check_s']['generation']:.2f} s); "
                  + "; ".join(f"{k} |Δ log-prob| {v['disagreement']:.2g} (tolerance {v['tolerance']:g})"
                              for k, v in found["judged"].items())
                  + f"; a fault (rows reading another prompt's keys) {found['fault']:.2g}", flush=True)
            files.write_text(out, json.dumps(results, indent=1) + "\n", key="--out")  # a killed bench keeps what it measured
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
