"""A run planned before it runs: counts from a model's config, and the memory and time they add up to.

`architecture` counts from a model config (`gemma4` Gemma 4's layer kinds and towers); `moments` what each phase of
a step holds, on grpokit's path or TRL's; `memory` the memory plan and the cards it fits; `vllm_share` vLLM's part of
one GPU; `cpu_time` a step's time on a CPU from bench's measured passes; `proof` a model's config proven before it
is believed; `measure` the live-tensor counter the plan is checked with.

Offers: `architecture`, `cpu_time`, `memory`, `moments`, `proof`, `vllm_share`.
Never: loads a model's weights or allocates its tensors to make a plan (a config is built on torch's meta device at
most, before anything heavy loads), or states a figure without saying how it was measured.
"""
