"""What a bench does before it imports grpokit: nothing downloads (the hub off for huggingface_hub and transformers),
tokenizers' threads stay quiet, and grpokit, rewards and labs come from this checkout -- its root first on sys.path,
ahead of bench/ (first for a script run from there: bench/rewards.py would hide the rewards package).

    from offline import ROOT  # noqa: E402  (before grpokit: sets the environment)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _name, _value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_name, _value)
sys.path.insert(0, str(ROOT))
