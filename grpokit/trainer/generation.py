"""TRL's transformers generation, with less work: a prompt computed once for its copies and kept across tool rounds;
a later turn stopped where the completion's room ends.

TRL's transformers path (`GRPOTrainer._generate_single_turn`) left-pads its rows and runs `model.generate` on all of
them from the first token, `max_completion_length` new tokens at most. Three kinds of work are wasted:

- the `num_generations` copies of one prompt: TRL prefills each copy, the same tokens `num_generations` times;
- a tool round: TRL generates the turn after a tool's result from prompt + completion + result (concatenated token
  ids) and prefills all of it again, though the previous turn had just computed the prompt and the completion;
- a tool round again: it generates up to `max_completion_length` new tokens, then cuts each row to the room its
  completion has left (`max_completion_length` less the earlier turns and the results): decoding, a full pass over
  the weights per token for the whole batch, the longest row sets the batch's time.

`generate` keeps, for the length of one generation batch (the trainer's `_generate`), each row's token ids, its first
turn's prompt length and its keys and values; a row of the next turn starts from the longest kept prefix of its
tokens, the copies of a prompt are prefilled once and share the result, and a later turn decodes no further than
the roomiest row can keep. Then it runs `model.generate` with that cache exactly as TRL does: the same sampling,
logits processors and stopping; only tokens with no kept state are computed. The cache holds real tokens' keys at
their own positions (a token's position is its index among the row's real tokens, whatever the padding), so a row's
kept keys are valid under any left padding.

What is the same and what is not: every completion TRL keeps is drawn the same way, and `tests/trainer/test_generation.py`
finds them equal token for token, greedy and sampled under one seed. Keys computed in a batch of 2 rows or of 8
differ in float rounding only (as TRL's own figures do between batch sizes); a turn cut short of TRL's
`max_completion_length` leaves the random generator elsewhere for the next turn, so a third round's draws differ
from TRL's (from the same distribution). Kept states never outlive the generation batch they were computed in, so a
step's rows are computed with its own weights.

Used when TRL generates through `model.generate` on text (no vLLM, no continuous batching, no images), with no
`cache_implementation` set, on a model grpokit.trainer.ownpasses finds proven (transformers' plain `DynamicLayer` cache in
every layer, a family tests/trainer/test_ownpasses.py compares), and while the first step's check agrees with TRL's method;
otherwise TRL's own method runs. `sampling.reuse_prefix: false` keeps no states (the turn's cut stays).
"""

from __future__ import annotations

import copy
import logging

import torch
from trl import GRPOTrainer

from grpokit.trainer import ownpasses
from grpokit import trl_compat
from grpokit.trainer.dynamic_sampling import DynamicSamplingGRPOTrainer
from grpokit.trainer.shared_prompt import SharedPromptMixin, common_prefix

logger = logging.getLogger(__name__)


class Kept:
    """One row of the last turn: its token ids, the length of its first turn's prompt, and (when states are kept) its
    keys and values per layer, `[heads, tokens, head_dim]`, for its first `held` tokens."""

    __slots__ = ("ids", "prompt_length", "layers")

    def __init__(self, ids: tuple[int, ...], prompt_length: int, layers: list | None):
        self.ids, self.prompt_length, self.layers = ids, prompt_length, layers

    @property
    def held(self) -> int:
        return self.layers[0][0].shape[1] if self.layers else 0


class PrefixStore:
    """What one generation batch keeps from turn to turn (`Kept` rows), and the tokens it reused and computed."""

    def __init__(self, keep_states: bool = True):
        self.keep_states = keep_states
        self.rows: list[Kept] = []
        self.reused_tokens = 0
        self.computed_tokens = 0

    def longest(self, ids: list[int]) -> tuple[Kept | None, int]:
        """The kept row `ids` continues (the longest such), and how many of its tokens' states apply to `ids`."""
        best, best_len = None, 0
        for kept in self.rows:
            if len(kept.ids) < len(ids) and tuple(ids[:len(kept.ids)]) == kept.ids and len(kept.ids) > best_len:
                best, best_len = kept, len(kept.ids)
        if best is None:
            return None, 0
        return best, min(best.held, len(ids) - 1)  # at least one token of each row is left to compute


