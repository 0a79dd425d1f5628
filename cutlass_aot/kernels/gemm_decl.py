"""What the three GEMM families declare alike: operands, the fused epilogue, fake tensors.

Build side. sm90_gemm (sm90.py), gemv (gemv.py) and sm80_gemm (sm80.py) take
the same operands, ``a[M,K] @ b[K,N] -> d[M,N]`` (optionally ``+ C``; rank 2
or 3, batched), and each compiles against symbolic fake tensors of the same
form. This module owns what they share:

* the operand parameters, their defaults and docs (a family narrows the
  majorness it accepts or adds a note to a doc by overriding one entry);
* the fused-epilogue parameters (bias, act) and the rule for the bias dtype;
* the signature a variant serves;
* the ``MxN`` text of tiles, clusters and warp grids;
* the fake tensors a compile traces with: dynamic extents, leading and batch
  strides that are dynamic multiples of the variant's alignment.

It is hashed into every key of the families that use it (each lists it among
its ``source_files``), because the fake tensors it builds are baked into
every artifact. Imports the CuTe DSL only inside the functions that compile,
so manifests validate without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..signature import DTYPE_BITS, GEMM_ACTS, Signature, gemm_signature

OPERAND_PARAMS: dict[str, tuple] = {
    "a": ("f16", "bf16"),
    "b": (None, "f16", "bf16"),
    "d": (None, "f16", "bf16", "f32"),
    "acc": ("f32",),
    "with_c": (False, True),
    "a_major": ("k", "m"),
    "b_major": ("k", "n"),
    "d_major": ("n", "m"),
    "rank": (2, 3),
}
OPERAND_DEFAULTS: dict[str, Any] = {
    "b": None,
    "d": None,
    "acc": "f32",
    "with_c": False,
    "a_major": "k",
    "b_major": "k",
    "d_major": "n",
    "rank": 2,
}
OPERAND_DOCS: dict[str, str] = {
    "a": "dtype of A",
    "b": "dtype of B; null (default) = A's",
    "d": "dtype of the output D and of C; null (default) = A's",
    "acc": "accumulator dtype (fp32 only)",
    "with_c": "true: D = alpha*A@B + beta*C, C shaped and laid out like D",
    "a_major": "contiguous dim of a[M,K]: k (row-major) or m (a transposed view)",
    "b_major": "contiguous dim of b[K,N]: n (row-major) or k (weight.t())",
    "d_major": "contiguous dim of d[M,N]: n (row-major) or m",
    "rank": "2 for [M,K]@[K,N], 3 for batched [L,M,K]@[L,K,N]",
}

EPILOGUE_PARAMS: dict[str, tuple] = {
    "bias": (None, "f16", "bf16", "f32"),
    "act": GEMM_ACTS,
}
EPILOGUE_DEFAULTS: dict[str, Any] = {"bias": None, "act": "none"}
EPILOGUE_DOCS: dict[str, str] = {
    "bias": "dtype of a per-column bias [N] added after alpha*AB + beta*C "
            "(D's dtype or f32); null: no bias",
    "act": "activation applied last: none, relu, gelu (tanh approximation), "
           "gelu_erf, silu",
}


def pair(text: str) -> tuple[int, int]:
    """``"128x64"`` -> (128, 64)."""
    m, n = text.split("x")
    return int(m), int(n)


def b_dtype(variant: Mapping[str, Any]) -> str:
    return variant["b"] or variant["a"]


def d_dtype(variant: Mapping[str, Any]) -> str:
    return variant["d"] or variant["a"]


def operand_problem(variant: Mapping[str, Any], why: str = "") -> str | None:
    """Why the variant's dtypes cannot be built (``why``: the MMA's reason), or None.

    A and B share one dtype; a bias is D's dtype or f32.
    """
    if b_dtype(variant) != variant["a"]:
        return "A and B must have the same dtype" + (f" ({why})" if why else "")
    bias = variant.get("bias")
    if bias is not None and bias not in (d_dtype(variant), "f32"):
        return f"bias must be D's dtype ({d_dtype(variant)}) or f32, not {bias}"
    return None


def variant_signature(variant: Mapping[str, Any], arch: str, align: int = 16) -> Signature:
    """The call signature a variant serves (``align``: the bytes it needs of
    every pointer and stride; a family without an epilogue has no bias/act)."""
    return gemm_signature(
        arch, a=variant["a"], b=b_dtype(variant), d=d_dtype(variant),
        c=d_dtype(variant) if variant["with_c"] else None,
        a_major=variant["a_major"], b_major=variant["b_major"], d_major=variant["d_major"],
        rank=variant["rank"], align=align, bias=variant.get("bias"),
        act=variant.get("act", "none"),
    )


def dsl_dtypes() -> dict[str, Any]:
    """The CuTe DSL's numeric type of each dtype name (imports the DSL)."""
    import cutlass  # noqa: PLC0415 - the DSL is imported only in build workers

    return {"f16": cutlass.Float16, "bf16": cutlass.BFloat16, "f32": cutlass.Float32}


def fake_operand(dtype: str, rows, cols, contiguous_last: bool, rank: int, batch,
                 align: int = 16):
    """A symbolic [rows, cols] (rank 2) or [batch, rows, cols] (rank 3) tensor.

    Its leading and batch strides are dynamic multiples of ``align`` bytes and
    its pointer is ``align``-byte aligned: what every call must then supply,
    which the artifact's own checks enforce at call time.
    """
    import cutlass.cute as cute  # noqa: PLC0415

    div = align * 8 // DTYPE_BITS[dtype]

    def stride():
        return cute.sym_int(divisibility=div) if div > 1 else cute.sym_int()

    ld = stride()
    inner = (ld, 1) if contiguous_last else (1, ld)
    if rank == 2:
        shape, strides = (rows, cols), inner
    else:
        shape, strides = (batch, rows, cols), (stride(), *inner)
    return cute.runtime.make_fake_tensor(dsl_dtypes()[dtype], shape, strides, assumed_align=align)


def fake_bias(dtype: str, n):
    """A contiguous bias of length ``n`` (the same symbol as B's and D's N, so the
    artifact refuses a bias of another length)."""
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.runtime.make_fake_tensor(dsl_dtypes()[dtype], (n,), (1,),
                                         assumed_align=DTYPE_BITS[dtype] // 8)
