"""Content keys: a canonical, fail-closed fingerprint of everything that
decides an artifact's bytes.

Core module: standard library only.

Encoding: every value is written with a one-byte type tag and, for anything
of variable size, a decimal length prefix, so ``["a", "b"]`` and ``["ab"]``,
``1`` and ``"1"``, ``True`` and ``1`` all encode differently. Dict keys are
sorted. Any value of another type (floats included: their text is not
canonical across producers) raises ``TypeError``: a key that silently drops
or stringifies a value is how stale artifacts get served.
"""

from __future__ import annotations

import hashlib
from typing import Any

KEY_SCHEME = "cutlass-aot-key-v1"


def encode(value: Any) -> bytes:
    """Canonical bytes for None, bool, int, str, bytes, list/tuple and dict."""
    out: list[bytes] = []
    _encode(value, out, path="$")
    return b"".join(out)


def _encode(value: Any, out: list[bytes], path: str) -> None:
    if value is None:
        out.append(b"N")
    elif isinstance(value, bool):  # before int: bool is an int subclass
        out.append(b"T" if value else b"F")
    elif isinstance(value, int):
        text = str(value).encode()
        out.append(b"i%d:" % len(text) + text)
    elif isinstance(value, str):
        data = value.encode("utf-8")
        out.append(b"s%d:" % len(data) + data)
    elif isinstance(value, bytes):
        out.append(b"b%d:" % len(value) + value)
    elif isinstance(value, (list, tuple)):
        out.append(b"l%d:" % len(value))
        for i, item in enumerate(value):
            _encode(item, out, f"{path}[{i}]")
    elif isinstance(value, dict):
        out.append(b"d%d:" % len(value))
        for k in sorted(value, key=_sort_key(path)):
            if not isinstance(k, str):
                raise TypeError(f"cannot fingerprint {path}: dict key {k!r} is not a str")
            _encode(k, out, path)
            _encode(value[k], out, f"{path}.{k}")
    else:
        raise TypeError(
            f"cannot fingerprint {path}: value {value!r} of type "
            f"{type(value).__name__} has no canonical encoding "
            "(allowed: None, bool, int, str, bytes, list, tuple, dict)"
        )


def _sort_key(path: str):
    def key(k: Any) -> str:
        if not isinstance(k, str):
            raise TypeError(f"cannot fingerprint {path}: dict key {k!r} is not a str")
        return k

    return key


def content_key(inputs: dict) -> str:
    """The hex sha256 key of a variant's key inputs (see cache_layout.md)."""
    h = hashlib.sha256()
    h.update(encode(KEY_SCHEME))
    h.update(encode(inputs))
    return h.hexdigest()
