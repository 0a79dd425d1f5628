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
  epilogue: scale by alpha, optionally add beta * C (read from global memory
  with bounds checks), convert, stage through shared memory with stmatrix and
  store with TMA (which clips rows and columns past the problem edge).

What is static (baked into the artifact): dtypes, majorness of every operand,
tile and cluster shape, raster order and swizzle, whether C is read, the
rank of the caller's tensors. What is dynamic (read per call): M, N, K, L,
leading and batch strides, alpha, beta, and the number of SMs of the GPU the
call runs on, from which the persistent grid is sized. Nothing about the
product (H100, H200, H20) is baked in.

The caller's tensors are taken in their natural PyTorch shapes, a[M,K] or
a[L,M,K], b[K,N] or b[L,K,N], d[M,N] or d[L,M,N]; the re-indexing into CuTe's
(M,K,L)/(N,K,L)/(M,N,L) views happens here, at trace time, so the run side
never builds a torch view on its hot path.

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

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

# Bytes reserved for mbarriers and alignment slack when sizing the A/B ring.
_BARRIER_BYTES = 1024
# Epilogue staging buffers in shared memory (TMA store ring depth).
_EPI_STAGES = 4
# wgmma issues 16-wide k slices; a k-block is four of them.
_K_BLOCK = 64
_THREADS_PER_WG = 128
# Register split between producer and consumer warpgroups (setmaxnreg).
_PRODUCER_REGS = 40
_CONSUMER_REGS = 232


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

    @property
    def consumer_wgs(self) -> int:
        # Two consumer warpgroups split M once the tile holds 128x256 outputs;
        # one warpgroup holding that many fp32 accumulators would spill.
        return 2 if self.tile_m * self.tile_n >= 128 * 256 else 1


def _leading(t: cute.Tensor):
    """The non-unit stride of a 2-D tensor.

    Used as the (never stepped) batch stride of a rank-2 call: it is known to
    be 16-byte divisible, which the TMA descriptor requires of every stride.
    """
    return t.stride[1] if isinstance(t.stride[0], int) and t.stride[0] == 1 else t.stride[0]


def _to_mkl(t: cute.Tensor, rank: int) -> cute.Tensor:
    """View a[M,K] / a[L,M,K] (or d[M,N] / d[L,M,N]) as (M, K, L)."""
    if rank == 2:
        layout = cute.make_layout(
            (t.shape[0], t.shape[1], 1), stride=(t.stride[0], t.stride[1], _leading(t))
        )
    else:
        layout = cute.make_layout(
            (t.shape[1], t.shape[2], t.shape[0]),
            stride=(t.stride[1], t.stride[2], t.stride[0]),
        )
    return cute.make_tensor(t.iterator, layout)


def _to_nkl(t: cute.Tensor, rank: int) -> cute.Tensor:
    """View b[K,N] / b[L,K,N] as (N, K, L)."""
    if rank == 2:
        layout = cute.make_layout(
            (t.shape[1], t.shape[0], 1), stride=(t.stride[1], t.stride[0], _leading(t))
        )
    else:
        layout = cute.make_layout(
            (t.shape[2], t.shape[1], t.shape[0]),
            stride=(t.stride[2], t.stride[1], t.stride[0]),
        )
    return cute.make_tensor(t.iterator, layout)


