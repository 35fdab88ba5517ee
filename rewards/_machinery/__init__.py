"""What the reward library runs on, apart from its topics: nothing here is a reward a recipe names.

    errors    the library's two errors (RewardError, RewardNameError) and the failure a reward raises mid-run
    user      a user's own reward or tool file named in a recipe, and the rule that keeps a recipe from reaching
              any other code

Where untrusted work runs (scorers, code tests, the Python tool) is not the rewards' own: `grpokit/untrusted/`.
"""
