"""The decode GEMV kernel: few tokens times a K-contiguous weight, on CUDA cores.

Owns the CuTe DSL program for D = act(alpha * A @ B + beta * C + bias) when A
has few rows (tokens) and B is a weight stored K-contiguous (``b = w.t()`` of
a row-major nn.Linear weight w[N, K]). Build side only: imports the CuTe DSL
and must never be imported by the run side.

Why a second kernel for decode: at M <= 8 the GEMM is a stream of the weight
from HBM. The wgmma kernel's narrowest swapped tile is 64 weight rows, so a
4096 x 4096 weight is 64 tiles on 132 SMs and half the GPU never reads (a
split-K variant reaches every SM but pays a second pass). Here every CTA
streams ``rows`` weight rows, so the same weight is 1024 to 2048 small CTAs,
every SM streams, and nothing runs after the kernel.

One CTA (four warps, 128 threads) computes a ``tokens x rows`` block of D:
tokens m0 .. m0+T-1 (one pass) of weight rows n0 .. n0+R-1.

* Each thread owns 16-byte chunks of K: chunk c = step * 128 + thread. Per
  step it loads the chunk from each of its R weight rows (one 16-byte load
  each) and from each of its T token rows of A (which every CTA reads, so
  they come from L1/L2), converts to fp32 and accumulates T x R dot products.
  The chunk that crosses K's end is loaded element by element; rows past N
  or M are never read (their sums stay zero and are never stored).
* The 128 partial sums of each output are reduced in a fixed order: a
  butterfly inside each warp, then the four warps' sums in warp order
  through shared memory. The same inputs give the same bits every run.
* T x R threads then run the epilogue (alpha, beta * C, bias, activation)
  and store one element each, with a bounds check: D needs no alignment of
  its own beyond its element size.

The grid is 1-D over (weight-row block, token pass), token passes fastest,
so the passes over one weight block run together and re-read it from L2;
batches (rank 3) are the grid's second dim. Static: dtypes, T, R, whether C
and bias are read, the activation, the rank. Dynamic: M, N, K, L and every
stride (leading strides 16-byte divisible, which the artifact checks).

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

_WARPS = 4
_THREADS = 32 * _WARPS
# Elements per 16-byte chunk of a 16-bit operand.
_VEC = 8


@dataclass(frozen=True)
class GemvConfig:
    """Static choices that define one GEMV variant."""

    rows: int  # weight rows (output columns) per CTA
    tokens: int  # rows of A (tokens) per pass
    with_c: bool = False
    bias: bool = False
    act: str = "none"


class Gemv:
    """One compile-able GEMV variant; see the module docstring."""

    def __init__(self, config: GemvConfig, rank: int):
        self.cfg = config
        self.rank = rank

    # One entry point per argument list of the GEMM ABI (signature.gemm_abi_args);
    # ``sm_count`` is part of that ABI and unused here (the grid follows N and M).
    @cute.jit
    def run(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor,
            alpha: cutlass.Float32, sm_count: cutlass.Int32, stream: cuda.CUstream):
        """D = act(alpha * A @ B)."""
        self._launch(a, b, d, None, None, alpha, cutlass.Float32(0.0), stream)

    @cute.jit
    def run_c(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
              alpha: cutlass.Float32, beta: cutlass.Float32, sm_count: cutlass.Int32,
              stream: cuda.CUstream):
        """D = act(alpha * A @ B + beta * C)."""
        self._launch(a, b, d, c, None, alpha, beta, stream)

    @cute.jit
    def run_bias(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, bias: cute.Tensor,
                 alpha: cutlass.Float32, sm_count: cutlass.Int32, stream: cuda.CUstream):
        """D = act(alpha * A @ B + bias)."""
        self._launch(a, b, d, None, bias, alpha, cutlass.Float32(0.0), stream)

    @cute.jit
    def run_c_bias(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, c: cute.Tensor,
                   bias: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
                   sm_count: cutlass.Int32, stream: cuda.CUstream):
        """D = act(alpha * A @ B + beta * C + bias)."""
        self._launch(a, b, d, c, bias, alpha, beta, stream)

    @cute.jit
    def _launch(self, a, b, d, c, bias, alpha, beta, stream):
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
        self.kernel(mA, mW, mD, mC, mBias, alpha, beta, passes).launch(
            grid=(blocks * passes, mD.shape[2], 1),
            block=[_THREADS, 1, 1],
            stream=stream,
            use_pdl=True,
        )

    @cute.jit
    def _load_w(self, w_rows, w, row_ok, n0, ch):
        """Registers <- chunk ``ch`` of each weight row (zeros past N)."""
        for r in cutlass.range_constexpr(self.cfg.rows):
            if row_ok[r]:
                cute.autovec_copy(w_rows[(0, None), (n0 + r, ch)], w[r, None])
            else:
                w[r, None].fill(0.0)

    @cute.jit
    def _load_a(self, a_rows, a, tok_ok, m0, ch):
        """Registers <- chunk ``ch`` of each token row (zeros past M)."""
        for t in cutlass.range_constexpr(self.cfg.tokens):
            if tok_ok[t]:
                cute.autovec_copy(a_rows[(0, None), (m0 + t, ch)], a[t, None])
            else:
                a[t, None].fill(0.0)

    @cute.jit
    def _fma(self, acc, w, a):
        """acc[t, r] += dot(a[t], w[r]) over one chunk, in fp32, element by
        element (R + 1 conversions live at a time, not 8 (R + T))."""
        R = self.cfg.rows
        for v in cutlass.range_constexpr(_VEC):
            wf = [w[r, v].to(cutlass.Float32) for r in range(R)]
            for t in cutlass.range_constexpr(self.cfg.tokens):
                af = a[t, v].to(cutlass.Float32)
                for r in cutlass.range_constexpr(R):
                    acc[t * R + r] = acc[t * R + r] + af * wf[r]

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mW: cute.Tensor, mD: cute.Tensor, mC: cute.Tensor,
               mBias: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32,
               passes: cutlass.Int32):
        R = self.cfg.rows
        T = self.cfg.tokens
        tidx, _, _ = cute.arch.thread_idx()
        bid, l_idx, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx - warp * 32
        blk = bid // passes
        m0 = (bid - blk * passes) * T
        n0 = blk * R
        M = mD.shape[0]
        N = mD.shape[1]
        K = mA.shape[1]

        acc = cute.make_rmem_tensor((T * R,), cutlass.Float32)
        acc.fill(0.0)
        # Row-major register blocks (each row's chunk is contiguous, so its
        # copy is one 16-byte load). The weight is double-buffered: the next
        # chunk's loads from HBM are in flight while this one's FMAs run.
        # The token rows come from L1/L2 and are loaded just before use.
        w_layout = cute.make_layout((R, _VEC), stride=(_VEC, 1))
        w0 = cute.make_rmem_tensor(w_layout, self.ab_dtype)
        w1 = cute.make_rmem_tensor(w_layout, self.ab_dtype)
        a = cute.make_rmem_tensor(cute.make_layout((T, _VEC), stride=(_VEC, 1)), self.ab_dtype)

        # Rows past the problem are never read: their sums stay zero.
        row_ok = cute.make_rmem_tensor((R,), cutlass.Boolean)
        tok_ok = cute.make_rmem_tensor((T,), cutlass.Boolean)
        for r in cutlass.range_constexpr(R):
            row_ok[r] = n0 + r < N
        for t in cutlass.range_constexpr(T):
            tok_ok[t] = m0 + t < M

        # (VEC, chunks) views of each row of W and A: chunk c is K elements
        # [8c, 8c+8); the artifact's stride checks make every chunk 16-byte aligned.
        w_rows = cute.zipped_divide(mW[None, None, l_idx], (1, _VEC))
        a_rows = cute.zipped_divide(mA[None, None, l_idx], (1, _VEC))
        full = K // _VEC
        # This thread's whole chunks: tidx, tidx + 128, ... below ``full``.
        mine = cutlass.Int32(0)
        if tidx < full:
            mine = (full - tidx + (_THREADS - 1)) // _THREADS

        # Programmatic dependent launch (as sm90_gemm's): the set-up above
        # touches no global memory, so it may run while the kernel ahead of
        # this one finishes; wait for that grid before the first load, and
        # let the next kernel launch once every CTA of this grid has started.
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        if mine > 0:
            self._load_w(w_rows, w0, row_ok, n0, tidx)
        for j in range(0, mine, 2):
            if j + 1 < mine:
                self._load_w(w_rows, w1, row_ok, n0, tidx + (j + 1) * _THREADS)
            self._load_a(a_rows, a, tok_ok, m0, tidx + j * _THREADS)
            self._fma(acc, w0, a)
            if j + 2 < mine:
                self._load_w(w_rows, w0, row_ok, n0, tidx + (j + 2) * _THREADS)
            if j + 1 < mine:
                self._load_a(a_rows, a, tok_ok, m0, tidx + (j + 1) * _THREADS)
                self._fma(acc, w1, a)
        if full * _VEC < K and tidx == full % _THREADS:
            # The chunk across K's end: element by element, zeros past it.
            for r in cutlass.range_constexpr(R):
                for v in cutlass.range_constexpr(_VEC):
                    x = self.ab_dtype(0.0)
                    if row_ok[r] and full * _VEC + v < K:
                        x = mW[n0 + r, full * _VEC + v, l_idx]
                    w0[r, v] = x
            for t in cutlass.range_constexpr(T):
                for v in cutlass.range_constexpr(_VEC):
                    x = self.ab_dtype(0.0)
                    if tok_ok[t] and full * _VEC + v < K:
                        x = mA[m0 + t, full * _VEC + v, l_idx]
                    a[t, v] = x
            self._fma(acc, w0, a)

        # Fixed-order reduction: butterfly in each warp, then warps in order.
        @cute.struct
        class Storage:
            red: cute.struct.MemRange[cutlass.Float32, _WARPS * T * R]

        storage = cutlass.utils.SmemAllocator().allocate(Storage)
        red = storage.red.get_tensor(cute.make_layout(_WARPS * T * R))
        for i in cutlass.range_constexpr(T * R):
            s = acc[i]
            for sh in cutlass.range_constexpr(5):
                s = s + cute.arch.shuffle_sync_bfly(s, offset=16 >> sh)
            if lane == 0:
                red[warp * (T * R) + i] = s
        cute.arch.sync_threads()

        if tidx < T * R:
            t = tidx // R
            r = tidx - t * R
            m = m0 + t
            n = n0 + r
            if m < M and n < N:
                v = red[tidx]
                for w in cutlass.range_constexpr(1, _WARPS):
                    v = v + red[w * (T * R) + tidx]
                v = v * alpha
                if cutlass.const_expr(self.cfg.with_c):
                    v = v + beta * mC[m, n, l_idx].to(cutlass.Float32)
                if cutlass.const_expr(self.cfg.bias):
                    v = v + mBias[n].to(cutlass.Float32)
                v = activate(v, self.cfg.act)
                mD[m, n, l_idx] = v.to(self.d_dtype)


__all__ = ["Gemv", "GemvConfig"]
