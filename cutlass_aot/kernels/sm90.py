"""The `sm90_gemm` kernel family: manifest parameters -> sm90_gemm kernels.

Build side. Declares the parameters a manifest may set, which combinations
are buildable, the signature each variant serves, and how to cross-compile
one with fake tensors (no GPU needed). Imports the CuTe DSL only inside
``compile`` so manifests validate without it.

Alignment: every variant needs 16-byte aligned pointers and leading/batch
strides that are multiples of 16 bytes (8 elements of f16/bf16, 4 of f32),
which is what TMA requires. Smaller alignments are not served by this family:
the run side raises ArgumentError naming the misaligned tensor (copy it with
``.contiguous()`` into a padded buffer, or use torch.mm).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..builder.family import KernelFamily
from ..layout import GEMM_ABI
from ..signature import DTYPE_BITS, Signature

_TILES = ("64x128", "64x256", "128x64", "128x128", "128x256", "256x128")
_CLUSTERS = ("1x1", "2x1", "1x2", "2x2")


def _pair(text: str) -> tuple[int, int]:
    m, n = text.split("x")
    return int(m), int(n)


def _b(variant: Mapping[str, Any]) -> str:
    return variant["b"] or variant["a"]


def _d(variant: Mapping[str, Any]) -> str:
    return variant["d"] or variant["a"]


class Sm90GemmFamily(KernelFamily):
    """TMA + wgmma, warp-specialized, persistent GEMM for sm_90a."""

    name = "sm90_gemm"
    archs = ("sm_90a",)
    abi = GEMM_ABI
    symbol = "gemm"
    params = {
        "a": ("f16", "bf16"),
        "b": (None, "f16", "bf16"),
        "d": (None, "f16", "bf16", "f32"),
        "acc": ("f32",),
        "with_c": (False, True),
        "a_major": ("k", "m"),
        "b_major": ("k", "n"),
        "d_major": ("n", "m"),
        "rank": (2, 3),
        "tile": _TILES,
        "cluster": _CLUSTERS,
        "raster": ("m", "n"),
        "swizzle": (1, 2, 4, 8),
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
        "tile": "128x256",
        "cluster": "1x1",
        "raster": "m",
        "swizzle": 1,
    }
    docs = {
        "a": "dtype of A",
        "b": "dtype of B; null (default) = A's (wgmma takes one 16-bit input type)",
        "d": "dtype of the output D and of C; null (default) = A's",
        "acc": "accumulator dtype (fp32 only)",
        "with_c": "true: D = alpha*A@B + beta*C, C shaped and laid out like D",
        "a_major": "contiguous dim of a[M,K]: k (row-major) or m (a transposed view)",
        "b_major": "contiguous dim of b[K,N]: n (row-major) or k (weight.t())",
        "d_major": "contiguous dim of d[M,N]: n (row-major) or m",
        "rank": "2 for [M,K]@[K,N], 3 for batched [L,M,K]@[L,K,N]",
        "tile": "CTA tile MxN (k-block is 64)",
        "cluster": "thread-block cluster MxN (TMA multicast across it)",
        "raster": "persistent schedule walks tiles along m or n first",
        "swizzle": "cluster swizzle width of the schedule (L2 reuse)",
    }

    def reject(self, variant: Mapping[str, Any], arch: str) -> str | None:
        if arch not in self.archs:
            return f"sm90_gemm targets {self.archs}, not {arch}"
        if _b(variant) != variant["a"]:
            return "A and B must have the same dtype (wgmma f16/bf16 takes one input type)"
        return None

    def signature(self, variant: Mapping[str, Any], arch: str) -> Signature:
        return Signature.make(
            "gemm",
            arch,
            {
                "a": variant["a"],
                "b": _b(variant),
                "d": _d(variant),
                "c": _d(variant) if variant["with_c"] else None,
                "a_major": variant["a_major"],
                "b_major": variant["b_major"],
                "d_major": variant["d_major"],
                "rank": variant["rank"],
                "align": 16,
            },
        )

    def source_files(self) -> list[Path]:
        here = Path(__file__).parent
        return [here / "sm90.py", here / "sm90_gemm.py"]

    def compile(self, variant: Mapping[str, Any], arch: str, options: str) -> Any:
        import cutlass  # noqa: PLC0415 - the DSL is imported only in build workers
        import cutlass.cute as cute  # noqa: PLC0415

        from .sm90_gemm import Sm90Gemm, Sm90GemmConfig  # noqa: PLC0415

        dtypes = {"f16": cutlass.Float16, "bf16": cutlass.BFloat16, "f32": cutlass.Float32}
        tm, tn = _pair(variant["tile"])
        cm, cn = _pair(variant["cluster"])
        config = Sm90GemmConfig(
            tile_m=tm,
            tile_n=tn,
            cluster_m=cm,
            cluster_n=cn,
            raster_along_m=variant["raster"] == "m",
            swizzle=variant["swizzle"],
            with_c=variant["with_c"],
        )
        rank = variant["rank"]
        m, n, k, batch = (cute.sym_int() for _ in range(4))

        def fake(dtype_name: str, rows, cols, contiguous_last: bool):
            # Leading and batch strides are dynamic but 16-byte divisible,
            # which the artifact's own checks enforce at call time.
            div = 128 // DTYPE_BITS[dtype_name]
            ld = cute.sym_int(divisibility=div)
            inner = (ld, 1) if contiguous_last else (1, ld)
            if rank == 2:
                shape, stride = (rows, cols), inner
            else:
                shape, stride = (batch, rows, cols), (cute.sym_int(divisibility=div), *inner)
            return cute.runtime.make_fake_tensor(
                dtypes[dtype_name], shape, stride, assumed_align=16
            )

        a = fake(variant["a"], m, k, variant["a_major"] == "k")
        b = fake(_b(variant), k, n, variant["b_major"] == "n")
        d = fake(_d(variant), m, n, variant["d_major"] == "n")
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        kernel = Sm90Gemm(config, rank)
        one, sms = cutlass.Float32(1.0), cutlass.Int32(132)
        if variant["with_c"]:
            c = fake(_d(variant), m, n, variant["d_major"] == "n")
            return cute.compile(kernel.run_with_c, a, b, d, c, one, one, sms, stream, options=options)
        return cute.compile(kernel.run, a, b, d, one, sms, stream, options=options)
