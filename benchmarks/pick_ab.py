"""Two picks per shape, timed together: a model change's old and new pick, or the best known option and the dispatcher's.

A replay (replay_selection.py) scores a model on one sweep's single timings,
which carry a few percent of noise per option; a pick that moves between two
options within that noise reads as a win or a loss by chance. This script
times exactly the picks a change moves, interleaved, on fresh operands:

    pick_ab.py plan --without-tiles 192x128,192x160,192x192 --out pairs.json   (CPU)
    pick_ab.py plan --without-tiles 256x144/2x1,256x144/1x2 --out pairs.json    (CPU)
    pick_ab.py plan --old-model old_constants.json --out pairs.json            (CPU)
    pick_ab.py time pairs.json --out pick_ab.md --raw pick_ab_raw.json          (GPU)

``plan`` walks bench_selection.py's seeded samples (``--samples``: fit,
heldout) and, per shape and dtype (nn.Linear layout), takes the model's pick
over the cache's candidates (B, what ships) and over the same candidates less
those with a tile in ``--without-tiles`` (A, the model before those tiles
existed; an entry ``MxN/CMxCN`` drops only that tile in that cluster shape,
``MxN/CMxCN/swap`` only its swap-AB form);
it writes the shapes where A and B differ. ``--old-model FILE``
instead takes A from the same candidates ranked with the constants in FILE
(JSON: any of ``MODEL``, ``TILE_EFFICIENCY`` as {"MxN": value},
``PINGPONG``, ``CLUSTER_SLOTS_132`` as {"size": clusters}; what a refit
changed), B from the shipped constants.

``plan --against-best RAW...`` instead pairs every shape those raws recorded
with A = the fastest option they recorded (bench_selection.py sweeps: the
sweep's best; tile_probe.py records: the faster of the old best and the best
new option, which that probe timed together; a later file overrides an
earlier one) and B = the dispatcher's live choice (the table's row, the row
below, else the model), decided on the GPU at ``time``. With ``--cache-dir``
A is the best known among the options that cache still ships. B / A is then the
dispatcher's regret against the best option known, measured in one run.

``plan --table-change OLD_CACHE --cache-dir NEW --widths NxK,...`` pairs a
selection table's change at token counts it was not tuned on: a seeded
sample held out from the manifest's ``tune:`` problems at those widths (M
log-uniform over 1..``--max-m``), A = what dispatch runs under OLD_CACHE's
table and B = under NEW's, for the GPU ``--gpu`` names (as ``cutlass-aot
explain`` resolves it); only the shapes whose choice moved are written.
``--widths random`` draws ``--count`` shapes at any width instead, with the
selection benchmark's sampler and GFLOP bound (bench_selection.sample: M, N
and K log-uniform, the extremes first) at ``--seed`` (2002 is its held-out
sample): whether a change reaches shapes nobody tuned.

``--from-plan PLAN`` takes an earlier such plan's pairs as they are (r33
re-timed r32's). ``--cluster-rivals N`` adds, per shape, pairs whose A is one
of the model's N leading options with a cluster of 3 or 4 CTAs: r33 changed
those options' persistent grid, so they may now beat the best option
recorded before it; ``time`` then also reports each shape's regret as the
worst B / A over its pairs.

``time`` times cuBLAS, A and B interleaved (``--rounds`` rounds, in reverse
order every other round, CUDA graph replay, cold L2; the rules of
tune.timing) and reports B / A per group
(geomean, median, p90 and worst, and the pairs where B is faster or slower
by more than 2%), with each against cuBLAS.

A kernel change instead compares two builds: ``time --a-cache OLD`` launches
A's option from the cache OLD (built from the old sources) and B's from
``--cache-dir``; a pair whose B is ``same`` (``--b-same`` at ``time``) takes
A's option from both, so B / A is the change's own effect on each shape's
best known option. ``--spacer`` puts a one-element torch kernel after every
call of each function, cuBLAS's included: a GEMM then never follows a GEMM,
as in a model, where the kernel before a GEMM is a norm, an activation or
attention (what programmatic dependent launch can hide differs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

from _common import gmean, header, linear_candidates, load_raw, parse_tiles, recorded_best, write


def moved(shapes, picks_a, picks_b) -> list[dict]:
    """The (M, N, K) of ``shapes`` whose pick differs between the two lists
    of choices, as plan records."""
    return [{"m": m, "n": n, "k": k, "a": a.label(), "a_splits": a.splits,
             "b": b.label(), "b_splits": b.splits}
            for (m, n, k), a, b in zip(shapes, picks_a, picks_b)
            if (a.candidate, a.splits) != (b.candidate, b.splits)]


def without_arg(text: str) -> set[tuple]:
    """``MxN``, ``MxN/CMxCN`` or ``MxN/CMxCN/swap`` entries, comma-separated,
    as (M, N, cluster or None, swap-AB only) (a bad part is a usage error, exit 2)."""
    out = set()
    for part in text.split(","):
        tile, *rest = part.strip().split("/")
        swap = rest[-1:] == ["swap"]
        rest = rest[:-1] if swap else rest
        try:
            if len(rest) > 1:
                raise ValueError(f"{'/'.join(rest)!r} is not a tile MxN cluster shape")
            ((m, n),) = parse_tiles(tile)
            out.add((m, n, min(parse_tiles(rest[0])) if rest else None, swap))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{part.strip()!r}: {exc}") from None
    return out


def dropped(c, without: set[tuple]) -> bool:
    """Whether candidate ``c`` is one of ``without``'s tiles (any cluster) or
    tile-and-cluster shapes (an entry marked swap: swap-AB candidates only)."""
    return any((m, n) == (c.tile_m, c.tile_n)
               and cluster in (None, (c.cluster_m, c.cluster_n))
               and (c.swap_ab or not swap)
               for m, n, cluster, swap in without)


def changed_picks(cands, shapes, without: set[tuple], sms: int) -> list[dict]:
    """Per (M, N, K): the model's pick without the ``without`` tiles (a) and
    with every candidate (b), where the two differ (pure: candidates in, dicts out)."""
    from cutlass_aot.run import select  # noqa: PLC0415 - keeps --help free of the package

    fewer = [c for c in cands if not dropped(c, without)]
    return moved(shapes, [select.model_choice(fewer, m, n, k, 1, sms) for m, n, k in shapes],
                 [select.model_choice(cands, m, n, k, 1, sms) for m, n, k in shapes])


def load_constants(path: str) -> dict:
    """A constants file for ``--old-model``: {"MODEL": {...}, "TILE_EFFICIENCY":
    {"MxN": v}, "PINGPONG": {"efficiency": {"MxN": v}, "unit_share": v},
    "CLUSTER_SLOTS_132": {"size": clusters}}, every part optional; unknown
    names, sizes and malformed tiles refused (exit 2)."""
    from cutlass_aot.run import select  # noqa: PLC0415

    def tiles(part: dict) -> dict:
        out = {}
        for t, v in part.items():
            (tile,) = parse_tiles(t)
            out[tile] = float(v)
        return out

    try:
        doc = json.loads(Path(path).read_text())
        unknown = sorted(set(doc) - {"MODEL", "TILE_EFFICIENCY", "PINGPONG", "CLUSTER_SLOTS_132"}) + \
            sorted(set(doc.get("MODEL", {})) - set(select.MODEL)) + \
            sorted(set(doc.get("CLUSTER_SLOTS_132", {})) - {str(s) for s in select.CLUSTER_SLOTS_132})
        if unknown:
            raise ValueError(f"unknown names {unknown}")
        pp = doc.get("PINGPONG", {})
        return {"MODEL": {k: float(v) for k, v in doc.get("MODEL", {}).items()},
                "TILE_EFFICIENCY": tiles(doc.get("TILE_EFFICIENCY", {})),
                "PINGPONG_efficiency": tiles(pp.get("efficiency", {})),
                "unit_share": None if pp.get("unit_share") is None else float(pp["unit_share"]),
                "CLUSTER_SLOTS_132": {int(s): int(v) for s, v in doc.get("CLUSTER_SLOTS_132", {}).items()}}
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"--old-model {path}: {exc}; want MODEL, TILE_EFFICIENCY, PINGPONG and "
                         "CLUSTER_SLOTS_132 with select's names and numbers") from None


@contextlib.contextmanager
def constants(c: dict):
    """``select``'s model constants set to ``c`` (``load_constants``) inside the block."""
    from cutlass_aot.run import select  # noqa: PLC0415

    saved = (dict(select.MODEL), dict(select.TILE_EFFICIENCY),
             dict(select.PINGPONG["efficiency"]), select.PINGPONG["unit_share"])
    slots = dict(select.CLUSTER_SLOTS_132)
    select.CLUSTER_SLOTS_132.update(c.get("CLUSTER_SLOTS_132", {}))
    select.MODEL.update(c["MODEL"])
    select.TILE_EFFICIENCY.update(c["TILE_EFFICIENCY"])
    select.PINGPONG["efficiency"].update(c["PINGPONG_efficiency"])
    if c["unit_share"] is not None:
        select.PINGPONG["unit_share"] = c["unit_share"]
    try:
        yield
    finally:
        for d, old in zip((select.MODEL, select.TILE_EFFICIENCY, select.PINGPONG["efficiency"]), saved):
            d.clear()
            d.update(old)
        select.PINGPONG["unit_share"] = saved[3]
        select.CLUSTER_SLOTS_132.clear()
        select.CLUSTER_SLOTS_132.update(slots)


