"""Values crossing between code_tests' two sides as plain data: encoded by one process, decoded strictly by the other.

The trusted side (sandbox/judge.py) and the graded code's side (sandbox/candidate.py) run in
different processes and exchange only these bytes: no pickle, marshal or eval, nothing in them runs code when
decoded. Each value is one tagged item:

    N  T  F                          None, True, False
    i<hex>;                          int (hex: no decimal digit limit applies)
    f<float.hex()>;                  float, nan and inf included
    c<float.hex()>;<float.hex()>;    complex
    s<n>:<n bytes>  b<n>:  a<n>:     str (UTF-8, lone surrogates kept), bytes, bytearray
    l<n>: t<n>: S<n>: Z<n>:          list, tuple, set, frozenset of the n items that follow
    d<n>:                            dict of the n key, value pairs that follow
    x<kind as s> <body>              a library or setup type rebuilt as itself (KINDS below): a Counter stays a
                                     Counter, a namedtuple a namedtuple of the same name and fields
    r<k>;                            the k-th list, dict, set, bytearray, deque or setup instance of this value
                                     again (one object used twice, or holding itself, stays one object)
    h<k>;<type name as s>            an object kept by the side that sent it (k: its number there), e.g. an
                                     instance of a class the graded code defines; `k<k>;` one the receiver
                                     keeps, sent back; `g<name as s>` one of the receiver's global names

A subclass of a plain type that the receiver does not know (the graded code's `class I(int)`) arrives as its
base value in a stand-in subclass of the same name: it compares, hashes and prints as its base type does, since
its own methods are the graded code's. Every size is capped and a set or dict whose keys were chosen to share one
hash is refused; anything malformed raises `BadValue`. Standard library only: the sandbox loads this file.

>>> decode(encode([1, 'hi', None]))
[1, 'hi', None]
"""

from __future__ import annotations

import sys

# This file's own references, taken when it is loaded, before any graded code runs (which may rebind the builtins):
# these names resolve to module globals, whatever `builtins.int = ...` does in the code's process.
from builtins import (AttributeError, BaseException, IndexError, KeyError, MemoryError, OverflowError,
                      RecursionError, TypeError, UnicodeDecodeError, ValueError, all, any, bool, bytearray, bytes,
                      complex, dict, enumerate, float, frozenset, getattr, hasattr, hash, id, int, isinstance,
                      issubclass, len, list, object, range, set, slice, str, tuple, type)

MAX_DEPTH = 64          # nesting; deeper is refused (the decoder and Python's comparisons recurse)
MAX_ITEMS = 1 << 16     # items in one value
MAX_BYTES = 1 << 19     # one value's encoding
MAX_INT_BITS = 1 << 17  # one int
MAX_SAME_HASH = 32      # distinct keys of one set or dict that share a hash
_NUMBER = 64 + MAX_INT_BITS // 4  # longest digit run: a float.hex() or a MAX_INT_BITS int in hex
_CONSTANTS = {ord("N"): None, ord("T"): True, ord("F"): False}
_SEQUENCES = ((list, b"l"), (tuple, b"t"), (set, b"S"), (frozenset, b"Z"))
_TAGS = {ord("l"): list, ord("t"): tuple, ord("S"): set, ord("Z"): frozenset}
# The plain types a subclass of which crosses as its base value (bool cannot be subclassed).
BASES = (int, float, complex, str, bytes, bytearray, list, tuple, set, frozenset, dict)
# Library types rebuilt as themselves: (module, name) -> kind.
KINDS = {("collections", "Counter"): "Counter", ("collections", "OrderedDict"): "OrderedDict",
         ("collections", "defaultdict"): "defaultdict", ("collections", "deque"): "deque",
         ("fractions", "Fraction"): "Fraction", ("decimal", "Decimal"): "Decimal", ("builtins", "range"): "range",
         ("builtins", "dict_keys"): "keys", ("builtins", "dict_values"): "values", ("builtins", "dict_items"): "items"}


class BadValue(ValueError):
    """The bytes are not one well-formed value within the limits above, or a value cannot be sent."""


class Handle:
    """How a side names an object sent by reference: one it keeps (`number`), one the other side keeps and lent it
    (`number`, `theirs`), or one of the other side's globals (`name`)."""

    __slots__ = ("number", "name", "kind", "theirs")

    def __init__(self, number: int | None = None, name: str | None = None, kind: str = "", theirs: bool = False):
        self.number, self.name, self.kind, self.theirs = number, name, kind, theirs


