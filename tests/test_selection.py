"""Selection on the CPU: the pure decisions, the table format, shape sets, tune/build CLI.

Real compiles and real caches where a cache is involved (the session's tiny
cache from conftest); every decision tested here is a pure function of plain
data, exactly what the GPU hot path calls.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from cutlass_aot import tables
from cutlass_aot.cli import main as cli
from cutlass_aot.errors import ArgumentError, CacheError, IntegrityError, KernelNotFoundError, UsageError
from cutlass_aot.run import select
from cutlass_aot.signature import gemm_abi_args, gemm_signature, splitk_tail_tiles, splitk_workspace_elems
from cutlass_aot.tune.shapes import MAX_PROBLEMS, parse_groups, read_shape_log

from .support import copy_cache, make_tree_writable

REPO = Path(__file__).resolve().parents[1]


def cand(tile="128x256", cluster="1x1", raster="m", swizzle=1, swap=False, split=False, key="k"):
    tm, tn = (int(x) for x in tile.split("x"))
    cm, cn = (int(x) for x in cluster.split("x"))
    return select.Candidate(key, tm, tn, cm, cn, raster, swizzle, swap, split)


CANDS = [cand(t, c, key=f"{t}/{c}") for t in ("128x256", "256x128", "128x128", "64x128")
         for c in ("1x1", "2x1")] + [
    cand("128x256", "2x1", "m", 8, key="sw8"),
    cand("128x16", swap=True, key="swap16"), cand("128x16", swap=True, split=True, key="swap16sk"),
    cand("128x64", swap=True, split=True, key="swap64sk"),
    cand("128x128", split=True, key="sk128"), cand("128x256", split=True, key="sk256"),
]


# ----------------------------------------------------------------- the ABI
def test_abi_argument_order_is_defined_once():
    assert gemm_abi_args(with_c=False, bias=False, split_k=False) == ("a", "b", "d", "alpha", "sm_count")
    assert gemm_abi_args(with_c=True, bias=True, split_k=True) == (
        "a", "b", "d", "c", "bias", "workspace", "alpha", "beta", "splits", "sm_count")


def test_workspace_counts_padded_cluster_tiles_in_the_kernels_orientation():
    # 300 rows in 128-row tiles = 3 tiles, padded to 4 by a 2x1 cluster;
    # fewer tiles than SMs, so every tile is split.
    assert splitk_workspace_elems(300, 256, 1, 3, tile_m=128, tile_n=128, cluster_m=2,
                                  cluster_n=1, swap_ab=False, sm_count=132) == 4 * 2 * 3 * 128 * 128
    # swap-AB: the kernel's M is the caller's N.
    assert splitk_workspace_elems(4, 4096, 2, 4, tile_m=128, tile_n=16, cluster_m=1,
                                  cluster_n=1, swap_ab=True, sm_count=132) == 32 * 1 * 2 * 4 * 128 * 16


def test_workspace_holds_only_the_split_tail_of_the_hybrid():
    # 165 tiles on 132 SMs: 132 run whole, the 33 of the last wave are split.
    elems = splitk_workspace_elems(33 * 128, 5 * 256, 1, 4, tile_m=128, tile_n=256, cluster_m=1,
                                   cluster_n=1, swap_ab=False, sm_count=132)
    assert elems == 33 * 4 * 128 * 256
    assert splitk_tail_tiles(165, 132) == 33 and splitk_tail_tiles(100, 132) == 100
    # Whole waves: nothing is split, and the caller still gets a valid buffer.
    assert splitk_workspace_elems(132 * 128, 256, 1, 4, tile_m=128, tile_n=256, cluster_m=1,
                                  cluster_n=1, swap_ab=False, sm_count=132) == 1
    with pytest.raises(ValueError, match="slots"):
        splitk_tail_tiles(10, 0)


def test_workspace_counts_cluster_tiles_for_a_clustered_split():
    # 2x1 clusters of 128x256: 33 x 5 CTA tiles pad to 17 x 5 = 85 cluster
    # tiles on 66 cluster slots: 19 split, two CTA tiles each.
    elems = splitk_workspace_elems(33 * 128, 5 * 256, 1, 3, tile_m=128, tile_n=256, cluster_m=2,
                                   cluster_n=1, swap_ab=False, sm_count=132)
    assert elems == 19 * 2 * 3 * 128 * 256
    sk = cand(cluster="2x1", split=True)
    assert select.split_choices(sk, 33 * 128, 5 * 256, 8192, 1, 132)[0] == 2
    assert select.split_choices(sk, 66 * 256, 256, 8192, 1, 132) == ()  # 66 clusters: whole


def test_plain_signature_text_is_unchanged_by_bias_and_act_fields():
    plain = gemm_signature("sm_90a", a="bf16", b="bf16", d="bf16", c=None, a_major="k",
                           b_major="k", d_major="n", rank=2)
    assert "bias" not in plain.text() and "act" not in plain.text()
    fused = gemm_signature("sm_90a", a="bf16", b="bf16", d="bf16", c=None, a_major="k",
                           b_major="k", d_major="n", rank=2, bias="bf16", act="gelu")
    assert "bias=bf16" in fused.text() and "act=gelu" in fused.text() and fused != plain


# ----------------------------------------------------- signature, checks
def _meta(**over):
    dtypes = {"a": "bf16", "b": "bf16", "out": "bf16"}
    shapes = {"a": (64, 32), "b": (32, 48), "out": (64, 48)}
    strides = {"a": (32, 1), "b": (1, 32), "out": (48, 1)}
    for k, v in over.items():
        name, what = k.split("_", 1)
        {"dtype": dtypes, "shape": shapes, "stride": strides}[what][name] = v
    return dtypes, shapes, strides


def test_call_signature_from_metadata():
    sig = select.call_signature("sm_90a", *_meta())
    f = dict(sig.fields)
    assert (f["a_major"], f["b_major"], f["d_major"], f["rank"]) == ("k", "k", "n", 2)
    d, s, st = _meta()
    d["bias"], s["bias"], st["bias"] = "f32", (48,), (1,)
    assert dict(select.call_signature("sm_90a", d, s, st, "silu").fields)["bias"] == "f32"


@pytest.mark.parametrize("over,match", [
    ({"a_dtype": "f32"}, "inputs must be float16"),
    ({"a_stride": (64, 2)}, "neither of its last two dims"),
    ({"out_shape": (2, 64, 48), "out_stride": (3072, 48, 1)}, "ranks"),
])
def test_call_signature_refusals_name_the_tensor(over, match):
    with pytest.raises(ArgumentError, match=match):
        select.call_signature("sm_90a", *_meta(**over))


def test_bias_of_wrong_length_or_dtype_is_refused():
    d, s, st = _meta()
    d["bias"], s["bias"], st["bias"] = "bf16", (47,), (1,)
    with pytest.raises(ArgumentError, match="length N = 48"):
        select.call_signature("sm_90a", d, s, st)
    d["bias"], s["bias"] = "f16", (48,)
    with pytest.raises(ArgumentError, match="out's dtype"):
        select.call_signature("sm_90a", d, s, st)


def test_shape_check_and_k_zero():
    assert select.check_shapes((5, 0), (0, 7), (5, 7), None) == (5, 7, 0, 1)
    assert select.check_shapes((3, 5, 8), (3, 8, 2), (3, 5, 2), (3, 5, 2)) == (5, 2, 8, 3)
    with pytest.raises(ArgumentError, match="do not agree"):
        select.check_shapes((5, 8), (9, 7), (5, 7), None)


def test_misalignment_is_named():
    assert select.misalignment("a", 1024, (4, 8), (8, 1), 2) is None
    assert "pointer" in select.misalignment("a", 1026, (4, 8), (8, 1), 2).message
    assert "stride 7" in select.misalignment("b", 1024, (4, 7), (7, 1), 2).message


# ------------------------------------------------------------------ model
def test_split_choices_respect_k_and_kind():
    assert select.split_choices(cand(), 128, 4096, 14336, 1) == (1,)
    assert select.split_choices(cand(split=True), 128, 4096, 256, 1) == (2,)  # 4 k-blocks
    assert select.split_choices(cand(split=True), 128, 4096, 100, 1) == ()
    # Whole waves on 132 SMs leave no tail to split: no split count is offered.
    assert select.split_choices(cand(split=True), 132 * 128, 256, 8192, 1, 132) == ()
    assert select.split_choices(cand(split=True), 133 * 128, 256, 8192, 1, 132)[:2] == (2, 3)


def test_model_splits_only_the_tail_wave():
    # 165 tiles of 128x256 (1.25 waves) with a long K: the hybrid's 1 + 1/S
    # waves beat 2 whole waves, and the same split count costs more when
    # every tile is split (a problem of exactly 132 tiles offers none).
    sk = cand(split=True)
    plain = cand()
    m, n, k = 33 * 128, 5 * 256, 8192
    assert select.estimate_us(sk, 4, m, n, k, 1, 132) < select.estimate_us(plain, 1, m, n, k, 1, 132)


def test_model_prefers_swap_and_split_for_decode_and_big_tiles_for_big():
    small = select.model_choice(CANDS, 4, 4096, 8192, 1, 132)
    assert small.candidate.swap_ab, small.label()
    big = select.model_choice(CANDS, 8192, 8192, 8192, 1, 132)
    assert (big.candidate.tile_m * big.candidate.tile_n) == 128 * 256 and not big.candidate.split_k


def test_swapped_clusters_along_the_weight_take_their_own_factors(monkeypatch):
    """A 4x1 cluster scales by cluster41_factor (not 2x2's cluster4_factor),
    a split-K 4x1 by cluster41_split (r32), a swapped 2x1 by
    swap_cluster2_factor; other shapes by none of them."""
    m, n, k = 142, 12928, 5456
    c41 = select.Candidate("q", 128, 144, 4, 1, swap_ab=True)
    c41s = select.Candidate("qs", 128, 144, 4, 1, swap_ab=True, split_k=True)
    c21 = select.Candidate("d", 128, 144, 2, 1, swap_ab=True)
    c22 = select.Candidate("s", 128, 128, 2, 2)
    plain21 = select.Candidate("p", 128, 256, 2, 1)
    splits = {c41s: 2}
    before = {c: select.estimate_us(c, splits.get(c, 1), m, n, k, 1, 132)
              for c in (c41, c41s, c21, c22, plain21)}
    monkeypatch.setitem(select.MODEL, "cluster41_factor", select.MODEL["cluster41_factor"] * 2)
    monkeypatch.setitem(select.MODEL, "cluster41_split", select.MODEL["cluster41_split"] * 5)
    monkeypatch.setitem(select.MODEL, "swap_cluster2_factor", select.MODEL["swap_cluster2_factor"] * 3)
    after = {c: select.estimate_us(c, splits.get(c, 1), m, n, k, 1, 132) for c in before}
    assert after[c41] == pytest.approx(2 * before[c41])
    assert after[c41s] == pytest.approx(5 * before[c41s])
    assert after[c21] == pytest.approx(3 * before[c21])
    assert after[c22] == pytest.approx(before[c22])
    assert after[plain21] == pytest.approx(before[plain21])


def test_four_cta_clusters_run_in_waves_of_the_clusters_the_gpu_co_schedules():
    """r32: a grid of 4-CTA clusters fills cluster_slots(4) clusters a wave
    (30 on 132 SMs since r33, the driver's count: 120 tiles), not SMs / 4
    (33: 132 tiles), so 124 tiles of a 4x1 cluster are two waves where 124
    tiles of a 2x1 are one."""
    c41 = select.Candidate("q", 128, 64, 4, 1, swap_ab=True)
    c21 = select.Candidate("d", 128, 64, 2, 1, swap_ab=True)
    k = 4096
    assert select.cluster_slots(4, 132) == 30

    def est(c, tiles):
        return select.estimate_us(c, 1, 8, 128 * tiles, k, 1, 132)
    assert est(c41, 124) > 1.4 * est(c41, 120)  # a second wave (the launch and HBM floor once)
    assert est(c21, 124) < 1.1 * est(c21, 120)


def test_model_splits_k_when_tiles_underfill_the_gpu():
    ch = select.model_choice(CANDS, 1024, 1024, 32768, 1, 132)
    assert ch.candidate.split_k and ch.splits > 1, ch.label()


def test_distance_is_log_scale_and_batch_aware():
    assert select.distance((1024, 4096, 4096, 1), (2048, 4096, 4096, 1)) == pytest.approx(1.0)
    assert select.distance((1024, 4096, 4096, 1), (1024, 4096, 4096, 2)) == pytest.approx(4.0)


def test_choose_uses_the_exact_table_row_else_the_model():
    rows = {(1024, 4096, 4096, 1): (CANDS[3].schedule, 1),
            (8, 4096, 4096, 1): (cand("128x64", swap=True, split=True).schedule, 6)}
    exact = select.choose(CANDS, 1024, 4096, 4096, 1, 132, rows)
    assert exact.source == "table" and exact.candidate == CANDS[3]
    # A shape near a row does not borrow its variant (select's docstring
    # says why): the model decides, as with no table. (1200 rows need more
    # 256-row tiles than 1024, so the row below does not carry either.)
    near = select.choose(CANDS, 1200, 4096, 4096, 1, 132, rows)
    assert near.source == "model"
    assert near == select.model_choice(CANDS, 1200, 4096, 4096, 1, 132)
    far = select.choose(CANDS, 65536, 256, 512, 1, 132, rows)
    assert far.source == "model"
    split_row = select.choose(CANDS, 8, 4096, 4096, 1, 132, rows)
    assert split_row.source == "table" and split_row.splits == 6


def test_choose_carries_a_row_up_to_an_m_its_tiles_still_cover():
    by_key = {c.key: c for c in CANDS}
    swap16, swap16sk, swap64sk = by_key["swap16"], by_key["swap16sk"], by_key["swap64sk"]
    rows = {(1, 4096, 4096, 1): (swap16sk.schedule, 2),
            (8, 4096, 4096, 1): (swap16sk.schedule, 4),
            (32, 4096, 4096, 1): (swap64sk.schedule, 3),
            (2, 4096, 8192, 1): (swap16.schedule, 1)}

    def pick(m, n=4096, k=4096, batch=1, cands=CANDS):
        return select.choose(cands, m, n, k, batch, 132, rows)

    # The largest smaller M whose variant covers M with the same tiles wins:
    # 2..7 tokens take the 1-token row, 9..16 the 8-token row (a 16-token tile).
    for m, splits in ((2, 2), (7, 2), (9, 4), (16, 4)):
        ch = pick(m)
        assert (ch.source, ch.candidate, ch.splits) == ("table-below", swap16sk, splits), m
    # 17 tokens need a second 16-token tile: no row below carries; the row at
    # 32 is above, so the model decides.
    assert pick(17) == select.model_choice(CANDS, 17, 4096, 4096, 1, 132)
    # The 64-token tile of the 32-token row covers 33..64.
    ch = pick(40)
    assert (ch.source, ch.candidate, ch.splits) == ("table-below", swap64sk, 3)
    assert pick(65).source == "model"
    # Only the same N, K and L carry; an exact row still comes first.
    assert pick(4, n=4104).source == "model"
    assert pick(4, batch=2).source == "model"
    assert pick(3, k=8192) == select.Choice(swap16, 1, "table-below")
    assert pick(8).source == "table"
    # A row whose variant the cache lacks is skipped, and the next one below counts.
    cands = [c for c in CANDS if c is not swap16sk]
    assert pick(12, cands=cands).source == "model"
    rows[(4, 4096, 4096, 1)] = (swap16.schedule, 1)
    assert pick(12, cands=cands) == select.Choice(swap16, 1, "table-below")


def test_row_below_falls_to_a_close_runner_up_that_covers_m():
    # r23: the 1-token row of bf16 10240x8192 was won by a one-token GEMV by
    # 0.4% over a 16-token swapped tile; 2..16 tokens fell to the model.
    gemv = select.Candidate("gemv", 1, 2, 1, 1, "m", 1, False, False, gemv=True)
    by_key = {c.key: c for c in CANDS}
    swap16, swap16sk = by_key["swap16"], by_key["swap16sk"]
    cands = CANDS + [gemv]
    assert swap16.label() == "128x16/1x1/m1/swap"

    def pick(m, row):
        return select.choose(cands, m, 4096, 4096, 1, 132, {(1, 4096, 4096, 1): row})

    for m in (2, 9, 16):
        assert pick(m, (gemv.schedule, 1, "128x16/1x1/m1/swap", 1.0036)) == select.Choice(
            swap16, 1, "table-below"), m
    # The runner-up's split count and stream-K come from its label.
    assert pick(4, (gemv.schedule, 1, "128x16/1x1/m1/swap/splitkx3", 1.01)) == select.Choice(
        swap16sk, 3, "table-below")
    assert pick(4, (gemv.schedule, 1, "128x16/1x1/m1/swap/streamk", 1.01)) == select.Choice(
        swap16sk, 0, "table-below")
    # Not when it was far behind at the row's M, not past its own tiles, not
    # when the cache lacks it or the label is not one; at M = 1 the row itself.
    model = select.model_choice(cands, 4, 4096, 4096, 1, 132)
    assert pick(4, (gemv.schedule, 1, "128x16/1x1/m1/swap", 1.2)) == model
    assert pick(17, (gemv.schedule, 1, "128x16/1x1/m1/swap", 1.0)).source == "model"
    assert pick(4, (gemv.schedule, 1, "128x32/1x1/m1/swap", 1.0)) == model
    assert pick(4, (gemv.schedule, 1, "128x16/1x1/m1/swap/splitkxq", 1.0)) == model
    assert pick(4, (gemv.schedule, 1, None, None)) == model
    assert pick(1, (gemv.schedule, 1, "128x16/1x1/m1/swap", 1.0)) == select.Choice(gemv, 1, "table")
    # A winner that covers M still comes first.
    assert pick(4, (swap16sk.schedule, 2, "128x16/1x1/m1/swap", 1.0)) == select.Choice(
        swap16sk, 2, "table-below")


def test_table_runner_up_fields_are_validated():
    row = {"signature": "gemm[sm_90a](a=bf16)", "family": "sm90_gemm", "kernel_sources": "s",
           "m": 1, "n": 8, "k": 8, "l": 1, "splits": 1, "us": 1.0,
           "variant": {"tile": "128x16", "cluster": "1x1"}}
    assert tables._row_problem(row) is None
    assert tables._row_problem({**row, "runner_up": "x", "margin": 1.0}) is None
    assert "runner_up" in tables._row_problem({**row, "runner_up": 3})
    for bad in ("1.1", float("nan"), 0.9, True):
        assert "margin" in tables._row_problem({**row, "margin": bad}), bad
    # a steady-state row (tune --steady-ms, r54) names its warm-up in ms
    assert tables._row_problem({**row, "steady_ms": 300}) is None
    assert tables._row_problem({**row, "steady_ms": 12.5}) is None
    for bad in (0, -1, float("inf"), "300", None, True):
        assert "steady_ms" in tables._row_problem({**row, "steady_ms": bad}), bad


def test_split_k_row_whose_split_count_cannot_run_here_falls_back_to_the_model():
    # The row names a split count that is too many for a K this short.
    sk = cand(split=True, key="sk256")
    rows = {(1024, 4096, 120, 1): (sk.schedule, 2)}
    assert select.choose(CANDS + [sk], 1024, 4096, 120, 1, 132, rows).source == "model"


def test_table_row_naming_a_missing_variant_falls_back():
    rows = {(1024, 4096, 4096, 1): (cand("256x128", "2x2").schedule, 1)}
    ch = select.choose(CANDS, 1024, 4096, 4096, 1, 132, rows)
    assert ch.source == "model"


def test_model_is_finite_and_positive_on_a_random_sample():
    rng = random.Random(7)
    for _ in range(500):
        m, n, k = rng.randint(1, 70000), rng.randint(8, 60000), rng.randint(8, 60000)
        ch = select.model_choice(CANDS, m, n, k, rng.choice([1, 3]), 132)
        t = select.estimate_us(ch.candidate, ch.splits, m, n, k, 1, 132)
        assert math.isfinite(t) and t > 0


def test_candidates_keep_the_newest_build_of_a_schedule():
    recs = [("old", {"tile": "128x256", "cluster": "1x1"}, "2026-01-01"),
            ("new", {"tile": "128x256", "cluster": "1x1"}, "2026-02-01"),
            ("other", {"tile": "128x128", "cluster": "1x1", "split_k": True}, "2026-01-05")]
    got = {c.key for c in select.candidates(recs)}
    assert got == {"new", "other"}


def test_pingpong_hides_most_of_the_fixed_cost_per_unit():
    """A pingpong candidate differs from its cooperative twin only by its
    constants (select.PINGPONG); on a short-K problem of many tiles, where
    the fixed cost per unit dominates, it is modelled faster."""
    coop = select.Candidate("c", 128, 128, 1, 1)
    pp = select.Candidate("p", 128, 128, 1, 1, pingpong=True)
    assert pp.schedule != coop.schedule and pp.label().endswith("/pp")
    assert pp.variant_fields()["pingpong"] is True
    short = [select.estimate_us(c, 1, 8192, 8192, 256, 1, 132) for c in (coop, pp)]
    assert short[1] < short[0]
    assert select.candidate_from_variant("k", {"tile": "128x128", "pingpong": True}) == \
        select.Candidate("k", 128, 128, 1, 1, pingpong=True)


def test_walk_that_rereads_an_operand_too_big_for_l2_ranks_below_one_that_does_not():
    """Tall M, short K (33476x4728x432 of the fit sample): the M-first walk
    of a 128x256 tile passes all 29 MB of A once per column of tiles, with
    that column's D between, more than the L2 holds; the N-first walk keeps
    B (4 MB) in L2 and reads A once. Where everything fits, no order reads
    anything again and the plain order keeps its place."""
    m1, m4, n4 = (cand("128x256", "2x1", r, w, key=f"{r}{w}") for r, w in (("m", 1), ("m", 4), ("n", 4)))
    big = (33476, 4728, 432)
    again = {c.key: select.rank_key(c, 1, *big, 1, 132)[1] for c in (m1, m4, n4)}
    assert again["n4"] == 0 and 0 < again["m4"] < again["m1"]
    # m1: 19 columns of tiles, the first wave runs one of them; 18 re-reads of A.
    assert again["m1"] == pytest.approx(18 * 33476 * 432 * 2)
    ranked = [ch.candidate.key for _, ch in select.ranked_choices([m1, m4, n4], *big, 1, 132)]
    assert ranked[0] == "n4" and ranked[-1] == "m1"
    small = (2048, 4096, 2048)  # 8 MB of A, 16 MB of B, 16 MB of D: fits
    assert all(select.rank_key(c, 1, *small, 1, 132)[1] == 0 for c in (m1, m4, n4))
    assert [ch.candidate.key for _, ch in select.ranked_choices([m1, m4, n4], *small, 1, 132)][0] == "m1"
    # A one-wave problem reads each operand once, whatever the order.
    assert select.rank_key(m1, 1, 2048, 2048, 65536, 1, 132)[1] == 0


def test_short_k_terms_price_the_store_the_reread_and_l2_resident_operands():
    """The three short-K terms of the model (r21), each against its own
    physical claim, with the other terms as shipped."""
    coop = select.Candidate("c", 128, 256, 2, 1)
    # The exposed store: at short K it is a share of the unit's time the
    # shipped constant adds; at long K the same absolute cost is noise.
    def unit(model_over, k):
        model = {**select.MODEL, **model_over}
        return select._unit_us(coop, k, 132, 2, model, store_bytes=2)
    added_short = unit({}, 640) - unit({"epi_hbm": 0.0}, 640)
    added_long = unit({}, 8192) - unit({"epi_hbm": 0.0}, 8192)
    # 128x256 bf16 tile, every SM storing: 64 KiB x 132 at the HBM rate.
    assert added_short == pytest.approx(select.MODEL["epi_hbm"] * 128 * 256 * 2 * 132
                                        / (select.MODEL["hbm_tbps"] * 1e12) * 1e6)
    assert added_short == pytest.approx(added_long)
    assert added_short / unit({}, 640) > 5 * added_long / unit({}, 8192)
    # Pingpong hides the same share of it as of the other fixed costs.
    pp = select.Candidate("p", 128, 128, 2, 1, pingpong=True)
    twin = select.Candidate("t", 128, 128, 2, 1)
    def fixed(c):
        with_store = select._unit_us(c, 64, 132, 2, select.MODEL)
        return with_store - select._unit_us(c, 64, 132, 2, {**select.MODEL, "epi_hbm": 0.0})
    assert fixed(pp) == pytest.approx(fixed(twin) * select.PINGPONG["unit_share"])
    # The re-read is paid beyond the HBM floor: an order that re-reads ranks
    # below one that does not even where the floor does not bind
    # (58472x4808x312, held-out: the M-first walk ran 1.36-1.40x the N-first).
    m1, n4 = (cand("128x256", "2x1", r, w, key=f"{r}{w}") for r, w in (("m", 1), ("n", 4)))
    tall = (58472, 4808, 312)
    est = {c.key: select.estimate_us(c, 1, *tall, 1, 132) for c in (m1, n4)}
    assert est["m1"] > est["n4"]
    again = select.rank_key(m1, 1, *tall, 1, 132)[1]
    no_add = select.estimate_us(m1, 1, *tall, 1, 132, model={**select.MODEL, "reread_add": 0.0})
    assert est["m1"] - no_add == pytest.approx(
        select.MODEL["reread_add"] * again / (select.MODEL["hbm_tbps"] * 1e12) * 1e6)
    # Operands that fit in L2 feed a load-bound unit faster; ones that do not, as before.
    narrow = select.Candidate("n", 128, 128, 2, 1)
    fits = (5281, 4768, 608)        # A and B: 12 MB
    spills = (5281, 47680, 608)     # A and B: 64 MB
    def slower_without(shape):
        base = select.estimate_us(narrow, 1, *shape, 1, 132)
        flat = select.estimate_us(narrow, 1, *shape, 1, 132,
                                  model={**select.MODEL, "l2_resident_share": select.MODEL["l2_share"]})
        return flat / base
    assert slower_without(fits) > 1.05 and slower_without(spills) == pytest.approx(1.0)


def test_model_keeps_the_worst_held_out_pick_off_split_k_at_short_k(monkeypatch):
    """5281x4768x608 (held-out, both dtypes): the shipped model before r21
    picked 128x256/2x1 split-K x4, live 1.34x the best known option
    (128x128/2x1 pingpong); with the short-K terms it picks an unsplit tile.
    Candidates: that signature's schedules as the r20 sweep recorded them."""
    cands = [cand("128x256", "2x1", "m", 1, key="c1"), cand("128x256", "2x1", "m", 1, split=True, key="s"),
             select.Candidate("p", 128, 128, 2, 1, pingpong=True), cand("128x192", "2x1", "m", 1, key="w"),
             cand("256x128", "2x1", "m", 1, key="t")]
    pick = select.model_choice(cands, 5281, 4768, 608, 1, 132)
    assert not pick.candidate.split_k, pick.label()
    for name, r20 in (("epi_hbm", 0.0), ("reread_add", 0.0), ("l2_resident_share", select.MODEL["l2_share"])):
        monkeypatch.setitem(select.MODEL, name, r20)
    assert select.model_choice(cands, 5281, 4768, 608, 1, 132).candidate.split_k


# ------------------------------------------------------------------ tables
GPU = tables.gpu_identity("NVIDIA H200", 132, "9.0")
SIG = "gemm[sm_90a](a=bf16,a_major=k,align=16,b=bf16,b_major=k,c=-,d=bf16,d_major=n,rank=2)"


def row(**over):
    r = {"signature": SIG, "family": "sm90_gemm", "kernel_sources": "src1", "m": 128, "n": 4096,
         "k": 4096, "l": 1, "splits": 1, "us": 12.5,
         "variant": {"tile": "128x256", "cluster": "2x1", "raster": "m", "swizzle": 1,
                     "swap_ab": False, "split_k": False}}
    r.update(over)
    return r


def doc(rows):
    return {"format": tables.TABLE_FORMAT, "version": 1, "gpu": GPU, "rows": rows}


def test_table_validation_refuses_foreign_and_malformed():
    tables.validate_table(doc([row()]), "t")
    for bad, match in [({"format": "x"}, "not a cutlass-aot selection table"),
                       (doc([row(m=0)]), "row 0: field 'm'"),
                       (doc([row(us=float("nan"))]), "'us'"),
                       (doc([row(variant={"tile": "128x256"})]), "variant"),
                       (dict(doc([]), gpu={"name": "x"}), "gpu")]:
        with pytest.raises(IntegrityError, match=match):
            tables.validate_table(bad, "t")


def test_a_table_handed_in_may_not_answer_one_problem_twice(tmp_path):
    """r51: two rows for one problem (the last one read won, unsaid) are
    refused where a user hands a table in (build --tuning, a manifest's
    tuning:). A table already in a cache, a shard or a registry is read as
    before, since r50's build shipped hand-written ones as given."""
    dup = doc([row(), row(m=64), row(us=9.0, splits=2)])
    with pytest.raises(IntegrityError, match="rows 0 and 2 both answer .* at M=128 N=4096 K=4096 "
                                             "L=1: keep one"):
        tables.validate_table(dup, "t", one_row_a_problem=True)
    tables.validate_table(dup, "t")  # a reader of cache, shard and registry bytes
    assert tables.parse_table_bytes(json.dumps(dup).encode(), "t")["rows"][2]["us"] == 9.0
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(dup))
    with pytest.raises(UsageError, match="keep one"):
        tables.load_table_file(path)
    tables.validate_table(doc([row(), row(signature=SIG.replace("bf16", "f16"))]), "t",
                          one_row_a_problem=True)


def test_table_files_past_what_json_and_floats_hold_are_clear_errors(tmp_path):
    """An int past the JSON parser's digit limit and nesting past its
    recursion limit: UsageError (exit 2) from ``build --tuning``'s reader,
    IntegrityError from bytes a registry or shard hands over; never
    RecursionError or a bare ValueError. An int too large for a float in
    'us' or 'margin' is a finite number: valid, not an OverflowError."""
    for big in (doc([row(us=10**400)]), doc([row(runner_up="x", margin=10**400)])):
        tables.validate_table(big, "t")
        tables.parse_table_bytes(json.dumps(big).encode(), "t")
    cases = {"digits": json.dumps(doc([row()])).replace('"m": 128', '"m": ' + "9" * 5000),
             "nesting": "[" * 100000 + "]" * 100000}
    for name, text in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        with pytest.raises(UsageError, match="selection table"):
            tables.load_table_file(path)
        with pytest.raises(IntegrityError, match="selection table"):
            tables.parse_table_bytes(text.encode(), name)


def test_a_signature_of_split_k_variants_only_serves_what_no_split_suits():
    """K under two k-blocks a split, or tiles that fill whole waves: no split
    count is offered, and the variant runs as one split (data-parallel)
    instead of the call failing with a bare ValueError."""
    c = select.Candidate("k", 128, 256, 1, 1, split_k=True)
    for m, n, k in ((4096, 4096, 64), (128 * 12, 256 * 22, 4096)):
        assert select.split_choices(c, m, n, k, 1, 132) == ()
        got = select.choose([c], m, n, k, 1, 132)
        assert (got.candidate.key, got.splits) == ("k", 1)
        assert [ch.splits for _, ch in select.ranked_choices([c], m, n, k, 1, 132)] == [1]


def test_a_row_binds_to_the_variant_it_timed_when_only_warps_bk_or_stages_differ():
    """sm80_gemm variants that differ only in warps, bk or stages are separate
    candidates; a row names its variant's with them (variant_fields), binds
    to that entry, and choose launches it, not the other."""
    va = {"tile": "128x128", "cluster": "1x1", "swizzle": 1, "warps": "2x2", "bk": 32, "stages": 4}
    vb = {"tile": "128x128", "cluster": "1x1", "swizzle": 1, "warps": "4x2", "bk": 64, "stages": 3}
    sig = "gemm[sm_80](a=bf16,...)"
    cands = select.candidates([("keyA", va, "2026-01-01"), ("keyB", vb, "2026-01-02")])
    assert len(cands) == 2
    for mine in cands:
        r = {"signature": sig, "family": "sm80_gemm", "kernel_sources": "S", "artifact": "a" * 64,
             "m": 512, "n": 512, "k": 512, "l": 1, "variant": mine.variant_fields(), "splits": 1, "us": 10.0}
        bound, counts = tables.bind([r], [(sig, "sm80_gemm", va, "S", "a" * 64),
                                          (sig, "sm80_gemm", vb, "S", "b" * 64)])
        assert counts["used"] == 1
        got = select.choose(cands, 512, 512, 512, 1, 108, bound[sig])
        assert got.source == "table" and got.candidate.key == mine.key


def test_bind_keeps_rows_across_keys_and_drops_stale_sources_and_missing_variants():
    variant = row()["variant"]
    sha = "ab" * 32
    entries = [(SIG, "sm90_gemm", dict(variant, a="bf16"), "src1", sha)]
    bound, counts = tables.bind([row(), row(m=256, variant=dict(variant, tile="64x128")),
                                 row(m=512, kernel_sources="src0"),
                                 row(m=1024, kernel_sources="src0", artifact="cd" * 32),
                                 row(m=2048, kernel_sources="src0", artifact=sha)], entries)
    # Other sources bind only when the entry is the very file the row timed.
    assert counts == {"used": 2, "same_bytes": 1, "missing_variant": 1, "stale_source": 2}
    assert bound[SIG][(128, 4096, 4096, 1)] == ((128, 256, 2, 1, "m", 1, False, False, False, 1, 0, ()), 1, None,
                                                None, 12.5)
    assert set(bound[SIG]) == {(128, 4096, 4096, 1), (2048, 4096, 4096, 1)}
    # An entry whose sha256 is unknown binds by sources only.
    _, counts = tables.bind([row(m=2048, kernel_sources="src0", artifact=sha)],
                            [(SIG, "sm90_gemm", variant, "src1", None)])
    assert counts["stale_source"] == 1


def test_restamp_moves_rows_whose_bytes_are_unchanged_and_leaves_changed_code_stale():
    variant = row()["variant"]
    other = dict(variant, tile="64x128")
    sha, sha2 = "ab" * 32, "ef" * 32
    rows = [row(kernel_sources="old", artifact=sha),           # same bytes: restamped
            row(m=256, kernel_sources="old", artifact="cd" * 32),  # code changed: stays stale
            row(m=512, kernel_sources="new"),                  # current, no artifact: filled
            row(m=1024, kernel_sources="new", artifact=sha),   # current
            row(m=2048, variant=dict(variant, tile="256x128"))]  # variant gone
    entries = [(SIG, "sm90_gemm", variant, "new", sha), (SIG, "sm90_gemm", other, "new", sha2)]
    out, counts, changed = tables.restamp(rows, entries)
    assert counts == {"current": 1, "filled": 1, "restamped": 1, "rebuilt": 0, "changed": 1,
                      "missing_variant": 1}
    assert changed == [rows[1]]
    assert out[0]["kernel_sources"] == "new" and out[0]["artifact"] == sha
    assert out[1] == rows[1] and out[4] == rows[4]
    assert out[2]["artifact"] == sha and "artifact" not in rows[2]
    _, bound = tables.bind(out, entries)
    assert bound == {"used": 3, "same_bytes": 0, "missing_variant": 1, "stale_source": 1}
    with pytest.raises(IntegrityError, match="artifact"):
        tables.validate_table(doc([row(artifact="not-a-digest")]), "t")


def test_restamp_with_a_baseline_moves_rows_whose_code_a_rebuild_shows_unchanged():
    """The timed build came from another toolchain (its bytes match neither build here): a
    row moves only where a build of its own sources, by this toolchain, has the new bytes."""
    variant = row()["variant"]
    other = dict(variant, tile="64x128")
    new_sha, new_sha2, timed = "ab" * 32, "ef" * 32, "cd" * 32
    rows = [row(kernel_sources="old", artifact=timed),                        # same code: rebuilt
            row(m=256, kernel_sources="old", artifact=timed, variant=other),  # code changed
            row(m=512, kernel_sources="older", artifact=timed)]               # baseline is not its sources
    entries = [(SIG, "sm90_gemm", variant, "new", new_sha), (SIG, "sm90_gemm", other, "new", new_sha2)]
    baseline = [(SIG, "sm90_gemm", variant, "old", new_sha), (SIG, "sm90_gemm", other, "old", "99" * 32)]
    out, counts, changed = tables.restamp(rows, entries, baseline)
    assert (counts["rebuilt"], counts["changed"]) == (1, 2)
    assert out[0]["kernel_sources"] == "new" and out[0]["artifact"] == new_sha
    assert changed == [rows[1], rows[2]] and out[1:] == rows[1:]
    # Without the baseline nothing moves: the timed bytes are nowhere here.
    assert tables.restamp(rows, entries)[1]["changed"] == 3


def test_restamp_refuses_a_cache_that_lists_one_variant_from_two_source_digests():
    """An incremental build after a kernel edit lists the old build's entries next to the new
    ones until gc drops them; a row could then meet the old entry and read as current (r19:
    193 'current' rows where a clean cache gave 3). Restamp refuses and names the fix."""
    variant = row()["variant"]
    entries = [(SIG, "sm90_gemm", variant, "old", "ab" * 32), (SIG, "sm90_gemm", variant, "new", "cd" * 32),
               (SIG, "sm90_gemm", dict(variant, tile="64x128"), "new", "ef" * 32)]
    assert tables.mixed_sources(entries) == [(SIG, "sm90_gemm", tables.schedule_of(variant))]
    with pytest.raises(CacheError, match="cutlass-aot gc") as err:
        tables.restamp([row(kernel_sources="old", artifact="ab" * 32)], entries)
    assert err.value.variants == [(SIG, "sm90_gemm", tables.schedule_of(variant))]
    assert err.value.which == "cache"
    with pytest.raises(CacheError, match="the baseline holds 1 variant") as err:
        tables.restamp([row(kernel_sources="old", artifact="ab" * 32)], entries[1:], entries)
    assert err.value.which == "baseline"
    assert tables.mixed_sources(entries[1:]) == []
    assert tables.restamp([row(kernel_sources="old", artifact="ab" * 32)], entries[1:])[1]["changed"] == 1


def test_binding_meets_the_newest_build_whatever_the_index_order():
    """Before gc, an index lists an older build of a variant next to the new one, in key order
    (no relation to age). Dispatch launches the newest build (select.candidates), so a row
    measured on the older code must read as stale, and one measured on the newer must bind."""
    variant = row()["variant"]
    old = {"signature_text": SIG, "family": "sm90_gemm", "variant": variant, "kernel_sources": "old",
           "sha256": "ab" * 32, "built_at": "2026-12-01T10:00:00+00:00"}
    new = dict(old, kernel_sources="new", sha256="cd" * 32, built_at="2026-12-02T01:00:00+00:00")
    for listed in ([old, new], [new, old]):
        entries = tables.entries_of((r, None) for r in listed)
        assert [e[3] for e in entries] == ["old", "new"]
        _, counts = tables.bind([row(kernel_sources="old", artifact="ab" * 32)], entries)
        assert (counts["used"], counts["stale_source"]) == (0, 1), listed
        _, counts = tables.bind([row(kernel_sources="new")], entries)
        assert (counts["used"], counts["stale_source"]) == (1, 0), listed
        assert tables.binding_rows([row(kernel_sources="old", artifact="ab" * 32)], entries) == []
    # the run side's own candidates agree: the newest build of the schedule
    cands = select.candidates([("k" * 64, dict(variant, split_k=False), old["built_at"]),
                               ("j" * 64, dict(variant, split_k=False), new["built_at"])])
    assert [c.key for c in cands] == ["j" * 64]


def test_gpu_binding():
    assert tables.gpu_matches(GPU, "NVIDIA H200", 132, "9.0")
    assert not tables.gpu_matches(GPU, "NVIDIA H100 80GB HBM3", 132, "9.0")
    assert not tables.gpu_matches(GPU, "NVIDIA H200", 114, "9.0")


def test_merge_rows_replaces_the_same_problem():
    merged = tables.merge_rows([row(), row(m=256)], [row(us=9.0)])
    assert len(merged) == 2 and {r["us"] for r in merged} == {9.0, 12.5}


# ----------------------------------------------------------- shape sets
def test_shape_groups_listed_and_bucketed():
    probs = parse_groups([{"a": "bf16", "shapes": [[1, 4096, 4096], [1, 8, 16, 32]]},
                          {"a": "bf16", "rank": 3, "shapes": [[2, 8, 16, 32]]},
                          {"a": "f16", "m": [1, 16], "nk": [[4096, 4096], [14336, 4096]]}], "t")
    assert len(probs) == 7
    assert probs[1].dims == (8, 16, 32, 1)
    assert probs[2].dims == (8, 16, 32, 2) and probs[2].layout[6] == 3
    assert probs[3].layout[0] == "f16" and probs[3].dims == (1, 4096, 4096, 1)
    assert (probs[0].bias, probs[0].act) == (None, "none")
    epi = parse_groups([{"a": "bf16", "bias": "bf16", "act": "gelu", "m": [1024], "nk": [[6144, 4096]]}], "t")
    assert (epi[0].bias, epi[0].act, epi[0].dims) == ("bf16", "gelu", (1024, 6144, 4096, 1))
    assert probs[0].c is None and epi[0].c is None
    # A residual group: C takes D's dtype (dispatch takes no other), and the
    # same dims with and without C are two problems (two signatures).
    res = parse_groups([{"a": "f16", "d": "f32", "with_c": True, "shapes": [[8, 16, 32]]},
                        {"a": "f16", "d": "f32", "shapes": [[8, 16, 32]]}], "t")
    assert [(p.c, p.dims) for p in res] == [("f32", (8, 16, 32, 1)), (None, (8, 16, 32, 1))]


def test_shape_sets_time_each_problem_once():
    """A problem listed twice (in a group, across groups, or across shape
    files and a manifest) is one problem: the tuner would time it again."""
    probs = parse_groups([{"a": "bf16", "shapes": [[1, 8, 16], [2, 8, 16], [1, 8, 16]]},
                          {"a": "bf16", "m": [2, 1], "nk": [[8, 16]]},
                          {"a": "bf16", "bias": "bf16", "shapes": [[1, 8, 16]]}], "t")
    assert [(p.dims, p.bias) for p in probs] == [((1, 8, 16, 1), None), ((2, 8, 16, 1), None),
                                                ((1, 8, 16, 1), "bf16")]


@pytest.mark.parametrize("bad,match", [
    ([], "non-empty list"), ([{"a": "f32", "shapes": [[1, 2, 3]]}], "a must be"),
    ([{"a": "bf16"}], "give shapes"), ([{"a": "bf16", "shapes": [[1, 2]]}], "is not"),
    ([{"a": "bf16", "shapes": [[0, 2, 3]]}], "dimension"), ([{"a": "bf16", "zz": 1}], "unknown keys"),
    ([{"a": "bf16", "bias": "f64", "shapes": [[1, 2, 3]]}], "bias must be"),
    ([{"a": "bf16", "act": "tanh", "shapes": [[1, 2, 3]]}], "act must be one of"),
    ([{"a": "bf16", "with_c": "bf16", "shapes": [[1, 2, 3]]}], "with_c must be true or false"),
    ([{"a": "bf16", 1: "x", "foo": "y", "shapes": [[1, 2, 3]]}], "unknown keys"),  # mixed key types
    ([{"a": "bf16", "shapes": [[8, 1, 2, 3]]}], "rank 2 has no batch"),  # was timed as L=1, filed as L=8
    ([{"a": "bf16", "rank": 2.0, "shapes": [[1, 2, 3]]}], "rank must be"),
    # A pasted range: 37 KB of m x nk that would expand to 4M problems, refused before expanding.
    ([{"a": "bf16", "m": list(range(1, 4097)), "nk": [[n, 4096] for n in range(8, 8200, 8)]}],
     "expands to 4194304 problems"),
    ([{"a": "bf16", "shapes": [[1, 8, 8]] * (MAX_PROBLEMS + 1)}], "more than"),
])
def test_malformed_shape_sets_are_clear_errors(bad, match):
    with pytest.raises(UsageError, match=match):
        parse_groups(bad, "t")


def test_shape_log_feeds_tune_and_skips_bad_lines(tmp_path):
    from cutlass_aot.shapelog import format_line  # noqa: PLC0415 - local to this test

    sig = gemm_signature("sm_90a", a="bf16", b="bf16", d="bf16", c=None, a_major="k",
                         b_major="k", d_major="n", rank=2)
    log = tmp_path / "shapes.log"
    good = format_line(sig, 7, 4096, 4096, 1, "miss")
    log.write_bytes(good + good + format_line(sig, 7, 4096, 0, 1, "hit") + b"{not json\n"
                    + good[: len(good) // 2])
    probs, skipped = read_shape_log([log])
    assert skipped == 2 and len(probs) == 1  # duplicates collapse, K = 0 is not tunable
    assert probs[0][1].dims == (7, 4096, 4096, 1) and probs[0][1].layout[4] == "k"
    assert (probs[0][1].bias, probs[0][1].act) == (None, "none")
    # A logged epilogue call is tuned on its own signature (until this round
    # the log's bias and act were dropped and the plain signature measured).
    fused = gemm_signature("sm_90a", a="bf16", b="bf16", d="bf16", c=None, a_major="k",
                           b_major="k", d_major="n", rank=2, bias="bf16", act="gelu")
    log.write_bytes(format_line(fused, 9, 512, 256, 1, "hit"))
    (text, prob), = read_shape_log([log])[0]
    assert text == fused.text() and (prob.bias, prob.act) == ("bf16", "gelu")


def test_shape_log_records_a_shape_file_could_not_state_are_skipped_and_counted(tmp_path):
    """--from-log once passed a logged record straight to the tuner: a huge M,
    rank 2 with L > 1, or a call with C or 8-byte alignment (timed and filed
    under the plain 16-byte signature). Each was then skipped and counted;
    since r64 a call with C is tuned on its own signature, with C in D's
    dtype (a C of another dtype, which dispatch refuses, is still skipped)."""
    from cutlass_aot.shapelog import format_line  # noqa: PLC0415 - local to this test

    def sig(**kw):
        base = dict(a="bf16", b="bf16", d="bf16", c=None, a_major="k", b_major="k", d_major="n",
                    rank=2)
        return gemm_signature("sm_90a", **(base | kw))

    log = tmp_path / "shapes.log"
    log.write_bytes(format_line(sig(), 7, 4096, 4096, 1, "miss")
                    + format_line(sig(), 10 ** 30, 4096, 4096, 1, "miss")
                    + format_line(sig(), 7, 4096, 4096, 8, "miss")
                    + format_line(sig(c="bf16"), 64, 256, 256, 1, "miss")
                    + format_line(sig(c="f16"), 64, 256, 256, 1, "miss")
                    + format_line(sig(align=8), 64, 256, 256, 1, "miss")
                    + format_line(sig(rank=3), 64, 256, 256, 4, "miss"))
    probs, skipped = read_shape_log([log])
    assert skipped == 4, probs
    assert sorted((p.dims, p.c or "-") for _, p in probs) == [
        ((7, 4096, 4096, 1), "-"), ((64, 256, 256, 1), "bf16"), ((64, 256, 256, 4), "-")]
    assert all(p.layout[6] in (2, 3) for _, p in probs)
    # the tuner files each under the signature it was logged with
    assert {text for text, p in probs if p.c} == {sig(c="bf16").text()}


def test_a_logged_signature_with_a_field_this_version_does_not_know_is_skipped(tmp_path):
    """r51: a record whose signature carried an extra field (a newer
    writer's, say a scale dtype) was tuned as the plain signature and its
    answer filed under the record's. It is skipped and counted now."""
    from cutlass_aot.shapelog import format_line  # noqa: PLC0415 - local to this test
    from cutlass_aot.signature import Signature  # noqa: PLC0415

    plain = gemm_signature("sm_90a", a="bf16", b="bf16", d="bf16", c=None, a_major="k",
                           b_major="k", d_major="n", rank=2)
    newer = Signature.make("gemm", "sm_90a", dict(plain.fields) | {"scale": "f32"})
    log = tmp_path / "shapes.log"
    log.write_bytes(format_line(plain, 7, 4096, 4096, 1, "miss")
                    + format_line(newer, 9, 4096, 4096, 1, "miss"))
    probs, skipped = read_shape_log([log])
    assert skipped == 1 and [p.dims for _, p in probs] == [(7, 4096, 4096, 1)], probs


# --------------------------------------------------------------- the CLI
def test_build_tuning_ships_a_table_and_info_shows_it(built_cache, tmp_path):
    cache = copy_cache(built_cache.path, tmp_path / "cache")
    table = tmp_path / "t.json"
    table.write_text(json.dumps(doc([row()])))
    r = CliRunner().invoke(cli, ["build", str(built_cache.manifest), "--cache-dir", str(cache),
                                 "--tuning", str(table), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["tables"][0]["rows"] == 1
    idx = json.loads((cache / "index.json").read_text())
    rec = next(iter(idx["tables"].values()))
    assert (cache / rec["path"]).is_file()
    info = CliRunner().invoke(cli, ["info", "--cache-dir", str(cache)])
    assert "NVIDIA H200 (132 SMs, sm 9.0): 1 rows" in info.output
    # A table from another GPU sits in the cache but is not used here.
    from cutlass_aot.run.load import Cache  # noqa: PLC0415 - local to this test

    c = Cache(cache)
    status = c.table_status("NVIDIA H100", 132, "9.0")
    assert status["table"] is None and "measured on NVIDIA H200" in status["reason"]
    make_tree_writable(cache)


def test_tampered_table_falls_back_to_the_model_with_a_warning(built_cache, tmp_path):
    cache = copy_cache(built_cache.path, tmp_path / "cache")
    table = tmp_path / "t.json"
    table.write_text(json.dumps(doc([row()])))
    assert CliRunner().invoke(cli, ["build", str(built_cache.manifest), "--cache-dir", str(cache),
                                    "--tuning", str(table)]).exit_code == 0
    idx = json.loads((cache / "index.json").read_text())
    path = cache / next(iter(idx["tables"].values()))["path"]
    path.chmod(0o644)
    path.write_bytes(path.read_bytes().replace(b"12.5", b"99.5"))
    from cutlass_aot.run.load import Cache  # noqa: PLC0415 - local to this test

    c = Cache(cache)
    with pytest.warns(RuntimeWarning, match="does not match its index record"):
        status = c.table_status("NVIDIA H200", 132, "9.0")
    assert "falls back to the model" in status["reason"]
    make_tree_writable(cache)


@pytest.mark.parametrize("content,match", [("{", "cannot read"), ('{"format": "x"}', "not a cutlass-aot")])
def test_build_tuning_refuses_a_bad_table(built_cache, tmp_path, content, match):
    cache = copy_cache(built_cache.path, tmp_path / "cache")
    table = tmp_path / "t.json"
    table.write_text(content)
    r = CliRunner().invoke(cli, ["build", str(built_cache.manifest), "--cache-dir", str(cache),
                                 "--tuning", str(table)])
    assert r.exit_code == 2 and match in r.output, r.output
    make_tree_writable(cache)


def test_tune_without_problems_or_gpu_exits_2(built_cache, tmp_path):
    r = CliRunner().invoke(cli, ["tune", "--cache-dir", str(built_cache.path)])
    assert r.exit_code == 2 and "nothing to tune" in r.output
    shapes = tmp_path / "s.yaml"
    shapes.write_text("- a: bf16\n  shapes: [[128, 256, 256]]\n")
    r = CliRunner().invoke(cli, ["tune", "--cache-dir", str(built_cache.path), "--shapes", str(shapes)])
    assert r.exit_code == 2 and "CUDA GPU" in r.output
    shapes.write_text("- a: bf16\n  shapes: [[128, 256]]\n")
    r = CliRunner().invoke(cli, ["tune", "--cache-dir", str(built_cache.path), "--shapes",
                                 str(shapes), "--json"])
    assert r.exit_code == 2 and json.loads(r.output)["ok"] is False


def _row_for_entry(cache_dir):
    idx = json.loads((cache_dir / "index.json").read_text())
    rec = next(iter(idx["entries"].values()))
    v = rec["variant"]
    return row(signature=rec["signature_text"], family=rec["family"],
               kernel_sources=rec.get("kernel_sources") or "x",
               variant={f: v.get(f) for f in ("tile", "cluster", "raster", "swizzle", "swap_ab", "split_k")})


def test_rows_of_unchanged_bytes_bind_and_restamp_on_a_real_cache(built_cache, tmp_path):
    """A row measured on other kernel sources binds when the cache's artifact is the file it
    timed, and build_scripts/restamp_table.py moves it to the cache's sources; a row whose
    artifact differs stays stale and the script exits 1 naming it."""
    import subprocess  # noqa: PLC0415 - local to this test
    import sys  # noqa: PLC0415

    from cutlass_aot.run.load import Cache  # noqa: PLC0415 - local to this test

    cache = copy_cache(built_cache.path, tmp_path / "cache")
    rec = next(iter(json.loads((cache / "index.json").read_text())["entries"].values()))
    same = dict(_row_for_entry(cache), kernel_sources="0" * 64, artifact=rec["sha256"])
    changed = dict(same, m=256, artifact="1" * 64)
    table = tmp_path / "t.json"
    table.write_text(json.dumps(doc([same, changed])))
    res = CliRunner().invoke(cli, ["build", str(built_cache.manifest), "--cache-dir", str(cache),
                                   "--tuning", str(table)])
    # build ships the table (exit 0) and says which rows will not bind.
    assert res.exit_code == 0, res.output
    assert ("warning: selection table for NVIDIA H200 (132 SMs, sm 9.0): 1 of 2 rows bind; "
            "1 measured older kernel code and 0 name variants this cache lacks") in res.stderr
    res = CliRunner().invoke(cli, ["build", str(built_cache.manifest), "--cache-dir", str(cache),
                                   "--tuning", str(table), "--json"])
    assert json.loads(res.stdout)["tables"][0]["binding"] == {
        "used": 1, "same_bytes": 1, "missing_variant": 0, "stale_source": 1}
    status = Cache(cache).table_status("NVIDIA H200", 132, "9.0")
    assert (status["used"], status["same_bytes"], status["stale_source"]) == (1, 1, 1), status
    info = CliRunner().invoke(cli, ["info", "--cache-dir", str(cache)])
    assert "1 rows bind (1 by unchanged artifact bytes), 0 name variants this cache lacks, " \
           "1 measured older kernel code" in info.output, info.output
    script = REPO / "build_scripts" / "restamp_table.py"
    res = subprocess.run([sys.executable, str(script), str(table), "--cache-dir", str(cache)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "restamped=1 rebuilt=0 changed=1" in res.stdout, (res.stdout, res.stderr)
    assert "re-run `cutlass-aot tune`" in res.stderr and "256x" in res.stdout
    rows = json.loads(table.read_text())["rows"]
    assert [r["kernel_sources"] for r in rows] == [rec["kernel_sources"], "0" * 64]
    res = subprocess.run([sys.executable, str(script), str(table), "--cache-dir", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "no cache directory" in res.stderr, res.stderr
    # A cache that holds none of the table's variants is the wrong cache:
    # exit 2, the table untouched; one that lacks some rows' variants: exit 1.
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps(doc([dict(same, variant=dict(same["variant"], tile="64x16"))])))
    before = foreign.read_bytes()
    res = subprocess.run([sys.executable, str(script), str(foreign), "--cache-dir", str(cache)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "holds none of the 1 variants" in res.stderr, res.stderr
    assert foreign.read_bytes() == before
    # A --baseline built from sources no row was measured on proves nothing: exit 2.
    res = subprocess.run([sys.executable, str(script), str(foreign), "--cache-dir", str(cache),
                          "--baseline", str(cache)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "was not built from the sources" in res.stderr, res.stderr
    assert foreign.read_bytes() == before
    part = tmp_path / "part.json"
    part.write_text(json.dumps(doc([same, dict(same, m=512, variant=dict(same["variant"], tile="64x16"))])))
    res = subprocess.run([sys.executable, str(script), str(part), "--cache-dir", str(cache)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "missing_variant=1" in res.stdout, (res.stdout, res.stderr)
    assert "1 rows name variants" in res.stderr
    # The index still lists an older build of one variant (what an incremental
    # build leaves until gc): exit 2, the table untouched, gc named.
    idx_path = cache / "index.json"
    idx = json.loads(idx_path.read_text())
    key, rec0 = next(iter(idx["entries"].items()))
    idx["entries"]["f" * 64] = dict(rec0, key="f" * 64, kernel_sources="0" * 64,
                                   path=f"entries/{'f' * 64}/kernel.so")
    idx_path.chmod(0o644)
    idx_path.write_text(json.dumps(idx))
    before = part.read_bytes()
    res = subprocess.run([sys.executable, str(script), str(part), "--cache-dir", str(cache)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "cutlass-aot gc" in res.stderr and "nothing written" in res.stderr, res.stderr
    assert part.read_bytes() == before
    make_tree_writable(cache)


def test_gc_drops_rows_of_removed_variants_and_verify_checks_tables(built_cache, tmp_path):
    cache = copy_cache(built_cache.path, tmp_path / "cache")
    table = tmp_path / "t.json"
    table.write_text(json.dumps(doc([_row_for_entry(cache), row(m=999)])))
    assert CliRunner().invoke(cli, ["build", str(built_cache.manifest), "--cache-dir", str(cache),
                                    "--tuning", str(table)]).exit_code == 0
    r = CliRunner().invoke(cli, ["verify", "--cache-dir", str(cache)])
    assert r.exit_code == 0 and "entries and 1 selection table: 0 problems" in r.output, r.output
    # gc keeping nothing: every row's variant is gone (one was never there),
    # so the table is republished without them.
    r = CliRunner().invoke(cli, ["gc", "--cache-dir", str(cache), "--older-than", "0s", "--json"])
    assert r.exit_code == 0, r.output
    assert list(json.loads(r.output)["table_rows_dropped"].values()) == [2]
    idx = json.loads((cache / "index.json").read_text())
    rec = next(iter(idx["tables"].values()))
    assert rec["rows"] == 0
    (cache / rec["path"]).chmod(0o644)
    (cache / rec["path"]).write_text("{}")
    r = CliRunner().invoke(cli, ["verify", "--cache-dir", str(cache)])
    assert r.exit_code == 1 and "selection table" in r.output
    r = CliRunner().invoke(cli, ["info", "--cache-dir", str(cache)])
    assert r.exit_code == 0 and "not usable" in r.output and "do not match the index record" in r.output
    make_tree_writable(cache)


def test_signature_order_prefers_the_aligned_wgmma_signature_staged_then_wider_alignment():
    sig = gemm_signature("sm_90a", a="bf16", b="bf16", d="bf16", c=None, a_major="k",
                         b_major="k", d_major="n", rank=2)
    order = select.signature_order(sig, 16, ["sm_90a", "sm_90"])
    assert [(s.arch, s.get("align")) for s in order][:3] == [("sm_90a", 16), ("sm_90", 16), ("sm_90a", 8)]
    assert not any(select.staged(s, 16) for s in order)
    # An odd N (2-byte strides): the 16-byte variants serve it staged (copies
    # into aligned scratch), and only then align-2 variants natively.
    low = select.signature_order(sig, 2, ["sm_90a", "sm_90"])
    assert [(s.arch, s.get("align")) for s in low] == [
        ("sm_90a", 16), ("sm_90", 16), ("sm_90a", 2), ("sm_90", 2)]
    assert [select.staged(s, 2) for s in low] == [True, True, False, False]
    assert [s.get("align") for s in select.signature_order(sig, 8, ["sm_90"])] == [16, 8, 4, 2]


def test_sm80_variants_are_told_apart_by_warps_and_stages():
    recs = [("a", {"tile": "128x128", "warps": "2x2", "stages": 3}, "1"),
            ("b", {"tile": "128x128", "warps": "2x4", "stages": 3}, "2"),
            ("c", {"tile": "128x128", "warps": "2x4", "stages": 3}, "3")]
    got = select.candidates(recs)
    assert {c.key for c in got} == {"a", "c"}
    assert all(c.cluster_m == c.cluster_n == 1 for c in got)
    assert "/warps2x4" in next(c for c in got if c.key == "c").label()


def test_model_reduce_step_matches_the_kernels_reduce_pass():
    # The model's loads-per-step of split-K's second kernel must be the
    # kernel's own, for every tile the family builds (its consumer
    # warpgroups, and so its accumulators per thread, depend on the tile).
    from cutlass_aot.kernels.sm90 import _TILES  # noqa: PLC0415
    from cutlass_aot.kernels.sm90_gemm import Sm90Gemm, Sm90GemmConfig  # noqa: PLC0415 - the DSL

    for tile in _TILES:
        tm, tn = (int(x) for x in tile.split("x"))
        kernel = Sm90Gemm(Sm90GemmConfig(tm, tn, 1, 1, True, 1, False, split_k=True), 2)
        kernel.tile = (tm, tn, 64)  # what _derive_static sets at trace time
        _, _, step = kernel._reduce_chunks()
        assert select._reduce_step(cand(tile, split=True)) == step, tile


def test_model_knows_every_tile_the_family_builds():
    # A tile missing from TILE_EFFICIENCY is ranked at a default 0.5 of the
    # peak, which silently mis-ranks it (r27 added 128x176..240: a tile added
    # to the family must get its efficiency, fitted or interpolated).
    from cutlass_aot.kernels.sm90 import _TILES  # noqa: PLC0415

    missing = [t for t in _TILES if tuple(int(x) for x in t.split("x")) not in select.TILE_EFFICIENCY]
    assert not missing


def test_unaligned_route_weighs_copies_against_the_low_alignment_family():
    """Staged when the cache has no low-alignment variant; otherwise by the
    estimates: the copies' fixed cost loses on a tiny problem, the native
    2-byte kernel's slowdown loses on a large one."""
    aligned = select.Candidate("w", 128, 256, 1, 1)
    native = select.Candidate("n", 128, 128, 1, 1, extra=(("warps", "2x4"),))
    a_ch, n_ch = select.Choice(aligned, 1, "model"), select.Choice(native, 1, "model")

    def staged(m, n, k, copies, align=2):
        return select.prefer_staged(a_ch, n_ch, align, copies, m, n, k, 1, 132)

    assert select.prefer_staged(a_ch, None, 16, [10**9], 8, 8, 8, 1, 132)
    assert not staged(8, 1752, 109, [2 * 8 * 109, 2 * 1752 * 109])
    assert staged(4095, 4095, 4095, [2 * 4095 * 4095] * 3)
    # Monotone in the copies: more bytes to copy never makes staging more attractive.
    base = select.staged_estimate_us(10.0, [1000])
    assert select.staged_estimate_us(10.0, [1000, 1]) > base < select.staged_estimate_us(10.0, [10**6])
    # A narrower native kernel is never modelled faster than a wider one.
    ests = [select.native_estimate_us(native, al, 1000, 1000, 1000, 1, 132) for al in (8, 4, 2)]
    assert ests == sorted(ests)


# ------------------------------------------------------------------ autotune
def test_autotune_leading_options_follow_the_model_and_keep_the_first_choice():
    """run/autotune.leading_options: the model's fastest options in its order
    (the first is model_choice's), distinct, at most ``count``; a given first
    choice (a table row, say) leads even when the model ranks it lower."""
    from cutlass_aot.run import autotune  # noqa: PLC0415 - imports torch

    for m, n, k in [(4, 4096, 8192), (8192, 8192, 8192), (1024, 1024, 32768), (777, 3000, 520)]:
        opts = autotune.leading_options(CANDS, m, n, k, 1, 132, 6)
        assert 2 <= len(opts) <= 6
        labels = [ch.label() for ch, _ in opts]
        assert len(set(labels)) == len(labels)
        assert labels[0] == select.model_choice(CANDS, m, n, k, 1, 132).label()
        ests = [est for _, est in opts]
        assert ests == sorted(ests)
        assert all(math.isfinite(e) and e > 0 for e in ests)
        last = opts[-1][0]
        led = autotune.leading_options(CANDS, m, n, k, 1, 132, 3, first=last)
        assert led[0][0] == last and len(led) == 3
        assert last not in [ch for ch, _ in led[1:]]


def test_autotune_defers_to_the_long_k_walk_and_nowhere_else():
    """select.autotune_defers (r55): autotune keeps the model's choice untimed
    where that choice is the long-K order's walk (a burst would rank the
    128x256 walks first, which lose under the power cap); anywhere else, and
    for any other option at a long-K problem, autotune times as before."""
    n8 = cand("128x256", "2x1", "n", 8, key="n8")
    t192 = cand("256x192", "1x2", key="256x192/1x2")
    t160 = cand("256x160", "1x2", key="256x160/1x2")
    split = cand("256x192", "1x2", split=True, key="split")
    cands = [n8, t192, t160, split]
    for shape in [(8878, 6480, 57336), (5740, 51864, 31288), (5000, 5000, 16384)]:
        pick = select.model_choice(cands, *shape, 1, 132)
        assert pick.candidate is t192 and select.autotune_defers(pick, *shape, 1)
        assert select.autotune_defers(select.Choice(t160, 1, "model"), *shape, 1)
        for other in (select.Choice(n8, 1, "model"), select.Choice(split, 4, "model")):
            assert not select.autotune_defers(other, *shape, 1)
    # off the long-K bounds, or batched: the walk itself is timed like any option
    for m, n, k, batch in [(4999, 8192, 28672, 1), (8192, 8192, 16376, 1), (8878, 6480, 57336, 2)]:
        assert not select.autotune_defers(select.Choice(t192, 1, "model"), m, n, k, batch)


def test_autotune_knob_parses_off_on_and_counts_and_refuses_junk(monkeypatch):
    from cutlass_aot import knobs  # noqa: PLC0415

    for value, want in [(None, 0), ("0", 0), ("off", 0), ("on", knobs.AUTOTUNE_DEFAULT),
                        ("1", knobs.AUTOTUNE_DEFAULT), ("8", 8), (" 3 ", 3)]:
        if value is None:
            monkeypatch.delenv("CUTLASS_AOT_AUTOTUNE", raising=False)
        else:
            monkeypatch.setenv("CUTLASS_AOT_AUTOTUNE", value)
        assert knobs.autotune_count() == want, value
    for junk in ("-2", "lots", "1.5"):
        monkeypatch.setenv("CUTLASS_AOT_AUTOTUNE", junk)
        with pytest.raises(UsageError, match="CUTLASS_AOT_AUTOTUNE="):
            knobs.autotune_count()


def test_k_cluster_candidates_are_their_own_schedule_and_the_model_picks_them():
    """A K-cluster variant is its own schedule (label, table row, index
    record all carry k_cluster), and the model ranks and picks it like any
    other (r15: fitted on the fit sample's small-M shapes, replayed on the
    held-out), where one wave of its clusters holds every tile."""
    from cutlass_aot import tables  # noqa: PLC0415

    kc = select.Candidate("kc", 128, 16, 1, 1, swap_ab=True, k_cluster=4)
    plain = select.Candidate("p", 128, 16, 1, 1, swap_ab=True)
    assert kc.schedule != plain.schedule and kc.label() == "128x16/1x1/m1/swap/kc4"
    fields = kc.variant_fields()
    assert fields["k_cluster"] == 4
    assert select.candidate_from_variant("kc", fields) == kc
    assert tables._select_schedule(fields) == kc.schedule
    # A row written before k_cluster existed names the plain schedule.
    old = {k: v for k, v in plain.variant_fields().items() if k != "k_cluster"}
    assert tables._select_schedule(old) == plain.schedule
    # 4 tokens x 4096 x 14336: 32 weight tiles, one wave of 4-CTA clusters.
    problem = (4, 4096, 14336, 1, 132)
    est = {c.key: select.estimate_us(c, 1, *problem) for c in (kc, plain)}
    assert est["kc"] < est["p"]
    assert [ch.candidate.key for _, ch in select.ranked_choices([kc, plain], *problem)][0] == "kc"
    assert select.model_choice([kc, plain], *problem).candidate.key == "kc"
    # Replays pick among recorded options by the same rule.
    recorded = [(kc, 1, 30.3), (plain, 1, 34.0)]
    assert select.model_pick(recorded, *problem)[2] == 30.3
    # Many tiles (a long weight, M = 64): both stream the weight, and the
    # K-cluster pays its exchange and its wider cluster on every wave.
    wide = (64, 57344, 4096, 1, 132)
    assert select.rank_key(plain, 1, *wide) < select.rank_key(kc, 1, *wide)
    assert select.model_choice([kc, plain], *wide).candidate.key == "p"
    assert select.split_choices(kc, *problem[:4], 132) == (1,)


def test_a_promoted_sibling_serves_from_promote_from_k_on_whoever_picked_the_schedule():
    """sm90_gemm's ``promote`` is part of the schedule (a row that predates it
    names the unpromoted one), its label reads back, and from
    PROMOTE_FROM_K on dispatch runs the promoted sibling of what the model or
    a table row picked; below it, the unpromoted one, as before r71. A pick
    with no promoted sibling stays as it is."""
    from cutlass_aot import tables  # noqa: PLC0415

    plain = select.Candidate("p", 128, 32, 1, 1, swap_ab=True, split_k=True)
    pr = select.Candidate("pr", 128, 32, 1, 1, swap_ab=True, split_k=True, promote=16)
    other = select.Candidate("o", 64, 16, 1, 1, swap_ab=True)
    assert pr.schedule != plain.schedule and pr.label() == "128x32/1x1/m1/swap/pr16/splitk"
    assert select.Choice(pr, 3, "model").label() == "128x32/1x1/m1/swap/pr16/splitkx3"
    assert select.option_of_label([plain, pr], "128x32/1x1/m1/swap/pr16/splitkx3") == (pr, 3)
    assert select.option_of_label([plain, pr], "128x32/1x1/m1/swap/pr16/streamk") == (pr, 0)
    fields = pr.variant_fields()
    assert fields["promote"] == 16 and "promote" not in plain.variant_fields()
    assert select.candidate_from_variant("pr", fields) == pr
    assert tables._select_schedule(fields) == pr.schedule
    assert tables._select_schedule(plain.variant_fields()) == plain.schedule
    cands = [plain, pr, other]
    long_k, short_k = select.PROMOTE_FROM_K, select.PROMOTE_FROM_K - 64
    for k, want in ((long_k, "pr"), (short_k, "p")):
        problem = (8, 4096, k, 1, 132)
        # the model gives both the same estimate; the order puts one first
        assert select.estimate_us(pr, 1, *problem) == select.estimate_us(plain, 1, *problem)
        assert select.model_choice([plain, pr], *problem).candidate.key == want
        # a table row timed the unpromoted schedule: served promoted at long K
        rows = {(8, 4096, k, 1): (plain.schedule, 2)}
        got = select.choose(cands, *problem, rows)
        assert (got.candidate.key, got.splits, got.source) == (want, 2, "table")
        # a row whose schedule has no promoted sibling is served as timed
        rows = {(8, 4096, k, 1): (other.schedule, 1)}
        assert select.choose(cands, *problem, rows).candidate.key == "o"


def test_cluster_slots_are_fewer_than_sms_over_the_size():
    """Clusters must be co-scheduled in one GPC, so fewer run at once than
    sms // size: on 132 SMs, the driver's 66 of 2 CTAs, 39 of 3 and 30 of 4
    (r33); so a K-cluster of 3 over 40 tiles is modelled as two waves, over
    39 as one."""
    assert [select.cluster_slots(s, 132) for s in (1, 2, 3, 4)] == [132, 66, 39, 30]
    assert all(1 <= select.cluster_slots(s, sms) <= sms // s
               for s in (1, 2, 3, 4, 8) for sms in (8, 78, 114, 132))
    kc3 = select.Candidate("kc3", 64, 16, 1, 1, swap_ab=True, k_cluster=3)
    one, two = (select.estimate_us(kc3, 1, 8, 64 * t, 8192, 1, 132) for t in (39, 40))
    assert two > 1.6 * one  # launch cost once, the waves twice


def test_192_row_tiles_rank_only_on_the_rows_their_constants_were_fitted_on():
    # FITTED_MIN_ROWS: the 192-row tiles' constants come from problems of at
    # least 257 rows (benchmarks/tile_probe.py, r20); below, every other
    # option ranks first, whatever the estimates say.
    tall = [cand("192x128", "1x2", key="t128"), cand("192x160", "1x2", key="t160"),
            cand("192x192", "1x2", key="t192")]
    others = [cand("128x256", "2x1", key="a"), cand("128x144", swap=True, key="s"),
              cand("256x160", split=True, key="k")]
    assert not select.in_fitted_domain(tall[0], 256, 4096)
    assert select.in_fitted_domain(tall[0], 257, 4096)
    assert select.in_fitted_domain(others[1], 1, 4096)  # no band for other tiles
    ranked = select.ranked_choices(tall + others, 142, 12928, 5456, 1, 132)
    kinds = [ch.candidate.tile_m == 192 for _, ch in ranked]
    assert kinds == sorted(kinds)  # every 192-row option after every other one
    assert select.model_choice(tall + others, 142, 12928, 5456, 1, 132).candidate.tile_m != 192
    # Above the band the model takes one where it measured a win: 12371 x
    # 296, where 98 tiles of 256x160 leave a third of the SMs idle and 130
    # of 192x160 do not (1.28-1.31x faster live, r20's held-out probe).
    pick = select.model_choice(tall + others, 12371, 296, 9400, 1, 132)
    assert pick.candidate.key == "t160"
    assert select.model_pick([(c, 1) for c in tall + others[:2]], 142, 12928, 5456, 1, 132)[0] \
        .tile_m != 192


def test_setmaxnreg_split_never_asks_more_registers_than_the_producer_frees():
    # setmaxnreg.inc waits until the registers are free: consumers asking
    # more than the producer gives back would hang the CTA.
    from cutlass_aot.kernels.sm90_gemm import _REGS, Sm90GemmConfig  # noqa: PLC0415 - the DSL

    assert Sm90GemmConfig(192, 192, 1, 1, True, 1, False).consumer_wgs == 3
    assert Sm90GemmConfig(128, 256, 1, 1, True, 1, False).consumer_wgs == 2
    for wgs, (producer, consumer) in _REGS.items():
        threads = 128 * (1 + wgs)
        # The CTA's pool: what ptxas allocates each thread at launch (168 at
        # 384 threads, 128 at 512: benchmarks/results/*_resource_report.md).
        at_launch = min(65536 // threads, 255) // 8 * 8
        assert 24 <= producer <= at_launch and consumer <= 256 and producer % 8 == consumer % 8 == 0
        assert 128 * producer + 128 * wgs * consumer <= threads * at_launch, wgs


def test_among_tied_estimates_the_cluster_that_loads_less_goes_first():
    """Where the tensor cores bound a unit, a tile's estimate is the same in
    every cluster shape. The fit data timed the 1x2 of such a tie at
    0.93-0.95x the 1x1 (r34), so among options that differ only in their
    cluster the one whose CTAs load fewer operand rows goes first; ties
    between different tiles keep the label's order."""
    one, pair_n, pair_m = (select.Candidate(f"k{cl}", 256, 144, *cl) for cl in ((1, 1), (1, 2), (2, 1)))
    problem = (5328, 808, 1704, 1, 132)  # held-out: 256x144/1x2 ran 26.9 µs, 1x1 33.7
    est = {c.key: select.estimate_us(c, 1, *problem) for c in (one, pair_n, pair_m)}
    assert est["k(1, 1)"] == est["k(1, 2)"] == pytest.approx(est["k(2, 1)"], rel=0.01)
    ranked = [ch.candidate.key for _, ch in select.ranked_choices([one, pair_m, pair_n], *problem)]
    # 1x2 shares the 256-row A tile (128 + 144 rows a CTA), 2x1 the 144-row B tile (256 + 72).
    assert ranked.index("k(1, 2)") < ranked.index("k(1, 1)")
    assert select.model_choice([one, pair_n], *problem).candidate.key == "k(1, 2)"
    # Different tiles at the HBM floor tie too; the label still orders them.
    wide, narrow = select.Candidate("w", 128, 16, 1, 1, swap_ab=True), select.Candidate("n", 64, 16, 1, 1, swap_ab=True)
    decode = (2, 57344, 1024, 1, 132)
    assert select.estimate_us(wide, 1, *decode) == select.estimate_us(narrow, 1, *decode)
    assert select.model_choice([narrow, wide], *decode).candidate.key == "w"


# ------------------------------------------- 32-bit layout offsets (NVIDIA/cutlass#2312)
def test_element_span_counts_from_the_first_element_to_one_past_the_last():
    assert select.element_span((4, 8), (8, 1)) == 32
    assert select.element_span((4, 8), (1, 4)) == 32          # column-major
    assert select.element_span((4, 8), (100, 1)) == 308        # a padded pitch
    assert select.element_span((3, 4, 8), (0, 8, 1)) == 32     # a batch broadcast by stride 0
    assert select.element_span((4, 0), (8, 1)) == 0
    assert select.element_span((65536, 32768), (32768, 1)) == 1 << 31


def test_candidates_that_index_in_32_bits_cannot_serve_operands_past_2_31_elements():
    """gemv and sm80_gemm address every operand through CuTe layouts of 32-bit
    strides, sm90_gemm only C (A, B and D move by TMA): a call whose operand
    spans more than 2**31 elements must not reach them, or the offset wraps."""
    sm90 = select.Candidate("k90", 128, 128, 1, 1)
    gemv = select.Candidate("kgv", 1, 8, 1, 1, gemv=True)
    sm80 = select.Candidate("k80", 128, 128, 1, 1, extra=(("bk", 32), ("stages", 4), ("warps", "2x2")))
    cands = [sm90, gemv, sm80]
    small = {"a": 4096 * 4096, "b": 4096 * 4096, "out": 4096 * 4096}
    assert select.within_index_limit(cands, small) == cands
    at_limit = dict(small, out=1 << 31)  # the last offset is 2**31 - 1: still fits
    assert select.within_index_limit(cands, at_limit) == cands
    lm_head = {"a": 8192, "b": 262208 * 8192, "out": 262208}  # a 4 GiB weight at one token
    assert select.within_index_limit(cands, lm_head) == [sm90]
    residual = dict(small, out=(1 << 31) + 1, c=(1 << 31) + 1)
    assert select.within_index_limit(cands, residual) == []
    assert select.layout_indexed(sm90) == ("c",) and "a" in select.layout_indexed(gemv)


def test_dispatch_refuses_a_call_whose_c_spans_past_2_31_elements_and_names_it(built_cache):
    """On the real artifacts of the CPU cache (sm90 TMA variants, with and
    without C), through the dispatcher's resolution-time filter, on meta
    tensors (shapes and strides, no memory): D past 2**31 elements is served,
    a C that large is a coverage gap that names the operand."""
    import torch  # noqa: PLC0415 - meta tensors only

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.errors import KernelNotFoundError  # noqa: PLC0415
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415

    runner = GemmRunner(cutlass_aot.open_cache(built_cache.path), fast=False)
    m, n, k = 65536, 32776, 64   # out: 2**31 + 524288 elements
    meta = dict(device="meta", dtype=torch.bfloat16)
    a, w, out = torch.empty(m, k, **meta), torch.empty(n, k, **meta), torch.empty(m, n, **meta)
    plain = gemm_signature("sm_90a", a="bf16", b="bf16", d="bf16", c=None, a_major="k", b_major="k",
                           d_major="n", rank=2)
    cands = runner._candidates_for(plain)
    assert runner._indexable(plain, cands, a, w.t(), out, None) == cands
    residual = gemm_signature("sm_90a", a="bf16", b="bf16", d="bf16", c="bf16", a_major="k",
                              b_major="k", d_major="n", rank=2)
    c = torch.empty(m, n, **meta)
    with pytest.raises(KernelNotFoundError, match=r"and c spans 2148007936 elements \(more than 2\*\*31\)"):
        runner._indexable(residual, runner._candidates_for(residual), a, w.t(), out, c)
    # r50 review: a call below 16-byte alignment reaches the kernel as padded
    # copies (the staged route), which span more than the caller's tensors: a
    # C of 1049000 x 2047 spans 2147303000 elements, its copy (rows padded to
    # 2048) 2148351999, past 2**31. The filter reads the copies' spans.
    cm, cn = 1049000, 2047
    a2, w2 = torch.empty(cm, k, **meta), torch.empty(cn, k, **meta)
    out2 = torch.empty_strided((cm, cn), (2048, 1), **meta)
    c2 = torch.empty(cm, cn, **meta)  # contiguous: rows 4094 bytes apart, below 16-byte alignment
    cands = runner._candidates_for(residual)
    assert runner._indexable(residual, cands, a2, w2.t(), out2, c2) == cands
    with pytest.raises(KernelNotFoundError, match=r"c spans 2148351999 elements"):
        runner._indexable(residual, cands, a2, w2.t(), out2, c2, staged=True)
    # The same C with one row less ends below the limit: served.
    short = (m - 16, n)
    assert runner._indexable(residual, runner._candidates_for(residual), a[16:], w.t(),
                             torch.empty(short, **meta), torch.empty(short, **meta))


# ------------------------------------------- r50 review: tables and selection
def test_a_row_whose_schedule_values_cannot_be_keys_is_refused():
    """A list or object in a row's variant passed validation, then bind hashed
    it (schedule_of) and every call, info, gc and build raised TypeError."""
    for variant, field in (({"tile": "128x256", "cluster": "2x1", "raster": ["m"]}, "raster"),
                           ({"tile": [128, 80], "cluster": "1x1"}, "tile"),
                           ({"tile": "128x80", "cluster": "1x1", "swizzle": {}}, "swizzle"),
                           ({"tile": "128x80", "cluster": "1x1", "warps": [2, 2]}, "warps"),
                           ({"tile": "128x80x1", "cluster": "1x1"}, "tile"),
                           ({"tile": "128x80", "cluster": "two"}, "cluster")):
        with pytest.raises(IntegrityError, match=f"variant.{field}"):
            tables.parse_table_bytes(json.dumps(doc([row(variant=variant)])).encode(), "t")
    tables.validate_table(doc([row()]), "t")


def test_a_published_table_that_cannot_bind_falls_back_to_the_model(built_cache, tmp_path):
    """A table already in a cache (written before r50's checks, or edited by
    hand, its index record updated) whose rows or gpu are wrong: the run side
    warns once and uses the model, never raises from a call's lookup; a table
    filed under another GPU's slot than its own is not used for that GPU."""
    import hashlib  # noqa: PLC0415

    from cutlass_aot.run.load import Cache  # noqa: PLC0415 - local to this test

    cache = copy_cache(built_cache.path, tmp_path / "cache")
    table = tmp_path / "t.json"
    table.write_text(json.dumps(doc([row()])))
    assert CliRunner().invoke(cli, ["build", str(built_cache.manifest), "--cache-dir", str(cache),
                                    "--tuning", str(table)]).exit_code == 0
    index_path = cache / "index.json"
    idx = json.loads(index_path.read_text())
    slot, rec = next(iter(idx["tables"].items()))
    index_path.chmod(0o644)

    def file_table(data: bytes) -> None:  # content-addressed, as the store files it
        sha = hashlib.sha256(data).hexdigest()
        (cache / "tables" / f"{sha}.json").write_bytes(data)
        rec.update(size=len(data), sha256=sha, path=f"tables/{sha}.json")

    bad = json.dumps(doc([row(variant={"tile": "128x256", "cluster": "2x1", "raster": ["m"]})])).encode()
    (cache / "tables").chmod(0o755)
    file_table(bad)
    index_path.write_text(json.dumps(idx))
    with pytest.warns(RuntimeWarning, match="selection table not used"):
        status = Cache(cache).table_status("NVIDIA H200", 132, "9.0")
    assert status["reason"] and "variant.raster" in status["reason"]
    # A good table under another GPU's slot: not used for the GPU the slot names.
    file_table(json.dumps(doc([row(us=7.5)])).encode())
    rec.update(gpu={"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "capability": "9.0"})
    idx["tables"] = {"NVIDIA H100 80GB HBM3|132|9.0": rec}
    index_path.write_text(json.dumps(idx))
    with pytest.warns(RuntimeWarning, match="measured on"):
        status = Cache(cache).table_status("NVIDIA H100 80GB HBM3", 132, "9.0")
    assert status["reason"] and "index record files it under" in status["reason"]
    make_tree_writable(cache)


def test_a_row_split_count_the_model_would_not_offer_falls_back():
    """A row's split count is data: 600 splits of a 128x256 split-K tile at
    16768x256x89600 took a 2.6e9-element fp32 workspace, past the kernel's
    32-bit offsets (the model's split_choices bound it; rows skipped that)."""
    sk = cand(split=True, key="sk256")
    m, n, k = 16768, 256, 89600
    offered = select.split_choices(sk, m, n, k, 1, 132)
    assert 600 not in offered and offered
    for splits, source in ((600, "model"), (offered[0], "table"), (1, "table")):
        rows = {(m, n, k, 1): (sk.schedule, splits)}
        assert select.choose(CANDS + [sk], m, n, k, 1, 132, rows).source == source, splits


def test_clusters_larger_than_the_gpu_are_never_chosen():
    """The persistent grid is sms // cluster size: 0 on a GPU (or MIG slice)
    with fewer SMs than a cluster has CTAs."""
    four = select.Candidate("c4", 128, 48, 4, 1, swap_ab=True)
    one = select.Candidate("c1", 128, 48, 1, 1, swap_ab=True)
    for sms in (1, 2, 3):
        assert select.model_choice([one, four], 1, 4096, 4096, 1, sms).candidate is one
    assert {c.candidate.key for _, c in select.ranked_choices([one, four], 1, 4096, 4096, 1, 132)} \
        == {"c1", "c4"}


def test_tune_times_a_split_k_only_signature_data_parallel():
    """tune_options returned nothing where split_choices offers no split (K
    under two k-blocks a split), and the tune died on IndexError; dispatch runs
    such a signature data-parallel (select._options), and tune now times that."""
    from cutlass_aot.tune.tuner import tune_options  # noqa: PLC0415

    sk = cand(split=True, key="sk256")
    assert select.split_choices(sk, 128, 4096, 64, 1, 132) == ()
    assert tune_options([sk], 128, 4096, 64, 1, 132) == [select.Choice(sk, 1, "tune")]


def test_build_tuning_files_override_the_manifest_table(built_cache, tmp_path):
    """`tune --out new.json` then `build --tuning new.json` (the README's CI
    flow): the re-measured rows must win over the manifest's shipped table
    (r50: the manifest's came last and silently won)."""
    cache = copy_cache(built_cache.path, tmp_path / "cache")
    shipped, fresh = tmp_path / "shipped.json", tmp_path / "fresh.json"
    shipped.write_text(json.dumps(doc([row(us=12.5)])))
    fresh.write_text(json.dumps(doc([row(us=3.25)])))
    manifest = tmp_path / "m.yaml"
    manifest.write_text(Path(built_cache.manifest).read_text() + f"\ntuning: {shipped}\n")
    r = CliRunner().invoke(cli, ["build", str(manifest), "--cache-dir", str(cache), "--tuning", str(fresh)])
    assert r.exit_code == 0, r.output
    idx = json.loads((cache / "index.json").read_text())
    rows = json.loads((cache / next(iter(idx["tables"].values()))["path"]).read_text())["rows"]
    assert [r["us"] for r in rows] == [3.25]
    make_tree_writable(cache)


def test_a_manifest_ships_one_table_per_gpu_from_a_tuning_list(built_cache, tmp_path):
    """r61: configs/sm90.yaml ships the H200's table and the H100's
    (`tuning: [a.json, b.json]`). build publishes each under its GPU, and a
    runner on either GPU binds its own table's rows, never the other's."""
    from cutlass_aot.run.load import Cache  # noqa: PLC0415

    cache = copy_cache(built_cache.path, tmp_path / "cache")
    h100 = tables.gpu_identity("NVIDIA H100 80GB HBM3", 132, "9.0")
    (tmp_path / "h200.json").write_text(json.dumps(doc([row(us=12.5)])))
    (tmp_path / "h100.json").write_text(json.dumps(dict(doc([row(us=14.0, m=256)]), gpu=h100)))
    manifest = tmp_path / "m.yaml"
    manifest.write_text(Path(built_cache.manifest).read_text() + "\ntuning: [h200.json, h100.json]\n")
    r = CliRunner().invoke(cli, ["build", str(manifest), "--cache-dir", str(cache), "--json"])
    assert r.exit_code == 0, r.output
    shipped = json.loads(r.output)["tables"]
    assert sorted(t["gpu"]["name"] for t in shipped) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    idx = json.loads((cache / "index.json").read_text())
    by_gpu = {rec["gpu"]["name"]: json.loads((cache / rec["path"]).read_text())["rows"]
              for rec in idx["tables"].values()}
    assert [(r["m"], r["us"]) for r in by_gpu["NVIDIA H200"]] == [(128, 12.5)]
    assert [(r["m"], r["us"]) for r in by_gpu["NVIDIA H100 80GB HBM3"]] == [(256, 14.0)]
    paths = {rec["gpu"]["name"]: rec["path"] for rec in idx["tables"].values()}
    opened = Cache(cache)
    for gpu in paths:
        status = opened.table_status(gpu, 132, "9.0")
        assert status["reason"] is None and status["table"] == paths[gpu], status
    other = opened.table_status("NVIDIA H100 PCIe", 114, "9.0")
    assert other["table"] is None and "run `cutlass-aot tune` on this GPU" in other["reason"]
    make_tree_writable(cache)


def test_sm80_variants_past_an_ampere_sm_shared_memory_are_not_served_there(built_cache):
    """r50 review: an sm_80 build may use up to 163 KiB of shared memory (the
    A100's), and binary compatibility lets an sm_80-only cache serve sm_86 and
    sm_89 GPUs, whose CTAs get 99 KiB: such a variant would fail to launch.
    The run side keeps them away from those devices."""
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415
    from cutlass_aot.run.load import Cache  # noqa: PLC0415

    def sm80(key, tile, bk, stages):
        tm, tn = (int(x) for x in tile.split("x"))
        return select.Candidate(key, tm, tn, 1, 1, extra=(("bk", bk), ("stages", stages), ("warps", "2x2")))

    big, small, wgmma = sm80("big", "128x128", 64, 5), sm80("small", "128x128", 32, 4), cand(key="w")
    assert select.smem_bytes(big, 2) == 163840 and select.smem_bytes(small, 2) == 65536
    assert select.smem_bytes(wgmma, 2) is None
    assert select.fits_device([big, small, wgmma], "sm_80", 2) == [big, small, wgmma]
    for arch in ("sm_86", "sm_89"):
        assert select.fits_device([big, small, wgmma], arch, 2) == [small, wgmma]
    runner = GemmRunner(Cache(built_cache.path), fast=False)
    sig = gemm_signature("sm_80", a="bf16", b="bf16", d="bf16", c=None, a_major="k", b_major="k",
                         d_major="n", rank=2)
    import torch  # noqa: PLC0415 - a CPU tensor: only its element size is read

    a = torch.empty(4, 4, dtype=torch.bfloat16)
    runner._candidates[sig] = [big, small]
    assert runner._fitting(sig, "sm_86", a) == [small]
    assert runner._fitting(sig, "sm_80", a) == [big, small]
    runner._candidates[sig] = [big]
    with pytest.raises(KernelNotFoundError, match="more shared memory"):
        runner._fitting(sig, "sm_89", a)


def test_a_call_whose_padded_copies_pass_2_31_goes_native_not_refused(built_cache, monkeypatch):
    """r50 diff review: the staged-route filter (padded copies' spans) raised
    before the native low-alignment route was weighed, so a call a native
    variant serves (its offsets reach the caller's own, shorter, tensors) was
    refused. Now the staged route is dropped and native serves; only with no
    native candidate is the call a coverage gap. Meta tensors; the device and
    the launcher are stubbed, the candidates and selection are real."""
    import torch  # noqa: PLC0415

    from cutlass_aot.run import dispatch  # noqa: PLC0415
    from cutlass_aot.run.load import Cache  # noqa: PLC0415

    monkeypatch.setitem(dispatch._DEVICE_INFO, -1, ("sm_90a", 132, "NVIDIA H200", "9.0"))
    runner = dispatch.GemmRunner(Cache(built_cache.path), fast=False)

    def signature(a, b, out, c, bias, act):
        ts = {"a": a, "b": b, "out": out, "c": c}
        return select.call_signature("sm_90a", {n: "bf16" for n in ts}, {n: tuple(t.shape) for n, t in ts.items()},
                                     {n: tuple(t.stride()) for n, t in ts.items()}, "none")

    monkeypatch.setattr(runner, "_signature", signature)
    got = {}

    def memo_entry(cache, choice, *args, **kwargs):
        got["choice"] = choice
        return (None, 132, lambda *x: None)

    monkeypatch.setattr(dispatch, "_memo_entry", memo_entry)
    monkeypatch.setattr(dispatch, "_may_alias", lambda *args: False)
    meta = dict(device="meta", dtype=torch.bfloat16)
    m, n, k = 1049000, 2047, 64   # c and out: rows of 4094 bytes, below 16-byte alignment
    a, w = torch.empty(m, k, **meta), torch.empty(n, k, **meta)
    c, out = torch.empty(m, n, **meta), torch.empty(m, n, **meta)
    native = select.Candidate("native", 128, 128, 1, 1, extra=(("bk", 32), ("stages", 4), ("warps", "2x4")))
    native_sig = gemm_signature("sm_90a", a="bf16", b="bf16", d="bf16", c="bf16", a_major="k", b_major="k",
                                d_major="n", rank=2, align=2)
    monkeypatch.setattr(runner, "_native", lambda *args: (native_sig, [native]))
    runner._resolve(("k1",), a, w.t(), out, c, None, None)
    assert got["choice"].candidate is native
    monkeypatch.setattr(runner, "_native", lambda *args: (None, []))
    with pytest.raises(KernelNotFoundError, match=r"c spans 2148351999 elements"):
        runner._resolve(("k2",), a, w.t(), out, c, None, None)


# ------------------------------------------------- long K over many tiles (r53)
def test_long_k_over_many_tiles_puts_the_1x2_256_row_walks_first():
    """At K >= 16384 with M and N >= 5000 (one batch entry) the model's
    order takes the 1x2 walks before its estimate's favourites, the 128x256
    walks that went DRAM-bound under sustained load (select.LONGK_*):
    256x192 in bands of eight (r59), then its plain walk, then 256x160's,
    each taken where the cache lacks the one before. Anywhere else, or for
    the split, other-cluster, raster-n or other-band forms of those tiles,
    the estimate alone orders."""
    n8 = cand("128x256", "2x1", "n", 8, key="n8")
    m8 = cand("128x256", "2x1", "m", 8, key="m8")
    b192 = cand("256x192", "1x2", "m", 8, key="256x192/1x2/m8")
    t192 = cand("256x192", "1x2", key="256x192/1x2")
    t160 = cand("256x160", "1x2", key="256x160/1x2")
    others = [cand("256x192", "1x1", key="256x192/1x1"), cand("256x192", "1x2", "m", 4, key="band4"),
              cand("256x192", "1x2", "n", 8, key="rastern"), cand("256x160", "1x2", "m", 8, key="band160"),
              cand("256x192", "1x2", split=True, key="split")]
    cands = [n8, m8, t160, t192, b192, *others]
    # M <= N: the unswapped walks (and no swapped ones in the list at all)
    for shape in [(12541, 50208, 35032), (5740, 51864, 31288), (8192, 8192, 28672)]:
        assert select.model_choice(cands, *shape, 1, 132).candidate.key == "256x192/1x2/m8"
        assert select.model_choice([c for c in cands if c is not b192], *shape, 1, 132).candidate.key \
            == "256x192/1x2"
        assert select.model_choice([c for c in cands if c not in (b192, t192)], *shape, 1,
                                   132).candidate.key == "256x160/1x2"
        ranked = select.ranked_choices(cands, *shape, 1, 132)
        assert ranked[0][0] == pytest.approx(select.estimate_us(b192, 1, *shape, 1, 132))
        assert [ch.candidate.key for _, ch in ranked[:3]] == ["256x192/1x2/m8", "256x192/1x2", "256x160/1x2"]
        # without a preferred walk, the estimate orders (not the other bands, raster n or split)
        rest = [c for c in cands if c not in (b192, t192, t160)]
        best = min(rest, key=lambda c: select.rank_key(c, 1, *shape, 1, 132))
        assert select.model_choice(rest, *shape, 1, 132).candidate.key == best.key
        assert not any(select.longk_walk(c, *shape, 1) for c in rest)
    # below a bound, or batched: the estimate's order, as before r53
    for m, n, k, batch in [(4096, 8192, 28672, 1), (12541, 4096, 35032, 1), (12541, 50208, 8192, 1),
                           (12541, 50208, 35032, 2)]:
        pick = select.model_choice(cands, m, n, k, batch, 132).candidate
        assert pick.key in ("n8", "m8"), (m, n, k, batch, pick.key)
        assert all(select.longk_rank(c, m, n, k, batch, 132) == 0 for c in cands)


def test_long_k_walks_along_the_shorter_side():
    """r57 (H200, at the power cap): where M > N the swapped walk, which runs
    the same tile down N, goes first (16384 x 8192: 1.035 of cuBLAS against
    0.963; the transposed control the other way); r58 (H100): faster at
    eleven of twelve fresh pairs with M 1.03-1.97x N, and near square the two
    trade places within 1%. M = N keeps the unswapped walk. Where the other
    side's band takes fewer waves it goes first (r60-r61; the test below):
    52383x5160 (43.48 waves unswapped, 43.59 swapped) and 9711x8568 here. A
    signature without the swapped walks runs the unswapped ones, and both
    sides count as walks for tune and autotune."""
    sb192 = cand("256x192", "1x2", "m", 8, swap=True, key="swapband")
    s192 = cand("256x192", "1x2", swap=True, key="swap192")
    s160 = cand("256x160", "1x2", swap=True, key="swap160")
    b192 = cand("256x192", "1x2", "m", 8, key="plainband")
    t192 = cand("256x192", "1x2", key="plain192")
    t160 = cand("256x160", "1x2", key="plain160")
    rivals = [cand("128x256", "2x1", "m", 8, key="m8"), cand("256x192", "1x1", "m", 8, swap=True, key="sw1x1")]
    cands = [*rivals, t160, s160, t192, s192, b192, sb192]
    swapped = ["swapband", "swap192", "swap160", "plainband", "plain192", "plain160"]
    plain = ["plainband", "plain192", "plain160", "swapband", "swap192", "swap160"]
    for m, n, k, want in [(16384, 8192, 28672, swapped), (52383, 5160, 53936, plain),
                          (8192, 16384, 28672, plain), (8192, 8192, 28672, plain),
                          (9711, 8568, 57192, plain), (12273, 11344, 20800, swapped),
                          (8193, 8192, 28672, swapped), (8192, 8193, 28672, plain)]:
        got = [ch.candidate.key for _, ch in select.ranked_choices(cands, m, n, k, 1, 132)]
        assert got[:6] == want, (m, n, k, got)
        assert [c.key for c in cands if select.longk_walk(c, m, n, k, 1)] == \
            ["plain160", "swap160", "plain192", "swap192", "plainband", "swapband"]
        assert not any(select.longk_walk(c, m, n, k, 1) for c in rivals)
        first = select.model_choice(cands, m, n, k, 1, 132)
        assert select.autotune_defers(first, m, n, k, 1)
    # the swapped walks missing: the unswapped ones, still before the rivals
    pick = select.model_choice([*rivals, t160, t192, b192], 16384, 8192, 28672, 1, 132)
    assert pick.candidate.key == "plainband"
    # a cache built before r59 (no bands): the plain walk of the shorter side
    pick = select.model_choice([*rivals, t160, s160, t192, s192], 16384, 8192, 28672, 1, 132)
    assert pick.candidate.key == "swap192"


def test_long_k_band_splits_a_mostly_idle_last_wave():
    """r60 (H100 at the cap): the band's split-K form shares the band's place
    in the long-K order, so the estimate picks a split count (or stream-K)
    for its last partial wave, but only where that wave leaves at least
    LONGK_SPLIT_MIN_IDLE of the resident clusters idle (5008x5000x16392:
    4.24 waves, 0.916 -> 1.002 of cuBLAS). A grid of whole waves has no
    tail to split, and near a full last wave the whole band stands (the
    fix-up cost more than the idle SMs saved). The plain walk's split form
    is not a walk."""
    sband = cand("256x192", "1x2", "m", 8, swap=True, key="swapband")
    ssplit = cand("256x192", "1x2", "m", 8, swap=True, split=True, key="swapsplit")
    band = cand("256x192", "1x2", "m", 8, key="band")
    split = cand("256x192", "1x2", "m", 8, split=True, key="split")
    walk_split = cand("256x192", "1x2", swap=True, split=True, key="walksplit")
    rivals = [cand("128x256", "2x1", "m", 8, key="m8"), cand("128x256", "2x1", split=True, key="sk2x1"),
              cand("256x192", "1x2", swap=True, key="swap192"), walk_split]
    cands = [*rivals, band, split, sband, ssplit]
    assert select.LONGK_SPLIT_MIN_IDLE == 0.25
    # 280 clusters of two on 66 slots: 4 whole waves and 16 clusters, 76% idle
    for m, n, want in [(5008, 5000, "swapsplit"), (5000, 5008, "split"), (7512, 5000, "swapsplit")]:
        split_form = ssplit if want == "swapsplit" else split
        whole = sband if want == "swapsplit" else band
        assert select._last_wave(split_form, m, n, 132)[1] >= 0.25
        pick = select.model_choice(cands, m, n, 16392, 1, 132)
        assert pick.candidate.key == want and pick.splits in (0, *select.SPLIT_CHOICES), pick.label()
        assert select.autotune_defers(pick, m, n, 16392, 1)
        # one place for both forms: the estimate, not the order, put the split first
        assert select.longk_rank(split_form, m, n, 16392, 1, 132) == select.longk_rank(whole, m, n, 16392, 1, 132)
        # a cache without the split form (built before r60): the whole band
        assert select.model_choice([c for c in cands if c is not split_form], m, n, 16392, 1,
                                   132).candidate.key == whole.key
    assert select._last_wave(ssplit, 5008, 5000, 132)[1] == pytest.approx(1 - 16 / 66)
    # whole waves (2970 clusters = 45 x 66): no tail, no split count, the whole band
    assert select._last_wave(ssplit, 17264, 16744, 132)[1] == 0.0
    assert select.split_choices(ssplit, 17264, 16744, 55712, 1, 132) == ()
    assert select.model_choice(cands, 17264, 16744, 55712, 1, 132).candidate.key == "swapband"
    # a last wave 85% full: the split form stands after the walks, yet tune still times it
    m, n, k = 16384, 8192, 28672
    assert select._last_wave(ssplit, m, n, 132)[1] < 0.25
    assert select.model_choice(cands, m, n, k, 1, 132).candidate.key == "swapband"
    assert select.longk_rank(ssplit, m, n, k, 1, 132) == 2 * len(select.LONGK_WALKS)
    assert select._walk_place(ssplit, m, n) == select._walk_place(sband, m, n)  # the idle bound alone moved it
    assert select.longk_walk(ssplit, m, n, k, 1)
    # the plain walk's split form and other split tiles are no walks anywhere
    for shape in [(5008, 5000, 16392), (16384, 8192, 28672)]:
        assert not select.longk_walk(walk_split, *shape, 1)
        assert not select.longk_walk(rivals[1], *shape, 1)
    # outside the order's bounds the band's split form, timed only under it, stands last
    assert select.longk_rank(ssplit, 5008, 4992, 16392, 1, 132) == 1
    assert select.longk_rank(walk_split, 5008, 4992, 16392, 1, 132) == 0
    assert select.longk_rank(sband, 5008, 4992, 16392, 1, 132) == 0
    ranked = [ch.candidate.key for _, ch in select.ranked_choices(cands, 339, 26144, 31272, 1, 132)]
    assert "swapsplit" not in ranked[:ranked.index("walksplit")] and ranked[-1] in ("swapsplit", "split")


def test_long_k_side_with_fewer_band_waves_goes_first():
    """r60-r61 (H100 at the cap): the side where the band takes fewer waves
    goes first, the shorter side on a tie, counting a last wave the split
    form streams as its share of the slots and a whole band's last wave as a
    whole one. 8878x6480x57336: 9.02 waves unswapped against 9.45 swapped
    (0.947x the time); 5740x51864x31288: 46.1 swapped against 47.4 (0.961x);
    near square at 9711x8568x57192, 13.24 unswapped against 13.39 (r60 kept
    the shorter side below a 2% difference; r61 measured the other side
    faster at 12 of 17 such shapes). 12273x11344: 22 waves either way, the
    shorter side."""
    forms = {(swap, split): cand("256x192", "1x2", "m", 8, swap=swap, split=split,
                                 key=("swap" if swap else "plain") + ("split" if split else "band"))
             for swap in (False, True) for split in (False, True)}
    cands = [cand("128x256", "2x1", "m", 8, key="m8"), *forms.values()]
    assert select._band_waves(8878, 6480, True, 132) == pytest.approx(624 / 66)
    assert select._band_waves(8878, 6480, False, 132) == pytest.approx(595 / 66)
    # a whole band's last wave counts whole: 12408x10200 swapped fills 20 waves exactly
    assert select._band_waves(12408, 10200, True, 132) == 20
    assert select._band_waves(16384, 8192, True, 132) == 21  # 20.85 waves, the last 85% full
    for m, n, k, swap_first in [(8878, 6480, 57336, False), (5740, 51864, 31288, True),
                                (9711, 8568, 57192, False), (12273, 11344, 20800, True),
                                (16384, 8192, 28672, True),
                                (8192, 16384, 28672, False)]:
        assert select._longk_swap_first(m, n, 132) is swap_first, (m, n)
        pick = select.model_choice(cands, m, n, k, 1, 132)
        assert pick.candidate.swap_ab is swap_first, (m, n, pick.label())
        assert select.autotune_defers(pick, m, n, k, 1)
    # the flipped side's split form first; its whole band right after its own splits
    ranked = [ch.candidate.key for _, ch in select.ranked_choices(cands, 8878, 6480, 57336, 1, 132)]
    assert ranked[0] == "plainsplit" and ranked.index("plainband") < ranked.index("swapsplit")
    # _walk_place's own default side is the shorter one; the waves move it
    assert select._walk_place(forms[(True, True)], 8878, 6480) == 0
    assert select.longk_rank(forms[(True, True)], 8878, 6480, 57336, 1, 132) == len(select.LONGK_WALKS)


def test_the_row_above_serves_residual_signatures_only():
    """r66: rule 3 takes part for with-C signatures (call F measured it there:
    1.002 -> 1.012 of addmm at a fresh seed); plain calls keep rules 1, 2, 4."""
    fields = dict(a="bf16", b="bf16", d="bf16", a_major="k", b_major="k", d_major="n", rank=2)
    plain = gemm_signature("sm_90a", c=None, **fields)
    residual = gemm_signature("sm_90a", c="bf16", **fields)
    assert not select.row_above_serves(dict(plain.fields))
    assert select.row_above_serves(dict(residual.fields))
    assert not select.row_above_serves({})
    # choose leaves rule 3 out unless asked (callers that mirror a plain call's dispatch)
    by_key = {c.key: c for c in CANDS}
    rows = {(32, 4096, 4096, 1): (by_key["swap16"].schedule, 1, None, None, 20.0),
            (64, 4096, 4096, 1): (by_key["swap64sk"].schedule, 3, None, None, 21.0)}
    assert select.choose(CANDS, 40, 4096, 4096, 1, 132, rows).source == "model"
    assert select.choose(CANDS, 40, 4096, 4096, 1, 132, rows, above=True).source == "table-above"


def test_choose_takes_a_row_above_within_its_bound_of_the_row_below():
    # r65's rule 3: rows at 32 and 64 tokens; the 64-token row's 64-row tile
    # covers 33..64 on the same tiles, so it serves them where its time is
    # within ROW_ABOVE_BOUND of the 32-token row's (the least any option can
    # take at those M).
    by_key = {c.key: c for c in CANDS}
    swap16, swap64sk = by_key["swap16"], by_key["swap64sk"]
    assert swap16.label() == "128x16/1x1/m1/swap" and swap64sk.tile_n == 64 and swap64sk.swap_ab

    def pick(m, above_us, below_us=20.0, margin=None, runner=None, above=True):
        rows = {(32, 4096, 4096, 1): (swap16.schedule, 1, None, None, below_us),
                (64, 4096, 4096, 1): (swap64sk.schedule, 3, runner, margin, above_us)}
        return select.choose(CANDS, m, 4096, 4096, 1, 132, rows, above=above)

    for m in (33, 48, 63):
        assert pick(m, 21.0) == select.Choice(swap64sk, 3, "table-above"), m
        # past the bound (21.0 / 20.0 = 1.05 inside, 23.1 / 20.0 = 1.155 outside): the model
        assert pick(m, 23.1) == select.model_choice(CANDS, m, 4096, 4096, 1, 132), m
        assert pick(m, 21.0, above=False).source == "model"
    # The bound is the row's own time, exactly at the limit included.
    assert pick(40, 20.0 * select.ROW_ABOVE_BOUND).source == "table-above"
    # A row with no time (timed at the power cap's clock, or a tuple from
    # before r65) neither serves nor bounds.
    assert pick(40, None).source == "model"
    assert pick(40, 21.0, below_us=None).source == "model"
    # Below the lowest row there is no floor: no bound, no rule.
    rows = {(64, 4096, 4096, 1): (swap64sk.schedule, 3, None, None, 21.0)}
    assert select.choose(CANDS, 40, 4096, 4096, 1, 132, rows, above=True).source == "model"
    # The row below, where its tiles cover M, comes first: the 1-token row's
    # 16-token tile serves 9 tokens, though the 64-token row would cover them.
    rows = {(1, 4096, 4096, 1): (swap16.schedule, 1, None, None, 10.0),
            (64, 4096, 4096, 1): (swap64sk.schedule, 3, None, None, 10.5)}
    assert select.choose(CANDS, 9, 4096, 4096, 1, 132, rows, above=True) == select.Choice(swap16, 1, "table-below")
    # 20 tokens: the 16-token tile of the 1-token row no longer covers them, the
    # 64-token row does (one 64-wide tile), within 1.05 of the 1-token row's time
    assert select.choose(CANDS, 20, 4096, 4096, 1, 132, rows, above=True) == select.Choice(swap64sk, 3,
                                                                              "table-above")
    # Other N, K or L do not carry; a row above whose tiles at M differ does not either.
    assert select.choose(CANDS, 20, 4104, 4096, 1, 132, rows, above=True).source == "model"
    assert select.choose(CANDS, 20, 4096, 4096, 2, 132, rows, above=True).source == "model"
    far = {(1, 4096, 4096, 1): rows[(1, 4096, 4096, 1)],
           (128, 4096, 4096, 1): (swap64sk.schedule, 3, None, None, 10.5)}
    assert select.choose(CANDS, 20, 4096, 4096, 1, 132, far, above=True).source == "model"  # 1 tile at 20, 2 at 128
    assert select.choose(CANDS, 65, 4096, 4096, 1, 132, far, above=True).source == "table-above"  # 2 at both
    # A close runner-up that covers M serves at the winner's time times its margin.
    rows = {(32, 4096, 4096, 1): (swap16.schedule, 1, None, None, 20.0),
            (64, 4096, 4096, 1): (by_key["swap16sk"].schedule, 2, swap64sk.label() + "x3", 1.04, 21.0)}
    assert select.choose(CANDS, 40, 4096, 4096, 1, 132, rows, above=True) == select.Choice(swap64sk, 3,
                                                                              "table-above")
    rows[(64, 4096, 4096, 1)] = (by_key["swap16sk"].schedule, 2, swap64sk.label() + "x3", 1.04, 22.5)
    assert select.choose(CANDS, 40, 4096, 4096, 1, 132, rows, above=True).source == "model"  # 22.5 * 1.04 > 23


def test_option_of_label_reads_back_what_choice_label_writes():
    """The runner-up of a table row and benchmarks/edge_rows_probe.py's
    --option name an option by Choice.label: each reads back to its option."""
    for c in CANDS:
        for splits in ((1, 3, 0) if c.split_k else (1,)):
            label = select.Choice(c, splits, "model").label()
            assert select.option_of_label(CANDS, label) == (c, splits), label
    assert select.option_of_label(CANDS, "999x999/1x1/m1") is None
    assert select.option_of_label(CANDS, "128x16/1x1/m1/swap/splitkxx") is None
