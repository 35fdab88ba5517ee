"""Where prompts come from: a recipe's `dataset` section made into the rows GRPO trains on and is scored on.

`data` loads a local file, a hub dataset or a task source, builds each prompt (system prompt, few-shot turns) and
drops holes; `tasks` owns `dataset.reasoning_gym` (its keys, its checks, its problems made in `grpokit.taskgen`'s
bounded child); `arithmetic` is the offline arithmetic task the real-model recipe trains on; `datavalues` says what
a prompt or answer cell may hold and which data files a recipe may name; `screening` finds a local file's faults
before `datasets` reads and caches it.

Offers: `data`, `tasks`, `datavalues`.
Never: imports `grpokit.config` (it owns its keys, and the recipe reads them from here), or runs a model's output.
"""