def _loaded(module: str, name: str):
    """`module.name` where the module is already imported (a value of its type cannot exist otherwise)."""
    found = sys.modules.get(module)
    return getattr(found, name, None) if found is not None else None


def _kind_of(kind: type) -> str | None:
    """The KINDS entry of a type, checked to be the library's own (not a look-alike of the same name)."""
    entry = KINDS.get((getattr(kind, "__module__", None), getattr(kind, "__name__", None)))
    if entry is None:
        return None
    if kind.__module__ == "builtins":
        views = (type({}.keys()), type({}.values()), type({}.items()), range)
        return entry if any(kind is view for view in views) else None
    return entry if _loaded(kind.__module__, kind.__name__) is kind else None


def _plain_base(kind: type) -> type | None:
    for base in BASES:
        if issubclass(kind, base):
            return base
    return None


def _is_namedtuple(kind: type) -> bool:
    return issubclass(kind, tuple) and isinstance(getattr(kind, "_fields", None), tuple)


class Encoder:
    """Writes values. `classes`: {class: name} of the setup's classes (their instances cross as state, rebuilt from
    the receiver's own class); `refer(x)`: a Handle for anything else that is not plain data (None: refuse it)."""

    def __init__(self, classes: dict | None = None, refer=None):
        self.classes, self.refer = classes or {}, refer

    def encode(self, value) -> bytes:
        out, self.memo, self.budget = [], {}, [MAX_ITEMS, MAX_BYTES]
        self.put(value, out, 0)
        return b"".join(out)

    def put(self, x, out: list, depth: int) -> None:
        self.budget[0] -= 1
        if self.budget[0] < 0 or self.budget[1] < 0 or depth > MAX_DEPTH:
            raise BadValue("value too big or too deep to send")
        kind = type(x)
        if x is None or x is True or x is False:
            return self.piece(out, b"N" if x is None else b"T" if x else b"F")
        if kind in (int, float, complex, str, bytes):
            return self.piece(out, _scalar(x))
        mutable = isinstance(x, (list, dict, set, bytearray)) or kind in self.classes or _kind_of(kind) == "deque"
        if mutable:
            if id(x) in self.memo:
                return self.piece(out, b"r%d;" % self.memo[id(x)][0])
            self.memo[id(x)] = (len(self.memo), x)  # the object is kept alive, so its id is not reused meanwhile
        if kind in (list, tuple, set, frozenset, dict, bytearray):
            return self.body(x, kind, out, depth)
        if kind in self.classes:
            base = _plain_base(kind)
            state = _state(x)
            self.head(out, "setup", self.classes[kind])
            self.body(x, base, out, depth) if base else self.piece(out, b"N")
            return self.body(state, dict, out, depth)
        entry = _kind_of(kind)
        if entry is not None:
            return self.library(x, entry, out, depth)
        if isinstance(x, type) and x in self.classes:
            return self.head(out, "class", self.classes[x])
        if _is_namedtuple(kind):
            self.head(out, "namedtuple", kind.__name__)
            self.body(list(kind._fields), list, out, depth)
            return self.body(tuple.__iter__(x), tuple, out, depth)
        base = _plain_base(kind)
        if base is not None:
            self.head(out, "sub", kind.__name__)
            return self.body(x, base, out, depth) if base not in (int, float, complex, str, bytes) else \
                self.piece(out, _scalar(base(x) if base is not str else str.__str__(x)))
        handle = self.refer(x) if self.refer else None
        if handle is None:
            raise BadValue(f"a {kind.__name__} cannot be sent")
        if handle.name is not None:
            self.piece(out, b"g")
            return self.piece(out, _scalar(handle.name))
        if handle.theirs:
            return self.piece(out, b"k%d;" % handle.number)
        self.piece(out, b"h%d;" % handle.number)
        return self.piece(out, _scalar(handle.kind))

    def piece(self, out: list, data: bytes) -> None:
        out.append(data)
        self.budget[1] -= len(data)

    def head(self, out: list, kind: str, name: str) -> None:
        self.piece(out, b"x" + _scalar(kind) + _scalar(name))

    def body(self, x, base: type, out: list, depth: int) -> None:
        """A container's items after its tag (the object itself already in the memo)."""
        if base in (int, float, complex, str, bytes):
            return self.piece(out, _scalar(base(x)))
        if base is dict:
            pairs = list(dict.items(x))
            self.piece(out, b"d%d:" % len(pairs))
            for key, item in pairs:
                self.put(key, out, depth + 1)
                self.put(item, out, depth + 1)
            return None
        if base is bytearray:
            raw = bytes(x)
            return self.piece(out, b"a%d:%s" % (len(raw), raw))
        tag = dict(_SEQUENCES).get(base, b"l")
        items = list(base.__iter__(x)) if isinstance(x, base) else list(x)
        self.piece(out, b"%s%d:" % (tag, len(items)))
        for item in items:
            self.put(item, out, depth + 1)
        return None

    def library(self, x, entry: str, out: list, depth: int) -> None:
        self.head(out, entry, "")
        if entry in ("Counter", "OrderedDict"):
            return self.body(x, dict, out, depth)
        if entry == "defaultdict":
            factory = x.default_factory
            self.piece(out, _scalar(factory.__name__) if factory in (list, dict, set, int, str, float, tuple) else b"N")
            return self.body(x, dict, out, depth)
        if entry == "deque":
            self.put(x.maxlen, out, depth + 1)
            return self.body(x, list, out, depth)
        if entry == "Fraction":
            return self.piece(out, _scalar(x.numerator) + _scalar(x.denominator))
        if entry == "Decimal":
            return self.piece(out, _scalar(str(x)))
        if entry == "range":
            return self.piece(out, _scalar(x.start) + _scalar(x.stop) + _scalar(x.step))
        return self.body(list(x), list, out, depth)  # a dict view: its items


