"""grpokit.trainer.shared_prompt: the loss pass computes each prompt once for its copies -- and its log-probabilities,
entropies and gradients are TRL's own method's, to float rounding. On the tiny model with LoRA, TRL's method beside
ours on the same rows."""

from __future__ import annotations

import json

import pytest
import torch
from trl import GRPOTrainer

from grpokit import config
from grpokit.trainer import shared_prompt
from grpokit.run import training
from grpokit.run.build import make_trainer, prepare
from grpokit.config import validate
from grpokit.trainer.models import load_model
from tests.helpers import recipe_dict, write_recipe
from tests.tools.test_tooluse import scripted_calls, tool_recipe  # noqa: F401 - the fixture is used by name


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("shared")
    data = recipe_dict()
    data["trainer"].update(output_dir=str(folder / "run"), max_completion_length=10, temperature=0.7,
                           gradient_checkpointing=False)  # on where a test asks for it (checkpointed)
    recipe = validate(config.load(str(write_recipe(folder, data))))
    prep = prepare(recipe, mode="train", log=lambda m: None)
    trainer = make_trainer(prep, load_model(prep.model_path, recipe))
    trainer.model.train()
    trainer.model.float()  # in float32 two forwards agree with one to ~1e-6; bfloat16 rounds each its own way (~1e-2)
    return trainer


def rows(trainer, prompts: list[str], copies: int, completion_lengths: list[int]):
    """TRL's loss-pass input: prompts left-padded, completions (random tokens, of the given lengths) right-padded,
    side by side; and how many completion columns there are."""
    tok = trainer.processing_class
    prompt_ids = [tok(p)["input_ids"] for p in prompts for _ in range(copies)]
    gen = torch.Generator().manual_seed(0)
    completions = [torch.randint(5, tok.vocab_size, (n,), generator=gen).tolist() for n in completion_lengths]
    width, room = max(map(len, prompt_ids)), max(completion_lengths)
    ids, mask = [], []
    for p, c in zip(prompt_ids, completions, strict=True):
        pad_left, pad_right = width - len(p), room - len(c)
        ids.append([tok.pad_token_id] * pad_left + p + c + [tok.pad_token_id] * pad_right)
        mask.append([0] * pad_left + [1] * (len(p) + len(c)) + [0] * pad_right)
    return torch.tensor(ids), torch.tensor(mask), room


def logps_and_grads(trainer, method, ids, mask, keep):
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    logps, entropies, _ = method(trainer.model, ids, mask, keep, compute_entropy=True)
    completion = mask[:, -keep:].float()
    grads = torch.autograd.grad((logps * completion).sum() + (entropies * completion).sum(), params)
    return logps.detach(), entropies.detach(), grads


def test_the_loss_pass_with_shared_prompts_is_trls(trainer):
    # two prompts of unequal lengths (left padding differs), four copies each, completions of unequal lengths
    ids, mask, keep = rows(trainer, ["What is 2 + 2?", "What is 12 + 30? Think first."], 4, [3, 7, 5, 2, 6, 7, 1, 4])
    assert trainer._share_prompts
    tally = trainer.shared_prompt_tally
    before = (tally.computed, tally.shared)
    ours = logps_and_grads(trainer, trainer._get_per_token_logps_and_entropies, ids, mask, keep)
    theirs = logps_and_grads(trainer, lambda *a, **k: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **k),
                             ids, mask, keep)
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-4)  # log-probs, padding's zeros included
    torch.testing.assert_close(ours[1], theirs[1], atol=1e-5, rtol=1e-4)  # entropies
    assert len(ours[2]) > 0 and any(g.abs().sum() > 0 for g in theirs[2])  # LoRA's trainable weights, moved
    for mine, trl in zip(ours[2], theirs[2], strict=True):
        torch.testing.assert_close(mine, trl, atol=1e-5, rtol=1e-3)
    # each prompt computed once, its other three copies' tokens shared
    prompt_tokens = mask[:, :-keep].sum(dim=1)
    assert (tally.computed - before[0], tally.shared - before[1]) == (
        int(prompt_tokens[0] + prompt_tokens[4]), int(3 * prompt_tokens[0] + 3 * prompt_tokens[4]))


def test_prompts_that_do_not_repeat_run_trls_method(trainer):
    ids, mask, keep = rows(trainer, ["What is 2 + 2?", "What is 3 + 5?", "Add 4 and 4."], 1, [3, 5, 2])
    shared = trainer.shared_prompt_tally.shared
    ours = logps_and_grads(trainer, trainer._get_per_token_logps_and_entropies, ids, mask, keep)
    theirs = logps_and_grads(trainer, lambda *a, **k: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **k),
                             ids, mask, keep)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])  # the very same computation
    assert trainer.shared_prompt_tally.shared == shared


