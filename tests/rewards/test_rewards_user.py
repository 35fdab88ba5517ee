"""User rewards named in a recipe: what may be named, and that nothing else is ever called.

A recipe is data. `module:callable` and `file.py:callable` may name only a plain Python function defined
in that module (or in a submodule of that package), or a class marked with `@rewards.reward_class`;
everything else is refused before anything is called. Each hostile case would touch a marker file if it
ran; the test checks the refusal message and that the marker was never written.
"""

from __future__ import annotations

import pytest
from helpers import recipe_dict, write_recipe

import rewards
from grpokit.cli import main


def _marker_cases(marker: str) -> list[tuple[str, dict, str]]:
    shell = f"touch {marker}"
    # (name, args that would write the marker if called, fragment of the refusal)
    return [
        ("subprocess:Popen", {"args": shell, "shell": True}, "standard library"),  # the issue's exploit
        ("os:system", {"command": shell}, "standard library"),
        ("builtins:eval", {"source": f"open({marker!r}, 'w')"}, "standard library"),
        ("builtins:exec", {}, "standard library"),
        ("shutil:rmtree", {"path": marker}, "standard library"),  # pure Python, still stdlib
        ("pathlib:Path", {"args": marker}, "standard library"),
        ("antigravity:geohash", {}, "standard library"),  # importing it alone opens a browser: never imported
        ("posix:system", {"command": shell}, "standard library"),  # a built-in (C) module
    ]


@pytest.mark.parametrize("index", range(8))
def test_stdlib_and_builtins_are_refused_and_never_called(index, tmp_path):
    marker = tmp_path / "pwned"
    name, args, fragment = _marker_cases(str(marker))[index]
    with pytest.raises(rewards.RewardError, match=fragment) as err:
        rewards.build(name, **args)
    assert name in str(err.value)
    assert not marker.exists(), f"{name} ran"


HOSTILE_FILE = '''
import os, subprocess, functools
from subprocess import Popen                          # imported: defined elsewhere
from shutil import rmtree                             # a stdlib function imported into the file
system = os.system                                    # a C function under a local name
touch = functools.partial(os.system, "touch {marker}")  # a callable object, not a function


class Builder:                                        # a class defined here but not marked as a reward
    def __init__(self, path="{marker}"):
        open(path, "w").close()

    def __call__(self, completions, **kwargs):
        return [0.0] * len(completions)


def ok(completions, **kwargs):
    return [1.0] * len(completions)
'''


@pytest.mark.parametrize("attr, args, fragment", [
    ("Popen", {"args": "touch x", "shell": True}, "defined in subprocess"),  # imported from elsewhere
    ("rmtree", {}, "defined in shutil"),  # imported from the stdlib
    ("system", {}, "built-in"),  # C function
    ("touch", {}, "not a function or class"),  # partial object
    ("Builder", {}, "not marked"),  # a class defined here, unmarked: its __init__ never runs
])
def test_user_file_may_name_only_its_own_functions_and_marked_classes(attr, args, fragment, tmp_path):
    marker = tmp_path / "pwned"
    src = tmp_path / "hostile.py"
    src.write_text(HOSTILE_FILE.format(marker=marker))
    with pytest.raises(rewards.RewardError, match=fragment):
        rewards.build(f"{src}:{attr}", **args)
    assert not marker.exists()
    assert rewards.build(f"{src}:ok")(completions=["a"]) == [1.0]  # the file's own function is fine


MARKED_FILE = '''
from rewards import reward_class, text


@reward_class
class Contains:
    def __init__(self, word="a"):
        self.word = word

    def __call__(self, completions, **kwargs):
        return [float(self.word in text(c)) for c in completions]
'''


def test_a_marked_class_in_a_user_file_takes_recipe_args(tmp_path):
    src = tmp_path / "mine.py"
    src.write_text(MARKED_FILE)
    reward = rewards.build(f"{src}:Contains", word="b")
    assert reward(completions=["abc", "xyz"]) == [1.0, 0.0]


