# Copyright (c) 2026 cutlass-aot authors.
#
# The structure of this kernel (a multistage cp.async ring of shared-memory
# k-tiles, swizzled shared layouts read with ldmatrix, a two-deep register
# pipeline feeding mma.sync, and the m-major output trick D^T = B^T A^T)
# follows NVIDIA's CuTe DSL Ampere example
# examples/python/CuTeDSL/cute/ampere/kernel/dense_gemm/tensorop_gemm.py,
# which carries this notice:
#
#   Copyright (c) 2025 - 2026 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
#   SPDX-License-Identifier: BSD-3-Clause
#
#   Redistribution and use in source and binary forms, with or without
#   modification, are permitted provided that the following conditions are met:
#   1. Redistributions of source code must retain the above copyright notice, this
#   list of conditions and the following disclaimer.
#   2. Redistributions in binary form must reproduce the above copyright notice,
#   this list of conditions and the following disclaimer in the documentation
#   and/or other materials provided with the distribution.
#   3. Neither the name of the copyright holder nor the names of its
#   contributors may be used to endorse or promote products derived from
#   this software without specific prior written permission.
#
#   THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
#   AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
#   IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
#   DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE
#   FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
#   DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
#   SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
#   CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
#   OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
#   OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
"""The SM80-class dense GEMM kernel: cp.async ring, ldmatrix, mma.sync.

Owns the CuTe DSL program for D = alpha * (A @ B) + beta * C on any GPU with
mma.sync (sm_80 and later; we build it for sm_80, sm_86, sm_89 and, for
operands TMA cannot take, sm_90). Build side only: imports the CuTe DSL and
must never be imported by the run side.

One CTA computes a tile_m x tile_n block of D with warps_m x warps_n warps:

* k-tiles of A and B (bk deep) stream through ``stages`` shared-memory slots.
  Each thread copies vectors of ``align`` bytes (the widest the operands'
  alignment allows): cp.async for 4, 8 and 16 bytes, a plain load/store for
  2 bytes, since cp.async cannot move fewer than 4.
* Edges are exact at element granularity. A vector lying wholly inside the
  operand is copied as one; a vector that crosses the edge of the contiguous
  extent (K = 2049 with 16-byte aligned strides, say) is copied element by
  element; everything outside is written as zero, so no k-tile reads stale
  shared memory. Leading and batch strides need only the ``align`` bytes;
  extents are free.
* ldmatrix brings 16x16 fragments into registers one k-block ahead of the
  mma.sync m16n8k16 that consumes them; accumulation is fp32.
* The epilogue scales by alpha, adds beta * C when the variant reads C, and
  stores straight from the accumulators with a bounds check per element, so
  D and C need no more alignment than their element size. For an m-major D
  the kernel computes D^T = B^T A^T, so each thread's adjacent accumulators
  are adjacent in memory in both cases.

Static (baked in): dtypes, majorness, tile, warps, bk, stages, alignment,
raster swizzle, whether C is read, rank. Dynamic (per call): M, N, K, L,
strides, alpha, beta. ``sm_count`` is accepted for the shared GEMM ABI and not
used: the grid covers the output, one CTA per tile.

The caller's tensors arrive in their natural PyTorch shapes (a[M,K] or
a[L,M,K], b[K,N], d[M,N]); the (M,K,L)/(N,K,L)/(M,N,L) views are made here at
trace time, as in sm90_gemm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils as utils

from .views import to_mkl, to_nkl

# mma.sync m16n8k16 for f16/bf16 inputs.
_MMA_SHAPE = (16, 8, 16)


@dataclass(frozen=True)
class Sm80GemmConfig:
    """Static choices that define one kernel variant (problem orientation)."""

    tile_m: int
    tile_n: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int
    align: int  # bytes the operands' pointers and strides are known to satisfy
    swizzle: int  # CTAs of consecutive M tiles that share a band of N tiles
    with_c: bool

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n


def smem_bytes(tile_m: int, tile_n: int, bk: int, stages: int, elem_bytes: int = 2) -> int:
    """Shared memory of the A/B ring (the epilogue uses none)."""
    return stages * (tile_m + tile_n) * bk * elem_bytes


def _check_c_fragment(tiled_mma: cute.TiledMma, bm: int, bn: int) -> None:
    """Trace-time proof of what the epilogue's predicates assume.

    The epilogue computes one row predicate per (mode (0,1), mode 1) and one
    column predicate per (mode (0,0), mode 2) of the accumulator fragment.
    That holds when rows depend only on the former and columns only on the
    latter; check it on thread 0's static coordinates and refuse to build
    otherwise.
    """
    crd = tiled_mma.get_slice(0).partition_C(cute.make_identity_tensor((bm, bn)))
    shape = crd.shape
    if cute.size(shape[0]) != 4:
        raise ValueError(f"unexpected mma.sync C fragment {shape}")
    for h in range(2):
        for v in range(2):
            for mi in range(cute.size(shape[1])):
                for ni in range(cute.size(shape[2])):
                    row, col = crd[(h, v), mi, ni]
                    if row != crd[(0, v), mi, 0][0] or col != crd[(h, 0), 0, ni][1]:
                        raise ValueError(f"mma.sync C fragment {shape} is not row/column "
                                         "separable; the epilogue predicates would be wrong")


def _per_element(t: cute.Tensor) -> cute.Tensor:
    """Prepend a unit mode so a one-element copy atom walks every element."""
    return cute.make_tensor(t.iterator, cute.prepend(t.layout, cute.make_layout(1)))


def _transpose_mn(t: cute.Tensor) -> cute.Tensor:
    """(M, N, L) -> (N, M, L)."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 0, 2]))


