"""Shared fixtures. Nothing here, or in any test, reaches a hub: the tiny model is built locally."""

import os

# Before any Hugging Face import: fail fast instead of trying the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Before torch starts its OpenMP pool: idle threads sleep rather than spin, as in grpokit's own runs (grpokit.cpu;
# bench/README.md "CPU speed"). The suite's two workers share two cores, each with a pool of two threads; spinning,
# one worker's idle threads took the cores from the other's working ones (test_train, test_shared_prompt and
# test_generation with -n 2: 90 s spinning, 26 s sleeping, on the 2-core machine). The processes tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The embedded tiny Llama + character tokenizer, built once per machine and cached."""
    from grpokit.checkpoints.tiny import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture
def no_weights(monkeypatch, tiny_model_dir):
    """Any attempt to load weights fails the test (the tiny model is built first, outside the guard)."""
    import transformers

    def refuse(*args, **kwargs):
        pytest.fail("weights were loaded during --check")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))


class _CurrentStderr:
    def write(self, text):
        return sys.stderr.write(text)

    def flush(self):
        sys.stderr.flush()


@pytest.fixture(autouse=True)
def live_library_logs(monkeypatch):
    """Library log lines go to this test's stderr, as they do in a real command.

    datasets, transformers and huggingface_hub bind a StreamHandler to the sys.stderr of their first use:
    under pytest, an earlier test's capture, closed by now. Writing to it prints "--- Logging error ---"
    and a traceback that is pytest's doing, not ours.
    """
    import logging

    for name in ("datasets", "transformers", "huggingface_hub"):
        for handler in logging.getLogger(name).handlers:
            if type(handler) is logging.StreamHandler:
                monkeypatch.setattr(handler, "stream", _CurrentStderr())


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests run only where CUDA is present; CI (CPU) reports them as skipped."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tool():
    """make(**limits): a Python tool (grpokit.tools.environments.PythonTool) started for a rollout, 3 s a call unless
    given; every one made is closed after the test."""
    from grpokit.tools.environments import PythonTool

    made = []

    def make(**limits):
        t = PythonTool(**{"timeout_seconds": 3.0, **limits})
        t.reset()
        made.append(t)
        return t

    yield make
    for t in made:
        t._close()


# The whole suite's time, said where a newcomer meets it: what it takes on an idle machine (measured by
# bench/suite_time.py, never a figure typed in) and how busy this machine is now, so a slow run can be told from a
# busy machine. Said only when the whole suite runs (no file or test named), and by the controlling process alone.
def _whole_suite(config) -> bool:
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS and not hasattr(config, "workerinput")


SUITE_TIME = "bench/results/suite_time.json"
# What the start line quotes from it, each checked before it is said (the file is data: a hand edit or a cut write
# must not stop the suite before its first test): key -> (types, lowest, highest).
_QUOTED = {"wall_s": ((int, float), 0, 86_400), "cores": ((int,), 1, 100_000), "idle": ((bool,), None, None),
           "others_cpu_share": ((int, float), 0, 1), "date": ((str,), None, None)}


def _unquotable(result: dict) -> str | None:
    """Why `result` cannot be quoted (the first key missing, of the wrong type or out of range), None when it can."""
    import math

    for key, (types, low, high) in _QUOTED.items():
        value = result.get(key)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"{key} is {type(value).__name__ if key in result else 'missing'}, not {types[0].__name__}"
        if low is not None and not (math.isfinite(value) and low <= value <= high):
            return f"{key} is {value!r}, outside {low}-{high}"
        if isinstance(value, str) and not (len(value) <= 40 and value.isprintable()):
            return f"{key} is not a short printable line"
    return None


def measured(path=None) -> str:
    """The idle machine's suite time as the start line says it, or why bench/results/suite_time.json cannot say it
    (missing, damaged, or a value of the wrong type or range); never raises for what the file holds."""
    from pathlib import Path

    from grpokit.files import try_json

    path = Path(__file__).resolve().parents[1] / SUITE_TIME if path is None else Path(path)
    result, why = try_json(path)
    why = why or _unquotable(result)
    if why:
        return f"not known ({SUITE_TIME} cannot be quoted: {why})"
    minutes, seconds = divmod(round(result["wall_s"]), 60)
    idle = "idle" if result["idle"] else f"busy ({result['others_cpu_share']:.0%} of the CPU taken by other work)"
    return f"{minutes} min {seconds} s on {result['cores']} {idle} cores ({result['date']}, {SUITE_TIME})"


def pytest_sessionstart(session):
    if not _whole_suite(session.config):
        return
    import time

    session.config.stash[_STARTED] = time.monotonic()
    load, cores = os.getloadavg()[0], os.cpu_count()
    free = (cores or 1) - load  # the suite keeps two workers busy (-n 2): fewer free cores than that slows it
    busy = "fewer than 2 cores free: expect it slower" if free < 2 else "2 cores free or more"
    session.config.pluginmanager.get_plugin("terminalreporter").write_line(
        f"The whole suite: {measured()}; this machine now: {cores} cores, load average {load:.1f} ({busy}).")


def pytest_terminal_summary(terminalreporter, config):
    if not _whole_suite(config) or _STARTED not in config.stash:
        return
    import time

    minutes, seconds = divmod(round(time.monotonic() - config.stash[_STARTED]), 60)
    terminalreporter.write_line(f"This run took {minutes} min {seconds} s, the load average now "
                                f"{os.getloadavg()[0]:.1f}; the whole suite: {measured()}.")


_STARTED = pytest.StashKey[float]()
