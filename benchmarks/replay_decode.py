"""Replay the dispatcher's decode picks on recorded option times (CPU only).

Input: bench_decode.py's ``--raw`` JSON (every option of every decode
problem timed under CUDA graph replay, and cuBLAS) and the selection table
the run's cache shipped. For each problem, the pick is the table's row where
the table has this exact (M, N, K) for the dtype's nn.Linear signature, else
the current model's (run/select.py) among the recorded options; the report
gives pick / cuBLAS (cuBLAS time over the pick option's recorded time) per
M and overall, and how many picks the model made. bench_decode.py measures
the picks live; this shows what a model change does to them without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

from _common import load_raw
from fit_model import parse_label

from cutlass_aot.run import select


def gmean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def table_labels(path: str) -> dict[tuple, str]:
    """(dtype, m, n, k) -> the row's option label, for rank-2 nn.Linear rows without bias."""
    doc = json.load(open(path, encoding="utf-8"))
    out = {}
    for r in doc["rows"]:
        sig = r["signature"]
        if "rank=2" not in sig or "a_major=k" not in sig or "b_major=k" not in sig or "bias=" in sig:
            continue
        dtype = sig.split("a=")[1].split(",")[0]
        v = r["variant"]
        if v.get("gemv"):
            label = f"gemv{v['tile']}"
        else:
            label = f"{v['tile']}/{v.get('cluster', '1x1')}/{v.get('raster', 'm')}{v.get('swizzle', 1)}"
            label += "/swap" if v.get("swap_ab") else ""
            label += "/pp" if v.get("pingpong") else ""
            label += f"/splitkx{r['splits']}" if v.get("split_k") else ""
        out[(dtype, r["m"], r["n"], r["k"])] = label
    return out


def replay(raw: str, table: str, sms: int = 132) -> dict:
    rows = table_labels(table)
    by_m, model_picks, missing = defaultdict(list), 0, 0
    for rec in load_raw(raw):
        m, n, k = rec["m"], rec["n"], rec["k"]
        times = dict((label, us) for label, us in rec["options"])
        label = rows.get((rec["dtype"], m, n, k))
        if label not in times:
            if label is not None:
                missing += 1
            opts = []
            for lab, _ in rec["options"]:
                _, _, split = lab.partition("/splitkx")
                cand, _ = parse_label(lab, lab)
                opts.append((cand, int(split) if split else 1, lab))
            label = min(opts, key=lambda o: select.rank_key(o[0], o[1], m, n, k, 1, sms))[2]
            model_picks += 1
        by_m[m].append(rec["cublas_us"] / times[label])
    allv = [x for v in by_m.values() for x in v]
    return {"all": gmean(allv), "min": min(allv), "by_m": {m: gmean(v) for m, v in sorted(by_m.items())},
            "model_picks": model_picks, "n": len(allv), "table_rows_missing": missing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw")
    ap.add_argument("--table", default="configs/sm90-h200.selection.json")
    args = ap.parse_args()
    out = replay(args.raw, args.table)
    print(f"{args.raw}: n={out['n']} ({out['model_picks']} model picks, "
          f"{out['table_rows_missing']} table rows naming an option not recorded); "
          f"pick / cuBLAS geomean {out['all']:.3f}, min {out['min']:.2f}")
    print("  by M: " + ", ".join(f"{m}: {v:.3f}" for m, v in out["by_m"].items()))


if __name__ == "__main__":
    main()
