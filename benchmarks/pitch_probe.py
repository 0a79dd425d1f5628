"""Does a row pitch that is not a 32-byte multiple cost the cached kernels? (GPU)

On the random samples the cached kernels trail cuBLAS most where N is a
multiple of 8 but not 16 (the random samples' N and K are multiples of 8):
there D's rows start 16 bytes off a 32-byte sector on every other row, and
where K is too, so are A's and B's. The same shapes also have ragged last
tiles, so the samples alone cannot say which costs. This probe times the
same problem with the same values under four layouts of the same logical
tensors: contiguous, D's pitch padded to 64 elements (128 bytes), A's,
B's, both, and all three. A pitch that costs shows as a gap
between the contiguous and padded rows at equal tiles; a ragged tile
shows as none. cuBLAS (torch.mm into a contiguous D) is timed on the
contiguous and the padded A and B, interleaved in the same rounds.

Our time per layout is the fastest of the model's first ``--top`` options
(launch_choice, as dispatch launches them). CUDA graph replay, cold L2
(operand sets rotated call to call, tune.timing's rules).
"""

from __future__ import annotations

import argparse
import time

from _common import gmean, header, linear_candidates, write
from option_retime import shapes_arg

from cutlass_aot.run import select

LAYOUTS = ("contiguous", "D padded", "A padded", "B padded", "A, B padded", "all padded")


def padded(rows: int, cols: int, pad: bool, dtype, device):
    """A (rows, cols) row-major tensor whose pitch is cols rounded up to 64 when ``pad``."""
    import torch  # noqa: PLC0415

    pitch = -(-cols // 64) * 64 if pad else cols
    return torch.empty((rows, pitch), device=device, dtype=dtype)[:, :cols]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=shapes_arg, default="8192x8200x8192,8192x8192x8192,4096x4104x4096,4096x4096x4104,"
                                        "814x8248x1224,5328x808x1704,4180x1160x6536,1150x8120x6024")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep-us", type=float, default=300.0,
                    help="length of one timed repetition (each times at least one pass over "
                         "the operand sets); r18's 8192-class shapes read 7-12%% apart between "
                         "identical layouts at 300 µs, cause not known")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shapes = args.shapes
    if args.top < 1 or args.rounds < 1:
        ap.error("--top and --rounds must be at least 1")

    import torch  # noqa: PLC0415 - GPU part only

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run.dispatch import launch_choice  # noqa: PLC0415
    from cutlass_aot.tune.timing import TORCH_DTYPES, copies_for, interleaved, l2_bytes, rotate  # noqa: PLC0415

    dt = TORCH_DTYPES[args.dtype]
    cache = cutlass_aot.open_cache()
    sms, cands = linear_candidates(cache, args.dtype)
    text = header(f"Row pitch probe ({args.dtype}): contiguous against 128-byte padded pitches")
    text += (__doc__.split("\n\n")[1].replace("\n", " ") + "\n\n"
             f"Ours: fastest of the model's first {args.top} options per layout; µs, median of "
             f"{args.rounds} interleaved rounds of 3 repetitions of ~{args.rep_us:.0f} µs.\n\n"
             "| shape | N%16 | K%16 | ours contiguous | D padded | A padded | B padded | A, B padded | "
             "all padded | cuBLAS contiguous | cuBLAS A, B padded | cuBLAS / ours (contiguous) | "
             "cuBLAS / ours (all padded) | options |\n|" + "---|" * 14 + "\n")
    start = time.monotonic()
    gains = []
    for m, n, k in shapes:
        opts = [ch for _, ch in select.ranked_choices(cands, m, n, k, 1, sms)[:args.top]]
        nbytes = (m * k + k * n + m * n) * dt.itemsize
        count = copies_for(nbytes, l2_bytes(0))
        sets = {lay: [] for lay in LAYOUTS}
        for _ in range(count):
            a0 = torch.randn(m, k, device="cuda", dtype=dt)
            w0 = torch.randn(n, k, device="cuda", dtype=dt)
            for lay in LAYOUTS:
                pad_a = lay in ("A padded", "A, B padded", "all padded")
                pad_b = lay in ("B padded", "A, B padded", "all padded")
                pad_d = lay in ("D padded", "all padded")
                a = padded(m, k, pad_a, dt, "cuda")
                a.copy_(a0)
                w = padded(n, k, pad_b, dt, "cuda")
                w.copy_(w0)
                sets[lay].append((a, w.t(), padded(m, n, pad_d, dt, "cuda")))
        fns, tags = [], []
        for lay in LAYOUTS:
            for ch in opts:
                fns.append(rotate(launch_choice(cache, ch, sms, m, n, 1, k=k), sets[lay]))
                tags.append(("ours", lay))
        for lay in ("contiguous", "A, B padded"):
            fns.append(rotate(lambda a, b, out: torch.mm(a, b, out=out), sets[lay]))
            tags.append(("cublas", lay))
        times = interleaved(fns, rounds=args.rounds, rep_us=args.rep_us, graph=True)
        ours = {lay: min(t for t, tag in zip(times, tags) if tag == ("ours", lay)) for lay in LAYOUTS}
        cub = {lay: t for t, (who, lay) in zip(times, tags) if who == "cublas"}
        # Same values in every layout: the padded results must match the contiguous one.
        first = launch_choice(cache, opts[0], sms, m, n, 1, k=k)
        ref = sets["contiguous"][0]
        first(*ref)
        for lay in LAYOUTS[1:]:
            got = sets[lay][0]
            first(*got)
            if not torch.equal(got[2], ref[2]):
                raise SystemExit(f"{m}x{n}x{k}: {lay} gave other bits than contiguous")
        gains.append(ours["contiguous"] / ours["all padded"])
        text += (f"| {m}x{n}x{k} | {n % 16} | {k % 16} | " + " | ".join(f"{ours[lay]:.1f}" for lay in LAYOUTS)
                 + f" | {cub['contiguous']:.1f} | {cub['A, B padded']:.1f} | "
                 f"{cub['contiguous'] / ours['contiguous']:.3f} | {cub['A, B padded'] / ours['all padded']:.3f} | "
                 + ", ".join(ch.label() for ch in opts) + " |\n")
        print(text.splitlines()[-1], flush=True)
        sets = fns = None
        torch.cuda.empty_cache()
    text += (f"\nOurs, contiguous / all padded: geomean {gmean(gains):.3f} over {len(gains)} shapes. "
             f"Wall time {time.monotonic() - start:.0f} s.\n")
    write("pitch_probe", text, args.out)


if __name__ == "__main__":
    main()
