"""A model's config.json proven before any run reads it: every size the plan reads a whole number within bounds,
then the architecture built by transformers on torch's meta device (no memory) within a time bound, then counted by
the plan. A config.json is data the user (or whoever shared the folder) wrote: believed, a size of 10^9 layers hangs
the plan, a negative one plans negative memory, and one transformers cannot build passes `--check` and fails at
launch with a library traceback.

    from grpokit.planning.proof import problems
    found = problems("/models/my-llama")   # [] or one Problem per fault, naming the config's key and its file

Only configs from outside grpokit are proven: a local folder's or the Hugging Face cache's. The shipped configs and
the built-in models are built by the tests.
"""

from __future__ import annotations

import threading

from grpokit.errors import Problem
from grpokit.planning import architecture

BUILD_SECONDS = 60.0  # building a decoder of 1,000 layers on the meta device takes a few seconds on a slow core
# The sizes the plan reads (grpokit.planning.architecture.dims), each a whole number from 1 to its bound: far above
# any released model (the largest have ~130 layers, a hidden size of ~25,000, vocabularies of ~260,000), far below
# what hangs the plan or overflows its sums. SIZES are required where the plan counts the family; OPTIONAL_SIZES may
# be absent or null (the config class derives them).
SIZES = {
    "num_hidden_layers": 1_000,
    "hidden_size": 1 << 17,
    "num_attention_heads": 10_000,
    "vocab_size": 10_000_000,
    "intermediate_size": 1 << 20,
}
OPTIONAL_SIZES = {
    "num_key_value_heads": 10_000,
    "head_dim": 1 << 16,
    "max_position_embeddings": 1 << 27,
    "linear_key_head_dim": 1 << 16,
    "linear_value_head_dim": 1 << 16,
    "linear_num_key_heads": 10_000,
    "linear_num_value_heads": 10_000,
    "linear_conv_kernel_dim": 1_024,
    "full_attention_interval": 1_000,
}
MAX_PARAMETERS = 10**13  # ten trillion: a count above it is a config's fault, not a model anyone trains here
BUILT = "model_type"  # the key a config that cannot be built or counted is refused under: it picks the architecture


def _one_line(err: BaseException) -> str:
    """An exception as one short line: its type and its message's words."""
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"


def _text(config: dict, aliases: dict) -> dict:
    """The decoder's keys under their canonical names, each (the key as the file writes it, its value): a composite
    config's `text_config`, and a family's own names (GPT-2's `n_layer` for `num_hidden_layers`, from transformers'
    `attribute_map`)."""
    nested = isinstance(config.get("text_config"), dict)
    own = {stored: canonical for canonical, stored in aliases.items() if isinstance(stored, str)}
    return {own.get(k, k): (f"text_config.{k}" if nested else k, v)
            for k, v in (config["text_config"] if nested else config).items()}


def size_problems(config: dict, file: str, aliases: dict | None = None) -> list[Problem]:
    """One problem per size the plan reads that is not a whole number within its bound (missing too, in a family the
    plan counts), and a key-value head count that does not divide the attention heads.

    >>> size_problems({"num_hidden_layers": 10**9}, "config.json")[0].format()
    'config.json: num_hidden_layers: must be a whole number from 1 to 1,000 (got 1000000000)'
    """
    sizes = _text(config, aliases or {})
    try:  # a family the plan counts needs each of SIZES; for another, a size it has is still bounded for the build
        planned = isinstance(config.get("model_type"), str) and bool(architecture.family(architecture.text_config(config)))
    except Exception:  # noqa: BLE001 - NotModelled, or a value the family's own reading trips on: the build says which
        planned = False
    required = SIZES if planned else {}
    found = []
    for key, high in {**SIZES, **OPTIONAL_SIZES}.items():
        written, value = sizes.get(key, (key, None))
        if value is None and key not in required:
            continue
        if key not in sizes:
            found.append(Problem(key, "is missing: the memory plan reads it", file=file))
        elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            found.append(Problem(written, f"must be a whole number from 1 to {high:,}", value, file=file))
    (_, heads), (_, kv), (_, hidden), (_, head_dim) = (sizes.get(k, (k, None)) for k in
                                                       ("num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim"))
    if not found and isinstance(heads, int) and kv is not None and heads % kv:
        found.append(Problem(sizes["num_key_value_heads"][0], f"must divide num_attention_heads ({heads})", kv, file=file))
    if not found and isinstance(heads, int) and isinstance(hidden, int) and head_dim is None and hidden < heads:
        found.append(Problem(sizes["num_attention_heads"][0], f"is more than hidden_size ({hidden}) and head_dim is not "
                             "set: each head would be 0 wide", heads, file=file))
    return found


