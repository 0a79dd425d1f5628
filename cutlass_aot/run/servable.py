"""Servable: whether a cache index serves a GEMM signature, decided without a GPU.

Run side, pure: standard library and the core modules only (no torch, no
device query), so ``cutlass_aot.nn.patch`` can decide per module, and
``cutlass-aot coverage`` per logged signature, from the index alone.

The GEMM signature is ``signature.gemm_signature``'s: the fields a, b, d, c,
a_major, b_major, d_major, rank, align, plus the epilogue fields ``bias``
(dtype name of the bias vector) and ``act`` (activation name), which appear
only when set. ``normalized`` writes any GEMM signature in that canonical
form (a ``bias`` of None or an ``act`` of "none" is dropped), so signatures
from older logs or indexes that spelled the defaults out compare equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..signature import Signature
from ..signature import gemm_signature as core_gemm_signature

# Value of each epilogue field when a signature lacks it (its default).
EPILOGUE_DEFAULTS = {"bias": None, "act": "none"}
# 16-byte alignment, in elements, of each dtype's leading dimension.
ALIGN_ELEMENTS = {"f16": 8, "bf16": 8, "f32": 4}


def normalized(sig: Signature) -> Signature:
    """``sig`` without epilogue fields at their defaults (the canonical GEMM form)."""
    if sig.op != "gemm":
        return sig
    fields = dict(sig.fields)
    drop = [n for n, d in EPILOGUE_DEFAULTS.items() if n in fields and fields[n] == d]
    if not drop:
        return sig
    for name in drop:
        del fields[name]
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
    """The signature of a GEMM call with these operands (b has a's dtype; nn.Linear defaults)."""
    return core_gemm_signature(arch, a=a, b=a, d=d or a, c=c, a_major=a_major, b_major=b_major,
                               d_major=d_major, rank=rank, bias=bias, act=act)


def linear_signature(arch: str, dtype: str, has_bias: bool, act: str = "none") -> Signature:
    """The signature of ``x @ weight.t() (+ bias)``: x row-major [M,K], out row-major [M,N]."""
    return gemm_signature(arch, a=dtype, bias=dtype if has_bias else None, act=act)
