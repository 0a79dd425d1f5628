"""The `sm80_gemm` kernel family: manifest parameters -> sm80_gemm kernels.

Build side. Declares the parameters a manifest may set, which combinations
are buildable, the signature each variant serves, and how to cross-compile
one with fake tensors (no GPU needed). Imports the CuTe DSL only inside
``compile`` so manifests validate without it.

The kernel (sm80_gemm.py: cp.async + ldmatrix + mma.sync) runs on every arch
from sm_80 on. It is built for the Ampere class (sm_80, sm_86, sm_89) and for
plain ``sm_90``, where it serves the operands the TMA family refuses.

Alignment: the ``align`` parameter (bytes: 16, 8, 4 or 2) is what the variant
needs of every tensor's data pointer and of its leading and batch strides,
and it is the signature's ``align`` field. It sets the width of the copies
from global memory (16 bytes: cp.async.cg; 8 and 4: cp.async.ca; 2: plain
loads, since cp.async moves at least 4 bytes). Extents (M, N, K) need no
alignment: edges are handled element by element. An f32 output is 4-byte
aligned by construction, so the artifact demands max(align, 4) of it.

Same run-side ABI as sm90 (``GEMM_ABI``): ``fn(a, b, d, alpha, sm_count)`` and,
with C, ``fn(a, b, d, c, alpha, beta, sm_count)``, tensors in their natural
torch shapes; ``sm_count`` is not used (one CTA per output tile).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..builder.family import KernelFamily
from ..layout import GEMM_ABI
from ..signature import DTYPE_BITS, Signature
from . import gemm_decl as decl

_TILES = ("64x64", "64x128", "128x64", "128x128", "128x256", "256x128")
_WARPS = ("1x2", "2x1", "2x2", "2x4", "4x2")
_ALIGNS = (16, 8, 4, 2)

# Shared memory a CTA may use (opt-in maximum), per arch, in bytes.
SMEM_CAPACITY = {
    "sm_80": 163 * 1024,
    "sm_86": 99 * 1024,
    "sm_89": 99 * 1024,
    "sm_90": 227 * 1024,
}

# A thread's fp32 accumulators above this would spill (255 registers).
_MAX_ACC_PER_THREAD = 128


def smem_bytes(variant: Mapping[str, Any]) -> int:
    """Shared memory the variant's A/B ring takes (16-bit inputs)."""
    tm, tn = decl.pair(variant["tile"])
    return variant["stages"] * (tm + tn) * variant["bk"] * DTYPE_BITS[variant["a"]] // 8