def model_changed_picks(cands, shapes, old: dict, sms: int) -> list[dict]:
    """Per (M, N, K): the model's pick with the ``old`` constants (a) and the
    shipped ones (b), where the two differ."""
    from cutlass_aot.run import select  # noqa: PLC0415

    with constants(old):
        before = [select.model_choice(cands, m, n, k, 1, sms) for m, n, k in shapes]
    return moved(shapes, before, [select.model_choice(cands, m, n, k, 1, sms) for m, n, k in shapes])


def by_group(raw: list[dict]):
    """(group name, its records, their B / A sorted) per sample group, then
    over all when there are several."""
    names = sorted({r["sample"] for r in raw})
    for name in names + (["all"] if len(names) > 1 else []):
        rs = [r for r in raw if name in ("all", r["sample"])]
        yield name, rs, sorted(r["b_us"] / r["a_us"] for r in rs)


def spread(ratio: list[float]) -> str:
    """Sorted ratios' geomean, median, p90 and worst, as markdown cells."""
    return (f"{gmean(ratio):.3f} | {statistics.median(ratio):.3f} | "
            f"{ratio[int(0.9 * (len(ratio) - 1))]:.3f} | {ratio[-1]:.3f}")


def summary(raw: list[dict]) -> str:
    """B against A and both against cuBLAS, per group and over all, as markdown."""
    text = ("| group | pairs | B / A time: geomean | median | p90 | worst | B faster > 2% | "
            "B slower > 2% | A / cuBLAS | B / cuBLAS |\n|---|---|---|---|---|---|---|---|---|---|\n")
    for name, rs, ratio in by_group(raw):
        text += (f"| {name} | {len(rs)} | {spread(ratio)} | "
                 f"{sum(x < 1 / 1.02 for x in ratio)} | {sum(x > 1.02 for x in ratio)} | "
                 f"{gmean([r['cublas_us'] / r['a_us'] for r in rs]):.3f} | "
                 f"{gmean([r['cublas_us'] / r['b_us'] for r in rs]):.3f} |\n")
    text += ("\nBy call length (cuBLAS's time):\n\n| cuBLAS µs | pairs | B / A time: geomean | "
             "A / cuBLAS | B / cuBLAS |\n|---|---|---|---|---|\n")
    for lo, hi in ((0, 20), (20, 100), (100, 1000), (1000, float("inf"))):
        rs = [r for r in raw if lo <= r["cublas_us"] < hi]
        if rs:
            name = f"{lo}+" if hi == float("inf") else f"{lo}-{hi}"
            text += (f"| {name} | {len(rs)} | {gmean([r['b_us'] / r['a_us'] for r in rs]):.3f} | "
                     f"{gmean([r['cublas_us'] / r['a_us'] for r in rs]):.3f} | "
                     f"{gmean([r['cublas_us'] / r['b_us'] for r in rs]):.3f} |\n")
    return text


