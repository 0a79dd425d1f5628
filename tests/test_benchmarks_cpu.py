"""The CPU half of benchmark scripts, on the real recorded timings under benchmarks/results/raw.

swizzle_diag.py: which (shape, banded variant) pairs it re-times and in which
order, the walk features it reports, and its command line without a GPU.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCH / "swizzle_diag.py"
RAW = BENCH / "results" / "raw"
R5_HELDOUT = RAW / "2026-11-30_h200_r5_selection_heldout_raw.json.xz"
R3_FIT = RAW / "2026-11-30_h200_r3_selection_fit_raw.json.xz"
RECORDED = [str(R5_HELDOUT), str(R3_FIT)]
R7_HELDOUT = RAW / "2026-11-30_h200_r7_selection_heldout_raw.json.xz"
R7_FIT = RAW / "2026-11-30_h200_r7_selection_fit_raw.json.xz"


@pytest.fixture(scope="module")
def diag():
    sys.path.insert(0, str(BENCH))  # the scripts import their siblings by bare name
    try:
        import swizzle_diag  # noqa: PLC0415 - lives in benchmarks/, found through sys.path

        yield swizzle_diag
    finally:
        sys.path.remove(str(BENCH))


def recorded_below(threshold: float) -> dict[tuple, float]:
    """Every (dtype, shape, label, splits) below ``threshold`` in the two default files, the
    lowest recording of each, computed from the option labels alone: the plain
    sibling of ``T/C/<raster><swizzle>[/swap][/splitk]`` is ``T/C/m1[...]``."""
    sys.path.insert(0, str(BENCH))
    try:
        from _common import load_raw  # noqa: PLC0415
    finally:
        sys.path.remove(str(BENCH))
    out: dict[tuple, float] = {}
    for path in (R5_HELDOUT, R3_FIT):
        for rec in load_raw(str(path)):
            us = {(label, splits): t for label, _, splits, t, _ in rec["options"]}
            for (label, splits), t in us.items():
                parts = label.split("/")
                if parts[2] == "m1":
                    continue
                plain = us.get(("/".join(parts[:2] + ["m1"] + parts[3:]), splits))
                if plain is None or plain / t >= threshold:
                    continue
                k = (rec["dtype"], rec["m"], rec["n"], rec["k"], label, splits)
                out[k] = min(out.get(k, math.inf), plain / t)
    return out


def pair_id(p) -> tuple:
    from cutlass_aot.run import select  # noqa: PLC0415

    tm, tn, cm, cn, raster, swz, swap, split, splits = p.key
    label = select.Candidate("", tm, tn, cm, cn, raster, swz, swap, split).label()
    return (p.dtype, p.m, p.n, p.k, label, splits)


def test_default_raw_files_are_the_recorded_ones(diag):
    # The defaults are the latest runs (cold L2); the tests below pin the
    # logic on the older, warm-L2 files, whose pairs they name.
    assert [Path(p) for p in diag.DEFAULT_RAW] == [R7_HELDOUT, R7_FIT]
    assert all(p.is_file() for p in (R7_HELDOUT, R7_FIT, R5_HELDOUT, R3_FIT))


def test_flagged_pairs_are_every_pair_below_the_threshold_once(diag):
    want = recorded_below(0.95)
    got = diag.flagged_pairs(RECORDED, 0.95, max_pairs=None)
    assert len({pair_id(p) for p in got}) == len(got)  # one entry per pair
    assert {pair_id(p): p.recorded for p in got} == pytest.approx(want)
    assert len(got) > 300
    # A pair recorded in two files is one entry, with its lowest ratio.
    twice = diag.flagged_pairs([R3_FIT, R3_FIT, R5_HELDOUT], 0.95, max_pairs=None)
    assert [(pair_id(p), p.recorded) for p in twice] == [(pair_id(p), p.recorded) for p in got]


def test_flagged_pairs_worst_first_and_capped(diag):
    every = diag.flagged_pairs(RECORDED, 0.95, max_pairs=None)
    top = diag.flagged_pairs(RECORDED, 0.95, max_pairs=60)
    assert top == every[:60]
    ratios = [p.recorded for p in every]
    assert ratios == sorted(ratios) and ratios[-1] < 0.95
    first, second = top[:2]
    assert (first.dtype, first.m, first.n, first.k, first.label()) == (
        "bf16", 75, 24800, 256, "128x256/2x1/n4")
    assert first.source == R3_FIT.name and first.recorded == pytest.approx(0.736, abs=5e-4)
    assert (second.m, second.n, second.k, second.label()) == (2439, 48368, 28464, "128x256/2x1/m4")
    assert second.source == R5_HELDOUT.name
    assert second.plain_key == (128, 256, 2, 1, "m", 1, False, False, 1)


def test_threshold_narrows_the_list(diag):
    wide = set(diag.flagged_pairs(RECORDED, 0.95, max_pairs=None))
    bar = diag.flagged_pairs(RECORDED, 0.90, max_pairs=None)
    assert set(bar) < wide
    assert len(bar) == len(recorded_below(0.90))
    # swizzle_check.py's counts per file: 52 (r5 held-out) and 46 (r3 fit).
    per_file = {name: sum(p.source == name for p in bar) for name in (R5_HELDOUT.name, R3_FIT.name)}
    assert per_file[R5_HELDOUT.name] <= 52 and per_file[R3_FIT.name] <= 46
    assert sum(per_file.values()) == len(bar) > 90


def cluster_order(raster: str, swizzle: int, clm: int, cln: int,
                  slots: int | None = None) -> list[tuple[int, int]]:
    """The clusters a persistent CTA walk visits, in order: a port of
    sm90_gemm._tile_coords's arithmetic for one batch (with ``slots``, the
    persistent grid: a grid it holds in one wave is walked plainly)."""
    if slots is not None and clm * cln <= slots:
        raster, swizzle = "m", 1
    major, minor = (clm, cln) if raster == "m" else (cln, clm)
    order = []
    for rest in range(clm * cln):
        band, inside = divmod(rest, major * swizzle)
        width = min(swizzle, minor - band * swizzle)
        along_major, off = divmod(inside, width)
        along_minor = band * swizzle + off
        order.append((along_major, along_minor) if raster == "m" else (along_minor, along_major))
    return order


def test_walk_same_exactly_when_the_kernel_walks_in_plain_order(diag):
    # Grids within one wave of 132 slots (walked plainly) and beyond it.
    for clm, cln, raster, swz in itertools.product((1, 2, 3, 5, 40), (1, 2, 4, 9, 37), "mn", (4, 8)):
        key = (128, 256, 1, 1, raster, swz, False, False, 1)
        w = diag.walk(key, clm * 128, cln * 256)
        assert (w.clusters_m, w.clusters_n) == (clm, cln)
        order = cluster_order(raster, swz, clm, cln, slots=132)
        assert sorted(order) == sorted(cluster_order("m", 1, clm, cln))  # every cluster once
        assert w.same == (order == cluster_order("m", 1, clm, cln)), (clm, cln, raster, swz)
        assert w.bands == len({c[1] // swz if raster == "m" else c[0] // swz for c in order})


def test_walk_features_of_recorded_pairs(diag):
    top = diag.flagged_pairs(RECORDED, 0.95, max_pairs=2)
    w = diag.walk(top[0].key, top[0].m, top[0].n)  # 75 rows: one 2x1 cluster row
    assert (w.grid(), w.same, w.bands) == ("1x97", True, 1)
    assert w.waves == pytest.approx(97 / 66)
    w = diag.walk(top[1].key, top[1].m, top[1].n)
    assert (w.grid(), w.same, w.bands) == ("10x189", False, 48)
    assert w.waves == pytest.approx(1890 / 66)
    # A swapped variant walks the transposed problem: N is the kernel's M.
    w = diag.walk((128, 256, 1, 1, "m", 4, True, False, 1), 3000, 5000)
    assert (w.grid(), w.same, w.bands) == ("40x12", False, 3)
    # 40x2 clusters fit one wave: the kernel walks them plainly.
    w = diag.walk((128, 256, 1, 1, "m", 4, True, False, 1), 300, 5000)
    assert (w.grid(), w.same, w.bands) == ("40x2", True, 1)


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_help_and_list_need_no_gpu():
    res = run_script("--help")
    assert res.returncode == 0 and "--max-pairs" in res.stdout
    res = run_script("--list", "--max-pairs", "3", "--raw", *RECORDED)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 4 and lines[-1].startswith("3 pairs, 2 walking in the plain walk's order; estimated run on an H200: ~")
    assert lines[0].startswith("0.736  bf16 75x24800x256  128x256/2x1/n4  grid 1x97 same")


@pytest.mark.parametrize("args, message", [
    (("--raw", "/nonexistent_raw.json.xz"), "no raw file"),
    (("--threshold", "0"), "--threshold must be"),
    (("--max-pairs", "0"), "--max-pairs"),
    (("--sample", "fit", "--shapes", "11395x4720"), "is not MxNxK"),
])
def test_cli_bad_input_exits_2(args, message):
    res = run_script("--list", *args)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr


def test_every_flagged_pair_and_its_plain_sibling_are_in_the_shipped_manifest(diag):
    """What the GPU run matches pairs against: the non-pingpong candidates of the
    nn.Linear signature that configs/sm90.yaml builds (so none is skipped as
    'not in the cache' on a cache built from it). Since r35 the manifest no
    longer builds the 128x256 tile's raster-n bands without a cluster, and since
    r36 the 256x128 tile's 2x1 band of four cluster columns along M (its comments
    say why): their recorded pairs are the only ones it may lack."""
    from cutlass_aot.builder.manifest import load_manifest  # noqa: PLC0415 - build side, test only
    from cutlass_aot.run import select  # noqa: PLC0415

    manifest = load_manifest(BENCH.parent / "configs" / "sm90.yaml")
    built: dict[str, set] = {}
    for v in manifest.variants:
        p = v.param_dict
        if (v.family_ref == "sm90_gemm" and p["b"] in (None, p["a"]) and p["d"] in (None, p["a"])
                and (p["a_major"], p["b_major"], p["d_major"], p["rank"]) == ("k", "k", "n", 2)
                and not p["with_c"] and p["bias"] is None):
            c = select.candidate_from_variant("key", p)
            if not c.pingpong:
                built.setdefault(p["a"], set()).add(diag.schedule(c))
    pairs = diag.flagged_pairs(RECORDED, 0.90, max_pairs=None)
    pairs += diag.flagged_pairs(RECORDED, 0.95, max_pairs=60)
    dropped = 0
    for p in pairs:
        assert p.plain_key[:8] in built[p.dtype], p
        if p.key[:6] in ((128, 256, 1, 1, "n", p.key[5]), (256, 128, 2, 1, "m", 4)):
            assert p.key[:8] not in built[p.dtype], p
            dropped += 1
            continue
        assert p.key[:8] in built[p.dtype], p
    assert 0 < dropped < len(pairs)


def test_regime_pairs_are_fresh_one_band_grids_the_manifest_builds(diag):
    from cutlass_aot.builder.manifest import load_manifest  # noqa: PLC0415 - build side, test only

    pairs = diag.regime_pairs(60, seed=4004, max_waves=4.0)
    assert pairs == diag.regime_pairs(60, seed=4004, max_waves=4.0)  # seeded: the same draw
    assert pairs != diag.regime_pairs(60, seed=4005, max_waves=4.0)
    assert len({(p.shape, p.key) for p in pairs}) == 60
    for p in pairs:
        w = diag.walk(p.key, p.m, p.n)
        assert w.bands == 1 and not w.same and 1 < w.waves <= 4, p
        assert p.n % 8 == 0 and p.k % 8 == 0 and 256 <= p.k <= 57344 and math.isnan(p.recorded)
        # the banded walk really differs: two cluster columns at least (a port of the kernel's order)
        kclm, kcln = w.clusters_m, w.clusters_n
        assert cluster_order("m", p.key[5], kclm, kcln) != cluster_order("m", 1, kclm, kcln)
    assert {p.key[7] for p in pairs} == {False} and len({p.key[:6] for p in pairs}) > 8
    # every schedule (and its plain sibling) is one configs/sm90.yaml builds for
    # nn.Linear, but 256x128/2x1/m4, dropped in r36 (kept here: r19's seeded draws
    # stay reproducible; a run reports its pairs as not in the cache)
    built = set()
    for v in load_manifest(BENCH.parent / "configs" / "sm90.yaml").variants:
        q = v.param_dict
        if (v.family_ref == "sm90_gemm" and q["b_major"] == "k" and q["a_major"] == "k"
                and q["rank"] == 2 and not q["with_c"] and q["bias"] is None and not q["split_k"]
                and not q.get("pingpong") and q.get("k_cluster", 1) == 1 and q["a"] == "bf16"
                and q["d"] in (None, "bf16")):
            tm, tn = map(int, q["tile"].split("x"))
            cm, cn = map(int, q["cluster"].split("x"))
            built.add((tm, tn, cm, cn, q["raster"], q["swizzle"], q["swap_ab"]))
    for tm, tn, cm, cn, w, swap in diag.REGIME_SCHEDULES:
        assert (tm, tn, cm, cn, "m", 1, swap) in built
        dropped = (tm, tn, cm, cn, w) == (256, 128, 2, 1, 4)
        assert ((tm, tn, cm, cn, "m", w, swap) in built) != dropped


def test_sample_pairs_are_the_benchmark_shapes_where_a_banded_walk_differs(diag):
    """--sample's pairs: the selection benchmark's own shapes (bench_selection.sample,
    same seed), each banded candidate with a plain sibling in the cache, only where
    its walk differs from the plain one; gemv, K-cluster and pingpong candidates are
    left out, and a split-K variant takes the model's first split for its sibling."""
    from bench_selection import SEEDS, sample  # noqa: PLC0415 - benchmarks/, on sys.path

    from cutlass_aot.run import select  # noqa: PLC0415

    def cand(tm, tn, cm=1, raster="m", swz=1, swap=False, split=False, **kw):
        return select.Candidate("k", tm, tn, cm, 1, raster, swz, swap, split, **kw)

    have = [cand(128, 256), cand(128, 256, raster="m", swz=8), cand(128, 256, raster="n", swz=4),
            cand(256, 128, cm=2, swz=4),  # no plain 256x128/2x1 sibling: never paired
            cand(128, 256, split=True), cand(128, 256, swz=8, split=True),
            cand(64, 16, swap=True, k_cluster=2), cand(1, 4, gemv=True),
            cand(128, 128, pingpong=True), cand(128, 128, swz=8, pingpong=True)]
    pairs = diag.sample_pairs("heldout", 40, 20000.0, ["bf16"], lambda dtype: have)
    shapes = set(sample(SEEDS["heldout"], 40, 20000.0))
    assert pairs and {(p.m, p.n, p.k) for p in pairs} <= shapes
    labels = {p.label().split(" x")[0] for p in pairs}
    assert labels <= {"128x256/1x1/m8", "128x256/1x1/n4", "128x256/1x1/m8/splitk"}, labels
    for p in pairs:
        assert p.dtype == "bf16" and math.isnan(p.recorded) and not diag.walk(p.key, p.m, p.n).same
        if p.key[7]:
            assert p.key[8] == select.split_choices(cand(128, 256, split=True), p.m, p.n, p.k, 1,
                                                    132)[0]
    # a shape on one wave of tiles walks plainly under every band: none of its pairs
    assert all(diag.walk(p.key, p.m, p.n).waves > 1 for p in pairs)


