"""What a decode call's fixed cost is made of: hand-written CUDA GEMVs beside ours and cuBLAS (GPU).

bench_decode.py finds a decode GEMM paying a fixed ~2.6 µs a call beyond its
bytes (r35, r37): a quarter of a 32 MiB weight's call. copy_floor.py measured
torch's copy and sum at the same sizes, but neither is a GEMV. This script
compiles (with nvcc, through torch's cpp_extension) a plain one-token bf16
GEMV, y = W x with W an nn.Linear weight (N x K, row-major), one warp per row,
16-byte read-only loads (``ld.global.nc``), and times it beside our dispatcher's pick and
cuBLAS (torch.mm) at K = 4096 and growing N, as bench_decode.py times a
problem: CUDA graph replay of back-to-back calls, operand sets rotated call
to call (tune.timing's cold L2). A least-squares line through each kernel's
times gives its fixed cost (the intercept, µs) and its streaming bandwidth
(the slope).

The hand-written GEMV runs in three launch modes:

* ``plain``: no programmatic dependent launch (PDL);
* ``pdl``: launched with PDL, its dependents released at once, every load
  after ``griddepcontrol.wait`` (what our kernels do);
* ``pdl-w``: as ``pdl``, but each warp issues its first row's weight loads
  before the wait, the activation's after. Only valid where the kernel
  ahead does not write the weight (a model's parameters at inference).

and in three layouts: ``gemv_rows`` (``r1``, ``r2``: 1 or 2 rows a warp, as many
CTAs as that takes), ``gemv_stride`` (``g1``, ``g2``: a resident grid of one or
two 256-thread CTAs an SM, warps striding over the rows) and
``gemv_stride_pipe`` (``p1``, ``p2``: the same with 128-thread CTAs and a row of
look-ahead). With one CTA an SM a grid leaves half of each SM free, so under
PDL the next call's CTAs can be resident while this one drains: the overlap
r35 and r37 tried inside our kernel. ``--variants`` times cached options
by label beside them (r40: the gemv tiles, launched as the dispatcher
would). ``--frag`` adds ``gemv_frag`` (``g2 frag16``): the loads of r41's
tensor-core GEMV (16 rows a warp, 64 bytes a row a load instruction, K split
over a CTA's 8 warps) with CUDA-core math, to tell its access pattern's cost
from its MMAs', and ``gemv_tc`` (``g2 tc16``): the same split with rows loaded
contiguously (128 bytes a row a load), rearranged through shared memory and
``ldmatrix`` into ``mma.sync``. Each output is checked against torch's fp32
product before timing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _common import header, linear_candidates, write
from bench_decode import copy_tbps, problem_bytes
from torch.utils.cpp_extension import load_inline

import cutlass_aot
from cutlass_aot.run import select
from cutlass_aot.run.dispatch import launch_choice
from cutlass_aot.tune.timing import copies_for, interleaved, l2_bytes, rotate

MIB = 1 << 20
K = 4096
NS = (1024, 2048, 4096, 6144, 8192, 14336, 28672)

CUDA_SRC = r"""
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  return __ldg(p);  // a plain load the compiler can batch; the wait's memory clobber orders it
}

// The loads and the fence the CuTe DSL build of this layout compiled to
// (r39): a coherent ld.global.v4 (L1-allocating) and fence.acq_rel.cta.
__device__ __forceinline__ uint4 ldg_coherent(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <int KIND>
__device__ __forceinline__ uint4 load_w(const uint4* p) {
  if (KIND == 1) return ldg_coherent(p);
  return ldg_stream(p);
}

template <int KIND>
__device__ __forceinline__ void order_loads() {
  if (KIND == 0) __threadfence_block();
  else asm volatile("fence.acq_rel.cta;" ::: "memory");
}

__device__ __forceinline__ float dot2(unsigned a, unsigned b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a);
  __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162*>(&b);
  float2 fx = __bfloat1622float2(x), fy = __bfloat1622float2(y);
  return fx.x * fy.x + fx.y * fy.y;
}

// One row's CPL chunks for this lane (chunk c * 32 + lane), every load
// issued before any is used.
template <int CPL, int KIND = 0>
__device__ __forceinline__ void load_row(uint4 (&wv)[CPL], const uint4* __restrict__ w, int row, int lane) {
  const uint4* wr = w + (size_t)row * (CPL * 32);
#pragma unroll
  for (int c = 0; c < CPL; ++c) wv[c] = load_w<KIND>(wr + c * 32 + lane);
}

