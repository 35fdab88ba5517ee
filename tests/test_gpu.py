"""GPU-only checks (marker `gpu`, skipped without CUDA): the dtype and quantization paths a 16 GB card uses."""

from __future__ import annotations

import pytest
from helpers import ROOT

from grpokit.config import load
from grpokit.run import training
from grpokit.config import validate

pytestmark = pytest.mark.gpu


def test_auto_dtype_on_gpu_is_half_precision_and_trains(tmp_path):
    import torch

    recipe = validate(load(ROOT / "recipes" / "smoke.yaml", [f"trainer.output_dir={tmp_path}", "trainer.max_steps=2",
                                                                         "trainer.save_strategy=no", "trainer.disable_tqdm=true"]))
    trainer = training.train(recipe)
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    assert trainer.model.get_base_model().dtype == expected
    assert trainer.args.bf16 == (expected == torch.bfloat16) and trainer.args.fp16 == (expected == torch.float16)
    assert trainer.state.global_step == 2


def test_qlora_4bit_on_gpu(tmp_path):
    recipe = validate(load(ROOT / "recipes" / "smoke.yaml", ["model.quantization=4bit", f"trainer.output_dir={tmp_path}",
                                                                         "trainer.max_steps=2", "trainer.save_strategy=no",
                                                                         "trainer.disable_tqdm=true"]))
    trainer = training.train(recipe)
    assert "Linear4bit" in {type(m).__name__ for m in trainer.model.get_base_model().modules()}
    assert next(trainer.model.parameters()).is_cuda
