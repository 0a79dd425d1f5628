"""Which kernels cuBLAS runs where it beats us: names and device times.

For the pairs of a ``pick_ab.py`` raw (or ``--shapes M,N,K ...``) whose best
known option ran below ``--below`` of cuBLAS, calls ``torch.mm`` in the
nn.Linear layout (``x @ w.t()``, out given) under ``torch.profiler`` and
records every CUDA kernel the call launched, with its device time. cuBLAS's
kernel names carry its tile, cluster and K-splitting choices (``nvjet_*``
and ``sm90_xmma_*`` alike), which is what a missing variant of ours would
have to match. The table puts them next to our best known option and its
time from the raw, so the two configurations read side by side.
"""

from __future__ import annotations

import argparse
import json
import re

import torch
from _common import cuda_kernel_events, header, load_raw, write

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
# nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_TNT / ..._tilesize128x256x64_cluster2x1x1_...
NVJET = re.compile(r"_(\d+)x(\d+)_(\d+)x(\d+)_(\d+)x(\d+)_")
XMMA = re.compile(r"tilesize(\d+)x(\d+)x(\d+).*?cluster(\d+)x(\d+)x(\d+)")


def config(name: str) -> str:
    """A kernel name's tile / k-block x stages / cluster, where it carries them."""
    m = NVJET.search(name)
    if m:
        t = m.groups()
        return f"{t[0]}x{t[1]} k{t[2]}x{t[3]} c{t[4]}x{t[5]}"
    m = XMMA.search(name)
    if m:
        t = m.groups()
        return f"{t[0]}x{t[1]} k{t[2]} c{t[3]}x{t[4]}"
    return ""


def kernels(dtype: str, m: int, n: int, k: int, calls: int = 20) -> list[tuple[str, float]]:
    """(kernel name, median device µs) of each kernel one torch.mm call launches."""
    dt = DTYPES[dtype]
    a = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(n, k, device="cuda", dtype=dt)
    out = torch.empty(m, n, device="cuda", dtype=dt)
    for _ in range(3):
        torch.mm(a, w.t(), out=out)

    def run() -> None:
        for _ in range(calls):
            torch.mm(a, w.t(), out=out)
    times: dict[str, list[float]] = {}
    for ev in cuda_kernel_events(run):
        times.setdefault(ev.name, []).append(ev.device_time)
    rows = []
    for name, ts in times.items():
        ts.sort()
        rows.append((name, ts[len(ts) // 2]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", help="a pick_ab.py raw json (plain or .xz)")
    ap.add_argument("--below", type=float, default=0.90,
                    help="pairs whose best known option ran below this fraction of cuBLAS")
    ap.add_argument("--shapes", nargs="*", default=[], help="DTYPE:MxNxK problems to add")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    todo: list[dict] = []
    if args.raw:
        for r in load_raw(args.raw):
            if r["cublas_us"] / r["a_us"] < args.below:
                todo.append(r)
    for s in args.shapes:
        dtype, dims = s.split(":")
        m, n, k = map(int, dims.split("x"))
        todo.append({"dtype": dtype, "m": m, "n": n, "k": k})
    todo.sort(key=lambda r: r.get("cublas_us", 0) / r.get("a_us", 1))
    records, lines = [], []
    for r in todo:
        ks = kernels(r["dtype"], r["m"], r["n"], r["k"])
        rec = dict(r, kernels=[{"name": n, "us": t, "config": config(n)} for n, t in ks])
        records.append(rec)
        total = sum(t for _, t in ks)
        names = "<br>".join(f"{config(n) or n[:60]} ({t:.1f})" for n, t in ks)
        ours = f"{r['a']} ({r['a_us']:.1f})" if "a" in r else ""
        ratio = f"{r['cublas_us'] / r['a_us']:.3f}" if "a_us" in r else ""
        lines.append(f"| {r['dtype']} | {r['m']}x{r['n']}x{r['k']} | {total:.1f} | {names} | "
                     f"{ours} | {ratio} |")
        print(lines[-1], flush=True)
    text = header("cuBLAS's kernels where it beats our best known option")
    text += (f"Pairs from {args.raw or '(none)'} whose best known option ran below {args.below} of "
             "cuBLAS, plus any given shapes. torch.mm in the nn.Linear layout under "
             "torch.profiler, 20 calls, warm L2, median device µs per kernel. Config = tile, "
             "k-block x stages, cluster, as the kernel's name gives them. Ours = the raw's best "
             "known option and its time (graph replay, cold L2: not the same timing; read the "
             "configurations, not the ratio of these two columns).\n\n")
    text += "| dtype | shape | cuBLAS µs (sum) | cuBLAS kernels: config (µs) | ours (µs) | cuBLAS/ours in the raw |\n"
    text += "|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n\n"
    text += "Full names: the raw json next to this file.\n"
    tag = f"_{args.tag}" if args.tag else ""
    base = f"{args.out_dir}/cublas_kernels{tag}" if args.out_dir else None
    path = write(f"cublas_kernels{tag}.md", text, base + ".md" if base else None)
    with open(str(path).removesuffix(".md") + "_raw.json", "w") as f:
        json.dump(records, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