def fits(trainer) -> bool:
    """Whether this trainer generates the way `generate` stands in for (see the module's docstring): fixed for its life,
    so asked once, when it is built."""
    if trainer.use_vllm or getattr(trainer, "use_transformers_continuous_batching", False) or trainer._is_vlm:
        return False
    if trainer.generation_config.cache_implementation is not None or trainer.generation_config.use_cache is False:
        return False
    return ownpasses.verdict(trainer.model.config).runs


def _left_pad(rows: list[list[int]], pad_id: int, multiple: int | None, device) -> tuple[torch.Tensor, torch.Tensor]:
    from trl.trainer.utils import pad

    tensors = [torch.tensor(r) for r in rows]
    ids = pad(tensors, padding_value=pad_id, padding_side="left", pad_to_multiple_of=multiple)
    mask = pad([torch.ones_like(t) for t in tensors], padding_value=0, padding_side="left",
               pad_to_multiple_of=multiple)
    return ids.to(device), mask.to(device)


def _prefill(model, rows: list[list[int]], pad_id: int, device, lead: int = 0
             ) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Keys and values of each row's tokens: per row, per layer, `[heads, tokens, dim]`. The first `lead` tokens, the
    same in every row (a system text, tool schemas, a worked call), computed once; then the rest of each row in one
    forward against them, each token at its position within its row, as generate places it."""
    from transformers import DynamicCache

    held = []
    if lead:
        shared = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([rows[0][:lead]], device=device), position_ids=torch.arange(lead, device=device)[None],
              cache=shared, use_cache=True, logits_to_keep=1)
        held = [(layer.keys.expand(len(rows), -1, -1, -1), layer.values.expand(len(rows), -1, -1, -1))
                for layer in shared.layers]
    own = [r[lead:] for r in rows]
    ids, mask = _left_pad(own, pad_id, None, device)
    positions = (lead + mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as generate makes them
    cache = DynamicCache(ddp_cache_data=held or None, config=model.config)
    model(input_ids=ids, attention_mask=torch.cat([mask.new_ones(len(rows), lead), mask], dim=1), position_ids=positions,
          cache=cache, use_cache=True, logits_to_keep=1)
    width = ids.shape[1]
    return [[(torch.cat([layer.keys[i, :, :lead], layer.keys[i, :, lead + width - len(o):]], dim=1),
              torch.cat([layer.values[i, :, :lead], layer.values[i, :, lead + width - len(o):]], dim=1))
             for layer in cache.layers] for i, o in enumerate(own)]


def _cache_width(kept: list[int], pads: list[int]) -> int:
    """The width of the batch's cache: the least pad + kept over the rows, 0 where a row has nothing kept
    (pad_to_multiple_of pads every row: padding alone is no start)."""
    width = min(p + k for p, k in zip(pads, kept, strict=True))
    return width if all(kept) else 0


def _batch_cache(model, starts: list, kept: list[int], pads: list[int], release: list | None = None):
    """One cache for the padded batch, and its width C: row i holds its pad columns then its first kept tokens, C the
    least pad + kept over the rows (a row's kept tokens past C are computed again). `release`: every list of kept
    states per layer that holds them (each row's, the last turn's too); each layer is let go in all of them once
    copied, so a later turn holds the last turn's keys and values and their copy one layer at a time, not twice whole."""
    from transformers import DynamicCache

    width = _cache_width(kept, pads)
    if not width:
        return DynamicCache(config=model.config), 0
    layers = []
    reference = next(s for s in starts if s is not None)
    for layer_idx in range(len(reference)):
        k0, v0 = reference[layer_idx]
        heads, _, dim = k0.shape
        keys = k0.new_zeros(len(starts), heads, width, dim)
        values = v0.new_zeros(len(starts), heads, width, dim)
        for i, (start, pad) in enumerate(zip(starts, pads, strict=True)):
            n = width - pad
            if n > 0:
                keys[i, :, pad:] = start[layer_idx][0][:, :n]
                values[i, :, pad:] = start[layer_idx][1][:, :n]
        layers.append((keys, values))
        del k0, v0
        for held in release or ():
            held[layer_idx] = None
    return DynamicCache(ddp_cache_data=layers, config=model.config), width


def _starts(store: PrefixStore, model, rows: list[list[int]], pad_id: int, device):
    """Per row: the states it starts from (or None), how many tokens they cover, and its first turn's prompt length."""
    found = [store.longest(r) for r in rows]
    prompt_lengths = [kept.prompt_length if kept else len(r) for (kept, _), r in zip(found, rows, strict=True)]
    if not store.keep_states:
        return [None] * len(rows), [0] * len(rows), prompt_lengths
    if all(n for _, n in found):
        return [kept.layers for kept, _ in found], [n for _, n in found], prompt_lengths
    distinct = list(dict.fromkeys(tuple(r) for r in rows))
    if len(distinct) == len(rows) or any(n for _, n in found) or min(map(len, distinct)) < 2:
        # nothing repeats, a mixed turn, or a one-token prompt (nothing to keep before its last token): compute it whole
        return [None] * len(rows), [0] * len(rows), prompt_lengths
    # a first turn whose prompts repeat (num_generations copies): each distinct prompt prefilled once, all but its
    # last token (generate computes that one, and from it the first new token)
    # the lead all of them share (the system text, tool schemas, a worked call) once for all
    lead = common_prefix([torch.tensor(d) for d in distinct])
    states = dict(zip(distinct, _prefill(model, [list(d[:-1]) for d in distinct], pad_id, device, lead), strict=True))
    store.computed_tokens += sum(len(d) - 1 for d in distinct) - lead * (len(distinct) - 1)
    return [states[tuple(r)] for r in rows], [len(r) - 1 for r in rows], prompt_lengths


def _agrees(trainer, model, ids, mask, starts, kept, pads, cached_width: int) -> bool:
    """The first-step check (grpokit.trainer.ownpasses): the next-token distribution generate's prefill ends with, from a copy
    of the kept states and from none (TRL's method); each row at the positions generate gives it."""
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate makes them
    cache, _ = _batch_cache(model, starts, kept, pads)  # a copy: a forward extends the cache it is given
    with ownpasses.dropout_off(model):
        ours = model(input_ids=ids[:, cached_width:], attention_mask=mask, position_ids=positions[:, cached_width:],
                     cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        theirs = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits[:, -1]
    return trainer.own_pass_check.judge(trainer, "generation", ownpasses.expected_disagreement(ours, theirs),
                                        ownpasses.compute_dtype(trainer, model), ownpasses.attention_of(model))


def generate(trainer, prompt_ids: list[list[int]]):
    """What `GRPOTrainer._generate_single_turn` returns on its transformers path, `(completion_ids, None)`, from kept
    states where a row has them and no further than a row can keep. Called inside the trainer's `_generate`. None
    when the first-step check finds it apart from TRL's method (grpokit.trainer.ownpasses): TRL's is to run instead."""
    from trl.models import unwrap_model_for_generation

    store: PrefixStore = trainer._prefix_store
    device = trainer.accelerator.device
    pad_id = trainer._tokenizer.pad_token_id
    rows = [list(r) for r in prompt_ids]
    ids, mask = _left_pad(rows, pad_id, trainer.pad_to_multiple_of, device)
    width = ids.shape[1]
    pads = [width - len(r) for r in rows]
    config = trainer.generation_config
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            generation_kwargs=trainer.generation_kwargs,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
        trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False),
    ):
        starts, kept, prompt_lengths = _starts(store, model, rows, pad_id, device)
        cached_width = _cache_width(kept, pads)
        checking = cached_width and trainer.own_pass_check.pending("generation")
        if checking and not _agrees(trainer, model, ids, mask, starts, kept, pads, cached_width):
            return None
        # the kept states are read once more, into the batch's cache, and let go layer by layer as they are
        holders = list({id(h): h for h in [*(r.layers for r in store.rows if r.layers), *(s for s in starts if s)]}.values())
        cache, cached_width = _batch_cache(model, starts, kept, pads, release=holders)
        del starts, holders
        reused = [max(0, cached_width - p) for p in pads]
        store.reused_tokens += sum(reused)
        store.computed_tokens += sum(len(r) - n for r, n in zip(rows, reused, strict=True))
        # TRL keeps of a later turn only what fits the completion's room; decoding past the roomiest row is waste
        room = max(trainer.max_completion_length - (len(r) - p) for r, p in zip(rows, prompt_lengths, strict=True))
        if 0 < room < (config.max_new_tokens or room + 1):
            config = copy.deepcopy(config)
            config.max_new_tokens = room
        sequences = model.generate(input_ids=ids, attention_mask=mask, cache=cache, generation_config=config)

    completion = sequences[:, width:]
    eos = torch.isin(completion, torch.tensor(trainer.eos_token_ids, device=completion.device))
    ends = torch.full((eos.size(0),), eos.size(1), dtype=torch.long, device=completion.device)
    ends[eos.any(dim=1)] = eos.int().argmax(dim=1)[eos.any(dim=1)]
    completion_ids = [c[: int(e) + 1].tolist() for c, e in zip(completion.cpu(), ends.cpu(), strict=True)]

    held = cache.layers[0].keys.shape[2] if cache.layers and cache.layers[0].is_initialized else 0
    store.rows = []
    for i, (row, done) in enumerate(zip(rows, completion_ids, strict=True)):
        n = min(len(row) + len(done), held - pads[i]) if store.keep_states else 0
        layers = ([(layer.keys[i, :, pads[i]:pads[i] + n], layer.values[i, :, pads[i]:pads[i] + n])
                   for layer in cache.layers] if n > 0 else None)
        store.rows.append(Kept(tuple(row + done), prompt_lengths[i], layers))
    return completion_ids, None