// One row's output: the lane's dot products with the token, summed over the
// warp by shuffles, stored by lane 0.
template <int CPL>
__device__ __forceinline__ void row_out(const uint4 (&wv)[CPL], const uint4* __restrict__ x,
                                        __nv_bfloat16* __restrict__ y, int row, int lane) {
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < CPL; ++c) {
    uint4 xv = x[c * 32 + lane];
    acc += dot2(wv[c].x, xv.x) + dot2(wv[c].y, xv.y) + dot2(wv[c].z, xv.z) + dot2(wv[c].w, xv.w);
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) y[row] = __float2bfloat16(acc);
}

// CPL: 16-byte chunks per lane per row (K = 256 * CPL). MODE 0 plain, 1 PDL
// with every load after the wait, 2 PDL with the first row's weight loads
// before it.
template <int CPL, int MODE>
__global__ void __launch_bounds__(256) gemv_rows(const uint4* __restrict__ w, const uint4* __restrict__ x,
                                                 __nv_bfloat16* __restrict__ y, int n, int rpw) {
  if (MODE != 0) asm volatile("griddepcontrol.launch_dependents;");
  const int lane = threadIdx.x & 31;
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int row0 = warp * rpw;
  uint4 wv[CPL];
  if (MODE == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (MODE == 2 && row0 < n) load_row<CPL>(wv, w, row0, lane);
  if (MODE == 2) asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int r = 0; r < rpw; ++r) {
    const int row = row0 + r;
    if (row >= n) break;
    if (!(MODE == 2 && r == 0)) load_row<CPL>(wv, w, row, lane);
    // Keeps ptxas from sinking each load to its use: without it the plain
    // and pdl modes compile to 36 registers, a load or two in flight a lane.
    __threadfence_block();
    row_out<CPL>(wv, x, y, row, lane);
  }
}

// The resident grid: `gridDim.x` CTAs (one or two an SM), warp g takes
// rows g, g + warps, g + 2 warps, ... With one CTA an SM, half of each SM's
// registers stay free, so the next call's CTAs can be resident while this
// call drains (with PDL).
// KIND 0: read-only loads (ld.global.nc) and membar.cta; 1: the DSL's mix
// (ld.global.v4 and fence.acq_rel.cta); 2: read-only loads, fence.acq_rel.cta.
template <int CPL, int MODE, int KIND = 0>
__global__ void __launch_bounds__(256) gemv_stride(const uint4* __restrict__ w, const uint4* __restrict__ x,
                                                   __nv_bfloat16* __restrict__ y, int n) {
  if (MODE != 0) asm volatile("griddepcontrol.launch_dependents;");
  const int lane = threadIdx.x & 31;
  const int step = (gridDim.x * blockDim.x) >> 5;
  const int row0 = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  uint4 wv[CPL];
  if (MODE == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (MODE == 2 && row0 < n) load_row<CPL, KIND>(wv, w, row0, lane);
  if (MODE == 2) asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int row = row0; row < n; row += step) {
    if (!(MODE == 2 && row == row0)) load_row<CPL, KIND>(wv, w, row, lane);
    order_loads<KIND>();
    row_out<CPL>(wv, x, y, row, lane);
  }
}

// gemv_stride with one row of look-ahead: each warp loads its next row
// before it reduces the current one, so its loads never stop; 128 threads a
// CTA keep the doubled registers under half an SM.
template <int CPL, int MODE>
__global__ void __launch_bounds__(128) gemv_stride_pipe(const uint4* __restrict__ w, const uint4* __restrict__ x,
                                                        __nv_bfloat16* __restrict__ y, int n) {
  if (MODE != 0) asm volatile("griddepcontrol.launch_dependents;");
  const int lane = threadIdx.x & 31;
  const int step = (gridDim.x * blockDim.x) >> 5;
  const int row0 = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  uint4 cur[CPL], nxt[CPL];
  if (MODE == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (row0 < n) load_row<CPL>(cur, w, row0, lane);
  if (MODE == 2) asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int row = row0; row < n; row += step) {
    if (row + step < n) load_row<CPL>(nxt, w, row + step, lane);
    __threadfence_block();
    row_out<CPL>(cur, x, y, row, lane);
#pragma unroll
    for (int c = 0; c < CPL; ++c) cur[c] = nxt[c];
  }
}

