"""The offline arithmetic task the real-model recipe trains on: additions, generated deterministically.

Every pair (a, b) with 1 <= a, b <= 30 is one problem, "What is a + b?", with a GSM8K-style gold solution
ending in `#### N` (what the `accuracy` reward reads). A fixed-seed shuffle puts `HELDOUT` pairs in the
held-out split and the rest in the train split; the two never share a pair.

    >>> train, heldout = splits()
    >>> len(train), len(heldout), heldout[0]["answer"].splitlines()[-1].startswith("#### ")
    (852, 48, True)

Why additions of numbers up to 30: SmolLM2-135M-Instruct gets about a third of them right greedily
(a base model with no signal gives GRPO nothing to amplify; one always right leaves nothing to learn),
and an answer fits in 16 tokens, which keeps a CPU training step near ten seconds.

The files in grpokit/assets/arithmetic/ are this module's output, committed so a recipe can name them;
`python -m grpokit.prompts.arithmetic` rewrites them and a test checks they match.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

LOW, HIGH = 1, 30
HELDOUT = 48  # enough prompts that one more right answer moves pass@1 by ~2 points, few enough for a CPU
SEED = 0
ASSET_DIR = Path(__file__).parents[1] / "assets" / "arithmetic"
FILES = {"train": "train.jsonl", "heldout": "heldout.jsonl"}


def problem(a: int, b: int) -> dict:
    """One row: the question and its gold solution in GSM8K's form.

    >>> problem(7, 12)
    {'question': 'What is 7 + 12?', 'answer': '7 + 12 = 19\\n#### 19'}
    """
    return {"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}


def splits(seed: int = SEED, heldout: int = HELDOUT) -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows; the same lists on every machine for a given seed."""
    pairs = [(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)]
    random.Random(seed).shuffle(pairs)
    rows = [problem(a, b) for a, b in pairs]
    return rows[heldout:], rows[:heldout]


def render_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def write(folder: Path = ASSET_DIR) -> list[Path]:
    """Write both splits as JSON lines; returns the paths."""
    from grpokit import files

    train, heldout = splits()
    paths = []
    for split, rows in (("train", train), ("heldout", heldout)):
        path = folder / FILES[split]
        files.write_text(path, render_jsonl(rows))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write():
        print(f"wrote {written}")
