"""What the pages say about the program, held to what the program says: the CPU path's dtype, the templates the tool
recipes use, and the model a proof of grpokit's own passes was made on."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import yaml
from helpers import ROOT

from grpokit import cpu
from grpokit.trainer import ownpasses

RECIPES = ROOT / "recipes"


def test_recipes_readme_gives_the_cpu_paths_dtype_as_check_resolves_it(monkeypatch):
    """recipes/README.md's CPU path names each dtype `cpu_dtype` gives (`--check` prints the one this machine takes)
    and the instructions that decide between them."""
    text = " ".join((RECIPES / "README.md").read_text().split())
    said = text[text.index("CPU path a run there would take"):][:400]
    for computes_bf16 in (True, False):
        monkeypatch.setattr(cpu, "cpu_computes_bf16", lambda: computes_bf16)
        assert cpu.cpu_dtype({"quantization": "none"}, lora=True) in said
    assert cpu.cpu_dtype({"quantization": "none"}, lora=False) in said
    assert "AVX512-BF16" in said and "AMX" in said and "LoRA" in said


# docs/tools.md's row for each family -> the folder of that family's shipped recipes
FAMILY_ROWS = {"| Qwen3 |": "qwen3-1.7b", "| Qwen3.5": "qwen3.5-0.8b", "| Gemma 4": "gemma4-e2b",
               "| Llama 3.2": "llama3.2-3b"}


@pytest.mark.parametrize("row,folder", FAMILY_ROWS.items())
def test_docs_tools_names_the_template_each_shipped_recipe_uses(row, folder):
    table = (ROOT / "docs" / "tools.md").read_text().splitlines()
    line = next(line for line in table if line.startswith(row))
    named = {(yaml.safe_load(p.read_text()).get("model") or {}).get("chat_template") for p in (RECIPES / folder).glob("*.yaml")}
    for template in named - {None}:
        assert f"`{template}`" in line.split("|")[2], f"{folder} uses {template}; docs/tools.md's row: {line}"


@pytest.mark.parametrize("model,architecture", [("builtin:smollm2-135m-instruct", "llama"),
                                                ("Qwen/Qwen2.5-1.5B-Instruct", "qwen2")])
def test_own_passes_row_names_the_architecture_the_proof_ran_on(model, architecture):
    """--check's `own passes` row cites the test's tiny model by the architecture it shares with the recipe's model
    (SmolLM2 is a Llama-architecture model: the proof on the Llama 3.2 instance covers it, and the row says why)."""
    row = ownpasses.explain(SimpleNamespace(use_vllm=False), {}, {"name_or_path": model})
    assert re.search(rf"its architecture \(model_type {architecture}\)", row), row
    assert f"tiny {ownpasses.PROVEN[architecture]}" in row
