"""The generation engine's knobs (`trainer.use_vllm` and the `vllm_*` fields of TRL 1.16's `GRPOConfig`): the rules
a recipe must meet before any weight loads, and what the machine must have.

TRL 1.16 generates with transformers' `generate` unless `use_vllm` is true; then `vllm_mode` picks where vLLM runs:
`colocate` starts it inside the training process, on the same GPU, inside `vllm_gpu_memory_utilization` of the card;
`server` sends prompts to a separate `trl vllm-serve` process. Each mode reads its own knobs and ignores the other's,
so a knob of the other mode in a recipe is a mistake said now, not a silent no-op.

    >>> from grpokit.errors import Problems
    >>> p = Problems(file="r.yaml")
    >>> check_knobs({"use_vllm": True, "vllm_mode": "server", "vllm_enable_sleep_mode": True}, {}, 1, p)
    >>> [x.path for x in p.items]
    ['trainer.vllm_enable_sleep_mode']
"""

from __future__ import annotations

from grpokit.trl_compat import TRL_VERSION, VLLM_INSTALL, vllm_install_problem

# Read by VLLMGeneration only in its colocate branch (LLM(...) in the training process).
COLOCATE_KNOBS = ("vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "vllm_tensor_parallel_size",
                  "vllm_max_model_length", "vllm_model_impl")
# Read only in its server branch (VLLMClient).
SERVER_KNOBS = ("vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port")
# The server-side flags of `trl vllm-serve` a colocate knob corresponds to, for the message.
SERVE_FLAGS = {"vllm_gpu_memory_utilization": "--gpu_memory_utilization", "vllm_tensor_parallel_size": "--tensor_parallel_size",
               "vllm_max_model_length": "--max_model_len", "vllm_model_impl": "--vllm_model_impl"}


def _mode(trainer: dict) -> str:
    return trainer.get("vllm_mode", "colocate")


def check_knobs(trainer: dict, model: dict, num_processes: int, problems, where_set=lambda p: None) -> None:
    """Add a problem for each vLLM knob that contradicts the recipe: a mode's knobs under the other mode, a server
    address given twice, a tensor-parallel size the process count cannot hold, an 8-bit base (TRL raises at start)."""
    if not trainer.get("use_vllm"):
        return
    mode = _mode(trainer)
    if model.get("quantization") == "8bit":
        problems.add("model.quantization", "cannot be 8bit with trainer.use_vllm: TRL 1.16 refuses it at start-up (vLLM does "
                     "not support in-flight 8-bit quantization); use quantization 4bit (TRL loads vLLM's copy as "
                     "bitsandbytes 4-bit) or none, or set trainer.use_vllm: false", "8bit", "none, 4bit",
                     file=where_set("model.quantization"))
    if mode == "server":
        for knob in COLOCATE_KNOBS:
            if knob in trainer:
                where = (f"the server process sets it (trl vllm-serve {SERVE_FLAGS[knob]} ...)" if knob in SERVE_FLAGS
                         else "the server process owns its memory (trl vllm-serve has no sleep mode)")
                problems.add(f"trainer.{knob}", f"applies to vllm_mode colocate only; with vllm_mode server {where}",
                             trainer[knob],
                             file=where_set(f"trainer.{knob}"))
        if trainer.get("vllm_server_base_url") and ({"vllm_server_host", "vllm_server_port"} & trainer.keys()):
            given = [k for k in ("vllm_server_host", "vllm_server_port") if k in trainer]
            problems.add(f"trainer.{given[0]}", "is ignored when trainer.vllm_server_base_url is given; set the base URL or "
                         "host and port, not both", trainer[given[0]], file=where_set(f"trainer.{given[0]}"))
    else:
        for knob in SERVER_KNOBS:
            if knob in trainer:
                problems.add(f"trainer.{knob}", "applies to vllm_mode server only; with vllm_mode colocate vLLM runs in "
                             "the training process and no server is contacted", trainer[knob],
                             file=where_set(f"trainer.{knob}"))
        tp = trainer.get("vllm_tensor_parallel_size", 1)
        if isinstance(tp, int) and tp >= 1 and num_processes % tp:
            problems.add("trainer.vllm_tensor_parallel_size", f"must divide the number of processes ({num_processes}): "
                         "colocate mode groups the training processes into vLLM tensor-parallel groups", tp,
                         file=where_set("trainer.vllm_tensor_parallel_size"))


def environment(use_vllm: bool, cuda: bool, version: str | None, training: bool) -> tuple[list[str], list[str]]:
    """(problems, notes) about this machine for a recipe with `use_vllm`: where CUDA exists vLLM must be installed in
    TRL's range (else the run would fail after the weights load); without CUDA --check notes what it could not check,
    and training is refused (vLLM's PyPI wheels are CUDA builds).

    >>> environment(True, cuda=True, version=None, training=False)[0][0].split(";")[0]
    'vLLM is not installed'
    >>> environment(True, cuda=False, version=None, training=False)[1][0].split(":")[0]
    'trainer.use_vllm'
    """
    if not use_vllm:
        return [], []
    problem = vllm_install_problem(version)
    if cuda:
        return ([f"{problem} (TRL {TRL_VERSION} starts vLLM when the trainer is built, after the weights load)"]
                if problem else []), []
    installed = f"vLLM {version} installed" if version else "vLLM not installed"
    if training:
        return [f"needs a CUDA GPU: no CUDA device is visible here ({installed}); vLLM generates on the GPU it shares "
                "with training. Set trainer.use_vllm: false to generate with transformers"], []
    return [], [f"trainer.use_vllm: no CUDA GPU here, so vLLM is not checked ({installed}); on the GPU machine "
                f"--check verifies it is installed in TRL's range ({VLLM_INSTALL})"]
