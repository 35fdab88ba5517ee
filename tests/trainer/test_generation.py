"""grpokit.trainer.generation: the copies of a prompt are prefilled once, the turn after a tool's result starts from the states
the turn before computed and decodes no further than the completion's room -- and the completions TRL keeps are the
ones its own generation draws, token for token, greedy and sampled with the same seed. On the tiny model, TRL's
method beside ours."""

from __future__ import annotations

import json

import pytest
import torch
from trl import GRPOTrainer

from grpokit import config
from grpokit.run import training
from grpokit.run.build import make_trainer, prepare
from grpokit.config import validate
from grpokit.trainer.models import load_model
from grpokit.trainer.generation import PrefixReuseGRPOTrainer, PrefixStore
from tests.helpers import recipe_dict, write_recipe
from tests.tools.test_tooluse import scripted_calls, tool_recipe  # noqa: F401 - the fixture is used by name


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("prefix")
    data = recipe_dict()
    data["trainer"].update(output_dir=str(folder / "run"), max_completion_length=10)
    recipe = validate(config.load(str(write_recipe(folder, data))))
    prep = prepare(recipe, mode="train", log=lambda m: None)
    return make_trainer(prep, load_model(prep.model_path, recipe))


def generate(trainer, rows, num_generations, store=None):
    """One turn, seeded: through grpokit's kept prefixes when `store` is given, else through TRL's own method."""
    torch.manual_seed(0)
    trainer._prefix_store = store
    try:
        if store is None:
            return GRPOTrainer._generate_single_turn(trainer, rows, None, {}, num_generations)[0]
        return trainer._generate_single_turn(rows, None, {}, num_generations)[0]
    finally:
        trainer._prefix_store = None


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_a_turn_and_the_turn_after_a_tool_draw_what_trl_draws(trainer, sample):
    assert isinstance(trainer, PrefixReuseGRPOTrainer)
    tok = trainer.processing_class
    prompts = [tok("What is 2 + 2? " * k)["input_ids"] for k in (1, 3)]  # unequal lengths: left padding differs
    rows = [p for p in prompts for _ in range(4)]
    trainer.generation_config.do_sample = sample

    store = PrefixStore()
    first = generate(trainer, rows, 4, store)
    assert first == generate(trainer, rows, 4)
    # the copies were prefilled once: 2 distinct prompts' tokens computed, the other 6 copies' reused
    assert store.reused_tokens == sum(len(r) - 1 for r in rows)
    assert store.computed_tokens == sum(len(p) - 1 for p in prompts) + len(rows)  # the last token of each row

    # the turn after a tool: TRL concatenates prompt + completion + the result's tokens; results of unequal lengths
    result = tok(" <tool_response>\n42\n</tool_response>\n<|im_start|>assistant\n")["input_ids"]
    second_rows = [r + c + result[: 4 + i] for i, (r, c) in enumerate(zip(rows, first, strict=True))][::2]
    before, budget = store.reused_tokens, trainer.max_completion_length
    try:
        trainer.max_completion_length = 64  # room past max_new_tokens: no turn is cut here (the next test cuts)
        second = generate(trainer, second_rows, 1, store)
        assert second == generate(trainer, second_rows, 1)
    finally:
        trainer.max_completion_length = budget
    reused = store.reused_tokens - before
    # every row starts from what the first turn computed: at least its prompt, at most all but its last token
    assert sum(len(p) for p in rows[::2]) <= reused < sum(len(r) for r in second_rows)


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_a_lead_all_prompts_share_is_prefilled_once_and_draws_what_trl_draws(trainer, sample):
    from grpokit.trainer.shared_prompt import MIN_LEAD

    from tests.trainer.test_shared_prompt import LEAD, lead_of

    tok = trainer.processing_class
    prompts = [tok(LEAD + q)["input_ids"] for q in ("What is 2 + 2?", "What is 12 + 30? Think first.", "Add 4 and 4.")]
    lead = lead_of(prompts)
    assert lead >= MIN_LEAD
    rows = [p for p in prompts for _ in range(4)]
    trainer.generation_config.do_sample = sample
    store = PrefixStore()
    assert generate(trainer, rows, 4, store) == generate(trainer, rows, 4)
    # the lead computed once, each prompt's own tokens once, each row's last token
    assert store.computed_tokens == lead + sum(len(p) - 1 - lead for p in prompts) + len(rows)
    assert store.reused_tokens == sum(len(r) - 1 for r in rows)


def test_rows_with_nothing_kept_and_no_repeats_are_computed_whole(trainer):
    tok = trainer.processing_class
    rows = [tok("one two three")["input_ids"], tok("four five")["input_ids"]]
    store = PrefixStore()
    assert generate(trainer, rows, 1, store) == generate(trainer, rows, 1)
    assert store.reused_tokens == 0 and store.computed_tokens == sum(map(len, rows))
    assert len(store.rows) == 2  # kept for a next turn


