"""code_tests' sandbox: run a completion's Python against a sample's tests, where the code cannot decide its score.

One sandboxed process tree per candidate (`jobs`: what the trainer starts, the limits, the reports it reads;
`child`: the tree's inside -- namespaces, new root, cgroups, seccomp, rlimits), holding two processes that never
share memory: the *judge* (`judge`), which runs the sample's setup and every statement of every test and reports
each verdict, and the *code runner* (`candidate`), which runs the completion's code and answers the judge's requests.
They exchange only plain data (`values`: the format; `link`: requests and answers both ways). The code runner never
holds the tests, the setup's values or functions, the results pipe or its nonce.

>>> run("def add(a, b): return a + b", ["assert add(1, 2) == 3", "assert add(1, 1) == 3"]).passed
[True, False]
"""

from grpokit.untrusted.jobs import CHILD, Limits, Outcome, SandboxError, build_job, isolation, run, run_many

__all__ = ["CHILD", "Limits", "Outcome", "SandboxError", "build_job", "isolation", "run", "run_many"]
