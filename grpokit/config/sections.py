"""The recipe's sections as data: our own keys with their types, defaults and ranges, and the ranges and
enumerations we add to TRL's `GRPOConfig` and PEFT's `LoraConfig` fields (TRL 1.16 accepts `beta: "high"`,
`loss_type: dapo2` or `max_completion_length: 0`, and PEFT accepts `r: 0`).

A section that a domain owns keeps its keys beside its rules: `dataset.reasoning_gym` in `grpokit.prompts.tasks`
(`REASONING_GYM`), `tools` in `grpokit.tools.tooluse` (`TOOLS`), `warm_start` in `grpokit.warm_start.section` (`WARM_START`); `validate`
composes them with these.
"""

from __future__ import annotations

from grpokit.fields import Field

SECTIONS = ("model", "lora", "dataset", "rewards", "tools", "warm_start", "trainer", "sampling", "lint")
REQUIRED_SECTIONS = ("model", "dataset", "rewards")

MODEL = {
    "name_or_path": Field(str, doc="a hub id, a local directory, builtin:tiny-llama or builtin:smollm2-135m-instruct"),
    "gguf_file": Field(str | None, None, "a GGUF checkpoint in the name_or_path directory: converted once into ~/.cache/grpokit"),
    "dtype": Field(str, "auto", "weights dtype; auto = bfloat16 on a GPU (float16 where it lacks bfloat16), float32 on CPU",
                   choices=("auto", "bfloat16", "float16", "float32")),
    "quantization": Field(str, "none", "none, 8bit, or 4bit (nf4, QLoRA)", choices=("none", "8bit", "4bit")),
    "attn_implementation": Field(str | None, None, choices=("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")),
    "trust_remote_code": Field(bool, False),
    "revision": Field(str | None, None),
    "chat_template": Field(str | None, None, "one of TRL's chat templates by name (trl.chat_template_utils), in place of the "
                           "model's own: e.g. qwen2_5, whose tool calls TRL parses, for a ChatML model"),
}

DATASET = {
    "name": Field(str | None, None, "hub dataset id"),
    "config": Field(str | None, None, "hub dataset config, e.g. main"),
    "split": Field(str, "train"),
    "path": Field(str | None, None, "local .jsonl/.json/.parquet/.csv, relative to the recipe"),
    "reasoning_gym": Field(dict | None, None, "procedural tasks generated locally: {tasks, size, seed, eval_size, eval_seed}"),
    "prompt_column": Field(str, "prompt"),
    "template": Field(str | None, None, "text with {column} placeholders; default: the prompt column as is"),
    "system_prompt": Field(str | None, None),
    "few_shot": Field(list, [], "chat messages put before every prompt's user message (after system_prompt): worked "
                      "examples, e.g. a question and the assistant's tool call: {role, content, tool_calls}",
                      shape="a list of chat messages, each {role, content} (an assistant's may hold tool_calls): "
                      "few_shot: [{role: user, content: ...}, {role: assistant, content: ...}]"),
    "answer_column": Field(str | None, None, "gold answer column; exposed to rewards as `answer`"),
    "conversational": Field(str | bool, "auto", "auto: chat format when the tokenizer has a chat template",
                            choices=("auto", True, False)),
    "max_prompt_tokens": Field(int | None, None, min=1),
    "limit": Field(int | None, None, min=1),
    "eval_path": Field(str | None, None, "held-out local file for --eval and trainer.eval_strategy, relative to the recipe"),
    "eval_split": Field(str | None, None, "held-out split of the hub dataset, e.g. test"),
    "eval_limit": Field(int | None, None, "score only the first N held-out prompts", min=1),
}

SAMPLING = {
    "dynamic": Field(bool, False, "DAPO dynamic sampling: train only on groups whose metric varies"),
    "max_rounds": Field(int, 4, "generation rounds per batch before going on with what it has", min=1),
    "metric": Field(str, "reward", "'reward' (the weighted total) or the name of one reward"),
    "reuse_prefix": Field(bool, True, "generation computes each prompt once for its copies, and starts the turn after a "
                          "tool's result from the turn before (grpokit.trainer.generation); the loss pass computes each prompt "
                          "once for its copies (grpokit.trainer.shared_prompt): the same completions and gradients, less work"),
}

