"""Shared fixtures. Nothing here, or in any test, reaches a hub: the tiny model is built locally."""

import os

# Before any Hugging Face import: fail fast instead of trying the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The embedded tiny Llama + character tokenizer, built once per machine and cached."""
    from grpokit.tiny import ensure_tiny_model

    return ensure_tiny_model()
