"""Every TRL internal grpokit relies on beyond TRL's public API -- and every internal of the libraries under it
(transformers, torch, bitsandbytes) -- listed and checked in one place.

TRL is pinned exactly (pyproject.toml). What we use past its public API -- private methods the dynamic-sampling
trainer overrides or whose behaviour it assumes, lines that must still be in their source, trainer attributes
read, the last generation batch kept for the report, the fused LM head's tile sizes the memory plan counts --
is named here, so a TRL upgrade is this one file to port, and `check_trl_internals()` fails loudly, naming
each difference, instead of training wrong. The other libraries' internals are in `LIBRARY_INTERNALS`, each
reached through a function here and checked by `library_internals_problems()`.

Importing this module imports neither torch nor TRL (the memory planner reads `LOGPROB_TILE` from it).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings

TRL_VERSION = "1.16.0"

# Log-probs of the fused LM head are computed in tiles of trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE tokens x
# trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE vocabulary entries (read by grpokit.planning.memory).
LOGPROB_TILE = (4096, 32768)
# fp32 temporaries of one tile the fused head's torch fold (`_forward_tile` / `_backward_tile`, devices without
# Triton) holds at once; the Triton kernels fold in place. Counted in bench/plan_vs_measured.py's CPU runs.
HEAD_TEMPORARIES = {"cuda": {"forward": 0, "backward": 0}, "cpu": {"forward": 3, "backward": 7}}
_TILE_SOURCE = (("trl.kernels.chunked_logprob", "TOKEN_CHUNK_SIZE"), ("trl.trainer.utils", "_CHUNKED_LOGPROB_CHUNK_SIZE"))

# What GRPOTrainer._calculate_rewards passes every reward besides the dataset's columns ("prompt" goes as
# `prompts`; "completion" and "completion_ids" columns are not passed as such). A test reads TRL's source for it.
TRL_REWARD_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")

# GRPOTrainer methods overridden or relied on (grpokit.trainer.dynamic_sampling), with their parameters, and text that
# must still be in their source; trainer attributes the subclass reads.
SIGNATURES = {
    "_generate_and_score_completions": ("self", "inputs"),
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_generate": ("self", "prompts"),
    "_prepare_inputs": ("self", "generation_batch"),
    "_compute_loss": ("self", "model", "inputs"),
    "_remove_unused_columns": ("self", "dataset", "description"),
    "_tool_call_loop": ("self", "prompts", "prompt_ids", "completion_ids", "completions", "logprobs", "images",
                        "multimodal_fields"),
    "_save_checkpoint": ("self", "model", "trial"),
}
SOURCE_MARKERS = {
    "_generate_and_score_completions": (
        "= self._generate(prompts)",
        "self._calculate_rewards(inputs, prompts, completions, completion_ids_list)",
        '"num_items_in_batch": num_items_in_batch',
        "process_slice = slice(",
        # grpokit.tools.toolguard: an environment's tools are read from the instance, keyed by name; instance i serves sample i
        "getattr(environment, member_name)",
        "sync_tool_dict[tool.__name__] = tool",
        "observation = environment.reset(**reset_kwargs)",
        "pool.append(self.environment_factories[name]())",
        'self._logs["completion"].extend(gather_object(completions))',  # read back by generate_and_score
        'self._logs["rewards"][name].extend(rewards_per_func[:, i].tolist())',
    ),
    "_calculate_rewards": ("rewards_per_func = gather(rewards_per_func)",),
    # how a failed tool call reaches the completion (rewards/tools.py reads it): str({"error": message}); a sync tool
    # is called inline, in the trainer's thread, and any Exception it raises is its result and a counted failure
    # (grpokit.tools.toolguard bounds the call there and raises a BaseException for a fault that must stop the run)
    "_tool_call_loop": ('result = {"error": str(e)}', "content = result if isinstance(result, list) else str(result)",
                        'tool_call_results.append((name, sync_tool_dict[name](**function["arguments"])))',
                        "except Exception as e:\n                            tool_failure_count += 1"),
    "_compute_loss": ('"tool_mask" not in inputs', 'inputs["num_items_in_batch"]'),
    "_prepare_inputs": ("split_tensor_dict(generation_batch, self.args.steps_per_generation)",),
    # every checkpoint writes TRL's draft card into output_dir, which grpokit.trl_compat.no_draft_card turns off
    "_save_checkpoint": ("self.create_model_card(model_name=model_name)",),
}
# vLLM, as TRL 1.16 drives it (`trl.generation.vllm_generation.VLLMGeneration`, `GRPOTrainer.__init__`): the
# versions its `vllm` extra accepts (`trl.import_utils.is_vllm_available` warns outside them), the batch
# budget colocate mode gives vLLM's scheduler, the sleep level it uses, and the source lines the memory plan
# and `--check`'s messages follow. `check_vllm_internals()` reads them from TRL's source (vLLM need not be
# installed).
VLLM_RANGE = ("0.22.0", "0.31.0")  # inclusive, as TRL's own check
VLLM_PIN = "0.31.0"  # pyproject's `vllm` extra: inside VLLM_RANGE, resolves with grpokit's torch pin
VLLM_INSTALL = "pip install -e '.[vllm]'"
VLLM_MAX_NUM_BATCHED_TOKENS = 4096
VLLM_SLEEP_LEVEL = 2
VLLM_SOURCE_MARKERS = {
    "trl.generation.vllm_generation:VLLMGeneration._init_vllm": (
        "gpu_memory_utilization=self.gpu_memory_utilization",
        f"max_num_batched_tokens={VLLM_MAX_NUM_BATCHED_TOKENS}",
        f"self.llm.sleep(level={VLLM_SLEEP_LEVEL})",
        'quantization = "bitsandbytes"',
        "vLLM does not support in-flight 8-bit quantization",
        "max_model_len=self.max_model_length",
    ),
    "trl.generation.vllm_generation:VLLMGeneration._iter_named_params": (
        "model.merge_adapter()", "model.unmerge_adapter()"),
    "trl.generation.vllm_generation:VLLMGeneration.sync_weights": ('self.llm.wake_up(tags=["weights"])',),
    "trl.generation.vllm_generation:VLLMGeneration.generate": (
        'self.llm.wake_up(tags=["kv_cache"])', f"self.llm.sleep(level={VLLM_SLEEP_LEVEL})"),
    "trl.trainer.grpo_trainer:GRPOTrainer.__init__": (
        "max_num_seqs=args.per_device_train_batch_size",
        "* args.steps_per_generation",
    ),
    "trl.trainer.grpo_trainer:GRPOTrainer._generate_and_score_completions": (
        'output["sampling_per_token_logps"] = sampling_per_token_logps',
        'output["importance_sampling_ratio"] = vllm_importance_sampling_ratio',
    ),
    "trl.import_utils:is_vllm_available": (f'Version("{VLLM_RANGE[0]}") <= _vllm_base_version <= Version("{VLLM_RANGE[1]}")',),
}

# GRPOTrainer.__init__, as grpokit.tools.toolguard relies on it: the environment's first instance is built there (its
# constructor's fault is blamed on sample 0) and get_reward() is called per instance, with no argument.
TOOL_SOURCE_MARKERS = {
    "trl.trainer.grpo_trainer:GRPOTrainer.__init__": (
        "instance = factory()",
        "self._environment_pool[name] = [instance]",
        "return [e.get_reward() if type(e) is _env_type else None for e in environments]",
    ),
}

# GRPOTrainer's transformers generation, as grpokit.trainer.generation does it in its place (and reads it in the tool loop):
# left-padded rows, generate from them, the completion cut after the first end of sequence; a later turn's rows are
# prompt + completion + the result's tokens, concatenated, and cut to the completion's room after generation.
GENERATION_SOURCE_MARKERS = {
    "trl.trainer.grpo_trainer:GRPOTrainer._generate_single_turn": (
        'padding_side="left",\n                pad_to_multiple_of=self.pad_to_multiple_of,',
        "generation_kwargs=self.generation_kwargs,",
        "**generate_inputs, generation_config=self.generation_config",
        "completion_ids = prompt_completion_ids[:, prompt_length:]",
        "completion_mask = (sequence_indices <= eos_idx.unsqueeze(1)).int()",
        "logprobs = None  # not used in this case",
    ),
    "trl.trainer.grpo_trainer:GRPOTrainer._tool_call_loop": (
        "prompt_ids[idx_with_tool] + completion_ids[idx_with_tool] + suffix_ids",
        "excess_length = completion_tool_length + len(post_tool_ids[idx]) - self.max_completion_length",
    ),
}
GENERATION_SIGNATURE = ("self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images")

# GRPOTrainer's log-probability pass, as grpokit.trainer.shared_prompt does it in its place: positions are the rows' column
# indices (no position_ids passed), only the completion's tokens are labelled, through the fused LM head; the fused
# forward takes pre-shifted `shift_labels` and hands the rest of its keyword arguments (the cache) to the backbone.
LOGPROB_SOURCE_MARKERS = {
    "trl.trainer.grpo_trainer:GRPOTrainer._get_per_token_logps_and_entropies": (
        'model_inputs = {"input_ids": input_ids_batch, "attention_mask": attention_mask_batch}',
        "labels = input_ids_batch.masked_fill(attention_mask_batch == 0, -100)",
        "labels[:, :-logits_to_keep] = -100",
        "outputs = model(**model_inputs, labels=labels, fused_lm_head=True)",
        "all_logps.append(outputs.log_probs[:, -logits_to_keep:])",
        "return logps, entropies, aux_loss",
    ),
    "trl.trainer.utils:add_fused_lm_head": (
        "self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs",
        "backbone_outputs = getattr(self, backbone_attr)(*args, **kwargs)",
        "labels = shift_labels",
    ),
}
LOGPROB_SIGNATURE = ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
                     "compute_aux_loss", "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
                     "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids",
                     "image_position_ids")

TRAINER_ATTRIBUTES = (
    "_metrics", "_step", "_tokenizer", "_is_vlm", "accelerator", "eos_token_ids", "num_generations",
    "reward_func_names", "reward_weights", "scale_rewards", "multi_objective_aggregation", "state",
)


class TrlInternalsError(RuntimeError):
    """The installed TRL is not the one dynamic sampling was written against."""


def check_trl_internals(trainer=None) -> None:
    """Raise `TrlInternalsError` listing every TRL internal grpokit relies on that has changed.

    Checks the version pin, the signatures and key source lines of the methods overridden or relied on,
    the kernel tile sizes the memory plan assumes, and (given a trainer) the instance attributes read.

    >>> check_trl_internals()  # passes silently on trl 1.16.0
    """
    import trl
    from trl import GRPOTrainer

    problems = []
    if trl.__version__ != TRL_VERSION:
        problems.append(f"trl version is {trl.__version__}, expected {TRL_VERSION}")
    for name, expected in SIGNATURES.items():
        method = getattr(GRPOTrainer, name, None)
        if not callable(method):
            problems.append(f"GRPOTrainer.{name} is missing")
            continue
        params = tuple(inspect.signature(method).parameters)
        if params != expected:
            problems.append(f"GRPOTrainer.{name}{params} has changed; expected parameters {expected}")
            continue
        try:
            source = inspect.getsource(method)
        except (OSError, TypeError):
            source = None
        for marker in SOURCE_MARKERS.get(name, ()):
            if source is None or marker not in source:
                problems.append(f"GRPOTrainer.{name} no longer contains `{marker}`")
    problems += _tile_problems()
    problems += source_marker_problems(TOOL_SOURCE_MARKERS)
    problems += generation_internals_problems()
    problems += logprob_internals_problems()
    problems += library_internals_problems(("trl.trainer.utils:nanstd",))
    if trainer is not None and getattr(getattr(trainer, "args", None), "use_vllm", False):
        problems += vllm_internals_problems()
    if trainer is not None:
        problems += [f"trainer attribute `{a}` is missing" for a in TRAINER_ATTRIBUTES if not hasattr(trainer, a)]
    if problems:
        raise TrlInternalsError(
            f"grpokit is written against TRL {TRL_VERSION} internals (dynamic sampling, the memory plan), and these differ:\n  - "
            + "\n  - ".join(problems)
            + f"\nInstall the pinned version (pip install trl=={TRL_VERSION}) or set sampling.dynamic: false."
        )


def generation_internals_problems() -> list[str]:
    """What grpokit.trainer.generation relies on in TRL's generation that has changed: [] means it may stand in for it.

    >>> generation_internals_problems()  # [] on trl 1.16.0
    []
    """
    from trl import GRPOTrainer

    params = tuple(inspect.signature(GRPOTrainer._generate_single_turn).parameters)
    problems = [] if params == GENERATION_SIGNATURE else [
        f"GRPOTrainer._generate_single_turn{params} has changed; expected parameters {GENERATION_SIGNATURE}"]
    return problems + source_marker_problems(GENERATION_SOURCE_MARKERS)


def logprob_internals_problems() -> list[str]:
    """What grpokit.trainer.shared_prompt relies on in TRL's log-probability pass that has changed: [] means it may stand in.

    >>> logprob_internals_problems()  # [] on trl 1.16.0
    []
    """
    from trl import GRPOTrainer

    params = tuple(inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters)
    problems = [] if params == LOGPROB_SIGNATURE else [
        f"GRPOTrainer._get_per_token_logps_and_entropies{params} has changed; expected parameters {LOGPROB_SIGNATURE}"]
    return (problems + source_marker_problems(LOGPROB_SOURCE_MARKERS)
            + library_internals_problems(("transformers.modeling_layers:GradientCheckpointingLayer._can_checkpoint_with_cache",)))


def vllm_internals_problems() -> list[str]:
    """Each `VLLM_SOURCE_MARKERS` line missing from TRL's source: what the vLLM plan and messages rest on.

    >>> vllm_internals_problems()  # [] on trl 1.16.0; vLLM itself is not imported
    []
    """
    return source_marker_problems(VLLM_SOURCE_MARKERS)


def source_marker_problems(markers_by_place: dict) -> list[str]:
    """Each line of `{"module:Qualified.name": (line, ...)}` missing from that object's source."""
    import importlib

    problems = []
    for where, markers in markers_by_place.items():
        module_name, _, qualname = where.partition(":")
        try:
            obj = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            source = inspect.getsource(obj)
        except (ImportError, AttributeError, OSError, TypeError):
            problems.append(f"{where} is missing")
            continue
        problems += [f"{where} no longer contains `{m}`" for m in markers if m not in source]
    return problems


