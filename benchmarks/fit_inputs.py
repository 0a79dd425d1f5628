"""Make fit inputs from recorded raws (CPU only): re-timed records patched in, stale options left out.

Options recorded before a change that moved their time are stale fit data.
r33's resident grid made every 3-4 CTA cluster faster past one wave, so:

* ``--retimed RAW`` (cluster_grid_probe.py ``--from-raw ... --patched``):
  each re-timed record replaces the record of the same source file, dtype
  and shape;
* ``--max-cluster N`` leaves out the options whose cluster holds more than
  N CTAs (K-cluster CTAs counted), for raws nobody re-timed; a record left
  with no option is dropped, and its best is the fastest one kept.

Each input raw is written under ``--out`` with the same name, as plain JSON
(fit_model.load reads both). How r34's fit inputs were made
(benchmarks/results/2026-12-04_h200_r34_notes.md):

    fit_inputs.py --retimed raw/2026-12-03_h200_r33_cluster_grid_retime_fit_d6ad222_raw.json.xz \\
        --out /tmp/pfit raw/<the seven fit raws it re-timed>
    fit_inputs.py --max-cluster 2 --out /tmp/tp raw/2026-12-03_h200_r31_tile_probe_tokenpairs_*_raw.json.xz
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from _common import load_raw
from fit_model import parse_label


def cluster_size(label: str) -> int:
    """CTAs per cluster of an option label (a gemv option's is 1x1)."""
    return parse_label(label, label)[0].cluster_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raws", nargs="+", help="bench_selection.py or tile_probe.py raws")
    ap.add_argument("--retimed", default=None, help="cluster_grid_probe.py --patched records")
    ap.add_argument("--max-cluster", type=int, default=None, help="leave out options of larger clusters")
    ap.add_argument("--out", required=True, help="folder for the written raws")
    args = ap.parse_args()
    retimed = {}
    for rec in load_raw(args.retimed) if args.retimed else []:
        key = (rec["retimed"]["source"], rec.get("dtype", "bf16"), rec["m"], rec["n"], rec["k"])
        retimed[key] = rec
    os.makedirs(args.out, exist_ok=True)
    for path in args.raws:
        name = os.path.basename(path)
        out, patched, dropped = [], 0, 0
        for rec in load_raw(path):
            key = (name, rec.get("dtype", "bf16"), rec["m"], rec["n"], rec["k"])
            if key in retimed:
                rec, patched = retimed.pop(key), patched + 1
            if args.max_cluster is not None:
                opts = [o for o in rec["options"] if cluster_size(o[0]) <= args.max_cluster]
                if not opts:
                    dropped += 1
                    continue
                best = min(opts, key=lambda o: o[3])
                rec = {**rec, "options": opts, "best": best[0], "best_us": best[3]}
            out.append(rec)
        target = Path(args.out) / name.removesuffix(".xz")
        target.write_text(json.dumps(out))
        print(f"{name}: {len(out)} records ({patched} re-timed, {dropped} left with no option) -> {target}")
    if retimed:
        print(f"{len(retimed)} re-timed records matched no input raw")


if __name__ == "__main__":
    main()
