"""A user's own reward named in a recipe, and the rule that keeps a recipe from running anything else.

A recipe is data: the only code it may reach is the user's reward, named as `path/to/file.py:name` or
`package.module:name`. Before anything is called (a class's constructor runs at `--check` with the
recipe's `args`), the target must be

* a plain Python function (`def` or `lambda`) defined in the module named, or in a submodule of that
  package (so `trl.rewards:accuracy_reward`, defined in `trl.rewards.accuracy_rewards`, counts); or
* a class defined there and marked as a reward with `@reward_class` (or registered with `@register`).

Refused, with a message saying why: anything from Python's standard library (never even imported:
importing `antigravity` alone opens a browser), built-in (C) functions, objects imported into the module
from elsewhere, callable objects (`functools.partial`, instances), and unmarked classes. Without this,
`{name: "subprocess:Popen", args: {args: "...", shell: true}}` ran a shell command at `--check`.

Importing a module or executing a reward file still runs its top-level code: that is the user's own
code, which is what naming it means. So a `__main__` module (a program: importing `pygments.__main__`
parses launch.py's argv and exits) is never imported, and a reward file must be a `.py` file that is not
part of any Python installation (this one's prefixes and site-packages, or any `lib/pythonX.Y`,
`site-packages` or `dist-packages` folder), checked on the path with `..` and links resolved.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
import sysconfig
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from grpokit import MOVED
from grpokit.errors import nearest
from rewards._machinery.errors import RewardNameError

_MISSING = object()
MARK = "__grpokit_reward__"  # set in a class's own __dict__ by @reward_class / @register


@dataclass(frozen=True)
class Kind:
    """What a recipe names user code as, and what it may be: the words its messages use, and the targets allowed."""

    label: str  # "user reward": how a message names it
    own: str  # what a recipe may name, in a message's words
    attr: str  # the name's last part in the forms a message shows: 'path/to/file.py:<attr>'
    functions: bool = True
    classes: bool = True
    marked_classes: bool = True  # a class must carry @reward_class: its constructor runs at --check with the recipe's args


REWARD = Kind("user reward", "a function `def f(completions, **kwargs)` or a class marked @reward_class, defined in that "
              "file or module", "function")


def reward_class(cls):
    """Mark a callable class as a reward a recipe may build with its `args` (its `__init__` runs at `--check`).

    >>> @reward_class
    ... class Contains:
    ...     def __init__(self, word: str = "yes"):
    ...         self.word = word
    ...     def __call__(self, completions, **kwargs):
    ...         return [float(self.word in c) for c in completions]
    >>> Contains("no")(completions=["no way", "yes"])
    [1.0, 0.0]
    """
    setattr(cls, MARK, True)
    return cls


def is_marked(target) -> bool:
    return inspect.isclass(target) and target.__dict__.get(MARK) is True


def is_user_reward(name: str) -> bool:
    return ":" in name


def user_reward_file(name: str) -> tuple[str, str] | None:
    """(file, function) when `name` is a user reward given by file path (`dir/my.py:fn`), else None.

    >>> user_reward_file("my_rewards.py:score"), user_reward_file("pkg.mod:score")
    (('my_rewards.py', 'score'), None)
    """
    where, _, attr = name.rpartition(":")
    if where.endswith(".py") or "/" in where or "\\" in where:
        return where, attr
    return None


# ----------------------------------------------------------------------------------------------------
# The standard library, recognised before anything is imported or executed

_STDLIB_NAMES = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)


def _stdlib_dirs() -> tuple[list[Path], list[Path]]:
    paths = sysconfig.get_paths()
    stdlib = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib") if paths.get(k)}
    site = {Path(paths[k]).resolve() for k in ("purelib", "platlib") if paths.get(k)}
    return sorted(stdlib), sorted(site)


def _in_stdlib(path: Path) -> bool:
    stdlib, site = _stdlib_dirs()
    # A Python installed without a virtual environment keeps site-packages inside the stdlib folder.
    return any(path.is_relative_to(d) for d in stdlib) and not any(path.is_relative_to(d) for d in site)


_PYTHON_LIB = re.compile(r"^python\d+(\.\d+)?[a-z]*$", re.IGNORECASE)  # lib/python3.11, lib/python3.13t


def _installation_dirs() -> list[Path]:
    """The folders of this Python (its prefixes, stdlib and site-packages), resolved."""
    import site

    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sysconfig.get_paths().values()}
    dirs.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    dirs.add(site.getusersitepackages())
    return [Path(d).resolve() for d in dirs if d]


def installation_part(path: Path) -> str | None:
    """Why a resolved file belongs to a Python installation (this one or any other), or None when it does not.

    A reward file is the user's own code; a file of an installation (`/usr/lib/python3.11/this.py`, a package's
    module) runs someone else's top-level code, which a recipe may not reach.
    """
    for folder in _installation_dirs():
        if path.is_relative_to(folder):
            return f"it lies in this Python's installation ({folder})"
    parts = path.parts
    for i, part in enumerate(parts):
        if part.lower() in ("site-packages", "dist-packages"):
            return f"it lies in a {part} folder ({Path(*parts[: i + 1])})"
        if i and parts[i - 1].lower() in ("lib", "lib64") and _PYTHON_LIB.match(part):
            return f"it lies in a Python installation's library ({Path(*parts[: i + 1])})"
    return None


def _refuse_stdlib(name: str, what: str, kind: "Kind") -> RewardNameError:
    return RewardNameError(
        f"{kind.label} {name!r}: {what} is part of Python's standard library, which a recipe may not call "
        f"(a recipe is data); name {kind.own}: 'path/to/file.py:{kind.attr}' or 'package.module:{kind.attr}'"
    )


# ----------------------------------------------------------------------------------------------------
# Loading


_user_files: dict[Path, tuple[tuple[int, int], object]] = {}


def _load_user_file(name: str, path: Path, kind: "Kind"):
    """Execute a user's reward file once per version of it (validation, --check and training all ask)."""
    resolved = path.resolve()
    if _in_stdlib(resolved):
        raise _refuse_stdlib(name, str(path), kind)
    if resolved.suffix != ".py":
        raise RewardNameError(f"{kind.label} {name!r}: {str(path)!r} is not a .py file; a reward file is Python source "
                          "named path/to/file.py")
    part = installation_part(resolved)
    if part:
        raise RewardNameError(f"{kind.label} {name!r}: {str(path)!r} is not a file of your own: {part}; a recipe may run "
                          "only a reward file you wrote ('path/to/file.py:function') or a function of an installed "
                          "package ('package.module:function')")
    stat = resolved.stat()
    version = (stat.st_mtime_ns, stat.st_size)
    cached = _user_files.get(resolved)
    if cached and cached[0] == version:
        return cached[1]
    mod_name = f"grpokit_user_reward_{abs(hash(str(resolved)))}"
    spec = importlib.util.spec_from_file_location(mod_name, resolved)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as err:
        raise RewardNameError(f"{kind.label} {name!r}: syntax error in {path} line {err.lineno}: {err.msg}") from None
    except ModuleNotFoundError as err:
        raise RewardNameError(f"{kind.label} {name!r}: importing {path} failed: {_missing(err)}") from None
    except Exception as err:  # noqa: BLE001 - any import-time failure is the user's file, say so
        raise RewardNameError(f"{kind.label} {name!r}: importing {path} failed: {type(err).__name__}: {err}") from None
    except SystemExit as err:  # sys.exit(0) would end --check with 0: a passing check of a file never loaded
        raise _exited(name, str(path), err, kind) from None
    # Registered so that instances of classes defined in the file pickle by reference.
    sys.modules[mod_name] = module
    _user_files[resolved] = (version, module)
    return module


