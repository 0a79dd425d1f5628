"""The SM90 dense GEMM kernel: TMA loads, wgmma, warp-specialized, persistent.

Owns the CuTe DSL program for D = alpha * (A @ B) + beta * C on Hopper
(sm_90a). Build side only: this module imports the CuTe DSL and must never be
imported by the run side.

Structure of one CTA (threads = 128 * (1 + consumer warpgroups)):

* warpgroup 0 is the producer. One of its warps walks the persistent tile
  schedule and issues TMA loads of A and B k-blocks into a ring of shared
  memory stages (multicast across the cluster when the cluster is wider than
  one CTA). It gives most of its registers away (setmaxnreg).
* warpgroups 1..n are consumers. They walk the same schedule, wait for each
  stage, issue wgmma into fp32 accumulators, release the stage, and run the
  epilogue: scale by alpha, optionally add beta * C and a bias vector (C
  read from global memory at static offsets in tiles wholly inside D, and
  in the last row and column of tiles at each coordinate clamped into D,
  unbranched, so nothing past C is read and the loads overlap; the
  bias of a tile inside D read into registers before its mainloop, each
  distinct value once, and per element with bounds checks on the edges), apply the
  activation, convert, stage through shared memory with stmatrix and store
  with TMA (which clips rows and columns past the problem edge).

Split-K variants run a data-parallel + split-K hybrid, after the stream-K
idea of balancing only the last wave (Osama et al., "Stream-K", 2023, and
CUTLASS's sm90 stream-K scheduler, whose data-parallel + stream-K mode it
simplifies): with T tiles on P SMs, the first floor(T/P)*P tiles run whole
(full K, straight to D) and the T mod P tiles of the last partial wave are
each split S ways along K, so S times as many SMs share them. The split
units write fp32 partials to a workspace the caller provides (from torch's
allocator); a second kernel sums each tile's partials in split order, several
CTAs per tile with many splits' loads in flight, and runs the epilogue. It is
a programmatic dependent launch: the GEMM lets it launch at once, and its
CTAs wait (griddepcontrol.wait) for the GEMM grid to finish, so its launch
latency hides behind the GEMM. No
atomics, no flags: the same inputs give the same bits every run. With fewer
tiles than SMs every tile is split (plain split-K). With clusters, T counts
cluster tiles and P cluster slots (SMs / cluster size).

The same artifact runs stream-K when the run side passes splits = 0 (the
split-K ABI v3): the whole waves still run data-parallel, and the k-blocks
of the last partial wave's tiles, taken as one sequence (tile after tile),
are dealt out evenly to the P slots, each a contiguous run that may start
and end inside a tile (Osama et al.'s stream-K proper). A slot that covers a
whole tile writes it to D; a piece of a tile goes to the workspace, in the
slot of its place among the tile's pieces, and the second kernel sums a
tile's pieces in that order. So the last wave is balanced to a k-block
whatever T mod P is, where split-K balances only to a split of a tile (70
tiles on 132 SMs: split-K cannot split them at all, 140 > 132; stream-K
gives each SM 0.53 of a tile). The plan's arithmetic is
``signature.streamk_plan``'s, which the run side uses to size the
workspace; the kernel repeats it in device integers.

A slot runs its pieces last tile first. A run that crosses a tile edge is
the end of tile t (from k-block s) and the start of tile t + 1 (to k-block
e); taking t + 1 first puts every crossing slot at k-block j at the j-th
step of its run, and then, on tile t, at k-block j + (k-blocks per tile -
run length): the same offset for every slot. Neighbouring tail tiles, which
share an operand band in the walk's order, then read the same k-slice of it
at the same time, so L2 serves the second read. Taken first-tile-first,
neighbouring slots stood (k-blocks per tile - run length) apart in K, and on
long K no operand slice survived in L2 between them: 24791x608x38128 (256x160
m8, 124 tail tiles on 132 SMs, 596 k-blocks) ran 1.25-1.29x slower than the
plain variant in r18/r19, about what reading each tail tile's A band from
HBM once per tile column costs.

K-cluster variants (``k_cluster`` = 2..4) split every tile's K among the
CTAs of a thread-block cluster instead: each CTA of the cluster runs the
same tile over its own share of the k-blocks, the others push their fp32
accumulators into the first CTA's shared memory (st.async, counted by an
mbarrier's transaction bytes) and the first CTA sums them in rank order
and runs the epilogue. No workspace, no second kernel, no global traffic
for the partials, and the same bits every run. The first CTA tells the
others when their buffer is free again (a remote mbarrier arrive); each
waits for that before it writes the next tile's partial, and before it
exits. For small tiles (the partials live in shared memory next to the
ring), in decode and few-tile problems where split-K's second pass and
its partials cost more than the mainloop saves.

Promoted variants (``promote`` = P, r71) keep a second fp32 register set
beside the wgmma accumulators: every P k-stages (P x 64 of K) the consumer
waits for its wgmmas, adds the accumulators into that set on the CUDA
cores, and the next stage's first wgmma overwrites them (its accumulate
flag off: no other instruction writes a wgmma accumulator inside the
mainloop, which would make ptxas serialize every wgmma). The tensor core's
own fp32 accumulation loses bits over a long K: r71's accuracy probe (H100)
read elementwise errors of 0.02-0.027 at K 51,000-57,000 against cuBLAS's
0.004-0.009, every option's error pulled toward zero, and promotion every
4 or 16 stages brought them to 0.0039, the bf16 rounding of the output. It
costs the small swapped decode tiles 0.5% of their time (32 pairs timed
interleaved, at most 3.6%) and large tiles 14-59% (the second register
set and the drains), so the catalog
promotes decode tiles only (DeepGEMM promotes its FP8 accumulators the
same way).

Every launch, the GEMM's and the reduce pass's, is a programmatic dependent
launch, both ways (the scheme of CUTLASS's dependent kernel launches): the
grid may be scheduled before the kernel ahead of it on the stream has
finished, does its set-up (barriers, descriptor prefetch, the tile walk's
arithmetic) and then waits (griddepcontrol.wait) for that kernel's grid to
finish and its writes to be visible before it touches global memory; and it
lets the kernel behind it launch (griddepcontrol.launch_dependents) once
all of its own CTAs run. A persistent grid has every CTA resident by then,
so the next grid only takes SMs this one leaves, and waits the same way.
With a predecessor that does not trigger early (most of torch's kernels),
the wait returns when that kernel ends, as without PDL.

What is static (baked into the artifact): dtypes, majorness of every operand,
tile and cluster shape, raster order and swizzle, whether C is read, the
rank of the caller's tensors. What is dynamic (read per call): M, N, K, L,
leading and batch strides, alpha, beta, and the number of SMs of the GPU the
call runs on, from which the persistent grid is sized. Nothing about the
product (H100, H200, H20) is baked in.

The caller's tensors are taken in their natural PyTorch shapes, a[M,K] or
a[L,M,K], b[K,N] or b[L,K,N], d[M,N] or d[L,M,N]; the re-indexing into CuTe's
(M,K,L)/(N,K,L)/(M,N,L) views happens at trace time (views.py), so the run
side never builds a torch view on its hot path.

Credit: the structure of this kernel (producer/consumer warpgroups over a
TMA + mbarrier pipeline, the persistent tile scheduler, wgmma mainloop and a
TMA-store epilogue) follows NVIDIA's CuTe DSL Hopper persistent dense GEMM
example, examples/python/CuTeDSL/hopper/dense_gemm_persistent.py in
https://github.com/NVIDIA/cutlass, which is distributed under the
BSD-3-Clause license below. The code in this file is our own.

    Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
    SPDX-License-Identifier: BSD-3-Clause

    Redistribution and use in source and binary forms, with or without
    modification, are permitted provided that the following conditions are met:

    1. Redistributions of source code must retain the above copyright notice,
       this list of conditions and the following disclaimer.

    2. Redistributions in binary form must reproduce the above copyright
       notice, this list of conditions and the following disclaimer in the
       documentation and/or other materials provided with the distribution.

    3. Neither the name of the copyright holder nor the names of its
       contributors may be used to endorse or promote products derived from
       this software without specific prior written permission.

    THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
    AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
    IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE
    ARE DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE
    LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR
    CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF
    SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS
    INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN
    CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE)
    ARISING IN ANY WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF ADVISED OF THE
    POSSIBILITY OF SUCH DAMAGE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from .views import activate, swap_mn, to_mkl, to_nkl

# Bytes reserved for mbarriers and alignment slack when sizing the A/B ring.
_BARRIER_BYTES = 1024
# Epilogue staging buffers in shared memory (TMA store ring depth).
_EPI_STAGES = 4
# wgmma issues 16-wide k slices; a k-block is four of them.
_K_BLOCK = 64
_THREADS_PER_WG = 128
# Register split between producer and consumer warpgroups (setmaxnreg), by
# consumer warpgroups. The CTA starts with 64K registers / threads each (168
# with 384 threads, 128 with 512); what the producer gives back is all the
# consumers may take, or setmaxnreg.inc would wait forever: 128*(168-40) =
# 256*(232-168), and with three consumers 128*(128-40) >= 384*(152-128).
_REGS = {1: (40, 232), 2: (40, 232), 3: (40, 152)}
# An edge tile with C loads this many of a thread's C elements at once (the
# largest divisor of its accumulator count up to it): enough loads in
# flight to cover their latency, few enough registers beside 128 fp32
# accumulators.
_C_EDGE_GROUP = 32


def _c_edge_group(acc_size: int) -> int:
    """The elements an edge tile's C loads take at once (``_C_EDGE_GROUP``)."""
    return max(g for g in range(1, min(acc_size, _C_EDGE_GROUP) + 1) if acc_size % g == 0)


