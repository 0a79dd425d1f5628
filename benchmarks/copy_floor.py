"""What one kernel call moving a decode weight's bytes costs, without any GEMM (GPU).

bench_decode.py rates a decode GEMM against the device copy bandwidth, which
it measures on a 1 GiB buffer: a call that long hides its start (launch,
the first loads' latency, the ramp to full bandwidth) and its end (the last
loads draining, the grid's completion). A decode weight of 32-48 MiB moves
in 8-12 µs, where those costs are not hidden. This script measures them for
plain torch kernels at the decode grid's byte counts, timed as the decode
grid times a GEMM (CUDA graph replay of back-to-back calls, cold L2: buffer
sets rotated call to call, tune.timing's rules):

* ``copy``: ``torch.neg`` from one buffer into another, reading half the
  bytes and writing half (bench_decode.py's copy kernel, moving as many
  bytes as the weight);
* ``read``: ``torch.sum`` of a buffer of the weight's bytes into one element
  (what a decode GEMM mostly does).

Each row gives the µs per call and the bandwidth it reaches, and that
bandwidth as a fraction of the large copy's: the fraction a GEMM moving the
same bytes could at best show in bench_decode.py's HBM column if it were a
copy or a reduction.
"""

from __future__ import annotations

import argparse

import torch
from _common import header, write

from cutlass_aot.tune.timing import copies_for, l2_bytes, time_us

MIB = 1 << 20
# Bytes a decode weight moves (bench_decode.py's (N, K) pairs, 2-byte
# elements), and the 2 GiB bench_decode.py's copy moves.
SIZES = {
    "4096x4096": 4096 * 4096 * 2,
    "6144x4096": 6144 * 4096 * 2,
    "4096x14336": 4096 * 14336 * 2,
    "8192x8192": 8192 * 8192 * 2,
    "28672x4096": 28672 * 4096 * 2,
    "2 GiB (the reference)": 2 << 30,
}


def timed(kind: str, nbytes: int, l2: int) -> float:
    """µs per call of ``kind`` moving ``nbytes`` (read, or read + written), cold L2."""
    n = nbytes // (8 if kind == "copy" else 4)
    sets = copies_for(nbytes, l2)
    if kind == "copy":
        bufs = [(torch.randn(n, device="cuda"), torch.empty(n, device="cuda")) for _ in range(sets)]
        fns = [lambda x=x, y=y: torch.neg(x, out=y) for x, y in bufs]
    else:
        out = torch.empty((), device="cuda")
        bufs = [torch.randn(n, device="cuda") for _ in range(sets)]
        fns = [lambda x=x: torch.sum(x, dim=0, out=out) for x in bufs]
    for _ in range(20):  # clocks up
        fns[0]()
    return time_us(fns, reps=7, rep_us=3000, graph=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    l2 = l2_bytes()
    rows = []
    for name, nbytes in SIZES.items():
        for kind in ("copy", "read"):
            us = timed(kind, nbytes, l2)
            rows.append((name, kind, nbytes, us, nbytes / us / 1e6))
            print(f"{name} {kind}: {us:.2f} us, {rows[-1][-1]:.2f} TB/s", flush=True)
    big = {kind: tbps for name, kind, *_, tbps in rows if name.startswith("2 GiB")}
    text = header("One kernel call moving a decode weight's bytes: copy and read floors")
    text += ("torch.neg (copy: bytes read + written) and torch.sum (read) over one buffer per "
             "call, CUDA graph replay of back-to-back calls, cold L2 (buffer sets rotated). "
             "Each call moves the bytes named (a copy reads half and writes half). 'of the large "
             "copy' = this call's TB/s / the 2 GiB copy's (bench_decode.py's reference); 'of the "
             "large read' likewise for reads.\n\n")
    text += ("| buffer | kind | MiB moved | µs per call | TB/s | of the large copy | of the large read |\n"
             "|---|---|---|---|---|---|---|\n")
    for name, kind, moved, us, tbps in rows:
        text += (f"| {name} | {kind} | {moved / MIB:.0f} | {us:.2f} | {tbps:.2f} | "
                 f"{tbps / big['copy']:.0%} | {tbps / big['read']:.0%} |\n")
    path = write("copy_floor.md", text, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