def test_a_package_may_re_export_a_function_from_its_submodule():
    # `rewards.toy:CharFraction` is registered (so marked); a function re-exported by a package counts
    # as the package's own (TRL's `trl.rewards:accuracy_reward` is defined in trl.rewards.accuracy_rewards).
    assert rewards.build("rewards.toy:CharFraction", char="b")(completions=["bb"]) == [1.0]
    assert rewards.resolve("trl.rewards:accuracy_reward").name == "accuracy_reward"


def test_a_function_must_name_completions(tmp_path):
    # **kwargs alone would let any library function that takes keywords (torch.load, setuptools.setup)
    # be named as a reward and called with TRL's arguments.
    src = tmp_path / "kw.py"
    src.write_text("def only_kwargs(**kwargs):\n    return []\n")
    with pytest.raises(rewards.RewardError, match="completions"):
        rewards.build(f"{src}:only_kwargs")


def test_a_stdlib_file_given_by_path_is_refused_unread(tmp_path):
    import sysconfig
    from pathlib import Path

    path = Path(sysconfig.get_paths()["stdlib"]) / "antigravity.py"  # executing it opens a web browser
    with pytest.raises(rewards.RewardError, match="standard library"):
        rewards.build(f"{path}:geohash")


def test_check_refuses_the_issue_exploit_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "pwned"
    data = recipe_dict()
    data["rewards"] = [{"name": "subprocess:Popen", "args": {"args": f"touch {marker}", "shell": True}}]
    path = write_recipe(tmp_path, data)
    assert main(["--recipe", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "subprocess:Popen" in err and "standard library" in err and "Traceback" not in err
    assert not marker.exists()


@pytest.mark.parametrize("weight", [".inf", "-.inf", ".nan"])
def test_reward_weight_must_be_finite(weight, tmp_path, capsys):
    # A weight of .inf would make every advantage NaN or the loss 0: refused.
    data = recipe_dict()
    data["rewards"] = [{"name": "char_fraction", "weight": 1.0}]
    text = write_recipe(tmp_path, data).read_text().replace("weight: 1.0", f"weight: {weight}")
    path = write_recipe(tmp_path, text)
    assert main(["--recipe", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "rewards[0].weight" in err and "finite" in err and "Traceback" not in err


PLANTED = "open({marker!r}, 'w').close()\n\ndef f(completions, **kwargs):\n    return [0.0] * len(completions)\n"


def test_a_main_module_is_never_imported(tmp_path, monkeypatch, capsys):
    """A `__main__` module is a program: importing it ran it (it printed, parsed launch.py's argv, exited with its usage)."""
    marker = tmp_path / "ran"
    package = tmp_path / "grpokit_planted_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    data = recipe_dict()
    data["rewards"] = [{"name": "grpokit_planted_pkg.__main__:f"}]
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "'grpokit_planted_pkg.__main__' is a `__main__` module, a program's entry point" in err and "Traceback" not in err
    assert not marker.exists(), "the __main__ module ran"


@pytest.mark.parametrize("name", ["PIL.__main__:x", "pygments.__main__:x", "torch.utils.model_dump.__main__:x"])
def test_an_installed_packages_main_is_refused_unimported(name, capsys):
    import sys

    with pytest.raises(rewards.RewardError, match="is a `__main__` module"):
        rewards.build(name)
    assert name.partition(":")[0] not in sys.modules
    assert capsys.readouterr().out == ""


def _planted_file(tmp_path, where: str) -> tuple[str, object]:
    """A reward file that writes a marker when executed, at `where` under tmp_path; (its name as a recipe gives it, marker)."""
    marker = tmp_path / "ran"
    path = tmp_path / where
    path.parent.mkdir(parents=True)
    path.write_text(PLANTED.format(marker=str(marker)))
    (tmp_path / "elsewhere").mkdir()
    return f"{tmp_path}/elsewhere/../{where}:f", marker  # named through `..`: the resolved path is what is judged


@pytest.mark.parametrize("where, fragment", [
    ("lib/python3.99/planted.py", "it lies in a Python installation's library"),  # another Python's standard library
    ("lib64/python3.12t/planted.py", "it lies in a Python installation's library"),
    ("venv/lib/python3.11/site-packages/planted.py", "it lies in a Python installation's library"),
    ("pkgs/dist-packages/planted.py", "it lies in a dist-packages folder"),
])
def test_a_file_of_any_python_installation_is_refused_unexecuted(where, fragment, tmp_path):
    name, marker = _planted_file(tmp_path, where)
    with pytest.raises(rewards.RewardError, match="is not a file of your own") as err:
        rewards.build(name)
    assert fragment in str(err.value)
    assert not marker.exists(), "the file was executed"


def test_another_pythons_stdlib_file_is_refused_unexecuted(capsys):
    """/usr/lib/python3.X/this.py prints the Zen of Python when executed; this process's own stdlib check missed it."""
    import glob
    import os

    found = sorted(glob.glob("/usr/lib/python3*/this.py"))
    if not found:
        pytest.skip("no system Python with this.py here")
    relative = os.path.relpath(found[0], os.getcwd())  # through ../.. from the working folder
    for name in (f"{found[0]}:x", f"{relative}:x"):
        with pytest.raises(rewards.RewardError, match="is not a file of your own"):
            rewards.build(name)
    assert "Zen of Python" not in capsys.readouterr().out


def test_a_reward_file_must_be_python_source(tmp_path, capsys):
    """`./notpy.txt:f` ended in an AttributeError traceback (no loader for a .txt file)."""
    (tmp_path / "notpy.txt").write_text("def f(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    data = recipe_dict()
    data["rewards"] = [{"name": "./notpy.txt:f"}]
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "rewards[0].name: user reward" in err and "notpy.txt' is not a .py file; a reward file is Python source" in err
    assert "Traceback" not in err


PLAIN_WITH_KEYWORDS = '''
from rewards import text


def short_and_a(completions, max_chars: int = 8, prompts=None, **kwargs):
    return [float(len(text(c)) <= max_chars and "a" in text(c)) for c in completions]
'''


def test_a_plain_functions_keyword_arguments_are_set_by_args(tmp_path):
    import pickle

    src = tmp_path / "mine.py"
    src.write_text(PLAIN_WITH_KEYWORDS)
    done = ["a" * 10, "a" * 9, "b" * 5]
    assert rewards.build(f"{src}:short_and_a")(completions=done) == [0.0, 0.0, 0.0]  # its default, 8
    bound = rewards.build(f"{src}:short_and_a", max_chars=10)
    assert bound(completions=done) == [1.0, 1.0, 0.0]
    assert bound.__name__ == "short_and_a"  # logged as rewards/short_and_a/mean, args or not
    assert pickle.loads(pickle.dumps(bound))(completions=done) == [1.0, 1.0, 0.0]  # DDP and dataloader workers pickle it
    with pytest.raises(rewards.RewardError) as err:  # an unknown name: the ones it has, and the nearest
        rewards.bind(f"{src}:short_and_a", {"max_char": 10})
    assert str(err.value) == (f"reward '{src}:short_and_a' has no argument 'max_char'; arguments: max_chars "
                              "(the function's keyword arguments with a default); did you mean 'max_chars'?")


def test_a_plain_function_without_keyword_arguments_says_what_to_write_instead(tmp_path):
    src = tmp_path / "mine.py"
    src.write_text("def plain(completions, answer, **kwargs):\n    return [1.0 for _ in completions]\n")
    with pytest.raises(rewards.RewardError) as err:  # `answer` has no default: a dataset column TRL passes, not an arg
        rewards.bind(f"{src}:plain", {"answer": "x"})
    assert ("has no argument 'answer'; arguments: none (`args` sets a function's keyword arguments that have a default, "
            "e.g. `def plain(completions, max_chars: int = 8, **kwargs)`; the others come from TRL's call and the "
            "dataset's columns)") in str(err.value)
