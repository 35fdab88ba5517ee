"""A corpus of hostile recipes and data files (tests/hostile/): each ends in clear messages and exit code 2.

Cases: a recipe that would run code, bad dataset values, NaN and infinities, prompts over the model's context,
and messages (empty files, YAML tags, a base that is not a recipe, an alias bomb). Every case runs
`launch.py --check` in-process and must exit 2, name the problem (row or line numbers 1-based), print no
traceback and load no weights. Each YAML file's first line says what it breaks; the data files come from
tests/hostile/fixtures/make_data.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, launch, with_trainer, write_recipe

from grpokit.prompts import data
from grpokit.cli import main
from grpokit.prompts.datavalues import MAX_CELL_CHARS, MAX_LINE_BYTES

CORPUS = ROOT / "tests" / "hostile"
FIXTURES = CORPUS / "fixtures"

# case file (without .yaml) -> fragments the message must contain
CASES = {
    # --- a recipe is data; naming a callable that is not a reward runs nothing
    "reward_runs_code": ["subprocess:Popen", "standard library"],
    # --- bad dataset values, each with its 1-based line (.jsonl) or row (parquet, csv)
    "data_not_utf8": ["dataset.path: not_utf8.jsonl line 2 is not UTF-8 text", "byte 0xe9", "save the file as UTF-8"],
    "data_empty_jsonl": ["dataset.path: empty.jsonl is empty"],  # named, never a bare `StopIteration:`
    "data_whitespace_jsonl": ["dataset.path: whitespace.jsonl is empty (only blank lines)"],
    "data_empty_csv": ["dataset.path: empty.csv is empty"],
    "data_bad_json_line": ["dataset.path: bad_json_line.jsonl line 3 is not valid JSON", "column 25"],
    "data_numeric_prompt": ["dataset.prompt_column: numeric_prompt.jsonl line 2: 'prompt' holds a number", "got 7",
                            "text or a list of chat messages"],
    "data_bool_prompt": ["bool_prompt.jsonl line 1: 'prompt' holds true/false", "got True"],
    "data_mixed_prompt": ["mixed_prompt.jsonl line 3: 'prompt' holds a number", "got 3.5"],
    "data_list_of_strings_prompt": ["list_of_strings_prompt.jsonl line 1: 'prompt' holds a list of plain strings",
                                    "a chat prompt is a list of {role, content} messages"],
    "data_message_without_content": ["message_without_content.jsonl line 1: 'prompt' message 2 has no 'content'"],
    "data_dict_prompt": ["dict_prompt.jsonl line 2: 'prompt' holds a mapping", "got {'text': 'Say apple.'}"],
    "data_list_answer": ["dataset.answer_column: list_answer.jsonl line 1: 'answer' holds a list",
                         "a gold answer is text or a number"],
    "data_text_and_chat_prompts": ["text_and_chat_prompts.jsonl line 2: 'prompt' holds chat messages, but line 1's is text",
                                   "one form per dataset"],
    "data_parquet_int_prompt": ["int_prompt.parquet row 1: 'prompt' holds a number", "(and 1 more row like it: row 2)"],
    "data_parquet_binary_prompt": ["binary_prompt.parquet row 1: 'prompt' holds bytes", "store it as text (UTF-8)"],
    "data_parquet_list_prompt": ["list_prompt.parquet row 1: 'prompt' holds a list of plain strings"],
    "data_deep_json": ["dataset.path: deep_json.jsonl line 2 nests JSON arrays or objects deeper than Python's JSON "
                       "reader can follow"],
    # --- non-finite numbers, everywhere a number is validated
    "nan_learning_rate": ["trainer.learning_rate: must be a finite number", "got nan"],
    "inf_temperature": ["trainer.temperature: must be a finite number", "got inf"],
    "number_text_overflows": ["trainer.learning_rate: must be a finite number", "got inf"],
    "nan_lora_dropout": ["lora.lora_dropout: must be a finite number", "got nan"],
    "nan_reward_weight": ["rewards[0].weight: must be a finite number", "got nan"],
    "inf_penalty_factor": ["rewards[0].args.penalty_factor: must be a finite number", "got inf"],
    # --- prompts the model cannot hold
    "context_overflow": ["dataset: no rows left to train on (3 read", "3 longer than the model's context"],
    # --- messages
    "yaml_tag": ["line 3: YAML tag !!python/object/apply:os.system is not allowed", "plain data, loaded with safe_load"],
    "base_not_a_recipe": ["/etc/passwd: not a recipe: the file holds text, not a mapping of sections",
                          "read as the base of"],
    "alias_bomb": ["YAML aliases expand to more than", "values"],
    # --- GGUF checkpoints: every declared length is checked against the file before it is read
    "gguf_array_bomb": ["model.gguf_file: corrupt GGUF: metadata 'x.bomb' (1,099,511,627,776 items) declares "
                        "1,099,511,627,776 bytes", "but the file (99 bytes) has only"],
    "gguf_arch_only": ["model.gguf_file: GGUF file lacks what a llama model needs: metadata tokenizer.ggml.model, "
                       "tokenizer.ggml.tokens, llama.block_count", "tensors (it holds no weights)"],
}
PROBLEM_COUNT = {}  # every case is exactly one problem
NEVER_SHOWN = {"base_not_a_recipe": ["root:", "/bin/"]}  # the content of a file that is not a recipe
NEVER_CREATED = {"reward_runs_code": Path("/tmp/grpokit-hostile-pwned")}  # what the case's code would have made


def test_corpus_and_table_agree():
    assert sorted(p.stem for p in CORPUS.glob("*.yaml")) == sorted(CASES)


def test_the_base_is_valid(no_weights, capsys):
    """So that each case fails for the one thing it breaks."""
    assert main(["--recipe", str(FIXTURES / "valid.yaml"), "--check"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input(case, no_weights, capsys):
    marker = NEVER_CREATED.get(case)
    if marker:
        marker.unlink(missing_ok=True)
    assert main(["--recipe", str(CORPUS / f"{case}.yaml"), "--check"]) == 2
    assert marker is None or not marker.exists(), "the recipe ran code"
    captured = capsys.readouterr()
    err = captured.err
    for fragment in CASES[case]:
        assert fragment in err, err
    assert err.count("\n  - ") == PROBLEM_COUNT.get(case, 1), err
    assert "Traceback" not in err + captured.out
    for secret in NEVER_SHOWN.get(case, []):
        assert secret not in err + captured.out


def test_a_bad_json_line_is_reported_once(capsys):
    """datasets logged its own "Failed to load JSON ... in row 2" (0-based) before our message: one report only."""
    assert main(["--recipe", str(CORPUS / "data_bad_json_line.yaml"), "--check"]) == 2
    captured = capsys.readouterr()
    both = captured.out + captured.err
    assert both.count("not valid JSON") == 1 and "Failed to load JSON" not in both and "row 2" not in both


def test_numeric_gold_answers_stay_text(tmp_path):
    """`datasets.map` cast str(5) back into the column's int64: rewards compared 5 with "5"."""
    path = tmp_path / "numbers.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{n}+{n}?", "answer": 2 * n}) + "\n" for n in range(3)))
    ds = data.prepare(data.load_raw({"path": str(path)}), {"prompt_column": "prompt", "answer_column": "answer"},
                      data.TargetModel(conversational=False), log=lambda m: None)
    assert ds["answer"] == ["0", "2", "4"]
    float_path = tmp_path / "floats.jsonl"
    float_path.write_text(json.dumps({"prompt": "half?", "answer": 0.5}) + "\n")
    ds = data.prepare(data.load_raw({"path": str(float_path)}), {"prompt_column": "prompt", "answer_column": "answer"},
                      data.TargetModel(conversational=False), log=lambda m: None)
    assert ds["answer"] == ["0.5"]


