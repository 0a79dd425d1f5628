"""The decode GEMV kernel: few tokens times a K-contiguous weight, on CUDA cores.

Owns the CuTe DSL program for D = act(alpha * A @ B + beta * C + bias) when A
has few rows (tokens) and B is a weight stored K-contiguous (``b = w.t()`` of
a row-major nn.Linear weight w[N, K]). Build side only: imports the CuTe DSL
and must never be imported by the run side.

Why a second kernel for decode: at M <= 8 the GEMM is a stream of the weight
from HBM. The wgmma kernel's narrowest swapped tile is 64 weight rows, so a
4096 x 4096 weight is 64 tiles on 132 SMs and half the GPU never reads (a
split-K variant reaches every SM but pays a second pass). Here every warp of
the GPU streams weight rows, and nothing runs after the kernel.

The grid is resident: two CTAs of eight warps an SM (``sm_count`` x 2, fewer
when the work does not fill them), batches (rank 3) on the grid's second
dim. The work is a list of items, (block of ``rows`` weight rows, pass of
``tokens`` rows of A), passes fastest, so the passes over one weight block
run on neighbouring warps together and re-read it from L2. Warp w takes
items w, w + warps, w + 2 warps, ...

* Per item, a lane owns 16-byte chunks of K: chunk c = 32 j + lane. A
  segment is U chunks of each of the item's weight rows and of its tokens'
  rows, (R + T) x U <= 16 loads, all issued before the first multiply: the
  weight's from HBM, the tokens' from L1/L2 (every warp reads them). Then
  each chunk's R x T dot products are formed in fp32 as a fixed tree and
  added to the sums. No branch separates the loads: a chunk past K's whole
  chunks reads the tokens' last one and its sum is replaced by zero (a
  select), a pass's tokens past M read row M - 1 (never stored), and only
  the weight's loads are predicated (rows past N, chunks past K). The chunk
  across K's end is loaded element by element.
* The 32 lanes' partial sums of each output are reduced by a butterfly in a
  fixed order: the same inputs give the same bits every run. Lane i then
  runs the epilogue (alpha, beta * C, bias, activation) of output i and
  stores it with a bounds check: D needs no alignment of its own beyond its
  element size.

Until r39 a CTA of 128 threads took one block of rows, the grid held a CTA
per block, and the warps' sums met in shared memory. benchmarks/gemv_floor.py
measured this layout (hand-written in CUDA, one row a warp) at one token and
K = 4096 beside the dispatcher's pick (swap-AB wgmma tiles): a fixed cost of
about 2.1 µs a call against 2.7 µs, 9.9 against 10.4 µs for a 32 MiB weight
and 29.9 against 31.8 µs for 112 MiB
(``benchmarks/results/2026-12-04_h200_r39_gemv_floor_ecc42c0.md``). r39's
first port of it ran 1.7x slower: its token loads sat behind a branch each,
after a fence, so they went out one at a time. This one matches the
hand-written kernel at one token (r40: gemv1x1 9.98 µs at 32 MiB beside its
9.82, ``benchmarks/results/2026-12-04_h200_r40_gemv_floor_*.md``).

Static: dtypes, T, R, whether C and bias are read, the activation, the rank.
Dynamic: M, N, K, L, the SM count and every stride (leading strides 16-byte
divisible, which the artifact checks).

Its launch is a programmatic dependent launch, like sm90_gemm's (see that
module's docstring): set-up overlaps the tail of the kernel ahead, and the
first global access waits for that kernel's grid.

The design follows the split-free decode GEMV kernels of inference engines
(one warp-cooperative dot product per weight row, a warp shuffle reduction),
e.g. TensorRT-LLM's and FasterTransformer's weight-only GEMV; the code is
our own.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from .views import activate, to_mkl, to_nkl

_WARPS = 8
_THREADS = 32 * _WARPS
# Elements per 16-byte chunk of a 16-bit operand.
_VEC = 8
# 16-byte loads a lane issues before it multiplies: (rows + tokens) x chunks.
_IN_FLIGHT = 16
# CTAs an SM the grid holds at most: two 256-thread CTAs of about 100
# registers a thread fill the register file.
_CTAS_PER_SM = 2


@dataclass(frozen=True)
class GemvConfig:
    """Static choices that define one GEMV variant."""

    rows: int  # weight rows (output columns) a warp streams together
    tokens: int  # rows of A (tokens) per pass
    with_c: bool = False
    bias: bool = False
    act: str = "none"


class Gemv:
    """One compile-able GEMV variant; see the module docstring."""

    def __init__(self, config: GemvConfig, rank: int):
        self.cfg = config
        self.rank = rank
        # Chunks of K a lane takes per segment: each brings R weight loads
        # and T token loads, all issued before the first multiply, so the segment's
        # 16-byte loads (R + T) x U stay within _IN_FLIGHT (half that where
        # the block's sums would spill: more than 4 outputs a warp).
        in_flight = _IN_FLIGHT if config.rows * config.tokens <= 4 else _IN_FLIGHT // 2
        self.chunks = max(1, in_flight // (config.rows + config.tokens))

    # One entry point per argument list of the GEMM ABI (signature.gemm_abi_args);
    # ``sm_count`` sizes the resident grid.
    @cute.jit
    def run(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor,
            alpha: cutlass.Float32, sm_count: cutlass.Int32, stream: cuda.CUstream):
        """D = act(alpha * A @ B)."""
        self._launch(a, b, d, None, None, alpha, cutlass.Float32(0.0), sm_count, stream)

    @cute.jit
    def run_c(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
              alpha: cutlass.Float32, beta: cutlass.Float32, sm_count: cutlass.Int32,
              stream: cuda.CUstream):
        """D = act(alpha * A @ B + beta * C)."""
        self._launch(a, b, d, c, None, alpha, beta, sm_count, stream)

    @cute.jit
    def run_bias(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, bias: cute.Tensor,
                 alpha: cutlass.Float32, sm_count: cutlass.Int32, stream: cuda.CUstream):
        """D = act(alpha * A @ B + bias)."""
        self._launch(a, b, d, None, bias, alpha, cutlass.Float32(0.0), sm_count, stream)

    @cute.jit
    def run_c_bias(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
                   bias: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
                   sm_count: cutlass.Int32, stream: cuda.CUstream):
        """D = act(alpha * A @ B + beta * C + bias)."""
        self._launch(a, b, d, c, bias, alpha, beta, sm_count, stream)

    @cute.jit
    def _launch(self, a, b, d, c, bias, alpha, beta, sm_count, stream):
        mA = to_mkl(a, self.rank)   # (M, K, L), K contiguous
        mW = to_nkl(b, self.rank)   # (N, K, L), K contiguous
        mD = to_mkl(d, self.rank)   # (M, N, L)
        mC = mD if c is None else to_mkl(c, self.rank)
        # The bias as an (N,) vector; absent, D stands in and is never read.
        mBias = mD[0, None, 0] if bias is None else bias
        self.ab_dtype = mA.element_type
        self.d_dtype = mD.element_type
        passes = (mD.shape[0] + (self.cfg.tokens - 1)) // self.cfg.tokens
        blocks = (mD.shape[1] + (self.cfg.rows - 1)) // self.cfg.rows
        items = blocks * passes
        # The resident grid: at most _CTAS_PER_SM CTAs an SM, fewer when the
        # items do not fill them; each warp strides over the items.
        ctas = (items + (_WARPS - 1)) // _WARPS
        grid_x = sm_count * _CTAS_PER_SM
        if ctas < grid_x:
            grid_x = ctas
        self.kernel(mA, mW, mD, mC, mBias, alpha, beta, passes, items, grid_x * _WARPS).launch(
            grid=(grid_x, mD.shape[2], 1),
            block=[_THREADS, 1, 1],
            stream=stream,
            use_pdl=True,
            # Two CTAs an SM: ptxas keeps each thread to 128 registers (4x1
            # took 197 without it). No shared memory: all of it may be L1,
            # where the tokens' rows are re-read.
            min_blocks_per_mp=_CTAS_PER_SM,
            preferred_smem_carveout=0,
        )

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mW: cute.Tensor, mD: cute.Tensor, mC: cute.Tensor,
               mBias: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
               passes: cutlass.Int32, items: cutlass.Int32, nwarps: cutlass.Int32):
        R = self.cfg.rows
        T = self.cfg.tokens
        U = self.chunks
        tidx, _, _ = cute.arch.thread_idx()
        bid, l_idx, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx - warp * 32
        M = mD.shape[0]
        N = mD.shape[1]
        K = mA.shape[1]
        full = K // _VEC                 # whole 16-byte chunks of a row
        seg = 32 * U                     # chunks of a row one segment covers
        segs = (full + (seg - 1)) // seg

        # (VEC, chunks) views of each row of W and A: chunk c is K elements
        # [8c, 8c+8); the artifact's stride checks make every chunk 16-byte aligned.
        w_rows = cute.zipped_divide(mW[None, None, l_idx], (1, _VEC))
        a_rows = cute.zipped_divide(mA[None, None, l_idx], (1, _VEC))
        w = cute.make_rmem_tensor(cute.make_layout((R, U, _VEC), stride=(U * _VEC, _VEC, 1)),
                                  self.ab_dtype)
        a = cute.make_rmem_tensor(cute.make_layout((T, U, _VEC), stride=(U * _VEC, _VEC, 1)),
                                  self.ab_dtype)
        acc = cute.make_rmem_tensor((T * R,), cutlass.Float32)

        # Programmatic dependent launch (as sm90_gemm's): wait for the grid
        # ahead before the first load, then let the next kernel launch.
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        for item in range(bid * _WARPS + warp, items, nwarps):
            blk = item // passes
            n0 = blk * R
            m0 = (item - blk * passes) * T
            acc.fill(0.0)
            for s in range(segs):
                base = s * seg + lane
                # Every load of the segment first, the weight's (HBM) and
                # the tokens' (L1/L2) together, (R + T) x U 16-byte loads
                # in flight a lane; weight rows past N are never read. A
                # chunk past K's whole chunks reads the tokens' last one and
                # its sum is dropped (a select, not a branch).
                for r in cutlass.range_constexpr(R):
                    for j in cutlass.range_constexpr(U):
                        if base + j * 32 < full and n0 + r < N:
                            cute.autovec_copy(w_rows[(0, None), (n0 + r, base + j * 32)],
                                              w[r, j, None])
                for j in cutlass.range_constexpr(U):
                    self._load_a(a_rows, a, j, m0, M, cutlass.min(base + j * 32, full - 1))
                # No fence: with no branch between them, ptxas issues every
                # load above before the first multiply (checked on the SASS)
                # and each chunk's multiplies wait for their own loads only.
                # r39's first build issued the token loads after a fence,
                # each behind its own branch: an L2 round trip in series per
                # chunk once the weight had arrived, 1.7x the time. A fence
                # after all the loads (r40) cost 2.8% at 4096x4096 against
                # none (10.26 against 9.98 µs), waiting for the last load.
                for j in cutlass.range_constexpr(U):
                    self._fma(acc, w, a, j, base + j * 32 < full)
            if full * _VEC < K and lane == full % 32:
                # The chunk across K's end: element by element, zeros past it.
                self._load_tail(mW, w, R, n0, N, full * _VEC, K, l_idx)
                self._load_tail(mA, a, T, m0, M, full * _VEC, K, l_idx)
                self._fma(acc, w, a, 0, None)

            # Fixed-order reduction (a butterfly: every lane ends with every
            # sum), then lane i stores output i of the T x R block.
            for i in cutlass.range_constexpr(T * R):
                v = acc[i]
                for sh in cutlass.range_constexpr(5):
                    v = v + cute.arch.shuffle_sync_bfly(v, offset=16 >> sh)
                t = i // R
                r = i - t * R
                if lane == i and m0 + t < M and n0 + r < N:
                    v = v * alpha
                    if cutlass.const_expr(self.cfg.with_c):
                        v = v + beta * mC[m0 + t, n0 + r, l_idx].to(cutlass.Float32)
                    if cutlass.const_expr(self.cfg.bias):
                        v = v + mBias[n0 + r].to(cutlass.Float32)
                    v = activate(v, self.cfg.act)
                    mD[m0 + t, n0 + r, l_idx] = v.to(self.d_dtype)

    @cute.jit
    def _load_tail(self, src, dst, count, first, rows, col, K, l_idx):
        """dst[i, 0, :] <- src[first + i, col:col + 8] for i < ``count``,
        element by element: zeros past K and for rows at or past ``rows``."""
        for i in cutlass.range_constexpr(count):
            for v in cutlass.range_constexpr(_VEC):
                x = self.ab_dtype(0.0)
                if first + i < rows and col + v < K:
                    x = src[first + i, col + v, l_idx]
                dst[i, 0, v] = x

    @cute.jit
    def _load_a(self, a_rows, a, j, m0, M, ch):
        """Registers a[:, j] <- chunk ``ch`` of each token row, from L1/L2. A
        pass's rows past M read row M - 1 instead (no branch); their sums
        are never stored."""
        for t in cutlass.range_constexpr(self.cfg.tokens):
            cute.autovec_copy(a_rows[(0, None), (cutlass.min(m0 + t, M - 1), ch)], a[t, j, None])

    @cute.jit
    def _fma(self, acc, w, a, j, inside):
        """acc[t, r] += dot(a[t], w[r, j]) over one chunk, in fp32: four
        two-term products summed as a tree, then added to acc, so the
        dependent chain is one add a chunk, not eight (the order is fixed:
        the same bits every run). ``inside`` (None: always) says the chunk
        is within K; outside, the chunk's sum is replaced by zero, so
        whatever its registers hold (NaN included) never reaches acc."""
        R = self.cfg.rows
        wf = [[w[r, j, v].to(cutlass.Float32) for v in range(_VEC)] for r in range(R)]
        for t in cutlass.range_constexpr(self.cfg.tokens):
            af = [a[t, j, v].to(cutlass.Float32) for v in range(_VEC)]
            for r in cutlass.range_constexpr(R):
                p = [af[2 * h] * wf[r][2 * h] + af[2 * h + 1] * wf[r][2 * h + 1]
                     for h in range(_VEC // 2)]
                part = (p[0] + p[1]) + (p[2] + p[3])
                if cutlass.const_expr(inside is not None):
                    part = cutlass.Float32(cutlass.select_(inside, part, cutlass.Float32(0.0)))
                acc[t * R + r] = acc[t * R + r] + part

__all__ = ["Gemv", "GemvConfig"]
