"""Servable: whether a cache index serves a GEMM signature, decided without a GPU.

Run side, pure: standard library and the core modules only (no torch, no
device query), so ``cutlass_aot.nn.patch`` can decide per module, and
``cutlass-aot coverage`` per logged signature, from the index alone.

The GEMM signature (see cutlass_aot/signature.py) has the fields a, b, d, c,
a_major, b_major, d_major, rank, align, and the epilogue fields ``bias``
(dtype name of the bias vector, or None) and ``act`` (an activation name,
"none" for none). Indexes written before the epilogue fields existed have
signatures without them; such an entry serves exactly the calls with no
bias and act "none", which is what ``normalized`` encodes: a missing
epilogue field is its default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..signature import Signature

# Value of each epilogue field when a signature lacks it (pre-epilogue indexes).
EPILOGUE_DEFAULTS = {"bias": None, "act": "none"}
# 16-byte alignment, in elements, of each dtype's leading dimension.
ALIGN_ELEMENTS = {"f16": 8, "bf16": 8, "f32": 4}


def normalized(sig: Signature) -> Signature:
    """``sig`` with every epilogue field present (absent ones at their default)."""
    fields = dict(sig.fields)
    if sig.op != "gemm" or all(name in fields for name in EPILOGUE_DEFAULTS):
        return sig
    for name, default in EPILOGUE_DEFAULTS.items():
        fields.setdefault(name, default)
    return Signature.make(sig.op, sig.arch, fields)


def serving_index(by_signature: Mapping[Signature, Sequence]) -> dict[Signature, list]:
    """``{normalized signature: entries}`` of a cache's ``by_signature``."""
    index: dict[Signature, list] = {}
    for sig, entries in by_signature.items():
        if entries:
            index.setdefault(normalized(sig), []).extend(entries)
    return index


def serves(index: Mapping[Signature, Sequence], sig: Signature) -> bool:
    """Whether a ``serving_index`` has an entry for ``sig``."""
    return bool(index.get(normalized(sig)))


def gemm_signature(arch: str, *, a: str, d: str | None = None, c: str | None = None,
                   a_major: str = "k", b_major: str = "k", d_major: str = "n", rank: int = 2,
                   bias: str | None = None, act: str = "none") -> Signature:
    """The signature a GEMM call with these operands maps to (b has a's dtype)."""
    return Signature.make("gemm", arch, {
        "a": a, "b": a, "d": d or a, "c": c, "a_major": a_major, "b_major": b_major,
        "d_major": d_major, "rank": rank, "align": 16, "bias": bias, "act": act,
    })


def linear_signature(arch: str, dtype: str, has_bias: bool, act: str = "none") -> Signature:
    """The signature of ``x @ weight.t() (+ bias)``: x row-major [M,K], out row-major [M,N]."""
    return gemm_signature(arch, a=dtype, bias=dtype if has_bias else None, act=act)
