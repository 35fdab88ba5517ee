"""Peak live bytes of the loss pass (forward and backward), grpokit's shared pass beside TRL's own method.

    .venv/bin/python bench/shared_pass_memory.py --layers 28      # Qwen2.5-1.5B's width and depth: ~30 min, ~10 GiB
    .venv/bin/python bench/shared_pass_memory.py --layers 2       # the same shapes on 2 layers: ~2 min

The model: a random-weight copy of the shipped Qwen2.5-1.5B-Instruct architecture (hidden 1536, 12 query and 2
key/value heads, MLP 8960) cut to `--layers` decoder layers and a 2,000-token vocabulary (the LM head is the same
for both methods), float32, sdpa attention, LoRA r=16 on every linear layer, non-reentrant gradient checkpointing
(what the GPU recipes run; `--no-checkpointing` for without). A micro-batch of 8 rows: prompts left-padded
(random tokens), completions of 100 tokens. Counted by `grpokit.planning.measure.LiveTensors` (every storage an
operator returns, until freed): the peak from the pass's first operator to the gradients, weights excluded.
Printed, not stored: bench/README.md, "The shared pass's memory", keeps the figures with their date and HEAD.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from offline import ROOT  # noqa: E402  (before grpokit: sets the environment)

import torch  # noqa: E402

VOCAB, COMPLETION = 2000, 100
# name -> (distinct prompts, copies of each (0: the first prompt twice, the rest once), lead tokens, own tokens)
CASES = {
    "7 prompts of 8 rows, no lead": (7, 0, 0, 440),
    "8 prompts, no lead (TRL's method runs)": (8, 1, 0, 440),
    "7 prompts of 8 rows, a 400-token lead": (7, 0, 400, 40),
    "8 prompts, a 400-token lead": (8, 1, 400, 40),
    "2 prompts x 4, a 400-token lead": (2, 4, 400, 40),
    "1 prompt x 8": (1, 8, 400, 40),
}


def trainer_for(folder: Path):
    """grpokit's trainer (the smoke recipe's): its loss-pass methods are what this measures, on another model."""
    from grpokit.run.build import make_trainer, prepare
    from grpokit.config import load, validate
    from grpokit.trainer.models import load_model

    recipe = validate(load(str(ROOT / "recipes" / "smoke.yaml"), [f"trainer.output_dir={folder / 'run'}",
                                                                  "trainer.save_strategy=no", "trainer.report_to=none"]))
    prep = prepare(recipe, mode="train", log=lambda m: None)
    return make_trainer(prep, load_model(prep.model_path, recipe))


def qwen_cut(layers: int, trainer, checkpointing: bool):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer import add_fused_lm_head

    from grpokit import files

    data = files.read_json(ROOT / "grpokit/assets/model_configs/Qwen__Qwen2.5-1.5B-Instruct/config.json")
    data.update(num_hidden_layers=layers, max_window_layers=layers, vocab_size=VOCAB, tie_word_embeddings=False,
                bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**data), attn_implementation="sdpa",
                                             dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    add_fused_lm_head(model.get_base_model(), temperature=trainer.temperature,
                      cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32, outputs=("log_probs", "entropy"))
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
        trainer.args.gradient_checkpointing, trainer.args.gradient_checkpointing_kwargs = True, {"use_reentrant": False}
    return model


def batch(distinct: int, copies: int, lead: int, own: int, gen: torch.Generator):
    """Left-padded prompts (the lead, then each prompt's own tokens, one more for each next prompt), completions."""
    lead_ids = torch.randint(10, VOCAB, (lead,), generator=gen).tolist()
    prompts = [lead_ids + torch.randint(10, VOCAB, (own + i,), generator=gen).tolist() for i in range(distinct)]
    if copies == 0:
        prompts, copies = [prompts[0]] + prompts, 1
    width = max(map(len, prompts))
    ids, mask = [], []
    for p in prompts:
        for _ in range(copies):
            ids.append([0] * (width - len(p)) + p + torch.randint(10, VOCAB, (COMPLETION,), generator=gen).tolist())
            mask.append([0] * (width - len(p)) + [1] * (len(p) + COMPLETION))
    return torch.tensor(ids), torch.tensor(mask)


def peak(method, model, ids, mask) -> int:
    from grpokit.planning.measure import LiveTensors

    params = [p for p in model.parameters() if p.requires_grad]
    with LiveTensors() as live:
        logps = method(model, ids, mask, COMPLETION, compute_entropy=False)[0]
        grads = torch.autograd.grad((logps * mask[:, -COMPLETION:]).sum(), params)
        del logps, grads
    return live.peaks["default"].total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--no-checkpointing", action="store_true")
    args = parser.parse_args(argv)
    from trl import GRPOTrainer

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trainer_for(Path(tmp))
        model = qwen_cut(args.layers, trainer, not args.no_checkpointing)
        theirs = lambda *a, **k: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **k)  # noqa: E731
        gen = torch.Generator().manual_seed(0)
        print(f"Qwen2.5-1.5B's width, {args.layers} layers, 8 rows, completions {COMPLETION} tokens, gradient "
              f"checkpointing {'off' if args.no_checkpointing else 'on'}; peak live MiB of the loss pass", flush=True)
        print(f"{'case':42s} {'width':>5s} {'grpokit':>9s} {'TRL':>9s} {'ratio':>6s}", flush=True)
        for name, case in CASES.items():
            ids, mask = batch(*case, gen)
            ours = peak(trainer._get_per_token_logps_and_entropies, model, ids, mask)
            trl = peak(theirs, model, ids, mask)
            print(f"{name:42s} {ids.size(1):5d} {ours / 2**20:9.1f} {trl / 2**20:9.1f} {ours / trl:6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
