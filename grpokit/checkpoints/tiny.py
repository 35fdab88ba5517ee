"""The embedded offline model: a tiny random Llama and a character tokenizer, built locally.

No hub is reachable in tests, CI or the smoke run, so the default recipe points `model.name_or_path` at
`builtin:tiny-llama`. The first use builds it (seconds, deterministic under a fixed seed) and caches it
on disk; later uses load the cached directory through the same `from_pretrained` code a real model uses.

Why these choices:
- Llama architecture: for `qwen2`-type configs transformers 5 swaps in a byte-level tokenizer, which
  breaks a character tokenizer.
- `initializer_range=0.2`: with the usual 0.02 the logits are nearly flat and a LoRA adapter cannot
  grow them fast enough for the smoke task to learn in a minute.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

BUILTIN_PREFIX = "builtin:"
TINY_NAME = "tiny-llama"
# Bump when the architecture or the tokenizer changes, so stale caches are rebuilt, never reused.
TINY_VERSION = 2  # 2: 4096 positions (a tool schema spelled out by its near-character tokenizer takes ~700)

SPECIAL_TOKENS = ["<pad>", "<s>", "<|end|>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

TINY_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    initializer_range=0.2,
    tie_word_embeddings=False,
)


def cache_root() -> Path:
    """Where built-in models live: `$GRPOKIT_CACHE`, else `~/.cache/grpokit`."""
    return Path(os.environ.get("GRPOKIT_CACHE", Path.home() / ".cache" / "grpokit"))


def builtin_names() -> list[str]:
    return [TINY_NAME]


def resolve(name_or_path: str) -> str:
    """Turn `builtin:<name>` into a local directory (building it once); pass anything else through.

    >>> resolve("Qwen/Qwen2.5-0.5B-Instruct")
    'Qwen/Qwen2.5-0.5B-Instruct'
    """
    if not name_or_path.startswith(BUILTIN_PREFIX):
        return name_or_path
    name = name_or_path[len(BUILTIN_PREFIX) :]
    if name != TINY_NAME:
        raise ValueError(f"unknown built-in model {name!r}; built-ins: {', '.join(builtin_names())}")
    return str(ensure_tiny_model())


def _vocab() -> list[str]:
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    return SPECIAL_TOKENS + chars


def build_tokenizer():
    """A character-level fast tokenizer with a chat template; every printable ASCII char is one token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_vocab())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="<|end|>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(vocab_size: int, pad_id: int, bos_id: int, eos_id: int):
    """A random Llama with `TINY_CONFIG`, identical on every machine (fixed seed, CPU init)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, pad_token_id=pad_id, bos_token_id=bos_id, eos_token_id=eos_id, **TINY_CONFIG
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = pad_id
    model.generation_config.eos_token_id = eos_id
    return model


def ensure_tiny_model(root: Path | None = None) -> Path:
    """Build (once) and return the directory of the tiny model; safe when several processes race."""
    target = (root or cache_root()) / f"{TINY_NAME}-v{TINY_VERSION}"
    if (target / "done.json").exists():
        return target
    from grpokit import files

    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)

    def build(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        files.write_text(tmp / "done.json", json.dumps({"version": TINY_VERSION}))

    return files.build_folder(target, build)  # several processes racing: the first one's (identical) folder is kept
