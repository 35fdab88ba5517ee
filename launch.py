"""Run a GRPO recipe on TRL's GRPOTrainer.

    accelerate launch launch.py --recipe recipes/<name>.yaml [section.key=value ...]
    python launch.py --recipe recipes/smoke.yaml --check

The story: read the recipe (and its bases and overrides), validate every key before anything heavy is
imported or any weight loads, then build the trainer and train. See `grpokit/cli.py`.
"""

import sys

from grpokit.cli import main

if __name__ == "__main__":
    sys.exit(main())