def tensor_align(variant: Mapping[str, Any], dtype: str) -> int:
    """Bytes the artifact requires of a tensor of ``dtype`` (pointer, strides)."""
    return max(variant["align"], DTYPE_BITS[dtype] // 8)


def _copy_covers(k_major: bool, mn: int, bk: int, vec: int, threads: int) -> bool:
    """Whether whole passes of the CTA's threads cover an (mn, bk) operand tile.

    Mirrors Sm80Gemm._gmem_copy: threads run along the contiguous dim (bk when
    k-major, mn otherwise), `vec` elements each, then step the other dim.
    """
    major, minor = (bk, mn) if k_major else (mn, bk)
    if major % vec:
        return False
    along = min(major // vec, threads)
    return threads % along == 0 and major % (along * vec) == 0 and minor % (threads // along) == 0


class Sm80GemmFamily(KernelFamily):
    """cp.async + ldmatrix + mma.sync multistage GEMM for sm_80/86/89 and sm_90."""

    name = "sm80_gemm"
    archs = ("sm_80", "sm_86", "sm_89", "sm_90")
    abi = GEMM_ABI
    symbol = "gemm"
    params = {
        **decl.OPERAND_PARAMS,
        "align": _ALIGNS,
        "tile": _TILES,
        "warps": _WARPS,
        "bk": (32, 64),
        "stages": (3, 4, 5, 6),  # the ring keeps stages-2 k-tiles in flight
        "swizzle": (1, 2, 4, 8),
    }
    defaults = {
        **decl.OPERAND_DEFAULTS,
        "align": 16,
        "tile": "128x128",
        "warps": "2x2",
        "bk": 32,
        "stages": 4,
        "swizzle": 1,
    }
    docs = {
        **decl.OPERAND_DOCS,
        "b": "dtype of B; null (default) = A's (mma.sync f16/bf16 takes one input type)",
        "align": "bytes every pointer and leading/batch stride is a multiple of "
                 "(16, 8, 4, 2); the copy width; part of the signature",
        "tile": "CTA tile MxN",
        "warps": "warp grid MxN of the CTA (32 threads each)",
        "bk": "k-tile depth in elements",
        "stages": "shared-memory pipeline depth (k-tiles in flight)",
        "swizzle": "consecutive M tiles that walk one band of N tiles (L2 reuse)",
    }

    def reject(self, variant: Mapping[str, Any], arch: str) -> str | None:
        if arch not in self.archs:
            return f"sm80_gemm targets {self.archs}, not {arch}"
        problem = decl.operand_problem(variant, "mma.sync f16/bf16 takes one input type")
        if problem:
            return problem
        tm, tn = decl.pair(variant["tile"])
        wm, wn = decl.pair(variant["warps"])
        # Problem-orientation tile; an m-major D swaps M and N inside the kernel,
        # which keeps these divisibility rules symmetric.
        if tm % (16 * wm) or tn % (16 * wn):
            return (f"tile {variant['tile']} does not split into 16x16 warp fragments "
                    f"over warps {variant['warps']}")
        threads = 32 * wm * wn
        if tm * tn // threads > _MAX_ACC_PER_THREAD:
            return (f"tile {variant['tile']} over {threads} threads holds "
                    f"{tm * tn // threads} fp32 accumulators per thread (max "
                    f"{_MAX_ACC_PER_THREAD}); use more warps or a smaller tile")
        elem = DTYPE_BITS[variant["a"]] // 8
        # Copy layout: `align` bytes per thread; the 2-byte path stages 16
        # contiguous bytes per thread in registers (see sm80_gemm._launch).
        vec = (16 if variant["align"] < 4 else min(variant["align"], 16)) // elem
        for k_major, mn in ((variant["a_major"] == "k", tm), (variant["b_major"] == "k", tn)):
            if not _copy_covers(k_major, mn, variant["bk"], vec, threads):
                return (f"tile {variant['tile']} x bk {variant['bk']} cannot be copied by "
                        f"{threads} threads in {variant['align']}-byte vectors")
        smem = smem_bytes(variant)
        cap = SMEM_CAPACITY[arch]
        if smem > cap:
            return (f"{smem} bytes of shared memory (tile {variant['tile']}, bk {variant['bk']}, "
                    f"stages {variant['stages']}) exceed {arch}'s {cap}")
        return None

    def signature(self, variant: Mapping[str, Any], arch: str) -> Signature:
        return decl.variant_signature(variant, arch, align=variant["align"])

    def source_files(self) -> list[Path]:
        here = Path(__file__).parent
        return [here / "sm80.py", here / "sm80_gemm.py", here / "views.py", here / "gemm_decl.py"]

    def compile(self, variant: Mapping[str, Any], arch: str, options: str) -> Any:
        import cutlass  # noqa: PLC0415 - the DSL is imported only in build workers
        import cutlass.cute as cute  # noqa: PLC0415

        from .sm80_gemm import Sm80Gemm, Sm80GemmConfig  # noqa: PLC0415

        tm, tn = decl.pair(variant["tile"])
        wm, wn = decl.pair(variant["warps"])
        config = Sm80GemmConfig(
            tile_m=tm,
            tile_n=tn,
            bk=variant["bk"],
            warps_m=wm,
            warps_n=wn,
            stages=variant["stages"],
            align=variant["align"],
            swizzle=variant["swizzle"],
            with_c=variant["with_c"],
        )
        rank = variant["rank"]
        m, n, k, batch = (cute.sym_int() for _ in range(4))

        def fake(dtype_name: str, rows, cols, contiguous_last: bool):
            # Pointers and leading/batch strides carry the variant's alignment.
            return decl.fake_operand(dtype_name, rows, cols, contiguous_last, rank, batch,
                                     align=tensor_align(variant, dtype_name))

        a = fake(variant["a"], m, k, variant["a_major"] == "k")
        b = fake(decl.b_dtype(variant), k, n, variant["b_major"] == "n")
        d = fake(decl.d_dtype(variant), m, n, variant["d_major"] == "n")
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        kernel = Sm80Gemm(config, rank, d_m_major=variant["d_major"] == "m")
        one, sms = cutlass.Float32(1.0), cutlass.Int32(0)
        if variant["with_c"]:
            c = fake(decl.d_dtype(variant), m, n, variant["d_major"] == "n")
            return cute.compile(kernel.run_with_c, a, b, d, c, one, one, sms, stream, options=options)
        return cute.compile(kernel.run, a, b, d, one, sms, stream, options=options)