class Sm90Gemm:
    """One compiled-able GEMM variant; see the module docstring."""

    def __init__(self, config: Sm90GemmConfig, rank: int):
        self.cfg = config
        self.rank = rank
        self.acc_dtype = cutlass.Float32
        self.cluster_mn = (config.cluster_m, config.cluster_n)
        self.atom_layout_mnk = (config.consumer_wgs, 1, 1)
        self.num_consumer_wgs = config.consumer_wgs
        self.num_consumer_threads = self.num_consumer_wgs * _THREADS_PER_WG
        self.threads_per_cta = (1 + self.num_consumer_wgs) * _THREADS_PER_WG
        self.producer_warp = 0
        self.store_warp = 4  # first warp of the first consumer warpgroup
        self.smem_capacity = utils.get_smem_capacity_in_bytes("sm_90")
        self.epi_barrier = pipeline.NamedBarrier(
            barrier_id=1, num_threads=self.num_consumer_threads
        )

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
        self._launch(a, b, d, c, alpha, beta, sm_count, stream)

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
        self._launch(a, b, d, d, alpha, cutlass.Float32(0.0), sm_count, stream)

    @cute.jit
    def _launch(self, a, b, d, c, alpha, beta, sm_count, stream):
        mA = _to_mkl(a, self.rank)
        mB = _to_nkl(b, self.rank)
        mD = _to_mkl(d, self.rank)
        mC = _to_mkl(c, self.rank)

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

        tiles = cute.zipped_divide(mD, tiler=(self.tile[0], self.tile[1]))
        ctas_mnl = tiles[(0, (None, None, None))].shape
        sched = utils.PersistentTileSchedulerParams(
            ctas_mnl, (*self.cluster_mn, 1), self.cfg.swizzle, self.cfg.raster_along_m
        )
        # The persistent grid comes from the live GPU's SM count (a runtime
        # argument), never from the machine that compiled the artifact.
        max_clusters = sm_count // (self.cluster_mn[0] * self.cluster_mn[1])
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, max_clusters)

        @cute.struct
        class Storage:
            ring_barriers: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            sA: cute.struct.Align[
                cute.struct.MemRange[self.a_dtype, cute.cosize(self.a_smem_staged)], 1024
            ]
            sB: cute.struct.Align[
                cute.struct.MemRange[self.b_dtype, cute.cosize(self.b_smem_staged)], 1024
            ]
            sD: cute.struct.Align[
                cute.struct.MemRange[self.d_dtype, cute.cosize(self.d_smem_staged)], 1024
            ]

        self.storage = Storage
        self.kernel(
            tma_a, gA, tma_b, gB, tma_d, gD, mC, alpha, beta,
            self.tiled_mma, self.cta_layout_mnk,
            self.a_smem_staged, self.b_smem_staged, self.d_smem_staged, sched,
        ).launch(
            grid=grid,
            block=[self.threads_per_cta, 1, 1],
            cluster=(*self.cluster_mn, 1),
            min_blocks_per_mp=1,
            stream=stream,
        )

    def _derive_static(self) -> None:
        """Tiled MMA, shared-memory layouts and stage counts for this variant."""
        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.a_dtype,
            self.b_dtype,
            self.a_layout.sm90_mma_major_mode(),
            self.b_layout.sm90_mma_major_mode(),
            self.acc_dtype,
            self.atom_layout_mnk,
            tiler_mn=(64, self.cfg.tile_n),
        )
        self.tile = (self.cfg.tile_m, self.cfg.tile_n, _K_BLOCK)
        self.cta_layout_mnk = cute.make_layout((*self.cluster_mn, 1))
        self.mcast_a = self.cluster_mn[1]
        self.mcast_b = self.cluster_mn[0]

        if self.num_consumer_wgs == 2:
            self.epi_tile = (min(128, self.tile[0]), min(32, self.tile[1]))
        else:
            self.epi_tile = (min(64, self.tile[0]), min(32, self.tile[1]))

        ab_bytes = (self.tile[0] + self.tile[1]) * self.tile[2] * self.a_dtype.width // 8
        epi_bytes = self.epi_tile[0] * self.epi_tile[1] * self.d_dtype.width // 8 * _EPI_STAGES
        self.ab_stages = (self.smem_capacity - _BARRIER_BYTES - epi_bytes) // ab_bytes

        self.a_smem_staged = self._operand_smem(self.a_layout, self.a_dtype, self.tile[0])
        self.b_smem_staged = self._operand_smem(self.b_layout, self.b_dtype, self.tile[1])

        d_major_size = self.epi_tile[1] if self.d_layout.is_n_major_c() else self.epi_tile[0]
        d_atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(self.d_layout, self.d_dtype, d_major_size),
            self.d_dtype,
        )
        self.d_smem_staged = cute.tile_to_shape(
            d_atom,
            cute.append(self.epi_tile, _EPI_STAGES),
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
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        tiled_mma: cute.TiledMma,
        cta_layout_mnk: cute.Layout,
        a_smem_staged: cute.ComposedLayout,
        b_smem_staged: cute.ComposedLayout,
        d_smem_staged: cute.ComposedLayout,
        sched_params: utils.PersistentTileSchedulerParams,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_d)

        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cta_layout_mnk.get_flat_coord(cta_rank)
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
        release_count = (self.mcast_a + self.mcast_b - 1) * self.num_consumer_wgs * 4
        ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ring_barriers.data_ptr(),
            num_stages=self.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, release_count),
            tx_count=stage_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
            defer_sync=True,
        )
        pipeline_init_arrive(cluster_shape_mn=self.cluster_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem_staged.outer, swizzle=a_smem_staged.inner)
        sB = storage.sB.get_tensor(b_smem_staged.outer, swizzle=b_smem_staged.inner)
        sD = storage.sD.get_tensor(d_smem_staged.outer, swizzle=d_smem_staged.inner)

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
            cute.make_layout(self.num_consumer_wgs, stride=_THREADS_PER_WG)(wg - 1)
        )
        tCsA = thr_mma.partition_A(sA)
        tCsB = thr_mma.partition_B(sB)
        tCrA = tiled_mma.make_fragment_A(tCsA)
        tCrB = tiled_mma.make_fragment_B(tCsB)
        tCgD = thr_mma.partition_C(gD)
        acc = cute.make_rmem_tensor(tCgD.shape[:3], self.acc_dtype)

        k_tiles = cute.size(gA, mode=[3])

        pipeline_init_wait(cluster_shape_mn=self.cluster_mn)

        if wg == 0:
            cute.arch.setmaxregister_decrease(_PRODUCER_REGS)

        # ---------------- producer: TMA loads into the ring
        if warp == self.producer_warp:
            sched = utils.StaticPersistentTileScheduler.create(
                sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
            )
            work = sched.initial_work_tile_info()
            put = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stages)
            while work.is_valid_tile:
                m_idx, n_idx, l_idx = work.tile_idx
                tAgA_t = tAgA[(None, m_idx, None, l_idx)]
                tBgB_t = tBgB[(None, n_idx, None, l_idx)]
                put.reset_count()
                for _k in range(k_tiles):
                    ring.producer_acquire(put)
                    bar = ring.producer_get_barrier(put)
                    cute.copy(tma_a, tAgA_t[(None, put.count)], tAsA[(None, put.index)],
                              tma_bar_ptr=bar, mcast_mask=a_mask)
                    cute.copy(tma_b, tBgB_t[(None, put.count)], tBsB[(None, put.index)],
                              tma_bar_ptr=bar, mcast_mask=b_mask)
                    ring.producer_commit(put)
                    put.advance()
                sched.advance_to_next_work()
                work = sched.get_current_work()
            ring.producer_tail(put)

        # ---------------- consumers: wgmma + epilogue
        if wg > 0:
            cute.arch.setmaxregister_increase(_CONSUMER_REGS)
            sched = utils.StaticPersistentTileScheduler.create(
                sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
            )
            work = sched.initial_work_tile_info()
            get = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
            free = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
            k_blocks = cute.size(tCrA, mode=[2])

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
            thr_r2s = r2s.get_slice(tidx - _THREADS_PER_WG)
            tRS_sD = thr_r2s.partition_D(sD)
            tRS_acc = r2s.retile(acc)
            frag_shape = cute.shape(thr_r2s.partition_S(sD))[:3]
            frag_acc = cute.make_rmem_tensor(frag_shape, self.acc_dtype)
            frag_out = cute.make_rmem_tensor(frag_shape, self.d_dtype)
            frag_size = cute.size(frag_acc)

            store_ring = pipeline.PipelineTmaStore.create(
                num_stages=_EPI_STAGES,
                producer_group=pipeline.CooperativeGroup(
                    pipeline.Agent.Thread, self.num_consumer_threads
                ),
            )

            if cutlass.const_expr(self.cfg.with_c):
                thr_acc = tiled_mma.get_slice(tidx - _THREADS_PER_WG)
                cD_full = cute.make_identity_tensor(mD.shape)
                cD = cute.local_tile(
                    cD_full, cute.slice_(self.tile, (None, None, 0)), (None, None, None)
                )
                gC = cute.local_tile(
                    mC, cute.slice_(self.tile, (None, None, 0)), (None, None, None)
                )

            while work.is_valid_tile:
                tile_coord = work.tile_idx
                get.reset_count()
                free.reset_count()
                acc.fill(0.0)
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                cute.nvgpu.warpgroup.fence()

                # Keep one wgmma batch in flight: release stage k-1 once
                # stage k's wgmmas are issued and k-1's have retired.
                for k in range(k_tiles):
                    ring.consumer_wait(get)
                    for kb in cutlass.range_constexpr(k_blocks):
                        coord = (None, None, kb, get.index)
                        cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
                    cute.nvgpu.warpgroup.commit_group()
                    if k > 0:
                        cute.nvgpu.warpgroup.wait_group(1)
                        ring.consumer_release(free)
                        free.advance()
                    get.advance()
                cute.nvgpu.warpgroup.wait_group(0)
                if k_tiles > 0:
                    ring.consumer_release(free)
                    free.advance()

                # ---- epilogue math in registers
                if cutlass.const_expr(self.cfg.with_c):
                    # Coordinates of *this thread's* accumulators: slice the
                    # tiled MMA by thread, not by warpgroup (the warpgroup
                    # slice is what wgmma operands need, and it would give
                    # every thread its warpgroup's first thread's positions).
                    tCgC = thr_acc.partition_C(gC[(None, None, *tile_coord)])
                    tCcD = thr_acc.partition_C(cD[(None, None, *tile_coord)])
                    for i in cutlass.range_constexpr(cute.size(acc)):
                        val = acc[i] * alpha
                        if cute.elem_less(tCcD[i], mD.shape):
                            val = val + beta * tCgC[i].to(self.acc_dtype)
                        acc[i] = val
                else:
                    acc.store(acc.load() * alpha)

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
                done_before = sched.num_tiles_executed * epi_count
                for e in cutlass.range_constexpr(epi_count):
                    for v in cutlass.range_constexpr(frag_size):
                        frag_acc[v] = tRS_acc[e * frag_size + v]
                    frag_out.store(frag_acc.load().to(self.d_dtype))
                    buf = (done_before + e) % _EPI_STAGES
                    cute.copy(r2s, frag_out, tRS_sD[(None, None, None, buf)])
                    cute.arch.fence_proxy("async.shared", space="cta")
                    self.epi_barrier.arrive_and_wait()
                    if warp == self.store_warp:
                        cute.copy(tma_d, bSG_sD[(None, buf)], bSG_gD[(None, epi_order.get_hier_coord(e))])
                        store_ring.producer_commit()
                        store_ring.producer_acquire()
                    self.epi_barrier.arrive_and_wait()

                sched.advance_to_next_work()
                work = sched.get_current_work()

            store_ring.producer_tail()


__all__ = ["Sm90Gemm", "Sm90GemmConfig"]
