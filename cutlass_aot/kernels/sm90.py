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
from ..signature import Signature, gemm_abi_args
from . import gemm_decl as decl

# Narrow N tiles (16, 32, 48, 64) serve swap-AB's token dimension in decode
# (48: 33..48 tokens in one tile, as cuBLAS's 128x40 and 128x48 do); 32 and
# 48 also serve unswapped as weight panels under a 64-row token tile (6144
# rows: 128 panels of 48, one wave). Swapped, a tile below 64 wide holds
# the tokens and clusters along M only (along N it would multicast the
# weight over padding); unswapped panels may cluster along N too (r42:
# correct, but slower than the K-cluster at every decode width measured);
# 144 and 160 serve an N (or, swapped, an M) just past 128 or 256 with less
# padding than 192 or 256. The 192-row tiles (three consumer warpgroups of
# 64 rows) fill a wave where 128 and 256 rows leave a partial one. 192 is
# their widest N: with 512 threads ptxas gives each instruction at most 128
# registers whatever setmaxnreg grants, and a 64x208 wgmma's accumulators
# alone take 104 (it refuses 192x208: "Insufficient registers (128)").
# 64- and 128-row tiles 80, 96 and 112 wide split a decode weight into
# about one wave (10240 rows: 128 tiles of 80), as cuBLAS does at 64..128
# tokens. 128-row tiles 176..240 wide cut a narrow N (or, swapped, a few
# hundred tokens) into a tile count near a whole wave, as cuBLAS's 128x208
# and 160x192 do (benchmarks/cublas_kernels.py): 814 tokens make 4 tiles of
# 208 where 256 leaves 4 with 20% padding and 192 makes 5. 256x176 does the
# same for a large M: 4180 x 1160 is 119 tiles of 256x176 (126 in 2x1
# clusters), one wave, where 128x240 makes 165 and 256x192 needs 7 columns
# of tiles anyway. 176 is the widest 256-row tile without spills: ptxas
# spills about 5.9 KB a thread at 256x208 (two warpgroups of 128x208, 208
# accumulators each), none at 176 (2026-12-02, ptxas -v).
_TILES = ("64x16", "64x32", "64x48", "64x64", "64x80", "64x96", "64x112", "64x128", "64x256",
          "128x16", "128x32", "128x48", "128x64", "128x80", "128x96", "128x112",
          "128x128", "128x144", "128x160", "128x176", "128x192", "128x208", "128x224",
          "128x240", "128x256", "192x128", "192x160",
          "192x192", "256x128", "256x144", "256x160", "256x176", "256x192")
# The kernel's entry point for each argument list of the ABI.
_ENTRY = {
    (False, False, False): "run", (True, False, False): "run_c",
    (False, True, False): "run_bias", (True, True, False): "run_c_bias",
    (False, False, True): "run_sk", (True, False, True): "run_c_sk",
    (False, True, True): "run_bias_sk", (True, True, True): "run_c_bias_sk",
}
_CLUSTERS = ("1x1", "2x1", "1x2", "2x2", "4x1", "1x4")


