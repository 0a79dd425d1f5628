"""Compiler resource report (registers, shared memory, spills) for sm90_gemm variants.

Runs on the build machine (no GPU): compiles each variant with the CuTe DSL
told to keep its PTX (CUTE_DSL_KEEP=ptx), then runs `ptxas -arch=sm_90a -v`
on it and records ptxas's report per kernel. Writes
benchmarks/results/<date>_resource_report.md (or --out).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import tempfile

from _common import header, write

VARIANTS = [
    {"tile": t, "cluster": c} for t in ("128x256", "256x128", "128x192", "128x128", "64x128")
    for c in ("1x1", "2x1")
] + [
    {"tile": t, "cluster": "1x1", "swap_ab": True} for t in ("128x16", "128x64", "128x192", "128x256")
] + [
    # Split-K variants compile two kernels: the GEMM, then the reduce pass.
    {"tile": "128x256", "cluster": c, "split_k": True} for c in ("1x1", "2x1")
] + [{"tile": "128x16", "cluster": "1x1", "swap_ab": True, "split_k": True}]


def _extras(v: dict) -> str:
    return "+".join(k for k in ("swap_ab", "split_k") if v.get(k)) or "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dump = tempfile.mkdtemp(prefix="cutlass-aot-ptx-")
    os.environ["CUTE_DSL_KEEP"] = "ptx"
    os.environ["CUTE_DSL_DUMP_DIR"] = dump
    from cutlass_aot.kernels.sm90 import Sm90GemmFamily  # noqa: PLC0415 - after the env is set

    fam = Sm90GemmFamily()
    rows = []
    for v in VARIANTS:
        params = dict(fam.defaults) | {"a": "bf16"} | v
        fam.compile(params, "sm_90a", "--enable-tvm-ffi --gpu-arch sm_90a")
        # Every variant's PTX has the same file name: read, then remove it.
        for ptx in sorted(glob.glob(os.path.join(dump, "**", "*.ptx"), recursive=True)):
            res = subprocess.run(["ptxas", "-arch=sm_90a", "-v", "-o", os.devnull, ptx],
                                 capture_output=True, text=True)
            text = res.stderr
            regs = re.findall(r"Used (\d+) registers", text)
            spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
            stack = re.findall(r"(\d+) bytes stack frame", text)
            smem = re.findall(r"(\d+) bytes smem", text)
            rows.append(f"| {v['tile']} | {v['cluster']} | {_extras(v)} | {','.join(regs)} | {','.join(smem) or '0 (dynamic)'} "
                        f"| {','.join(stack)} | {'; '.join(f'{a}/{b}' for a, b in spills)} |")
            print(rows[-1], flush=True)
            os.unlink(ptx)
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
