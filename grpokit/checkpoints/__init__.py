"""Weights on disk: the model files grpokit makes or converts, and a run folder's checkpoints.

`tiny` makes the built-in tiny model and its tokenizer locally, once, in grpokit's cache; `gguf` finds, checks and
converts a GGUF checkpoint once into an ordinary model folder beside it, offline; `rundir` knows a run folder: its
checkpoints, which one `--resume` takes, the run lock, the names of the files a run keeps there, and whether a model
folder holds its weights.

Offers: `tiny`, `gguf`, `rundir`.
Never: downloads anything, loads a model for a run (that is `grpokit.trainer.models`), or writes anywhere but a
folder made through `grpokit.files` (a cache entry is built beside its place and renamed in whole).
"""
