"""Did any banded/raster-n schedule collapse? From bench_selection's raw timings (CPU only).

For every shape of a ``--raw`` file and every variant with a raster or swizzle
other than the plain M-first walk, the ratio speed(variant) / speed(same tile,
cluster, swap and split with the plain walk). The issue's bar: none below 0.90.
"""

from __future__ import annotations

import sys

from _common import load_raw
from fit_model import parse_label


def ratios(path: str) -> list[tuple]:
    raw = load_raw(path)
    out = []
    for rec in raw:
        opts = {}
        for label, key, splits, us, _ in rec["options"]:
            c, _ = parse_label(label, key)
            if c.pingpong:
                # Pingpong variants ship with the plain walk only; keyed like
                # the rest they would overwrite their cooperative sibling.
                continue
            opts[(c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.raster, c.swizzle, c.swap_ab,
                  c.split_k, splits)] = us
        for k, us in opts.items():
            if (k[4], k[5]) != ("m", 1):
                base = opts.get(k[:4] + ("m", 1) + k[6:])
                if base:
                    out.append((base / us, rec["dtype"], rec["m"], rec["n"], rec["k"], k))
    return sorted(out)


def main() -> None:
    for path in sys.argv[1:]:
        r = ratios(path)
        below = [x for x in r if x[0] < 0.90]
        print(f"{path}: {len(r)} (shape, banded variant) pairs; below 0.90x the plain walk: "
              f"{len(below)} ({len(below) / len(r):.1%}); worst {r[0][0]:.2f}")
        for x in r[:8]:
            k = x[5]
            print(f"  {x[0]:.2f}  {x[1]} {x[2]}x{x[3]}x{x[4]}  {k[0]}x{k[1]}/{k[2]}x{k[3]}/{k[4]}{k[5]}")


if __name__ == "__main__":
    main()