def vllm_version() -> str | None:
    """The installed vLLM's version, read from its metadata (vLLM is not imported: that takes seconds and a GPU)."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def vllm_install_problem(version: str | None) -> str | None:
    """Why this vLLM cannot serve TRL 1.16's `use_vllm`, with the command that fixes it; None when it can.

    >>> vllm_install_problem("0.31.0") is None, vllm_install_problem("0.32.1").split(";")[0]
    (True, 'vLLM 0.32.1 is installed, outside the versions TRL 1.16.0 supports (0.22.0 to 0.31.0)')
    """
    from packaging.version import InvalidVersion, Version

    fix = f"install grpokit's vllm extra: {VLLM_INSTALL} (vllm=={VLLM_PIN})"
    if version is None:
        return f"vLLM is not installed; {fix}"
    try:
        base = Version(Version(version).base_version)
    except InvalidVersion:
        return f"vLLM reports version {version!r}, which cannot be read; {fix}"
    lo, hi = VLLM_RANGE
    if not Version(lo) <= base <= Version(hi):
        return f"vLLM {version} is installed, outside the versions TRL {TRL_VERSION} supports ({lo} to {hi}); {fix}"
    return None


def _tile_problems() -> list[str]:
    import importlib

    problems = []
    for (module_name, name), expected in zip(_TILE_SOURCE, LOGPROB_TILE):
        try:
            found = getattr(importlib.import_module(module_name), name, None)
        except ImportError:
            found = None
        if found != expected:
            problems.append(f"{module_name}.{name} is {found}, the memory plan assumes {expected} (trl_compat.LOGPROB_TILE)")
    return problems


# TRL's UserWarning at every GRPOTrainer built with an environment: it speaks to the author of that call (grpokit, which
# pins TRL and checks what it relies on here), not to a recipe's user, who can do nothing about it.
EXPERIMENTAL_ENVIRONMENT = r"You are using 'environment_factory', which is an experimental feature"


@contextlib.contextmanager
def environment_factory_unwarned():
    """Build a GRPOTrainer inside this block and TRL's "environment_factory is experimental" warning is not shown
    (every other warning is)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=EXPERIMENTAL_ENVIRONMENT, category=UserWarning)
        yield