def test_narrow_keeps_only_the_named_shapes_variants_and_long_k(diag):
    """--min-k, --shapes and --variants narrow --sample's pairs, each alone and
    together; an empty filter keeps everything."""
    key = (256, 128, 2, 1, "m", 4, False, False, 1)
    pairs = [diag.Pair(math.nan, "bf16", 11395, 4720, 53832, key, "fit sample"),
             diag.Pair(math.nan, "f16", 11395, 4720, 53832, key[:5] + (8,) + key[6:], "fit sample"),
             diag.Pair(math.nan, "bf16", 1796, 7640, 5672, key, "fit sample")]
    assert diag.narrow(pairs) == pairs
    assert diag.narrow(pairs, min_k=53832) == pairs[:2]
    assert diag.narrow(pairs, shapes=[(1796, 7640, 5672)]) == pairs[2:]
    assert diag.narrow(pairs, variants=["256x128/2x1/m4"]) == [pairs[0], pairs[2]]
    assert diag.narrow(pairs, 50000, [(11395, 4720, 53832), (1, 2, 3)], ["256x128/2x1/m8"]) == [pairs[1]]


def test_cli_lists_a_regime_sample_without_a_gpu():
    res = run_script("--list", "--regime", "5", "--seed", "7")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 6 and all("bands 1" in x and "regime seed 7" in x for x in lines[:5])
    res = run_script("--list", "--regime", "5", "--max-waves", "1")
    assert res.returncode == 2 and "--max-waves" in res.stderr


# ------------------------------------------- replay_selection / fit_model on gemv options
R9_HELDOUT = RAW / "2026-11-30_h200_r9_selection_heldout_bf16_raw.json.xz"


def test_replay_reads_gemv_options_and_its_picks_are_recorded_options():
    """The r9 held-out raw holds gemv options: they parse as gemv candidates
    (tokens x weight rows), and every replayed pick is one of the shape's
    recorded options, so each regret is a real recorded ratio (>= 1)."""
    sys.path.insert(0, str(BENCH))
    try:
        import fit_model  # noqa: PLC0415 - lives in benchmarks/
        import replay_selection  # noqa: PLC0415

        cand, splits = fit_model.parse_label("gemv2x4", "k")
        assert cand.gemv and (cand.tile_m, cand.tile_n, splits) == (2, 4, 1)
        shapes = fit_model.load(str(R9_HELDOUT))
        assert any(c.gemv for s in shapes for c, _, _ in s["opts"])
        out = replay_selection.replay(str(R9_HELDOUT))
        assert out["n"] == len(shapes) == 82
        assert all(r >= 1.0 for r, *_ in out["worst"])
        # Every shape's best option is one of its own: the ratio of best to
        # pick is the recorded regret, never below 1.
        assert 1.0 <= out["regret_median"] <= out["regret_p90"] <= out["regret_worst"]
    finally:
        sys.path.remove(str(BENCH))


def test_replay_model_overrides_replay_another_model_and_refuse_bad_ones():
    """--hbm-tbps and --model NAME=VALUE change the model the replay runs
    (r69 tried the H100's peak ratio, r70 its per-SM bandwidth), and a bad
    override is a usage error (exit 2) that names what is wrong."""
    script = str(BENCH / "replay_selection.py")

    def replay(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, script, *extra, str(R9_HELDOUT)],
                              capture_output=True, text=True, timeout=300)

    shipped, slower = replay(), replay("--hbm-tbps", "2.948")
    assert shipped.returncode == 0 and slower.returncode == 0, shipped.stderr + slower.stderr
    # The first line names the constants the replay ran with, the second its figures.
    assert shipped.stdout.splitlines()[0] == "model constants: as shipped"
    assert slower.stdout.splitlines()[0] == ("model constants: hbm_tbps=2.948 (overridden; the rest "
                                             "as shipped)")
    first = [r.stdout.splitlines()[1] for r in (shipped, slower)]
    assert all("n=82" in x for x in first) and first[0] != first[1]
    for bad in ("0", "-1", "nan"):
        res = replay("--hbm-tbps", bad)
        assert res.returncode == 2 and "--hbm-tbps" in res.stderr
    # --model sets any real-valued constant (r70: sm_gbps for the H100); it
    # refuses a name the model lacks, a pair without "=", a value that is not
    # a positive number, each a usage error naming what is wrong.
    other = replay("--model", "sm_gbps=50", "--model", "l2_share=1.25")
    assert other.returncode == 0, other.stderr
    assert other.stdout.splitlines()[0] == ("model constants: l2_share=1.25, sm_gbps=50 (overridden; "
                                            "the rest as shipped)")
    other_first = other.stdout.splitlines()[1]
    assert "n=82" in other_first and other_first != first[0]
    assert replay("--model", "hbm_tbps=2.948").stdout == slower.stdout
    for bad, named in (("sm_gbs=50", "'sm_gbs'"), ("swap_wide_min_m=3", "'swap_wide_min_m'"),
                       ("sm_gbps", "NAME=VALUE"), ("sm_gbps=fast", "'fast'"),
                       ("sm_gbps=0", "above 0"), ("sm_gbps=inf", "above 0")):
        res = replay("--model", bad)
        assert res.returncode == 2 and named in res.stderr, (bad, res.stderr)


# The decode grid measured with the shipped table (r11, a5bea6c): every
# option the table's rows name is recorded there.
DECODE_RAW = RAW / "2026-11-30_h200_r11_decode_a5bea6c_raw.json.xz"
R10_TABLE = [RAW / f"2026-11-30_h200_{p}_raw.json.xz"
             for p in ("r9_selection_table", "r10_selection_table_bf16_66", "r10_selection_table_f16_0")]


def test_replay_decode_takes_table_rows_and_model_picks_from_recorded_options():
    """The decode replay picks as select.choose does (the shipped table's
    exact row, else the row below whose tiles cover M, else the model); each
    pick is a recorded option, so the per-problem ratio is a real cuBLAS /
    ours; and the fit loader reads the same raw as shapes with every option
    parsed."""
    sys.path.insert(0, str(BENCH))
    try:
        import fit_model  # noqa: PLC0415 - lives in benchmarks/
        import replay_decode  # noqa: PLC0415

        table = str(BENCH.parent / "configs" / "sm90-h200.selection.json")
        rows = replay_decode.table_rows(table)
        assert (1, 4096, 4096, 1) in rows["bf16"]
        # Split count 0 is stream-K, which only a split-K variant (sched[7]) runs.
        assert all(isinstance(sched, tuple) and (splits >= 1 or (splits == 0 and sched[7]))
                   for sched, splits, *_ in rows["f16"].values())
        out = replay_decode.replay(str(DECODE_RAW), table)
        assert out["n"] == 128 and sum(out["sources"].values()) == 128
        # The grid's M = 2, 4, 16 are not table rows; most take a row below.
        assert out["sources"]["table"] > 0 and out["sources"]["table-below"] > 0
        assert set(out["by_m"]) == {1, 2, 4, 8, 16, 32, 64, 128}
        assert 1.0 <= out["regret"] <= out["regret_worst"]
        alone = replay_decode.replay(str(DECODE_RAW), None)
        assert set(alone["sources"]) <= {"model", "model (untimed split)"}
        assert alone["regret"] > out["regret"]
        shapes = fit_model.load_decode(str(DECODE_RAW))
        assert len(shapes) == 128 and all(s["best"] == min(o[2] for o in s["opts"]) for s in shapes)
        assert any(c.gemv for s in shapes for c, _, _ in s["opts"])
        assert any(c.k_cluster > 1 for s in shapes for c, _, _ in s["opts"])
    finally:
        sys.path.remove(str(BENCH))


