"""Values sent by the graded side, decoded strictly: the bytes come from a process that may be hostile.

The sandbox (rewards/_sandbox_child.py, `_encode`) writes each value as one tagged item:

    N  T  F                          None, True, False
    i<hex>;                          int, e.g. `i-1f;` (hex: no decimal digit limit applies)
    f<float.hex()>;                  float, nan and inf included
    c<float.hex()>;<float.hex()>;    complex
    s<n>:<n bytes>                   str, UTF-8 (lone surrogates kept)
    b<n>:<n bytes>                   bytes
    l<n>: t<n>: S<n>: Z<n>:          list, tuple, set, frozenset of the n items that follow
    d<n>:                            dict of the n key, value pairs that follow

Nothing here runs code from the bytes (no eval, marshal or pickle); every size is capped, and a set or
dict whose keys were chosen to share one hash (which would make building it quadratic) is refused.
Anything wrong raises `BadValue`.

>>> decode(b"l3:i1;s2:hiN")
[1, 'hi', None]
"""

from __future__ import annotations

MAX_DEPTH = 64          # nesting; deeper is refused (the decoder and Python's comparisons recurse)
MAX_ITEMS = 1 << 16     # items in one value: bounds the trainer's memory and time (decoding 65,536 takes ~30 ms)
MAX_INT_BITS = 1 << 17  # one int; products and powers of such are guarded in rewards/_judge.py
MAX_SAME_HASH = 32      # distinct keys of one set or dict that share a hash
_NUMBER = 64 + MAX_INT_BITS // 4  # longest digit run: a float.hex() or a MAX_INT_BITS int in hex
_CONSTANTS = {ord("N"): None, ord("T"): True, ord("F"): False}
_TAGS = {ord("l"): list, ord("t"): tuple, ord("S"): set, ord("Z"): frozenset}


class BadValue(ValueError):
    """The bytes are not one well-formed value within the limits above."""


class Budget:
    """Items that several values decoded for one candidate may hold together (decoding costs ~0.5-1 µs
    an item here): past it the rest are refused, so one candidate's values cost the trainer a bounded time."""

    def __init__(self, items: int):
        self.items = items


def decode(data: bytes, budget: Budget | None = None):
    """The value `data` encodes; BadValue for anything malformed, too big, too deep or trailing. Its items
    (even when refused part way) are taken from `budget`.

    >>> decode(b"d1:s1:at2:f0x1.8000000000000p+0;finf;")
    {'a': (1.5, inf)}
    """
    reader = _Reader(data, MAX_ITEMS if budget is None else min(MAX_ITEMS, budget.items))
    try:
        value = reader.value(0)
    except (RecursionError, MemoryError, OverflowError, TypeError, ValueError, IndexError, UnicodeDecodeError) as err:
        raise BadValue(f"not a value: {type(err).__name__}") from None
    finally:
        if budget is not None:
            budget.items -= reader.items
    if reader.pos != len(data):
        raise BadValue("bytes after the value")
    return value


class _Reader:
    def __init__(self, data: bytes, max_items: int):
        self.data, self.pos, self.items, self.max_items = bytes(data), 0, 0, max_items

    def value(self, depth: int):
        self.items += 1
        if self.items > self.max_items or depth > MAX_DEPTH:
            raise BadValue("too many items or too deep")
        tag = self.data[self.pos]
        self.pos += 1
        if tag in _CONSTANTS:
            return _CONSTANTS[tag]
        if tag == ord("i"):
            digits = self.until(b";")
            if len(digits) > MAX_INT_BITS // 4 + 1:
                raise BadValue("int too big")
            return int(digits, 16)
        if tag == ord("f"):
            return float.fromhex(self.until(b";"))
        if tag == ord("c"):
            return complex(float.fromhex(self.until(b";")), float.fromhex(self.until(b";")))
        if tag in b"sb":
            raw = self.take(self.count())
            return raw.decode("utf-8", "surrogatepass") if tag == ord("s") else raw
        if tag == ord("d"):
            n = self.count()
            pairs = [(self.value(depth + 1), self.value(depth + 1)) for _ in range(n)]
            return safe_dict(pairs)
        if tag in _TAGS:
            kind = _TAGS[tag]
            items = [self.value(depth + 1) for _ in range(self.count())]
            return safe_set(items, kind) if kind in (set, frozenset) else kind(items)
        raise BadValue(f"unknown tag {tag!r}")

    def until(self, end: bytes) -> str:
        stop = self.data.index(end, self.pos, self.pos + _NUMBER)
        text = self.data[self.pos:stop].decode("ascii")
        self.pos = stop + 1
        return text

    def count(self) -> int:
        text = self.until(b":")
        if not text.isdigit() or len(text) > 10:
            raise BadValue("bad count")
        n = int(text)
        if n > len(self.data) - self.pos:  # every item takes a byte at least: no promise of more than is here
            raise BadValue("count past the end")
        return n

    def take(self, n: int) -> bytes:
        raw = self.data[self.pos:self.pos + n]
        self.pos += n
        return raw


def check_hashes(keys) -> None:
    """BadValue when more than MAX_SAME_HASH distinct keys share one hash (TypeError when one is unhashable).

    Python's sets and dicts slow to a quadratic crawl on such keys; ints, floats and tuples can be chosen
    to collide. Buckets are keyed by the hash's bytes, whose own hash is randomised per process.

    >>> check_hashes([1, 2, 2**61 - 1 + 1])  # 1 and 2**61 share a hash: two keys is fine
    """
    buckets: dict[bytes, list] = {}
    for key in keys:
        seen = buckets.setdefault(hash(key).to_bytes(8, "little", signed=True), [])
        if not any(key is other or key == other for other in seen):
            seen.append(key)
            if len(seen) > MAX_SAME_HASH:
                raise BadValue("too many keys share one hash")


def safe_set(items, kind=set):
    """`set(items)` (or frozenset) for items of any origin: refuses hash floods and oversize inputs."""
    items = list(items)
    if len(items) > MAX_ITEMS:
        raise BadValue("too many items")
    check_hashes(items)
    return kind(items)


def safe_dict(pairs) -> dict:
    """`dict(pairs)` for pairs of any origin, under the same rules as `safe_set`."""
    pairs = [tuple(p) for p in (pairs.items() if isinstance(pairs, dict) else pairs)]
    if len(pairs) > MAX_ITEMS or any(len(p) != 2 for p in pairs):
        raise BadValue("not key, value pairs within the limits")
    check_hashes(k for k, _ in pairs)
    return dict(pairs)
