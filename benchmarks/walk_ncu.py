"""Why a banded walk loses to the plain one at long K, in hardware counters (GPU, under Nsight Compute)

r35's screen of every banded pair on the selection benchmark's shapes
(swizzle_diag.py --sample) left seven pairs below 0.90x their plain sibling,
all at two long-K shapes (K 53,832 and 57,192, 13-20 waves of tiles). By
bytes, each banded wave there needs fewer unique operand bytes from HBM than
a plain one. That holds only while the tiles that share an operand panel
read the same k-slice at about the same time. This script counts what the
walks really move: each named option is launched once inside its own
profiled range (NVTX ``option|shape``), so ``ncu`` reports DRAM bytes, L2
hit rate, L2 and tensor-pipe load and the duration per (shape, option).

Modes, as pitch_ncu.py's:
- ``run`` (under ncu; build_scripts/gpu_suite.sh step ``walkncu`` writes the
  command): ``--cases "MxNxK:label,label;MxNxK:label"`` (bf16, nn.Linear layout;
  the label ``cuBLAS`` profiles ``torch.mm`` on the same operands, every
  kernel it launches, so its walk's DRAM bytes read beside ours);
- ``report CSV``: one table per shape, plus the operand bytes each walk needs
  once (no GPU).

``--clock-control none`` leaves the clocks alone: durations are single launches
and noisy; read the counters.
"""

from __future__ import annotations

import argparse
import sys

from _common import header, write
from pitch_ncu import cell, metric, ncu_main, parse, profile_once

DEFAULT_CASES = ("9711x8568x57192:128x256/1x1/m1,128x256/1x1/n4,128x256/1x1/m8,"
                 "128x256/2x1/m1,128x256/2x1/n8;"
                 "11395x4720x53832:256x128/2x1/m1,256x128/2x1/m4,256x128/2x1/m8;"
                 "4096x4096x4096:128x256/2x1/m1,128x256/2x1/m8")


def cases_arg(text: str) -> list[tuple[tuple[int, int, int], list[str]]]:
    out = []
    for item in text.split(";"):
        shape, _, labels = item.partition(":")
        try:
            m, n, k = (int(x) for x in shape.strip().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shape!r} is not MxNxK") from None
        names = [x.strip() for x in labels.split(",") if x.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"{item!r}: name at least one option label")
        out.append(((m, n, k), names))
    return out


def cublas_mm(a, b, out):
    """torch.mm with out given, in the option launchers' argument order."""
    import torch  # noqa: PLC0415 - GPU part only

    return torch.mm(a, b, out=out)


def run(args) -> None:
    import torch  # noqa: PLC0415 - GPU part only
    from _common import linear_candidates  # noqa: PLC0415

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run import select  # noqa: PLC0415
    from cutlass_aot.run.dispatch import launch_choice  # noqa: PLC0415

    cache = cutlass_aot.open_cache()
    sms, cands = linear_candidates(cache, "bf16")
    by_label = {select.Choice(c, 1, "ncu").label(): c for c in cands
                if not c.split_k and not c.gemv and c.k_cluster == 1}
    for (m, n, k), labels in args.cases:
        missing = [x for x in labels if x not in by_label and x != "cuBLAS"]
        if missing:
            sys.exit(f"{m}x{n}x{k}: no option {missing} among the cache's bf16 nn.Linear variants")
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        for label in labels:
            if label == "cuBLAS":
                fn = cublas_mm
            else:
                fn = launch_choice(cache, select.Choice(by_label[label], 1, "ncu"), sms, m, n, 1, k=k)
            profile_once(f"{label}|{m}x{n}x{k}", fn, a, w.t(), out)
        print(f"{m}x{n}x{k}: profiled {', '.join(labels)}", flush=True)
        del a, w, out
        torch.cuda.empty_cache()


def once_mb(m: int, n: int, k: int) -> float:
    """A, B and D once, in MB (bf16)."""
    return (m * k + n * k + m * n) * 2 / 1e6


def report(path: str, out: str | None) -> None:
    with open(path, encoding="utf-8", errors="replace") as f:
        rows = parse(f.read())
    if not rows:
        raise SystemExit(f"{path}: no kernel rows (did ncu run, and may it read the counters?)")
    text = header("Banded against plain walks at long K in hardware counters: Nsight Compute")
    text += (__doc__.split("\n\n")[1].replace("\n", " ") + "\n\nncu --clock-control none: the "
             "GPU's clocks untouched. Times are single launches (noisy); read the counters.\n\n")
    by_shape: dict[str, list] = {}
    for r in rows:
        parts = r["Kernel Name"].split("|")
        if len(parts) == 2:
            shape, _, kernel = parts[1].partition("/")
            who = parts[0] if parts[0] != "cuBLAS" else f"cuBLAS {kernel[:48]}"
            by_shape.setdefault(shape, []).append((who, r))
    cols = [("ms", "gpu__time_duration.sum", 1e-6), ("DRAM read GB", "dram__bytes_read.sum", 1e-9),
            ("L2 hit %", "lts__t_sector_op_read_hit_rate.pct", 1),
            ("L2 busy %", "lts__throughput.avg.pct_of_peak_sustained_elapsed", 1),
            ("tensor busy %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed", 1)]
    for shape, items in by_shape.items():
        m, n, k = (int(x) for x in shape.split("x"))
        text += (f"## {shape} (A, B and D once: {once_mb(m, n, k) / 1e3:.2f} GB)\n\n| option | "
                 + " | ".join(c[0] for c in cols) + " | DRAM read / once |\n|"
                 + "---|" * (len(cols) + 2) + "\n")
        for label, r in items:
            vals = [cell(r, key, scale) for _, key, scale in cols]
            dram = metric(r, "dram__bytes_read.sum")
            ratio = "n/a" if dram is None else f"{dram / 1e6 / once_mb(m, n, k):.2f}"
            text += f"| {label} | " + " | ".join(vals) + f" | {ratio} |\n"
        text += "\n"
    write("walk_ncu.md", text, out)


def main() -> None:
    ncu_main(__doc__.splitlines()[0], run, report,
             lambda r: r.add_argument("--cases", type=cases_arg, default=DEFAULT_CASES))


if __name__ == "__main__":
    main()