def test_merge_of_parts_replaces_by_shape_and_counts_re_timed_pairs(tmp_path):
    """heldout_merge.py over the table parts: a later part's record of a
    (dtype, shape) replaces an earlier one, and a re-timing report's pick
    (rank 1) replaces the live regret."""
    report = tmp_path / "retime.md"
    report.write_text("# x\n\n## 512x4096x4096\n\n| option | median µs | min | max | vs best | est µs | rank |\n"
                      "|---|---|---|---|---|---|---|\n| a | 1.0 | 1.0 | 1.0 | 1.000 | 1.0 | 2 |\n"
                      "| b | 1.5 | 1.5 | 1.5 | 1.500 | 1.0 | 1 |\n")
    out = tmp_path / "merged.md"
    proc = subprocess.run([sys.executable, str(BENCH / "heldout_merge.py"), *map(str, R10_TABLE),
                           "--retime", f"bf16:{report}", "--out", str(out)],
                          capture_output=True, text=True, cwd=BENCH.parent, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    # 66 + 27 bf16 rows (r9's first 66, then r10's 67-93) and 92 f16.
    assert "- bf16: n=93 (1 re-timed)" in text and "- f16: n=92 (0 re-timed)" in text
    assert "| bf16 | 512x4096x4096 | b | 1.500 |" in text


R52_H100_F16 = [RAW / f"2026-12-05_h100_r52_selection_heldout_f16_{p}0788332_raw.json.xz"
                for p in ("", "start55_")]


def test_merge_of_parts_measured_where_no_table_applies_scores_the_mode_asked(tmp_path):
    """An H100 run has no dispatch records (the shipped table names the H200):
    the default mode says so and names the modes the record has, instead of a
    KeyError; --mode model and --mode autotune score those picks."""
    def merge(*extra):
        return subprocess.run([sys.executable, str(BENCH / "heldout_merge.py"), *map(str, R52_H100_F16),
                               *extra], capture_output=True, text=True, cwd=BENCH.parent, timeout=300)

    proc = merge()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "has no dispatch record (it has: model, autotune); pass --mode" in proc.stderr
    figures = {}
    for mode in ("model", "autotune"):
        proc = merge("--mode", mode)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"Picks scored: {mode} mode." in proc.stdout
        line = next(x for x in proc.stdout.splitlines() if x.startswith("- f16: n=105 "))
        figures[mode] = float(line.split("pick / cuBLAS ")[1].split(";")[0])
    # these parts: autotune 1.089, model 1.065 (autotune times the model's 6 best)
    assert figures["autotune"] >= figures["model"] > 0


# The probes check their arguments before they import torch or touch a GPU:
# a bad one is a usage error (exit 2) that names it, never a traceback.
@pytest.mark.parametrize("script, args, message", [
    ("option_retime", ("--shapes", "12x34"), "'12x34' is not MxNxK"),
    ("option_retime", ("--shapes", "1x2x0"), "'1x2x0' is not MxNxK"),
    ("option_retime", ("--shapes", "8x8x8", "--rounds", "0"), "--rounds and --reps"),
    ("pitch_probe", ("--shapes", "8192x8200"), "'8192x8200' is not MxNxK"),
    ("pitch_probe", ("--top", "0"), "--top and --rounds"),
    ("pitch_probe", ("--rounds", "0"), "--top and --rounds"),
    ("sustained_probe", ("--shapes", "1x2"), "'1x2' is not MxNxK"),
    ("sustained_probe", ("--shapes", "8x8x8", "--seconds", "0"), "--seconds and --window-ms"),
    ("sustained_probe", ("--shapes", "8x8x8", "--sample-ms", "5"), "--sample-ms at least 10"),
    ("sustained_probe", ("--shapes", "8x8x8", "--cool-s", "-1"), "--cool-s and --steady-ms not negative"),
    ("sustained_probe", ("--shapes", "8x8x8", "--steady-ms", "-5"), "--cool-s and --steady-ms not negative"),
    ("tile_probe", ("--tiles", "192"), "'192' is not a tile MxN"),
    ("tile_probe", ("--tiles", "192x0"), "'192x0' is not a tile MxN"),
    ("tile_probe", ("--tiles", "192x192", "--splits", "0"), "--splits must be at least 1"),
    ("tile_probe", ("--tiles", "128x144", "--clusters", "4"), "'4' is not a tile MxN"),
    ("pick_ab", ("plan", "--out", "x.json"),
     "one of the arguments --without-tiles --against-best --old-model --from-plan --table-change is required"),
    ("pick_ab", ("plan", "--table-change", "old", "--out", "x.json"),
     "--table-change OLD_CACHE goes with --cache-dir NEW and --widths NxK"),
    ("pick_ab", ("plan", "--without-tiles", "192x128", "--cluster-rivals", "2", "--out", "x.json"),
     "--cluster-rivals N wants N >= 0, with --against-best or --from-plan"),
    ("pick_ab", ("plan", "--from-plan", "missing.json", "--out", "x.json"), "No such file"),
    ("pick_ab", ("plan", "--without-tiles", "192", "--out", "x.json"), "'192' is not a tile MxN"),
    ("pick_ab", ("plan", "--without-tiles", "192x128", "--samples", "fit,other", "--out", "x.json"),
     "want fit, heldout or both"),
    ("pick_ab", ("plan", "--without-tiles", "192x128", "--cache-dir", "/nonexistent/cache",
                 "--out", "x.json"), "does not exist"),
    ("pick_ab", ("plan", "--old-model", "missing.json", "--out", "x.json"), "No such file"),
    ("pick_ab", ("time", "pairs.json", "--rounds", "0"), "--rounds must be at least 1"),
    ("harness_ab", ("--pairs", "bf16:bias:1x2:A:B"), "bad shape"),
    ("harness_ab", ("--pairs", "bf16:relu:1x2x3:A:B"), "want dtype:plain|bias|gelu:MxNxK:A:B"),
    ("harness_ab", ("--pairs", "bf16:bias:1x2x3:A:B", "--rounds", "0"), "--rounds must be at least 1"),
    ("with_c_edge", ("--old-cache", "x", "--shapes", "100x12x64"), "N, K multiples of 8"),
    ("with_c_edge", ("--old-cache", "x", "--shapes", "100x64"), "want MxNxK"),
    ("with_c_edge", ("--old-cache", "x", "--rounds", "0"), "--rounds must be at least 1"),
    ("with_c_edge", (), "the following arguments are required: --old-cache"),
    ("with_c_edge", ("--old-cache", "x", "--sample", "4", "--random", "4"), "two samples: pick one"),
    ("with_c_edge", ("--old-cache", "x", "--random", "4", "--max-gflop", "0"), "--max-gflop above 0"),
    ("with_c_replay", ("--old-cache", "x", "--sample", "0", "--random", "0"), "not both 0"),
    ("with_c_replay", ("--old-cache", "x", "--max-gflop", "-1"), "--max-gflop must be above 0"),
    ("bench_odd_edge", ("--samples", "suite,fit"), "want suite, heldout or both"),
    ("bench_odd_edge", ("--dtypes", "f32"), "want bf16, f16 or both"),
    ("bench_odd_edge", ("--count", "0"), "--count must be at least 1"),
    ("bench_selection", ("--steady-ms", "-1"), "--steady-ms must be a finite number of ms"),
    ("bench_selection", ("--steady-ms", "nan"), "--steady-ms must be a finite number of ms"),
    ("bench_model", ("--tokens", "128,2048", "--profile", "8192"), "each must be one of --tokens"),
    ("bench_model", ("--tokens", "12a"), "want comma-separated integers"),
])
def test_probes_refuse_bad_arguments_before_touching_a_gpu(script, args, message, tmp_path):
    res = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr


# ------------------------------------------- streamk_order (stream-K piece order A/B)
def _load_bench(name: str):
    import importlib.util  # noqa: PLC0415

    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_streamk_order_sample_is_the_regime_it_names():
    sko = _load_bench("streamk_order")
    shapes = sko.sample_shapes(40, seed=5005)
    assert shapes == sko.sample_shapes(40, seed=5005) != sko.sample_shapes(40, seed=5006)
    for dtype, m, n, k, label in shapes:
        tm, tn = map(int, label.split("/")[0].split("x"))
        cm = int(label.split("/")[1][0])
        slots = 132 // cm
        clusters = math.ceil(math.ceil(m / tm) / cm) * math.ceil(n / tn)
        tail = clusters % slots
        assert slots // 2 < tail < slots, (m, n, k, label)  # most runs cross a tile edge
        assert 2 <= -(-n // tn) <= 4 and n % 8 == 0 and 4096 <= k <= 57344 and k % 8 == 0
        assert label.endswith("/streamk") and dtype in ("bf16", "f16")


def test_streamk_order_reads_stream_k_pairs_from_raws():
    sko = _load_bench("streamk_order")
    raw = str(RAW / "2026-12-01_h200_r18_selection_heldout_bf16_minm257_54_raw.json.xz")
    pairs = sko.raw_pairs([raw], 1.01)
    assert pairs and all(p[4].endswith("/streamk") and p[0] == "bf16" for p in pairs)
    assert len(set(pairs)) == len(pairs)
    # every pair's option is in the raw, within 1% of the best or the model's pick
    recs = {(r["m"], r["n"], r["k"]): r for r in sko.load_raw(raw)}
    for _, m, n, k, label in pairs:
        r = recs[(m, n, k)]
        t = {o[0]: o[3] for o in r["options"]}
        assert label == r["dispatch"]["pick"] or t[label] <= 1.01 * r["best_us"]
    res = subprocess.run([sys.executable, str(BENCH / "streamk_order.py"), "--list", "--sample", "3",
                          "--within", "1.01", "--from-raw", raw], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith(f"{len(pairs) + 3} pairs")
    res = subprocess.run([sys.executable, str(BENCH / "streamk_order.py"), "--sample", "2"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--old" in res.stderr and "Traceback" not in res.stderr


# ------------------------------------------- pitch_ncu (Nsight Compute CSV -> tables)
R19_NCU = RAW / "2026-12-02_h200_r19_pitch_ncu.csv.xz"


def test_pitch_ncu_report_reads_the_recorded_ncu_csv(tmp_path):
    import lzma  # noqa: PLC0415

    ncu = _load_bench("pitch_ncu")
    csv_path = tmp_path / "ncu.csv"
    csv_path.write_text(lzma.open(R19_NCU, "rt").read())
    rows = ncu.parse(csv_path.read_text())
    assert len(rows) == 32  # 4 shapes x 4 layouts x (ours, cuBLAS)
    assert all(r["Kernel Name"].count("|") == 2 for r in rows)  # each renamed by its NVTX range
    out = tmp_path / "ncu.md"
    ncu.report(str(csv_path), str(out))
    text = out.read_text()
    for shape in ("5328x808x1704", "1150x8120x6024", "4180x1160x6536", "4096x4096x4104"):
        assert f"## {shape}\n" in text
    # what r19 read off it: a misaligned A and B double the L2 read requests of our 256x144 tile
    line = next(x for x in text.splitlines() if x.startswith("| ours 256x144/1x1/m1 | contiguous"))
    assert line.split("|")[-2].strip() == "1.78"
    empty = tmp_path / "empty.csv"
    empty.write_text("==PROF== nothing profiled\n")
    with pytest.raises(SystemExit, match="no kernel rows"):
        ncu.report(str(empty), str(out))


def test_walk_ncu_reads_cases_and_reports_dram_against_the_operands_once(tmp_path):
    """walk_ncu.py: --cases parses, and report() turns ncu's CSV (rows renamed
    option|shape/kernel by their NVTX ranges) into one table per shape with
    DRAM read over the bytes A, B and D need once."""
    ncu = _load_bench("walk_ncu")
    cases = ncu.cases_arg("9711x8568x57192:128x256/1x1/m1,128x256/1x1/n4;64x64x64:64x128/1x1/m1")
    assert cases == [((9711, 8568, 57192), ["128x256/1x1/m1", "128x256/1x1/n4"]),
                     ((64, 64, 64), ["64x128/1x1/m1"])]
    for bad in ("9711x8568:128x256/1x1/m1", "64x64x64:"):
        with pytest.raises(argparse.ArgumentTypeError):
            ncu.cases_arg(bad)
    once = ncu.once_mb(9711, 8568, 57192)
    metrics = _load_bench("pitch_ncu").METRICS
    cols = ['"ID"', '"Kernel Name"'] + [f'"{m}"' for m in metrics]
    units = ['""', '""'] + ['""'] * len(metrics)

    def row(i, label, ms, dram_gb, hit, kernel="kernel_cutlass_x"):
        vals = {"gpu__time_duration.sum": ms * 1e6, "dram__bytes_read.sum": dram_gb * 1e9,
                "lts__t_sector_op_read_hit_rate.pct": hit}
        return ",".join([f'"{i}"', f'"{label}|9711x8568x57192/{kernel}"']
                        + [f'"{vals.get(m, 1.0)}"' for m in metrics])

    csv_path = tmp_path / "walk.csv"
    csv_path.write_text("==PROF== Connected\n" + ",".join(cols) + "\n" + ",".join(units) + "\n"
                        + row(0, "128x256/1x1/m1", 20.5, once / 1e3 * 20, 80.0) + "\n"
                        + row(1, "128x256/1x1/n4", 23.3, once / 1e3 * 35, 60.0) + "\n"
                        + row(2, "cuBLAS", 14.1, once / 1e3 * 9, 85.0,
                              kernel="nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_TNT") + "\n")
    out = tmp_path / "walk.md"
    ncu.report(str(csv_path), str(out))
    text = out.read_text()
    assert "## 9711x8568x57192 (A, B and D once: 2.26 GB)" in text
    lines = [x for x in text.splitlines() if x.startswith("| 128x256/1x1/")]
    assert [x.split("|")[-2].strip() for x in lines] == ["20.00", "35.00"]
    assert lines[1].split("|")[2].strip() == "23.3"
    # cuBLAS's row names the kernel torch.mm launched (its tile and cluster)
    cub = [x for x in text.splitlines() if x.startswith("| cuBLAS ")]
    assert cub and "nvjet_sm90_tst_256x128_64x4_2x1" in cub[0] and cub[0].split("|")[-2].strip() == "9.00"


# ------------------------------------------- tile_probe (new tiles against the recorded best)
def test_tile_probe_takes_every_new_plain_option_and_the_best_splits():
    from cutlass_aot.run import select  # noqa: PLC0415

    probe = _load_bench("tile_probe")
    cands = [select.Candidate("a", 192, 192, 1, 1), select.Candidate("b", 192, 192, 1, 2),
             select.Candidate("c", 192, 128, 1, 1, split_k=True),
             select.Candidate("d", 128, 256, 2, 1), select.Candidate("e", 128, 256, 1, 1, split_k=True)]
    m, n, k = 4180, 1160, 6536
    ranked = select.ranked_choices(cands, m, n, k, 1, 132)
    got = probe.probe_options(ranked, {(192, 192), (192, 128)}, 2)
    plain = [ch for ch in got if not ch.candidate.split_k]
    split = [ch for ch in got if ch.candidate.split_k]
    assert {ch.candidate.key for ch in plain} == {"a", "b"}
    # The split-K candidate's two best split counts by estimate, in the model's order.
    c_splits = [ch for _, ch in ranked if ch.candidate.key == "c"]
    assert split == c_splits[:2] and len(c_splits) > 2
    assert all((ch.candidate.tile_m, ch.candidate.tile_n) != (128, 256) for ch in got)


def test_tile_probe_clusters_narrow_the_options_to_those_clusters():
    from cutlass_aot.run import select  # noqa: PLC0415

    probe = _load_bench("tile_probe")
    cands = [select.Candidate("a", 128, 144, 1, 1, swap_ab=True),
             select.Candidate("b", 128, 144, 2, 1, swap_ab=True),
             select.Candidate("c", 128, 144, 4, 1, swap_ab=True, split_k=True),
             select.Candidate("d", 128, 256, 4, 1, swap_ab=True)]
    ranked = select.ranked_choices(cands, 142, 12928, 5456, 1, 132)
    got = probe.probe_options(ranked, {(128, 144)}, 1, {(2, 1), (4, 1)})
    assert {ch.candidate.key for ch in got} == {"b", "c"}
    assert sum(ch.candidate.key == "c" for ch in got) == 1  # --splits 1
    assert {ch.candidate.key for ch in probe.probe_options(ranked, {(128, 144)}, 1)} == {"a", "b", "c"}


def test_cublas_kernel_names_give_tile_stages_and_cluster():
    ck = _load_bench("cublas_kernels")
    assert ck.config("nvjet_sm90_tst_128x144_64x6_4x1_v_bz_TNT") == "128x144 k64x6 c4x1"
    assert ck.config("nvjet_sm90_hsh_96x64_64x10_2x4_h_bz_splitK_TNN") == "96x64 k64x10 c2x4"
    assert ck.config("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cluster2x1x1_"
                     "warpgroupsize2x1x1_execute_segment_k_off_kernel") == "128x256 k64 c2x1"
    assert ck.config("void cublasLt::splitKreduce_kernel<32, 16, int, float>") == ""


def test_tile_probe_reads_recorded_bests_and_summarises_gains(tmp_path):
    probe = _load_bench("tile_probe")
    best = _load_bench("_common").recorded_best([str(RAW / "2026-12-01_h200_r16_selection_fit_raw.json.xz")])
    assert len(best) == 81 and all(k[0] == "bf16" for k in best)
    raw = [{"cublas_us": 10.0, "old_best_us": 12.0, "new_best_us": 10.0, "model_us": 12.0,
            "class": "other"},
           {"cublas_us": 10.0, "old_best_us": 9.0, "new_best_us": 9.9, "model_us": 9.0,
            "class": "large"}]
    text = probe.summary(raw)
    assert "- shapes: 2" in text
    assert "new faster by > 2% on 1, slower by > 2% on 1" in text
    # best of both: 10/10 and 10/9 -> geomean 1.054
    assert "- best of both / cuBLAS: geomean 1.054" in text


# ------------------------------------------- pick_ab (two picks per shape, timed together)
def test_pick_ab_best_known_prefers_what_the_probe_timed_faster(tmp_path):
    import json  # noqa: PLC0415

    pab = _load_bench("pick_ab")
    sweep = tmp_path / "sweep.json"
    probe = tmp_path / "probe.json"
    sweep.write_text(json.dumps([
        {"dtype": "bf16", "m": 300, "n": 512, "k": 64, "best": "128x256/2x1/m1"},
        {"dtype": "bf16", "m": 64, "n": 512, "k": 64, "best": "64x128/1x1/m1"}]))
    probe.write_text(json.dumps([
        {"dtype": "bf16", "m": 300, "n": 512, "k": 64, "best": "x", "old_best": "128x256/2x1/m1",
         "old_best_us": 10.0, "new_best": "192x128/1x2/m1", "new_best_us": 9.0}]))
    pairs = pab.against_best([str(sweep), str(probe)])
    assert [(p["sample"], p["m"], p["a"], p["b"]) for p in pairs] == [
        ("M <= 256", 64, "64x128/1x1/m1", "dispatch"), ("M >= 257", 300, "192x128/1x2/m1", "dispatch")]
    # An option the cache no longer ships gives way to the next fastest: the
    # probe's old best; a sweep's next option by time (none left: no pair).
    sweep.write_text(json.dumps([
        {"dtype": "bf16", "m": 64, "n": 512, "k": 64, "best": "64x128/1x1/m1",
         "options": [["64x128/1x1/m1", "k1", 1, 5.0, 5.0], ["128x128/1x1/m1", "k2", 1, 6.0, 6.0],
                     ["64x256/1x1/m1", "k3", 1, 5.5, 5.0]]},
        {"dtype": "f16", "m": 64, "n": 512, "k": 64, "best": "64x128/1x1/m1",
         "options": [["64x128/1x1/m1", "k1", 1, 5.0, 5.0]]}]))
    gone = {"192x128/1x2/m1", "64x128/1x1/m1"}
    pairs = pab.against_best([str(sweep), str(probe)], lambda d, label: label not in gone)
    assert [(p["dtype"], p["m"], p["a"]) for p in pairs] == [
        ("bf16", 64, "64x256/1x1/m1"), ("bf16", 300, "128x256/2x1/m1")]
    # A pick_ab.py pair (A and B timed together) gives the faster of the two.
    ab = tmp_path / "ab.json"
    ab.write_text(json.dumps([
        {"dtype": "bf16", "m": 64, "n": 512, "k": 64, "a": "64x128/1x1/m1", "a_us": 5.0,
         "b": "64x96/1x2/m1", "b_us": 4.5, "cublas_us": 5.0},
        {"dtype": "f16", "m": 64, "n": 512, "k": 64, "a": "64x128/1x1/m1", "a_us": 5.0,
         "b": "64x96/1x2/m1", "b_us": 5.5, "cublas_us": 5.0}]))
    assert [(p["dtype"], p["a"]) for p in pab.against_best([str(ab)])] == [
        ("bf16", "64x96/1x2/m1"), ("f16", "64x128/1x1/m1")]
    # A later run that never timed the known best does not replace it with
    # something slower; one that timed both decides between them.
    later = tmp_path / "later.json"
    later.write_text(json.dumps([
        {"dtype": "bf16", "m": 64, "n": 512, "k": 64, "best": "128x128/1x1/m1", "best_us": 5.2,
         "options": [["128x128/1x1/m1", "k2", 1, 5.2, 6.0], ["64x128/1x1/m1", "k1", 1, 5.3, 5.0]]}]))
    assert [(p["dtype"], p["a"]) for p in pab.against_best([str(ab), str(later)])][0] == (
        "bf16", "64x96/1x2/m1")
    later.write_text(json.dumps([
        {"dtype": "bf16", "m": 64, "n": 512, "k": 64, "best": "128x128/1x1/m1", "best_us": 5.2,
         "options": [["128x128/1x1/m1", "k2", 1, 5.2, 6.0], ["64x96/1x2/m1", "k4", 1, 5.6, 5.0]]}]))
    assert [(p["dtype"], p["a"]) for p in pab.against_best([str(ab), str(later)])][0] == (
        "bf16", "128x128/1x1/m1")
    raw = [{"sample": "g", "a_us": 10.0, "b_us": 12.0, "cublas_us": 10.0},
           {"sample": "g", "a_us": 10.0, "b_us": 9.0, "cublas_us": 10.0},
           {"sample": "h", "a_us": 10.0, "b_us": 10.0, "cublas_us": 10.0}]
    text = pab.summary(raw)
    assert "| g | 2 |" in text and "| all | 3 |" in text
    assert "| 1 | 1 |" in text  # in g, B faster > 2% once and slower > 2% once


def test_pick_ab_shipped_labels_match_schedules_whatever_the_split_count(monkeypatch):
    from cutlass_aot.run import select  # noqa: PLC0415

    pab = _load_bench("pick_ab")
    cands = [select.Candidate("a", 128, 256, 2, 1, split_k=True),
             select.Candidate("g", 1, 2, 1, 1, gemv=True), select.Candidate("s", 256, 144, 1, 2, swap_ab=True)]
    monkeypatch.setattr(pab, "linear_candidates", lambda cache, d, sms: (sms, cands))
    usable = pab.shipped_labels(None, ["bf16"], 132)
    for label in ("128x256/2x1/m1/splitkx4", "128x256/2x1/m1/streamk", "gemv1x2", "256x144/1x2/m1/swap"):
        assert usable("bf16", label), label
    for label in ("128x256/2x1/m1", "256x144/1x2/m1", "256x144/2x1/m1/swap", "gemv1x4"):
        assert not usable("bf16", label), label
    assert not usable("f16", "gemv1x2")


def test_pick_ab_table_change_refuses_a_width_the_manifest_does_not_tune(tmp_path):
    import argparse  # noqa: PLC0415

    pab = _load_bench("pick_ab")
    args = argparse.Namespace(widths="1024x4096,1000x4096", dtypes="bf16", manifest=str(BENCH.parent / "configs" / "sm90.yaml"),
                              count=4, seed=72, max_m=16384, table_change=str(tmp_path), cache_dir=str(tmp_path),
                              gpu="H100")
    with pytest.raises(ValueError, match="tunes no bf16 problem at 1000x4096"):
        pab.table_change(args)
    args.widths = "1024x4096,1024"
    with pytest.raises(ValueError, match="'1024' is not NxK"):
        pab.table_change(args)


def test_pick_ab_table_change_at_random_widths_explains_the_benchmark_sample_in_both_caches(
        cache_copy, capsys):
    """``--widths random``: the selection benchmark's seeded sample at any width,
    resolved under both caches' tables for the GPU named; the same cache twice
    moves nothing, and the sample is bench_selection's at that seed."""
    from cutlass_aot.builder.store import CacheStore  # noqa: PLC0415
    from cutlass_aot.layout import read_index  # noqa: PLC0415

    rec = next(r for r in read_index(cache_copy)["entries"].values() if "c=-" in r["signature_text"])
    CacheStore(cache_copy).publish_table({  # a table for the H200, so that --gpu resolves
        "format": "cutlass-aot-selection", "version": 1,
        "gpu": {"name": "NVIDIA H200", "sm_count": 132, "capability": "9.0"},
        "rows": [{"signature": rec["signature_text"], "family": rec["family"], "kernel_sources": "x" * 64,
                  "m": 7, "n": 4096, "k": 4096, "l": 1, "splits": 1, "us": 10.0,
                  "variant": {"tile": rec["variant"]["tile"], "cluster": rec["variant"]["cluster"]}}]})
    pab = _load_bench("pick_ab")
    args = argparse.Namespace(widths="random", dtypes="bf16", manifest=None, count=12, seed=73,
                              max_m=16384, table_change=str(cache_copy), cache_dir=str(cache_copy),
                              gpu="H200")
    assert pab.table_change(args) == []
    assert "bf16: 12 random shapes, 0 moved" in capsys.readouterr().out


def test_bench_model_gemm_order_names_each_product_and_leaves_no_hook():
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415

    bm = _load_bench("bench_model")

    class Rotary(nn.Module):  # a product no Linear makes, as transformers' rotary embedding's
        def forward(self, x):
            return x + (torch.ones(1, 4, 1) @ torch.ones(1, 1, 8)).sum()

    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), Rotary(),
                          nn.Sequential(nn.Linear(16, 4), nn.Linear(4, 8)))
    order = bm.gemm_order(model, lambda m, x: m(x), (torch.randn(2, 3, 8),))
    assert order == [("0", "6x16x8", "torch.float32"), ("(matmul)", "4x8x1", "torch.float32"),
                     ("3.0", "6x4x16", "torch.float32"), ("3.1", "6x8x4", "torch.float32")]
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_bench_model_profile_sorts_kernels_by_kind():
    bm = _load_bench("bench_model")
    assert bm.kernel_kind("kernel_cutlass_aot_kernels_sm90_gemm_Sm90Gemm_kernel_0") == "ours"
    assert bm.kernel_kind("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT") == "cuBLAS"
    assert bm.kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "cuBLAS"
    assert bm.kernel_kind("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>") == "attention"
    assert bm.kernel_kind("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "inductor (Triton)"
    assert bm.kernel_kind("triton_poi_fused_gemm_out_mul_silu_t_view_8") == "inductor (Triton)"
    assert bm.kernel_kind("triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy_1") == "inductor (Triton)"
    assert bm.kernel_kind("void at::native::elementwise_kernel<128, 2>") == "other"
    text = bm.render_profile(8192, {"compiled": ({"nvjet_tst_x": (1500.0, 2), "triton_poi_y": (250.0, 5)},
                                                 [700.0, 800.0]),
                                    "patched+compiled": ({"kernel_cutlass_z": (1600.0, 2)}, [650.0, 950.0])})
    assert "| # | product (MxNxK) | compiled | patched+compiled |" in text and "| 2 |  | 800.0 | 950.0 |" in text
    named = bm.render_profile(8192, {"compiled": ({"nvjet_tst_x": (1500.0, 2)}, [700.0, 800.0]),
                                     "patched": ({"kernel_cutlass_z": (900.0, 3)}, [300.0, 300.0, 300.0])},
                              order=[("(matmul)", "64x8192x1", "torch.float32"),
                                     ("lm_head", "8192x128256x4096", "torch.bfloat16")])
    assert "| 1 | `(matmul)` 64x8192x1 float32 | 700.0 | 300.0 |" in named
    assert "| 2 | `lm_head` 8192x128256x4096 | 800.0 | 300.0 |" in named
    assert "patched: a launch count other than the 2 products" in named
    assert "| compiled | 0.000 | 0.250 | 1.500 | 0.000 | 0.000 | 1.750 | | | 7 |" in text
    assert "| patched+compiled | 1.600 | 0.000 | 0.000 | 0.000 | 0.000 | 1.600 | | | 2 |" in text
    spanned = bm.render_profile(2048, {"patched": ({"kernel_cutlass_z": (900.0, 3)}, [300.0] * 3, 1250.0)})
    assert "| patched | 0.900 | 0.000 | 0.000 | 0.000 | 0.000 | 0.900 | 1.250 | 0.350 | 3 |" in spanned
    assert "| `nvjet_tst_x` | cuBLAS | 2 | 1.500 |" in text
    # Kernel events in any order: per-name shares of the stream, and the GEMMs in launch order
    # with a split GEMM's reduction added to the GEMM before it. A kernel that starts before
    # the one ahead of it ends (ours launch the next early) counts from that end.
    from types import SimpleNamespace  # noqa: PLC0415

    def evt(name, start, us):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, elapsed_us=lambda: us))
    times, gemms, span = bm.summarize_kernels([
        evt("kernel_cutlass_reduce_kernel_cutlass_aot_Sm90Gemm_1", 30.0, 5.0),
        evt("kernel_cutlass_kernel_cutlass_aot_Sm90Gemm_0", 0.0, 20.0),
        evt("triton_poi_fused_mul_silu_0", 25.0, 2.0),
        evt("kernel_cutlass_kernel_cutlass_aot_Sm90Gemm_0", 26.0, 3.0),
        evt("nvjet_tst_128x128", 50.0, 7.0),
        evt("kernel_cutlass_kernel_cutlass_aot_Sm90Gemm_0", 52.0, 30.0),  # launched early: waits to 57
        evt("kernel_cutlass_kernel_cutlass_aot_Sm90Gemm_0", 60.0, 40.0)])  # waits to 82
    assert gemms == [20.0, 7.0, 7.0, 25.0, 18.0]
    assert times["kernel_cutlass_kernel_cutlass_aot_Sm90Gemm_0"] == (20.0 + 2.0 + 25.0 + 18.0, 4)
    assert times["triton_poi_fused_mul_silu_0"] == (2.0, 1)
    # from the first start (0) to the last end (100): 67 µs of kernels, 33 idle (29-30, 33-50)
    assert span == 100.0
    assert bm.summarize_kernels([]) == ({}, [], 0.0)


def test_pick_ab_plan_lists_the_shapes_whose_pick_the_new_tiles_move():
    from cutlass_aot.run import select  # noqa: PLC0415

    pab = _load_bench("pick_ab")
    cands = [select.Candidate("a", 128, 256, 2, 1), select.Candidate("s", 128, 144, 1, 1, swap_ab=True),
             select.Candidate("k", 256, 160, 1, 1, split_k=True), select.Candidate("t", 192, 160, 1, 2)]
    shapes = [(12371, 296, 9400), (142, 12928, 5456)]
    got = pab.changed_picks(cands, shapes, pab.without_arg("192x160"), 132)
    # Moved at 12371 rows; not at 142, below the rows the 192-row constants were fitted on.
    assert [(g["m"], g["b"]) for g in got] == [(12371, "192x160/1x2/m1")]
    assert got[0]["a"] != got[0]["b"]
    # A tile-and-cluster entry drops only that cluster shape of the tile.
    assert pab.changed_picks(cands, shapes, pab.without_arg("192x160/2x1"), 132) == []
    assert pab.changed_picks(cands, shapes, pab.without_arg("192x160/1x2"), 132) == got
    assert pab.changed_picks(cands, shapes, pab.without_arg("192x160/1x2/swap"), 132) == []


def test_pick_ab_cluster_rivals_pair_the_leading_3_4_cta_options_and_score_per_shape(tmp_path):
    import json  # noqa: PLC0415

    from cutlass_aot.run import select  # noqa: PLC0415

    pab = _load_bench("pick_ab")
    cands = [select.Candidate("a", 128, 256, 2, 1), select.Candidate("q", 128, 128, 4, 1),
             select.Candidate("r", 128, 128, 2, 2), select.Candidate("s", 128, 128, 1, 4)]
    plan = [{"sample": "M >= 257", "dtype": "bf16", "m": 4096, "n": 4096, "k": 4096,
             "a": "128x128/2x2/m1", "b": "dispatch"}]
    rivals = pab.cluster_rivals(plan, lambda d: cands, 2, 132)
    # Two options with four CTAs, never the pair's own A again, never the 2-CTA one.
    assert len(rivals) == 2 and all(r["rival"] and r["b"] == "dispatch" for r in rivals)
    assert {r["a"] for r in rivals} <= {"128x128/4x1/m1", "128x128/1x4/m1"}
    # A stored plan round-trips (its rivals dropped); a file of something else is refused.
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan + rivals))
    assert pab.load_plan(str(path)) == plan
    path.write_text(json.dumps([{"m": 1}]))
    with pytest.raises(ValueError, match="not a plan of best-known pairs"):
        pab.load_plan(str(path))
    # Per shape, the regret is B against the fastest A timed beside it.
    raw = [{**plan[0], "b": "x", "a_us": 10.0, "b_us": 11.0, "cublas_us": 12.0},
           {**rivals[0], "b": "x", "a_us": 8.0, "b_us": 10.8, "cublas_us": 12.0}]
    text = pab.per_shape(raw)
    assert "| M >= 257 | 1 | 1.350 | 1.350 | 1.350 | 1.350 | 1 | 1 | 1 | 1.500 |" in text


