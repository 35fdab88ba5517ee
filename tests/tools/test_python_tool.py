"""The shipped Python tool (grpokit.tools.environments.PythonTool): a caged interpreter kept per rollout, so later calls see
what earlier ones defined; every limit and every hostile program ends as a call the model can read about, never as a
stopped or slowed run; its limits are checked at --check; real multi-call GRPOTrainer steps run it on the tiny model."""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest

from grpokit import config
from grpokit.run import training
from grpokit.config import validate
from grpokit.tools.environments import PythonTool
from grpokit.errors import RecipeError
from tests.helpers import cage_processes, completion_reader, recipe_dict, write_recipe


def processes_of(t: PythonTool) -> list[int]:
    """The pids of the rollout's worker and whatever it runs (below its keeper in the cage)."""
    pool = t._session.pool
    keeper = t._session.ident()
    below = [pid for pid in cage_processes(pool) if pid != keeper]
    return [pid for pid in below if _ancestor(pid, keeper)]


def _ancestor(pid: int, keeper_ident) -> bool:
    # The keeper's id is its pid inside the cage's namespace; NSpid's last field is that pid.
    seen = pid
    for _ in range(8):
        try:
            with open(f"/proc/{seen}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            return False
        if status["NSpid"].split()[-1] == str(keeper_ident) and seen != pid:
            return True
        seen = int(status["PPid"])
    return False


# ---------------------------------------------------------------------------------------------------------------
# A notebook per rollout


def test_later_calls_see_what_earlier_calls_defined_as_in_a_notebook(tool):
    t = tool()
    assert t.python("x = 6 * 7") == "(no output)"
    assert t.python("import math\ndef f(n):\n    return math.factorial(n)") == "(no output)"
    assert t.python("print(x + 1)\nf(5)") == "43\n120\n"  # printed, then the last line's value, as a notebook shows it
    assert t.python("import sympy\nsympy.factorint(x)") == "{2: 1, 3: 1, 7: 1}\n"
    assert t.calls == ["ok"] * 4


def test_each_rollout_starts_with_a_fresh_interpreter_and_its_own_files(tool):
    a, b = tool(), tool()
    a.python("secret = 1\nopen('/tmp/note', 'w').write('a')")
    assert "NameError" in b.python("secret")
    assert b.python("import os\nos.listdir('/tmp')") == "[]\n"  # a's /tmp is a's own
    a.reset()  # the next rollout on the same instance
    assert "NameError" in a.python("secret")
    assert a.python("import os\nos.listdir('/tmp')") == "[]\n"


def test_an_error_shows_the_end_of_its_traceback_and_keeps_the_state(tool):
    t = tool()
    t.python("y = 2")
    out = t.python("def g():\n    return 1 / 0\nprint('before')\ng()")
    assert out.startswith("before\nTraceback (most recent call last):")
    assert out.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "python_job" not in out  # the frames are the model's code, not the cage's
    broken = t.python("print(")
    assert "SyntaxError" in broken and 'File "<cell>", line 1' in broken
    assert "compile(" not in broken and ".py" not in broken  # no frame of the parser that read the cell
    assert t.python("y") == "2\n"
    assert t.calls == ["ok", "error", "error", "ok"]


def test_long_output_is_cut_with_a_note_and_the_traceback_still_shown(tool):
    t = tool(max_output_chars=200)
    out = t.python("print('x' * 5000)\nraise ValueError('late')")
    assert out.startswith("x" * 200 + "\n[output cut: 4801 more characters]")
    assert out.rstrip().endswith("ValueError: late")
    assert len(out) < 200 + 700


# ---------------------------------------------------------------------------------------------------------------
# Limits: a failed call with a line the model can read; the next call works; nothing left running


def test_a_call_past_its_time_fails_restarts_the_interpreter_and_leaves_nothing_running(tool):
    t = tool(timeout_seconds=0.5)
    t.python("z = 5")
    with pytest.raises(TimeoutError, match="ran past 0.5 s and was stopped; the interpreter restarted, so names "
                                           "defined before are gone"):
        t.python("while True:\n    pass")
    assert "NameError" in t.python("z")  # a fresh interpreter
    assert t.python("1 + 1") == "2\n"
    assert t.calls == ["ok", "timeout", "error", "ok"]
    assert t._session.restarts == 1


def test_what_a_call_starts_is_killed_when_the_call_ends(tool):
    t = tool()
    t.python("import os, time\nif os.fork() == 0:\n    time.sleep(600)")
    assert len(processes_of(t)) == 1  # the worker alone: the child the call forked is gone
    assert t.python("import os\nos.waitpid(-1, os.WNOHANG)") != ""


@pytest.mark.parametrize("code, outcome", [
    # a fork bomb: the process limit refuses forks; the call ends and the interpreter lives
    ("import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            import time; time.sleep(60)\n"
     "        n += 1\nexcept OSError as e:\n    print('forks', n, type(e).__name__)", "forks"),
    # a memory bomb: MemoryError inside the call, past the call's memory
    ("b = bytearray(2 << 30)", "MemoryError"),
    # the network: no interface is up
    ("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", "OSError"),
    ("import urllib.request\nurllib.request.urlopen('http://example.com', timeout=1)", "URLError"),
    # the run's files: not in the cage's root
    ("open({secret!r}).read()", "FileNotFoundError"),
    ("import os\nos.listdir({folder!r})", "FileNotFoundError"),
    # writing outside its /tmp: a read-only root
    ("open('/usr/evil', 'w')", "OSError"),
])
def test_hostile_programs_end_as_calls_with_a_readable_error(tool, tmp_path, code, outcome):
    secret = tmp_path / "run" / "trainer_state.json"
    secret.parent.mkdir()
    secret.write_text("{}")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    t = tool()
    t.python("kept = 1")
    out = t.python(code.format(port=listener.getsockname()[1], secret=str(secret), folder=str(tmp_path)))
    assert outcome in out, out
    assert t.python("kept") == "1\n"  # the interpreter lived through it
    listener.settimeout(0.1)
    with pytest.raises(socket.timeout):
        listener.accept()  # nothing connected
    assert secret.read_text() == "{}"


def test_signalling_its_process_group_reaches_no_other_rollout(tool):
    # kill(0) signals the sender's process group, which the kernel finds whatever pid namespace its members are in:
    # interpreters sharing one group (and one uid) could end each other.
    t, other = tool(), tool()
    other.python("mine = 1")
    t.python("import os, signal\nos.kill(0, signal.SIGKILL)")
    assert other.python("mine") == "1\n"


def test_killing_its_parent_or_every_process_reaches_nothing_outside(tool):
    t, other = tool(), tool()
    other.python("mine = 1")
    t.python("import os, signal\nfor pid in (os.getppid(), 1, -1, 2, 3, 4, 5):\n    try:\n"
             "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass")
    assert t.python("'alive'") == "'alive'\n"  # pid 1 of its own namespace: the kernel ignores the signals it sends itself
    assert other.python("mine") == "1\n"  # another rollout's interpreter, the cage and the trainer: out of reach
    assert t._session.pool._cages[0].alive()


def test_an_interpreter_that_dies_fails_the_call_and_the_next_starts_fresh(tool):
    t = tool()
    t.python("w = 1")
    with pytest.raises(RuntimeError, match="the interpreter stopped"):
        t.python("import os\nos._exit(3)")
    assert "NameError" in t.python("w")
    assert t.calls == ["ok", "crash", "error"]


def test_the_code_must_be_text(tool):
    with pytest.raises(TypeError, match="python takes the code as a string, got int"):
        tool().python(12)


def test_a_signal_during_a_call_leaves_no_call_running(tool):
    t = tool(timeout_seconds=30)
    t.python("ok = 1")

    def cut(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, cut)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(KeyboardInterrupt):
            t.python("while True:\n    pass")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert t._session.ident() is None  # the worker ended with the interrupted call
    assert "NameError" in t.python("ok")


# ---------------------------------------------------------------------------------------------------------------
# --check: limits, rounds


def python_recipe(folder, args: dict | None = None, tools_extra: dict | None = None, **trainer) -> str:
    data = recipe_dict()
    data["model"]["chat_template"] = "qwen2_5"
    data["tools"] = {"environment": "grpokit.tools.environments:PythonTool", **({"environment_args": args} if args else {}),
                     **(tools_extra or {})}
    data["trainer"].update({"max_completion_length": 320, "max_tool_calling_iterations": 2,
                            "output_dir": str(folder / "run"), **trainer})
    return write_recipe(folder, data)


@pytest.mark.parametrize("args, tools_extra, expected", [
    ({"timeout_seconds": "fast"}, {}, "tools.environment_args.timeout_seconds: does not fit PythonTool's constructor's "
                                      "annotation for timeout_seconds (got 'fast'); allowed: number"),
    ({"memory_mb": 10}, {}, "tools.environment_args.memory_mb: is out of range for memory a call may add to the "
                            "interpreter's (MemoryError past it) (got 10); allowed: an integer from 64 to 8192"),
    ({"timeout_seconds": 20}, {}, "tools.environment_args.timeout_seconds: is not below tools.timeout_seconds (10), "
                                  "which would cut the call first"),
    ({"max_output_chars": 5000}, {"max_result_chars": 2000}, "tools.environment_args.max_output_chars: cannot fit "
                                                             "tools.max_result_chars (2000)"),
    ({"timeout_secnds": 2}, {}, "did you mean 'timeout_seconds'?"),
])
def test_each_bad_limit_is_one_line_at_check(tmp_path, no_weights, args, tools_extra, expected):
    with pytest.raises(RecipeError) as err:
        validate(config.load(python_recipe(tmp_path, args, tools_extra)))
    lines = [p.format() for p in err.value.problems]
    assert len(lines) == 1 and expected in lines[0], lines


def test_a_python_tool_without_a_template_trl_parses_is_refused_at_check(tmp_path, capsys, no_weights):
    from grpokit import cli

    path = python_recipe(tmp_path)
    text = path.read_text().replace("chat_template: qwen2_5", "chat_template: null")
    path.write_text(text)
    assert cli.main(["--recipe", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "model" in err and "template" in err and "Traceback" not in err, err


def test_rounds_the_completion_cannot_hold_are_refused_before_weights_load(tmp_path, capsys, no_weights):
    from grpokit import cli

    path = python_recipe(tmp_path, max_completion_length=64, max_tool_calling_iterations=3)
    assert cli.main(["--recipe", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "trainer.max_tool_calling_iterations: 3 rounds of tool calls take at least" in err
    assert "which trainer.max_completion_length (64) cannot hold" in err
    assert "Traceback" not in err


def test_the_tool_schemas_count_in_the_room_a_prompt_leaves_for_the_completion(tmp_path, no_weights):
    # TRL renders every prompt with the tools' schemas: a prompt that fits the model's context without them but not
    # with them would have every tool result dropped (TRL rolls back a result past the context) -- or run past the
    # model's positions. The tiny model has 4096 positions; the Python tool's schema takes ~720 of its tokens, the
    # prompts ~160 with the template: 3300 for the completion fits without the schemas, not with them.
    from grpokit.run.build import prepare

    with pytest.raises(RecipeError) as err:
        prepare(validate(config.load(python_recipe(tmp_path, max_completion_length=3300))))
    text = str(err.value)
    assert "tokens of tool schemas" in text and "4096 positions - max_completion_length 3300 - " in text, text


def test_check_says_the_code_runs_caged_with_its_limits(tmp_path, capsys, no_weights):
    from grpokit import cli

    assert cli.main(["--recipe", str(python_recipe(tmp_path, {"timeout_seconds": 2.5})), "--check"]) == 0, \
        capsys.readouterr().err
    out = capsys.readouterr().out
    assert "PythonTool.python(code: str) -> str (environment method)" in out
    assert "runs as       the model's code, caged" in out and "each call within 2.5 s, 512 MB" in out
    assert "with your permissions" not in out


def test_the_shipped_python_tool_recipes_check_offline(no_weights):
    from tests.helpers import ROOT

    for name in ("smollm2-135m/python_tool.yaml", "qwen2.5-1.5b/python_tool.yaml"):
        recipe = validate(config.load(str(ROOT / "recipes" / name)))
        assert recipe.tools["environment"] == "grpokit.tools.environments:PythonTool"


# ---------------------------------------------------------------------------------------------------------------
# Real GRPOTrainer steps: two calls a rollout, the second on the name the first defined

FIRST = '<tool_call>\n{"name": "python", "arguments": {"code": "x = 6 * 7\\nprint(x)"}}\n</tool_call>'
SECOND = '<tool_call>\n{"name": "python", "arguments": {"code": "print(x + 1)"}}\n</tool_call>'


@pytest.fixture
def two_calls(monkeypatch):
    """The tiny model never writes a call: every turn is scripted (the tokens a model that had learned the format would
    write) -- every other rollout calls FIRST, then SECOND, then answers; the others answer at once. Generation is the
    script, the rest of each step (the tool loop, rewards, loss, backward) is TRL's own."""
    import torch
    from transformers import LlamaForCausalLM

    def generate(self, *args, **kwargs):
        prompt_ids = kwargs.get("input_ids", args[0] if args else None)
        tokenizer = generate.tokenizer
        rows = []
        for i in range(prompt_ids.shape[0]):
            rounds = tokenizer.decode(prompt_ids[i], skip_special_tokens=False).count("<tool_response>")
            if rounds == 0:  # a first turn: this batch holds every rollout
                script = FIRST if i % 2 == 0 else "42"
            else:  # a later turn: TRL passes only the rollouts that called
                script = SECOND if rounds == 1 else "The answer is 43."
            rows.append(tokenizer(script, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        width = max(len(r) for r in rows)
        completion = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows], dtype=prompt_ids.dtype)
        return torch.cat([prompt_ids, completion], dim=1)

    monkeypatch.setattr(LlamaForCausalLM, "generate", generate)
    return generate


@pytest.mark.slow
def test_real_steps_run_two_calls_on_one_interpreter(tmp_path, monkeypatch, two_calls):
    from grpokit.trainer.models import load_tokenizer
    from grpokit.checkpoints.tiny import ensure_tiny_model

    completion_reader(tmp_path, monkeypatch)
    data = recipe_dict(rewards=[{"name": "reader.py:seen", "weight": 0.0}])
    data["model"]["chat_template"] = "qwen2_5"
    data["tools"] = {"environment": "grpokit.tools.environments:PythonTool"}
    data["trainer"].update(max_completion_length=640, max_tool_calling_iterations=2, output_dir=str(tmp_path / "run"),
                           per_device_train_batch_size=4, num_generations=4, max_steps=2)
    recipe = validate(config.load(write_recipe(tmp_path, data)))
    two_calls.tokenizer = load_tokenizer(str(ensure_tiny_model()), recipe)
    training.train(recipe)

    rollouts = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    results = [[m["content"] for m in r if m.get("role") == "tool"] for r in rollouts]
    assert results[::2] == [["42\n", "43\n"]] * (len(rollouts) // 2)  # the second call read the first call's x
    assert all(r == [] for r in results[1::2])
    assert all(r[-1] == {"role": "assistant", "content": "The answer is 43."} for r in rollouts[::2])
    history = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "tools/call_frequency" in h]
    assert steps and all(h["tools/call_frequency"] == 1.0 and h["tools/failure_frequency"] == 0 for h in steps)
