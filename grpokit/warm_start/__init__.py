"""The warm start: a short supervised pass over worked exchanges before GRPO, in the same run.

`section` owns the `warm_start` section (its keys `WARM_START`, its rules, what `--check` says of it, the names of
the folder and record it leaves in a run folder); `worked` reads or writes the worked exchanges and says which of
their tokens carry the loss. The pass itself, TRL's `SFTTrainer`, is `grpokit.run.supervised`: it loads a model,
which stands above the recipe, while the section's rules stand below it.

Offers: `section`, `worked`.
Never: imports `grpokit.config` (which reads the section's rules from here), or loads a model.
"""