def test_chunks_share_within_themselves(trainer):
    # TRL's batch_size chunks the rows; each chunk shares what repeats in it (here: 2 copies of each prompt per chunk)
    ids, mask, keep = rows(trainer, ["What is 2 + 2?", "What is 12 + 30?"], 4, [3, 7, 5, 2, 6, 7, 1, 4])
    order = torch.tensor([0, 1, 4, 5, 2, 3, 6, 7])
    ids, mask = ids[order], mask[order]
    ours, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, batch_size=4)
    theirs, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(trainer, trainer.model, ids, mask, keep, batch_size=4)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def assert_gradients_close(ours, theirs):
    """The gradients, all of them together, equal to float32 rounding (a relative error of ~1e-6): where prompts differ
    in length the shared lead puts a row's tokens at other absolute positions than TRL's columns, the same attention
    under rotary embeddings, whose angles transformers computes in float32 -- so single small elements stray further
    than an element-wise tolerance allows, while a real fault (a prompt that missed the lead) is off by ~1."""
    assert any(g.abs().sum() > 0 for g in theirs)
    diff = torch.cat([(mine - trl).flatten() for mine, trl in zip(ours, theirs, strict=True)])
    assert diff.norm() <= 1e-5 * torch.cat([g.flatten() for g in theirs]).norm()


# A lead every prompt shares, as a system text, tool schemas and a worked call are in a tool recipe's prompts.
LEAD = ("You are a careful calculator. Use the tools add, subtract and multiply for every step; state only the "
        "result. Example: What is 2718 * 43? Call multiply with a = 2718 and b = 43. ")


def lead_of(token_lists: list[list[int]]) -> int:
    """How many leading tokens all of `token_lists` share."""
    return next(i for i in range(min(map(len, token_lists))) if len({tuple(t[:i + 1]) for t in token_lists}) > 1)


def test_a_lead_all_prompts_share_is_computed_once_and_the_pass_is_still_trls(trainer):
    # three prompts after one long lead, their own parts of unequal lengths (left padding differs), two copies each
    prompts = [LEAD + "What is 2 + 2?", LEAD + "What is 12 + 30? Think first, then answer.", LEAD + "Add 4 and 4."]
    ids, mask, keep = rows(trainer, prompts, 2, [3, 7, 5, 2, 6, 4])
    tally = trainer.shared_prompt_tally
    before = (tally.computed, tally.shared)
    ours = logps_and_grads(trainer, trainer._get_per_token_logps_and_entropies, ids, mask, keep)
    theirs = logps_and_grads(trainer, lambda *a, **k: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **k),
                             ids, mask, keep)
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours[1], theirs[1], atol=1e-5, rtol=1e-4)
    assert_gradients_close(ours[2], theirs[2])
    # the lead computed once, each prompt's own tokens once
    tok = trainer.processing_class
    real = [tok(p)["input_ids"] for p in prompts]
    lead = lead_of(real)
    assert lead >= shared_prompt.MIN_LEAD
    computed = lead + sum(len(r) - lead for r in real)
    assert (tally.computed - before[0], tally.shared - before[1]) == (computed, 2 * sum(map(len, real)) - computed)


def test_a_shared_lead_is_shared_even_where_no_prompt_repeats(trainer):
    prompts = [LEAD + "What is 2 + 2?", LEAD + "What is 7 * 6, then minus 5?"]
    ids, mask, keep = rows(trainer, prompts, 1, [4, 6])
    shared = trainer.shared_prompt_tally.shared
    ours = logps_and_grads(trainer, trainer._get_per_token_logps_and_entropies, ids, mask, keep)
    theirs = logps_and_grads(trainer, lambda *a, **k: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **k),
                             ids, mask, keep)
    assert trainer.shared_prompt_tally.shared > shared
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-4)
    assert_gradients_close(ours[2], theirs[2])


def test_a_model_without_rotary_embeddings_gets_no_lead(trainer, monkeypatch):
    # the lead puts tokens at other absolute positions than TRL does: the same attention under rotary embeddings only
    from transformers import GPT2Config, LlamaConfig

    from grpokit import trl_compat

    assert trl_compat.rotary_positions(trainer.model.config) and trl_compat.rotary_positions(LlamaConfig())
    assert not trl_compat.rotary_positions(GPT2Config())
    monkeypatch.setattr(trl_compat, "rotary_positions", lambda config: False)
    prompts = [LEAD + "What is 2 + 2?", LEAD + "What is 12 + 30? Think first."]
    ids, mask, keep = rows(trainer, prompts, 2, [3, 7, 5, 2])
    before = trainer.shared_prompt_tally.computed
    trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)
    tok = trainer.processing_class
    assert trainer.shared_prompt_tally.computed - before == sum(len(tok(p)["input_ids"]) for p in prompts)


