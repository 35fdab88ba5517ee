"""What a run computes and what it did: the papers' terms, curves, report.md, the held-out table, the model card.

`explain` (the papers' terms for a recipe), `plots`, `report` (report.md), `verdict` (learnt or not, and why),
`compare`, `tool_calls`, `failed_calls`, `last_word`, `scoring`, `own_passes`, `memory_use`, `heldout_table`,
`warm_start` and `model_card` each write one part; `messages` makes every text a run or a model produced inert
before it enters markdown.

Offers: `compare`, `explain`, `failed_calls`, `last_word`, `messages`, `model_card`, `plots`, `report`, `tool_calls`,
`verdict`.
Never: trains or loads a model, writes a file except through `grpokit.files`, or puts a run's text into markdown
without `messages`.
"""
