"""`launch.py --merge RUN_DIR`: a LoRA adapter folded into its base gives the same logits, as a plain model."""

from __future__ import annotations

import pytest
import torch
import yaml
from helpers import recipe_dict

from grpokit.cli import main


@pytest.fixture(scope="module")
def adapter_run(tiny_model_dir, tmp_path_factory):
    """A run directory as training leaves it (adapter, tokenizer, recipe.yaml), with a non-zero adapter.

    PEFT initialises B = 0, so an untrained adapter merges to the base unchanged and proves nothing;
    `init_lora_weights=False` gives random A and B, which changes every adapted layer's output.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path_factory.mktemp("merge") / "run"
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM", init_lora_weights=False)
    model = get_peft_model(base, config)
    model.save_pretrained(run)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(run)
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe_dict()))  # model.name_or_path: builtin:tiny-llama
    return run, model.eval()


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.slow
def test_merged_logits_equal_the_adapter_models(adapter_run):
    from transformers import AutoModelForCausalLM

    run, adapted = adapter_run
    assert main(["--merge", str(run)]) == 0
    merged_dir = run / "merged"
    assert (merged_dir / "config.json").is_file() and (merged_dir / "tokenizer_config.json").is_file()
    assert not (merged_dir / "adapter_config.json").exists()  # a plain model: loads without PEFT
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    ids = torch.randint(7, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    expected = logits(adapted, ids)
    with adapted.disable_adapter():
        unadapted = logits(adapted, ids)
    assert not torch.allclose(unadapted, expected, atol=1e-3)  # the adapter really changes the output
    torch.testing.assert_close(logits(merged, ids), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_merge_out_and_overwrite(adapter_run, tmp_path, capsys):
    """A previous merge is replaced only with --overwrite; a folder holding anything else is never merged into."""
    run, _ = adapter_run
    out = tmp_path / "merged"
    assert main(["--merge", str(run), "--merge-out", str(out)]) == 0
    assert main(["--merge", str(run), "--merge-out", str(out)]) == 2  # never silently replaced
    err = capsys.readouterr().err
    assert "--merge-out: holds a previous merge; pass --overwrite" in err and "Traceback" not in err
    assert main(["--merge", str(run), "--merge-out", str(out), "--overwrite"]) == 0
    assert (out / "config.json").is_file()
    (out / "keep.txt").write_text("the user's")
    assert main(["--merge", str(run), "--merge-out", str(out), "--overwrite"]) == 2
    assert "keep.txt" in capsys.readouterr().err and (out / "keep.txt").is_file() and (out / "config.json").is_file()


@pytest.mark.parametrize(
    "make,fragment",
    [
        (lambda d: None, "no LoRA adapter here (adapter_config.json missing)"),  # an empty directory
        (lambda d: (d / "config.json").write_text("{}"), "full fine-tune"),  # a full fine-tune: nothing to merge
    ],
    ids=["empty", "full-ft"],
)
def test_no_adapter_exits_2(tmp_path, capsys, make, fragment):
    make(tmp_path)
    assert main(["--merge", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and str(tmp_path) in err and "Traceback" not in err


def test_missing_run_dir_exits_2(tmp_path, capsys):
    assert main(["--merge", str(tmp_path / "nope")]) == 2
    assert "run directory does not exist" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("recipe_in_parent", [True, False], ids=["checkpoint-recipe-in-parent", "no-recipe-adapter-config-base"])
def test_merge_finds_the_base(adapter_run, tmp_path, recipe_in_parent):
    """A checkpoint takes its base from the run's recipe.yaml one level up; a bare adapter from its own config."""
    import shutil

    run, _ = adapter_run
    parent = tmp_path / "run"
    checkpoint = parent / "checkpoint-1"
    shutil.copytree(run, checkpoint, ignore=shutil.ignore_patterns("merged", "recipe.yaml"))
    if recipe_in_parent:
        shutil.copy(run / "recipe.yaml", parent / "recipe.yaml")
    assert main(["--merge", str(checkpoint), "--merge-out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "config.json").is_file()


@pytest.mark.parametrize("case", ["corrupt-adapter-config", "merge-out-is-a-file"])
def test_merge_inputs_and_output_are_checked_before_any_weights_load(tmp_path, capsys, no_weights, case):
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe_dict()))
    out = tmp_path / "merged"
    if case == "corrupt-adapter-config":  # cut off mid-write: PEFT's JSONDecodeError once the base had loaded
        (run / "adapter_config.json").write_text('{"r": 8, "lora_al')
        expected = f"--merge: {run / 'adapter_config.json'} is not valid JSON (line 1, column 10: Unterminated string"
    else:  # iterdir() on a file: NotADirectoryError
        (run / "adapter_config.json").write_text("{}")
        out.write_text("not a directory")
        expected = "--merge-out: names an existing file; the merged model is a directory"
    assert main(["--merge", str(run), "--merge-out", str(out)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert case != "merge-out-is-a-file" or out.read_text() == "not a directory"
