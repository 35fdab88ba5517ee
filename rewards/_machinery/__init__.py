"""What the reward library runs on, apart from its topics: nothing here is a reward a recipe names.

    errors    the library's two errors (RewardError, RewardNameError) and the failure a reward raises mid-run
    user      a user's own reward or tool file named in a recipe, and the rule that keeps a recipe from reaching
              any other code
    sandbox   where untrusted work runs: code_tests' per-candidate sandbox (jobs, child, judge, candidate) and the
              one pool of caged workers for everything else that reads a model's output (pool, cage, *_job)

This face imports nothing: the cage loads `rewards._machinery.sandbox`'s modules without running any __init__.
"""