def test_pick_ab_without_tiles_refuses_a_malformed_entry():
    import argparse  # noqa: PLC0415

    pab = _load_bench("pick_ab")
    assert pab.without_arg("256x144, 256x160/1x2,256x128/2x1/swap") == {
        (256, 144, None, False), (256, 160, (1, 2), False), (256, 128, (2, 1), True)}
    for bad in ("256x", "256x144/2", "256x144/2x1/m1", "x/1x2", "256x144/swap/swap"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a tile"):
            pab.without_arg(bad)


def test_pick_ab_plan_old_model_moves_picks_and_restores_the_constants(tmp_path):
    import json  # noqa: PLC0415

    from cutlass_aot.run import select  # noqa: PLC0415

    pab = _load_bench("pick_ab")
    path = tmp_path / "old.json"
    # r20's values of the three short-K terms (2026-12-02_r21_old_model.json).
    path.write_text(json.dumps({"MODEL": {"epi_hbm": 0.0, "l2_resident_share": 1.4256, "reread_add": 0.0},
                                "PINGPONG": {"unit_share": 0.35}}))
    old = pab.load_constants(str(path))
    before = (dict(select.MODEL), dict(select.TILE_EFFICIENCY), dict(select.PINGPONG["efficiency"]),
              select.PINGPONG["unit_share"])
    cands = [select.Candidate("c", 128, 256, 2, 1), select.Candidate("s", 128, 256, 2, 1, split_k=True),
             select.Candidate("p", 128, 128, 2, 1, pingpong=True), select.Candidate("w", 128, 192, 2, 1)]
    got = pab.model_changed_picks(cands, [(5281, 4768, 608), (4096, 4096, 4096)], old, 132)
    assert [(g["m"], g["a"]) for g in got] == [(5281, "128x256/2x1/m1/splitkx4")]
    assert (dict(select.MODEL), dict(select.TILE_EFFICIENCY), dict(select.PINGPONG["efficiency"]),
            select.PINGPONG["unit_share"]) == before
    path.write_text(json.dumps({"PINGPONG": {"efficiency": {"128": 0.7}}}))
    with pytest.raises(ValueError, match="'128' is not a tile MxN"):
        pab.load_constants(str(path))



R33_RETIME_FIT = RAW / "2026-12-03_h200_r33_cluster_grid_retime_fit_d6ad222_raw.json.xz"
R24_PROBE_FIT = RAW / "2026-12-02_h200_r24_tile_probe_swapclusters_fit_raw.json.xz"
R31_PAIRS_FIT = RAW / "2026-12-03_h200_r31_tile_probe_tokenpairs_fit_ad9dd09_raw.json.xz"


def run_bench(name: str, *args) -> subprocess.CompletedProcess:
    """A benchmark script run from benchmarks/ (it imports its siblings), which must exit 0."""
    proc = subprocess.run([sys.executable, str(BENCH / name), *map(str, args)],
                          capture_output=True, text=True, cwd=BENCH, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_fit_inputs_patch_re_timed_records_and_drop_large_clusters(tmp_path):
    """fit_inputs.py on recorded raws: r33's re-timed records replace those
    of the file they came from (19 of the r24 probe's 54 shapes), and
    --max-cluster 2 leaves no option of 3 or 4 CTAs, its best re-taken
    from what is left."""
    sys.path.insert(0, str(BENCH))
    try:
        from _common import load_raw  # noqa: PLC0415
        from fit_inputs import cluster_size  # noqa: PLC0415
    finally:
        sys.path.remove(str(BENCH))
    proc = run_bench("fit_inputs.py", "--retimed", R33_RETIME_FIT, "--out", tmp_path / "p", R24_PROBE_FIT)
    assert "54 records (19 re-timed" in proc.stdout
    patched = load_raw(str(tmp_path / "p" / R24_PROBE_FIT.name.removesuffix(".xz")))
    retimed = [r for r in load_raw(str(R33_RETIME_FIT)) if r["retimed"]["source"] == R24_PROBE_FIT.name]
    assert len(retimed) == 19 and all(r in patched for r in retimed)
    run_bench("fit_inputs.py", "--max-cluster", "2", "--out", tmp_path / "d", R31_PAIRS_FIT)
    before = load_raw(str(R31_PAIRS_FIT))
    after = load_raw(str(tmp_path / "d" / R31_PAIRS_FIT.name.removesuffix(".xz")))
    assert len(after) == len(before) == 132
    assert any(cluster_size(o[0]) > 2 for r in before for o in r["options"])
    for rec in after:
        assert rec["options"] and all(cluster_size(o[0]) <= 2 for o in rec["options"])
        assert rec["best_us"] == min(o[3] for o in rec["options"])


def test_cluster_ties_compares_only_siblings_the_model_ties():
    """cluster_ties.py on r22's cluster probe of the fit sample, which timed
    1x1, 1x2 and 2x1 of the large tiles: it finds ties there, each row's
    shares are of the ties it counts, and r31's token-pair probe, which has
    no 1x1 sibling of its 1x2 options, gives none."""
    out = run_bench("cluster_ties.py", RAW / "2026-12-02_h200_r22_tile_probe_clusters_fit_raw.json.xz").stdout
    rows = [line.split("|")[3:-1] for line in out.splitlines() if line.startswith(("| 1x2", "| 2x1"))]
    assert rows, out
    for ties, geomean, faster, slower in rows:
        assert int(ties) > 0 and 0.5 < float(geomean) < 2.0
        assert int(faster.strip(" %")) + int(slower.strip(" %")) <= 100
    assert "| 1x2 |" not in run_bench("cluster_ties.py", R31_PAIRS_FIT).stdout


R19_REGIME = BENCH / "results" / "2026-12-02_h200_r19_swizzle_diag_regime.md"


def test_swizzle_balance_prices_the_narrow_column_on_recorded_regime_pairs():
    """swizzle_balance.py on r19's 120 regime pairs: the one pair below 0.90 live
    (f16 10397x816x880, 82x4 clusters, the last column 48 of 256 wide) gets
    the plain walk's busiest slot at 0.865 of the band's with a narrow tile
    at half a full one's fixed time (w = 0.5), and the summary splits all
    120 pairs by that balance."""
    sys.path.insert(0, str(BENCH))
    try:
        from swizzle_balance import balance  # noqa: PLC0415
    finally:
        sys.path.remove(str(BENCH))
    b, rows, cols, frac = balance(10397, 816, "128x256/1x1/m4", 0.5)
    assert (rows, cols) == (82, 4) and abs(frac - 48 / 256) < 1e-9
    assert abs(b - 0.865) < 0.001
    # A grid whose columns are all whole: the narrow column costs a full tile, no imbalance.
    assert balance(4096, 1024, "128x256/1x1/m4", 0.5)[0] == 1.0
    out = run_bench("swizzle_balance.py", R19_REGIME).stdout
    assert "| 0.844 | 0.865 | f16 | 10397x816x880 | 128x256/1x1/m4 | 82x4 | 0.19 |" in out
    counts = [int(line.split(": ")[1].split()[0]) for line in out.splitlines()
              if line.startswith("balance ")]
    assert sum(counts) == 120


# ------------------------------------------- bench_epilogue (fused epilogues vs torch)
def test_epilogue_heldout_sample_is_seeded_and_in_its_stated_bounds():
    be = _load_bench("bench_epilogue")
    shapes = be.heldout_sample(12)
    assert shapes == be.heldout_sample(12) != be.heldout_sample(12, seed=be.HELDOUT_SEED + 1)
    assert len(shapes) == 12
    for m, n, k in shapes:
        assert 256 <= m <= 16384 and 1024 <= n <= 28672 and 1024 <= k <= 28672
        assert n % 64 == 0 and k % 64 == 0 and 2 * m * n * k <= 2e12
    # Not the llm group the table's epilogue rows were tuned on.
    import yaml  # noqa: PLC0415

    llm = yaml.safe_load((BENCH / "shapes.yaml").read_text())["llm"]
    assert not {tuple(s) for s in shapes} & {tuple(s) for s in llm}


# ------------------------------------------- gemv_floor (decode's fixed cost)
def test_gemv_floor_kernels_cover_its_modes_and_layouts():
    gf = _load_bench("gemv_floor")
    # Every launch mode the CLI offers is a template instance the launcher dispatches.
    assert set(gf.MODES.values()) == {0, 1, 2}
    for mode in gf.MODES.values():
        assert f"launch<{mode}>(w, x, y, (int)layout, (int)arg)" in gf.CUDA_SRC
    for layout in range(7):
        assert f"layout == {layout}" in gf.CUDA_SRC
    # --frag's two kernels (r41) are launched under the labels the report names.
    assert '("g2 frag16", 5, 2 * sms), ("g2 tc16", 6, 2 * sms)' in Path(gf.__file__).read_text()
    # Its copy reference is bench_decode.py's, so its HBM columns read the same.
    assert gf.copy_tbps.__code__.co_filename.endswith("bench_decode.py")


# r41: every option of the fit sample's small-M pairs timed on the resident
# gemv (fitted on), and r40's live sweep of the held-out sample's bf16
# small-M pairs (never fitted on).
R41_FIT_SMALLM = RAW / "2026-12-04_h200_r41_selection_fit_smallm_73755d4_raw.json.xz"
R40_HELDOUT_SMALLM = RAW / "2026-12-04_h200_r40_selection_heldout_smallm_fa888d5_raw.json.xz"
R40_GEMV = {"hbm_share": 1.03, "seg_us": 0.9, "seg_load_us": 0.4, "l2_factor": 2.5,
            "fma_tflops": 6.0, "fixed_us": 0.0}


def test_fitted_gemv_model_ranks_better_than_r40s_on_both_samples():
    """select.GEMV was fitted on R41_FIT_SMALLM (r41). Replayed, it must rank
    the recorded options better than r40's constants there and on the
    held-out raw it never saw (select.GEMV's comment gives the figures). The
    replay leaves select.GEMV as it found it."""
    from cutlass_aot.run import select  # noqa: PLC0415

    sys.path.insert(0, str(BENCH))
    fitted = dict(select.GEMV)
    try:
        import replay_selection  # noqa: PLC0415

        out = {}
        for name, consts in (("r40", R40_GEMV), ("r41", fitted)):
            select.GEMV.update(consts)
            out[name] = [replay_selection.replay(str(p)) for p in (R41_FIT_SMALLM, R40_HELDOUT_SMALLM)]
    finally:
        select.GEMV.update(fitted)
        sys.path.remove(str(BENCH))
    (fit40, ho40), (fit41, ho41) = out["r40"], out["r41"]
    assert fit41["n"] == 130 and ho41["n"] == 52
    assert fit41["regret_median"] < fit40["regret_median"]
    assert ho41["regret_p90"] < ho40["regret_p90"] - 0.03
    assert ho41["pick_vs_cublas"] > ho40["pick_vs_cublas"]
    assert ho41["regret_worst"] <= ho40["regret_worst"]
    assert select.GEMV == fitted


R40_DECODE = RAW / "2026-12-04_h200_r40_decode_fa888d5_raw.json.xz"


def test_decode_bandwidth_share_prices_the_recorded_grid():
    """bench_decode's what-if line on r40's grid (copy 4.25 TB/s in that run):
    a share too small to bind gives the measured geomean back (1.084), and
    at least 85% of the copy bandwidth everywhere gives 1.112 (r41 notes);
    the figure never falls as the share rises."""
    bd = _load_bench("bench_decode")
    sys.path.insert(0, str(BENCH))
    try:
        from _common import load_raw  # noqa: PLC0415

        recs = load_raw(str(R40_DECODE))
    finally:
        sys.path.remove(str(BENCH))
    assert len(recs) == 128
    assert round(bd.at_bandwidth_share(recs, 4.25, 0.01), 3) == 1.084
    assert round(bd.at_bandwidth_share(recs, 4.25, 0.85), 3) == 1.112
    shares = [bd.at_bandwidth_share(recs, 4.25, s) for s in (0.5, 0.85, 0.9, 1.0)]
    assert shares == sorted(shares)


def test_bias_twins_gap_counts_only_what_the_bias_catalog_offers():
    """bias_twins.gap: per shape, the best bias-catalog estimate over the best plain
    one, geomean; a form added to the catalog counts once chosen, others never."""
    sys.path.insert(0, str(BENCH))
    try:
        import bias_twins  # noqa: PLC0415 - lives in benchmarks/, found through sys.path
    finally:
        sys.path.remove(str(BENCH))
    rows = [(10.0, {"a": 10.0, "b": 12.0, "c": 15.0}),  # plain pick "a", no twin
            (20.0, {"a": 25.0, "b": 20.0})]              # plain pick "b", twinned
    have = {"b", "c"}
    assert bias_twins.gap(rows, have, []) == pytest.approx(math.sqrt(1.2 * 1.0))
    assert bias_twins.gap(rows, have, ["a"]) == pytest.approx(1.0)
    assert math.isnan(bias_twins.gap(rows, {"c"}, []))  # a shape the catalog cannot serve


def test_sass_ops_cuts_the_device_code_out_of_a_real_artifact(built_cache, monkeypatch, tmp_path):
    """sass_ops.device_elves finds each artifact's embedded CUDA ELF whole
    (its header's tables inside the cut), and opcodes() counts a SASS
    listing by opcode with predicates dropped, per function."""
    import struct  # noqa: PLC0415

    sys.path.insert(0, str(BENCH))
    import sass_ops  # noqa: PLC0415

    for key in built_cache.keys:
        blob = (built_cache.path / "entries" / key / "kernel.so").read_bytes()
        elves = sass_ops.device_elves(blob)
        assert len(elves) >= 1, key
        for elf in elves:
            assert elf[:4] == b"\x7fELF" and struct.unpack_from("<H", elf, 18)[0] == sass_ops.EM_CUDA
            phoff, shoff = struct.unpack_from("<QQ", elf, 0x20)
            assert shoff < len(elf) and phoff < len(elf)
            assert elf in blob
    listing = """
        Function : kernel_a
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   MUFU.TANH R13, R13 ;
        /*0020*/              @!P0 MUFU.TANH R14, R14 ;
        /*0030*/                   MUFU.TANH.F16 R19, R12.H1 ;
        Function : kernel_b
        /*0000*/              @P1 BRA 0x490 ;
    """
    counts = sass_ops.opcodes(listing)
    assert counts["kernel_a"] == {"MOV": 1, "MUFU.TANH": 2, "MUFU.TANH.F16": 1}
    assert counts["kernel_b"] == {"BRA": 1}
    monkeypatch.delenv("CUOBJDUMP", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cuobjdump anywhere: a clear exit
    monkeypatch.setattr(sass_ops.glob, "glob", lambda pattern: [])
    with pytest.raises(SystemExit, match="cuobjdump not found: pass --cuobjdump"):
        sass_ops.tool("cuobjdump", None)


# ------------------------------------------- bench_odd_edge (out padded past an odd N)
def test_odd_edge_shapes_all_end_off_a_16_byte_boundary_inside_an_aligned_pitch():
    """Every shape the benchmark times takes the odd-edge route (not the
    staged one): N is no multiple of 8 elements, so a padded view's rows end
    off a 16-byte boundary, while K (x's and w's rows) is a multiple of 8.
    The held-out sample is seeded, spans the issue's ranges, and is not the suite."""
    odd = _load_bench("bench_odd_edge")
    sample = odd.heldout(64)
    assert sample == odd.heldout(64) != odd.heldout(64, seed=odd.SEED + 1)
    assert not set(sample) & set(odd.suite())
    for m, n, k in odd.suite() + sample:
        assert n % 8 and not k % 8 and odd.padded(n) - n in range(1, 8), (m, n, k)
        assert 1 <= m <= 16384 and 96 <= n <= 57344 + 7 and 256 <= k <= 16384
    assert min(m for m, _, _ in sample) < 16 < 4096 < max(m for m, _, _ in sample)


def test_timing_drift_names_the_records_whose_best_moved_between_sweep_and_re_timing():
    """_common.timing_drift over r52's H100 f16 parts: the three giant shapes
    whose best option re-timed 1.38-1.49x its sweep time are named, worst
    first, and nothing else is; a record moved the other way (faster) is
    named too, and a record without its best among the options is skipped."""
    common = _load_bench("_common")
    recs = [r for p in R52_H100_F16 for r in common.load_raw(str(p))]
    median, off = common.timing_drift(recs)
    assert 0.98 < median < 1.02
    assert [(r["m"], r["n"], r["k"]) for r in off] == [
        (5740, 51864, 31288), (7565, 20480, 19176), (9711, 8568, 57192)]
    assert [round(r["drift"], 2) for r in off] == [1.49, 1.41, 1.38]
    fast = {**recs[0], "best_us": next(o[3] for o in recs[0]["options"] if o[0] == recs[0]["best"]) / 1.3}
    lost = {**recs[1], "best": "not-an-option"}
    _, off = common.timing_drift([fast, lost])
    assert [round(r["drift"], 2) for r in off] == [0.77]
    text = common.drift_lines(recs)
    assert "3 of 105 outside 0.87-1.15" in text and "| f16 | 5740x51864x31288 | 128x256/2x1/n8 |" in text


def test_sustained_probe_reads_nvidia_smi_lines_and_sums_a_phase():
    """sustained_probe.py's pure parts: an nvidia-smi line (with and without
    the reasons field, [N/A] cells, a warning line), the reason bits' names,
    and one phase's figures from windows and the samples inside its span."""
    sp = _load_bench("sustained_probe")
    assert sp.parse_sample("1755, 698.12, 61, 87, 0x0000000000000004") == {
        "clocks.sm": 1755.0, "power.draw": 698.12, "temperature.gpu": 61.0,
        "utilization.memory": 87.0, "reasons": 4}
    assert sp.parse_sample("1980, [N/A], 40, [N/A]") == {
        "clocks.sm": 1980.0, "power.draw": None, "temperature.gpu": 40.0, "utilization.memory": None}
    assert sp.parse_sample("1980, 400, 40") is None  # a line of another query
    assert sp.parse_sample("Failed to initialize NVML: Unknown Error") is None
    assert sp.parse_sample("1, 2, x, 3, 0x0") is None
    assert sp.reason_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert sp.reason_names(0) == [] and sp.reason_names(0x1000) == ["0x1000"]
    windows = [(float(t), us) for t, us in enumerate([10, 10, 11, 12, 13, 14, 20, 21])]
    samples = [(-1.0, {"clocks.sm": 100.0, "power.draw": 1.0, "temperature.gpu": 99.0,
                       "utilization.memory": 1.0, "reasons": 0x8}),
               (1.0, {"clocks.sm": 1900.0, "power.draw": 500.0, "temperature.gpu": 50.0,
                      "utilization.memory": 40.0, "reasons": 0}),
               (5.0, {"clocks.sm": 1500.0, "power.draw": 700.0, "temperature.gpu": 70.0,
                      "utilization.memory": 90.0, "reasons": 0x4}),
               (6.0, {"clocks.sm": 1400.0, "power.draw": None, "temperature.gpu": 71.0,
                      "utilization.memory": None, "reasons": 0x4})]
    st = sp.phase_stats(windows, samples, 0.0, 7.0)
    assert st["us_first"] == 10 and st["us_last"] == 20.5 and st["windows"] == 8
    assert st["samples"] == 3 and st["sm_mhz"] == 1500.0 and st["power_w"] == 600.0
    assert st["mem_util"] == 65.0
    assert st["temp_max"] == 71.0 and st["reasons"] == ["sw_power_cap"]
    empty = sp.phase_stats([], [], 0.0, 1.0)
    assert empty["us_first"] is None and empty["sm_mhz"] is None and empty["reasons"] == []


def test_drift_scan_counts_heavy_problems_re_timed_slower():
    """drift_scan.py over r52's two H100 f16 parts: the three giants are the
    heavy problems re-timed slower, and a tolerance of 1 or less is a usage
    error."""
    run = functools.partial(subprocess.run, capture_output=True, text=True, cwd=BENCH, timeout=300)
    proc = run([sys.executable, str(BENCH / "drift_scan.py"), *map(str, R52_H100_F16)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "All: 3 of 105 records outside 0.87-1.15" in proc.stdout
    assert "Slower re-timings: median 1.41, largest 1.49." in proc.stdout
    assert proc.stdout.count("| 2026-12-05_h100_r52_selection_heldout_f16_") == 2 + 3
    bad = run([sys.executable, str(BENCH / "drift_scan.py"), "--tolerance", "1"])
    assert bad.returncode == 2 and "--tolerance must be above 1" in bad.stderr


def test_sustained_summary_puts_every_shape_on_a_row_and_geomeans_each_option():
    """sustained_summary.py's pure parts: phases of several rounds fold to
    their median last-quarter µs, every option's cuBLAS / option lands on
    its shape's row (the pick in bold, with its memory-busy share), and the
    geomeans count only the shapes that timed an option."""
    ss = _load_bench("sustained_summary")

    def ph(name, us, shape=(5740, 51864, 31288), rnd=0, mem=None):
        m, n, k = shape
        return {"dtype": "bf16", "m": m, "n": n, "k": k, "round": rnd, "name": name,
                "us_last": us, "mem_util": mem}

    other = (12541, 50208, 35032)
    recs = [ph("cuBLAS", 100.0), ph("cuBLAS", 110.0, rnd=1), ph("a", 140.0, mem=100.0),
            ph("a", 150.0, rnd=1, mem=98.0), ph("b", 105.0, mem=40.0),
            ph("cuBLAS", 50.0, other), ph("b", 40.0, other, mem=30.0),
            {"dtype": "bf16", "m": 1, "n": 1, "k": 1, "name": "cut short", "us_last": None}]
    rows = ss.rows_of(recs)
    assert set(rows) == {("bf16", 5740, 51864, 31288), ("bf16", *other)}
    assert rows[("bf16", 5740, 51864, 31288)]["cuBLAS"]["us"] == 105.0
    assert rows[("bf16", 5740, 51864, 31288)]["a"] == {"us": 145.0, "mem": 99.0}
    text = ss.summarize(rows, {("bf16", 5740, 51864, 31288): "a", ("bf16", *other): "b"})
    assert "| bf16 | 5740x51864x31288 | a | 99 | **0.724** | 1.000 |" in text
    assert "| bf16 | 12541x50208x35032 | b | 30 |  | **1.250** |" in text
    assert "| the model's pick | 2 | 0.951 | 0.724 |" in text  # sqrt(0.724 * 1.25)
    assert "| best timed per shape | 2 | 1.118 | 1.000 |" in text
    assert "| a | 1 | 0.724 | 0.724 |" in text and "| b | 2 | 1.118 | 1.000 |" in text


def test_bench_selection_times_the_long_k_walks_on_huge_shapes():
    """bench_selection.bounded: above 2 TFLOP the model's 16 best options by
    estimate, plus the long-K order's 1x2 256-row walks where it applies
    (r53: the held-out sweeps had never timed them where they win); below the
    bound, or off the long-K shapes, nothing is added."""
    import itertools  # noqa: PLC0415

    from cutlass_aot.run import select  # noqa: PLC0415

    bs = _load_bench("bench_selection")
    cands = [select.Candidate(key=f"k{i}", tile_m=int(t.split("x")[0]), tile_n=int(t.split("x")[1]),
                              cluster_m=cm, cluster_n=cn, raster=r, swizzle=z)
             for i, (t, r, z, (cm, cn)) in enumerate(itertools.product(
                 ("128x256", "256x192", "256x160", "256x128"), "mn", (1, 2, 4, 8),
                 ((1, 1), (2, 1), (1, 2))))]
    options = [select.Choice(c, 1, "bench") for c in cands]
    # the walks: 256x192 banded (swizzle 8, r59) and plain, 256x160 plain; 1x2, raster m
    walks = {o for o in options if o.candidate.cluster_n == 2 and o.candidate.cluster_m == 1
             and o.candidate.raster == "m" and o.candidate.tile_m == 256
             and (o.candidate.tile_n, o.candidate.swizzle) in ((192, 8), (192, 1), (160, 1))}
    assert len(walks) == 3
    for (m, n, k), extra in (((8192, 8192, 28672), True), ((4800, 8192, 28672), False),
                             ((16384, 16384, 8192), False), ((512, 512, 28672), None)):
        est = {o: select.estimate_us(o.candidate, 1, m, n, k, 1, 132) for o in options}
        got = bs.bounded(options, est, m, n, k)
        if extra is None:  # under 2 TFLOP: every option
            assert got == options
            continue
        top = set(sorted(options, key=est.get)[:16])
        assert top <= set(got) and len(got) == len(set(got))
        assert (set(got) - top) == ((walks - top) if extra else set()), (m, n, k)
        if extra:
            assert walks <= set(got) and not walks <= top  # the fixture's point


def test_bench_selection_best_cached_is_the_fastest_option_as_re_timed():
    """_common.best_vs (r55; bench_selection, heldout_merge and heldout_bands
    read it): the best cached option's ratio to cuBLAS
    takes the fastest option of the interleaved re-timing, not the screen's
    best re-timed. Under --steady-ms a burst winner can lose to a pick (r55's
    H100 run: 128x256/2x1/n8 screened at 13,040 µs, re-timed steady at 17,897,
    the pick at 14,750, cuBLAS 14,200); a raw from before r55 holds only the
    screen's best; its picks' re-timed figures give the same answer (r50's
    128x256x57344: the screen's best 19.30 µs, the dispatch pick 18.80)."""
    bs = _load_bench("_common")
    new = {"cublas_us": 14199.6, "best_us": 17897.0, "fastest_us": 14749.5}
    assert abs(bs.best_vs(new) - 14199.6 / 14749.5) < 1e-12
    old = {"cublas_us": 16.35, "best_us": 19.30, "model": {"us": 18.80}, "dispatch": {"us": 18.80},
           "autotune": {"us": float("nan")}}
    assert abs(bs.best_vs(old) - 16.35 / 18.80) < 1e-12
    assert abs(bs.best_vs({"cublas_us": 10.0, "best_us": 8.0, "model": {"us": 9.0}}) - 1.25) < 1e-12


def test_epilogue_same_form_reports_each_form_over_its_own_plain_time(tmp_path):
    """epilogue_same_form.py (r61): each fused time is divided by the same
    form's plain time, never another form's; a form the bias signature lacks
    shows plain only; --from-raw renders a measured raw (its machine, not
    this one's) and the CLI refuses bad shapes."""
    import json  # noqa: PLC0415

    run = functools.partial(subprocess.run, capture_output=True, text=True, cwd=BENCH, timeout=300)
    esf = _load_bench("epilogue_same_form")
    rec = {"dtype": "bf16", "m": 4096, "n": 4096, "k": 4096, "commit": "abc1234",
           "machine": "NVIDIA H100 80GB HBM3 (132 SMs)", "date": "2026-12-06 09:41 UTC",
           "us": {"torch.mm": 200.0, "128x256/2x1/m1": {"plain": 190.0, "bias": 195.7, "gelu": 199.5},
                  "256x192/1x1/m8": {"plain": 180.0}}}
    text = esf.render([rec])
    assert "| 4096x4096x4096 | 200.0 | 190.0 | 1.030 | 1.050 | 180.0 | - | - |" in text
    assert "bias over plain, every (form, shape): geomean 1.030" in text
    assert "bias+GELU over plain, every (form, shape): geomean 1.050" in text
    raw = tmp_path / "r.json"
    raw.write_text(json.dumps([rec]))
    out = tmp_path / "o.md"
    proc = run([sys.executable, str(BENCH / "epilogue_same_form.py"), "--from-raw", str(raw),
                "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert "- machine: NVIDIA H100 80GB HBM3 (132 SMs)" in out.read_text()
    bad = run([sys.executable, str(BENCH / "epilogue_same_form.py"), "--shapes", "4096x4096"])
    assert bad.returncode == 2 and "'4096x4096' is not MxNxK" in bad.stderr


# ------------------------------------------- with_c_edge (two builds' with-C calls)
def test_with_c_edge_classes_decode_apart_from_edge_tiles():
    """r63's twins report counted M = 1 as an edge shape (1 % 128 != 0), which
    mixed decode into the edge geomean: decode is its own class now."""
    wc = _load_bench("with_c_edge")
    assert [wc.shape_class(m, n) for m, n in ((1, 4096), (128, 4104), (129, 4104), (4096, 4104),
                                              (1000, 3072), (4096, 4096), (2048, 8192))] == \
        ["decode", "decode", "edge", "edge", "edge", "aligned", "aligned"]
    assert wc.shapes_arg("129x4104x4096,1x8x8") == [(129, 4104, 4096), (1, 8, 8)]


def test_with_c_edge_sample_is_held_out_from_the_manifests_residual_tune(tmp_path):
    """--sample (r64): seeded shapes at the widths of the manifest's residual
    tune: problems (with_c in that dtype, nn.Linear layout), never a tuned
    problem, the same for the same seed; a manifest tuning no residual
    problem in the dtype is a clear exit."""
    wc = _load_bench("with_c_edge")
    tuned = wc.tuned_residuals(str(BENCH.parent / "configs" / "sm90.yaml"), "bf16")
    assert len(tuned) == 60 and (128, 4096, 14336) in tuned
    got = wc.held_out_sample(tuned, 32, 64, 16384)
    assert got == wc.held_out_sample(tuned, 32, 64, 16384) != wc.held_out_sample(tuned, 32, 65, 16384)
    assert len(set(got)) == 32 and not set(got) & tuned
    assert {(n, k) for _, n, k in got} == {(n, k) for _, n, k in tuned}
    assert all(1 <= m <= 16384 for m, _, _ in got)
    # r64's call A ran this sample: its first shapes, as recorded
    assert got[:4] == [(102, 4096, 4096), (453, 4096, 14336), (50, 8192, 8192), (7540, 8192, 28672)]
    plain = tmp_path / "plain.yaml"
    plain.write_text("tune:\n  - a: bf16\n    shapes: [[8, 4096, 4096]]\n")
    with pytest.raises(SystemExit, match="tunes no residual problem"):
        wc.held_out_sample(wc.tuned_residuals(str(plain), "bf16"), 4, 1, 64)


def test_twin_coverage_replays_both_calls_on_a_real_cache(built_cache, tmp_path):
    """twin_coverage.py (r66) on the session's tiny cache: its plain and its
    residual bf16 signature have one form each, the same 128x128 tile, so no
    plain pick lacks a twin and the two calls pick alike at every token count
    of the manifest's four residual widths; a dtype the cache cannot serve is
    a clear exit."""
    out = tmp_path / "tc.md"
    args = [sys.executable, str(BENCH / "twin_coverage.py"), "--cache-dir", str(built_cache.path),
            "--points", "9", "--max-m", "4096", "--out", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "1 plain nn.Linear candidates, 1 with C" in text, text
    assert "4096x4096, 4096x14336, 8192x8192, 8192x28672" in text, text
    bands = [line for line in text.splitlines() if line.startswith("| 1..") or line.startswith("| 65..")
             or line.startswith("| 513..")]
    assert len(bands) == 3, text
    for line in bands:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == "0 (0%)" and cells[3] == "0 (0%)" and cells[4] == "-", line
    proc = subprocess.run([*args[:-2], "--dtype", "f16"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "cannot serve both calls in f16" in proc.stderr, proc.stderr[-2000:]


def test_with_c_edge_random_sample_is_bench_selections_law_at_any_width():
    """--random (r67): bench_selection.sample's seeded shapes, bounded in
    GFLOP, the same for the same seed: widths no residual row covers."""
    wc = _load_bench("with_c_edge")
    got = wc.random_sample(40, 67, 200.0)
    assert got == wc.random_sample(40, 67, 200.0) != wc.random_sample(40, 68, 200.0)
    assert len(got) == 40 and all(2 * m * n * k <= 200e9 for m, n, k in got)
    assert all(1 <= m <= 65536 and 256 <= n <= 57344 and 256 <= k <= 57344 and n % 8 == k % 8 == 0
               for m, n, k in got)
    tuned = wc.tuned_residuals(str(BENCH.parent / "configs" / "sm90.yaml"), "bf16")
    assert len({(n, k) for _, n, k in got} - {(n, k) for _, n, k in tuned}) > 30


def test_with_c_edge_twin_is_the_plain_picks_with_c_form(built_cache):
    """--twin (r68): the option it times is the with-C variant of the form the
    plain call picks at that problem, at the plain pick's split count, on the
    session's tiny cache (one 128x128 form a call) for the H100 table's GPU."""
    import cutlass_aot  # noqa: PLC0415

    wc = _load_bench("with_c_edge")
    tc = _load_bench("twin_coverage")
    cache = cutlass_aot.open_cache(built_cache.path)
    gpu = json.loads((BENCH.parent / "configs" / "sm90-h100.selection.json").read_text())["gpu"]
    plain_choose = tc.linear_dispatch(cache, "bf16", gpu, False)[2]
    c_cands = tc.linear_dispatch(cache, "bf16", gpu, True)[0]
    for m, n, k in ((1, 4096, 4096), (300, 8192, 28672), (5000, 1000, 4096)):
        plain = plain_choose(m, n, k)
        twin = wc.twin_of_plain(plain_choose, c_cands, m, n, k)
        assert twin is not None and twin.source == "twin"
        assert twin.candidate.label() == plain.candidate.label() and twin.splits == plain.splits
        assert twin.candidate.key != plain.candidate.key  # the with-C artifact, not the plain one
        assert twin.candidate in c_cands
    assert wc.twin_of_plain(plain_choose, [], 1, 4096, 4096) is None  # no with-C form of it


def test_with_c_replay_finds_no_move_between_a_build_and_itself(built_cache, tmp_path):
    """with_c_replay.py (r67) on the session's tiny cache as both builds: no
    pick moves in either sample, every band reads 0; a dtype the cache cannot
    serve with C is a clear exit."""
    out = tmp_path / "wcr.md"
    args = [sys.executable, str(BENCH / "with_c_replay.py"), "--cache-dir", str(built_cache.path),
            "--old-cache", str(built_cache.path), "--sample", "8", "--random", "60", "--out", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "## 8 held-out token counts at the tuned residual widths (seed 67): 0 of 8 picks moved" in text
    assert "## 60 random shapes, every width" in text and "0 of 60 picks moved" in text, text
    rows = [line for line in text.splitlines() if line.startswith("| 1..") or line.startswith("| 65..")
            or line.startswith("| 513..") or line.startswith("| 4097..")]
    assert len(rows) >= 4, text
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == "0 (0%)" and cells[3] == "0" and cells[4] == "-", line
    proc = subprocess.run([*args[:-2], "--dtype", "f16"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "cannot serve" in proc.stderr, proc.stderr[-2000:]
    raw = tmp_path / "sweep_raw.json"
    raw.write_text(json.dumps([{"m": 8, "n": 512, "k": 256, "options": [["128x128/1x1/m1", "k", 1, 5.0, 5.0]]}]))
    proc = subprocess.run([*args, "--raws", str(raw)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "0 picks moved, 0 with both forms timed" in out.read_text() and "| - | 0 | - | - | - |" in out.read_text()


def test_with_c_replay_proxy_reads_the_sweeps_plain_times_of_moved_picks(tmp_path):
    """--raws (r67): for each moved pick whose old and new options a sweep
    timed, new / old of the plain times, per token band; a moved pick the
    sweep did not time counts as moved, not matched; .xz raws read too."""
    import lzma  # noqa: PLC0415

    wcr = _load_bench("with_c_replay")
    rows = [{"m": 8, "n": 512, "k": 256, "options": [["A", "a", 1, 10.0, 9.0], ["B", "b", 1, 12.0, 9.0]]},
            {"m": 40, "n": 512, "k": 256, "options": [["A", "a", 1, 10.0, 9.0], ["B", "b", 1, 8.0, 9.0]]},
            {"m": 300, "n": 512, "k": 256, "options": [["A", "a", 1, 10.0, 9.0]]},
            {"m": 5000, "n": 512, "k": 256, "options": [["A", "a", 1, 10.0, 9.0], ["B", "b", 1, 30.0, 9.0]]}]
    path = tmp_path / "raw.json.xz"
    path.write_bytes(lzma.compress(json.dumps(rows).encode()))
    sweeps = wcr.load_sweeps([path])
    assert sweeps[(8, 512, 256)] == {"A": 10.0, "B": 12.0}

    def old(m, n, k):
        return "A"

    def new(m, n, k):
        return "B" if m < 1000 else "A"

    text, moved, matched = wcr.proxy(sweeps, old, new)
    assert (moved, matched) == (3, 2)
    assert text == f"| 1..64 | 2 | {math.sqrt(1.2 * 0.8):.3f} | 0.80 | 1.20 |\n", text