class Sm80Gemm:
    """One compile-able GEMM variant; see the module docstring."""

    def __init__(self, config: Sm80GemmConfig, rank: int, d_m_major: bool):
        self.cfg = config
        self.rank = rank
        self.acc_dtype = cutlass.Float32
        # An m-major D is computed as D^T = B^T A^T: the kernel's "M" is the
        # problem's N. The tile and warp grid are given in problem terms and
        # swapped with it, so the manifest's tile=MxN always means M x N.
        self.swap = d_m_major
        if self.swap:
            self.bm, self.bn = config.tile_n, config.tile_m
            self.wm, self.wn = config.warps_n, config.warps_m
        else:
            self.bm, self.bn = config.tile_m, config.tile_n
            self.wm, self.wn = config.warps_m, config.warps_n
        self.bk = config.bk
        self.threads = config.threads

    # ------------------------------------------------------------------ host
    @cute.jit
    def run_with_c(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        d: cute.Tensor,
        c: cute.Tensor,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        sm_count: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        """D = alpha * A @ B + beta * C on the caller's stream."""
        self._launch(a, b, d, c, alpha, beta, stream)

    @cute.jit
    def run(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        d: cute.Tensor,
        alpha: cutlass.Float32,
        sm_count: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        """D = alpha * A @ B on the caller's stream."""
        self._launch(a, b, d, d, alpha, cutlass.Float32(0.0), stream)

    @cute.jit
    def _launch(self, a, b, d, c, alpha, beta, stream):
        mA = to_mkl(a, self.rank, zero_batch_stride=True)
        mB = to_nkl(b, self.rank, zero_batch_stride=True)
        mD = to_mkl(d, self.rank, zero_batch_stride=True)
        mC = to_mkl(c, self.rank, zero_batch_stride=True)
        if cutlass.const_expr(self.swap):
            mA, mB = mB, mA
            mD = _transpose_mn(mD)
            mC = _transpose_mn(mC)

        self.ab_dtype = mA.element_type
        self.d_dtype = mD.element_type
        self.c_dtype = mC.element_type
        a_major = utils.LayoutEnum.from_tensor(mA)
        b_major = utils.LayoutEnum.from_tensor(mB)
        self.a_k_major = a_major == utils.LayoutEnum.ROW_MAJOR
        self.b_k_major = b_major == utils.LayoutEnum.ROW_MAJOR

        # Copies move `vec` elements: the operands' alignment, at most 16 bytes.
        elem_bytes = self.ab_dtype.width // 8
        self.vec = max(1, min(self.cfg.align, 16) // elem_bytes)
        copy_bits = self.vec * self.ab_dtype.width
        # cp.async moves 4, 8 or 16 bytes; 2-byte operands go through registers.
        self.staged = copy_bits < 32

        sA_layout, sA_swizzle = self._smem_layout(self.a_k_major, self.bm)
        sB_layout, sB_swizzle = self._smem_layout(self.b_k_major, self.bn)

        if cutlass.const_expr(copy_bits >= 32):
            g2s_op = cute.nvgpu.cpasync.CopyG2SOp(
                cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL
                if copy_bits == 128
                else cute.nvgpu.LoadCacheMode.ALWAYS
            )
        else:
            g2s_op = cute.nvgpu.CopyUniversalOp()
        g2s_atom = cute.make_copy_atom(g2s_op, self.ab_dtype, num_bits_per_copy=copy_bits)
        # The 2-byte path still gives each thread 16 contiguous bytes of a row:
        # eight 2-byte loads off one address register, then one 16-byte
        # shared-memory store (`stash_*`), instead of eight scattered rows.
        lay_vec = 128 // self.ab_dtype.width if self.staged else self.vec
        copy_a = self._gmem_copy(g2s_atom, self.a_k_major, self.bm, lay_vec)
        copy_b = self._gmem_copy(g2s_atom, self.b_k_major, self.bn, lay_vec)
        stash_a, stash_b = copy_a, copy_b
        if cutlass.const_expr(self.staged):
            s_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.ab_dtype,
                                         num_bits_per_copy=128)
            stash_a = self._gmem_copy(s_atom, self.a_k_major, self.bm, lay_vec)
            stash_b = self._gmem_copy(s_atom, self.b_k_major, self.bn, lay_vec)

        mma_op = cute.nvgpu.warp.MmaF16BF16Op(self.ab_dtype, self.acc_dtype, _MMA_SHAPE)
        # N of the tiled MMA is 16 per warp so that one ldmatrix.x4 feeds two
        # n8 atoms of B.
        tiled_mma = cute.make_tiled_mma(
            mma_op,
            cute.make_layout((self.wm, self.wn, 1)),
            permutation_mnk=(self.wm * _MMA_SHAPE[0], self.wn * _MMA_SHAPE[1] * 2, _MMA_SHAPE[2]),
        )

        _check_c_fragment(tiled_mma, self.bm, self.bn)

        tiles = cute.ceil_div(mD.shape, (self.bm, self.bn, 1))
        f = self.cfg.swizzle
        grid = (
            cute.size(tiles[0]) * f,
            (cute.size(tiles[1]) + f - 1) // f,
            cute.size(tiles[2]),
        )
        self.kernel(
            mA, mB, mD, mC, alpha, beta,
            sA_layout, sA_swizzle, sB_layout, sB_swizzle,
            copy_a, copy_b, stash_a, stash_b, g2s_atom, tiled_mma,
        ).launch(grid=grid, block=[self.threads, 1, 1], stream=stream)

    def _smem_layout(self, k_major: bool, mn: int):
        """Staged (mn, bk, stages) layout, swizzled for conflict-free ldmatrix.

        The swizzle permutes 16-byte chunks, so copies of any width up to 16
        bytes land in one chunk and stay contiguous.
        """
        width = self.ab_dtype.width
        major = self.bk if k_major else mn
        major = min(major, 1024 // width)  # at most 128 bytes per atom row
        bits = min(int(math.log2(major * width // 128)), 3)
        swizzle = cute.make_swizzle(bits, 4, int(math.log2(128 // width)))
        if k_major:
            atom = cute.make_layout((8, major), stride=(major, 1))
        else:
            atom = cute.make_layout((major, 8), stride=(1, major))
        return cute.tile_to_shape(atom, (mn, self.bk, self.cfg.stages), (0, 1, 2)), swizzle

    def _gmem_copy(self, atom, k_major: bool, mn: int, v: int):
        """Threads laid out along the contiguous dim, `v` elements each."""
        if k_major:
            along = min(self.bk // v, self.threads)
            threads = cute.make_layout((self.threads // along, along), stride=(along, 1))
            values = cute.make_layout((1, v))
        else:
            along = min(mn // v, self.threads)
            threads = cute.make_layout((along, self.threads // along), stride=(1, along))
            values = cute.make_layout((v, 1))
        return cute.make_tiled_copy_tv(atom, threads, values)

    # ---------------------------------------------------------------- device
    @cute.jit
    def _load_tile(self, tiled_copy, tXgX, tXsX, tXcX, extent, k_tile, slot):
        """Copy k-tile `k_tile` of one operand into smem slot `slot`, exactly.

        tXgX/tXcX: (CPY, CPY_MN, CPY_K, k_tiles) gmem values and coordinates;
        tXsX: (CPY, CPY_MN, CPY_K, stages). `extent` is the operand's (MN, K).
        """
        for i in cutlass.range_constexpr(cute.size(tXgX, mode=[1])):
            for j in cutlass.range_constexpr(cute.size(tXgX, mode=[2])):
                src = tXgX[None, i, j, k_tile]
                dst = tXsX[None, i, j, slot]
                crd = tXcX[None, i, j, k_tile]
                last = crd[cute.size(crd) - 1]
                if cute.elem_less(last, extent):
                    cute.copy(tiled_copy, src, dst)
                else:
                    for e in range(cute.size(src)):
                        val = self.ab_dtype(0)
                        if cute.elem_less(crd[e], extent):
                            val = src[e]
                        dst[e] = val

    @cute.jit
    def _fetch(self, atom, tXgX, tXcX, extent, k_tile, regs, pred):
        """Registers <- k-tile `k_tile` of one operand, one element per copy.

        The 2-byte path: cp.async cannot move 2 bytes, so loads go to
        registers first (issued a k-tile ahead of their use, so their latency
        hides behind the mma.sync of the current k-tile) and ``_stash`` writes
        them to shared memory later. Elements outside the operand are zero.
        """
        src = tXgX[None, None, None, k_tile]
        crd = tXcX[None, None, None, k_tile]
        for i in cutlass.range_constexpr(cute.size(regs)):
            pred[i] = cute.elem_less(crd[i], extent)
        regs.fill(0.0)
        cute.copy(atom, _per_element(src), _per_element(regs), pred=_per_element(pred))

    @cute.jit
    def _stash(self, tiled_copy, regs, tXsX, slot):
        """Shared memory slot <- registers from ``_fetch`` (16-byte stores).

        ``regs`` is compact in the gmem partition's element order, which is
        the stash partition's too (same thread and value layouts), so a
        compact view with the stash partition's shape lines them up.
        """
        dst = tXsX[None, None, None, slot]
        cute.copy(tiled_copy, cute.make_tensor(regs.iterator, cute.make_layout(dst.shape)), dst)

    @cute.kernel
    def kernel(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mD: cute.Tensor,
        mC: cute.Tensor,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        sA_layout: cute.Layout,
        sA_swizzle: cute.Swizzle,
        sB_layout: cute.Layout,
        sB_swizzle: cute.Swizzle,
        copy_a: cute.TiledCopy,
        copy_b: cute.TiledCopy,
        stash_a: cute.TiledCopy,
        stash_b: cute.TiledCopy,
        g2s_atom: cute.CopyAtom,
        tiled_mma: cute.TiledMma,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, bidz = cute.arch.block_idx()
        tiles = cute.ceil_div(mD.shape, (self.bm, self.bn, 1))
        f = self.cfg.swizzle
        tile_m = bidx // f
        tile_n = bidx % f + bidy * f
        if tile_m < tiles[0] and tile_n < tiles[1]:
            tiler = (self.bm, self.bn, self.bk)
            coord = (tile_m, tile_n, None)
            a2 = mA[None, None, bidz]
            b2 = mB[None, None, bidz]
            d2 = mD[None, None, bidz]
            a_extent = (mA.shape[0], mA.shape[1])
            b_extent = (mB.shape[0], mB.shape[1])
            d_extent = (mD.shape[0], mD.shape[1])

            # (bM, bK, k_tiles), (bN, bK, k_tiles), (bM, bN)
            gA = cute.local_tile(a2, tiler=tiler, coord=coord, proj=(1, None, 1))
            gB = cute.local_tile(b2, tiler=tiler, coord=coord, proj=(None, 1, 1))
            gD = cute.local_tile(d2, tiler=tiler, coord=coord, proj=(1, 1, None))
            cA = cute.local_tile(cute.make_identity_tensor(a_extent), tiler=tiler,
                                 coord=coord, proj=(1, None, 1))
            cB = cute.local_tile(cute.make_identity_tensor(b_extent), tiler=tiler,
                                 coord=coord, proj=(None, 1, 1))
            cD = cute.local_tile(cute.make_identity_tensor(d_extent), tiler=tiler,
                                 coord=coord, proj=(1, 1, None))

            @cute.struct
            class Storage:
                a: cute.struct.Align[
                    cute.struct.MemRange[self.ab_dtype, cute.cosize(sA_layout)], 128
                ]
                b: cute.struct.Align[
                    cute.struct.MemRange[self.ab_dtype, cute.cosize(sB_layout)], 128
                ]

            storage = cutlass.utils.SmemAllocator().allocate(Storage)
            sA = storage.a.get_tensor(sA_layout, swizzle=sA_swizzle)
            sB = storage.b.get_tensor(sB_layout, swizzle=sB_swizzle)

            thr_a = copy_a.get_slice(tidx)
            thr_b = copy_b.get_slice(tidx)
            tAgA = thr_a.partition_S(gA)
            tAcA = thr_a.partition_S(cA)
            tBgB = thr_b.partition_S(gB)
            tBcB = thr_b.partition_S(cB)
            # Same element ownership; the staged path stores 16 bytes at once.
            tAsA = stash_a.get_slice(tidx).partition_D(sA)
            tBsB = stash_b.get_slice(tidx).partition_D(sB)

            stages = self.cfg.stages
            k_tiles = cute.size(tAgA, mode=[3])

            # ---- prologue: fill stages-1 slots
            if cutlass.const_expr(self.staged):
                rA = cute.make_rmem_tensor(tAgA[None, None, None, 0].shape, self.ab_dtype)
                rB = cute.make_rmem_tensor(tBgB[None, None, None, 0].shape, self.ab_dtype)
                pA = cute.make_rmem_tensor(rA.shape, cutlass.Boolean)
                pB = cute.make_rmem_tensor(rB.shape, cutlass.Boolean)
                for s in range(stages - 1):
                    if s < k_tiles:
                        self._fetch(g2s_atom, tAgA, tAcA, a_extent, s, rA, pA)
                        self._fetch(g2s_atom, tBgB, tBcB, b_extent, s, rB, pB)
                        self._stash(stash_a, rA, tAsA, s)
                        self._stash(stash_b, rB, tBsB, s)
            else:
                for s in range(stages - 1):
                    if s < k_tiles:
                        self._load_tile(copy_a, tAgA, tAsA, tAcA, a_extent, s, s)
                        self._load_tile(copy_b, tBgB, tBsB, tBcB, b_extent, s, s)
                    cute.arch.cp_async_commit_group()

            thr_mma = tiled_mma.get_slice(tidx)
            tCsA = thr_mma.partition_A(sA)
            tCsB = thr_mma.partition_B(sB)
            tCgD = thr_mma.partition_C(gD)
            tCcD = thr_mma.partition_C(cD)
            tCrA = tiled_mma.make_fragment_A(tCsA[None, None, None, 0])
            tCrB = tiled_mma.make_fragment_B(tCsB[None, None, None, 0])
            acc = tiled_mma.make_fragment_C(tCgD)
            acc.fill(0.0)

            ldsm_a = cute.make_copy_atom(
                cute.nvgpu.warp.LdMatrix8x8x16bOp(not self.a_k_major, 4), self.ab_dtype
            )
            ldsm_b = cute.make_copy_atom(
                cute.nvgpu.warp.LdMatrix8x8x16bOp(not self.b_k_major, 4), self.ab_dtype
            )
            s2r_a = cute.make_tiled_copy_A(ldsm_a, tiled_mma)
            s2r_b = cute.make_tiled_copy_B(ldsm_b, tiled_mma)
            thr_s2r_a = s2r_a.get_slice(tidx)
            thr_s2r_b = s2r_b.get_slice(tidx)
            tCsA_v = thr_s2r_a.partition_S(sA)
            tCrA_v = thr_s2r_a.retile(tCrA)
            tCsB_v = thr_s2r_b.partition_S(sB)
            tCrB_v = thr_s2r_b.retile(tCrB)

            read = 0
            write = stages - 1
            tCsA_p = tCsA_v[None, None, None, read]
            tCsB_p = tCsB_v[None, None, None, read]
            k_blocks = cute.size(tCrA, mode=[2])

            if cutlass.const_expr(not self.staged):
                cute.arch.cp_async_wait_group(stages - 2)
            cute.arch.sync_threads()
            cute.copy(s2r_a, tCsA_p[None, None, 0], tCrA_v[None, None, 0])
            cute.copy(s2r_b, tCsB_p[None, None, 0], tCrB_v[None, None, 0])

            # ---- mainloop: smem ring (gmem -> smem) and a register pipeline
            # (smem -> rmem one k-block ahead of the mma).
            next_tile = stages - 1
            stash_slot = write
            for _kt in range(k_tiles):
                for kb in cutlass.range(k_blocks, unroll_full=True):
                    if kb == k_blocks - 1:
                        if cutlass.const_expr(self.staged):
                            # The registers fetched at k-block 0 go to the slot
                            # every thread finished reading before the last
                            # barrier; the barrier below publishes them.
                            if next_tile - 1 < k_tiles:
                                self._stash(stash_a, rA, tAsA, stash_slot)
                                self._stash(stash_b, rB, tBsB, stash_slot)
                        tCsA_p = tCsA_v[None, None, None, read]
                        tCsB_p = tCsB_v[None, None, None, read]
                        if cutlass.const_expr(not self.staged):
                            cute.arch.cp_async_wait_group(stages - 2)
                        cute.arch.sync_threads()
                    kb_next = (kb + 1) % k_blocks
                    cute.copy(s2r_a, tCsA_p[None, None, kb_next], tCrA_v[None, None, kb_next])
                    cute.copy(s2r_b, tCsB_p[None, None, kb_next], tCrB_v[None, None, kb_next])
                    if kb == 0:
                        if cutlass.const_expr(self.staged):
                            if next_tile < k_tiles:
                                self._fetch(g2s_atom, tAgA, tAcA, a_extent, next_tile, rA, pA)
                                self._fetch(g2s_atom, tBgB, tBcB, b_extent, next_tile, rB, pB)
                            stash_slot = write
                        else:
                            if next_tile < k_tiles:
                                self._load_tile(copy_a, tAgA, tAsA, tAcA, a_extent, next_tile, write)
                                self._load_tile(copy_b, tBgB, tBsB, tBcB, b_extent, next_tile, write)
                            cute.arch.cp_async_commit_group()
                        next_tile = next_tile + 1
                        write = read
                        read = read + 1
                        if read == stages:
                            read = 0
                    cute.gemm(tiled_mma, acc, tCrA[None, None, kb], tCrB[None, None, kb], acc)

            if cutlass.const_expr(not self.staged):
                cute.arch.cp_async_wait_group(0)

            # ---- epilogue: alpha (and beta * C), bounds-checked per element.
            # One predicate per element, then predicated element copies: no
            # branch per element (which costs seconds of compile time).
            # The mma.sync C fragment is ((cols 2, rows 2), MMA_M, MMA_N): rows
            # depend on modes (0,1) and 1 only, columns on (0,0) and 2 only, so
            # 2*MMA_M + 2*MMA_N comparisons give every element's predicate.
            mma_m = cute.size(acc, mode=[1])
            mma_n = cute.size(acc, mode=[2])
            row_ok = cute.make_rmem_tensor((2, mma_m), cutlass.Boolean)
            col_ok = cute.make_rmem_tensor((2, mma_n), cutlass.Boolean)
            for h in cutlass.range_constexpr(2):
                for mi in cutlass.range_constexpr(mma_m):
                    row_ok[h, mi] = tCcD[(0, h), mi, 0][0] < d_extent[0]
                for ni in cutlass.range_constexpr(mma_n):
                    col_ok[h, ni] = tCcD[(h, 0), 0, ni][1] < d_extent[1]
            ok = cute.make_rmem_tensor(acc.shape, cutlass.Boolean)
            for h in cutlass.range_constexpr(2):
                for v in cutlass.range_constexpr(2):
                    for mi in cutlass.range_constexpr(mma_m):
                        for ni in cutlass.range_constexpr(mma_n):
                            ok[(h, v), mi, ni] = row_ok[v, mi] & col_ok[h, ni]
            out = cute.make_rmem_tensor(acc.shape, self.d_dtype)
            if cutlass.const_expr(self.cfg.with_c):
                gC = cute.local_tile(mC[None, None, bidz], tiler=tiler, coord=coord,
                                     proj=(1, 1, None))
                tCgC = thr_mma.partition_C(gC)
                cin = cute.make_rmem_tensor(acc.shape, self.c_dtype)
                cin.fill(0.0)
                c_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.c_dtype)
                cute.copy(c_atom, _per_element(tCgC), _per_element(cin), pred=_per_element(ok))
                out.store((acc.load() * alpha + cin.load().to(self.acc_dtype) * beta).to(self.d_dtype))
            else:
                out.store((acc.load() * alpha).to(self.d_dtype))
            d_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.d_dtype)
            cute.copy(d_atom, _per_element(out), _per_element(tCgD), pred=_per_element(ok))


__all__ = ["Sm80Gemm", "Sm80GemmConfig", "smem_bytes"]