def test_the_common_prefix_leaves_each_prompt_two_tokens_and_ignores_short_leads():
    t = torch.tensor
    long = list(range(100, 100 + shared_prompt.MIN_LEAD + 4))
    assert shared_prompt.common_prefix([t(long + [1, 2]), t(long + [3, 4, 5])]) == len(long)
    assert shared_prompt.common_prefix([t(long), t(long + [7])]) == len(long) - 2  # the shorter keeps two of its own
    assert shared_prompt.common_prefix([t(long[:5] + [1] * 30), t(long[:5] + [2] * 30)]) == 0  # 5 < MIN_LEAD
    assert shared_prompt.common_prefix([t(long + [1, 2])]) == 0  # one prompt: nothing shared


@pytest.fixture
def checkpointed(trainer):
    """The trainer's model under gradient checkpointing, non-reentrant (TRL's default; the GPU recipes')."""
    trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer.args.gradient_checkpointing, trainer.args.gradient_checkpointing_kwargs = True, {"use_reentrant": False}
    try:
        yield trainer
    finally:
        trainer.model.gradient_checkpointing_disable()
        trainer.model.disable_input_require_grads()
        trainer.args.gradient_checkpointing, trainer.args.gradient_checkpointing_kwargs = False, None


def test_under_gradient_checkpointing_the_shared_pass_is_still_trls(checkpointed):
    # a checkpointed layer runs again in the backward: the prompts' keys are recorded once, the rows' cache is read
    # only, so the replay computes what the forward did -- and transformers' layers keep the cache for our forwards
    trainer = checkpointed
    ids, mask, keep = rows(trainer, ["What is 2 + 2?", "What is 12 + 30? Think first."], 4, [3, 7, 5, 2, 6, 7, 1, 4])
    shared = trainer.shared_prompt_tally.shared
    ours = logps_and_grads(trainer, trainer._get_per_token_logps_and_entropies, ids, mask, keep)
    theirs = logps_and_grads(trainer, lambda *a, **k: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **k),
                             ids, mask, keep)
    assert trainer.shared_prompt_tally.shared > shared  # shared, not TRL's method run in its place
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-4)
    for mine, trl in zip(ours[2], theirs[2], strict=True):
        torch.testing.assert_close(mine, trl, atol=1e-5, rtol=1e-3)
    layer = next(m for m in trainer.model.modules() if hasattr(type(m), "_can_checkpoint_with_cache"))
    assert layer._can_checkpoint_with_cache is False  # the layers' own rule is back
    # with a shared lead: the prompts' own pass, replayed, attends to the lead again (not to itself alone)
    ids, mask, keep = rows(trainer, [LEAD + "What is 2 + 2?", LEAD + "What is 12 + 30? Think first."], 2, [3, 7, 5, 2])
    ours = logps_and_grads(trainer, trainer._get_per_token_logps_and_entropies, ids, mask, keep)
    theirs = logps_and_grads(trainer, lambda *a, **k: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **k),
                             ids, mask, keep)
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-4)
    assert_gradients_close(ours[2], theirs[2])


def test_under_reentrant_checkpointing_trls_method_runs(checkpointed):
    # the reentrant kind runs a layer's forward without grad: recorded keys would carry none, so TRL's method runs
    trainer = checkpointed
    trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    trainer.model.enable_input_require_grads()  # what reentrant checkpointing needs for LoRA's gradients
    ids, mask, keep = rows(trainer, ["What is 2 + 2?", "What is 12 + 30?"], 4, [3, 7, 5, 2, 6, 7, 1, 4])
    shared = trainer.shared_prompt_tally.shared
    ours = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)[0]
    theirs = GRPOTrainer._get_per_token_logps_and_entropies(trainer, trainer.model, ids, mask, keep)[0]
    assert trainer.shared_prompt_tally.shared == shared
    assert torch.equal(ours, theirs)
    # sampling.reuse_prefix: false turns it off with generation's reuse (tests/trainer/test_generation.py)


@pytest.mark.slow
def test_real_tool_steps_share_their_prompts_in_the_loss_pass(tmp_path, monkeypatch, scripted_calls):
    """Two real steps of a tool recipe, its first turn's calls scripted: the loss pass took each prompt's copies
    from one computation, and the step trained (the adapter moved)."""
    from grpokit.trainer.models import load_tokenizer
    from grpokit.checkpoints.tiny import ensure_tiny_model

    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator"})
    data["trainer"].update(per_device_train_batch_size=4, num_generations=4, max_steps=2, gradient_checkpointing=False)
    recipe = validate(config.load(str(write_recipe(tmp_path, data))))
    scripted_calls.tokenizer, scripted_calls.made = load_tokenizer(str(ensure_tiny_model()), recipe), 0
    seen = {}

    def keep(prep, model):
        seen["trainer"] = made = make_trainer(prep, model)
        return made

    monkeypatch.setattr(training, "make_trainer", keep)
    training.train(recipe)
    tally = seen["trainer"].shared_prompt_tally
    assert tally.computed > 0 and tally.shared == 3 * tally.computed  # one prompt a step, four copies: three shared
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