def test_a_huge_recipe_file_is_refused_unread(tmp_path, capsys):
    """Input size is bounded before YAML parses a byte of it."""
    path = tmp_path / "huge.yaml"
    path.write_text("# padding\n" * 200_000)  # 2 MB of comments
    assert main(["--recipe", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "huge.yaml: the file is 2.0 MB; a recipe is at most 1 MB" in err and "Traceback" not in err


def test_an_alias_bomb_on_the_command_line_is_refused(capsys):
    small = "[&a [x, x, x], *a, *a]"  # aliases as such are fine: this one is just the wrong type
    assert main(["--recipe", str(FIXTURES / "valid.yaml"), "--check", f"trainer.max_steps={small}"]) == 2
    err = capsys.readouterr().err
    assert "trainer.max_steps: has the wrong type" in err and "Traceback" not in err
    levels = ["&a0 [" + ", ".join(["x"] * 9) + "]"]
    levels += [f"&a{k} [" + ", ".join([f"*a{k - 1}"] * 9) + "]" for k in range(1, 8)]  # 9^8 values once expanded
    assert main(["--recipe", str(FIXTURES / "valid.yaml"), "--check", f"trainer.max_steps=[{', '.join(levels)}]"]) == 2
    err = capsys.readouterr().err
    assert "YAML aliases expand to more than" in err and "Traceback" not in err


def test_yaml_tag_names_the_whole_tag():
    from grpokit.config.loader import read_yaml
    from grpokit.errors import RecipeError

    with pytest.raises(RecipeError) as caught:
        read_yaml(CORPUS / "yaml_tag.yaml")
    assert "(:yaml.org" not in str(caught.value) and "tag !!python/object/apply:os.system is not allowed" in str(caught.value)


# --- --check measures every prompt, drops those the model cannot hold (with a count), prints rows short


def _check_output(tmp_path, rows, capsys, **dataset):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = with_trainer(tmp_path)
    recipe["dataset"].update(path=str(path), **dataset)
    code = main(["--recipe", str(write_recipe(tmp_path, recipe)), "--check"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out, captured.err


def test_check_measures_every_row_not_the_first_2000(tmp_path, capsys, tiny_model_dir):
    """A long prompt at row 2,501 was never measured: the plan said 21 tokens and 'fits'."""
    rows = [{"prompt": "Say apple.", "answer": "a"}] * 2500 + [{"prompt": "b" * 600, "answer": "a"}]
    code, out, err = _check_output(tmp_path, rows, capsys)
    assert code == 0, err
    # the tiny model's tokenizer reads one token a character; its chat template adds <|user|>, <|end|>, <|assistant|>
    assert "prompt length 603 tokens: the longest formatted prompt (all 2,501 rows, chat template included)" in out


def test_prompts_over_the_context_are_dropped_with_a_count_and_rows_print_short(tmp_path, capsys, tiny_model_dir):
    """A 1 MB prompt passed --check and would run out of memory; --check printed all of it."""
    rows = [{"prompt": "x" * 1_000_000, "answer": "a"}, {"prompt": "y" * 900, "answer": "a"}, {"prompt": "Say apple.", "answer": "a"}]
    code, out, err = _check_output(tmp_path, rows, capsys)
    assert code == 0, err
    assert ("dataset: dropped 1 of 3 prompts longer than the model's context leaves them: "
            "4096 positions - max_completion_length 16 = 4080 tokens") in out
    assert "dataset: 2 prompts ready (of 3 rows)" in out
    assert "y" * 120 + "... [900 characters]" in out and "y" * 121 not in out
    assert len(out) < 20_000


def test_max_prompt_tokens_and_context_drops_are_counted_apart(tmp_path, capsys, tiny_model_dir):
    rows = [{"prompt": "x" * 4500, "answer": "a"}, {"prompt": "y" * 60, "answer": "a"}, {"prompt": "Say apple.", "answer": "a"}]
    code, out, err = _check_output(tmp_path, rows, capsys, max_prompt_tokens=5000)
    assert code == 0, err
    assert "dataset: dropped 1 of 3 prompts longer than the model's context" in out
    code, out, err = _check_output(tmp_path, rows, capsys, max_prompt_tokens=40)
    assert "dataset: dropped 2 of 3 prompts longer than 40 tokens (max_prompt_tokens)" in out


def test_batched_lengths_are_trl_s_own(tiny_model_dir):
    """One batched call per 512 rows must count what TRL's `_tokenize_prompts` feeds the model, row by row."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    chats = [[{"role": "user", "content": "a" * n}] for n in (1, 7, 30)] + [[{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]]
    texts = ["", "abc", "a longer line of text"]
    for prompts in (chats, texts):
        ds = Dataset.from_dict({"prompt": prompts})
        lengths = data.prompt_lengths(tokenizer, ds, batch_size=2)
        assert lengths == [data.prompt_tokens(tokenizer, p) for p in prompts]
    single = tokenizer.apply_chat_template(chats[1], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert data.prompt_lengths(tokenizer, Dataset.from_dict({"prompt": chats}))[1] == len(single)


# --- a copied recipe keeps its data; --check catches a reward's missing column; overrides blamed right


def test_a_copied_smoke_recipe_still_finds_its_data(tmp_path, capsys, tiny_model_dir):
    """smoke.yaml names its data `builtin:smoke.jsonl`: copied anywhere, it still checks (and the resolved recipe says so)."""
    copy = tmp_path / "elsewhere" / "my.yaml"
    copy.parent.mkdir()
    copy.write_text((ROOT / "recipes" / "smoke.yaml").read_text())
    assert main(["--recipe", str(copy), "--check", "--full", f"trainer.output_dir={tmp_path / 'run'}"]) == 0, \
        capsys.readouterr().err
    assert "path: builtin:smoke.jsonl" in capsys.readouterr().out


def test_a_lost_relative_path_says_where_it_was_read_from(tmp_path, capsys):
    recipe = (ROOT / "tests" / "hostile" / "fixtures" / "valid.yaml").read_text()
    (tmp_path / "copied.yaml").write_text(recipe)  # its ../../../grpokit/assets/smoke.jsonl now points nowhere
    assert main(["--recipe", str(tmp_path / "copied.yaml"), "--check"]) == 2
    err = capsys.readouterr().err
    assert "dataset.path: dataset file does not exist" in err
    assert f"a relative path is read from the folder of the recipe that sets it ({tmp_path})" in err
    assert "builtin:smoke.jsonl" in err and "Traceback" not in err


def test_an_unknown_builtin_data_file_names_the_shipped_ones(tmp_path, capsys):
    recipe = with_trainer(tmp_path)
    recipe["dataset"]["path"] = "builtin:smoke.jsnol"
    assert main(["--recipe", str(write_recipe(tmp_path, recipe)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "dataset.path: no data file shipped as 'builtin:smoke.jsnol'" in err and "did you mean 'builtin:smoke.jsonl'?" in err


REWARD_NEEDS_SOLUTION = "def f(completions, solution, **kwargs):\n    return [float(s in c) for c, s in zip(completions, solution)]\n"


def test_a_reward_parameter_that_is_no_column_fails_check(tmp_path, capsys):
    """`def f(completions, solution, **kwargs)` passed --check and raised TypeError at the first step."""
    (tmp_path / "needs.py").write_text(REWARD_NEEDS_SOLUTION)
    recipe = with_trainer(tmp_path)
    recipe["rewards"] = [{"name": "char_fraction", "args": {"char": "a"}}, {"name": "needs.py:f"}]
    assert main(["--recipe", str(write_recipe(tmp_path, recipe)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "rewards[1].name: reward 'f' requires 'solution', which TRL does not pass" in err
    assert "dataset columns: id, answer" in err and "Traceback" not in err


def test_a_reward_parameter_that_is_a_column_passes(tmp_path, capsys, tiny_model_dir):
    (tmp_path / "needs.py").write_text(REWARD_NEEDS_SOLUTION.replace("solution", "answer"))
    recipe = with_trainer(tmp_path)
    recipe["rewards"] = [{"name": "needs.py:f"}]
    assert main(["--recipe", str(write_recipe(tmp_path, recipe)), "--check"]) == 0, capsys.readouterr().err


def test_reward_failures_count_steps_from_1_as_the_console_does():
    """During the first step TRL's global_step is still 0: the message said 'step 0' while the console said 'step 1'."""
    import types

    import rewards

    def boom(completions, **kwargs):
        raise ValueError("no")

    guarded = rewards.Guarded("boom", boom)
    with pytest.raises(Exception) as caught:
        guarded(["x"], trainer_state=types.SimpleNamespace(global_step=0))
    assert "reward 'boom' raised at step 1 on sample 0" in str(caught.value)


def test_an_override_is_blamed_on_the_command_line(capsys):
    """`rewards.0.name=char_fracton` was reported as `valid.yaml: rewards[0].name`."""
    assert main(["--recipe", str(FIXTURES / "valid.yaml"), "--check", "rewards.0.name=char_fracton"]) == 2
    err = capsys.readouterr().err
    assert "  - command line: rewards[0].name: unknown reward 'char_fracton'" in err and "valid.yaml" not in err
    assert main(["--recipe", str(FIXTURES / "valid.yaml"), "--check", "rewards.0.args.char=ab"]) == 2
    err = capsys.readouterr().err
    assert "  - command line: rewards[0].args: reward 'char_fraction': argument char=" in err
    assert main(["--recipe", str(FIXTURES / "valid.yaml"), "--check", "rewards.0.wieght=2"]) == 2
    err = capsys.readouterr().err
    assert "  - command line: rewards[0].wieght: is not a known key" in err


def test_a_dataset_named_on_the_command_line_is_blamed_on_it(tmp_path, capsys, monkeypatch):
    """Its faults are the command line's, not valid.yaml's: the recipe file names another dataset."""
    monkeypatch.chdir(tmp_path)
    assert main(["--recipe", str(FIXTURES / "valid.yaml"), "--check", f"dataset.path={FIXTURES / 'numeric_prompt.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert "  - command line: dataset.prompt_column: numeric_prompt.jsonl line 2: 'prompt' holds a number" in err
    assert "valid.yaml" not in err
    assert main(["--recipe", str(FIXTURES / "valid.yaml"), "--check", "dataset.path=nope.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "  - command line: dataset.path: dataset file does not exist; a relative path on the command line is read " \
           f"from the folder the command runs in ({tmp_path})" in err and "valid.yaml" not in err


def test_a_base_chain_too_long_says_its_limit_and_where_it_stopped(tmp_path, capsys):
    """1,000 recipes each extending the next ran Python out of stack: "r20.yaml: YAML nested too deeply"."""
    from grpokit.config.loader import MAX_BASE_CHAIN

    (tmp_path / "r999.yaml").write_text((FIXTURES / "valid.yaml").read_text().replace("../../../", str(ROOT) + "/"))
    for i in range(999):
        (tmp_path / f"r{i}.yaml").write_text(f"base: r{i + 1}.yaml\n")
    assert main(["--recipe", str(tmp_path / "r0.yaml"), "--check"]) == 2
    err = capsys.readouterr().err
    assert (f"  - {tmp_path / f'r{MAX_BASE_CHAIN - 1}.yaml'}: base: the chain of base recipes is longer than "
            f"{MAX_BASE_CHAIN} (MAX_BASE_CHAIN; shipped recipes use at most 3): stopped before reading "
            f"{tmp_path / f'r{MAX_BASE_CHAIN}.yaml'}, the base named here, {MAX_BASE_CHAIN} links from "
            f"{tmp_path / 'r0.yaml'}") in err, err
    assert "nested too deeply" not in err and "Traceback" not in err


def test_the_reward_keywords_are_trl_s_own():
    """reward_call_problems trusts a list of what TRL passes a reward: a TRL upgrade that changes it fails here."""
    import inspect
    import re

    from trl import GRPOTrainer

    from grpokit.trl_compat import TRL_REWARD_KEYWORDS

    source = inspect.getsource(GRPOTrainer._calculate_rewards)
    extra = set(re.findall(r'(?<!row_)reward_kwargs\["(\w+)"\]', source)) - {"environments"}  # only with environment_factories
    assert "prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs" in source
    assert set(TRL_REWARD_KEYWORDS) == {"prompts", "completions", "completion_ids"} | extra


SUBPROCESS_CASES = ["data_not_utf8", "alias_bomb", "nan_learning_rate"]  # the data, YAML and value stages


@pytest.mark.slow
@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_hostile_input_as_a_real_command(case):
    """As a user runs it: library loggers, warnings and the exit code of a real process."""
    proc = launch("--recipe", str(CORPUS / f"{case}.yaml"), "--check", timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert all(fragment in proc.stderr for fragment in CASES[case]), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


# (cell or line, bytes, fragments): sizes just past each cap, made in the test; a real command, because without the
# caps the tokenizer aborts the whole process (SIGABRT) rather than raising
OVERSIZED = {
    "prompt": ('{"prompt": "%s", "answer": "a"}', MAX_CELL_CHARS + 1,
               [f"big.jsonl line 2: 'prompt' holds {MAX_CELL_CHARS + 1:,} characters",
                f"at most {MAX_CELL_CHARS:,} characters a cell"]),
    "line": ('{"prompt": "Say apple.", "answer": "a", "pad": "%s"}', MAX_LINE_BYTES,
             [f"dataset.path: big.jsonl line 2 is longer than {MAX_LINE_BYTES // 2**20} MiB (MAX_LINE_BYTES); refused unread"]),
}


@pytest.mark.parametrize("what", sorted(OVERSIZED))
def test_an_oversized_cell_or_line_is_refused_before_parsing_or_tokenizing(what, tmp_path):
    line, size, fragments = OVERSIZED[what]
    path = tmp_path / "big.jsonl"
    path.write_text('{"prompt": "Say apple.", "answer": "a"}\n' + line % ("x" * size) + "\n")
    recipe = with_trainer(tmp_path)
    recipe["dataset"]["path"] = str(path)
    proc = launch("--recipe", str(write_recipe(tmp_path, recipe)), "--check", timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert all(fragment in proc.stderr for fragment in fragments), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout and len(proc.stderr) < 2000


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0"])
def test_gpu_memory_must_be_a_finite_positive_number(value, capsys):
    """`--gpu-memory` must be a finite positive number: `nan` must not plan for 'a nan GiB GPU' and say the recipe fits."""
    with pytest.raises(SystemExit) as caught:
        main(["--recipe", str(FIXTURES / "valid.yaml"), "--check", f"--gpu-memory={value}"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --gpu-memory: must be a finite number of GB > 0 (got {value!r})" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_num_processes_must_be_one_or_more(value, capsys):
    """`--num-processes -3` passed --check, which planned "generation batch -24 (-6 prompts x 4)"."""
    with pytest.raises(SystemExit) as caught:
        main(["--recipe", str(FIXTURES / "valid.yaml"), "--check", f"--num-processes={value}"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --num-processes: must be a whole number of processes, 1 or more (got {value!r})" in err
    assert "Traceback" not in err


def test_an_empty_output_dir_override_is_a_schema_problem(capsys):
    """`trainer.output_dir=` reads as null, which GRPOConfig's `str | None` let through to a TypeError in Path()."""
    assert main(["--recipe", str(FIXTURES / "valid.yaml"), "--check", "trainer.output_dir="]) == 2
    err = capsys.readouterr().err
    assert ("  - command line: trainer.output_dir: must be a folder path; leave the key out for the default "
            "runs/<recipe name> (got None)") in err and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_during_check_is_one_line_and_exit_130():
    """SIGINT once --check has said its first line: no traceback, the shell's code for Ctrl-C."""
    import signal
    import subprocess
    import sys

    def as_from_a_shell():  # a shell starts a command with SIGINT at its default and unblocked, whatever this process has
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    proc = subprocess.Popen([sys.executable, "launch.py", "--recipe", str(FIXTURES / "valid.yaml"), "--check"], cwd=ROOT,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=as_from_a_shell)
    first = proc.stdout.readline()  # "[grpokit] recipe: ...", said before the heavy libraries are imported
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert first.startswith("[grpokit] recipe: ")
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err and err.strip().splitlines()[-1] == "launch.py: interrupted (Ctrl-C)"


def test_lines_that_are_not_rows_are_counted_after_the_first(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "Say apple.", "answer": "a"}\nnull\n[1]\n{oops\n')
    recipe = with_trainer(tmp_path)
    recipe["dataset"]["path"] = str(path)
    assert main(["--recipe", str(write_recipe(tmp_path, recipe)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "rows.jsonl line 2 is not a JSON object ({...}, one row): it holds null (and 2 more bad lines: 3, 4)" in err


@pytest.mark.slow
def test_numeric_gold_answers_reach_a_reward_as_text_in_a_real_step(tmp_path, capsys):
    """Through data preparation and TRL's reward call: a reward comparing text never sees the int 5."""
    (tmp_path / "gold.py").write_text(
        "def is_text(completions, answer, **kwargs):\n"
        "    kinds = {type(a).__name__ for a in answer}\n"
        "    if kinds != {'str'}:\n"
        "        raise TypeError(f'gold answers arrived as {kinds}')\n"
        "    return [float(a == '4') for a in answer]\n"
    )
    path = tmp_path / "numbers.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{n}+{n}?", "answer": 2 * n}) + "\n" for n in range(8)))
    recipe = with_trainer(tmp_path, max_steps=1)
    recipe["dataset"]["path"] = str(path)
    recipe["rewards"] = [{"name": "gold.py:is_text"}]
    assert main(["--recipe", str(write_recipe(tmp_path, recipe))]) == 0, capsys.readouterr().err
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["global_step"] == 1 and "rewards/is_text/mean" in state["log_history"][0]