@dataclass(frozen=True)
class Sm90GemmConfig:
    """Static choices that define one kernel variant."""

    tile_m: int
    tile_n: int
    cluster_m: int
    cluster_n: int
    raster_along_m: bool
    swizzle: int
    with_c: bool
    swap_ab: bool = False
    split_k: bool = False
    bias: bool = False
    act: str = "none"
    pingpong: bool = False
    k_cluster: int = 1
    promote: int = 0  # k-stages between accumulator promotions (module docstring); 0: off

    @property
    def consumer_wgs(self) -> int:
        # Pingpong: two consumer warpgroups, each on its own tile. Otherwise
        # two consumer warpgroups split M once a 128-row tile is wider than
        # 128: one warpgroup holding 144+ fp32 accumulators per thread leaves
        # too few registers for the epilogue (192 spills). A 192-row tile
        # takes three, 64 rows each (wgmma's M is 64 per warpgroup, so two
        # cannot split 192).
        if self.pingpong:
            return 2
        if self.tile_m == 192:
            return 3
        return 2 if self.tile_m >= 128 and self.tile_m * self.tile_n > 128 * 128 else 1

    @property
    def mma_wgs(self) -> int:
        """Consumer warpgroups that share one tile (1 under pingpong)."""
        return 1 if self.pingpong else self.consumer_wgs


def _ceil_div(x, y: int):
    return (x + (y - 1)) // y