def against_best(paths: list[str], usable=None) -> list[dict]:
    """Pairs of (the best known option, the live dispatcher), grouped by M <= 256 or not;
    with ``usable(dtype, label)``, the best known among the options it accepts."""
    return [{"sample": "M <= 256" if m <= 256 else "M >= 257", "dtype": d, "m": m, "n": n, "k": k,
             "a": label, "b": "dispatch"}
            for (d, m, n, k), label in sorted(recorded_best(paths, usable).items())]


def cluster_rivals(pairs: list[dict], cands_of, count: int, sms: int) -> list[dict]:
    """Per shape of ``pairs``, extra pairs whose A is one of the model's
    ``count`` leading options with a cluster of 3 or 4 CTAs other than the
    pair's own A (B the live dispatcher): r33 changed those options' grid,
    so a best known option recorded before it may no longer be the best
    (pure: ``cands_of(dtype)`` gives the candidates)."""
    from cutlass_aot.run import select  # noqa: PLC0415

    out = []
    for p in pairs:
        ranked = select.ranked_choices(cands_of(p["dtype"]), p["m"], p["n"], p["k"], 1, sms)
        big = [ch.label() for _, ch in ranked
               if ch.candidate.cluster_size >= 3 and ch.label() != p["a"]]
        out += [{**p, "a": label, "rival": True} for label in big[:count]]
    return out


