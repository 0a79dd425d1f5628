"""The `gemv` kernel family: manifest parameters -> decode GEMV kernels.

Build side. Declares the parameters a manifest may set, which combinations
are buildable, the signature each variant serves, and how to cross-compile
one with fake tensors (no GPU needed). Imports the CuTe DSL only inside
``compile`` so manifests validate without it.

A gemv variant serves the same signatures as sm90_gemm's nn.Linear variants
(A k-major, B k-major: ``x @ w.t()``) on sm_90a, so the run side weighs it
against them per call (run/select.py models it as a stream of the weight).
It is correct at any M (one pass per ``tokens`` rows of A, each re-reading
the weight), and fast only at a few tokens. Its ``tile`` is the output
block of one CTA, tokens x weight rows, in the same M x N sense as
sm90_gemm's tiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..builder.family import KernelFamily
from ..layout import GEMM_ABI
from ..signature import DTYPE_BITS, GEMM_ACTS, Signature, gemm_abi_args, gemm_signature

# tokens x weight rows per CTA.
_TILES = ("1x2", "1x4", "1x8", "2x2", "2x4", "4x2", "4x4", "8x2", "8x4")
_ENTRY = {(False, False): "run", (True, False): "run_c", (False, True): "run_bias",
          (True, True): "run_c_bias"}


def _pair(text: str) -> tuple[int, int]:
    m, n = text.split("x")
    return int(m), int(n)


def _d(variant: Mapping[str, Any]) -> str:
    return variant["d"] or variant["a"]


class GemvFamily(KernelFamily):
    """Few tokens x a K-contiguous weight on CUDA cores, for decode (sm_90a)."""

    name = "gemv"
    archs = ("sm_90a",)
    abi = GEMM_ABI
    symbol = "gemm"
    params = {
        "a": ("f16", "bf16"),
        "b": (None, "f16", "bf16"),
        "d": (None, "f16", "bf16", "f32"),
        "acc": ("f32",),
        "with_c": (False, True),
        "a_major": ("k",),
        "b_major": ("k",),
        "d_major": ("n", "m"),
        "rank": (2, 3),
        "tile": _TILES,
        "gemv": (True,),
        "bias": (None, "f16", "bf16", "f32"),
        "act": GEMM_ACTS,
    }
    defaults = {
        "b": None,
        "d": None,
        "acc": "f32",
        "with_c": False,
        "a_major": "k",
        "b_major": "k",
        "d_major": "n",
        "rank": 2,
        "tile": "1x4",
        "gemv": True,
        "bias": None,
        "act": "none",
    }
    docs = {
        "a": "dtype of A",
        "b": "dtype of B; null (default) = A's",
        "d": "dtype of the output D and of C; null (default) = A's",
        "acc": "accumulator dtype (fp32 only)",
        "with_c": "true: D = alpha*A@B + beta*C, C shaped and laid out like D",
        "a_major": "contiguous dim of a[M,K]: k only (rows of tokens)",
        "b_major": "contiguous dim of b[K,N]: k only (weight.t() of a row-major weight)",
        "d_major": "contiguous dim of d[M,N]: n (row-major) or m",
        "rank": "2 for [M,K]@[K,N], 3 for batched [L,M,K]@[L,K,N]",
        "tile": "output block of one CTA: tokens (rows of A per pass) x weight rows",
        "gemv": "fixed (true): marks the variant as a CUDA-core weight stream for selection",
        "bias": "dtype of a per-column bias [N] added after alpha*AB + beta*C "
                "(D's dtype or f32); null: no bias",
        "act": "activation applied last: none, relu, gelu (tanh approximation), "
               "gelu_erf, silu",
    }

    def reject(self, variant: Mapping[str, Any], arch: str) -> str | None:
        if arch not in self.archs:
            return f"gemv targets {self.archs}, not {arch}"
        b = variant["b"] or variant["a"]
        if b != variant["a"]:
            return "A and B must have the same dtype"
        if variant["bias"] is not None and variant["bias"] not in (_d(variant), "f32"):
            return f"bias must be D's dtype ({_d(variant)}) or f32, not {variant['bias']}"
        return None

    def signature(self, variant: Mapping[str, Any], arch: str) -> Signature:
        return gemm_signature(
            arch, a=variant["a"], b=variant["b"] or variant["a"], d=_d(variant),
            c=_d(variant) if variant["with_c"] else None,
            a_major=variant["a_major"], b_major=variant["b_major"], d_major=variant["d_major"],
            rank=variant["rank"], align=16, bias=variant["bias"], act=variant["act"],
        )

    def source_files(self) -> list[Path]:
        here = Path(__file__).parent
        return [here / "gemv.py", here / "gemv_kernel.py", here / "views.py"]

    def compile(self, variant: Mapping[str, Any], arch: str, options: str) -> Any:
        import cutlass  # noqa: PLC0415 - the DSL is imported only in build workers
        import cutlass.cute as cute  # noqa: PLC0415

        from .gemv_kernel import Gemv, GemvConfig  # noqa: PLC0415

        dtypes = {"f16": cutlass.Float16, "bf16": cutlass.BFloat16, "f32": cutlass.Float32}
        tokens, rows = _pair(variant["tile"])
        with_bias = variant["bias"] is not None
        config = GemvConfig(rows=rows, tokens=tokens, with_c=variant["with_c"], bias=with_bias,
                            act=variant["act"])
        rank = variant["rank"]
        m, n, k, batch = (cute.sym_int() for _ in range(4))

        def fake(dtype_name: str, rows_, cols, contiguous_last: bool):
            # Leading and batch strides: dynamic, 16-byte divisible (checked per call).
            div = 128 // DTYPE_BITS[dtype_name]
            ld = cute.sym_int(divisibility=div)
            inner = (ld, 1) if contiguous_last else (1, ld)
            if rank == 2:
                shape, stride = (rows_, cols), inner
            else:
                shape, stride = (batch, rows_, cols), (cute.sym_int(divisibility=div), *inner)
            return cute.runtime.make_fake_tensor(dtypes[dtype_name], shape, stride,
                                                 assumed_align=16)

        b_dtype = variant["b"] or variant["a"]
        values = {
            "a": fake(variant["a"], m, k, True),
            "b": fake(b_dtype, k, n, False),
            "d": fake(_d(variant), m, n, variant["d_major"] == "n"),
            "c": fake(_d(variant), m, n, variant["d_major"] == "n") if variant["with_c"] else None,
            "bias": cute.runtime.make_fake_tensor(
                dtypes[variant["bias"]], (n,), (1,), assumed_align=DTYPE_BITS[variant["bias"]] // 8)
            if with_bias else None,
            "alpha": cutlass.Float32(1.0), "beta": cutlass.Float32(1.0),
            "sm_count": cutlass.Int32(132),
        }
        kernel = Gemv(config, rank)
        names = gemm_abi_args(with_c=variant["with_c"], bias=with_bias, split_k=False)
        entry = getattr(kernel, _ENTRY[(variant["with_c"], with_bias)])
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return cute.compile(entry, *(values[x] for x in names), stream, options=options)
