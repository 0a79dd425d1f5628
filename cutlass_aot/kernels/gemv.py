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
block of one warp, tokens x weight rows, in the same M x N sense as
sm90_gemm's tiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..builder.family import KernelFamily
from ..layout import GEMM_ABI
from ..signature import Signature, gemm_abi_args
from . import gemm_decl as decl

# tokens x weight rows per warp.
_TILES = ("1x1", "1x2", "1x4", "1x8", "2x1", "2x2", "2x4", "4x1", "4x2", "4x4", "8x1", "8x2", "8x4")
_ENTRY = {(False, False): "run", (True, False): "run_c", (False, True): "run_bias",
          (True, True): "run_c_bias"}


class GemvFamily(KernelFamily):
    """Few tokens x a K-contiguous weight on CUDA cores, for decode (sm_90a)."""

    name = "gemv"
    archs = ("sm_90a",)
    abi = GEMM_ABI
    symbol = "gemm"
    params = {
        **decl.OPERAND_PARAMS,
        "a_major": ("k",),
        "b_major": ("k",),
        "tile": _TILES,
        "gemv": (True,),
        **decl.EPILOGUE_PARAMS,
    }
    defaults = {
        **decl.OPERAND_DEFAULTS,
        "tile": "1x4",
        "gemv": True,
        **decl.EPILOGUE_DEFAULTS,
    }
    docs = {
        **decl.OPERAND_DOCS,
        "a_major": "contiguous dim of a[M,K]: k only (rows of tokens)",
        "b_major": "contiguous dim of b[K,N]: k only (weight.t() of a row-major weight)",
        "tile": "output block of one warp: tokens (rows of A per pass) x weight rows",
        "gemv": "fixed (true): marks the variant as a CUDA-core weight stream for selection",
        **decl.EPILOGUE_DOCS,
    }

    def reject(self, variant: Mapping[str, Any], arch: str) -> str | None:
        if arch not in self.archs:
            return f"gemv targets {self.archs}, not {arch}"
        return decl.operand_problem(variant)

    def signature(self, variant: Mapping[str, Any], arch: str) -> Signature:
        return decl.variant_signature(variant, arch)

    def source_files(self) -> list[Path]:
        here = Path(__file__).parent
        return [here / "gemv.py", here / "gemv_kernel.py", here / "views.py", here / "gemm_decl.py"]

    def compile(self, variant: Mapping[str, Any], arch: str, options: str) -> Any:
        import cutlass  # noqa: PLC0415 - the DSL is imported only in build workers
        import cutlass.cute as cute  # noqa: PLC0415

        from .gemv_kernel import Gemv, GemvConfig  # noqa: PLC0415

        tokens, rows = decl.pair(variant["tile"])
        with_bias = variant["bias"] is not None
        config = GemvConfig(rows=rows, tokens=tokens, with_c=variant["with_c"], bias=with_bias,
                            act=variant["act"])
        rank = variant["rank"]
        m, n, k, batch = (cute.sym_int() for _ in range(4))

        def fake(dtype_name: str, rows_, cols, contiguous_last: bool):
            return decl.fake_operand(dtype_name, rows_, cols, contiguous_last, rank, batch)

        d_major_n = variant["d_major"] == "n"
        values = {
            "a": fake(variant["a"], m, k, True),
            "b": fake(decl.b_dtype(variant), k, n, False),
            "d": fake(decl.d_dtype(variant), m, n, d_major_n),
            "c": fake(decl.d_dtype(variant), m, n, d_major_n) if variant["with_c"] else None,
            "bias": decl.fake_bias(variant["bias"], n) if with_bias else None,
            "alpha": cutlass.Float32(1.0), "beta": cutlass.Float32(1.0),
            "sm_count": cutlass.Int32(132),
        }
        kernel = Gemv(config, rank)
        names = gemm_abi_args(with_c=variant["with_c"], bias=with_bias, split_k=False)
        entry = getattr(kernel, _ENTRY[(variant["with_c"], with_bias)])
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return cute.compile(entry, *(values[x] for x in names), stream, options=options)