def _import_module(name: str, where: str, kind: "Kind"):
    if where.partition(".")[0] in _STDLIB_NAMES:
        raise _refuse_stdlib(name, f"module {where!r}", kind)
    if "__main__" in where.split("."):  # a program's entry point: importing it runs the program (argv, usage, exit)
        raise RewardNameError(f"{kind.label} {name!r}: {where!r} is a `__main__` module, a program's entry point that runs "
                          "when imported, never a reward module; name the module that defines the function")
    try:
        return importlib.import_module(where)
    except SystemExit as err:
        raise _exited(name, where, err, kind) from None
    except ModuleNotFoundError as err:
        if moved := MOVED.get(where):  # a recipe written for grpokit's old layout is told the new name
            _, _, attr = name.rpartition(":")
            raise RewardNameError(f"{kind.label} {name!r}: module {where!r} has moved to {moved!r}; write "
                                  f"'{moved}:{attr}'") from None
        if err.name != where and err.name in MOVED:  # the module named is there; what it imports moved
            raise RewardNameError(f"{kind.label} {name!r}: importing {where!r} failed: {_missing(err)}") from None
        raise RewardNameError(f"{kind.label} {name!r}: module {where!r} not found ({err})") from None
    except SyntaxError as err:
        raise RewardNameError(f"{kind.label} {name!r}: syntax error in {err.filename} line {err.lineno}: {err.msg}") from None
    except Exception as err:  # noqa: BLE001
        raise RewardNameError(f"{kind.label} {name!r}: importing {where!r} failed: {type(err).__name__}: {err}") from None


def _missing(err: ModuleNotFoundError) -> str:
    """What a user's file lacks: a module grpokit moved into a package (`grpokit.MOVED`) is named with its new place."""
    if moved := MOVED.get(err.name):
        return f"it imports {err.name!r}, which has moved to {moved!r}: import it from there"
    return f"{type(err).__name__}: {err}"


