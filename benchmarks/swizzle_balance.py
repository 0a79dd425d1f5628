"""Does wave balance explain the one-band walk's losses? A CPU replay of recorded regime pairs.

``swizzle_diag.py --regime`` timed banded walks against the plain walk on
seeded pairs where one band holds every cluster column (issue 9's swizzle
bar). Where the last cluster column is narrow (N not a multiple of the
cluster's width), the plain walk (M first, column after column) leaves that
column's cheap tiles for the last, partial wave, while the band (row after
row) spreads them over every wave. Longest-processing-time-first scheduling
says the plain order then finishes sooner.

This script prices that alone. Each persistent cluster slot (132 SMs over
the cluster's CTAs) takes clusters slot, slot + P, ...; a full tile costs 1
and a tile of the narrow last column ``w + (1 - w) * f`` (f: the fraction of
its columns inside the problem; ``w``: the share of a tile's time its width
does not change, 0 = all of it scales, 1 = none). ``balance`` = the busiest
slot's load under the plain walk / under the band: below 1, wave balance
favours the plain walk by that factor. It reads the pairs from the regime
result tables (their 'live' column is t(plain) / t(banded)), prints every
pair and whether the pairs the balance says the band should lose are the
ones that lose live.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

SMS = 132


def busiest(order, clusters_m: int, clusters_n: int, slots: int, narrow_cost: float) -> float:
    loads = [0.0] * slots
    for c in range(clusters_m * clusters_n):
        _, col = order(c)
        loads[c % slots] += narrow_cost if col == clusters_n - 1 else 1.0
    return max(loads)


def balance(m: int, n: int, variant: str, w: float) -> tuple[float, int, int, float]:
    """(plain's busiest slot / the band's, cluster rows, cluster columns,
    the narrow column's fraction) for one pair; the kernel's M and N are
    the problem's, swapped for a swapped variant."""
    tile, cluster = variant.split("/")[:2]
    tm, tn = (int(x) for x in tile.split("x"))
    cm, cn = (int(x) for x in cluster.split("x"))
    km, kn = (n, m) if "swap" in variant else (m, n)
    rows, cols = -(-km // (tm * cm)), -(-kn // (tn * cn))
    width = tn * cn
    frac = (kn - (cols - 1) * width) / width
    cost = w + (1 - w) * frac
    slots = SMS // (cm * cn)
    plain = busiest(lambda c: (c % rows, c // rows), rows, cols, slots, cost)
    band = busiest(lambda c: (c // cols, c % cols), rows, cols, slots, cost)
    return plain / band, rows, cols, frac


def pairs(path: Path):
    """(dtype, M, N, K, variant, live) of every pair row in a regime table."""
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or cells[0] not in ("bf16", "f16") or "x" not in cells[1]:
            continue
        try:
            m, n, k = (int(x) for x in cells[1].split("x"))
            live = float(cells[4])
        except ValueError:
            continue
        yield cells[0], m, n, k, cells[2], live


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+", help="swizzle_diag.py --regime result tables (.md)")
    ap.add_argument("--w", type=float, default=0.5,
                    help="share of a tile's time its width does not change (default 0.5)")
    ap.add_argument("--below", type=float, default=0.97,
                    help="a balance under this says the band should lose (default 0.97)")
    args = ap.parse_args()
    rows = []
    for t in args.tables:
        for dt, m, n, k, variant, live in pairs(Path(t)):
            b, cr, cc, frac = balance(m, n, variant, args.w)
            rows.append((live, b, dt, f"{m}x{n}x{k}", variant, cr, cc, frac, Path(t).name))
    if not rows:
        sys.exit(f"no pair rows in {args.tables}: are these swizzle_diag.py --regime tables?")
    rows.sort()
    print("| live (plain / banded) | balance | dtype | MxNxK | variant | cluster grid | narrow column | table |")
    print("|---|---|---|---|---|---|---|---|")
    for live, b, dt, shape, variant, cr, cc, frac, name in rows:
        print(f"| {live:.3f} | {b:.3f} | {dt} | {shape} | {variant} | {cr}x{cc} | {frac:.2f} | {name} |")
    said = [r[0] for r in rows if r[1] < args.below]
    other = [r[0] for r in rows if r[1] >= args.below]
    print()
    for name, v in (("balance favours plain", said), ("balance neutral", other)):
        if v:
            print(f"{name} (balance {'<' if v is said else '>='} {args.below}): {len(v)} pairs, live "
                  f"median {statistics.median(v):.3f}, min {min(v):.3f}, "
                  f"below 0.90: {sum(x < 0.90 for x in v)}")
        else:
            print(f"{name}: no pairs")


if __name__ == "__main__":
    main()
