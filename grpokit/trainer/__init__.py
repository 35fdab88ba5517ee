"""What grpokit does inside TRL's trainers: TRL's method with less work, and a run measuring itself.

`generation` is TRL's generation with each prompt computed once for its copies and kept across tool rounds (the
trainer classes `grpokit.run.build` makes); `shared_prompt` the loss pass with each prompt computed once;
`ownpasses` says where those two passes run in place of TRL's and checks on a run's first step that they still
agree with it; `dynamic_sampling` is DAPO's dynamic sampling as a subclass of `GRPOTrainer`; `models` where a model
comes from, and its tokenizer and weights loaded; `rollouts` `--eval`'s multi-turn rollouts through TRL's own loop;
`watch` each phase's peak memory against the plan, and what an out-of-memory error says.

Offers: `generation`, `models`, `ownpasses`, `rollouts`, `watch`.
Never: reaches an internal of TRL, transformers or torch except through `grpokit.trl_compat`, or computes other
log-probabilities or gradients than TRL's method would.
"""
