"""What a row pitch off a 128-byte line costs, in hardware counters (GPU, under Nsight Compute)

pitch_probe.py times the same values under contiguous and padded row
pitches and finds a misaligned pitch (K % 16 == 8 in bf16) costs our kernels
3-18% and cuBLAS 3-5%, with A padded alone or B padded alone winning back
most of it (r19). This script launches each (kernel, layout) once inside its
own profiled range so that ``ncu`` can count what the layouts change: L2
sectors and requests, DRAM bytes, the kernel's duration. Ours is the
model's first option without split-K or stream-K (one kernel per call);
cuBLAS is torch.mm on the same tensors.

Two modes:
- ``run`` (under ncu): ``ncu --profile-from-start off --clock-control none
  --nvtx --print-nvtx-rename kernel --csv --page raw --metrics ...
  python3 pitch_ncu.py run`` (build_scripts/gpu_suite.sh step ``pitchncu``
  writes the command). Every range is an NVTX range named ``who|layout|shape``.
- ``report CSV``: reads ncu's CSV and prints one table per shape (no GPU).

``--clock-control none`` leaves the GPU's clocks as they are (ncu would lock
them to base otherwise); durations are then as noisy as any single launch,
so read the counters, not the times.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys

from _common import header, write

LAYOUTS = ("contiguous", "A padded", "B padded", "A, B padded")
DEFAULT_SHAPES = "5328x808x1704,1150x8120x6024,4180x1160x6536,4096x4096x4104"
METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "lts__t_sectors_op_read.sum",
    "lts__t_requests_op_read.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "lts__t_sector_op_read_hit_rate.pct",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
)


def run(args) -> None:
    import torch  # noqa: PLC0415 - GPU part only
    from _common import linear_candidates  # noqa: PLC0415
    from pitch_probe import padded  # noqa: PLC0415

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run import select  # noqa: PLC0415
    from cutlass_aot.run.dispatch import launch_choice  # noqa: PLC0415

    dt = torch.bfloat16
    cache = cutlass_aot.open_cache()
    sms, cands = linear_candidates(cache, "bf16")
    for m, n, k in args.shapes:
        ranked = select.ranked_choices(cands, m, n, k, 1, sms)
        ch = next(c for _, c in ranked if not c.candidate.split_k)
        fn = launch_choice(cache, ch, sms, m, n, 1, k=k)
        a0 = torch.randn(m, k, device="cuda", dtype=dt)
        w0 = torch.randn(n, k, device="cuda", dtype=dt)
        for lay in LAYOUTS:
            a = padded(m, k, lay in ("A padded", "A, B padded"), dt, "cuda")
            a.copy_(a0)
            w = padded(n, k, lay in ("B padded", "A, B padded"), dt, "cuda")
            w.copy_(w0)
            out = torch.empty(m, n, device="cuda", dtype=dt)
            for who, call in ((f"ours {ch.label()}", fn),
                              ("cuBLAS", lambda a, b, o: torch.mm(a, b, out=o))):
                profile_once(f"{who}|{lay}|{m}x{n}x{k}", call, a, w.t(), out)
        print(f"{m}x{n}x{k}: profiled {ch.label()} and cuBLAS under {len(LAYOUTS)} layouts", flush=True)


def profile_once(name: str, call, *args) -> None:
    """``call(*args)`` once to warm up, then once inside the profiled NVTX
    range ``name`` (ncu ``--profile-from-start off --nvtx`` counts only that)."""
    import torch  # noqa: PLC0415 - GPU part only

    call(*args)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    torch.cuda.nvtx.range_push(name)
    call(*args)
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def ncu_main(description: str, run_fn, report_fn, add_run_args) -> None:
    """The CLI of a script run under ncu: ``run`` (profiled launches; its
    arguments from ``add_run_args``), ``report CSV [--out]`` and ``metrics``."""
    ap = argparse.ArgumentParser(description=description)
    sub = ap.add_subparsers(dest="mode", required=True)
    add_run_args(sub.add_parser("run", help="launch the profiled ranges (run it under ncu)"))
    p = sub.add_parser("report", help="tables from ncu's CSV (no GPU)")
    p.add_argument("csv")
    p.add_argument("--out", default=None)
    sub.add_parser("metrics", help="print the --metrics list for ncu")
    args = ap.parse_args()
    if args.mode == "run":
        run_fn(args)
    elif args.mode == "report":
        report_fn(args.csv, args.out)
    else:
        sys.stdout.write(",".join(METRICS) + "\n")


def metric(row: dict, key: str) -> float | None:
    """A counter of an ncu CSV row as a number (None when absent or not a number)."""
    try:
        return float(row.get(key, "").replace(",", ""))
    except ValueError:
        return None


def cell(row: dict, key: str, scale: float) -> str:
    """A counter scaled for a table cell: three significant digits, or 'n/a'."""
    v = metric(row, key)
    return "n/a" if v is None else f"{v * scale:.3g}"


def parse(text: str) -> list[dict]:
    """ncu's ``--csv --page raw`` rows: one per kernel, metrics as columns
    (the second line holds units; ncu's own log lines start with ==)."""
    lines = [x for x in text.splitlines() if x.strip() and not x.startswith("==")]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    return [r for r in rows if r.get("Kernel Name") and r.get("ID", "").strip().isdigit()]


def report(path: str, out: str | None) -> None:
    with open(path, encoding="utf-8", errors="replace") as f:
        rows = parse(f.read())
    if not rows:
        raise SystemExit(f"{path}: no kernel rows (did ncu run, and may it read the counters?)")
    text = header("Row pitch in hardware counters: Nsight Compute, one launch per (kernel, layout)")
    text += (__doc__.split("\n\n")[1].replace("\n", " ") + "\n\nncu --clock-control none: the GPU's "
             "clocks untouched. Times are single launches (noisy); read the counters.\n\n")
    by_shape: dict[str, list] = {}
    for r in rows:
        name = r["Kernel Name"]
        parts = name.split("|")
        if len(parts) == 3:  # renamed by its NVTX range: who|layout|shape/<kernel's own name>
            shape, _, kernel = parts[2].partition("/")
            who = parts[0] if parts[0] != "cuBLAS" else f"cuBLAS {kernel[:48]}"
            by_shape.setdefault(shape, []).append((who, parts[1], r))
        else:
            by_shape.setdefault("(not renamed by NVTX)", []).append((name[:60], "?", r))
    cols = [("µs", "gpu__time_duration.sum", 1e-3), ("DRAM read MB", "dram__bytes_read.sum", 1e-6),
            ("L2 read sectors (M)", "lts__t_sectors_op_read.sum", 1e-6),
            ("L2 read requests (M)", "lts__t_requests_op_read.sum", 1e-6),
            ("L2 hit %", "lts__t_sector_op_read_hit_rate.pct", 1),
            ("L2 busy %", "lts__throughput.avg.pct_of_peak_sustained_elapsed", 1),
            ("tensor busy %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed", 1)]
    for shape, items in by_shape.items():
        text += (f"## {shape}\n\n| kernel | layout | " + " | ".join(c[0] for c in cols)
                 + " | sectors / request |\n|" + "---|" * (len(cols) + 3) + "\n")
        for who, lay, r in items:
            vals = [cell(r, key, scale) for _, key, scale in cols]
            sectors = metric(r, "lts__t_sectors_op_read.sum")
            requests = metric(r, "lts__t_requests_op_read.sum")
            spr_s = f"{sectors / requests:.2f}" if sectors is not None and requests else "n/a"
            text += f"| {who} | {lay} | " + " | ".join(vals) + f" | {spr_s} |\n"
        text += "\n"
    write("pitch_ncu", text, out)


def main() -> None:
    from option_retime import shapes_arg  # noqa: PLC0415

    ncu_main(__doc__.splitlines()[0], run, report,
             lambda r: r.add_argument("--shapes", type=shapes_arg, default=DEFAULT_SHAPES))


if __name__ == "__main__":
    main()
