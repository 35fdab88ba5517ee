"""Where untrusted work runs: everything that reads a model's output with code we did not write, and every cell of
the Python tool, bounded and caged, where it cannot decide its own score.

`pool` is the one pool of caged workers (a `Kind` names the job module a worker runs: `task_job` reasoning-gym's
scorers, `math_job` math-verify, `python_job` a Python-tool cell), `session` a worker kept for one rollout's cells,
`worker` the pool's end of one worker; inside a worker (`cage`: the bootstrap and the zygote) its keeper (`keeper`:
the channel, the deadline, every reply checked against its job's number; its cgroups in `groups`) never runs a job,
and its runner (`runner`) runs it holding nothing but its pipes to the keeper. code_tests' sandbox runs a whole
program per candidate (`jobs`: the limits and reports; `child`: namespaces, new root, cgroups, seccomp, rlimits) as two
processes that never share memory: the judge (`judge`), which runs the tests, and the code runner (`candidate`),
exchanging plain data only (`values`, `link`); `process` starts and ends a process tree for both.

Offers: `pool`, `session`, `task_job`, `python_job`, `keeper`; here, code_tests' `run`, `run_many`, `Limits`,
`Outcome`, `SandboxError`, `build_job`, `isolation` and `CHILD`.
Never: lets the process that holds a worker's channel run a job, starts a process outside this package's pool or
sandbox, or gives a job network or writes outside its scratch.

>>> run("def add(a, b): return a + b", ["assert add(1, 2) == 3", "assert add(1, 1) == 3"]).passed
[True, False]
"""

from grpokit.untrusted.jobs import CHILD, Limits, Outcome, SandboxError, build_job, isolation, run, run_many

__all__ = ["CHILD", "Limits", "Outcome", "SandboxError", "build_job", "isolation", "run", "run_many"]
