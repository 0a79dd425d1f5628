"""How fast the H200 runs the fused GELU's tanh: the MUFU question r44 left open (GPU).

r44 moved the GELU epilogue's tanh from ``tanh.approx.f32`` (one value an
instruction) to ``tanh.approx.f16x2`` (two values an instruction) and measured
no change in the fused GEMMs (1.002x over 26 pairs). Either the packed form
issues as two MUFU operations on sm_90, or the epilogue is not bound by the
MUFU pipe. This script settles which, apart from any GEMM:

* it compiles (nvcc, through torch's cpp_extension) one kernel per mode, each
  a loop of independent chains (8 a thread) of one operation, on a grid of
  ``--blocks-per-sm`` 256-thread CTAs an SM;
* it times each with the SM's own cycle counter (``clock64`` around the loop,
  in every CTA) and reports values an SM finishes a clock: a CTA's values
  times the CTAs an SM holds, over the CTA's mean cycles;
* it counts the ``MUFU`` instructions in each kernel's SASS (``cuobjdump``,
  where the toolkit has it), so an f16x2 op that is two MUFU ops shows.

Modes: ``tanh.f32``, ``tanh.f16x2``, ``tanh.bf16x2``, ``ex2.f32`` (a second
MUFU function, for scale: the chain is x -> -2^x, which stays bounded), and ``gelu.f32``: the epilogue's GELU body as
views.py writes it (u = v (c0 + c1 v^2), h = v / 2, h tanh(u) + h), chained
through its output, so its rate includes its FMAs.

The fused epilogue applied GELU at about 9.6 values a clock an SM (r44,
from the GEMMs' time over their plain twins): a mode well above that rate
cannot be what bounds it.

r45 answered the first half without a GPU (benchmarks/sass_ops.py probe):
on sm_90a ``tanh.approx.f16x2`` and ``.bf16x2`` are assembled as one
``MUFU.TANH.F16`` / ``.BF16`` a value, so the packed form issues as many
MUFU operations as the f32 one. This script's first run on the H200 stopped
at ``ex2.f32``, whose chain (then x -> 2^x) overflowed; the bounded chain
has not run on a GPU yet, so the rates are still unmeasured.

    python3 benchmarks/mufu_probe.py [--iters 4096] [--blocks-per-sm 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess

import sass_ops
import torch
from _common import header, write
from torch.utils.cpp_extension import _get_build_directory, load_inline

# The kernels alone (benchmarks/sass_ops.py compiles them with nvcc for their
# SASS on a machine without a GPU); CUDA_SRC adds the torch entry point.
KERNELS = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

template <int MODE>
__global__ void __launch_bounds__(256) probe(float* sink, long long* cycles, int iters, float seed) {
  float f[8];
  uint32_t r[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    f[j] = seed * (0.001f * (threadIdx.x + 1) + 0.01f * j);
    __half2 h2 = __floats2half2_rn(f[j], -f[j]);
    r[j] = *reinterpret_cast<uint32_t*>(&h2);
  }
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (MODE == 0) {
        asm volatile("tanh.approx.f32 %0, %0;" : "+f"(f[j]));
      } else if constexpr (MODE == 1) {
        asm volatile("tanh.approx.f16x2 %0, %0;" : "+r"(r[j]));
      } else if constexpr (MODE == 2) {
        asm volatile("tanh.approx.bf16x2 %0, %0;" : "+r"(r[j]));
      } else if constexpr (MODE == 3) {
        // -2^x stays in (-1, 0) along the chain (2^x alone overflows); the
        // negation folds into the next MUFU's operand
        asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(f[j]));
        f[j] = -f[j];
      } else {
        float v = f[j];
        float u = v * fmaf(0.0356774081f, v * v, 0.7978845608f);
        float t;
        asm volatile("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
        float h = 0.5f * v;
        f[j] = fmaf(h, t, h);
      }
    }
  }
  long long t1 = clock64();
  __syncthreads();
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) acc += f[j] + 1e-9f * static_cast<float>(r[j] & 0xffffu);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
"""