// The access pattern of r41's tensor-core GEMV (branch exp/gemv-mma), with
// CUDA-core math: a CTA takes a block of 16 rows, its 8 warps split K
// (warp p takes segments p, p + 8, ... of 4 steps of 32 elements), and lane
// (g, c) = (lane / 4, lane % 4) loads 16 bytes of rows g and g + 8 and of x
// at chunk 4 step + c: 64 bytes a row, 8 rows, per load instruction (an
// mma.sync fragment's layout), 8 weight and 4 token loads a lane in
// flight. The warps' sums meet in shared memory, the quad's by shuffles.
// `arg` CTAs, striding over the blocks; N a multiple of 16.
template <int MODE>
__global__ void __launch_bounds__(256) gemv_frag(const uint4* __restrict__ w, const uint4* __restrict__ x,
                                                 __nv_bfloat16* __restrict__ y, int n) {
  __shared__ float red[8][32][2];
  if (MODE != 0) asm volatile("griddepcontrol.launch_dependents;");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  if (MODE != 0) asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int blk = blockIdx.x; blk * 16 < n; blk += gridDim.x) {
    const uint4* w0 = w + (size_t)(blk * 16 + g) * 512;
    const uint4* w1 = w0 + 8 * 512;
    float a0 = 0.f, a1 = 0.f;
    for (int seg = warp; seg < 32; seg += 8) {
      uint4 v0[4], v1[4], xv[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int ch = (seg * 4 + j) * 4 + c;
        v0[j] = ldg_stream(w0 + ch);
        v1[j] = ldg_stream(w1 + ch);
        xv[j] = x[ch];
      }
      __threadfence_block();
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        a0 += dot2(v0[j].x, xv[j].x) + dot2(v0[j].y, xv[j].y) + dot2(v0[j].z, xv[j].z) + dot2(v0[j].w, xv[j].w);
        a1 += dot2(v1[j].x, xv[j].x) + dot2(v1[j].y, xv[j].y) + dot2(v1[j].z, xv[j].z) + dot2(v1[j].w, xv[j].w);
      }
    }
    red[warp][lane][0] = a0;
    red[warp][lane][1] = a1;
    __syncthreads();
    if (warp == 0) {
      a0 = red[0][lane][0];
      a1 = red[0][lane][1];
#pragma unroll
      for (int p = 1; p < 8; ++p) { a0 += red[p][lane][0]; a1 += red[p][lane][1]; }
      a0 += __shfl_xor_sync(0xffffffffu, a0, 1);
      a0 += __shfl_xor_sync(0xffffffffu, a0, 2);
      a1 += __shfl_xor_sync(0xffffffffu, a1, 1);
      a1 += __shfl_xor_sync(0xffffffffu, a1, 2);
      if (c == 0) {
        y[blk * 16 + g] = __float2bfloat16(a0);
        y[blk * 16 + g + 8] = __float2bfloat16(a1);
      }
    }
    __syncthreads();
  }
}

// A tensor-core GEMV that loads rows contiguously: gemv_frag's work split
// (a CTA a block of 16 rows, its 8 warps over K), but a warp's load
// instruction reads 4 rows x 128 bytes, 8 lanes a row, and the warp
// rearranges through shared memory: 16 rows x 128 elements a step into a
// private tile (16-byte chunks XOR-swizzled by row), then ldmatrix.x4 per
// 16 k gives mma.sync m16n8k16 its A fragment. B is the token, the same in
// all 8 columns (read as 32-bit pairs from L1); column 0 is stored. 8 weight
// loads a lane in flight, as one row a warp (g2) has.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <int MODE>
__global__ void __launch_bounds__(256) gemv_tc(const uint4* __restrict__ w, const uint4* __restrict__ x,
                                               __nv_bfloat16* __restrict__ y, int n) {
  __shared__ __align__(16) uint4 tile[8][16][16];
  __shared__ float red[8][32][2];
  if (MODE != 0) asm volatile("griddepcontrol.launch_dependents;");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const unsigned* xw = reinterpret_cast<const unsigned*>(x);
  if (MODE != 0) asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int blk = blockIdx.x; blk * 16 < n; blk += gridDim.x) {
    const uint4* wb = w + (size_t)blk * 16 * 512;
    float acc[2][4] = {};  // two sets (even and odd 16 k): the MMAs overlap in pairs
    for (int it = warp; it < 32; it += 8) {  // 128 k a step: 16 chunks of each row
      uint4 v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = (i & 3) * 4 + (lane >> 3), ch = (i >> 2) * 8 + (lane & 7);
        v[i] = ldg_stream(wb + (size_t)r * 512 + it * 16 + ch);
      }
      unsigned xb[8][2];
#pragma unroll
      for (int kb = 0; kb < 8; ++kb) {
        const int k = it * 128 + kb * 16 + 2 * c;
        xb[kb][0] = __ldg(xw + k / 2);
        xb[kb][1] = __ldg(xw + k / 2 + 4);
      }
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = (i & 3) * 4 + (lane >> 3), ch = (i >> 2) * 8 + (lane & 7);
        tile[warp][r][ch ^ (r & 7)] = v[i];
      }
      __syncwarp();