def _scalar(x) -> bytes:
    kind = type(x)
    if kind is int:
        return b"i%x;" % x
    if kind is float:
        return b"f%s;" % float.hex(x).encode()
    if kind is complex:
        return b"c%s;%s;" % (float.hex(x.real).encode(), float.hex(x.imag).encode())
    raw = x.encode("utf-8", "surrogatepass") if kind is str else bytes(x)
    return b"%c%d:%s" % (115 if kind is str else 98, len(raw), raw)


def _state(x) -> dict:
    """An instance's attributes: its __dict__ and its slots (read without its own __getattribute__)."""
    state = {}
    try:
        state.update(object.__getattribute__(x, "__dict__"))
    except AttributeError:
        pass
    for kind in type(x).__mro__:
        slots = kind.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                try:
                    state[name] = object.__getattribute__(x, name)
                except AttributeError:
                    pass
    return state


def encode(value, classes: dict | None = None, refer=None) -> bytes:
    """`value`'s bytes; BadValue where it is not plain data (and `refer` gives no handle for it) or is too big."""
    return Encoder(classes, refer).encode(value)


_STAND_INS: dict = {}


def stand_in(name: str, base: type) -> type:
    """A subclass of `base` (a plain type, or a builtin exception) named `name`, with none of its own methods; one
    per (name, base) in this process."""
    key = (name, base)
    if key not in _STAND_INS:
        if len(_STAND_INS) > 256:
            raise BadValue("too many subclass types")
        slots = {} if base in (int, bytes, tuple) or issubclass(base, BaseException) else {"__slots__": ()}
        _STAND_INS[key] = type(name, (base,), {"__module__": "__main__", "__qualname__": name, **slots})
    return _STAND_INS[key]


_NAMEDTUPLES: dict = {}


def _namedtuple(name: str, fields: tuple) -> type:
    key = (name, fields)
    if key not in _NAMEDTUPLES:
        if len(_NAMEDTUPLES) > 256:
            raise BadValue("too many namedtuple types")
        from collections import namedtuple

        _NAMEDTUPLES[key] = namedtuple(name, fields, module="__main__")
    return _NAMEDTUPLES[key]


