"""The loss pass with each prompt computed once for its copies.

GRPO scores `num_generations` completions of one prompt, and TRL's log-probability pass
(`GRPOTrainer._get_per_token_logps_and_entropies`) runs every row from its first token: the same prompt through
the model (and, in the training pass, through the backward) once per copy. With tools the prompt is the long part
of a row -- the tool schemas, the system text and a worked call make SmolLM2's calculator prompt ~540 tokens beside
a ~90-token completion -- so most of a tool step's training pass is copies of work already done.

`logps_and_entropies` runs each distinct prompt of a micro-batch once, all but its last token, keeping its keys and
values (with their gradient); hands every row its prompt's keys and values; and runs the rest -- the prompt's last
token and the completion -- against them, through TRL's fused LM head, as TRL does: the same positions (a row's
column index, TRL passes none), the same attention mask, the same temperature. The log-probabilities and entropies
are TRL's to float rounding (two forwards instead of one), and so are the gradients: the keys and values of a
prompt receive the sum of its copies' gradients, which is what the copies' separate passes add up to.
`tests/trainer/test_shared_prompt.py` compares both with TRL's own method.

The distinct prompts themselves mostly share a lead: a tool recipe's system text, tool schemas and worked call are
the same ~480 tokens before every question. Where they share at least MIN_LEAD tokens, the lead runs once for all of
them and each prompt's own tokens run against its keys and values (`_prompts_after_a_shared_lead`); the same holds
for generation's prefill (grpokit.trainer.generation).

Under gradient checkpointing (the GPU recipes') a layer's forward runs again in the backward: transformers drops
the cache from a checkpointed layer for that reason (a second run would write it twice). Here neither cache is
written twice: the prompts' cache records each layer's keys and values once (the replay gets its own back, which
is all the prompt attended to), and the rows' cache is read-only (each call returns the prompt's keys and values
joined to the row's own, storing nothing), so the layers are told to keep it (`_can_checkpoint_with_cache`, on
each layer for the two forwards). Only with non-reentrant checkpointing (transformers' default): the reentrant
kind runs the forward without grad, so the recorded keys would carry none.

Used where it is the same computation: one process (no DDP, DeepSpeed or FSDP wrapper, whose reducers expect one
forward per backward), text only, no MoE aux loss, no reentrant gradient checkpointing, on a model grpokit.trainer.ownpasses
finds proven (transformers' plain `DynamicLayer` cache in every layer, a family tests/trainer/test_ownpasses.py compares), while
the first step's check agrees with TRL's method; and in a micro-batch whose prompts repeat. Otherwise, or with
`sampling.reuse_prefix: false`, TRL's method runs.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from grpokit.trainer import ownpasses
from grpokit import trl_compat
from grpokit.planning.moments import MIN_LEAD  # the plan's and the pass's shortest lead are one

# Keyword arguments of TRL's method that carry images or extra token types: any of them set, TRL's method runs.
_MULTIMODAL = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
               "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


class Tally:
    """Prompt tokens the loss pass computed and the ones it took from another copy's, over the trainer's life."""

    def __init__(self):
        self.computed = 0
        self.shared = 0


def fits(trainer) -> bool:
    """Whether this trainer's loss pass can share prompts (see the module's docstring): fixed for its life."""
    from accelerate.utils import DistributedType

    if trainer.accelerator.num_processes != 1 or trainer.accelerator.distributed_type != DistributedType.NO:
        return False
    if trainer._is_vlm:
        return False
    return ownpasses.verdict(trainer.model.config).runs


def checkpointed_layers(model) -> list:
    """`model`'s layers that gradient checkpointing is on for (the backward runs their forward again): asked of the
    layers themselves at each pass, since the trainer turns checkpointing on when it trains."""
    return [m for m in model.modules() if isinstance(m, trl_compat.checkpointing_layer()) and m.gradient_checkpointing]


def reentrant(layers: list) -> bool:
    """Whether checkpointed `layers` are checkpointed the reentrant way, whose forward keeps no grad (nothing to
    record); all of a model's layers are checkpointed alike."""
    if not layers:
        return False
    how = getattr(getattr(layers[0], "_gradient_checkpointing_func", None), "keywords", {})
    return how.get("use_reentrant", True) is not False


def _caches():
    """The two caches (classes made on first use: transformers is imported late): the prompts' that records each
    layer's keys and values once, and the rows' that reads the prompts' without storing anything."""
    from transformers import DynamicCache

    class Recording(DynamicCache):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.recorded = set()

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if layer_idx in self.recorded:  # a checkpointed layer run again in the backward: it attended to what the
                layer = self.layers[layer_idx]  # cache held before it (a shared prefix, or nothing) and to itself
                held = layer.keys.size(-2) - key_states.size(-2)
                return (torch.cat([layer.keys[..., :held, :], key_states], dim=-2),
                        torch.cat([layer.values[..., :held, :], value_states], dim=-2))
            self.recorded.add(layer_idx)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    class ReadOnly(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            layer = self.layers[layer_idx]
            return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)

    return Recording, ReadOnly