def fused_head_function():
    """The autograd function of TRL's fused LM head (`trl.kernels.chunked_logprob.ChunkedLogProbFunction`):
    grpokit.planning.measure tags what its forward and backward allocate as the plan's "logits"."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    return ChunkedLogProbFunction


def last_generation_logs(trainer) -> dict | None:
    """The last generation batch TRL keeps for its completions table (`GRPOTrainer._logs`: prompt, completion,
    rewards, advantages), or None; read by the run report."""
    return getattr(trainer, "_logs", None) or None


def no_draft_card(trainer) -> None:
    """Stop the trainer writing TRL's draft model card (`create_model_card`, called by `GRPOTrainer._save_checkpoint` into
    output_dir at every checkpoint): for a local model it reads "a fine-tuned version of [None]", and the run folder
    then holds a card that is not the run's while it trains and after a stop. grpokit writes its own once the model is
    saved (grpokit.reporting.model_card)."""
    trainer.create_model_card = lambda *args, **kwargs: None


def metric_sink(trainer):
    """`sink(key, value)`: one value of a metric TRL averages into its next log line, as it does its own
    (`GRPOTrainer._metrics[mode][key]`, mode from the model's training flag); grpokit.tools.toolguard counts limit cuts so."""
    def sink(key: str, value: float) -> None:
        trainer._metrics["train" if trainer.model.training else "eval"][key].append(value)

    return sink


def generate_and_score(trainer, rows: list[dict]) -> tuple[list[dict], float]:
    """One batch of dataset rows through `GRPOTrainer._generate_and_score_completions` (generation, the tool loop,
    every reward), read back per sample from the logs TRL keeps for its completions table: (samples, the batch's
    share of failed tool calls). A sample: its row, prompt, completion (a tool rollout's messages), the environment
    instance that served its rollout (None without one) and each reward by TRL's name for it (None where a reward returned None). Used by `--eval` of a recipe with tools
    (grpokit.trainer.rollouts); `len(rows)` must not pass `trainer.args.generation_batch_size`, the logs' length."""
    import math

    logs = last_generation_logs(trainer)
    for key in ("prompt", "completion", "advantages"):
        logs[key].clear()
    logs["rewards"].clear()
    mode = "train" if trainer.model.training else "eval"
    before = len(trainer._metrics[mode].get("tools/failure_frequency", []))
    trainer._generate_and_score_completions(rows)
    failures = trainer._metrics[mode].get("tools/failure_frequency", [])[before:]
    rewards = {name: list(values) for name, values in logs["rewards"].items()}
    environments = trainer.environments or [None] * len(rows)  # one per sample, in order, reset for its rollout
    samples = [{"row": row, "prompt": prompt, "completion": completion, "environment": environments[i],
                "rewards": {n: (None if math.isnan(v[i]) else v[i]) for n, v in rewards.items()}}
               for i, (row, prompt, completion) in enumerate(zip(rows, logs["prompt"], logs["completion"], strict=True))]
    return samples, (failures[-1] if failures else 0.0)


# ----------------------------------------------------------------------------------------------------
# Internals of the libraries under TRL (and TRL's own private helpers grpokit calls), each used only through
# the function named here, and checked: where it lives -> (the function, who relies on it and why).
LIBRARY_INTERNALS = {
    "trl.trainer.utils:nanstd": (
        "nanstd", "grpokit.trainer.dynamic_sampling: the reward std of a group exactly as GRPOTrainer computes it "
        "(NaN-ignoring, Bessel-corrected)"),
    "transformers.cache_utils:DynamicLayer.update": (
        "dynamic_cache_layer", "grpokit.planning.measure wraps it to tag as KV cache what each decode step appends "
        "(the layer's `keys` and `values` after the call)"),
    "torch.utils._python_dispatch:TorchDispatchMode": (
        "torch_dispatch", "grpokit.planning.measure: sees every tensor an operator returns, on any device"),
    "torch.utils._pytree:tree_map_only": (
        "torch_dispatch", "grpokit.planning.measure: walks an operator's nested outputs for their tensors"),
    "torch:UntypedStorage._cdata": (
        "storage_key", "grpokit.planning.measure: a storage's identity while it lives (views share it)"),
    "transformers.modeling_layers:GradientCheckpointingLayer._can_checkpoint_with_cache": (
        "checkpointing_layer", "grpokit.trainer.shared_prompt: a checkpointed layer keeps the cache it is given when this is "
        "set on it (else it drops it), and a replay in the backward reuses the forward's arguments"),
    "torch:DefaultCPUAllocator's refusal": (
        "out_of_memory", "grpokit.trainer.watch: torch's CPU allocator refuses an allocation with a plain "
        "RuntimeError whose text is the only mark of it (CUDA raises torch.OutOfMemoryError)"),
    "bitsandbytes.nn.modules:Linear4bit.support_avx512bf16_for_cpu": (
        "keep_4bit_trainable", "grpokit.trainer.models: a 4-bit layer repacks its weight for a CPU's AVX512-BF16 kernel, "
        "which has no backward, when this is true; cleared on every layer a policy loads with"),
}
_KV_UPDATE_PARAMS = ("self", "key_states", "value_states")  # DynamicLayer.update's leading parameters


def nanstd():
    """TRL's `nanstd(tensor, dim=None, keepdim=False)`: the std GRPOTrainer scales advantages by (unbiased, NaNs
    ignored). From `trl.trainer.utils`, which TRL does not document as public."""
    from trl.trainer.utils import nanstd as fn

    return fn


def dynamic_cache_layer():
    """transformers' `DynamicLayer`, one layer of the KV cache generation grows; its `update(key_states,
    value_states, ...)` appends one step and leaves the whole cache in the layer's `keys` and `values`."""
    from transformers.cache_utils import DynamicLayer

    return DynamicLayer


def plain_dynamic_cache(config) -> bool:
    """Whether transformers builds this model's generation cache from plain `DynamicLayer`s only (no sliding window,
    no indexed or quantized layer): grpokit.trainer.generation slices and joins such layers' `keys` and `values`
    (`[batch, heads, tokens, head_dim]`) and builds a cache from them with `DynamicCache(ddp_cache_data=, config=)`."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config transformers cannot read layer types from: not this path
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def rotary_positions(config) -> bool:
    """Whether the model places tokens by rotary embeddings (transformers 5's `rope_parameters` on its text config):
    attention then depends on positions' differences only, so a row's positions may all be shifted alike."""
    try:
        text = config.get_text_config(decoder=True)
    except Exception:  # not a transformers config
        return False
    return bool(getattr(text, "rope_parameters", None))


def torch_dispatch():
    """(`TorchDispatchMode`, `tree_map_only`) from torch's private `torch.utils._python_dispatch` and `_pytree`."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map_only

    return TorchDispatchMode, tree_map_only


def keep_4bit_trainable(model) -> int:
    """Keep every bitsandbytes 4-bit layer of `model` in the layout its backward reads; returns how many it holds.

    On a CPU with AVX512-BF16, `Linear4bit.forward` repacks its weight for that CPU's fast kernel the first time it
    runs without gradients in eval mode (generation) and keeps the packing afterwards, in training too, where that
    kernel has no backward: every gradient through the frozen base is dropped (torch warns "an autograd kernel was not
    registered"), so the adapters train on the wrong ones. Clearing `support_avx512bf16_for_cpu` keeps the layout
    (tests/run/test_train.py); generation on a CPU then runs the layers' plain 4-bit path. Nothing changes on a GPU."""
    from bitsandbytes.nn import Linear4bit

    layers = [module for module in model.modules() if isinstance(module, Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)


def storage_key(storage) -> int:
    """A live storage's identity (torch's private `UntypedStorage._cdata`, its C address): views share it."""
    return storage._cdata


def library_internals_problems(names=None) -> list[str]:
    """Each of `LIBRARY_INTERNALS` (or of `names`) that is missing or no longer has the shape relied on.

    >>> library_internals_problems()  # [] on the pinned torch, transformers and TRL
    []
    """
    checks = {
        "trl.trainer.utils:nanstd": _check_nanstd,
        "transformers.cache_utils:DynamicLayer.update": _check_kv_update,
        "torch.utils._python_dispatch:TorchDispatchMode": lambda: _check_dispatch(0),
        "torch.utils._pytree:tree_map_only": lambda: _check_dispatch(1),
        "torch:UntypedStorage._cdata": _check_storage_key,
        "transformers.modeling_layers:GradientCheckpointingLayer._can_checkpoint_with_cache": _check_checkpointing,
        "bitsandbytes.nn.modules:Linear4bit.support_avx512bf16_for_cpu": _check_4bit_packing,
        "torch:DefaultCPUAllocator's refusal": _check_cpu_refusal,
    }
    problems = []
    for where in names or LIBRARY_INTERNALS:
        try:
            why = checks[where]()
        except (ImportError, AttributeError, TypeError, ValueError, RuntimeError) as err:
            why = f"{type(err).__name__}: {err}"
        if why:
            problems.append(f"{where} ({LIBRARY_INTERNALS[where][1]}): {why}")
    return problems


def check_library_internals(names=None) -> None:
    """Raise `TrlInternalsError` naming each of `LIBRARY_INTERNALS` (or of `names`) that has changed."""
    problems = library_internals_problems(names)
    if problems:
        raise TrlInternalsError("grpokit relies on these library internals, and they differ from the pinned versions':\n  - "
                                + "\n  - ".join(problems))


def _check_nanstd() -> str | None:
    import torch

    params = tuple(inspect.signature(nanstd()).parameters)
    if params[:3] != ("tensor", "dim", "keepdim"):
        return f"parameters are {params}, expected ('tensor', 'dim', 'keepdim')"
    got = nanstd()(torch.tensor([1.0, 3.0, float("nan")])).item()
    return None if abs(got - 2 ** 0.5) < 1e-6 else f"std of [1, 3, nan] is {got}, expected sqrt(2) (unbiased, NaN ignored)"


CPU_REFUSAL = "DefaultCPUAllocator: can't allocate memory"  # torch's text when malloc fails (alloc_cpu.cpp)
ONEDNN_REFUSAL = "could not create a primitive"  # oneDNN's text when it cannot make a kernel, memory among the causes
NEAR_LIMIT = 512 * 2**20  # address space left under `ulimit -v` below which oneDNN's refusal is read as memory's


def out_of_memory(err: BaseException) -> bool:
    """Whether `err` is a device refusing memory: CUDA's `torch.OutOfMemoryError`, Python's `MemoryError`, torch's
    CPU allocator's refusal (a RuntimeError: its text is the mark), or oneDNN's refusal to make a kernel while this
    process is at its address-space limit (the limit measured, not guessed from the text alone)."""
    import torch

    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    if not isinstance(err, RuntimeError):
        return False
    text = str(err)
    return CPU_REFUSAL in text or (ONEDNN_REFUSAL in text and address_space_left() < NEAR_LIMIT)


def address_space_left() -> float:
    """Bytes this process may still map under RLIMIT_AS (`ulimit -v`); infinity without such a limit (grpokit.trainer.watch
    reads it for a run's capacity too)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return float("inf")
    try:
        size = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return float("inf")
    return soft - size


def _check_cpu_refusal() -> str | None:
    import torch

    try:
        torch.empty(2**60, dtype=torch.uint8)  # more than any machine has: refused at once, nothing allocated
    except RuntimeError as err:
        return None if out_of_memory(err) else f"an impossible allocation raised {type(err).__name__}: {str(err)[:120]}"
    return "an allocation of 2**60 bytes succeeded"


def checkpointing_layer():
    """transformers' `GradientCheckpointingLayer`, the base of a model's decoder layers: under gradient checkpointing
    it drops the cache a layer is given unless the layer's `_can_checkpoint_with_cache` is true, and checkpoints
    `forward` with the arguments it was called with (the backward's replay reuses them) through the layer's
    `_gradient_checkpointing_func`, a `functools.partial` of torch's checkpoint whose keywords say `use_reentrant`."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return GradientCheckpointingLayer


def _check_4bit_packing() -> str | None:
    from bitsandbytes.nn import Linear4bit

    source = inspect.getsource(Linear4bit.forward)
    for marker in ("and self.support_avx512bf16_for_cpu", "_convert_weight_packed_for_cpu("):
        if marker not in source:
            return f"Linear4bit.forward no longer contains `{marker}`"
    if "self.support_avx512bf16_for_cpu = " not in inspect.getsource(Linear4bit.__init__):
        return "Linear4bit.__init__ no longer sets `support_avx512bf16_for_cpu`"
    return None


def _check_checkpointing() -> str | None:
    layer = checkpointing_layer()
    if getattr(layer, "_can_checkpoint_with_cache", None) is not False:
        return "the class attribute `_can_checkpoint_with_cache` (False) is gone"
    source = inspect.getsource(layer.__init_subclass__)
    for marker in ("if not self._can_checkpoint_with_cache:",
                   "return self._gradient_checkpointing_func(partial(forward, self, **kwargs), *args)"):
        if marker not in source:
            return f"no longer contains `{marker}`"
    return None


def _check_kv_update() -> str | None:
    layer = dynamic_cache_layer()
    params = tuple(inspect.signature(layer.update).parameters)
    if params[:3] != _KV_UPDATE_PARAMS:
        return f"parameters are {params}, expected to start with {_KV_UPDATE_PARAMS}"
    import torch

    k = torch.zeros(1, 1, 2, 4)
    cache = layer()
    cache.update(k, k)
    cache.update(k[:, :, :1], k[:, :, :1])
    shapes = [tuple(getattr(cache, name).shape) for name in ("keys", "values")]
    return None if shapes == [(1, 1, 3, 4)] * 2 else f"after two steps of 2 and 1 tokens `keys`/`values` are {shapes}, expected 3 tokens"


def _check_dispatch(which: int) -> str | None:
    import torch

    mode, tree_map_only = torch_dispatch()
    if which == 1:
        return None if tree_map_only(torch.Tensor, lambda t: 1, [torch.zeros(1), (torch.zeros(1), "x")]) == [1, (1, "x")] \
            else "does not map (type, fn, tree) as expected"
    return None if callable(getattr(mode, "__torch_dispatch__", None)) and hasattr(mode, "__enter__") else "has no __torch_dispatch__"


def _check_storage_key() -> str | None:
    import torch

    a = torch.zeros(4)
    if storage_key(a.untyped_storage()) != storage_key(a[1:].untyped_storage()):
        return "differs between a tensor and its view"
    return None if isinstance(storage_key(a.untyped_storage()), int) else "is not an int"
