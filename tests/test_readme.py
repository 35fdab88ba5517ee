"""The docs' promises that code can check: the reward list is the registry's, the first screen's commands exist,
every link between the pages resolves, and the README stays a page a newcomer finishes."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

from grpokit.cli import main

README = (ROOT / "README.md").read_text()
# The pages the README sends a reader to for what it leaves out; each must be linked from it.
PAGES = ("docs/running.md", "docs/grpo.md", "docs/troubleshooting.md", "docs/architecture.md", "rewards/README.md",
         "recipes/README.md", "bench/README.md")


def test_reward_list_is_the_registry(capsys):
    """One source of truth: rewards/README.md shows exactly what `--list-rewards` prints."""
    assert main(["--list-rewards"]) == 0
    printed = capsys.readouterr().out.rstrip()
    catalogue = (ROOT / "rewards" / "README.md").read_text()
    block = re.search(r"<!-- rewards:begin -->\n```text\n(.*?)\n```\n<!-- rewards:end -->", catalogue, re.S)
    assert block, "rewards/README.md lost its rewards block"
    assert block.group(1) == printed, "rewards/README.md's reward list is stale: paste `python launch.py --list-rewards`"
    assert 'see rewards/README.md, "Add a reward"' in printed and "\n## Add a reward\n" in catalogue


def test_first_screen_gives_exactly_two_commands():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.split("#")[0].strip()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()  # CI runs what a newcomer runs


def test_first_screen_quotes_the_suites_measured_time():
    """`make test`'s line gives the time bench/suite_time.py measured on an idle machine, as the suite prints it at its
    start: never a figure typed in, and within the 10 minutes the suite is held to."""
    from grpokit.files import read_json

    result = read_json(ROOT / "bench" / "results" / "suite_time.json")
    minutes = round(result["wall_s"] / 60)
    # every test passed in the run it times, but this one, which reads the file that run writes: the first
    # measurement ever, or one after the figure moved, fails here until the README quotes it
    assert result["idle"] and set(result["failed"]) <= {f"tests/test_readme.py::{test_first_screen_quotes_the_suites_measured_time.__name__}"}, result
    assert result["wall_s"] <= 600, result
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    assert f"~{minutes} min on {result['cores']} idle cores" in first_block, first_block


@pytest.mark.slow
def test_first_screen_names_the_next_command_and_it_works():
    """After the two commands, one line says how every further command runs (.venv's Python) and gives the
    next one; run as written it passes (a bare `python launch.py ...`, outside .venv, cannot import peft)."""
    after = README.split("```bash", 1)[1].split("```", 2)[1]
    line = after.strip().split("\n\n")[0]
    assert ".venv/bin/activate" in line
    command = re.search(r"`(\.venv/bin/python launch\.py [^`]*)`", line).group(1)
    argv = shlex.split(command)
    python = ROOT / argv[0]
    if not python.exists():  # tests run from another environment: same command, this interpreter
        python = Path(sys.executable)
    done = subprocess.run([str(python), *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "check passed" in done.stdout
    # its header names what a user can look up, not a chapter the repository never names
    assert "chapter" not in done.stdout and "DeepSeekMath's GRPO objective" in done.stdout
    # the page it cites for the eq. labels exists under that title
    assert 'docs/grpo.md, "GRPO in one screen"' in done.stdout
    assert (ROOT / "docs" / "grpo.md").read_text().startswith("# GRPO in one screen")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than '-' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '#' in a code block is no heading
    return {_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", ("README.md", *PAGES))
def test_every_link_between_the_pages_resolves(page):
    """A moved section leaves no dead link behind: every relative link names a file that exists and, with
    `#anchor`, a heading in it."""
    source = ROOT / page
    for target in re.findall(r"\]\(([^)\s]+)\)", source.read_text()):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        where = (source.parent / path).resolve() if path else source
        assert where.is_file(), f"{page}: link to {target}: no such file"
        assert not anchor or anchor in _anchors(where), f"{page}: link to {target}: no such heading"


def test_the_readme_links_every_page_that_holds_what_it_leaves_out():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", README)}
    assert {(ROOT / p).resolve() for p in PAGES} - linked == set()


def test_the_readme_stays_a_page_a_newcomer_finishes():
    """The README gives the two commands, what a recipe is, the sections, the exit codes and links out; the
    details live on the pages it links, so it stays under 250 lines."""
    assert len(README.splitlines()) < 250


def test_bench_readme_quotes_the_real_model_results_as_the_bench_wrote_them(tmp_path):
    """bench/README.md's real-model figures are the ones in bench/results/real_model.json: the section between the
    bench's markers is what `bench/real_model.py` writes from that file, so the page cannot drift from the results."""
    import json

    from helpers import load_bench

    bench = load_bench("real_model")
    results = json.loads((ROOT / "bench" / "results" / "real_model.json").read_text())
    page = (ROOT / "bench" / "README.md").read_text()
    assert bench.BEGIN + "\n" + bench.markdown(results) + "\n" + bench.END in page
    # The writer keeps the rest of the page and refuses a page without its markers.
    copy = tmp_path / "README.md"
    copy.write_text("# head\n" + bench.BEGIN + "\nold\n" + bench.END + "\ntail\n")
    bench.write_readme_section("new", copy)
    assert copy.read_text() == "# head\n" + bench.BEGIN + "\nnew\n" + bench.END + "\ntail\n"
    copy.write_text("no markers\n")
    from grpokit.errors import RecipeError

    with pytest.raises(RecipeError, match="markers"):
        bench.write_readme_section("new", copy)


def test_bench_readme_quotes_the_tool_use_results_and_reads_them_by_the_tasks_rule():
    """The tool-use section is what `bench/tool_use.py` writes from results/tool_use.json, and its reading is the
    tasks page's: a verdict only from 3 seeds, learning only at +10 points on every one of them."""
    import copy
    import json

    from helpers import load_bench

    bench = load_bench("tool_use")
    results = json.loads((ROOT / "bench" / "results" / "tool_use.json").read_text())
    page = (ROOT / "bench" / "README.md").read_text()
    assert bench.BEGIN + "\n" + bench.markdown(results) + "\n" + bench.END in page

    def seed(n, rise, calls):
        return {"seed": n, "rise": rise, "after": {"pass@1": 0.5 + rise, "tools": {"calls_per_completion": calls}}}

    made_up = copy.deepcopy(results)
    made_up["seeds"] = [seed(0, 0.15, 1.0), seed(1, 0.12, 0.9)]
    assert "2 of 3 seeds so far; learns" in bench.reading(made_up)
    made_up["seeds"].append(seed(2, 0.05, 1.0))
    said = bench.reading(made_up)
    assert "pass@1 mixed: 2 of 3 seeds up 10+ points" in said and "so far" not in said
    assert "tool calls per completion 0.80 in the base, 1.00, 0.90, 1.00 after" in said
    made_up["seeds"][2] = seed(2, 0.11, 1.0)
    assert "pass@1 learns: up +11 to +15 points on every seed" in bench.reading(made_up)
    made_up["seeds"] = [seed(n, 0.141, 1.0) for n in range(3)]  # every seed alike: one figure, not "+14 to +14"
    assert "pass@1 learns: up +14 points on every seed" in bench.reading(made_up)


def test_bench_readme_quotes_every_tool_recipe_and_the_warm_starts_from_their_results():
    """Each other tool recipe's section (Python tool, several calls) is what `bench/tool_use.py --recipe NAME` writes
    from its results file; the several-calls section labels its first row the warm start the seeds trained from (not
    the recipe's own model), and the warm starts' table is what `bench/multi_call.py` writes from its file."""
    import json

    from helpers import load_bench

    tool_use, multi_call = load_bench("tool_use"), load_bench("multi_call")
    page = (ROOT / "bench" / "README.md").read_text()
    for name in tool_use.OTHERS:
        recipe, out, begin, end = tool_use.places(name)
        assert begin + "\n" + tool_use.section(recipe, out) + "\n" + end in page, name
    several = tool_use.section(*tool_use.places("multi_call")[:2])
    assert "\n| warm start | " in several and "| base |" not in several
    tried = json.loads((ROOT / "bench" / "results" / multi_call.WARM_RESULTS).read_text())
    table = multi_call.warm_markdown(tried)
    assert multi_call.WARM_BEGIN + "\n" + table + "\n" + multi_call.WARM_END in page
    rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows[0] == "| base" and len(rows) == sum(1 for entry in tried["warm_starts"].values() if entry.get("sampled"))


def test_real_model_keeps_earlier_seeds_only_when_they_measured_the_same_thing():
    """`--keep` carries seeds an earlier call scored (their runs may be gone) into the new results, never a seed this
    call scores again, and refuses when the earlier file measured something else (another base figure, recipe, ...)."""
    from helpers import load_bench

    from grpokit.errors import RecipeError

    bench = load_bench("real_model")
    same = {"recipe": "r.yaml", "dtype": "bfloat16", "steps": 30, "completions_per_step": 16, "cap": 96, "heldout": "h", "pass_reward": "p",
            "base": {"pass@1": 0.5, "passed": 32, "prompts": 64}}
    previous = {**same, "seeds": [{"seed": 0, "rise": 0.1}, {"seed": 1, "rise": 0.2}]}
    assert bench.kept_seeds(previous, {**same, "seeds": []}, [0, 2]) == [{"seed": 1, "rise": 0.2}]
    with pytest.raises(RecipeError, match=r"--keep: .*base .*0\.5.*0\.25"):
        bench.kept_seeds(previous, {**same, "base": {**same["base"], "pass@1": 0.25}}, [0])
    with pytest.raises(RecipeError, match=r"steps 30 there, 60 now"):
        bench.kept_seeds(previous, {**same, "steps": 60}, [0])
    with pytest.raises(RecipeError, match=r"dtype 'bfloat16' there, 'float32' now"):
        bench.kept_seeds(previous, {**same, "dtype": "float32"}, [0])
