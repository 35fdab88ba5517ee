"""Small builders shared by tests: a valid smoke-like recipe as a dict, written where a test wants it."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SMOKE_DATA = ROOT / "grpokit" / "assets" / "smoke.jsonl"

BASE = {
    "model": {"name_or_path": "builtin:tiny-llama"},
    "lora": {"r": 8, "lora_alpha": 16, "target_modules": "all-linear"},
    "dataset": {"path": str(SMOKE_DATA), "prompt_column": "prompt", "answer_column": "answer"},
    "rewards": [{"name": "char_fraction", "args": {"char": "a"}}],
    "trainer": {
        "max_steps": 2,
        "learning_rate": 1.0e-2,
        "lr_scheduler_type": "constant",
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 16,
        "logging_steps": 1,
        "save_strategy": "no",
        "seed": 0,
        "disable_tqdm": True,
    },
}


def recipe_dict(**sections) -> dict:
    """A valid recipe with whole sections replaced (`trainer=...`) or removed (`lora=None`)."""
    data = copy.deepcopy(BASE)
    for key, value in sections.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def write_recipe(folder: Path, data: dict | str, name: str = "recipe.yaml") -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def with_trainer(folder: Path, **trainer) -> dict:
    """The base recipe with trainer keys changed and output_dir inside `folder`."""
    data = recipe_dict()
    data["trainer"].update(trainer)
    data["trainer"].setdefault("output_dir", str(folder / "run"))
    return data


def fake_run(folder: Path, names=("checkpoint-1", "trainer_state.json", "recipe.yaml", "adapter_model.safetensors"),
             checkpoint_files=("trainer_state.json",), text: str = "{}") -> Path:
    """A folder as a finished grpokit run leaves it: its entries, and the manifest (grpokit.files.ownership) that lists them.

    A `checkpoint-N` name is a folder holding `checkpoint_files`; a trainer_state.json there holds a step, every other
    file `text`.
    """
    from grpokit.files import ownership

    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name.startswith("checkpoint-"):
            (folder / name).mkdir()
            for inner in checkpoint_files:
                (folder / name / inner).write_text('{"global_step": 1}' if inner == "trainer_state.json" else text)
        else:
            (folder / name).write_text(text)
    ownership.claim(folder, names)
    return folder


def overwrite(run: Path) -> None:
    """What `--overwrite` does once the new run's weights are loaded (rundir.guard_output_dir, then remove_previous)."""
    from grpokit.rundir import guard_output_dir, remove_previous

    remove_previous(run, guard_output_dir(run, None, True, "recipe.yaml"), "recipe.yaml")


def age_claims(run: Path, by_ns: int) -> None:
    """Time passes: every claim's start in the run's manifest (and a pending save's) moves `by_ns` into the past."""
    import json

    from grpokit.files import ownership

    path = run / ownership.MANIFEST
    manifest = json.loads(path.read_text())
    for rec in manifest["entries"].values():
        if "since" in rec:
            rec["since"] -= by_ns
    if "pending" in manifest:
        manifest["pending"] -= by_ns
    path.write_text(json.dumps(manifest))


def load_bench(name: str):
    """A script of bench/ as a module (bench/ is not a package), e.g. load_bench("gpu_memory")."""
    import importlib.util
    import sys

    if str(ROOT / "bench") not in sys.path:  # where the benches find one another and `offline`, as when run
        sys.path.append(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def launch(*argv, timeout: int = 600, **kwargs):
    """`python launch.py ARGV` as a user runs it, from the repository root; output captured as text."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "launch.py", *argv], cwd=ROOT, text=True, capture_output=True, timeout=timeout,
                          **kwargs)


# The knobs every hand-built tiny run shares: CPU, float32, no reporting, no checkpoints, seeded, quiet.
TINY_GRPO = dict(max_steps=3, per_device_train_batch_size=8, num_generations=4, max_completion_length=16,
                 learning_rate=1e-2, lr_scheduler_type="constant", logging_steps=1, report_to=[], use_cpu=True,
                 save_strategy="no", bf16=False, seed=0, disable_tqdm=True)


def tiny_trainer(output_dir, reward_funcs, train_dataset, *, trainer_cls=None, model_dir=None, lora=True,
                 trainer_kwargs=None, **config):
    """A real GRPOTrainer (or `trainer_cls`) on the embedded tiny model, for tests that drive TRL directly.

    `config` overrides `TINY_GRPO` as GRPOConfig fields; `trainer_kwargs` go to the trainer's constructor
    (e.g. `sampling=` for the dynamic-sampling subclass); `lora=False` trains the full model.

    >>> trainer = tiny_trainer(tmp_path, [reward], Dataset.from_list(rows), beta=0.04)  # doctest: +SKIP
    """
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from grpokit.tiny import ensure_tiny_model

    model_dir = model_dir or ensure_tiny_model()
    return (trainer_cls or GRPOTrainer)(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32"),
        reward_funcs=reward_funcs,
        args=GRPOConfig(output_dir=str(output_dir), **{**TINY_GRPO, **config}),
        train_dataset=train_dataset,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
        if lora else None,
        **(trainer_kwargs or {}),
    )


_READABLE: Path | None = None


def readable_by_anyone() -> Path:
    """A folder any user can enter holding a copy of the project's `rewards` package (and what of grpokit it imports:
    `grpokit.errors`, the sandbox `grpokit.untrusted`), for a test that starts the
    sandbox as `nobody` (a trainer that is not root): a checkout inside a private folder (/root is 0700 in most
    containers, `mktemp -d` makes 0700 folders) is out of nobody's reach, so nobody imports the copy. Made once per
    test session under /tmp, removed when the session ends."""
    global _READABLE
    if _READABLE is None:
        import atexit
        import os
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="grpokit-readable-", dir="/tmp"))
        shutil.copytree(ROOT / "rewards", folder / "rewards", ignore=shutil.ignore_patterns("__pycache__"))
        (folder / "grpokit").mkdir()
        for name in ("__init__.py", "errors.py"):
            shutil.copyfile(ROOT / "grpokit" / name, folder / "grpokit" / name)
        shutil.copytree(ROOT / "grpokit" / "untrusted", folder / "grpokit" / "untrusted",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for top, dirs, names in os.walk(folder):
            os.chmod(top, 0o755)
            for name in names:
                os.chmod(os.path.join(top, name), 0o644)
        atexit.register(shutil.rmtree, folder, True)
        _READABLE = folder
    return _READABLE


def cage_processes(pool, depth: int | None = None) -> list[int]:
    """The pids (as this machine sees them) of an untrusted-work pool's cage: its bootstrap (depth 1), the zygote (2),
    the workers' keepers (3) and the workers (4) with whatever they started; only those at `depth` if given."""
    found, level = [], [pool._cages[0].proc.pid]
    for d in range(1, 16):
        if depth is None or d == depth:
            found += level
        below = []
        for pid in level:
            try:
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children") as f:
                        below += [int(p) for p in f.read().split()]
            except OSError:  # gone meanwhile
                continue
        if not below:
            break
        level = below
    return found
