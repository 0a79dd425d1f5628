"""Warm against cold L2, in one process: what the harness's L2 policy changes.

For a few decode and small problems (nn.Linear layout, bf16), times cuBLAS
(torch.mm) and the dispatcher's pick twice each, interleaved under CUDA
graph replay (tune.timing): with one operand set (warm: the operands stay in
L2 between calls) and with ``copies_for`` sets rotated call to call (cold:
each call reads its operands from HBM, the policy tune and the selection
benchmarks use). It reports both times, cold / warm, and the bytes per
second each cold call moves (A, B and D once) against a device copy
measured in the same run. A cold figure that reads above the copy's
bandwidth would mean the rotation failed to evict.
"""

from __future__ import annotations

import argparse
import os

import torch
from _common import header, write
from bench_decode import copy_tbps

import cutlass_aot
from cutlass_aot.tune.timing import cold_operands, interleaved, l2_bytes, rotate

SHAPES = ((1, 4096, 4096), (8, 4096, 4096), (16, 2048, 2784), (7, 2600, 2512), (1, 4096, 14336),
          (1, 8192, 8192), (128, 4096, 4096), (1024, 4096, 4096))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cache = cutlass_aot.open_cache(args.cache_dir)
    bw = copy_tbps()
    l2 = l2_bytes()
    print(f"device copy: {bw:.2f} TB/s; L2 {l2 / 2**20:.0f} MiB", flush=True)
    lines = []
    layout = ("bf16", "bf16", "bf16", "k", "k", "n", 2)
    for m, n, k in SHAPES:
        sets = cold_operands(layout, m, n, k, 1)
        one = sets[:1]
        mm = lambda a, b, out: torch.mm(a, b, out=out)  # noqa: E731
        pick = cache.gemm.runner.choice_for(*sets[0])
        t = interleaved([rotate(mm, one), rotate(mm, sets), rotate(cache.gemm, one),
                         rotate(cache.gemm, sets)], graph=True)
        nbytes = (m * k + n * k + m * n) * 2
        cold_tbps = [nbytes / t[1] / 1e6, nbytes / t[3] / 1e6]
        lines.append(f"| {m}x{n}x{k} | {nbytes / 1e6:.1f} | {len(sets)} | {t[0]:.1f} | {t[1]:.1f} | "
                     f"{t[1] / t[0]:.2f} | {t[2]:.1f} | {t[3]:.1f} | {t[3] / t[2]:.2f} | "
                     f"{cold_tbps[0]:.2f} / {cold_tbps[1]:.2f} | {pick.label()} ({pick.source}) |")
        print(lines[-1], flush=True)
        del sets, one
    text = header("Warm against cold L2 (the timing harness's L2 policy)")
    text += (f"Device copy bandwidth, same run: {bw:.2f} TB/s (read + write). L2: {l2 / 2**20:.0f} "
             "MiB. Warm = one operand set, called back to back; cold = operand sets rotated call "
             "to call so the others move two L2-fulls between uses of one (`tune.timing.copies_for`). CUDA "
             "graph replay, the four timed interleaved (3 rounds). Cold TB/s = (A + B + D bytes) / "
             "cold time: HBM traffic, to compare with the copy's.\n\n"
             "| MxNxK (bf16) | operand MB | sets | cuBLAS warm µs | cuBLAS cold µs | cold/warm | "
             "pick warm µs | pick cold µs | cold/warm | cold TB/s (cuBLAS / pick) | pick |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|\n")
    text += "\n".join(lines) + "\n"
    path = write("l2_check.md", text, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
