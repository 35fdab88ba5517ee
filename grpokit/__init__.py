"""grpokit: a YAML recipe to a GRPO run on TRL's `GRPOTrainer`. The house is in folders, each a floor's room
(docs/architecture.md draws them, lowest first):

- leaves: `errors`, `fields`, `cpu`, `dist`, `lifecycle`, `taskgen`, `trl_compat` -- nothing of ours below them;
- `files/` (the one door for files), `checkpoints/` (weights on disk), `untrusted/` (where untrusted work runs);
- the domains: `planning/` (a run planned before it runs), `prompts/` (where prompts come from), `tools/` (tools and
  environments), `warm_start/` (the supervised pass before GRPO: its section and its worked exchanges);
- `config/` (the recipe), `trainer/` (what grpokit does inside TRL's trainers), `reporting/` (what a run did),
  `run/` (a run's life, start to finish), `cli` (the commands).

`MOVED` says where a module that once stood loose in grpokit/ stands now, so that a recipe naming it by its old
path (`grpokit.environments:PythonTool`), or a user's file importing it, is told the new one in one line instead of
"module not found".
"""

MOVED = {f"grpokit.{old}": f"grpokit.{new}" for old, new in {
    "tiny": "checkpoints.tiny", "gguf": "checkpoints.gguf", "rundir": "checkpoints.rundir",
    "data": "prompts.data", "datavalues": "prompts.datavalues", "screening": "prompts.screening",
    "tasks": "prompts.tasks", "arithmetic": "prompts.arithmetic",
    "tooluse": "tools.tooluse", "toolchecks": "tools.toolchecks", "toolguard": "tools.toolguard",
    "tooltext": "tools.tooltext", "toolfaults": "tools.toolfaults", "envguard": "tools.envguard",
    "environments": "tools.environments", "templates": "tools.templates",
    "warmstart": "warm_start.section", "worked": "warm_start.worked",
    "generation": "trainer.generation", "shared_prompt": "trainer.shared_prompt", "ownpasses": "trainer.ownpasses",
    "dynamic_sampling": "trainer.dynamic_sampling", "models": "trainer.models", "rollouts": "trainer.rollouts",
    "watch": "trainer.watch",
    "training": "run.training", "build": "run.build", "check": "run.check", "probe": "run.probe",
    "evaluate": "run.evaluate", "runfiles": "run.runfiles", "merge": "run.merge", "launcher": "run.launcher",
    "request": "run.request", "progress": "run.progress", "supervised": "run.supervised",
}.items()}
