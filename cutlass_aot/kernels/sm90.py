"""The `sm90_gemm` kernel family: manifest parameters -> sm90_gemm kernels.

Build side. Declares the parameters a manifest may set, which combinations
are buildable, the signature each variant serves, and how to cross-compile
one with fake tensors (no GPU needed). Imports the CuTe DSL only inside
``compile`` so manifests validate without it.

Alignment: every variant needs 16-byte aligned pointers and leading/batch
strides that are multiples of 16 bytes (8 elements of f16/bf16, 4 of f32),
which is what TMA requires. The run side serves smaller alignments by
staging the misaligned operands into 16-byte pitched scratch, or routes them
to a low-alignment family (run/dispatch.py decides).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..builder.family import KernelFamily
from ..layout import GEMM_ABI, GEMM_SPLITK_ABI
from ..signature import DTYPE_BITS, GEMM_ACTS, Signature, gemm_abi_args, gemm_signature

# Narrow N tiles (16, 32, 64) serve swap-AB's token dimension in decode;
# 144 and 160 serve an N (or, swapped, an M) just past 128 or 256 with less
# padding than 192 or 256.
_TILES = ("64x16", "64x32", "64x64", "64x128", "64x256", "128x16", "128x32", "128x64",
          "128x128", "128x144", "128x160", "128x192", "128x256", "256x128", "256x144",
          "256x160", "256x192")
# The kernel's entry point for each argument list of the ABI.
_ENTRY = {
    (False, False, False): "run", (True, False, False): "run_c",
    (False, True, False): "run_bias", (True, True, False): "run_c_bias",
    (False, False, True): "run_sk", (True, False, True): "run_c_sk",
    (False, True, True): "run_bias_sk", (True, True, True): "run_c_bias_sk",
}
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
        "swap_ab": (False, True),
        "split_k": (False, True),
        "pingpong": (False, True),
        "k_cluster": (1, 2, 3, 4),
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
        "tile": "128x256",
        "cluster": "1x1",
        "raster": "m",
        "swizzle": 1,
        "swap_ab": False,
        "split_k": False,
        "pingpong": False,
        "k_cluster": 1,
        "bias": None,
        "act": "none",
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
        "swizzle": "cluster swizzle width of the schedule (L2 reuse); the last band is "
                   "as wide as the tiles left, so it never pads",
        "swap_ab": "true: compute D^T = B^T A^T so M (tokens) lands on the tile's narrow N; "
                   "for decode (small M) with tiles like 128x16 .. 128x64",
        "split_k": "true: a data-parallel + split-K hybrid: whole waves of tiles run "
                   "full-K, the last partial wave's tiles are split K ways across the "
                   "idle SMs (all tiles when there are fewer tiles than SMs); the run side "
                   "picks the split count per call and passes fp32 scratch; partials are "
                   "summed in a fixed order by a second kernel (bit-identical run to run); "
                   "waves, tails and splits count whole clusters",
        "pingpong": "true: the two consumer warpgroups take alternate tiles, each with its "
                    "own accumulators, so one tile's epilogue runs while the other's "
                    "mainloop uses the tensor cores (short K, many tiles); tiles up to "
                    "128x128 or 64x256 (128 accumulators a thread); not with split_k",
        "k_cluster": "CTAs of a thread-block cluster that share each tile's K (2..4): the "
                     "others push their fp32 partials into the first CTA's shared memory, "
                     "which sums them in rank order and runs the epilogue (no workspace, no "
                     "second kernel, bit-identical run to run); 1: off. Tiles of at most "
                     "128x64 (the partials live in shared memory); cluster 1x1, not with "
                     "split_k or pingpong",
        "bias": "dtype of a per-column bias [N] added after alpha*AB + beta*C "
                "(D's dtype or f32); null: no bias",
        "act": "activation applied last: none, relu, gelu (tanh approximation), "
               "gelu_erf, silu",
    }

    def reject(self, variant: Mapping[str, Any], arch: str) -> str | None:
        if arch not in self.archs:
            return f"sm90_gemm targets {self.archs}, not {arch}"
        if _b(variant) != variant["a"]:
            return "A and B must have the same dtype (wgmma f16/bf16 takes one input type)"
        if variant["bias"] is not None and variant["bias"] not in (_d(variant), "f32"):
            return f"bias must be D's dtype ({_d(variant)}) or f32, not {variant['bias']}"
        tm, tn = _pair(variant["tile"])
        cm, cn = _pair(variant["cluster"])
        if tn < 64 and not variant["swap_ab"]:
            return (f"tile {variant['tile']}: N tiles below 64 are for swap-AB decode "
                    "variants (set swap_ab: true)")
        if tn < 64 and cm * cn > 1 and cn > 1:
            return f"tile {variant['tile']}: narrow N tiles take clusters along M only"
        if variant["k_cluster"] > 1:
            if cm * cn > 1:
                return (f"k_cluster {variant['k_cluster']} takes the whole cluster along K: "
                        f"set cluster 1x1, not {variant['cluster']}")
            if variant["split_k"] or variant["pingpong"]:
                return "k_cluster does not combine with split_k or pingpong (set them false)"
            if tm * tn > 128 * 64:
                return (f"tile {variant['tile']}: k_cluster keeps the other CTAs' fp32 partials "
                        "in shared memory; use a tile of at most 128x64")
        if variant["pingpong"]:
            if variant["split_k"]:
                return "pingpong does not combine with split_k (set one of them false)"
            if tm * tn > 128 * 128:
                return (f"tile {variant['tile']}: a pingpong warpgroup holds the whole tile; "
                        "use at most 128x128 or 64x256 (128 accumulators a thread)")
        return None

    def abi_for(self, variant: Mapping[str, Any]) -> str:
        return GEMM_SPLITK_ABI if variant["split_k"] else GEMM_ABI

    def signature(self, variant: Mapping[str, Any], arch: str) -> Signature:
        return gemm_signature(
            arch, a=variant["a"], b=_b(variant), d=_d(variant),
            c=_d(variant) if variant["with_c"] else None,
            a_major=variant["a_major"], b_major=variant["b_major"], d_major=variant["d_major"],
            rank=variant["rank"], align=16, bias=variant["bias"], act=variant["act"],
        )

    def source_files(self) -> list[Path]:
        here = Path(__file__).parent
        return [here / "sm90.py", here / "sm90_gemm.py", here / "views.py"]

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
            swap_ab=variant["swap_ab"],
            split_k=variant["split_k"],
            bias=variant["bias"] is not None,
            act=variant["act"],
            pingpong=variant["pingpong"],
            k_cluster=variant["k_cluster"],
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
        kernel = Sm90Gemm(config, rank)
        with_bias = variant["bias"] is not None
        values = {
            "a": a, "b": b, "d": d,
            "c": fake(_d(variant), m, n, variant["d_major"] == "n") if variant["with_c"] else None,
            # Same symbolic N as B and D: the artifact refuses a bias of another length.
            "bias": cute.runtime.make_fake_tensor(
                dtypes[variant["bias"]], (n,), (1,), assumed_align=DTYPE_BITS[variant["bias"]] // 8)
            if with_bias else None,
            "workspace": cute.runtime.make_fake_tensor(
                cutlass.Float32, (cute.sym_int(),), (1,), assumed_align=16),
            "alpha": cutlass.Float32(1.0), "beta": cutlass.Float32(1.0),
            "splits": cutlass.Int32(1), "sm_count": cutlass.Int32(132),
        }
        names = gemm_abi_args(with_c=variant["with_c"], bias=with_bias, split_k=variant["split_k"])
        entry = getattr(kernel, _ENTRY[(variant["with_c"], with_bias, variant["split_k"])])
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return cute.compile(entry, *(values[x] for x in names), stream, options=options)