LINT = {  # rule names are checked against grpokit.config.lint.RULES by validate
    "ignore": Field(list[str], [], "--check's lint rules this recipe breaks on purpose, silenced by name"),
}

REWARD_ENTRY = {
    "name": Field(str, doc="a registered reward, path/to/file.py:function, or package.module:function"),
    "weight": Field(float, 1.0),
    "args": Field(dict, {}),
}

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
TRAINER_BOUNDS = {
    "loss_type": Field(choices=LOSS_TYPES),
    "scale_rewards": Field(choices=("group", "batch", "none"), also=(True, False)),
    "importance_sampling_level": Field(choices=("token", "sequence")),
    "multi_objective_aggregation": Field(choices=("sum_then_normalize", "normalize_then_sum")),
    "vllm_mode": Field(choices=("server", "colocate")),
    "vllm_importance_sampling_mode": Field(choices=("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")),
    "beta": Field(min=0.0),
    "epsilon": Field(gt=0.0),
    "epsilon_high": Field(gt=0.0),
    "delta": Field(gt=1.0),
    "num_generations": Field(min=2),
    "num_generations_eval": Field(min=1),
    "max_completion_length": Field(min=1),
    "num_iterations": Field(min=1),
    "generation_batch_size": Field(min=1),
    "steps_per_generation": Field(min=1),
    "per_device_train_batch_size": Field(min=1),
    "per_device_eval_batch_size": Field(min=1),
    "gradient_accumulation_steps": Field(min=1),
    "learning_rate": Field(gt=0.0),
    "weight_decay": Field(min=0.0),
    "max_grad_norm": Field(min=0.0),
    "warmup_steps": Field(min=0),
    "num_train_epochs": Field(gt=0.0),
    "max_steps": Field(min=-1),
    "logging_steps": Field(gt=0.0),
    "save_steps": Field(gt=0.0),
    "save_total_limit": Field(min=1),
    "temperature": Field(gt=0.0),
    "top_p": Field(gt=0.0, max=1.0),
    "top_k": Field(min=0),
    "min_p": Field(min=0.0, max=1.0),
    "repetition_penalty": Field(gt=0.0),
    "top_entropy_quantile": Field(min=0.0, max=1.0),
    "ref_model_mixup_alpha": Field(min=0.0, max=1.0),
    "ref_model_sync_steps": Field(min=1),
    "vllm_gpu_memory_utilization": Field(gt=0.0, max=1.0),
    "entropy_coef": Field(min=0.0),
    "seed": Field(min=0),
    "max_tool_calling_iterations": Field(min=1),
}
TRAINER_REFUSED = {
    "model_init_kwargs": "is set by grpokit from the model section (dtype, quantization, attn_implementation)",
    "reward_weights": "is set by grpokit from the rewards list: give each entry a weight",
    "auto_find_batch_size": "is not supported by GRPO: shrinking the batch on OOM breaks whole prompt groups; "
    "lower trainer.per_device_train_batch_size instead",
}

LORA_BOUNDS = {
    "r": Field(min=1),
    "lora_alpha": Field(gt=0),
    "lora_dropout": Field(min=0.0, lt=1.0),
}
LORA_DEFAULTS = {"task_type": "CAUSAL_LM", "target_modules": "all-linear", "r": 16, "lora_alpha": 32}

# Advantage knobs under which a sample's advantage depends on its own group only, as dynamic sampling needs:
# it builds a batch from several generation rounds, whose batch-level statistics must not mix.
PER_GROUP = {"scale_rewards": ("group", "none"), "multi_objective_aggregation": ("sum_then_normalize",)}
TOTAL_REWARD = "reward"  # `sampling.metric` value for the weighted sum of all rewards