def _build(config, timeout: float) -> str | None:
    """Build `config`'s causal LM on the meta device in a thread; why it could not (its exception in one line, or the
    time bound passed), None when it built. The thread is a daemon: one past the bound is left behind, never waited
    for, and ends with the process that refuses the recipe."""
    outcome: list = []

    def build():
        try:
            import torch
            from transformers import AutoModelForCausalLM

            with torch.device("meta"):
                AutoModelForCausalLM.from_config(config)
            outcome.append(None)
        except Exception as err:  # noqa: BLE001 - whatever transformers raises for this config is the finding
            outcome.append(_one_line(err))

    worker = threading.Thread(target=build, name="grpokit-config-proof", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        return f"building it on the meta device took over {timeout:g} s"
    return outcome[0]


def problems(name_or_path: str, trust_remote_code: bool = False, timeout: float = BUILD_SECONDS) -> list[Problem]:
    """What is wrong with the config.json of the model at `name_or_path` (a local folder or a cached hub model), each
    one line naming the key and the file; [] when it is sound, or when it is grpokit's own or not reachable offline
    (the plan says so itself). A `trust_remote_code` model's own code is not run to prove it: its sizes are checked."""
    from grpokit import files
    from grpokit.errors import RecipeError

    path = architecture.outside_config_file(name_or_path)
    if path is None:
        return []
    file = str(path)
    try:
        config = files.read_json(path, key="model.name_or_path")  # a regular file, bounded, a JSON object
    except RecipeError as err:
        return err.problems
    from transformers import CONFIG_MAPPING

    kind = config.get("model_type")
    known = isinstance(kind, str) and kind in CONFIG_MAPPING
    if not known and not trust_remote_code:
        return [Problem("model_type", "is not a model type transformers knows", kind,
                        allowed="a model_type of this transformers (e.g. llama, qwen2, qwen3), or "
                                "model.trust_remote_code: true for a model that ships its own code", file=file)]
    aliases = {}
    if known:
        cls = CONFIG_MAPPING[kind]
        text_cls = (getattr(cls, "sub_configs", None) or {}).get("text_config")
        aliases = {**getattr(text_cls, "attribute_map", {}), **getattr(cls, "attribute_map", {})}
    found = size_problems(config, file, aliases)
    if found or not known:
        return found
    try:
        built = CONFIG_MAPPING[kind](**{k: v for k, v in config.items() if k != "model_type"})
    except Exception as err:  # noqa: BLE001 - a config its own class refuses is the user's finding, said in one line
        return [Problem(BUILT, f"transformers cannot read this config ({_one_line(err)})", file=file)]
    why = _build(built, timeout)
    if why:
        return [Problem(BUILT, f"transformers cannot build this config's model ({why})", file=file)]
    return _count_problems(config, file)


def _count_problems(config: dict, file: str) -> list[Problem]:
    """The plan counts the config or says it does not model it (`NotModelled`: the plan is then not available, and
    the run goes on); any other failure, or a count that is not a positive number within bounds, refuses it."""
    try:
        total = architecture.param_counts(config)["total"]
    except architecture.NotModelled:
        return []
    except Exception as err:  # noqa: BLE001 - a built config the plan misreads must not reach the plan
        return [Problem(BUILT, f"the memory plan cannot count this config's model ({_one_line(err)})", file=file)]
    if not (isinstance(total, int) and 0 < total <= MAX_PARAMETERS):
        return [Problem(BUILT, "the memory plan counts a parameter total outside its bounds", total,
                        allowed=f"1 to {MAX_PARAMETERS:,}", file=file)]
    return []