def per_shape(raw: list[dict]) -> str:
    """Where a shape has several pairs (``--cluster-rivals``), its regret is
    the worst B / A over them: B against the fastest A timed beside it."""
    worst: dict[tuple, dict] = {}
    for r in raw:
        key = (r["dtype"], r["m"], r["n"], r["k"])
        if key not in worst or r["b_us"] / r["a_us"] > worst[key]["b_us"] / worst[key]["a_us"]:
            worst[key] = r
    rs = list(worst.values())
    text = ("| group | shapes | regret: geomean | median | p90 | worst | over 1.2 | over 1.25 | "
            "a rival is the best | best / cuBLAS |\n|---|---|---|---|---|---|---|---|---|---|\n")
    for name, sel, ratio in by_group(rs):
        text += (f"| {name} | {len(sel)} | {spread(ratio)} | "
                 f"{sum(x > 1.2 for x in ratio)} | {sum(x > 1.25 for x in ratio)} | "
                 f"{sum(bool(r.get('rival')) for r in sel)} | "
                 f"{gmean([r['cublas_us'] / r['a_us'] for r in sel]):.3f} |\n")
    top = sorted(rs, key=lambda r: r["a_us"] / r["b_us"])[:10]
    text += ("\nThe ten worst shapes:\n\n| dtype | shape | best A | µs | B | µs | regret |\n"
             "|---|---|---|---|---|---|---|\n")
    text += "".join(f"| {r['dtype']} | {r['m']}x{r['n']}x{r['k']} | {r['a']} | {r['a_us']:.1f} | "
                    f"{r['b']} | {r['b_us']:.1f} | {r['b_us'] / r['a_us']:.3f} |\n" for r in top)
    return text


def shipped_labels(cache, dtypes, sms: int):
    """``usable(dtype, label)`` for ``against_best``: whether the cache's
    nn.Linear candidates of that dtype include the option's schedule (a
    variant a probe timed may have been left out of the manifest since)."""
    from fit_model import parse_label  # noqa: PLC0415

    # A candidate's label names its schedule without the split count.
    have = {d: {c.label() for c in linear_candidates(cache, d, sms)[1]} for d in dtypes}
    return lambda d, label: d in have and parse_label(label, label)[0].label() in have[d]


def load_plan(path: str) -> list[dict]:
    """An earlier ``plan --against-best`` file (plain or .xz), its rivals left out."""
    try:
        pairs = load_raw(path)
        return [p for p in pairs if not p.get("rival") and p["b"] == "dispatch" and p["a"]
                and p["dtype"] and p["m"] > 0 and p["n"] > 0 and p["k"] > 0]
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"--from-plan {path}: not a plan of best-known pairs ({exc})") from None