#pragma unroll
      for (int kb = 0; kb < 8; ++kb) {
        const int q = lane >> 3, r = ((q & 1) << 3) + (lane & 7), ch = 2 * kb + (q >> 1);
        unsigned a0, a1, a2, a3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(smem_u32(&tile[warp][r][ch ^ (r & 7)])));
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(acc[kb & 1][0]), "+f"(acc[kb & 1][1]), "+f"(acc[kb & 1][2]), "+f"(acc[kb & 1][3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(xb[kb][0]), "r"(xb[kb][1]));
      }
    }
    red[warp][lane][0] = acc[0][0] + acc[1][0];  // row g, column 2c
    red[warp][lane][1] = acc[0][2] + acc[1][2];  // row g + 8, column 2c
    __syncthreads();
    if (warp == 0) {
      float s0 = red[0][lane][0], s1 = red[0][lane][1];
#pragma unroll
      for (int p = 1; p < 8; ++p) { s0 += red[p][lane][0]; s1 += red[p][lane][1]; }
      if (c == 0) {
        y[blk * 16 + g] = __float2bfloat16(s0);
        y[blk * 16 + g + 8] = __float2bfloat16(s1);
      }
    }
    __syncthreads();
  }
}

// layout 0: gemv_rows, `arg` rows a warp; 1: gemv_stride on `arg` CTAs;
// 2: gemv_stride_pipe on `arg` CTAs; 3 and 4: gemv_stride with load/fence
// KIND 1 and 2; 5: gemv_frag on `arg` CTAs; 6: gemv_tc on `arg` CTAs.
template <int MODE>
static void launch(torch::Tensor w, torch::Tensor x, torch::Tensor y, int layout, int arg) {
  const int n = w.size(0);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(layout == 0 ? ((n + arg - 1) / arg + 7) / 8 : arg);
  cfg.blockDim = dim3(layout == 2 ? 128 : 256);
  cfg.stream = at::cuda::getCurrentCUDAStream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = MODE ? 1 : 0;
  auto wp = (const uint4*)w.data_ptr();
  auto xp = (const uint4*)x.data_ptr();
  auto yp = (__nv_bfloat16*)y.data_ptr();
  cudaError_t err;
  if (layout == 0) err = cudaLaunchKernelEx(&cfg, gemv_rows<16, MODE>, wp, xp, yp, n, arg);
  else if (layout == 1) err = cudaLaunchKernelEx(&cfg, gemv_stride<16, MODE>, wp, xp, yp, n);
  else if (layout == 3) err = cudaLaunchKernelEx(&cfg, gemv_stride<16, MODE, 1>, wp, xp, yp, n);
  else if (layout == 4) err = cudaLaunchKernelEx(&cfg, gemv_stride<16, MODE, 2>, wp, xp, yp, n);
  else if (layout == 5) err = cudaLaunchKernelEx(&cfg, gemv_frag<MODE>, wp, xp, yp, n);
  else if (layout == 6) err = cudaLaunchKernelEx(&cfg, gemv_tc<MODE>, wp, xp, yp, n);
  else err = cudaLaunchKernelEx(&cfg, gemv_stride_pipe<16, MODE>, wp, xp, yp, n);
  TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
}

