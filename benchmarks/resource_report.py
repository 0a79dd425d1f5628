"""Compiler resource report (registers, shared memory, spills) for sm90_gemm variants.

Runs on the build machine (no GPU): compiles each variant with the CuTe DSL
told to keep its PTX (CUTE_DSL_KEEP=ptx), then runs `ptxas -arch=sm_90a -v`
on it and records ptxas's report per kernel. Writes
benchmarks/results/<date>_resource_report.md (or --out).
"""

from __future__ import annotations

import argparse
import tempfile

from _common import header, keep_ptx, ptxas_resources, write

VARIANTS = [
    {"tile": t, "cluster": c} for t in ("128x256", "256x128", "128x192", "128x160", "128x144",
                                        "128x128", "64x128")
    for c in ("1x1", "2x1")
] + [
    {"tile": t, "cluster": "1x1", "swap_ab": True}
    for t in ("128x16", "128x64", "128x144", "128x160", "128x192", "128x256")
] + [
    # Split-K variants compile two kernels: the GEMM, then the reduce pass.
    {"tile": "128x256", "cluster": c, "split_k": True} for c in ("1x1", "2x1")
] + [{"tile": t, "cluster": "1x1", "swap_ab": True, "split_k": True}
      for t in ("128x16", "128x160")
] + [
    # The 256-row narrow tiles (two warpgroups of 128 rows, 144-192
    # accumulators a thread), plain and swapped, with and without split-K.
    {"tile": t, "cluster": "1x1", "swap_ab": swap, "split_k": sk, "swizzle": 8}
    for t in ("256x144", "256x160", "256x192") for swap in (False, True) for sk in (False, True)
] + [{"tile": "256x128", "cluster": "1x1", "swap_ab": True, "split_k": sk, "swizzle": 8}
     for sk in (False, True)
] + [
    # The 192-row tiles (three consumer warpgroups of 64 rows, 512 threads:
    # 128 registers a thread at entry, and per instruction).
    {"tile": t, "cluster": c, "split_k": sk}
    for t in ("192x128", "192x160", "192x192") for c in ("1x1", "1x2") for sk in (False, True)
    if not (sk and c != "1x1")
] + [
    # The 256-row tiles in 2-CTA clusters (r22), as configs/sm90.yaml ships them.
    {"tile": t, "cluster": c, "swap_ab": swap}
    for t in ("256x144", "256x160", "256x192") for c in ("1x2", "2x1") for swap in (False, True)
    if c == "1x2" or (t != "256x192" and not swap)
] + [
    # Bias epilogues (r22: the bias read into registers before each tile's
    # mainloop), with and without GELU.
    {"tile": t, "cluster": "2x1", "bias": "bf16", "act": act}
    for t in ("128x256", "128x192", "128x128") for act in ("none", "gelu")
] + [{"tile": "128x128", "cluster": "2x1", "bias": "bf16", "act": "gelu", "pingpong": True},
     {"tile": "128x32", "cluster": "1x1", "bias": "bf16", "act": "gelu", "swap_ab": True, "split_k": True},
]


def _extras(v: dict) -> str:
    swizzle = [f"swizzle {v['swizzle']}"] if "swizzle" in v else []
    epilogue = [f"bias {v['bias']}" + (f" {v['act']}" if v.get("act", "none") != "none" else "")
                ] if v.get("bias") else []
    return "+".join([k for k in ("swap_ab", "split_k", "pingpong") if v.get(k)] + swizzle
                    + epilogue) or "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dump = tempfile.mkdtemp(prefix="cutlass-aot-ptx-")
    keep_ptx(dump)
    from cutlass_aot.kernels.sm90 import Sm90GemmFamily  # noqa: PLC0415 - after the env is set

    fam = Sm90GemmFamily()
    rows = []
    for v in VARIANTS:
        params = dict(fam.defaults) | {"a": "bf16"} | v
        fam.compile(params, "sm_90a", "--enable-tvm-ffi --gpu-arch sm_90a")
        for r in ptxas_resources(dump, "sm_90a"):
            rows.append(f"| {v['tile']} | {v['cluster']} | {_extras(v)} | {','.join(r['registers'])} "
                        f"| {','.join(r['smem']) or '0 (dynamic)'} | {','.join(r['stack'])} "
                        f"| {'; '.join(f'{a}/{b}' for a, b in r['spills'])} |")
            print(rows[-1], flush=True)
    text = header("ptxas resource report, sm90_gemm (bf16, A k-major, B k-major, D row-major)")
    text += ("`ptxas -arch=sm_90a -v` on the PTX the CuTe DSL emits for each variant. Registers are per "
             "thread at kernel entry (setmaxnreg then moves them between producer and consumer "
             "warpgroups); shared memory is dynamic (A/B ring + epilogue staging), so static smem is 0.\n\n")
    text += ("Several values in a cell are several kernels in one artifact (split-K: the GEMM, "
             "then the reduce pass).\n\n")
    text += ("| tile | cluster | schedule | registers | static smem bytes | stack frame bytes "
             "| spill stores/loads bytes |\n")
    text += "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    print(text)
    print("wrote", write("resource_report.md", text, args.out))


if __name__ == "__main__":
    main()