@contextmanager
def _cache_kept_under_checkpointing(layers: list):
    """Checkpointed `layers` keep the cache they are given (the caches above are safe to run again), for the forwards
    inside; the layers' own rule comes back after (a replay in the backward reuses the forward's arguments)."""
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache




def common_prefix(prompts: list[torch.Tensor]) -> int:
    """How many leading tokens every one of `prompts` (each its real tokens) shares, leaving each at least two of its
    own (one its own pass computes, and the last, which every row computes for itself); 0 under MIN_LEAD."""
    room = min(len(p) for p in prompts) - 2
    if len(prompts) < 2 or room < MIN_LEAD:
        return 0
    first = prompts[0][:room]
    same = torch.stack([p[:room] == first for p in prompts[1:]]).all(dim=0)
    lead = room if bool(same.all()) else int(same.to(torch.int8).argmin())
    return lead if lead >= MIN_LEAD else 0


def logps_and_entropies(trainer, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                        compute_entropy: bool, tally: Tally, checkpointed: list = ()
                        ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """TRL's `(per-token log-probs, entropies)` of the last `logits_to_keep` tokens of `input_ids` (left-padded
    prompts, then right-padded completions), each distinct prompt computed once, and the lead they all share (a
    system text, tool schemas, worked examples) once for all of them; None where no prompt repeats and none shares a
    lead. `checkpointed`: the model's layers under (non-reentrant) gradient checkpointing, `checkpointed_layers(model)`.

    With a shared lead of C tokens, prompt i (of n real tokens) is computed as the lead (once), then its own tokens
    but the last against the lead's keys and values, right-aligned after it (padding between, masked), then each row:
    the last prompt token and the completion. Every token is placed at its position within its own prompt (the lead at
    0..C-1, the prompt's last token at n-1): TRL places them at their column, further on by the prompt's left
    padding. Rotary embeddings make that the same attention (every position of a row shifted alike), to float
    rounding; a model without them (absolute position embeddings) gets no lead."""
    width = input_ids.size(1) - logits_to_keep  # the prompts' columns
    if width < 2:
        return None
    prompts = torch.cat([input_ids[:, :width], attention_mask[:, :width]], dim=1)
    distinct, row_of = torch.unique(prompts, dim=0, return_inverse=True)
    lengths = distinct[:, width:].sum(dim=1)  # each distinct prompt's real tokens (left-padded)
    # the lead's tokens sit at other absolute positions than TRL's: the same attention only under rotary embeddings
    lead = (common_prefix([d[width - n:width] for d, n in zip(distinct, lengths.tolist(), strict=True)])
            if trl_compat.rotary_positions(model.config) else 0)
    if len(distinct) == len(prompts) and not lead:
        return None
    recording, read_only = _caches()
    rest = input_ids[:, width - 1:]
    labels = rest.masked_fill(attention_mask[:, width - 1:] == 0, -100)
    shifted = torch.full_like(labels, -100)
    shifted[:, :-1] = labels[:, 1:]  # column j is scored on the token after it, as TRL's shift does
    with trainer.accelerator.autocast(), _cache_kept_under_checkpointing(checkpointed):
        # all but each prompt's last token: a row's first log-prob needs that token's output, which its own
        # completion's labels decide, so it is computed per row below
        if lead:
            cache, held_mask = _prompts_after_a_shared_lead(model, recording, distinct, lengths, width, lead)
            mask = torch.cat([held_mask.index_select(0, row_of), attention_mask[:, width - 1:]], dim=1)
            kw = {"position_ids": (lengths.index_select(0, row_of) - 1)[:, None]
                  + torch.arange(rest.size(1), device=rest.device)}
        else:
            cache = recording(config=model.config)
            model(input_ids=distinct[:, :width - 1], attention_mask=distinct[:, width:2 * width - 1], cache=cache,
                  use_cache=True, logits_to_keep=1)
            mask, kw = attention_mask, {}
        copies = read_only(ddp_cache_data=[(layer.keys.index_select(0, row_of), layer.values.index_select(0, row_of))
                                           for layer in cache.layers], config=model.config)
        out = model(input_ids=rest, attention_mask=mask, cache=copies, shift_labels=shifted, fused_lm_head=True, **kw)
    computed = int(lengths.sum()) - lead * (len(distinct) - 1)  # the distinct prompts' real tokens, the lead once
    tally.computed += computed
    tally.shared += int(attention_mask[:, :width].sum()) - computed
    return out.log_probs[:, :logits_to_keep], (out.entropy[:, :logits_to_keep] if compute_entropy else None)


def _prompts_after_a_shared_lead(model, recording, distinct: torch.Tensor, lengths: torch.Tensor, width: int,
                                 lead: int) -> tuple:
    """The distinct prompts' keys and values but their last token's, the `lead` tokens they share computed once:
    their cache, laid out [lead | padding | each prompt's own tokens], and its attention mask. Each token at its
    position within its prompt."""
    first = width - int(lengths[0])
    shared = recording(config=model.config)
    model(input_ids=distinct[:1, first:first + lead], attention_mask=distinct[:1, width + first:width + first + lead],
          position_ids=torch.arange(lead, device=distinct.device)[None], cache=shared, use_cache=True, logits_to_keep=1)
    own = lengths - lead - 1  # each prompt's tokens after the lead, its last one left out
    room = int(own.max())
    columns = torch.arange(room, device=distinct.device)
    start = (room - own)[:, None]  # right-aligned: padding first
    real = columns[None] >= start
    # a prompt's own tokens end one before its last token, at column width - 2 of `distinct`
    taken = (width - 1 - room + columns)[None].expand(len(distinct), -1).clamp(min=0)
    ids = torch.where(real, distinct[:, :width].gather(1, taken), 0)
    held_mask = torch.cat([torch.ones(len(distinct), lead, dtype=real.dtype, device=real.device), real], dim=1).long()
    positions = (lead + columns[None] - start).clamp(min=lead)
    cache = recording(ddp_cache_data=[(layer.keys.expand(len(distinct), -1, -1, -1),
                                       layer.values.expand(len(distinct), -1, -1, -1)) for layer in shared.layers],
                      config=model.config)
    model(input_ids=ids, attention_mask=held_mask, position_ids=positions, cache=cache, use_cache=True,
          logits_to_keep=1)
    return cache, held_mask


class SharedPromptMixin:
    """Put before `GRPOTrainer` (or a subclass) in the bases: its log-probability pass goes through
    `logps_and_entropies` where it fits, checked against TRL's method on its first micro-batch (grpokit.trainer.ownpasses)."""

    def __init__(self, *args, reuse_prefix: bool = True, **kwargs):
        self.own_pass_check = getattr(self, "own_pass_check", None) or ownpasses.FirstStepCheck()
        super().__init__(*args, reuse_prefix=reuse_prefix, **kwargs)
        self.shared_prompt_tally = Tally()
        self._share_prompts = reuse_prefix and not trl_compat.logprob_internals_problems() and fits(self)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        checkpointed = checkpointed_layers(model) if self._share_prompts else []
        plain = (not self._share_prompts or compute_aux_loss or reentrant(checkpointed)
                 or any(multimodal.get(k) is not None for k in _MULTIMODAL) or set(multimodal) - set(_MULTIMODAL))
        if plain:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):  # TRL's chunks, each shared where its prompts repeat
            ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
            tally = self.shared_prompt_tally
            counted = (tally.computed, tally.shared)
            done = logps_and_entropies(self, model, ids, mask, logits_to_keep, compute_entropy, tally, checkpointed)
            if done is not None and self.own_pass_check.pending("loss") and not self._agrees(model, ids, mask,
                                                                                              logits_to_keep, done):
                self._share_prompts, done = False, None  # TRL's method, from this micro-batch on
                tally.computed, tally.shared = counted
            if done is None:
                done = super()._get_per_token_logps_and_entropies(model, ids, mask, logits_to_keep,
                                                                  compute_entropy=compute_entropy)[:2]
                self.shared_prompt_tally.computed += int(mask[:, :mask.size(1) - logits_to_keep].sum())
            logps.append(done[0])
            entropies.append(done[1])
        return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

    def _agrees(self, model, ids, mask, logits_to_keep, done) -> bool:
        """The first-step check (grpokit.trainer.ownpasses): TRL's log-probabilities of this micro-batch, without gradient,
        against ours; under dropout both computed again without it (each pass would draw its own masks)."""
        again = ownpasses.draws_dropout(model)
        with torch.no_grad(), ownpasses.dropout_off(model):
            theirs = super()._get_per_token_logps_and_entropies(model, ids, mask, logits_to_keep)[0]
            ours = logps_and_entropies(self, model, ids, mask, logits_to_keep, False, Tally())[0] if again else done[0]
        found = ownpasses.disagreement(ours.detach(), theirs, mask[:, -logits_to_keep:])
        return self.own_pass_check.judge(self, "loss", found, ownpasses.compute_dtype(self, model),
                                         ownpasses.attention_of(model))