class Decoder:
    """Reads values. `classes`: {name: class} of the setup's; `held(handle)`: the object a Handle names (None: keep
    the Handle itself, for the side that sent it by reference)."""

    def __init__(self, classes: dict | None = None, held=None):
        self.classes, self.held = classes or {}, held

    def decode(self, data: bytes):
        """The value `data` encodes; BadValue for anything malformed, too big, too deep or trailing."""
        self.data, self.pos, self.items, self.memo = bytes(data), 0, 0, []
        if len(self.data) > MAX_BYTES * 2:
            raise BadValue("value too big")
        try:
            value = self.value(0)
        except BadValue:
            raise
        except (RecursionError, MemoryError, OverflowError, TypeError, ValueError, IndexError, KeyError,
                AttributeError, UnicodeDecodeError) as err:
            raise BadValue(f"not a value: {type(err).__name__}: {str(err)[:80]}") from None
        if self.pos != len(self.data):
            raise BadValue("bytes after the value")
        return value

    def value(self, depth: int, keep: bool = True):
        """One tagged value. `keep`: a container is one the sender numbered for `r` (False for the body of a typed
        value, numbered as that value)."""
        self.items += 1
        if self.items > MAX_ITEMS or depth > MAX_DEPTH:
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
        if tag in b"adlS":
            k = self.place(keep)
            if tag == ord("a"):
                return self.fill(k, bytearray(self.take(self.count())))
            if tag == ord("S"):
                return self.fill(k, safe_set([self.value(depth + 1) for _ in range(self.count())]))
            made = self.fill(k, {} if tag == ord("d") else [])
            return self.pairs(made, depth) if tag == ord("d") else self.items_into(made, depth)
        if tag in _TAGS:
            items = [self.value(depth + 1) for _ in range(self.count())]
            return safe_set(items, frozenset) if _TAGS[tag] is frozenset else tuple(items)
        if tag == ord("r"):
            k = int(self.until(b";"))
            if not 0 <= k < len(self.memo) or self.memo[k] is _UNFILLED:
                raise BadValue("reference to nothing (or to a value not yet whole)")
            return self.memo[k]
        if tag in b"hgk":
            number = int(self.until(b";")) if tag != ord("g") else None
            text = self.text() if tag != ord("k") else ""
            handle = Handle(number, None, text, tag == ord("k")) if tag != ord("g") else Handle(None, text)
            return self.held(handle) if self.held else handle
        if tag == ord("x"):
            return self.typed(self.text(), self.text(), depth)
        raise BadValue(f"unknown tag {tag!r}")

    def place(self, keep: bool = True) -> int | None:
        """Number the next container where the sender did (before its items, which may refer to it)."""
        if not keep:
            return None
        self.memo.append(_UNFILLED)
        return len(self.memo) - 1

    def fill(self, k: int | None, made):
        if k is not None:
            self.memo[k] = made
        return made

    def typed(self, kind: str, name: str, depth: int):
        if kind in ("setup", "class"):
            cls = self.classes.get(name)
            if not isinstance(cls, type):
                raise BadValue(f"no setup class {name!r} here")
            return self.instance(cls, depth) if kind == "setup" else cls
        if kind == "sub":
            if not name.isidentifier() or len(name) > 100:
                raise BadValue("bad class name")
            k = self.place()
            base = self.value(depth + 1, keep=False)
            if type(base) not in BASES:
                raise BadValue("a subclass of what?")
            return self.fill(k, _rebuild(stand_in(name, type(base)), type(base), base))
        if kind == "namedtuple":
            fields = self.value(depth + 1, keep=False)
            values = self.value(depth + 1)
            if type(fields) is not list or not all(type(f) is str for f in fields) or type(values) is not tuple:
                raise BadValue("namedtuple")
            return _namedtuple(name, tuple(fields))._make(values)
        return self.library(kind, depth)

    def library(self, kind: str, depth: int):
        import collections

        if kind in ("Counter", "OrderedDict", "defaultdict", "deque"):
            k = self.place()
            extra = self.value(depth + 1) if kind in ("defaultdict", "deque") else None
            if kind == "defaultdict":
                made = collections.defaultdict(_FACTORIES[extra] if extra is not None else None)
            elif kind == "deque":
                if extra is not None and type(extra) is not int:
                    raise BadValue("deque maxlen")
                made = collections.deque(maxlen=extra)
            else:
                made = getattr(collections, kind)()
            self.fill(k, made)
            body = self.value(depth + 1, keep=False)
            if type(body) is not (list if kind == "deque" else dict):
                raise BadValue(f"{kind} body")
            if kind == "deque":
                made.extend(body)
            else:  # an OrderedDict keeps its order outside the dict: its own update; the others are plain dicts
                made.update(body) if kind == "OrderedDict" else dict.update(made, body)
            return made
        if kind == "Fraction":
            from fractions import Fraction

            return Fraction(self.exact(int), self.exact(int))
        if kind == "Decimal":
            from decimal import Decimal

            return Decimal(self.exact(str))
        if kind == "range":
            return range(self.exact(int), self.exact(int), self.exact(int))
        if kind in ("keys", "values", "items"):
            items = self.value(depth + 1, keep=False)
            if type(items) is not list:
                raise BadValue("dict view body")
            if kind == "keys":
                return safe_dict((k, None) for k in items).keys()
            return dict(enumerate(items)).values() if kind == "values" else safe_dict(items).items()
        raise BadValue(f"unknown kind {kind!r}")

    def instance(self, cls: type, depth: int):
        """An instance of the setup's class `cls`, built without its __init__: its base value, then its attributes."""
        base = _plain_base(cls)
        k = self.place()
        early = base not in (int, float, complex, str, bytes, tuple, frozenset)
        if early:  # made before its parts, which may refer back to it (a doubly linked list)
            made = self.fill(k, (base or object).__new__(cls))
        value = self.value(depth + 1, keep=False)
        if (base is None) != (value is None) or base is not None and type(value) is not base:
            raise BadValue(f"not the state of a {cls.__name__}")
        if not early:
            made = self.fill(k, base.__new__(cls, value))
        elif base is not None:
            _refill(made, value, base)
        state = self.value(depth + 1, keep=False)
        if type(state) is not dict or not all(type(name) is str and name.isidentifier() and not name.startswith("__")
                                               for name in state):
            raise BadValue("attributes")  # plain names only: never __class__ or __dict__
        for name, item in state.items():
            object.__setattr__(made, name, item)
        return made

    def exact(self, kind: type):
        value = self.value(0)
        if type(value) is not kind:
            raise BadValue(f"expected a {kind.__name__}")
        return value

    def text(self) -> str:
        if self.data[self.pos] != ord("s"):
            raise BadValue("expected a name")
        self.pos += 1
        return self.take(self.count()).decode("utf-8", "surrogatepass")

    def items_into(self, made: list, depth: int) -> list:
        made.extend(self.value(depth + 1) for _ in range(self.count()))
        return made

    def pairs(self, made: dict, depth: int) -> dict:
        pairs = [(self.value(depth + 1), self.value(depth + 1)) for _ in range(self.count())]
        check_hashes(k for k, _ in pairs)
        for key, item in pairs:
            made[key] = item
        return made

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
        if len(raw) != n:
            raise BadValue("past the end")
        self.pos += n
        return raw


