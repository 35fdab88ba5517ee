"""DAPO dynamic sampling on TRL 1.16's GRPOTrainer: train only on prompt groups whose reward varies.

Why: when all `num_generations` completions of a prompt get the same reward, eq. 8.1 gives every one of
them advantage 0, so the group fills a slot of the batch and teaches nothing. DAPO (Yu et al. 2025, §3.2)
drops such groups and samples more prompts until the batch is full of groups that carry signal.

How: `DynamicSamplingGRPOTrainer._generate_and_score_completions` calls TRL's own version once per
generation *round*, reads the rewards TRL gathered across processes, keeps the groups whose metric
(total weighted reward, or one named reward) has a spread (std > `STD_EPS`), and draws further prompts
from an independent seeded stream until every process holds a full generation batch of kept groups, or
`max_rounds` rounds have run. Kept groups are concatenated (prompts left-padded, completions
right-padded) and `num_items_in_batch` is recomputed for what is kept. Advantages are TRL's own; with
`scale_rewards` "group" or "none" a group's advantages depend on that group only, so mixing rounds is
exact ("batch" scaling and "normalize_then_sum" would mix rounds' statistics, so they are refused).

Under vLLM (`use_vllm`) TRL adds per-row tensors to a round's output -- the log-probs vLLM sampled each token with
(`sampling_per_token_logps`) and its importance-sampling ratio (`importance_sampling_ratio`, one per sequence in
the `sequence_*` modes) -- and they are cut and padded with their rows like the others, so the correction of a
kept row is that row's own.

Short batch (max_rounds ran out): the missing slots are filled with zero-spread groups from the rounds
already generated, with advantage 0 *and* loss mask 0 (through TRL's `tool_mask`), so they add no policy,
KL or entropy term and no tokens to `num_items_in_batch`; the kept groups' token normalisation (loss_type
dapo / bnpo / cispo) is exactly what it would be for a batch of only them. Loss types that average per
sequence over the rows of a micro-batch (grpo, dr_grpo, sapo, luspo) still count a filler row as a row,
exactly as vanilla GRPO counts a zero-advantage group. Every such step logs a warning and
`sampling/filled_short = 1`; nothing is filled silently.

Several processes: each process keeps its own groups, which requires `per_device_train_batch_size x
steps_per_generation` to be a multiple of `num_generations` (checked at init). Rewards are gathered, so
every process sees every process's keep mask and takes the same decision about another round. A process
that fills first discards its surplus kept groups from later rounds.

Metrics per generation: `sampling/rounds`, `sampling/frac_groups_dropped`, `sampling/prompts_consumed`,
`sampling/filled_short`, `sampling/frac_groups_filled`, and `sampling/generated/rewards/<name>/mean`: each
reward's mean over everything generated in the step, kept or dropped (the trained batch's own leans toward 1/2,
having only groups with a spread). TRL's reward and completion-length metrics are
recomputed for the trained batch (so `frac_reward_zero_std` is 0 unless a step was filled); metrics TRL
takes from data we do not keep per row (reward functions' `log_metric`, vLLM importance-sampling stats)
are averaged over rounds. The completions table (`log_completions`) shows the last generated rows.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F
from trl import GRPOTrainer

from grpokit.config.combinations import batch_level_knobs, check_group_layout, sampling_settings
from grpokit.config.sections import TOTAL_REWARD
from grpokit import trl_compat
from grpokit.trl_compat import TrlInternalsError, check_trl_internals

nanstd = trl_compat.nanstd()  # TRL's own, so group stds match GRPOTrainer's to the bit

logger = logging.getLogger(__name__)

# A group is kept when the std of its metric exceeds this. Above float32 noise (rewards computed two ways
# that should tie can differ by ~1e-8), far below any real reward difference.
STD_EPS = 1e-6
# Mixed into the extra-prompt seed so the stream is independent of anything else seeded with `args.seed`.
_STREAM_SALT = 0x5D5A

# Output keys of `_generate_and_score_completions` that are per-row, with how to pad them to a common width.
_LEFT_PADDED = {"prompt_ids": "pad", "prompt_mask": 0}
_RIGHT_PADDED = {
    "completion_ids": "pad",
    "completion_mask": 0,
    "tool_mask": 1,  # TRL pads it with 1 too
    "old_per_token_logps": 0.0,
    "ref_per_token_logps": 0.0,
    "sampling_per_token_logps": 0.0,
    "importance_sampling_ratio": 1.0,
}
_PADS = {**_LEFT_PADDED, **_RIGHT_PADDED}
_PER_ROW = {"advantages"}
_RECOMPUTED = {"num_items_in_batch"}


def prompt_stream(num_rows: int, seed: int, key: tuple[int, ...]):
    """An endless stream of dataset indices: seeded permutations one after another, reproducible from `key`.

    A fresh stream per generation call (`key` = step position) needs no checkpointed state, so a resumed run
    draws the same extra prompts, and the main dataloader's sampler is never touched.

    >>> sorted(next_n(prompt_stream(3, 0, (0,)), 3))
    [0, 1, 2]
    """
    rng = np.random.default_rng([_STREAM_SALT, seed, *key])
    while True:
        yield from rng.permutation(num_rows).tolist()


def next_n(stream, n: int) -> list[int]:
    return [next(stream) for _ in range(n)]


def group_spread_mask(values: torch.Tensor, num_generations: int, eps: float = STD_EPS) -> torch.Tensor:
    """True for each group of `num_generations` consecutive values whose (NaN-ignoring, unbiased) std > eps.

    >>> group_spread_mask(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2).tolist()
    [False, True]
    """
    std = nanstd(values.view(-1, num_generations), dim=1)
    return torch.isfinite(std) & (std > eps)


def total_reward(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """TRL 1.16's r of eq. 8.1: weighted sum over reward functions, NaN where every function returned None.

    >>> total_reward(torch.tensor([[1.0, float("nan")], [float("nan")] * 2]), torch.tensor([2.0, 1.0])).tolist()
    [2.0, nan]
    """
    total = (rewards_per_func * weights.to(rewards_per_func.device)).nansum(dim=1)
    total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return total


def _pad_width(t: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    missing = width - t.size(1)
    return F.pad(t, (missing, 0) if left else (0, missing), value=value) if missing else t


class DynamicSamplingGRPOTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` with DAPO dynamic sampling; identical to it when `sampling["dynamic"]` is false.

    Constructed like GRPOTrainer, plus `sampling`::

        trainer = DynamicSamplingGRPOTrainer(model=model, reward_funcs=[char_fraction], args=GRPOConfig(...),
                                             train_dataset=ds, sampling={"dynamic": True, "max_rounds": 4})
    """

    def __init__(self, *args, sampling: dict | None = None, **kwargs):
        sampling_settings(sampling)  # types and keys, before the model loads
        super().__init__(*args, **kwargs)
        self.sampling = sampling_settings(sampling, self.reward_func_names)
        self._stash_rewards = self._stash_lengths = None
        self._prompt_rows = None
        self._warned_short = False
        if not self.sampling["dynamic"]:
            try:
                check_trl_internals(self)
            except TrlInternalsError as err:  # nothing relies on them with dynamic sampling off
                logger.warning("%s", err)
            return
        check_trl_internals(self)
        if not (hasattr(self.train_dataset, "__getitem__") and hasattr(self.train_dataset, "__len__")):
            raise ValueError("dynamic sampling draws extra prompts by index, so it needs a map-style "
                             "train_dataset, not an IterableDataset; load the dataset without streaming.")
        if self._is_vlm:
            raise ValueError("dynamic sampling does not support vision-language inputs yet; "
                             "set sampling.dynamic: false.")
        if batch_level_knobs(self.scale_rewards, self.multi_objective_aggregation):
            raise ValueError(
                f"dynamic sampling needs per-group advantages (scale_rewards 'group' or 'none' with "
                f"multi_objective_aggregation 'sum_then_normalize'), got scale_rewards={self.scale_rewards!r}, "
                f"multi_objective_aggregation={self.multi_objective_aggregation!r}: batch-level statistics would "
                f"mix the rounds a batch is built from."
            )
        check_group_layout(self.args.per_device_train_batch_size, self.args.steps_per_generation, self.num_generations)

    # -- what TRL computes inside one round, kept for the selection ---------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._stash_rewards = rewards_per_func  # gathered over processes, process-major
        return rewards_per_func

    def _generate(self, prompts):
        out = super()._generate(prompts)
        if self.sampling["dynamic"]:
            # Same per-row quantities TRL logs as completions/*, so they can be logged for the trained rows.
            completion_ids, tool_mask = out[1], out[2]
            device = self.accelerator.device
            lengths = [sum(m) for m in tool_mask] if tool_mask is not None else [len(ids) for ids in completion_ids]
            stop = {*self.eos_token_ids, self._tokenizer.pad_token_id}
            truncated = [ids[-1] not in stop for ids in completion_ids]
            self._stash_lengths = (torch.tensor(lengths, device=device, dtype=torch.float32),
                                   torch.tensor(truncated, device=device))
        return out

    # -- the round loop --------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        if not self.sampling["dynamic"] or not self.model.training:
            return super()._generate_and_score_completions(inputs)
        G, nproc, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        target = len(inputs) // G  # groups per process
        outer_metrics, round_metrics = self._metrics["train"], []
        kept, spare = [], []  # (round output, local group index) for kept groups / zero-spread fill candidates
        kept_per_rank = torch.zeros(nproc, dtype=torch.long)
        dropped = generated = 0
        stream = None
        for rnd in range(1, self.sampling["max_rounds"] + 1):
            if rnd > 1:
                stream = stream or prompt_stream(len(self.train_dataset), self.args.seed, self._stream_key())
                inputs = self._extra_inputs(next_n(stream, nproc * target)[rank * target:(rank + 1) * target])
            self._stash_rewards = None
            self._metrics["train"] = defaultdict(list)  # this round's TRL metrics, kept apart
            try:
                out = super()._generate_and_score_completions(inputs)
            finally:
                round_metrics.append(self._metrics["train"])
                self._metrics["train"] = outer_metrics
            rewards = self._stash_rewards
            if rewards is None or rewards.size(0) != nproc * len(inputs):
                raise TrlInternalsError("TRL's _generate_and_score_completions no longer passes the gathered "
                                        "rewards through _calculate_rewards as expected")
            keep_by_rank = group_spread_mask(self._metric_values(rewards), G).view(nproc, target).cpu()
            out["_rewards"] = rewards.view(nproc, len(inputs), -1)[rank]
            out["_lengths"], out["_truncated"] = self._stash_lengths
            generated += nproc * target
            dropped += int((~keep_by_rank).sum())
            if rnd == 1 and bool(keep_by_rank.all()):  # nothing to drop: TRL's batch as is
                return self._finish(out, round_metrics, rounds=1, dropped=0, generated=generated, filled=0)
            for g in range(target):
                if keep_by_rank[rank, g] and len(kept) < target:
                    kept.append((out, g))
                elif not keep_by_rank[rank, g] and len(spare) < target:
                    spare.append((out, g))
            kept_per_rank += keep_by_rank.sum(dim=1)
            if bool((kept_per_rank >= target).all()):
                break
        fill = spare[: target - len(kept)]
        filled_global = int((target - kept_per_rank.clamp(max=target)).sum())
        if filled_global and self.accelerator.is_main_process:
            self._warn_short(fewest=int(kept_per_rank.min()), target=target)
        batch = self._assemble(kept, fill)
        return self._finish(batch, round_metrics, rounds=rnd, dropped=dropped, generated=generated,
                            filled=filled_global)

    def _warn_short(self, fewest: int, target: int) -> None:
        """The rounds ran out before every process had `target` groups with a spread: say so, advice once."""
        advice = "" if self._warned_short else (
            " If this recurs, raise sampling.max_rounds or check that the reward can differ between "
            "completions of one prompt (later occurrences are reported in one line).")
        self._warned_short = True
        logger.warning(  # the step being generated for, counted from 1 as the console counts
            "dynamic sampling ran out of generation rounds at step %d (sampling.max_rounds=%d): only %d of %d "
            "prompt groups (on the process with the fewest) had a spread in '%s'. Those are trained on; the "
            "other %d slots hold zero-spread groups masked out of the loss (advantage 0, no tokens counted), "
            "and the step logs sampling/filled_short=1.%s",
            self.state.global_step + 1, self.sampling["max_rounds"], fewest, target, self.sampling["metric"],
            target - fewest, advice)

    def _metric_values(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """One value per completion: TRL's weighted total (eq. 8.1's r), or the named reward's column."""
        if self.sampling["metric"] != TOTAL_REWARD:
            return rewards_per_func[:, self.reward_func_names.index(self.sampling["metric"])]
        return total_reward(rewards_per_func, self.reward_weights)

    def _stream_key(self) -> tuple[int, int]:
        # Unique per generation call, and the same after a resume (global_step is restored; checkpoints fall on
        # optimizer-step boundaries, so the micro-step position within a step is restored too).
        return (self.state.global_step, self._step % self.args.gradient_accumulation_steps)

    def _extra_inputs(self, indices: list[int]) -> list[dict]:
        """Dataset rows for `indices`, each repeated num_generations times as RepeatSampler lays them out."""
        if self._prompt_rows is None:  # the same columns the main dataloader hands over
            self._prompt_rows = self._remove_unused_columns(self.train_dataset, description="training")
        rows = [self._prompt_rows[i] for i in indices]
        return self.data_collator([dict(row) for row in rows for _ in range(self.num_generations)])

    # -- building the trained batch and its metrics -------------------------------------------------------

    def _assemble(self, kept, fill) -> dict:
        """Concatenate the chosen groups' rows into one batch, padding to a common width."""
        G = self.num_generations
        picks = kept + fill
        keys = list(picks[0][0])
        unknown = [k for k in keys if k not in _PADS.keys() | _PER_ROW | _RECOMPUTED and not k.startswith("_")]
        if unknown:
            raise NotImplementedError(f"dynamic sampling does not know how to merge the batch key(s) {unknown} "
                                      f"across rounds; set sampling.dynamic: false for this setup.")
        pad_id = self._tokenizer.pad_token_id
        batch = {}
        for key in keys:
            if key in _RECOMPUTED or picks[0][0][key] is None:
                batch[key] = picks[0][0][key]
                continue
            parts = [out[key][g * G:(g + 1) * G] for out, g in picks]
            if key in _PADS and parts[0].dim() == 2:
                value = pad_id if _PADS[key] == "pad" else _PADS[key]
                width = max(p.size(1) for p in parts)
                parts = [_pad_width(p, width, value, left=key in _LEFT_PADDED) for p in parts]
            batch[key] = torch.cat(parts)
        if fill:
            is_fill = torch.zeros(len(picks) * G, dtype=torch.bool, device=batch["advantages"].device)
            is_fill[len(kept) * G:] = True
            batch["advantages"] = batch["advantages"].masked_fill(
                is_fill.view(-1, *[1] * (batch["advantages"].dim() - 1)), 0.0)
            tool_mask = batch.get("tool_mask")
            tool_mask = torch.ones_like(batch["completion_mask"]) if tool_mask is None else tool_mask
            batch["tool_mask"] = tool_mask * (~is_fill).unsqueeze(1).to(tool_mask.dtype)
        loss_mask = batch["completion_mask"] * batch.get("tool_mask", 1)
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()  # as TRL, over kept rows only
        return batch

    def _finish(self, batch, round_metrics, rounds, dropped, generated, filled) -> dict:
        """Log TRL's metrics for the trained rows plus the sampling metrics; drop the private keys."""
        rewards, lengths, truncated = (self.accelerator.gather(batch.pop(k))
                                       for k in ("_rewards", "_lengths", "_truncated"))
        metrics = self._metrics["train"]
        recomputed = self._batch_metrics(rewards, lengths, truncated.bool())
        for key in dict.fromkeys(k for m in round_metrics for k in m):
            if key in recomputed:
                continue
            values = [v for m in round_metrics for v in m.get(key, [])]
            if key == "num_tokens":  # cumulative count, set (not appended) by TRL
                metrics[key] = [values[-1]]
            elif values:
                metrics[key].append(sum(values) / len(values))
        for key, value in recomputed.items():
            metrics[key].append(value)
        for name in self.reward_func_names:  # everything generated, kept or dropped: rounds are the same size
            values = [v for m in round_metrics for v in m.get(f"rewards/{name}/mean", [])]
            if values:
                metrics[f"sampling/generated/rewards/{name}/mean"].append(sum(values) / len(values))
        metrics["sampling/rounds"].append(float(rounds))
        metrics["sampling/frac_groups_dropped"].append(dropped / generated)
        metrics["sampling/prompts_consumed"].append(float(generated))
        metrics["sampling/filled_short"].append(float(filled > 0))
        metrics["sampling/frac_groups_filled"].append(filled / (rewards.size(0) // self.num_generations))
        return batch

    def _batch_metrics(self, rewards_per_func, lengths, truncated) -> dict[str, float]:
        """TRL 1.16's reward and completion-length metrics (same formulas), over the trained rows."""
        out = {}
        for i, name in enumerate(self.reward_func_names):
            out[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
            out[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
        total = total_reward(rewards_per_func, self.reward_weights)
        out["reward"] = torch.nanmean(total).item()
        out["reward_std"] = nanstd(total).item()
        group_std = nanstd(total.view(-1, self.num_generations), dim=1)
        out["frac_reward_zero_std"] = torch.isclose(group_std, torch.zeros_like(group_std)).float().mean().item()
        out["completions/mean_length"] = lengths.mean().item()
        out["completions/min_length"] = lengths.min().item()
        out["completions/max_length"] = lengths.max().item()
        out["completions/clipped_ratio"] = truncated.float().mean().item()
        terminated = lengths[~truncated] if bool((~truncated).any()) else torch.zeros(1, device=lengths.device)
        out["completions/mean_terminated_length"] = terminated.mean().item()
        out["completions/min_terminated_length"] = terminated.min().item()
        out["completions/max_terminated_length"] = terminated.max().item()
        return out