def _exited(name: str, where: str, err: SystemExit, kind: "Kind") -> RewardNameError:
    code = "" if err.code is None else repr(err.code)
    return RewardNameError(f"{kind.label} {name!r}: importing {where} exited (sys.exit({code})) at its top level; a file "
                           "a recipe names must define what it names, not run a program: put the program under "
                           "`if __name__ == \"__main__\":`")


def _python_files(folder: Path, limit: int = 1000) -> list[str]:
    """The names of the `.py` files in `folder` (the first `limit`), for the nearest to a misspelt one; [] unreadable."""
    import itertools

    try:
        return [p.name for p in itertools.islice(folder.iterdir(), limit) if p.suffix == ".py"]
    except OSError:
        return []


def _not_a_file(path: Path) -> str:
    """Why `path` cannot be read as a source file, in words: a folder, a FIFO (opening it would wait for a writer), ..."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        return "does not exist"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    kinds = {stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISSOCK: "a socket", stat.S_ISCHR: "a character device",
             stat.S_ISBLK: "a block device"}
    what = next((w for test, w in kinds.items() if test(mode)), None)
    return f"is {what}, not a regular file" if what else "is not a regular file"


def load_user_target(name: str, kind: Kind = REWARD) -> Callable:
    """The function or class `name` points to, after checking it is one a recipe may name as `kind` (a reward,
    unless told: a tool function, an environment class)."""
    where, _, attr = name.rpartition(":")
    if not where or not attr:
        raise RewardNameError(f"{kind.label} {name!r} must be 'path/to/file.py:function' or 'package.module:function'")
    if user_reward_file(name):
        path = Path(where).expanduser()
        if not path.is_file():
            why = _not_a_file(path)
            beside = nearest(path.name, _python_files(path.parent)) if why == "does not exist" else None
            raise RewardNameError(f"{kind.label} {name!r}: file {str(path)!r} {why}"
                                  + (f"; did you mean {beside!r} (beside it)?" if beside else ""))
        module = _load_user_file(name, path, kind)
    else:
        module = _import_module(name, where, kind)
    try:  # a lazy package (trl, transformers) imports the submodule here: its own code, like the import
        target = getattr(module, attr, _MISSING)
    except Exception as err:  # noqa: BLE001
        raise RewardNameError(f"{kind.label} {name!r}: reading {attr!r} from {where} failed: {type(err).__name__}: {err}") from None
    if target is _MISSING:
        public = [n for n, v in vars(module).items() if not n.startswith("_") and callable(v)]
        hint = nearest(attr, public)
        raise RewardNameError(
            f"{kind.label} {name!r}: {where} has no {attr!r}" + (f"; did you mean {hint!r}?" if hint else "")
        )
    _check_allowed(name, where, module.__name__, attr, target, kind)
    return target


def _check_allowed(name: str, where: str, module_name: str, attr: str, target, kind: "Kind") -> None:
    """Refuse any target but what `kind` allows (a function, or a class: marked, for a reward), defined in the
    module named; calls nothing."""
    if inspect.isbuiltin(target) or isinstance(target, (types.MethodDescriptorType, types.WrapperDescriptorType,
                                                        types.BuiltinFunctionType)):
        raise RewardNameError(f"{kind.label} {name!r}: {attr!r} is a built-in (C) function, not a Python function of {where}; "
                          f"a recipe may name only {kind.own}")
    wanted = (inspect.isfunction(target) and kind.functions) or (inspect.isclass(target) and kind.classes)
    if not wanted:
        what = ("a class" if inspect.isclass(target) else "a function" if inspect.isfunction(target)
                else f"a {type(target).__name__}, not a function or class")
        raise RewardNameError(f"{kind.label} {name!r}: {attr!r} is {what}; a recipe may name only {kind.own}")
    defined_in = getattr(target, "__module__", None) or "?"
    if defined_in != module_name and not defined_in.startswith(module_name + "."):
        raise RewardNameError(f"{kind.label} {name!r}: {attr!r} is defined in {defined_in}, not in {where} (it was imported there); "
                          f"a recipe may name only {kind.own}")
    if defined_in.partition(".")[0] in _STDLIB_NAMES:
        raise _refuse_stdlib(name, f"{attr!r} (defined in {defined_in})", kind)
    if inspect.isclass(target) and kind.marked_classes and not is_marked(target):
        raise RewardNameError(
            f"{kind.label} {name!r}: class {attr!r} is not marked as a reward, and building it would run its constructor "
            "with the recipe's args; if it is your reward class, decorate it: "
            "`from rewards import reward_class` then `@reward_class` above `class " + attr + "`"
        )
