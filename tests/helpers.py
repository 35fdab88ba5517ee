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
    from grpokit.checkpoints.rundir import guard_output_dir, remove_previous

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


def docs_block(name: str) -> list[str]:
    """The lines of the code block docs/troubleshooting.md marks `<!-- printed: NAME ... -->`: what a test compares with
    what the program printed, so the page shows the program's own words."""
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    block = text.split(f"<!-- printed: {name} ", 1)[1].split("```", 2)[1]
    return [line.strip() for line in block.strip().splitlines()]


def normal(line: str, shown: dict) -> str:
    """A printed line with this run's paths and names as the docs' example shows them (`shown`: real -> example)."""
    for real, example in shown.items():
        line = line.replace(real, example)
    return line.strip()


def numberless(line: str) -> str:
    """A line with its measured numbers (steps, seconds, rates, losses) as N: the docs' example is of a longer run."""
    import re

    return re.sub(r"\d+(\.\d+)?", "N", line)


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

    from grpokit.checkpoints.tiny import ensure_tiny_model

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


# ---------------------------------------------------------------------------------------------------------------
# Today's families, tiny: each its transformers config class at tiny widths keeping its layer kinds, its real TRL
# chat template, and the tiny character tokenizer with that template's markers as tokens of their own (as the real
# tokenizers have them). Random weights; built offline in well under a second each.

# family: (transformers config class, config values, TRL template, the template's marker tokens, end of turn, bos)
_CHATML = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
           "</tool_response>", "<tools>", "</tools>"]
_TINY_WIDTHS = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=4096, initializer_range=0.2)
FAMILIES = {
    "qwen3": ("Qwen3Config", dict(num_hidden_layers=2), "qwen3", _CHATML, ["<|im_end|>"], None),
    # Gated DeltaNet (linear attention) beside full attention, as Qwen3.5 interleaves them
    "qwen3_5": ("Qwen3_5TextConfig", dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                                          linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                          linear_value_head_dim=16, linear_conv_kernel_dim=4),
                "qwen3_5_think", _CHATML, ["<|im_end|>"], None),
    # sliding-window and full layers, per-layer input embeddings, and a last layer sharing an earlier one's keys and
    # values (num_kv_shared_layers: the last layer reads the full layer's before it); a window of 16 tokens, shorter
    # than any prompt here
    "gemma4": ("Gemma4TextConfig", dict(num_hidden_layers=3, layer_types=["sliding_attention", "full_attention",
                                                                          "full_attention"],
                                        num_kv_shared_layers=1, sliding_window=16, hidden_size_per_layer_input=8,
                                        global_head_dim=16),
               "gemma4", ["<bos>", "<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|tool_response>",
                          "<tool_response|>", "<|tool>", "<tool|>", "<|channel>", "<channel|>", "<|think|>"],
               ["<turn|>", "<|tool_response>"], "<bos>"),
    # a layer without rotary positions (no_rope_layers: 0) beside one with them
    "smollm3": ("SmolLM3Config", dict(num_hidden_layers=2, no_rope_layers=[1, 0]), "qwen3", _CHATML, ["<|im_end|>"],
                None),
    "qwen2_5": ("Qwen2Config", dict(num_hidden_layers=2), "qwen2_5", _CHATML, ["<|im_end|>"], None),
    "llama3_2": ("LlamaConfig", dict(num_hidden_layers=2, tie_word_embeddings=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=1024)),
                 "llama3_2", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                              "<|eom_id|>", "<|python_tag|>"], ["<|eot_id|>"], "<|begin_of_text|>"),
}


# The families people train now (each its tool steps in tests/planning/test_families.py); FAMILIES also holds Qwen2.5, whose
# instance proves grpokit's passes on model_type qwen2 (tests/trainer/test_ownpasses.py) -- saved, its folder loads with
# transformers' byte-level Qwen2 tokenizer, which reads the character vocabulary wrongly, so no text goes through it.
TODAY = ("qwen3", "qwen3_5", "gemma4", "smollm3", "llama3_2")


def family_tokenizer(family: str):
    """The tiny character tokenizer with `family`'s TRL template and its markers as single tokens."""
    from grpokit.tools import tooluse
    from grpokit.checkpoints.tiny import build_tokenizer

    _, _, template, markers, ends, bos = FAMILIES[family]
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": markers}, replace_extra_special_tokens=False)
    tokenizer.eos_token = ends[0]
    tokenizer.bos_token = bos
    tokenizer.chat_template = tooluse.template_text(template)
    return tokenizer


def family_model(family: str, tokenizer):
    """A tiny random instance of `family` (fixed seed), its vocabulary the tokenizer's."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    config_class, values, _, _, ends, _ = FAMILIES[family]
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                                 eos_token_id=tokenizer.convert_tokens_to_ids(ends),
                                                 bos_token_id=tokenizer.bos_token_id, **{**_TINY_WIDTHS, **values})
    if family == "gemma4":
        config.vocab_size_per_layer_input = len(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    return model


def family_dir(family: str, root: Path) -> Path:
    """`family`'s tiny instance saved as a model folder under `root` (once): what a recipe's model.name_or_path names."""
    target = root / family
    if not (target / "config.json").exists():
        tokenizer = family_tokenizer(family)
        family_model(family, tokenizer).save_pretrained(target)
        tokenizer.save_pretrained(target)
    return target


def family_trainer(family: str, root: Path, **config):
    """grpokit's trainer (its own passes where they fit: grpokit.trainer.generation, grpokit.trainer.shared_prompt) on `family`'s tiny
    instance with LoRA, as tiny_trainer builds it; `config` as GRPOConfig fields."""
    from datasets import Dataset

    from grpokit.trainer.generation import PrefixReuseGRPOTrainer

    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 6 * 7?"}]}] * 8)
    return tiny_trainer(root / "run", [lambda completions, **kw: [0.0] * len(completions)], rows,
                        trainer_cls=PrefixReuseGRPOTrainer, model_dir=family_dir(family, root), **config)


COMPLETION_READER = '''
import json, os

def seen(completions, **kwargs):
    with open(os.environ["SEEN_COMPLETIONS"], "a") as f:
        for c in completions:
            f.write(json.dumps(c) + "\\n")
    return [0.0 for _ in completions]
'''


def completion_reader(folder: Path, monkeypatch) -> Path:
    """`folder/reader.py:seen`, a reward of weight 0 that appends every completion it is given to the file returned
    (one JSON line each): what a run's rollouts were, read back by the test."""
    (folder / "reader.py").write_text(COMPLETION_READER)
    monkeypatch.setenv("SEEN_COMPLETIONS", str(folder / "seen.jsonl"))
    return folder / "seen.jsonl"
