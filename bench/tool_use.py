"""Tool use, offline: does GRPO teach SmolLM2-135M-Instruct to call a calculator? Held-out greedy pass@1 and tool calls.

    nice -n 10 .venv/bin/python bench/tool_use.py --commit-results   # train and score 3 seeds (recipes/smollm2-135m/calculator.yaml)
    .venv/bin/python bench/tool_use.py --report-only --commit-results   # the page from bench/results/tool_use.json
    nice -n 10 .venv/bin/python bench/tool_use.py --recipe python_tool   # the same for python_tool.yaml, into runs/bench/

The recipe as shipped goes through bench/real_model.py `--once`: each seed trained for its max_steps, then the base
model and every seed scored by `--eval`, which runs the held-out prompts through TRL's own multi-turn loop (greedy):
pass@1 (the task's own scorer on the model's last turn, at full credit), tool calls per completion and failed calls
per call. Writes tool_use.{json,png} (real_model.py's: per-step training reward of each seed) in runs/bench/, or with
`--commit-results` in bench/results/ with bench/README.md's section on tool use (labs/outputs.py's rule). Runs go to
tool_use_runs/ beside them (not committed).

Seeds trained in other sessions (their runs gone) stay in results/tool_use.json when more are scored with
`real_model.py --recipe recipes/smollm2-135m/calculator.yaml --once --report-only --keep --seeds N ...`, which
refuses unless both measured the same: recipe, steps, held-out set and the base model's dtype and figures. The
dtype follows the CPU (`model.dtype: auto`: a bfloat16 base where the CPU has bf16 instructions, else float32),
so seeds measured on a CPU of the other kind are measured again, all of them, not mixed in. A seed's training
needs most of a 24 GiB machine (the plan: ~17 GiB for 16 completions of up to ~630 tokens; one was killed at
17.8 GB resident beside a 7 GB neighbour): train seeds one after another, alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from offline import ROOT  # noqa: E402  (before grpokit: no hub, grpokit from this checkout)
import tasks  # noqa: E402  (the rule a rise is read by: the tasks page's)
from grpokit import files  # noqa: E402
from labs.outputs import COMMITTED, add_commit_flag, results_dir  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

RECIPE = ROOT / "recipes" / "smollm2-135m" / "calculator.yaml"
README = ROOT / "bench" / "README.md"
BEGIN, END = "<!-- tool_use.py writes this section from results/tool_use.json -->", "<!-- end of tool_use.py's section -->"
# Other tool recipes: results/<recipe's stem>.json and a section of their own.
OTHERS = {# the calculator as shipped since 2026-12-05 (8 a group, learning rate 1.5e-4: groups that stay mixed)
          "calculator_mixed": RECIPE,
          "python_tool": ROOT / "recipes" / "smollm2-135m" / "python_tool.yaml",
          # the same recipe, measured on a machine whose CPU computes bfloat16 (dtype auto: bfloat16, base included)
          "python_tool_bf16": ROOT / "recipes" / "smollm2-135m" / "python_tool.yaml",
          # the warm start, then GRPO from it, in each seed's run (its warm_start section)
          "multi_call": ROOT / "recipes" / "smollm2-135m" / "multi_call.yaml"}
# What each recipe's held-out problems are, and whose calls TRL's loop runs (by the recipe's stem), for the page.
DESCRIBED = {"calculator": ("products and sums", "the calculator's"),
             "python_tool": ("products of three numbers", "the Python tool's"),
             "multi_call": ("products of three numbers", "the two-integer calculator's")}
# What the seeds start from, where it is not the recipe's own model (the rows' label, and the reading's).
STARTS = {"multi_call": "warm start"}


def places(name: str | None, home: Path = COMMITTED) -> tuple[Path, Path, str, str]:
    """(recipe, results file in `home`, the README section's markers) of the calculator (None) or another tool
    recipe."""
    if name is None:
        return RECIPE, home / "tool_use.json", BEGIN, END
    out = home / f"{name}.json"
    return (OTHERS[name], out, f"<!-- tool_use.py writes this section from results/{out.name} -->",
            f"<!-- end of tool_use.py's section on {name} -->")


def _start(r: dict) -> str:
    """What the seeds started from: the recipe's own model ("base") unless STARTS says otherwise."""
    return STARTS.get(Path(r["recipe"]).stem, "base")


def _tools(scored: dict) -> str:
    t = scored.get("tools") or {}
    if not t:
        return "- | -"
    failed = "-" if t.get("failures_per_call") is None else f"{t['failures_per_call']:.2f}"
    return f"{t['calls_per_completion']:.2f} | {failed}"


def markdown(r: dict) -> str:
    base, start = r["base"], _start(r)
    problems, tool = DESCRIBED[Path(r["recipe"]).stem]
    shipped = ("(the shipped recipe, its model the warm start named below, made from this one)"
               if not r["recipe"].startswith("recipes/") else
               f"as shipped until {r['shipped_until']}: {r['recipe_then']}" if r.get("shipped_until") else "as shipped")
    lines = [f"`tool_use.py` ({r['recipe']} {shipped}: {r['steps']} steps of {r['completions_per_step']} completions, "
             f"{r['model']}, {r['dtype']}): held-out greedy pass@1 on {base['prompts']} problems ({problems} from "
             f"reasoning-gym, seeds apart from training's) with {tool} calls run by TRL's loop, and the calls the "
             f"model made. Machine: {r['machine']}. {r.get('when', '')}".rstrip(), "",
             "| model | pass@1 | tool calls per completion | failed calls per call | training calls per completion, first 5 / last 5 steps | s/step |",
             "|---|---:|---:|---:|---|---:|",
             f"| {start} | {base['pass@1']:.3f} | {_tools(base)} | - | - |"]
    for s in r["seeds"]:
        calls = s.get("tool_calls") or []
        trend = (f"{sum(calls[:5]) / len(calls[:5]):.2f} / {sum(calls[-5:]) / len(calls[-5:]):.2f}" if calls else "-")
        lines.append(f"| seed {s['seed']} | {s['after']['pass@1']:.3f} ({s['rise'] * 100:+.1f}) | {_tools(s['after'])} | "
                     f"{trend} | {s['seconds_per_step']:.0f} |")
    out = r.get("out", "tool_use.json")
    lines += ["", "pass@1 rise in points in brackets. Calls per completion count the tool messages of each greedy rollout "
              f"(at most {r.get('rounds', 1)} with the recipe's max_tool_calling_iterations); the training column is TRL's "
              "`tools/call_frequency` over the sampled completions. Every figure and how it was measured: "
              f"`results/{out}`; per-step training reward: `results/{Path(out).with_suffix('.png').name}`."]
    if any(m.get("tools", {}).get("calls_distribution") for m in [base] + [s["after"] for s in r["seeds"]]):
        lines += ["", *calls_table(r)]
    lines += ["", reading(r)]
    return "\n".join(lines)


def calls_table(r: dict) -> list[str]:
    """Greedy calls per completion as a distribution, how calls ended, and the training steps whose groups all scored
    alike (no gradient)."""
    rows = ["| model | completions with 0 / 1 / 2 / 3+ calls | calls ended: ok / code error / timeout / crash / unparseable "
            "(- not kept) | training steps with every group alike | groups without spread: whole run / last third | "
            "entropy, last 5 steps |", "|---|---|---|---:|---|---:|"]
    for label, m, seed in [(_start(r), r["base"], None)] + [(f"seed {s['seed']}", s["after"], s) for s in r["seeds"]]:
        t = m.get("tools", {})
        dist = t.get("calls_distribution") or {}
        kinds = t.get("call_outcomes") or {}
        alike = (seed or {}).get("zero_std_groups") or []
        flat = f"{sum(1 for a in alike if a >= 1.0)} of {len(alike)}" if alike else "-"
        third = alike[-max(1, len(alike) // 3):]
        spread = f"{sum(alike) / len(alike):.0%} / {sum(third) / len(third):.0%}" if alike else "-"
        entropy = (seed or {}).get("entropy") or []
        last = f"{sum(entropy[-5:]) / len(entropy[-5:]):.2f}" if entropy else "-"
        rows.append(f"| {label} | {' / '.join(f'{dist.get(k, 0):.2f}' for k in ('0', '1', '2', '3+'))} | "
                    f"{' / '.join(str(kinds.get(k, 0)) for k in ('ok', 'error', 'timeout', 'crash', 'unparseable')) if kinds else '-'} | "
                    f"{flat} | {spread} | {last} |")
    return rows


def reading(r: dict) -> str:
    """The table in words, by the tasks page's rule (+10 points of pass@1 on every seed, of 3), and the calls."""
    calls = [s["after"].get("tools", {}).get("calls_per_completion") for s in r["seeds"]]
    base_calls = r["base"].get("tools", {}).get("calls_per_completion")
    said = (f"; greedy tool calls per completion {base_calls:.2f} in the {_start(r)}, "
            f"{', '.join(f'{c:.2f}' for c in calls)} after" if base_calls is not None and None not in calls else "")
    return (f"Reading: pass@1 {tasks.verdict(r)} (learning = +{tasks.TARGET_RISE * 100:.0f} points on every seed, of "
            f"{tasks.WANTED_SEEDS}; one of the {r['base']['prompts']} problems is {100 / r['base']['prompts']:.1f} points){said}.")


@one_line_exit
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--report-only", action="store_true", help="write the page from results/tool_use.json")
    parser.add_argument("--how", default="", help="how the seeds were trained, for the results")
    parser.add_argument("--recipe", choices=sorted(OTHERS), default=None,
                        help="another tool recipe than the calculator (its own results file and section)")
    parser.add_argument("--threads", default=None, help="torch threads of each training and scoring process")
    add_commit_flag(parser)
    opts = parser.parse_args(argv)
    recipe, out, begin, end = places(opts.recipe, results_dir(opts))
    check_outputs([out, out.with_suffix(".png")])
    if not opts.report_only:
        import real_model  # bench/ is on sys.path since the module's start (for tasks)

        code = real_model.main(["--recipe", str(recipe), "--seeds", *map(str, opts.seeds), "--once", "--runs",
                                str(out.parent / f"{out.stem}_runs"), "--out", str(out), "--how", opts.how,
                                *(["--threads", opts.threads] if opts.threads else [])])
        if code:
            return code
    text = section(recipe, out)
    if opts.commit_results:  # the page quotes the committed results only
        files.replace_section(README, begin, end, text)
    print(text)
    return 0


def section(recipe: Path, out: Path) -> str:
    """The page's section on `recipe`, from its results file `out`."""
    result = files.read_json(out, dict)
    result.setdefault("out", out.name)
    if "rounds" not in result:  # a copy made for a run (multi_call's) differs from the shipped recipe in its model only
        read = recipe if recipe.is_file() else RECIPE.parent / recipe.name
        result["rounds"] = yaml.safe_load(read.read_text())["trainer"].get("max_tool_calling_iterations", 1)
    return markdown(result)


if __name__ == "__main__":
    sys.exit(main())