class PrefixReuseMixin:
    """Put before `GRPOTrainer` (or a subclass) in the bases: its generation goes through `generate` where it fits."""

    _prefix_store: PrefixStore | None = None
    _reuse_prefix_cache: bool = True

    def __init__(self, *args, reuse_prefix: bool = True, **kwargs):
        self.own_pass_check = getattr(self, "own_pass_check", None) or ownpasses.FirstStepCheck()
        with trl_compat.environment_factory_unwarned():  # wherever grpokit builds it: a run, --eval, a test
            super().__init__(*args, **kwargs)
        self._reuse_prefix_cache = reuse_prefix  # sampling.reuse_prefix: false keeps no states (the cut stays)
        problems = trl_compat.generation_internals_problems()
        if problems:  # TRL's generation is not the one this stands in for: let TRL's run
            logger.warning("grpokit.trainer.generation is off, TRL's own generation runs: %s", "; ".join(problems))
        self._own_generation = not problems and fits(self)

    def _generate(self, prompts):
        if not self._own_generation:
            return super()._generate(prompts)
        self._prefix_store = PrefixStore(keep_states=self._reuse_prefix_cache)
        try:
            return super()._generate(prompts)
        finally:
            self._prefix_store = None

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self._prefix_store is not None and not (images is not None and any(images)) and not multimodal_fields:
            done = generate(self, prompt_ids)
            if done is not None:
                return done
            self._own_generation, self._prefix_store = False, None  # TRL's method, from this turn on
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                             has_tool_images=has_tool_images)


class PrefixReuseGRPOTrainer(SharedPromptMixin, PrefixReuseMixin, GRPOTrainer):
    """`trl.GRPOTrainer`, generating through grpokit.trainer.generation, its loss pass through grpokit.trainer.shared_prompt."""


class PrefixReuseSamplingTrainer(SharedPromptMixin, PrefixReuseMixin, DynamicSamplingGRPOTrainer):
    """grpokit's dynamic-sampling trainer, generating through grpokit.trainer.generation, its loss pass through
    grpokit.trainer.shared_prompt."""