class Sm90GemmFamily(KernelFamily):
    """TMA + wgmma, warp-specialized, persistent GEMM for sm_90a."""

    name = "sm90_gemm"
    archs = ("sm_90a",)
    abi = GEMM_ABI
    symbol = "gemm"
    params = {
        **decl.OPERAND_PARAMS,
        "tile": _TILES,
        "cluster": _CLUSTERS,
        "raster": ("m", "n"),
        "swizzle": (1, 2, 4, 8),
        "swap_ab": (False, True),
        "split_k": (False, True),
        "pingpong": (False, True),
        "k_cluster": (1, 2, 3, 4),
        "promote": (0, 4, 8, 16),
        **decl.EPILOGUE_PARAMS,
    }
    defaults = {
        **decl.OPERAND_DEFAULTS,
        "tile": "128x256",
        "cluster": "1x1",
        "raster": "m",
        "swizzle": 1,
        "swap_ab": False,
        "split_k": False,
        "pingpong": False,
        "k_cluster": 1,
        "promote": 0,
        **decl.EPILOGUE_DEFAULTS,
    }
    docs = {
        **decl.OPERAND_DOCS,
        "b": "dtype of B; null (default) = A's (wgmma takes one 16-bit input type)",
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
                   "waves, tails and splits count whole clusters. The same artifact runs "
                   "stream-K when the run side passes split count 0: the last wave's "
                   "k-blocks dealt out evenly to the SMs, runs crossing tile edges",
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
        "promote": "k-stages (64 of K each) between promotions of the wgmma accumulators "
                   "into a second fp32 register set (4, 8, 16; 0: off): the tensor core's "
                   "own accumulation loses bits over a long K (r71: 0.02-0.027 elementwise "
                   "at K 51k-57k, 0.0039 promoted, cuBLAS 0.004-0.009). Tiles of at most 64 "
                   "accumulators a thread (128x64, 64x128 and narrower); not with pingpong",
        **decl.EPILOGUE_DOCS,
    }

    def reject(self, variant: Mapping[str, Any], arch: str) -> str | None:
        if arch not in self.archs:
            return f"sm90_gemm targets {self.archs}, not {arch}"
        problem = decl.operand_problem(variant, "wgmma f16/bf16 takes one input type")
        if problem:
            return problem
        tm, tn = decl.pair(variant["tile"])
        cm, cn = decl.pair(variant["cluster"])
        if tn < 32 and not variant["swap_ab"]:
            return (f"tile {variant['tile']}: N tiles below 32 are for swap-AB decode "
                    "variants (set swap_ab: true)")
        if tn < 64 and cn > 1 and variant["swap_ab"]:
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
        if variant["promote"]:
            if variant["pingpong"]:
                return "promote does not combine with pingpong (set promote 0 or pingpong false)"
            wgs = 3 if tm == 192 else 2 if tm >= 128 and tm * tn > 128 * 128 else 1
            if tm * tn // (wgs * 128) > 64:
                return (f"tile {variant['tile']}: promote keeps a second fp32 copy of the "
                        f"accumulators ({tm * tn // (wgs * 128)} a thread here); use a tile of at "
                        "most 64 a thread (128x64, 64x128 or narrower) or promote 0")
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
        return decl.variant_signature(variant, arch)

    def source_files(self) -> list[Path]:
        here = Path(__file__).parent
        return [here / "sm90.py", here / "sm90_gemm.py", here / "views.py", here / "gemm_decl.py"]

    def compile(self, variant: Mapping[str, Any], arch: str, options: str) -> Any:
        import cutlass  # noqa: PLC0415 - the DSL is imported only in build workers
        import cutlass.cute as cute  # noqa: PLC0415

        from .sm90_gemm import Sm90Gemm, Sm90GemmConfig  # noqa: PLC0415

        tm, tn = decl.pair(variant["tile"])
        cm, cn = decl.pair(variant["cluster"])
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
            promote=variant["promote"],
        )
        rank = variant["rank"]
        m, n, k, batch = (cute.sym_int() for _ in range(4))

        def fake(dtype_name: str, rows, cols, contiguous_last: bool):
            return decl.fake_operand(dtype_name, rows, cols, contiguous_last, rank, batch)

        a = fake(variant["a"], m, k, variant["a_major"] == "k")
        b = fake(decl.b_dtype(variant), k, n, variant["b_major"] == "n")
        d = fake(decl.d_dtype(variant), m, n, variant["d_major"] == "n")
        kernel = Sm90Gemm(config, rank)
        with_bias = variant["bias"] is not None
        values = {
            "a": a, "b": b, "d": d,
            "c": fake(decl.d_dtype(variant), m, n, variant["d_major"] == "n")
            if variant["with_c"] else None,
            "bias": decl.fake_bias(variant["bias"], n) if with_bias else None,
            "workspace": cute.runtime.make_fake_tensor(
                cutlass.Float32, (cute.sym_int(),), (1,), assumed_align=16),
            "alpha": cutlass.Float32(1.0), "beta": cutlass.Float32(1.0),
            "splits": cutlass.Int32(1), "sm_count": cutlass.Int32(132),
        }
        names = gemm_abi_args(with_c=variant["with_c"], bias=with_bias, split_k=variant["split_k"])
        entry = getattr(kernel, _ENTRY[(variant["with_c"], with_bias, variant["split_k"])])
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return cute.compile(entry, *(values[x] for x in names), stream, options=options)