_UNFILLED = object()
_FACTORIES = {"list": list, "dict": dict, "set": set, "int": int, "str": str, "float": float, "tuple": tuple}


def _rebuild(cls: type, base: type, value):
    """An instance of `cls` (a subclass of the plain type `base`) holding `value`, without running its __init__."""
    if base in (int, float, complex, str, bytes, tuple, frozenset):
        return base.__new__(cls, value)
    made = base.__new__(cls)
    _refill(made, value, base)
    return made


def refill(target, value) -> bool:
    """Make `target` (a list, dict, set, bytearray or deque, or an instance with attributes) hold what `value` holds,
    in place: how a change the graded code made to an argument reaches the test's own object. False where `value`
    is not of `target`'s type, or the type is immutable."""
    if type(value) is not type(target):
        return False
    base = _plain_base(type(target))
    if base in (int, float, complex, str, bytes, tuple, frozenset):
        return False  # immutable: nothing to change in place
    if type(target).__name__ in ("OrderedDict", "deque"):  # the library's own, whose order lives outside the dict
        target.clear()
        target.extend(value) if hasattr(target, "extend") else target.update(value)
    elif base in (list, dict, set, bytearray):
        _refill(target, value, base)
    elif base is None:
        mine = _state(target)
        for name in mine:
            if name not in _state(value):
                try:
                    object.__delattr__(target, name)
                except AttributeError:
                    pass
        for name, item in _state(value).items():
            object.__setattr__(target, name, item)
    return True


def _refill(made, value, base: type) -> None:
    if base is dict:
        dict.clear(made)
        dict.update(made, value)
    elif base is set:
        set.clear(made)
        set.update(made, value)
    else:  # list, bytearray
        base.__setitem__(made, slice(None), value)


def decode(data: bytes, classes: dict | None = None, held=None):
    """The value `data` encodes (see Decoder).

    >>> decode(b"d1:s1:at2:f0x1.8000000000000p+0;finf;")
    {'a': (1.5, inf)}
    """
    return Decoder(classes, held).decode(data)


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
    pairs = [tuple(p) for p in pairs]
    if len(pairs) > MAX_ITEMS or any(len(p) != 2 for p in pairs):
        raise BadValue("not key, value pairs within the limits")
    check_hashes(k for k, _ in pairs)
    return dict(pairs)