def table_change(args) -> list[dict]:
    """Held-out shapes at ``--widths`` (or, ``random``, at any width) whose
    dispatch choice differs between the old cache's table (A) and the new
    one's (B): the module docstring."""
    from with_c_edge import held_out_sample, tuned_problems  # noqa: PLC0415

    from cutlass_aot import explain as ex  # noqa: PLC0415

    at_random = args.widths == "random"
    what = "random" if at_random else "held out"
    widths = set()
    for w in ([] if at_random else args.widths.split(",")):
        n, sep, k = w.partition("x")
        if not (sep and n.isdigit() and k.isdigit()):
            raise ValueError(f"--widths: {w!r} is not NxK")
        widths.add((int(n), int(k)))
    out = []
    for dname in args.dtypes.split(","):
        if at_random:
            from bench_selection import MAX_GFLOP, sample  # noqa: PLC0415 - imports torch

            shapes = sample(args.seed, args.count, MAX_GFLOP)
        else:
            tuned = {(m, n, k) for m, n, k in tuned_problems(args.manifest, dname, False) if (n, k) in widths}
            missing = widths - {(n, k) for _, n, k in tuned}
            if missing:
                raise ValueError(f"--widths: the manifest tunes no {dname} problem at "
                                 f"{', '.join(f'{n}x{k}' for n, k in sorted(missing))}")
            shapes = held_out_sample(tuned, args.count, args.seed, args.max_m)
        problems = [(m, n, k, 1) for m, n, k in shapes]
        before = ex.explain(args.table_change, problems, dtype=dname, gpu=args.gpu, top=0)["problems"]
        after = ex.explain(args.cache_dir, problems, dtype=dname, gpu=args.gpu, top=0)["problems"]
        out += [{"sample": f"{what} (seed {args.seed})", "dtype": dname, "m": a["m"], "n": a["n"],
                 "k": a["k"], "a": a["runs"], "a_source": a["source"], "b": b["runs"],
                 "b_source": b["source"]}
                for a, b in zip(before, after) if a["runs"] != b["runs"]]
        print(f"{dname}: {len(shapes)} {what} shapes, {sum(1 for p in out if p['dtype'] == dname)} "
              "moved by the table change")
    return out


def plan(args) -> None:
    if args.table_change:
        if not args.cache_dir or not args.widths:
            raise ValueError("--table-change OLD_CACHE goes with --cache-dir NEW and --widths NxK,...")
        out = table_change(args)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"{len(out)} pairs (old table, new table) -> {args.out}")
        return
    if args.against_best or args.from_plan:
        import cutlass_aot  # noqa: PLC0415

        dtypes = args.dtypes.split(",")
        cache = cutlass_aot.open_cache(args.cache_dir) if args.cache_dir or args.cluster_rivals else None
        if args.from_plan:
            out = load_plan(args.from_plan)
        else:
            out = against_best(args.against_best, shipped_labels(cache, dtypes, args.sms) if args.cache_dir else None)
        rivals = []
        if args.cluster_rivals:
            cands = {d: linear_candidates(cache, d, args.sms)[1] for d in dtypes}
            rivals = cluster_rivals(out, cands.__getitem__, args.cluster_rivals, args.sms)
        Path(args.out).write_text(json.dumps(out + rivals, indent=1))
        print(f"{len(out)} pairs (best known, dispatch) + {len(rivals)} (a 3-4 CTA rival, dispatch) -> {args.out}")
        return
    from bench_selection import SEEDS, sample  # noqa: PLC0415 - imports torch

    import cutlass_aot  # noqa: PLC0415

    old = args.old_constants
    cache = cutlass_aot.open_cache(args.cache_dir)
    out = []
    for dname in args.dtypes.split(","):
        _, cands = linear_candidates(cache, dname, args.sms)
        for name in args.samples.split(","):
            shapes = sample(SEEDS[name], args.count, 20000.0)
            pairs = (model_changed_picks(cands, shapes, old, args.sms) if old
                     else changed_picks(cands, shapes, args.without_tiles, args.sms))
            for p in pairs:
                out.append({"sample": name, "dtype": dname, **p})
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"{len(out)} pairs whose pick changes -> {args.out}")


