"""Tools and environments: a recipe's `tools` section, and every call TRL makes into them, bounded and blamed.

`tooluse` owns the section (`TOOLS`): the environment and tool functions resolved under the rule that a recipe
reaches no other code, checked, and handed to TRL; `toolchecks` checks them past loading their code (clashing
names, worked calls, argument types); `templates` holds TRL's chat templates as its tool loop reads them;
`environments` are the environments grpokit ships, which a recipe names as `grpokit.tools.environments:Calculator`
and `grpokit.tools.environments:PythonTool` (a caged interpreter kept per rollout); `toolguard` bounds every call in
time and size; `envguard` blames an environment's constructor, `reset` and `get_reward` on the sample they served;
`tooltext` is what a tool hands back as the model reads it; `toolfaults` what a tool's own exception tells its author.

Offers: `tooluse`, `toolguard`, `toolchecks`, `templates`.
Never: runs a model's code outside `grpokit.untrusted`, imports `grpokit.config`, or lets a call run unbounded or
fail unblamed.
"""