def test_rows_padded_to_a_multiple_draw_the_same(trainer):
    """trainer.pad_to_multiple_of pads every row, the longest too: padding is no state to start from."""
    tok = trainer.processing_class
    distinct = [tok("one two three")["input_ids"], tok("four five")["input_ids"]]
    repeated = [distinct[0]] * 2 + [distinct[1]] * 2
    multiple = trainer.pad_to_multiple_of
    try:
        trainer.pad_to_multiple_of = 16
        for rows, copies in ((distinct, 1), (repeated, 2)):
            assert generate(trainer, rows, copies, PrefixStore()) == generate(trainer, rows, copies)
    finally:
        trainer.pad_to_multiple_of = multiple


def test_a_kept_prefix_never_outlives_its_generation_batch(trainer):
    """Weights change between steps: states computed in one `_generate` are never read by the next."""
    tok = trainer.processing_class
    seen = []
    original = GRPOTrainer._generate

    def spy(self, prompts):
        seen.append(self._prefix_store)
        return []

    GRPOTrainer._generate = spy
    try:
        trainer._generate([tok("x")["input_ids"]])
        trainer._generate([tok("x")["input_ids"]])
    finally:
        GRPOTrainer._generate = original
    assert seen[0] is not None and seen[1] is not None and seen[0] is not seen[1]
    assert trainer._prefix_store is None


def test_a_later_turn_decodes_no_further_than_the_roomiest_row_keeps(trainer):
    tok = trainer.processing_class
    rows = [tok("Count: one two")["input_ids"]] * 2 + [tok("Count: three")["input_ids"]] * 2
    store = PrefixStore()
    first = generate(trainer, rows, 2, store)
    result = tok(" <tool_response>\n7\n</tool_response>\n")["input_ids"]
    second_rows = [r + c + result[: 3 + i] for i, (r, c) in enumerate(zip(rows, first, strict=True))]
    used = [len(c) + 3 + i for i, c in enumerate(first)]
    budget = trainer.max_completion_length
    try:
        trainer.max_completion_length = max(used) + 3  # TRL keeps at most max_completion_length - used of a row
        rooms = [trainer.max_completion_length - u for u in used]
        ours = generate(trainer, second_rows, 1, store)
        theirs = generate(trainer, second_rows, 1)
    finally:
        trainer.max_completion_length = budget
    assert max(map(len, ours)) <= max(rooms) < max(map(len, theirs))  # TRL decoded past every row's room
    assert [o[:room] for o, room in zip(ours, rooms)] == [t[:room] for t, room in zip(theirs, rooms)]


def test_the_switch_off_keeps_no_states_and_draws_the_same(trainer):
    tok = trainer.processing_class
    rows = [tok("What is 3 + 4?")["input_ids"]] * 4
    off = PrefixStore(keep_states=False)
    assert generate(trainer, rows, 4, off) == generate(trainer, rows, 4)
    assert off.reused_tokens == 0 and all(kept.layers is None for kept in off.rows)


def test_the_recipe_switch_reaches_the_trainer(tmp_path, tiny_model_dir):
    data = recipe_dict(sampling={"reuse_prefix": False})
    data["trainer"].update(output_dir=str(tmp_path / "run"), gradient_checkpointing=False)  # else no sharing anyway
    recipe = validate(config.load(str(write_recipe(tmp_path, data))))
    prep = prepare(recipe, mode="train", log=lambda m: None)
    trainer = make_trainer(prep, load_model(prep.model_path, recipe))
    assert trainer._reuse_prefix_cache is False
    assert trainer._share_prompts is False  # the loss pass's sharing (grpokit.trainer.shared_prompt) goes with it


@pytest.mark.slow
def test_real_tool_steps_see_the_same_rollouts_with_and_without_kept_prefixes(tmp_path, monkeypatch, scripted_calls):
    """Two runs of two real steps, the first turn's calls scripted and every other turn generated by the model:
    with kept prefixes and without, the rollouts the rewards read are the same."""
    from grpokit.trainer.models import load_tokenizer
    from grpokit.checkpoints.tiny import ensure_tiny_model

    reader = tmp_path / "reader.py"
    reader.write_text(
        "import json, os\n\n"
        "def seen(completions, **kwargs):\n"
        "    with open(os.environ['SEEN_COMPLETIONS'], 'a') as f:\n"
        "        for c in completions:\n"
        "            f.write(json.dumps(c) + '\\n')\n"
        "    return [float(len(json.dumps(c)) % 3) for c in completions]\n")
    runs = {}
    for reuse in (True, False):
        folder = tmp_path / f"reuse-{reuse}"
        folder.mkdir()
        monkeypatch.setenv("SEEN_COMPLETIONS", str(folder / "seen.jsonl"))
        data = tool_recipe(folder, {"environment": "env.py:Calculator"}, rewards=[{"name": str(reader) + ":seen"}],
                           sampling={"reuse_prefix": reuse})
        data["trainer"].update(per_device_train_batch_size=4, num_generations=4, max_steps=2)
        recipe = validate(config.load(str(write_recipe(folder, data))))
        scripted_calls.tokenizer, scripted_calls.made = load_tokenizer(str(ensure_tiny_model()), recipe), 0
        training.train(recipe)
        runs[reuse] = [json.loads(line) for line in (folder / "seen.jsonl").read_text().splitlines()]
    assert runs[True] == runs[False]
    assert any(m.get("role") == "tool" for rollout in runs[True] for m in rollout)  # the tool rounds ran
