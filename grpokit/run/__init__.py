"""A run's life, start to finish, and what each command does with it.

`request` is what one command asks for, read once; `build` prepares everything that needs no weights, then builds
the trainer; `training` locks the folder, prepares, builds, trains and finishes, and says what a stopped run did;
`supervised` is the warm start's pass; `progress` the console's line per logging step; `runfiles` the files grpokit
writes into a run folder beside the trainer's; `check` is `--check`, `probe` `--probe`, `evaluate` `--eval`, `merge`
`--merge`; `launcher` starts several processes for one run through accelerate.

Offers: `build`, `check`, `evaluate`, `launcher`, `merge`, `probe`, `request`, `runfiles`, `training`.
Never: parses a command line (that is `grpokit.cli`), or removes what grpokit did not write.
"""