void gemv(torch::Tensor w, torch::Tensor x, torch::Tensor y, int64_t mode, int64_t layout, int64_t arg) {
  TORCH_CHECK(w.is_cuda() && w.scalar_type() == at::kBFloat16 && w.is_contiguous() && w.size(1) == 4096,
              "w: contiguous bf16 CUDA, K = 4096");
  TORCH_CHECK(x.numel() == 4096 && x.is_contiguous() && y.numel() == w.size(0), "x, y sizes");
  TORCH_CHECK(layout >= 0 && layout <= 6 && arg > 0, "layout 0..6, arg > 0");
  if (mode == 0) launch<0>(w, x, y, (int)layout, (int)arg);
  else if (mode == 1) launch<1>(w, x, y, (int)layout, (int)arg);
  else launch<2>(w, x, y, (int)layout, (int)arg);
}

int64_t blocks_per_sm(int64_t layout) {
  int b = 0;
  if (layout == 0) cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, gemv_rows<16, 2>, 256, 0);
  else if (layout == 1) cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, gemv_stride<16, 2>, 256, 0);
  else cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, gemv_stride_pipe<16, 2>, 128, 0);
  return b;
}
"""

CPP_DECLS = """
#include <torch/extension.h>
void gemv(torch::Tensor w, torch::Tensor x, torch::Tensor y, int64_t mode, int64_t layout, int64_t arg);
int64_t blocks_per_sm(int64_t layout);
"""
MODES = {"plain": 0, "pdl": 1, "pdl-w": 2}


def build():
    return load_inline(
        name="gemv_floor_ext", cpp_sources=CPP_DECLS, cuda_sources=CUDA_SRC,
        functions=["gemv", "blocks_per_sm"], verbose=False,
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"])


def variant_choices(cache, labels: list[str]) -> list:
    """The cached bf16 nn.Linear options whose labels are ``labels`` (as the
    table writes them), to time as the dispatcher would launch them."""
    sms, cands = linear_candidates(cache, "bf16")
    by_label = {}
    for _, choice in select.ranked_choices(cands, 1, 4096, K, 1, sms):
        by_label.setdefault(choice.label(), choice)
    missing = [lab for lab in labels if lab not in by_label]
    if missing:
        raise SystemExit(f"gemv_floor: no cached option labelled {missing}; cached gemv options: "
                         f"{sorted(lab for lab in by_label if lab.startswith('gemv'))}")
    return [by_label[lab] for lab in labels]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--rpw", default="1,2", help="rows per warp to try (gemv_rows)")
    ap.add_argument("--per-sm", default="1,2",
                    help="CTAs an SM to try for the resident grids (gemv_stride, gemv_stride_pipe)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES), help="launch modes to time")
    ap.add_argument("--dsl-mix", action="store_true",
                    help="also time g2 with the loads and fence r39's DSL build compiled to")
    ap.add_argument("--frag", action="store_true",
                    help="also time gemv_frag (r41's tensor-core GEMV's loads on CUDA cores, g2 frag16) "
                         "and gemv_tc (a tensor-core GEMV loading rows contiguously, g2 tc16)")
    ap.add_argument("--variants", default="",
                    help="cached options to time beside the pick, by label (e.g. gemv1x1,gemv1x2)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    t0 = time.monotonic()
    ext = build()
    print(f"built the probe in {time.monotonic() - t0:.0f} s; blocks per SM "
          f"{[ext.blocks_per_sm(lay) for lay in range(3)]} (rows, stride, stride_pipe)", flush=True)
    cache = cutlass_aot.open_cache(args.cache_dir)
    bw = copy_tbps()
    print(f"device copy: {bw:.2f} TB/s", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (label, layout, argument): rows a warp, or the resident grid's CTAs
    layouts = [(f"r{r}", 0, int(r)) for r in args.rpw.split(",")]
    layouts += [(f"g{p}", 1, p * sms) for p in map(int, args.per_sm.split(","))]
    layouts += [(f"p{p}", 2, p * sms) for p in map(int, args.per_sm.split(","))]
    if args.dsl_mix:  # the resident grid of two CTAs an SM with the DSL build's loads and fence
        layouts += [("g2 ld.global+acq_rel", 3, 2 * sms), ("g2 ld.nc+acq_rel", 4, 2 * sms)]
    if args.frag:  # 16 rows a warp in mma fragment order, K over a CTA's 8 warps
        layouts += [("g2 frag16", 5, 2 * sms), ("g2 tc16", 6, 2 * sms)]
    modes = {m: MODES[m] for m in args.modes.split(",")}
    names = ["ours (pick)", "cuBLAS"] + [f"{m} {lab}" for m in modes for lab, _, _ in layouts]
    wanted = [v for v in args.variants.split(",") if v]
    choices = variant_choices(cache, wanted)
    names += [f"ours {v}" for v in wanted]
    l2 = l2_bytes()
    times: dict[str, list[float]] = {name: [] for name in names}
    sizes = []
    for n in NS:
        nbytes = n * K * 2
        sets = []
        for _ in range(copies_for(nbytes, l2)):
            w = torch.randn(n, K, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
            sets.append((w, x, torch.empty(1, n, device="cuda", dtype=torch.bfloat16)))
        w, x, y = sets[0]
        ref = (x.float() @ w.float().t())
        for mode in modes.values():
            for _, lay, arg in layouts:
                y.fill_(float("nan"))
                ext.gemv(w, x, y, mode, lay, arg)
                torch.cuda.synchronize()
                err = ((y.float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (n, mode, lay, arg, err)  # NaN fails too
        fns = [rotate(lambda w, x, y: cache.gemm(x, w.t(), out=y), sets),
               rotate(lambda w, x, y: torch.mm(x, w.t(), out=y), sets)]
        fns += [rotate(lambda w, x, y, m=m, lay=lay, arg=arg: ext.gemv(w, x, y, m, lay, arg), sets)
                for m in modes.values() for _, lay, arg in layouts]
        for choice in choices:
            launch = launch_choice(cache, choice, sms, 1, n, 1, k=K)
            y.fill_(float("nan"))
            launch(x, w.t(), y)
            torch.cuda.synchronize()
            err = ((y.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (n, choice.label(), err)  # NaN fails too
            fns.append(rotate(lambda w, x, y, f=launch: f(x, w.t(), y), sets))
        for f in fns:  # clocks up
            for g in f:
                g()
        res = interleaved(fns, rounds=args.rounds, graph=True)
        sizes.append(nbytes)
        for name, us in zip(names, res):
            times[name].append(us)
        print(f"N={n} ({nbytes / MIB:.0f} MiB): " + ", ".join(f"{a} {b:.2f}" for a, b in zip(names, res)),
              flush=True)
        del sets, fns
    text = header("Decode's fixed cost: a hand-written CUDA GEMV beside ours and cuBLAS")
    text += ("One token, bf16, K = 4096, W an nn.Linear weight (N x K). µs per call by CUDA graph "
             "replay of back-to-back calls, operand sets rotated call to call (cold L2), "
             f"{args.rounds} interleaved rounds, median. 'fixed µs' and 'TB/s' are the intercept "
             "and the inverse slope of a least-squares line through the weight bytes' times. "
             f"Device copy (torch.neg over 1 GiB, read + write): {bw:.2f} TB/s. 'r1/r2/r4' = rows "
             "per warp (gemv_rows); 'g1/g2' = the resident grid of one or two CTAs an SM (gemv_stride), 'p1/p2' the same with a row of look-ahead (gemv_stride_pipe). Modes: the module docstring. The 32 and 48 MiB columns give the fraction "
             "of the copy bandwidth bench_decode.py's HBM column would show.\n\n")
    cols = [n for n in NS]
    text += ("| kernel | fixed µs | TB/s | " + " | ".join(f"N={n} µs" for n in cols)
             + " | 32 MiB | 48 MiB |\n|---|" + "---|" * (len(cols) + 4) + "\n")
    for name in names:
        # intercept: µs a call; slope: µs per MB, so 1 / slope is TB/s
        s, a = statistics.linear_regression([b / 1e6 for b in sizes], times[name])
        fr = {}
        for n, us in zip(NS, times[name]):
            fr[n] = problem_bytes(1, n, K) / us / 1e6 / bw
        text += (f"| {name} | {a:.2f} | {1 / s:.2f} | " + " | ".join(f"{t:.2f}" for t in times[name])
                 + f" | {fr[4096]:.0%} | {fr[6144]:.0%} |\n")
    print(text)
    path = write("gemv_floor.md", text, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