class Sm90Gemm:
    """One compiled-able GEMM variant; see the module docstring."""

    def __init__(self, config: Sm90GemmConfig, rank: int):
        self.cfg = config
        self.rank = rank
        self.acc_dtype = cutlass.Float32
        self.cluster_mn = (config.cluster_m, config.cluster_n)
        # K-cluster: CTAs per cluster that share each tile's K (module
        # docstring); its cluster is (k_cluster, 1), cluster_mn stays (1, 1).
        self.k_cluster = config.k_cluster
        self.atom_layout_mnk = (config.mma_wgs, 1, 1)
        self.num_consumer_wgs = config.consumer_wgs
        # Threads that compute one tile: every consumer thread, or one
        # warpgroup's under pingpong.
        self.mma_threads = config.mma_wgs * _THREADS_PER_WG
        self.threads_per_cta = (1 + self.num_consumer_wgs) * _THREADS_PER_WG
        self.producer_warp = 0
        self.smem_capacity = utils.get_smem_capacity_in_bytes("sm_90")
        # Epilogue buffers: one ring per warpgroup that runs an epilogue.
        self.epi_rings = 2 if config.pingpong else 1

    # ------------------------------------------------------------------ host
    # One entry point per argument list of the ABI (signature.gemm_abi_args):
    # C, bias and the split-K workspace are present only in the variants
    # that use them, so a plain call converts no tensor it does not need.
    @cute.jit
    def run(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor,
            alpha: cutlass.Float32, sm_count: cutlass.Int32, stream: cuda.CUstream):
        """D = act(alpha * A @ B)."""
        self._launch(a, b, d, None, None, None, alpha, cutlass.Float32(0.0), cutlass.Int32(1), sm_count, stream)

    @cute.jit
    def run_c(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
              alpha: cutlass.Float32, beta: cutlass.Float32, sm_count: cutlass.Int32,
              stream: cuda.CUstream):
        """D = act(alpha * A @ B + beta * C)."""
        self._launch(a, b, d, c, None, None, alpha, beta, cutlass.Int32(1), sm_count, stream)

    @cute.jit
    def run_bias(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, bias: cute.Tensor,
                 alpha: cutlass.Float32, sm_count: cutlass.Int32, stream: cuda.CUstream):
        """D = act(alpha * A @ B + bias)."""
        self._launch(a, b, d, None, bias, None, alpha, cutlass.Float32(0.0), cutlass.Int32(1), sm_count, stream)

    @cute.jit
    def run_c_bias(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
                   bias: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
                   sm_count: cutlass.Int32, stream: cuda.CUstream):
        """D = act(alpha * A @ B + beta * C + bias)."""
        self._launch(a, b, d, c, bias, None, alpha, beta, cutlass.Int32(1), sm_count, stream)

    @cute.jit
    def run_sk(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, workspace: cute.Tensor,
               alpha: cutlass.Float32, splits: cutlass.Int32, sm_count: cutlass.Int32,
               stream: cuda.CUstream):
        """Split-K: D = act(alpha * A @ B)."""
        self._launch(a, b, d, None, None, workspace, alpha, cutlass.Float32(0.0), splits, sm_count, stream)

    @cute.jit
    def run_c_sk(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
                 workspace: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
                 splits: cutlass.Int32, sm_count: cutlass.Int32, stream: cuda.CUstream):
        """Split-K: D = act(alpha * A @ B + beta * C)."""
        self._launch(a, b, d, c, None, workspace, alpha, beta, splits, sm_count, stream)

    @cute.jit
    def run_bias_sk(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, bias: cute.Tensor,
                    workspace: cute.Tensor, alpha: cutlass.Float32, splits: cutlass.Int32,
                    sm_count: cutlass.Int32, stream: cuda.CUstream):
        """Split-K: D = act(alpha * A @ B + bias)."""
        self._launch(a, b, d, None, bias, workspace, alpha, cutlass.Float32(0.0), splits, sm_count, stream)

    @cute.jit
    def run_c_bias_sk(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
                      bias: cute.Tensor, workspace: cute.Tensor, alpha: cutlass.Float32,
                      beta: cutlass.Float32, splits: cutlass.Int32, sm_count: cutlass.Int32,
                      stream: cuda.CUstream):
        """Split-K: D = act(alpha * A @ B + beta * C + bias)."""
        self._launch(a, b, d, c, bias, workspace, alpha, beta, splits, sm_count, stream)

    @cute.jit
    def _launch(self, a, b, d, c, bias, workspace, alpha, beta, splits, sm_count, stream):
        # Swap-AB computes D^T = B^T A^T: the caller's N becomes the kernel's
        # M (the wide wgmma dim) and the caller's M (few tokens) the kernel's
        # narrow N. Only views change, at trace time: the caller's tensors
        # and the ABI are the same as without the swap.
        if cutlass.const_expr(self.cfg.swap_ab):
            mA = to_nkl(b, self.rank)
            mB = to_mkl(a, self.rank)
            mD = swap_mn(to_mkl(d, self.rank))
            mC = mD if c is None else swap_mn(to_mkl(c, self.rank))
        else:
            mA = to_mkl(a, self.rank)
            mB = to_nkl(b, self.rank)
            mD = to_mkl(d, self.rank)
            mC = mD if c is None else to_mkl(c, self.rank)
        # Absent operands are replaced by D, which the kernel then never reads.
        # The bias vector is viewed as an (M, N, L) tensor that broadcasts it
        # (stride 0 over rows and batches; over columns with swap-AB, where
        # the caller's N is the kernel's M), so the epilogue indexes it with
        # the same thread partition as D and C.
        mBias = mD
        if cutlass.const_expr(bias is not None):
            along = (1, 0, 0) if cutlass.const_expr(self.cfg.swap_ab) else (0, 1, 0)
            mBias = cute.make_tensor(bias.iterator, cute.make_layout(mD.shape, stride=along))
        mWs = mD if workspace is None else workspace

        self.a_dtype = mA.element_type
        self.b_dtype = mB.element_type
        self.d_dtype = mD.element_type
        self.a_layout = utils.LayoutEnum.from_tensor(mA)
        self.b_layout = utils.LayoutEnum.from_tensor(mB)
        self.d_layout = utils.LayoutEnum.from_tensor(mD)
        self._derive_static()

        tma_a, gA = self._tma_load(mA, self.a_smem_staged, (self.tile[0], self.tile[2]), self.cluster_mn[1])
        tma_b, gB = self._tma_load(mB, self.b_smem_staged, (self.tile[1], self.tile[2]), self.cluster_mn[0])
        epi_smem = cute.slice_(self.d_smem_staged, (None, None, 0))
        tma_d, gD = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), mD, epi_smem, self.epi_tile
        )

        # The persistent grid: as many clusters as the live GPU holds (its SM
        # count is a runtime argument, never the compiling machine's), at
        # most one per work unit (tile x k-split).
        cm, cn = self.cluster_mn
        clusters_m = _ceil_div(_ceil_div(mD.shape[0], self.tile[0]), cm)
        clusters_n = _ceil_div(_ceil_div(mD.shape[1], self.tile[1]), cn)
        kc = self.k_cluster
        slots = sm_count // (cm * cn * kc)
        tiles = clusters_m * clusters_n * mD.shape[2]
        # Split-K is a hybrid (module docstring): the whole waves run
        # data-parallel, only the last partial wave's tiles are split.
        dp_tiles = tiles
        if cutlass.const_expr(self.cfg.split_k):
            dp_tiles = (tiles // slots) * slots
        units = dp_tiles + (tiles - dp_tiles) * splits
        persistent = cutlass.min(units, slots)
        k_tiles = _ceil_div(mA.shape[1], self.tile[2])
        if cutlass.const_expr(self.cfg.split_k):
            # Stream-K (splits == 0) counts the tail's k-blocks as its units:
            # every slot works unless the tail has fewer k-blocks than slots.
            streamk = 1 - cutlass.min(splits, 1)
            units = units + streamk * (tiles - dp_tiles) * k_tiles
            persistent = cutlass.max(cutlass.min(units, slots), 1)

        self.storage = self._shared_storage()
        self.kernel(
            tma_a, gA, tma_b, gB, tma_d, gD, mC, mBias, mWs, alpha, beta, splits, dp_tiles,
            self.tiled_mma, self.cta_layout_mnk,
            self.a_smem_staged, self.b_smem_staged, self.d_smem_staged,
        ).launch(
            grid=(cm * kc, cn, persistent),
            block=[self.threads_per_cta, 1, 1],
            cluster=(cm * kc, cn, 1),
            min_blocks_per_mp=1,
            stream=stream,
            use_pdl=True,
        )
        if cutlass.const_expr(self.cfg.split_k):
            # Second pass on the same stream: sum each split tile's partials
            # in split order (deterministic), then the epilogue. Several CTAs
            # share a tile, each a chunk of its registers (_reduce_chunks).
            tail = tiles - dp_tiles
            self.reduce_kernel(
                mWs, mD, mC, mBias, alpha, beta, splits, dp_tiles, tail, self.tiled_mma,
                clusters_m, clusters_n, mD.shape[2], k_tiles, persistent,
            ).launch(
                grid=(cutlass.max(tail, 1) * cm * cn * self._reduce_chunks()[0], 1, 1),
                block=[self.mma_threads, 1, 1],
                stream=stream,
                use_pdl=True,
            )

    def _make_tiled_mma(self):
        return sm90_utils.make_trivial_tiled_mma(
            self.a_dtype,
            self.b_dtype,
            self.a_layout.sm90_mma_major_mode(),
            self.b_layout.sm90_mma_major_mode(),
            self.acc_dtype,
            self.atom_layout_mnk,
            tiler_mn=(64, self.cfg.tile_n),
        )

    def _derive_static(self) -> None:
        """Tiled MMA, shared-memory layouts and stage counts for this variant."""
        self.tiled_mma = self._make_tiled_mma()
        self.tile = (self.cfg.tile_m, self.cfg.tile_n, _K_BLOCK)
        self.cta_layout_mnk = cute.make_layout((*self.cluster_mn, 1))
        self.mcast_a = self.cluster_mn[1]
        self.mcast_b = self.cluster_mn[0]

        # Epilogue chunks are 32 columns wide, or 16 where 32 does not divide
        # the tile (128x144). A chunk spans the rows of every warpgroup that
        # shares the tile (64 each, at most 128 for the 256-row tiles, whose
        # warpgroups hold two 64-row blocks each). Three warpgroups (192
        # rows) take 16-wide chunks: 32-wide ones would cost the ring a
        # stage (192x192: 3 stages of A and B instead of 4).
        epi_n = math.gcd(32, self.tile[1])
        if self.cfg.mma_wgs == 3:
            self.epi_tile = (192, 16)
        elif self.cfg.mma_wgs == 2:
            self.epi_tile = (min(128, self.tile[0]), epi_n)
        else:
            self.epi_tile = (min(64, self.tile[0]), epi_n)

        ab_bytes = (self.tile[0] + self.tile[1]) * self.tile[2] * self.a_dtype.width // 8
        epi_bytes = (self.epi_tile[0] * self.epi_tile[1] * self.d_dtype.width // 8 * _EPI_STAGES
                     * self.epi_rings)
        # K-cluster: the first CTA holds the others' fp32 partials.
        self.red_elems = (self.k_cluster - 1) * self.tile[0] * self.tile[1]
        red_bytes = self.red_elems * 4
        self.ab_stages = (self.smem_capacity - _BARRIER_BYTES - epi_bytes - red_bytes) // ab_bytes

        self.a_smem_staged = self._operand_smem(self.a_layout, self.a_dtype, self.tile[0])
        self.b_smem_staged = self._operand_smem(self.b_layout, self.b_dtype, self.tile[1])

        d_major_size = self.epi_tile[1] if self.d_layout.is_n_major_c() else self.epi_tile[0]
        d_atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(self.d_layout, self.d_dtype, d_major_size),
            self.d_dtype,
        )
        self.d_smem_staged = cute.tile_to_shape(
            d_atom,
            cute.append(self.epi_tile, _EPI_STAGES * self.epi_rings),
            order=(1, 0, 2) if self.d_layout.is_m_major_c() else (0, 1, 2),
        )

    def _operand_smem(self, layout, dtype, mn_extent):
        k_major = layout.sm90_mma_major_mode() == cute.nvgpu.warpgroup.OperandMajorMode.K
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(
                layout, dtype, self.tile[2] if k_major else mn_extent
            ),
            dtype,
        )
        return cute.tile_to_shape(
            atom,
            (mn_extent, self.tile[2], self.ab_stages),
            order=(0, 1, 2) if k_major else (1, 0, 2),
        )

    @staticmethod
    def _tma_load(tensor, smem_staged, smem_tile, mcast):
        op = (
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
            if mcast == 1
            else cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp()
        )
        return cute.nvgpu.cpasync.make_tiled_tma_atom(
            op,
            tensor,
            cute.slice_(smem_staged, (None, None, 0)),
            smem_tile,
            num_multicast=mcast,
        )

    # ------------------------------------------------------------- schedule
    def _tile_coords(self, tile, clusters_m, clusters_n, cta_m, cta_n, plain=None):
        """Decode a linear tile number into (m tile, n tile, batch).

        Tiles are numbered batch-major, then along the raster: with raster m
        and swizzle W, clusters are walked in bands of W cluster-columns,
        M-first inside a band. The last band is as wide as the columns left
        (never padded to W), so every number is a real tile whatever the
        swizzle and the problem's tile counts: a schedule cannot collapse
        onto idle work when a dimension has fewer than W tiles. Raster n
        swaps the roles of M and N.

        ``plain`` (a banded or raster-n variant's flag from ``_plain_walk``;
        None for the plain walk itself) is 1 when one wave holds every
        tile: then the walk is the plain one (raster m, swizzle 1). With
        all tiles in flight at once an order buys no L2 reuse, and a banded
        order ran slower than the plain walk there (bf16 6863x400x25424,
        128x256 m4, 54x2 tiles on 132 SMs: 0.864x, r7's swizzle_diag).
        """
        per_batch = clusters_m * clusters_n
        batch = tile // per_batch
        rest = tile - batch * per_batch
        width = self.cfg.swizzle
        if cutlass.const_expr(self.cfg.raster_along_m):
            major, minor = clusters_m, clusters_n
        else:
            major, minor = clusters_n, clusters_m
        band = rest // (major * width)
        inside = rest - band * (major * width)
        band_width = cutlass.min(width, minor - band * width)
        along_major = inside // band_width
        along_minor = band * width + (inside - along_major * band_width)
        if cutlass.const_expr(self.cfg.raster_along_m):
            cl_m, cl_n = along_major, along_minor
        else:
            cl_m, cl_n = along_minor, along_major
        if cutlass.const_expr(plain is not None):
            # Integer arithmetic, no branches: the plain walk where plain == 1.
            plain_n = rest // clusters_m
            plain_m = rest - plain_n * clusters_m
            cl_m = cl_m + plain * (plain_m - cl_m)
            cl_n = cl_n + plain * (plain_n - cl_n)
        uniform = cute.arch.make_warp_uniform
        return (
            uniform(cl_m * self.cluster_mn[0] + cta_m),
            uniform(cl_n * self.cluster_mn[1] + cta_n),
            uniform(batch),
        )

    def _plain_walk(self, tiles, capacity):
        """None for the plain walk (raster m, swizzle 1: nothing to switch,
        so its code stays as it was); else 1 when ``tiles <= capacity`` (one
        wave holds every tile, ``_tile_coords``), 0 otherwise."""
        if cutlass.const_expr(self.cfg.raster_along_m and self.cfg.swizzle == 1):
            return None
        return cutlass.min(cutlass.max(capacity - tiles + 1, 0), 1)

    def _unit(self, unit, worker, unit_step, dp_tiles, tail, splits, k_tiles, k_rank, walk):
        """The loop's unit decoded: a global unit (``_work_unit``), or under
        split-K the worker's own count (``_sk_unit``)."""
        if cutlass.const_expr(self.cfg.split_k):
            return self._sk_unit(unit, worker, unit_step, dp_tiles, tail, splits, k_tiles, walk)
        return self._work_unit(unit, dp_tiles, tail, splits, k_tiles, k_rank)

    def _work_unit(self, unit, dp_tiles, tail, splits, k_tiles, k_rank):
        """Decode a linear work unit into (tile, (tail tile, split), first
        k-block, k-block count, partial).

        Units below ``dp_tiles`` are whole tiles (full K, written straight to
        D). The rest cover the ``tail`` tiles of the last partial wave, each
        split ``splits`` ways along K: unit ``dp_tiles + j`` is split
        ``j // tail`` of tail tile ``j % tail``, so neighbouring CTAs work on
        different tiles. ``partial`` is 1 for a split unit (its accumulators
        go to the workspace), else 0. Units, tiles and the tail count whole
        clusters: every CTA of a cluster takes the same unit (and the same
        k-range, so multicast still works); a CTA's own slot in the
        workspace is ``(tail tile * cluster size + its rank) * splits +
        split``. Plain variants have no tail: every unit is a whole tile.
        Under a K-cluster every unit is a whole tile and CTA ``k_rank`` of
        the cluster takes its share of the k-blocks; ``partial`` is 1 for
        every CTA but the first (its accumulators go to the first's
        shared memory).
        """
        if cutlass.const_expr(self.k_cluster > 1):
            first, count = self._k_range(k_tiles, self.k_cluster, k_rank)
            return unit, (0, 0), first, count, cutlass.min(k_rank, 1)
        if cutlass.const_expr(self.cfg.split_k):
            # Integer arithmetic, no branches: partial = [unit >= dp_tiles].
            partial = cutlass.min(cutlass.max(unit - dp_tiles + 1, 0), 1)
            j = cutlass.max(unit - dp_tiles, 0)
            tail_n = cutlass.max(tail, 1)
            t_local = j % tail_n
            split = j // tail_n
            first, count = self._k_range(k_tiles, splits, split)
            tile = unit + partial * (dp_tiles + t_local - unit)
            return (tile, (t_local, split), partial * first, k_tiles + partial * (count - k_tiles),
                    partial)
        return unit, (0, 0), 0, k_tiles, cutlass.Int32(0)

    @staticmethod
    def _k_range(k_tiles, splits, split):
        """First k-block and count of one split: an even division, the first
        ``k_tiles % splits`` splits taking one block more (a split may get
        none when K is shorter than the split count: its partial is zero)."""
        base = k_tiles // splits
        rem = k_tiles - base * splits
        first = split * base + cutlass.min(split, rem)
        end = (split + 1) * base + cutlass.min(split + 1, rem)
        return first, end - first

    # Stream-K (splits == 0; module docstring). The arithmetic is
    # signature.streamk_plan's, in device integers: the tail's k-blocks
    # 0..W-1 (W = tail tiles x k-blocks per tile) are dealt to G workers
    # (slots, fewer when W is smaller), worker w taking [w*W//G, (w+1)*W//G).
    @staticmethod
    def _sk_workers(tail, k_tiles, slots):
        """(W, G, pieces stride): the tail's k-blocks, its workers, and the
        workspace slots per tile (the most workers one tile can span)."""
        work = tail * k_tiles
        workers = cutlass.max(cutlass.min(slots, work), 1)
        least = cutlass.max(work // workers, 1)
        return work, workers, (k_tiles + least - 1) // least + 1

    @staticmethod
    def _sk_owner(x, work, workers):
        """The worker whose run holds the tail's k-block ``x``."""
        return ((x + 1) * workers - 1) // cutlass.max(work, 1)

    @cute.jit
    def _sk_walk(self, worker, unit_step, dp_tiles, tail, splits, k_tiles):
        """This worker's walk under a split-K variant: (units it runs, the
        stream-K flag, its run's first and end k-block, last tail tile,
        data-parallel units before it, workspace slots per tile). With
        splits >= 1 (the hybrid) the units are the worker's share of
        dp_tiles + tail * splits, strided by the grid as before, and none of
        stream-K's arithmetic runs: the branch on splits is uniform over the
        grid, taken once per CTA."""
        stream = 1 - cutlass.min(splits, 1)
        count = cutlass.max(_ceil_div(dp_tiles + tail * splits - worker, unit_step), 0)
        start = cutlass.Int32(0)
        end = cutlass.Int32(0)
        last_tile = cutlass.Int32(0)
        n_dp = cutlass.Int32(0)
        stride = cutlass.Int32(splits)
        work = cutlass.Int32(0)
        workers = cutlass.Int32(1)
        if splits == 0:
            n_dp = cutlass.max(_ceil_div(dp_tiles - worker, unit_step), 0)
            work, workers, stride = self._sk_workers(tail, k_tiles, unit_step)
            start = (worker * work) // workers
            end = ((worker + 1) * work) // workers
            mine = (cutlass.min(cutlass.max(workers - worker, 0), 1)
                    * cutlass.min(cutlass.max(end - start, 0), 1))
            kt = cutlass.max(k_tiles, 1)
            last_tile = (cutlass.max(end, 1) - 1) // kt
            count = n_dp + mine * (last_tile - start // kt + 1)
        return count, stream, start, end, last_tile, n_dp, stride, work, workers

    @cute.jit
    def _sk_unit(self, i, worker, unit_step, dp_tiles, tail, splits, k_tiles, walk):
        """Unit ``i`` of this worker's walk (``_sk_walk``), decoded as
        ``_work_unit`` decodes a global unit: (tile, (tail tile, piece or
        split), first k-block, k-block count, partial). One uniform branch:
        the hybrid decodes as a global unit, stream-K by its run."""
        _, stream, start, end, last_tile, n_dp, _, work, workers = walk
        unit = worker + i * unit_step
        tile = cutlass.Int32(unit)
        t_local = cutlass.Int32(0)
        split = cutlass.Int32(0)
        first = cutlass.Int32(0)
        count = cutlass.Int32(k_tiles)
        partial = cutlass.Int32(0)
        if stream == 0:
            h = self._work_unit(unit, dp_tiles, tail, splits, k_tiles, 0)
            tile = h[0]
            t_local = h[1][0]
            split = h[1][1]
            first = h[2]
            count = h[3]
            partial = h[4]
        else:
            # Stream-K: the first n_dp units are whole tiles, strided as in
            # the hybrid; then the pieces of the worker's run, tile by tile.
            dp = cutlass.min(cutlass.max(n_dp - i, 0), 1)
            t_sk = last_tile - cutlass.max(i - n_dp, 0)  # last tile first (module docstring)
            base = t_sk * k_tiles
            lo = cutlass.max(start, base) - base
            hi = cutlass.min(end, base + k_tiles) - base
            # The run covers the whole tile (lo == 0, hi == k_tiles): no
            # other worker touches it, so it goes straight to D.
            whole = (1 - cutlass.min(lo, 1)) * (1 - cutlass.min(k_tiles - hi, 1))
            tile = unit + (1 - dp) * (dp_tiles + t_sk - unit)
            first = (1 - dp) * lo
            count = k_tiles + (1 - dp) * (hi - lo - k_tiles)
            partial = (1 - dp) * (1 - whole)
            t_local = (1 - dp) * t_sk
            split = (1 - dp) * (worker - self._sk_owner(base, work, workers))
        return tile, (t_local, split), first, count, partial

    def _shared_storage(self):
        """The CTA's shared-memory struct: the ring's mbarriers and the A, B
        and D stages; under K-cluster also the reduction's two mbarriers
        ([0]: the first CTA's "partials arrived", [1]: the others' "buffer
        free") and the partials buffer. Fields keep their order, so the
        offsets of a variant without K-cluster are what they always were."""
        kc = self.k_cluster > 1
        fields = {"ring_barriers": cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]}
        if kc:
            fields["red_barriers"] = cute.struct.MemRange[cutlass.Int64, 2]
        for name, dtype, staged in (("sA", self.a_dtype, self.a_smem_staged),
                                    ("sB", self.b_dtype, self.b_smem_staged),
                                    ("sD", self.d_dtype, self.d_smem_staged)):
            fields[name] = cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(staged)], 1024]
        if kc:
            fields["sRed"] = cute.struct.Align[cute.struct.MemRange[cutlass.Float32, self.red_elems], 16]
        return cute.struct(type("KClusterStorage" if kc else "Storage", (), {"__annotations__": fields}))

    # -------------------------------------------------------------- epilogue
    @staticmethod
    def _bias_slots(layout, count: int):
        """The bias a thread reads, deduplicated at trace time: (the distinct
        static offsets of its ``count`` accumulators' bias elements, and per
        accumulator the index of its offset among them), or None where an
        offset is not a compile-time constant (then the epilogue reads the
        bias per element, as before).

        The bias is broadcast (stride 0) over the tile's rows, so a thread's
        accumulators name only a few columns: 64 values for 128 accumulators
        of a 64x256 warpgroup tile, two per row block under swap-AB. Reading
        them before the mainloop takes the global loads off the epilogue's
        critical path, where every thread otherwise stalls on them once per
        tile (r20: the bias epilogue cost 1-6% over the plain GEMM at the llm
        shapes).

        The third item is, per distinct offset, the first accumulator that
        reads it: an edge tile checks that accumulator's coordinate along the
        bias to mask the elements past the vector's end."""
        offsets = [layout(i) for i in range(count)]
        if not all(isinstance(o, int) for o in offsets):
            return None
        distinct = sorted(set(offsets))
        return distinct, [distinct.index(o) for o in offsets], [offsets.index(o) for o in distinct]

    @cute.jit
    def _bias_act(self, v, coord, inside, mBias):
        """+ bias, read only where ``inside`` (the element is within D), then
        the activation, on one fp32 value the caller has scaled (and given its
        C: an edge tile loads C at clamped coordinates, unbranched, before it
        calls this; until r65 a per-element helper loaded it here behind the
        same bounds branch, one load in flight at a time)."""
        if cutlass.const_expr(self.cfg.bias):
            if inside:
                v = v + mBias[coord].to(self.acc_dtype)
        return activate(v, self.cfg.act)

    # ---------------------------------------------------------------- device
    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_b: cute.CopyAtom,
        mB: cute.Tensor,
        tma_d: cute.CopyAtom,
        mD: cute.Tensor,
        mC: cute.Tensor,
        mBias: cute.Tensor,
        mWs: cute.Tensor,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        splits: cutlass.Int32,
        dp_tiles: cutlass.Int32,
        tiled_mma: cute.TiledMma,
        cta_layout_mnk: cute.Layout,
        a_smem_staged: cute.ComposedLayout,
        b_smem_staged: cute.ComposedLayout,
        d_smem_staged: cute.ComposedLayout,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_d)

        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        k_rank = cutlass.Int32(0)
        if cutlass.const_expr(self.k_cluster > 1):
            # The cluster spans K, not M or N: every CTA takes the (0, 0)
            # place of a 1x1 cluster and its rank picks its k-blocks.
            k_rank = cta_rank
            cluster_coord = (0, 0, 0)
        else:
            cluster_coord = cta_layout_mnk.get_flat_coord(cta_rank)
        cluster_size = self.cluster_mn[0] * self.cluster_mn[1]
        a_mask = 0
        b_mask = 0
        if cutlass.const_expr(self.mcast_a > 1):
            a_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=1)
        if cutlass.const_expr(self.mcast_b > 1):
            b_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=0)

        a_stage_layout = cute.slice_(a_smem_staged, (None, None, 0))
        b_stage_layout = cute.slice_(b_smem_staged, (None, None, 0))
        stage_bytes = cute.size_in_bytes(self.a_dtype, a_stage_layout) + cute.size_in_bytes(
            self.b_dtype, b_stage_layout
        )

        storage = cutlass.utils.SmemAllocator().allocate(self.storage)

        # Every consumer warp of every CTA that received a multicast must
        # release a stage before the producer may overwrite it.
        # (Under pingpong one warpgroup consumes each stage.)
        release_count = (self.mcast_a + self.mcast_b - 1) * self.cfg.mma_wgs * 4
        ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ring_barriers.data_ptr(),
            num_stages=self.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, release_count),
            tx_count=stage_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
            defer_sync=True,
        )
        red_full = None
        red_free = None
        if cutlass.const_expr(self.k_cluster > 1):
            red_full = storage.red_barriers.data_ptr()
            red_free = red_full + 1
            if tidx == 0:
                cute.arch.mbarrier_init(red_full, 1)
                cute.arch.mbarrier_init(red_free, 1)
        sync_shape = (self.k_cluster, 1) if cutlass.const_expr(self.k_cluster > 1) else self.cluster_mn
        pipeline_init_arrive(cluster_shape_mn=sync_shape, is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem_staged.outer, swizzle=a_smem_staged.inner)
        sB = storage.sB.get_tensor(b_smem_staged.outer, swizzle=b_smem_staged.inner)
        sD = storage.sD.get_tensor(d_smem_staged.outer, swizzle=d_smem_staged.inner)
        red_ptr = None
        sRed = None
        if cutlass.const_expr(self.k_cluster > 1):
            red_ptr = storage.sRed.data_ptr()
            sRed = cute.make_tensor(red_ptr, cute.make_layout(self.red_elems))

        # (bM, bK, tilesM, tilesK, L) and friends
        gA = cute.local_tile(mA, cute.slice_(self.tile, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB, cute.slice_(self.tile, (0, None, None)), (None, None, None))
        gD = cute.local_tile(mD, cute.slice_(self.tile, (None, None, 0)), (None, None, None))

        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_a,
            cluster_coord[1],
            cute.make_layout(cute.slice_(cta_layout_mnk, (0, None, 0)).shape),
            cute.group_modes(sA, 0, 2),
            cute.group_modes(gA, 0, 2),
        )
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_b,
            cluster_coord[0],
            cute.make_layout(cute.slice_(cta_layout_mnk, (None, 0, 0)).shape),
            cute.group_modes(sB, 0, 2),
            cute.group_modes(gB, 0, 2),
        )

        wg = cute.arch.make_warp_uniform(tidx // _THREADS_PER_WG)
        thr_mma = tiled_mma.get_slice(
            cute.make_layout(self.cfg.mma_wgs, stride=_THREADS_PER_WG)(
                0 if cutlass.const_expr(self.cfg.pingpong) else wg - 1)
        )
        tCsA = thr_mma.partition_A(sA)
        tCsB = thr_mma.partition_B(sB)
        tCrA = tiled_mma.make_fragment_A(tCsA)
        tCrB = tiled_mma.make_fragment_B(tCsB)
        tCgD = thr_mma.partition_C(gD)
        acc = cute.make_rmem_tensor(tCgD.shape[:3], self.acc_dtype)
        promote = self.cfg.promote
        if cutlass.const_expr(promote > 0):
            # Promotion (module docstring): the running sum, and a copy of
            # the tiled MMA whose wgmma overwrites its accumulators.
            acc_sum = cute.make_rmem_tensor(tCgD.shape[:3], self.acc_dtype)
            mma_fresh = self._make_tiled_mma()
            mma_fresh.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)

        k_tiles = cute.size(gA, mode=[3])
        cm, cn = self.cluster_mn
        clusters_m = _ceil_div(_ceil_div(mD.shape[0], self.tile[0]), cm)
        clusters_n = _ceil_div(_ceil_div(mD.shape[1], self.tile[1]), cn)
        batches = mD.shape[2]
        tiles = clusters_m * clusters_n * batches
        tail = tiles - dp_tiles
        units = dp_tiles + tail * splits
        _, _, first_unit = cute.arch.block_idx()
        _, _, unit_step = cute.arch.grid_dim()
        # One wave of clusters holds every tile: walk them plainly.
        plain = self._plain_walk(tiles, unit_step)
        # Split-K variants walk a per-worker count of units (_sk_walk): the
        # hybrid's strided units, or stream-K's whole tiles then pieces.
        walk = None
        loop_first = first_unit
        loop_end = units
        loop_step = unit_step
        if cutlass.const_expr(self.cfg.split_k):
            walk = self._sk_walk(first_unit, unit_step, dp_tiles, tail, splits, k_tiles)
            loop_first = 0
            loop_end = walk[0]
            loop_step = 1

        pipeline_init_wait(cluster_shape_mn=sync_shape)
        # Programmatic dependent launch, both ways (module docstring). This
        # grid may start while the kernel before it on the stream finishes:
        # everything above touches only shared memory, registers and the
        # kernel's parameters; nothing global is read or written before the
        # previous grid has finished and its writes are visible.
        cute.arch.griddepcontrol_wait()
        # And the next kernel (the split-K reduce pass, or the next GEMM)
        # may be launched now: its CTAs take SMs this grid leaves and wait
        # the same way, so its launch latency and set-up hide behind us.
        cute.arch.griddepcontrol_launch_dependents()

        if wg == 0:
            cute.arch.setmaxregister_decrease(_REGS[self.num_consumer_wgs][0])

        # ---------------- producer: TMA loads into the ring
        if warp == self.producer_warp:
            put = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
            unit = cutlass.Int32(loop_first)
            while unit < loop_end:
                tile, _, k_first, k_count, _ = self._unit(
                    unit, first_unit, unit_step, dp_tiles, tail, splits, k_tiles, k_rank, walk)
                m_idx, n_idx, l_idx = self._tile_coords(
                    tile, clusters_m, clusters_n, cluster_coord[0], cluster_coord[1], plain)
                tAgA_t = tAgA[(None, m_idx, None, l_idx)]
                tBgB_t = tBgB[(None, n_idx, None, l_idx)]
                for kk in range(k_count):
                    ring.producer_acquire(put)
                    bar = ring.producer_get_barrier(put)
                    cute.copy(tma_a, tAgA_t[(None, k_first + kk)], tAsA[(None, put.index)],
                              tma_bar_ptr=bar, mcast_mask=a_mask)
                    cute.copy(tma_b, tBgB_t[(None, k_first + kk)], tBsB[(None, put.index)],
                              tma_bar_ptr=bar, mcast_mask=b_mask)
                    ring.producer_commit(put)
                    put.advance()
                unit += loop_step
            ring.producer_tail(put)

        # ---------------- consumers: wgmma + epilogue
        if wg > 0:
            cute.arch.setmaxregister_increase(_REGS[self.num_consumer_wgs][1])
            get = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
            free = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
            k_blocks = cute.size(tCrA, mode=[2])
            # Pingpong (after CUTLASS's sm90 pingpong kernel and QuACK's
            # gemm_sm90): each consumer warpgroup ``pp`` owns every other
            # unit of the CTA's walk, with its own accumulators, epilogue
            # buffers and barriers. The producer loads units in walk order,
            # so a warpgroup skips the other's k-blocks in the ring; a pair
            # of named barriers hands the tensor cores from one warpgroup's
            # mainloop to the other's, so one tile's epilogue runs under the
            # next tile's mainloop. Split-K is not offered with pingpong
            # (its units' k-ranges differ), so every unit is k_tiles long.
            pp = 0
            walk_step = loop_step
            if cutlass.const_expr(self.cfg.pingpong):
                pp = wg - 1
                walk_step = 2 * unit_step
                skip = cutlass.Int32(k_tiles)
                get.advance(skip * pp)
                free.advance(skip * pp)
                if pp == 0:
                    # The first mainloop needs no cue.
                    cute.arch.barrier_arrive(barrier_id=3, number_of_threads=2 * _THREADS_PER_WG)
            ctid = tidx - _THREADS_PER_WG - pp * _THREADS_PER_WG
            epi_barrier = pipeline.NamedBarrier(barrier_id=1 + pp, num_threads=self.mma_threads)
            store_warp = 4 + 4 * pp  # first warp of the warpgroup
            epi_base = pp * _EPI_STAGES
            acc_size = cute.size(acc)

            store_atom = sm90_utils.sm90_get_smem_store_op(
                self.d_layout, elem_ty_d=self.d_dtype, elem_ty_acc=self.acc_dtype
            )
            stmatrix_atom = cute.make_copy_atom(
                cute.nvgpu.warp.StMatrix8x8x16bOp(self.d_layout.is_m_major_c(), 4),
                self.d_dtype,
            )
            r2s = cute.make_tiled_copy_S(
                store_atom, cute.make_tiled_copy_C_atom(stmatrix_atom, tiled_mma)
            )
            thr_r2s = r2s.get_slice(ctid)
            tRS_sD = thr_r2s.partition_D(sD)
            tRS_acc = r2s.retile(acc)
            frag_shape = cute.shape(thr_r2s.partition_S(sD))[:3]
            frag_acc = cute.make_rmem_tensor(frag_shape, self.acc_dtype)
            frag_out = cute.make_rmem_tensor(frag_shape, self.d_dtype)
            frag_size = cute.size(frag_acc)

            store_ring = pipeline.PipelineTmaStore.create(
                num_stages=_EPI_STAGES,
                producer_group=pipeline.CooperativeGroup(
                    pipeline.Agent.Thread, self.mma_threads
                ),
            )

            # Coordinates of *this thread's* accumulators: slice the tiled
            # MMA by thread, not by warpgroup (the warpgroup slice is what
            # wgmma operands need; it would give every thread its
            # warpgroup's first thread's positions).
            thr_acc = tiled_mma.get_slice(ctid)
            cD = cute.local_tile(
                cute.make_identity_tensor(mD.shape), cute.slice_(self.tile, (None, None, 0)),
                (None, None, None),
            )
            gC = cute.local_tile(mC, cute.slice_(self.tile, (None, None, 0)), (None, None, None))
            gBias = cute.local_tile(mBias, cute.slice_(self.tile, (None, None, 0)), (None, None, None))
            # The bias, read before each tile's mainloop (``_bias_slots``):
            # the few distinct values a thread's accumulators need, in
            # registers, so the epilogue does not wait on global loads.
            bias_slots = None
            if cutlass.const_expr(self.cfg.bias):
                bias_slots = self._bias_slots(
                    thr_acc.partition_C(gBias[(None, None, 0, 0, 0)]).layout, acc_size)
            if cutlass.const_expr(bias_slots is not None):
                bias_frag = cute.make_rmem_tensor((len(bias_slots[0]),), mBias.element_type)
                # The mode of D the bias runs along (its N; the kernel's M
                # under swap-AB, where D's modes are swapped).
                bias_mode = 0 if cutlass.const_expr(self.cfg.swap_ab) else 1

            tiles_done = cutlass.Int32(0)
            unit = cutlass.Int32(loop_first) + pp * unit_step
            while unit < loop_end:
                tile, slot, k_first, k_count, partial = self._unit(
                    unit, first_unit, unit_step, dp_tiles, tail, splits, k_tiles, k_rank, walk)
                m_idx, n_idx, l_idx = self._tile_coords(
                    tile, clusters_m, clusters_n, cluster_coord[0], cluster_coord[1], plain)
                tile_coord = (m_idx, n_idx, l_idx)
                if cutlass.const_expr(bias_slots is not None):
                    bias_room = (mD.shape[bias_mode]
                                 - ((m_idx, n_idx)[bias_mode] + 1) * self.tile[bias_mode])
                    # Issued now, used after the mainloop. A tile that ends
                    # past the bias vector (the last column of tiles; the last
                    # row under swap-AB) masks the elements beyond it to 0:
                    # the bias broadcasts over the other mode, whose rows
                    # past D the TMA store drops, so no other element needs
                    # a check. Until r38 any edge tile read its bias per
                    # element in the epilogue, each load behind its own
                    # bounds branch: on bench_epilogue's held-out sample,
                    # whose tile grids all have edges, the fused bias call
                    # took 1.18x our plain GEMM's time (1.00 at the llm
                    # shapes, whose sizes are whole tiles).
                    bias_tile = thr_acc.partition_C(gBias[(None, None, *tile_coord)])
                    bias_flat = cute.make_tensor(bias_tile.iterator,
                                                 cute.make_layout(bias_slots[0][-1] + 1))
                    if bias_room >= 0:
                        for j in cutlass.range_constexpr(len(bias_slots[0])):
                            bias_frag[j] = bias_flat[bias_slots[0][j]]
                    else:
                        tCcB = thr_acc.partition_C(cD[(None, None, *tile_coord)])
                        for j in cutlass.range_constexpr(len(bias_slots[0])):
                            if tCcB[bias_slots[2][j]][bias_mode] < mD.shape[bias_mode]:
                                bias_frag[j] = bias_flat[bias_slots[0][j]]
                            else:
                                bias_frag[j] = mBias.element_type(0.0)
                acc.fill(0.0)
                if cutlass.const_expr(promote > 0):
                    acc_sum.fill(0.0)
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                if cutlass.const_expr(self.cfg.pingpong):
                    # Wait for this warpgroup's turn on the tensor cores.
                    cute.arch.barrier(barrier_id=3 + pp, number_of_threads=2 * _THREADS_PER_WG)
                cute.nvgpu.warpgroup.fence()

                # Keep one wgmma batch in flight: release stage k-1 once
                # stage k's wgmmas are issued and k-1's have retired.
                for kk in range(k_count):
                    ring.consumer_wait(get)
                    for kb in cutlass.range_constexpr(k_blocks):
                        coord = (None, None, kb, get.index)
                        if cutlass.const_expr(promote > 0 and kb == 0):
                            if kk % promote == 0:
                                cute.gemm(mma_fresh, acc, tCrA[coord], tCrB[coord], acc)
                            else:
                                cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
                        else:
                            cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
                    cute.nvgpu.warpgroup.commit_group()
                    if kk > 0:
                        cute.nvgpu.warpgroup.wait_group(1)
                        ring.consumer_release(free)
                        free.advance()
                    get.advance()
                    if cutlass.const_expr(promote > 0):
                        # The stage that closes a group (not the last: the
                        # sum below takes it) adds the group into acc_sum.
                        if (kk + 1) % promote == 0:
                            if kk + 1 < k_count:
                                cute.nvgpu.warpgroup.wait_group(0)
                                for i in cutlass.range_constexpr(acc_size):
                                    acc_sum[i] = acc_sum[i] + acc[i]
                                cute.nvgpu.warpgroup.fence()
                if cutlass.const_expr(self.cfg.pingpong):
                    # Every wgmma of this tile is issued: cue the other
                    # warpgroup's mainloop.
                    cute.arch.barrier_arrive(barrier_id=4 - pp, number_of_threads=2 * _THREADS_PER_WG)
                cute.nvgpu.warpgroup.wait_group(0)
                if cutlass.const_expr(promote > 0):
                    for i in cutlass.range_constexpr(acc_size):
                        acc[i] = acc[i] + acc_sum[i]
                if k_count > 0:
                    ring.consumer_release(free)
                    free.advance()
                if cutlass.const_expr(self.cfg.pingpong):
                    # Skip the other warpgroup's next unit in the ring.
                    get.advance(skip)
                    free.advance(skip)

                if cutlass.const_expr(self.cfg.split_k):
                    if partial == 1:
                        # A split unit: its partial goes to the workspace in
                        # the accumulator's own register order, thread-
                        # interleaved: each store instruction writes 32
                        # consecutive floats per warp. The reduce kernel reads
                        # them back the same way.
                        t_local, split = slot
                        # stride: the split count, or stream-K's pieces per tile
                        cta_slot = (t_local * cluster_size + cta_rank) * walk[6] + split
                        base = (cta_slot * acc_size) * self.mma_threads + ctid
                        for i in cutlass.range_constexpr(acc_size):
                            mWs[base + i * self.mma_threads] = acc[i]
                if cutlass.const_expr(self.k_cluster > 1):
                    # K-cluster (module docstring): the others push their
                    # accumulators into the first CTA's shared memory, slot
                    # rank - 1, thread-interleaved; the first waits for all
                    # of them, sums them in rank order, then frees the slots.
                    tile_elems = acc_size * self.mma_threads
                    if partial == 1:
                        # The first CTA has read this CTA's previous partial.
                        cute.arch.mbarrier_wait(red_free, (tiles_done & 1) ^ 1)
                        base = (k_rank - 1) * tile_elems + ctid
                        for i in cutlass.range_constexpr(acc_size):
                            cute.arch.store_async_dsmem(
                                red_ptr + (base + i * self.mma_threads),
                                acc[i].bitcast(cutlass.Int32), red_full, 0)
                    else:
                        if ctid == 0:
                            cute.arch.mbarrier_arrive_and_expect_tx(
                                red_full, (self.k_cluster - 1) * tile_elems * 4)
                        cute.arch.mbarrier_wait(red_full, tiles_done & 1)
                        for r in cutlass.range_constexpr(self.k_cluster - 1):
                            for i in cutlass.range_constexpr(acc_size):
                                acc[i] = acc[i] + sRed[r * tile_elems + i * self.mma_threads + ctid]
                        epi_barrier.arrive_and_wait()
                        if ctid == 0:
                            for r in cutlass.range_constexpr(1, self.k_cluster):
                                cute.arch.mbarrier_arrive(red_free, peer_cta_rank_in_cluster=r)
                if partial == 0:
                    # ---- epilogue math in registers
                    if cutlass.const_expr(not self.cfg.with_c and bias_slots is not None):
                        # Every tile alike: its bias is in registers, masked
                        # past the vector's end, and D's TMA store drops the
                        # elements outside D.
                        for i in cutlass.range_constexpr(acc_size):
                            v = acc[i] * alpha + bias_frag[bias_slots[1][i]].to(self.acc_dtype)
                            acc[i] = activate(v, self.cfg.act)
                    elif cutlass.const_expr(self.cfg.with_c or self.cfg.bias):
                        tCgC = thr_acc.partition_C(gC[(None, None, *tile_coord)])
                        tCgBias = thr_acc.partition_C(gBias[(None, None, *tile_coord)])
                        # A tile wholly inside D (every tile but the last row
                        # and column of tiles) reads C and bias unpredicated,
                        # at offsets fixed at compile time; only edge tiles
                        # pay a coordinate and a bounds check per element.
                        room = cutlass.min(mD.shape[0] - (m_idx + 1) * self.tile[0],
                                           mD.shape[1] - (n_idx + 1) * self.tile[1])
                        if room >= 0:
                            for i in cutlass.range_constexpr(acc_size):
                                v = acc[i] * alpha
                                if cutlass.const_expr(self.cfg.with_c):
                                    v = v + beta * tCgC[i].to(self.acc_dtype)
                                if cutlass.const_expr(bias_slots is not None):
                                    v = v + bias_frag[bias_slots[1][i]].to(self.acc_dtype)
                                elif cutlass.const_expr(self.cfg.bias):
                                    v = v + tCgBias[i].to(self.acc_dtype)
                                acc[i] = activate(v, self.cfg.act)
                        elif cutlass.const_expr(self.cfg.with_c):
                            # An edge tile with C (r65): every element loads
                            # C at its coordinate clamped into D (the last
                            # row or column for those past it), unbranched,
                            # so a group's loads are all in flight at once;
                            # the values past D are computed and dropped by
                            # the TMA store, and nothing outside C is read.
                            # Until r65 each load sat behind its own bounds
                            # branch (r62's fix of an unpredicated read past
                            # C), which serialized them: an edge tile's
                            # epilogue waited on one load at a time, 1.2-1.5x
                            # the call's time at token counts off the tile
                            # (r65 call B: 72x4096x14336 on 128x64 tiles ran
                            # 58.7 us, 46.0 at 128 tokens). Groups of
                            # _C_EDGE_GROUP bound the registers they hold.
                            tCcD = thr_acc.partition_C(cD[(None, None, *tile_coord)])
                            last_m = mD.shape[0] - 1
                            last_n = mD.shape[1] - 1
                            group = _c_edge_group(acc_size)
                            c_frag = cute.make_rmem_tensor((group,), mC.element_type)
                            for g in cutlass.range_constexpr(acc_size // group):
                                for j in cutlass.range_constexpr(group):
                                    coord = tCcD[g * group + j]
                                    c_frag[j] = mC[(cutlass.min(coord[0], last_m),
                                                    cutlass.min(coord[1], last_n), coord[2])]
                                for j in cutlass.range_constexpr(group):
                                    i = g * group + j
                                    coord = tCcD[i]
                                    inside = cute.elem_less(coord, mD.shape)
                                    v = acc[i] * alpha + beta * c_frag[j].to(self.acc_dtype)
                                    if cutlass.const_expr(bias_slots is not None):
                                        # in registers, 0 past the vector's end
                                        v = v + bias_frag[bias_slots[1][i]].to(self.acc_dtype)
                                        acc[i] = activate(v, self.cfg.act)
                                    else:
                                        acc[i] = self._bias_act(v, coord, inside, mBias)
                        else:
                            tCcD = thr_acc.partition_C(cD[(None, None, *tile_coord)])
                            for i in cutlass.range_constexpr(acc_size):
                                coord = tCcD[i]
                                inside = cute.elem_less(coord, mD.shape)
                                acc[i] = self._bias_act(acc[i] * alpha, coord, inside, mBias)
                    elif cutlass.const_expr(self.cfg.act == "none"):
                        acc.store(acc.load() * alpha)
                    else:
                        for i in cutlass.range_constexpr(acc_size):
                            acc[i] = activate(acc[i] * alpha, self.cfg.act)

                    # ---- registers -> smem (stmatrix) -> gmem (TMA store)
                    gD_tile = gD[(None, None, *tile_coord)]
                    gD_epi = cute.zipped_divide(gD_tile, self.epi_tile)
                    bSG_sD, bSG_gD = cute.nvgpu.cpasync.tma_partition(
                        tma_d, 0, cute.make_layout(1), cute.group_modes(sD, 0, 2), gD_epi
                    )
                    epi_count = cute.size(gD_epi, mode=[1])
                    epi_grid = gD_epi.shape[1]
                    # Each thread's accumulator fragment holds a wgmma block's N
                    # positions inside its value mode, so consecutive epilogue
                    # chunks walk N first, then the next 64-row block (row-major).
                    epi_order = cute.make_layout(epi_grid, stride=(epi_grid[1], 1))
                    done_before = tiles_done * epi_count
                    for e in cutlass.range_constexpr(epi_count):
                        for v in cutlass.range_constexpr(frag_size):
                            frag_acc[v] = tRS_acc[e * frag_size + v]
                        frag_out.store(frag_acc.load().to(self.d_dtype))
                        buf = epi_base + (done_before + e) % _EPI_STAGES
                        cute.copy(r2s, frag_out, tRS_sD[(None, None, None, buf)])
                        cute.arch.fence_proxy("async.shared", space="cta")
                        epi_barrier.arrive_and_wait()
                        if warp == store_warp:
                            cute.copy(tma_d, bSG_sD[(None, buf)], bSG_gD[(None, epi_order.get_hier_coord(e))])
                            store_ring.producer_commit()
                            store_ring.producer_acquire()
                        epi_barrier.arrive_and_wait()

                tiles_done += 1
                unit += walk_step

            if cutlass.const_expr(self.k_cluster > 1):
                if k_rank > 0:
                    # Stay resident until the first CTA has read the last
                    # partial: its "free" arrive lands in this CTA's memory.
                    cute.arch.mbarrier_wait(red_free, (tiles_done & 1) ^ 1)
            store_ring.producer_tail()

    def _reduce_chunks(self) -> tuple[int, int, int]:
        """How the reduce pass splits one tile: (CTAs per tile, registers per
        thread, splits loaded per step). Each CTA sums ``regs`` of every
        consumer thread's accumulators, loading ``step`` splits' worth at
        once so the loads are in flight together (latency, not bandwidth,
        bounds a pass over many splits)."""
        acc_size = self.tile[0] * self.tile[1] // self.mma_threads
        regs = 2 if acc_size <= 32 else 4
        return acc_size // regs, regs, 32 // regs

    @cute.kernel
    def reduce_kernel(
        self,
        mWs: cute.Tensor,
        mD: cute.Tensor,
        mC: cute.Tensor,
        mBias: cute.Tensor,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        splits: cutlass.Int32,
        dp_tiles: cutlass.Int32,
        tail: cutlass.Int32,
        tiled_mma: cute.TiledMma,
        clusters_m: cutlass.Int32,
        clusters_n: cutlass.Int32,
        batches: cutlass.Int32,
        k_tiles: cutlass.Int32,
        workers: cutlass.Int32,
    ):
        """Split-K's second pass over the ``tail`` split cluster tiles: CTA
        ``t * chunks + c`` sums chunk ``c`` of CTA tile ``t``'s registers
        (CTA tile ``t`` is rank ``t % cluster size`` of tail cluster tile
        ``t // cluster size``), one thread per consumer thread of the GEMM,
        in split order (the same bits every run), then runs the epilogue.
        Under stream-K (splits == 0) a tile has as many pieces as workers
        whose runs touch it, summed in worker order; a tile one worker ran
        whole is already in D and is skipped. ``workers`` is the GEMM's
        persistent grid, ``k_tiles`` its k-blocks per tile."""
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        chunks, regs, step = self._reduce_chunks()
        cm, cn = self.cluster_mn
        t_cta = bid // chunks
        chunk = bid - t_cta * chunks
        t_local = t_cta // (cm * cn)
        rank = t_cta - t_local * (cm * cn)
        # Pieces of this tile and the workspace slots per tile (_sk_walk);
        # the hybrid (splits >= 1) skips stream-K's arithmetic.
        count = cutlass.Int32(splits)
        stride = cutlass.Int32(splits)
        need = cutlass.Int32(1)
        if splits == 0:
            work, sk_workers, sk_stride = self._sk_workers(tail, k_tiles, workers)
            base_k = t_local * k_tiles
            pieces = (self._sk_owner(base_k + k_tiles - 1, work, sk_workers)
                      - self._sk_owner(base_k, work, sk_workers) + 1)
            count = pieces
            stride = sk_stride
            need = cutlass.min(cutlass.max(pieces - 1, 0), 1)
        go = cutlass.min(cutlass.max(tail - t_local, 0), 1) * need
        if go == 1:
            # The rank's coordinate in the (cm, cn) cluster, as the GEMM's
            # cta_layout_mnk.get_flat_coord gives it (M fastest).
            cta_n = rank // cm
            cta_m = rank - cta_n * cm
            # The GEMM walked plainly iff it had no whole wave (dp_tiles == 0).
            m_idx, n_idx, l_idx = self._tile_coords(
                dp_tiles + t_local, clusters_m, clusters_n, cta_m, cta_n,
                self._plain_walk(dp_tiles, 0))
            tile_coord = (m_idx, n_idx, l_idx)
            tile_mn = cute.slice_(self.tile, (None, None, 0))
            thr = tiled_mma.get_slice(tidx)
            cD = cute.local_tile(cute.make_identity_tensor(mD.shape), tile_mn, (None, None, None))
            gD = cute.local_tile(mD, tile_mn, (None, None, None))
            tCcD = thr.partition_C(cD[(None, None, *tile_coord)])
            tCgD = thr.partition_C(gD[(None, None, *tile_coord)])
            nthr = self.mma_threads
            acc_size = cute.size(tCgD)
            tile_elems = acc_size * nthr
            acc = cute.make_rmem_tensor(regs, self.acc_dtype)
            vals = cute.make_rmem_tensor(regs * step, self.acc_dtype)
            c_vals = cute.make_rmem_tensor(regs, mC.element_type)
            # Launched early (programmatic dependent launch): the index
            # arithmetic above runs while the GEMM finishes; nothing is read
            # before its grid has finished and its writes are visible.
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
            # One static branch per chunk, so register indices stay static.
            for c in cutlass.range_constexpr(chunks):
                if chunk == c:
                    if cutlass.const_expr(self.cfg.with_c):
                        # C at each coordinate clamped into D (as the GEMM's
                        # edge tiles load it), unbranched and before the
                        # partials' loads, so its latency hides behind them
                        for j in cutlass.range_constexpr(regs):
                            coord = tCcD[c * regs + j]
                            c_vals[j] = mC[(cutlass.min(coord[0], mD.shape[0] - 1),
                                            cutlass.min(coord[1], mD.shape[1] - 1), coord[2])]
                    acc.fill(0.0)
                    first = (t_cta * stride) * tile_elems + (c * regs) * nthr + tidx
                    groups = count // step
                    for g in range(groups):
                        at = first + (g * step) * tile_elems
                        for u in cutlass.range_constexpr(step):
                            for j in cutlass.range_constexpr(regs):
                                vals[u * regs + j] = mWs[at + u * tile_elems + j * nthr]
                        for u in cutlass.range_constexpr(step):
                            for j in cutlass.range_constexpr(regs):
                                acc[j] = acc[j] + vals[u * regs + j]
                    for split in range(groups * step, count):
                        at = first + split * tile_elems
                        for j in cutlass.range_constexpr(regs):
                            acc[j] = acc[j] + mWs[at + j * nthr]
                    for j in cutlass.range_constexpr(regs):
                        i = c * regs + j
                        coord = tCcD[i]
                        inside = cute.elem_less(coord, mD.shape)
                        if inside:
                            if cutlass.const_expr(self.cfg.with_c):
                                v = acc[j] * alpha + beta * c_vals[j].to(self.acc_dtype)
                                tCgD[i] = self._bias_act(v, coord, inside, mBias).to(self.d_dtype)
                            else:
                                tCgD[i] = self._bias_act(acc[j] * alpha, coord, inside,
                                                         mBias).to(self.d_dtype)


__all__ = ["Sm90Gemm", "Sm90GemmConfig"]