def time_pairs(args) -> None:
    pairs = json.loads(Path(args.pairs).read_text())
    import torch  # noqa: PLC0415 - GPU part

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run import select  # noqa: PLC0415
    from cutlass_aot.run.dispatch import device_info, launch_choice  # noqa: PLC0415
    from cutlass_aot.signature import gemm_signature  # noqa: PLC0415
    from cutlass_aot.tune.timing import cold_operands, interleaved, rotate  # noqa: PLC0415

    cache = cutlass_aot.open_cache(args.cache_dir)
    a_cache = cutlass_aot.open_cache(args.a_cache) if args.a_cache else cache
    arch, _, gpu_name, cc = device_info(0)
    per_dtype = {}  # dtype -> (SM count, candidates, the table's bound rows, A's candidates)
    for dname in sorted({p["dtype"] for p in pairs}):
        sms, cands = linear_candidates(cache, dname)
        a_cands = linear_candidates(a_cache, dname)[1] if args.a_cache else cands
        sig = gemm_signature(arch, a=dname, b=dname, d=dname, c=None, a_major="k", b_major="k",
                             d_major="n", rank=2)
        per_dtype[dname] = (sms, cands, cache.table_rows(sig, gpu_name, sms, cc) or {}, a_cands)
    spacer = torch.zeros(1, device="cuda")

    def spaced(f):
        if not args.spacer:
            return f

        def g(*xs, _f=f):
            _f(*xs)
            spacer.add_(1.0)
        return g
    started = time.monotonic()
    raw, lines = [], []
    for i, p in enumerate(pairs):
        if args.budget_s and time.monotonic() - started > args.budget_s:
            print(f"budget reached after {i} of {len(pairs)} pairs", file=sys.stderr)
            break
        m, n, k, dname = p["m"], p["n"], p["k"], p["dtype"]
        sms, cands, rows, a_cands = per_dtype[dname]
        by = {ch.label(): ch for _, ch in select.ranked_choices(cands, m, n, k, 1, sms)}
        a_by = by if not args.a_cache else {
            ch.label(): ch for _, ch in select.ranked_choices(a_cands, m, n, k, 1, sms)}
        if p["b"] == "dispatch":
            live = select.choose(cands, m, n, k, 1, sms, rows)
            p = {**p, "b": live.label(), "b_source": live.source}
        if args.b_same:
            p = {**p, "b": p["a"]}
        a, b = a_by.get(p["a"]), by.get(p["b"])
        if a is None or b is None:
            print(f"{dname} {m}x{n}x{k}: the cache lacks {p['a'] if a is None else p['b']}; skipped",
                  file=sys.stderr)
            continue
        sets = cold_operands((dname,) * 3 + ("k", "k", "n", 2), m, n, k, 1)
        fns = [rotate(spaced(lambda x, y, out: torch.mm(x, y, out=out)), sets),
               rotate(spaced(launch_choice(a_cache, a, sms, m, n, 1, k=k)), sets),
               rotate(spaced(launch_choice(cache, b, sms, m, n, 1, k=k)), sets)]
        ref, ta, tb = interleaved(fns, rounds=args.rounds, graph=True)
        rec = {**p, "cublas_us": ref, "a_us": ta, "b_us": tb}
        raw.append(rec)
        line = (f"| {p['sample']} | {dname} | {m}x{n}x{k} | {ref:.1f} | {p['a']} | {ta:.1f} | "
                f"{p['b']} | {tb:.1f} | {tb / ta:.3f} |")
        lines.append(line)
        print(line, flush=True)
        sets = fns = None
        torch.cuda.empty_cache()
    if args.raw:
        Path(args.raw).write_text(json.dumps(raw))
    text = header("Two picks per shape, timed together")
    if args.a_cache:
        what = (f"A = each pair's option from the cache {args.a_cache} and B = "
                + ("the same option" if args.b_same else "B's option") + f" from {args.cache_dir or 'the default cache'}")
    else:
        what = ("A = the model's pick without the new candidates (or, plan --old-model, with the "
                "old constants) and B = the shipped model's pick, or (plan --against-best) A = the "
                "best option known and B = the dispatcher's live choice")
    text += (f"Pairs from {args.pairs} (pick_ab.py plan): {what}. cuBLAS, A and B timed interleaved over "
             f"{args.rounds} rounds (medians), CUDA graph replay, cold L2, fresh operands per pair"
             + ("; a one-element torch kernel after every call (--spacer)" if args.spacer else "")
             + f". Wall time {time.monotonic() - started:.0f} s.\n\n## Summary\n\n")
    text += summary(raw) if raw else "no pair timed\n"
    if any(r.get("rival") for r in raw):
        text += "\n## Per shape: B against the fastest A of its pairs\n\n" + per_shape(raw)
    text += ("\n## Every pair\n\n| sample | dtype | shape | cuBLAS µs | A | µs | B | µs | B / A |\n"
             "|---|---|---|---|---|---|---|---|---|\n") + "\n".join(lines) + "\n"
    path = write("pick_ab.md", text, args.out)
    print(text[: text.index("## Every pair")])
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("plan", help="list the shapes whose pick the new candidates change (CPU)")

    how = pp.add_mutually_exclusive_group(required=True)
    how.add_argument("--without-tiles", type=without_arg,
                     help="MxN, MxN/CMxCN or MxN/CMxCN/swap entries, comma-separated: the candidates A lacks")
    how.add_argument("--against-best", nargs="+", metavar="RAW")
    how.add_argument("--old-model", metavar="FILE", help="constants JSON the shipped model is compared with")
    how.add_argument("--from-plan", metavar="PLAN", help="an earlier --against-best plan's pairs, as they are")
    how.add_argument("--table-change", metavar="OLD_CACHE",
                     help="pair dispatch under this cache's table (A) with --cache-dir's (B) at held-out shapes")
    pp.add_argument("--widths", default=None,
                    help="with --table-change: tuned NxK widths, comma-separated, or 'random' "
                         "(bench_selection's sampler at --seed, --count shapes, any width)")
    pp.add_argument("--gpu", default="H100", help="with --table-change: the GPU whose table rows bind")
    pp.add_argument("--seed", type=int, default=72, help="with --table-change: the held-out sample's seed")
    pp.add_argument("--max-m", type=int, default=16384, help="with --table-change: the largest M drawn")
    pp.add_argument("--manifest", default=str(Path(__file__).resolve().parents[1] / "configs" / "sm90.yaml"),
                    help="with --table-change: whose tune: problems the sample avoids")
    pp.add_argument("--samples", default="fit,heldout")
    pp.add_argument("--dtypes", default="bf16,f16")
    pp.add_argument("--count", type=int, default=200)
    pp.add_argument("--sms", type=int, default=132, help="SM count of the GPU planned for")
    pp.add_argument("--cache-dir", default=None)
    pp.add_argument("--cluster-rivals", type=int, default=0, metavar="N",
                    help="with --against-best or --from-plan: per shape, also pair the model's N "
                         "leading 3-4 CTA options (needs --cache-dir)")
    pp.add_argument("--out", required=True)
    tp = sub.add_parser("time", help="time each pair's two picks and cuBLAS (GPU)")
    tp.add_argument("pairs")
    tp.add_argument("--rounds", type=int, default=5)
    tp.add_argument("--budget-s", type=float, default=None)
    tp.add_argument("--cache-dir", default=None)
    tp.add_argument("--a-cache", default=None, help="launch A's option from this cache (an old build)")
    tp.add_argument("--b-same", action="store_true", help="B = A's option (with --a-cache: one option, two builds)")
    tp.add_argument("--spacer", action="store_true", help="a one-element torch kernel after every call")
    tp.add_argument("--raw", default=None)
    tp.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.cmd == "plan":
        if any(s not in ("fit", "heldout") for s in args.samples.split(",")):
            ap.error(f"--samples {args.samples!r}: want fit, heldout or both, comma-separated")
        if args.cluster_rivals < 0 or (args.cluster_rivals and not (args.against_best or args.from_plan)):
            ap.error("--cluster-rivals N wants N >= 0, with --against-best or --from-plan")
        try:
            args.old_constants = load_constants(args.old_model) if args.old_model else None
        except (OSError, ValueError) as exc:
            print(f"pick_ab.py plan: {exc}", file=sys.stderr)
            sys.exit(2)
        from cutlass_aot.errors import CutlassAotError  # noqa: PLC0415 - after argument checks

        try:
            plan(args)
        except (CutlassAotError, OSError, ValueError) as exc:
            print(f"pick_ab.py plan: {exc}", file=sys.stderr)
            sys.exit(2)
    else:
        if args.rounds < 1:
            ap.error("--rounds must be at least 1")
        time_pairs(args)


if __name__ == "__main__":
    main()
