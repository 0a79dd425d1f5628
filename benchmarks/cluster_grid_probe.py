"""Does a cluster's persistent grid fit the GPU? Old against new grid size (GPU).

The SM90 kernels size their persistent grid as ``sm_count // cluster size``
clusters. Until r33 the run side handed them the device's SM count, so a
4-CTA cluster's grid held 33 clusters on 132 SMs; since r33 it hands them
``occupancy.grid_sms``, the resident clusters (the driver's answer) times
the size. This script prints the driver's answers, then, per shape
(``--shapes``, default: multi-wave shapes of the held-out sample where a
4-CTA option was picked or lost), times the model's leading options of each
kind of cluster of 3 or 4 CTAs under both grids, and the model's leading option
with a smaller cluster as a reference, interleaved over ``--rounds`` rounds
(CUDA graph replay, cold L2, fresh operands: tune.timing's rules).

``--raw FILE`` writes the records (per option: old and new µs, the model's
estimate) for the notes and for refitting.

``--from-raw RAW...`` re-times recorded sweeps instead (bench_selection.py
or tile_probe.py raws, taken before r33): per recorded shape, the options
with clusters of 3 or 4 CTAs over more than one resident wave, recorded
within ``--within`` of the shape's best, under the new grid, with the
fastest recorded option of 1 or 2 CTAs (which the change leaves alone) as
the reference, 3 rounds interleaved. ``--patched FILE`` writes the shapes
re-timed, in the input's record format, each re-timed option's time
scaled by the reference's recorded / re-timed time: fit-side data that
fit_terms.py can refit the cluster terms on. Shapes past ``--budget-s``
are left out, not kept stale.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _common import gmean, header, linear_candidates, load_raw, write
from option_retime import shapes_arg

from cutlass_aot.run import select

# Held-out shapes whose pick or best option is a cluster of 4 over several
# waves (r32's worst: 48x50960x760, 171x42384x3488, 247x3832x4760), and
# large grids of each kind.
DEFAULT_SHAPES = ("48x50960x760,171x42384x3488,247x3832x4760,235x1832x2168,512x28672x4096,"
                  "1024x14336x4096,2048x8192x8192,4096x4096x4096,8192x8192x8192,16384x3072x1024")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=shapes_arg, default=shapes_arg(DEFAULT_SHAPES))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    ap.add_argument("--per-shape", type=int, default=2,
                    help="per shape, the model's leading options of each 3-4 CTA cluster kind timed")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rep-us", type=float, default=300.0)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--raw", default=None)
    ap.add_argument("--from-raw", nargs="+", default=[], help="recorded sweeps to re-time (module doc)")
    ap.add_argument("--within", type=float, default=1.5)
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--patched", default=None, help="with --from-raw: the re-timed records")
    args = ap.parse_args()
    if args.from_raw:
        retime_recorded(args)
        return

    import torch  # noqa: PLC0415 - GPU part only

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run import occupancy  # noqa: PLC0415
    from cutlass_aot.run.dispatch import launch_choice  # noqa: PLC0415
    from cutlass_aot.tune.timing import cold_operands, interleaved, rotate  # noqa: PLC0415

    cache = cutlass_aot.open_cache(args.cache_dir)
    sms, cands = linear_candidates(cache, args.dtype)
    answers = occupancy.query(torch.cuda.current_device())
    text = header(f"Persistent grids of 3- and 4-CTA clusters: SMs // size against the resident clusters ({args.dtype})")
    text += (f"The driver's resident clusters per size (cuOccupancyMaxActiveClusters, one CTA per SM): "
             f"{answers} on {sms} SMs; the grid handed to a launch: "
             + ", ".join(f"size {s}: {occupancy.grid_sms(0, s, sms)} SMs" for s in (1, 2, 3, 4))
             + f".\nPer shape, each option timed with the old grid (sm_count {sms}) and the new, "
             f"interleaved over {args.rounds} rounds (medians, µs; CUDA graph replay, cold L2). "
             "ref: the model's leading option with a cluster of 1-2 CTAs. waves: tiles over the new "
             "grid's CTAs.\n\n")
    text += "| shape | option | waves | old µs | new µs | new / old | ref | ref µs | new / ref | old / ref |\n"
    text += "|---|---|---|---|---|---|---|---|---|---|\n"
    start = time.monotonic()
    records, ratios = [], []
    for m, n, k in args.shapes:
        ranked = [ch for _, ch in select.ranked_choices(cands, m, n, k, 1, sms)]
        big, kinds = [], {}
        for ch in ranked:  # the leading options of each cluster kind (4x1, 2x2, 1x4, kc3, kc4)
            c = ch.candidate
            kind = (c.cluster_m, c.cluster_n, c.k_cluster)
            if c.cluster_size >= 3 and kinds.get(kind, 0) < args.per_shape:
                kinds[kind] = kinds.get(kind, 0) + 1
                big.append(ch)
        ref = next((ch for ch in ranked if ch.candidate.cluster_size <= 2), None)
        if not big or ref is None:
            continue
        sets = cold_operands((args.dtype,) * 3 + ("k", "k", "n", 2), m, n, k, 1)
        fns = [rotate(launch_choice(cache, ref, sms, m, n, 1, k=k), sets)]
        for ch in big:
            fns.append(rotate(launch_choice(cache, ch, sms, m, n, 1, k=k, grid_sms=sms), sets))
            fns.append(rotate(launch_choice(cache, ch, sms, m, n, 1, k=k), sets))
        med = interleaved(fns, rounds=args.rounds, reps=args.reps, rep_us=args.rep_us, graph=True)
        ref_us = med[0]
        rec = {"dtype": args.dtype, "m": m, "n": n, "k": k, "ref": ref.label(), "ref_us": ref_us,
               "options": []}
        for j, ch in enumerate(big):
            old, new = med[1 + 2 * j], med[2 + 2 * j]
            c = ch.candidate
            _, _, tiles = select._tiles(c, m, n, 1)
            grid = occupancy.grid_sms(0, c.cluster_size, sms)
            waves = tiles * c.k_cluster / grid
            ratios.append((waves, new / old))
            text += (f"| {m}x{n}x{k} | {ch.label()} | {waves:.1f} | {old:.1f} | {new:.1f} | "
                     f"{new / old:.3f} | {ref.label()} | {ref_us:.1f} | {new / ref_us:.3f} | "
                     f"{old / ref_us:.3f} |\n")
            rec["options"].append([ch.label(), c.key, ch.splits, old, new, waves])
        records.append(rec)
        print(text.splitlines()[-1], flush=True)
        if args.raw:
            Path(args.raw).write_text(json.dumps({"answers": answers, "records": records}))
        sets = fns = None
        torch.cuda.empty_cache()
    text += "\n| waves (new grid) | options | new / old geomean | best | worst |\n|---|---|---|---|---|\n"
    for lo, hi in ((0, 1), (1, 2), (2, 4), (4, 1e9)):
        sel = [r for w, r in ratios if lo < w <= hi]
        if sel:
            text += f"| {lo}-{hi if hi < 1e9 else 'more'} | {len(sel)} | {gmean(sel):.3f} | {min(sel):.3f} | {max(sel):.3f} |\n"
    text += f"\nWall time {time.monotonic() - start:.0f} s.\n"
    write("cluster_grid_probe", text, args.out)


def retime_recorded(args) -> None:
    """``--from-raw``: the module doc's second mode."""
    import torch  # noqa: PLC0415 - GPU part only
    from fit_model import parse_label  # noqa: PLC0415

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run import occupancy  # noqa: PLC0415
    from cutlass_aot.run.dispatch import launch_choice  # noqa: PLC0415
    from cutlass_aot.tune.timing import cold_operands, interleaved, rotate  # noqa: PLC0415

    cache = cutlass_aot.open_cache(args.cache_dir)
    by_dtype = {}
    start = time.monotonic()
    patched, ratios, left = [], [], 0
    text = header("Recorded 3- and 4-CTA cluster options re-timed on the resident grid")
    for path in args.from_raw:
        for rec in load_raw(path):
            if time.monotonic() - start > args.budget_s:
                left += 1
                continue
            dtype, m, n, k = rec.get("dtype", "bf16"), rec["m"], rec["n"], rec["k"]
            if dtype not in by_dtype:
                by_dtype[dtype] = linear_candidates(cache, dtype)
            sms, cands = by_dtype[dtype]
            best_us = min(o[3] for o in rec["options"])
            moved, ref = [], None
            for i, (label, key, _splits, us, *_rest) in enumerate(rec["options"]):
                c, _ = parse_label(label, key)
                size = c.cluster_size
                _, _, tiles = select._tiles(c, m, n, 1)
                multi = tiles * c.k_cluster > occupancy.grid_sms(0, size, sms)
                if size >= 3 and multi and us <= args.within * best_us:
                    moved.append(i)
                elif size <= 2 and (ref is None or us < rec["options"][ref][3]):
                    ref = i
            if not moved or ref is None:
                continue
            choices = {ch.label(): ch for _, ch in select.ranked_choices(cands, m, n, k, 1, sms)}
            labels = [rec["options"][i][0] for i in [ref, *moved]]
            if any(lb not in choices for lb in labels):
                continue
            sets = cold_operands((dtype,) * 3 + ("k", "k", "n", 2), m, n, k, 1)
            fns = [rotate(launch_choice(cache, choices[lb], sms, m, n, 1, k=k), sets) for lb in labels]
            med = interleaved(fns, rounds=3, reps=2, rep_us=args.rep_us, graph=True)
            scale = rec["options"][ref][3] / med[0]
            out = json.loads(json.dumps(rec))
            for j, i in enumerate(moved):
                new_us = med[1 + j] * scale
                c, _ = parse_label(out["options"][i][0], out["options"][i][1])
                _, _, tiles = select._tiles(c, m, n, 1)
                waves = tiles * c.k_cluster / occupancy.grid_sms(0, c.cluster_size, sms)
                ratios.append((waves, new_us / out["options"][i][3]))
                out["options"][i][3] = new_us
            fastest = min(out["options"], key=lambda o: o[3])
            out["best"], out["best_us"] = fastest[0], fastest[3]
            out["retimed"] = {"ref": labels[0], "ref_recorded_us": rec["options"][ref][3],
                              "ref_us": med[0], "options": len(moved), "source": Path(path).name}
            patched.append(out)
            sets = fns = None
            torch.cuda.empty_cache()
        if args.patched:
            Path(args.patched).write_text(json.dumps(patched))
    text += (f"{len(patched)} shapes re-timed ({left} left out past the budget), "
             f"{len(ratios)} options; per option, its re-timed µs (scaled by the reference's "
             "recorded / re-timed) over its recorded µs:\n\n")
    text += "| waves (new grid) | options | re-timed / recorded geomean | best | worst |\n|---|---|---|---|---|\n"
    for lo, hi in ((0, 1), (1, 2), (2, 4), (4, 1e9)):
        sel = [r for w, r in ratios if lo < w <= hi]
        if sel:
            text += (f"| {lo}-{hi if hi < 1e9 else 'more'} | {len(sel)} | {gmean(sel):.3f} | "
                     f"{min(sel):.3f} | {max(sel):.3f} |\n")
    text += f"\nWall time {time.monotonic() - start:.0f} s.\n"
    write("cluster_grid_retime", text, args.out)


if __name__ == "__main__":
    main()