CUDA_SRC = "#include <torch/extension.h>\n" + KERNELS + r"""
void run(torch::Tensor sink, torch::Tensor cycles, int64_t mode, int64_t iters, double seed) {
  int blocks = cycles.numel();
  float* s = sink.data_ptr<float>();
  long long* c = reinterpret_cast<long long*>(cycles.data_ptr<int64_t>());
  switch (mode) {
    case 0: probe<0><<<blocks, 256>>>(s, c, iters, seed); break;
    case 1: probe<1><<<blocks, 256>>>(s, c, iters, seed); break;
    case 2: probe<2><<<blocks, 256>>>(s, c, iters, seed); break;
    case 3: probe<3><<<blocks, 256>>>(s, c, iters, seed); break;
    default: probe<4><<<blocks, 256>>>(s, c, iters, seed); break;
  }
}
"""

CPP_DECLS = "void run(torch::Tensor sink, torch::Tensor cycles, int64_t mode, int64_t iters, double seed);"
# mode name -> (template index, values an instruction, SASS kernel-name fragment)
MODES = {
    "tanh.f32": (0, 1, "Li0E"),
    "tanh.f16x2": (1, 2, "Li1E"),
    "tanh.bf16x2": (2, 2, "Li2E"),
    "ex2.f32": (3, 1, "Li3E"),
    "gelu.f32": (4, 1, "Li4E"),
}
NAME = "mufu_probe_ext"


def build():
    return load_inline(name=NAME, cpp_sources=CPP_DECLS, cuda_sources=CUDA_SRC, functions=["run"],
                       verbose=False, extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"])


def sass_counts() -> dict[str, dict[str, int]] | str:
    """Per mode, the MUFU.* opcodes in its kernel's SASS; or why there are none."""
    try:
        cuobjdump = sass_ops.tool("cuobjdump", None)
    except SystemExit as exc:
        return str(exc)
    libs = glob.glob(os.path.join(_get_build_directory(NAME, verbose=False), "*.so"))
    if not libs:
        return "extension library not found"
    res = subprocess.run([cuobjdump, "-sass", libs[0]], capture_output=True, text=True)
    if res.returncode != 0:
        return f"cuobjdump failed: {res.stderr.strip()[:200]}"
    counts: dict[str, dict[str, int]] = {}
    for func, ops in sass_ops.opcodes(res.stdout).items():
        name = next((n for n, (_, _, frag) in MODES.items() if frag in func), None)
        if name is not None:
            counts[name] = {op: v for op, v in ops.items() if op.startswith("MUFU")}
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=4096)
    ap.add_argument("--blocks-per-sm", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ext = build()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = sms * args.blocks_per_sm
    sink = torch.empty(blocks * 256, device="cuda")
    cycles = torch.empty(blocks, dtype=torch.int64, device="cuda")
    rates: dict[str, list[float]] = {name: [] for name in MODES}
    for _ in range(args.rounds):
        for name, (mode, per_op, _) in MODES.items():
            ext.run(sink, cycles, mode, args.iters, 0.5)
            torch.cuda.synchronize()
            if not torch.isfinite(sink).all():
                raise SystemExit(f"mufu_probe: {name} produced a non-finite value")
            mean_cycles = cycles.double().mean().item()
            values = 256 * 8 * args.iters * per_op * args.blocks_per_sm
            rates[name].append(values / mean_cycles)
    sass = sass_counts()
    lines = [header("MUFU throughput on sm_90: f32 against packed tanh, and the GELU body"),
             f"{blocks} CTAs of 256 threads ({args.blocks_per_sm} an SM), 8 independent chains a "
             f"thread, {args.iters} iterations, {args.rounds} rounds (median). Values a clock an SM "
             "= a CTA's values x CTAs an SM / the CTAs' mean clock64 cycles over the loop. "
             "SASS: MUFU opcodes in each mode's kernel (the loop is unrolled 8 chains wide).\n",
             "| mode | values an instruction (PTX) | values / clk / SM | vs tanh.f32 | SASS MUFU ops |",
             "|---|---|---|---|---|"]
    base = sorted(rates["tanh.f32"])[len(rates["tanh.f32"]) // 2]
    for name, (_, per_op, _) in MODES.items():
        med = sorted(rates[name])[len(rates[name]) // 2]
        ops = sass.get(name, {}) if isinstance(sass, dict) else sass
        ops_text = ops if isinstance(ops, str) else (", ".join(f"{k} x{v}" for k, v in sorted(ops.items())) or "none")
        lines.append(f"| {name} | {per_op} | {med:.2f} | {med / base:.2f} | {ops_text} |")
    text = "\n".join(lines) + "\n"
    print(text)
    path = write("mufu_probe.md", text, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
