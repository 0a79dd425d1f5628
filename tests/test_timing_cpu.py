"""The tune harness's L2 policy, on a CPU: how many operand sets a problem
rotates through, that each call of a rotation gets its own set, and that
tune keeps only rows timed under its own policy."""

from __future__ import annotations

import itertools

import pytest

from cutlass_aot.run.select import Candidate
from cutlass_aot.tune.timing import L2_POLICY, MAX_COPIES, copies_for, rotate, round_order, time_us
from cutlass_aot.tune.tuner import candidates_digest, policy_rows

L2 = 50 * 2**20


@pytest.mark.parametrize("nbytes", [1, 4096, 300_000, 5 * 2**20, 32 * 2**20, 99 * 2**20])
def test_other_sets_move_two_l2_fulls_between_uses_of_one(nbytes):
    n = copies_for(nbytes, L2)
    assert 2 <= n <= MAX_COPIES
    if n < MAX_COPIES:
        # The n - 1 other sets move at least 2 L2s; one fewer would not.
        assert (n - 1) * nbytes >= 2 * L2
        assert (n - 2) * nbytes < 2 * L2


@pytest.mark.parametrize("nbytes", [2 * L2, 3 * 2**30])
def test_a_problem_that_flushes_the_l2_itself_needs_one_set(nbytes):
    assert copies_for(nbytes, L2) == 1


def test_tiny_problems_are_capped():
    assert copies_for(64, L2) == MAX_COPIES


def test_rotate_binds_each_set():
    calls = []
    fns = rotate(lambda *args: calls.append(args), [(1, 2), (3, 4), (5, 6)])
    for f in fns:
        f()
    assert calls == [(1, 2), (3, 4), (5, 6)]


@pytest.mark.parametrize("doc", [
    None,
    {"rows": [{"m": 1}]},                                  # no timing recorded
    {"timing": "cold", "rows": [{"m": 1}]},                # not a mapping
    {"timing": {"l2": "warm"}, "rows": [{"m": 1}]},        # another policy
])
def test_tune_keeps_no_row_timed_under_other_rules(doc):
    assert policy_rows(doc) == []


def test_tune_keeps_rows_of_its_own_policy():
    rows = [{"m": 1}, {"m": 2}]
    assert policy_rows({"timing": {"l2": L2_POLICY}, "rows": rows}) == rows


def test_candidate_digest_is_order_free_and_sees_a_new_variant():
    a = Candidate("k1", 128, 256, 2, 1)
    b = Candidate("k2", 256, 144, 1, 1, "m", 8, swap_ab=True)
    c = Candidate("k3", 256, 144, 1, 1, "m", 1, swap_ab=True)
    assert candidates_digest([a, b]) == candidates_digest([b, a])
    assert candidates_digest([a, b]) != candidates_digest([a, b, c])
    # sm80_gemm tells variants apart by their extra parameters.
    d = Candidate("k4", 128, 128, 1, 1, extra=(("warps", "2x2"),))
    e = Candidate("k5", 128, 128, 1, 1, extra=(("warps", "2x4"),))
    assert candidates_digest([d]) != candidates_digest([e])


def test_tune_retimes_up_to_four_leaders_within_ten_percent():
    from cutlass_aot.tune.tuner import leaders, retime_rounds  # noqa: PLC0415

    # r11's f16 1x4096x4096: the eventual winner's first timing sat 9% behind.
    times = [11.6, 12.7, 30.0, 12.6, 11.9, 12.5]
    assert leaders(times) == [0, 4, 5, 3]  # fastest first, 1.0 .. 1.086, at most four
    assert leaders([100.0, 111.0, 109.0]) == [0, 2]
    assert leaders([5.0]) == [0]
    assert retime_rounds(times) == 5 and retime_rounds([20.0, 25.0]) == 3


def test_leaders_are_distinct_variants_so_split_counts_cannot_crowd_out_the_rest():
    from cutlass_aot.tune.tuner import LEADERS, leaders  # noqa: PLC0415

    # One split-K variant at six split counts, all ahead of two other variants.
    times = [100.0, 100.5, 101.0, 101.5, 102.0, 102.5, 103.0, 104.0, 130.0]
    variants = ["sk"] * 6 + ["plain", "pp", "far"]
    assert leaders(times) == [0, 1, 2, 3]                 # the split counts alone
    lead = leaders(times, variants)
    assert lead == [0, 6, 7]                              # the best of each variant in the window
    assert len(lead) <= LEADERS and 8 not in lead         # 1.30x: outside the window
    assert leaders(times, ["a", "b", "c", "d", "e", "f", "g", "h", "i"]) == [0, 1, 2, 3]


def test_long_problems_retime_more_leaders_in_a_wider_window_for_more_rounds():
    from cutlass_aot.tune.tuner import CLOSE_LONG, LEADERS, LEADERS_LONG, LONG_US, leaders, retime_rounds  # noqa: PLC0415

    # r37's bf16 bias+GELU 16384x4096x14336: the option bench_epilogue ran
    # fastest sat 1.101x behind the tune's pick, outside the 10% window.
    times = [2837.0, 3124.0, 3300.0, 3500.0, 2900.0, 3000.0, 3050.0, 3200.0]
    lead = leaders(times)
    assert lead[:2] == [0, 4] and 1 in lead
    assert len(lead) == LEADERS_LONG > LEADERS
    assert all(times[i] <= times[0] * (1 + CLOSE_LONG) for i in lead)
    assert 3 not in lead  # 1.234x: outside even the long window
    # The long rule starts at LONG_US: just under it, the short rule.
    assert len(leaders([x * (LONG_US - 1) / 2837.0 for x in times])) == LEADERS
    assert retime_rounds(times) == 5
    assert retime_rounds([LONG_US - 1, LONG_US]) == 3 and retime_rounds([LONG_US, 2 * LONG_US]) == 5


def test_rounds_alternate_the_order_so_no_function_always_runs_second():
    orders = [round_order(3, r) for r in range(4)]
    assert orders == [[0, 1, 2], [2, 1, 0], [0, 1, 2], [2, 1, 0]]
    # Over two rounds every function stands at the same mean position.
    for i in range(3):
        assert sum(o.index(i) for o in orders[:2]) == 2
    assert round_order(1, 1) == [0]


def test_tune_times_each_form_the_model_ranks_out_within_the_window():
    """Above MAX_OPTIONS the tune times the model's first options plus the
    best-estimated option of each form they leave out, if its estimate is
    within FORM_WINDOW of the best: a form the model ranks far down still
    gets timed once, a hopeless one does not."""
    from cutlass_aot.run import select  # noqa: PLC0415
    from cutlass_aot.tune.tuner import FORM_WINDOW, MAX_OPTIONS, _form, tune_options  # noqa: PLC0415

    def cand(i, tile, **kw):
        tm, tn = (int(x) for x in tile.split("x"))
        return select.Candidate(key=f"k{i}", tile_m=tm, tile_n=tn, cluster_m=kw.pop("cm", 1),
                                cluster_n=kw.pop("cn", 1), **kw)

    # Cluster/raster/swizzle siblings of a few tiles fill the first
    # MAX_OPTIONS; the wider and narrower tiles are forms of their own.
    cands = [cand(i, "128x64", swap_ab=True, raster=r, swizzle=z, cm=cm)
             for i, (r, z, cm) in enumerate((r, z, cm) for r in "mn" for z in (1, 2, 4, 8)
                                            for cm in (1, 2, 4))]
    cands += [cand(100 + i, t, swap_ab=True, raster=r, swizzle=z)
              for i, (t, r, z) in enumerate((t, r, z) for t in ("64x64", "64x80", "128x80", "128x96",
                                                             "128x112", "64x32", "128x32")
                                            for r in "mn" for z in (1, 2, 4, 8))]
    cands += [cand(200, "128x64", k_cluster=2), cand(201, "128x64", k_cluster=3),
              cand(202, "64x16", swap_ab=True)]
    m, n, k = 128, 4096, 14336
    est = {c.key: select.estimate_us(c, 1, m, n, k, 1, 132) for c in cands}
    opts = tune_options(cands, m, n, k, 1, 132)
    labels = [o.label() for o in opts]
    assert len(labels) == len(set(labels))
    best = min(est.values())
    ranked = sorted(cands, key=lambda c: est[c.key])
    top = {c.key for c in ranked[:MAX_OPTIONS]}
    assert top <= {o.candidate.key for o in opts}
    forms_in_top = {_form(c) for c in ranked[:MAX_OPTIONS]}
    extra = [o.candidate for o in opts if o.candidate.key not in top]
    assert extra, "the fixture must leave some form out of the first options"
    # Each option beyond the first is a form they lack, within the window
    # (so no form beyond it is timed), and one option per such form.
    for c in extra:
        assert _form(c) not in forms_in_top and est[c.key] <= best * FORM_WINDOW
    assert len({_form(c) for c in extra}) == len(extra)
    # The 128x112 swapped tiles all rank below the first options; their
    # best-estimated sibling (raster m, no swizzle) stands for them.
    wide = [c for c in extra if (c.tile_m, c.tile_n) == (128, 112)]
    assert [(c.raster, c.swizzle) for c in wide] == [("m", 1)]
    assert not any(c.tile_n == 16 for c in extra), "64x16 at 128 tokens is far outside the window"


def test_time_us_refuses_a_negative_steady_ms_before_touching_the_gpu():
    with pytest.raises(ValueError, match="must be 0 or more, not -1 and 1000"):
        time_us(lambda: None, steady_ms=-1)
    with pytest.raises(ValueError, match="must be 0 or more, not 10 and -5"):
        time_us(lambda: None, steady_ms=10, steady_min_us=-5)


def test_tune_times_the_long_k_walks_the_estimate_ranks_out(monkeypatch):
    """At long K (select.longk_applies) the tune times the long-K order's 1x2
    plain walks even where the estimate leaves them out of its first
    MAX_OPTIONS and out of the form window; below the bound it adds nothing.
    Without this, a steady-state re-tune could never find them (r53: the
    estimate puts 256x192 1.3-1.5x behind the walks that go DRAM-bound)."""
    from cutlass_aot.run import select  # noqa: PLC0415
    from cutlass_aot.tune.tuner import MAX_OPTIONS, tune_options  # noqa: PLC0415

    def cand(i, tile, **kw):
        tm, tn = (int(x) for x in tile.split("x"))
        return select.Candidate(key=f"k{i}", tile_m=tm, tile_n=tn, cluster_m=kw.pop("cm", 1),
                                cluster_n=kw.pop("cn", 1), **kw)

    # every cluster, raster and swizzle of five tiles, as a manifest ships
    # them; the three long-K walks (1x2, raster m: 256x192 banded and plain,
    # 256x160 plain) come last
    walk_forms = {("256x192", "m", 8, 1, 2), ("256x192", "m", 1, 1, 2), ("256x160", "m", 1, 1, 2)}
    cands = [cand(i, t, raster=r, swizzle=z, cm=cm, cn=cn)
             for i, (t, r, z, (cm, cn)) in enumerate(itertools.product(
                 ("128x256", "256x192", "256x160", "128x192", "256x128"), "mn", (1, 2, 4, 8),
                 ((1, 1), (2, 1), (1, 2))))
             if (t, r, z, cm, cn) not in walk_forms]
    walks = [cand(899, "256x192", cn=2, swizzle=8), cand(900, "256x192", cn=2), cand(901, "256x160", cn=2)]
    cands += walks
    assert len(cands) > MAX_OPTIONS
    m, n, k = 8192, 8192, 28672
    assert select.longk_applies(m, n, k, 1)
    timed = {o.candidate.key for o in tune_options(cands, m, n, k, 1, 132)}
    assert {w.key for w in walks} <= timed
    # the fixture's point: the estimate and the form window alone leave a walk out
    with monkeypatch.context() as mp:
        mp.setattr(select, "longk_applies", lambda *a: False)
        without = {o.candidate.key for o in tune_options(cands, m, n, k, 1, 132)}
    assert not {w.key for w in walks} <= without
    assert timed - without <= {w.key for w in walks}
    # K below the bound, or M under LONGK_MIN_MN: the estimate's options only
    for mm, kk in ((8192, select.LONGK_MIN_K - 8), (select.LONGK_MIN_MN - 8, 28672)):
        assert not select.longk_applies(mm, n, kk, 1)
        plain = tune_options(cands, mm, n, kk, 1, 132)
        est2 = {c.key: select.estimate_us(c, 1, mm, n, kk, 1, 132) for c in cands}
        top = sorted(cands, key=lambda c: est2[c.key])[:MAX_OPTIONS]
        assert {c.key for c in top} <= {o.candidate.key for o in plain}
        assert len(plain) <= MAX_OPTIONS + 8  # the form window's few, no walk added for K


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_tune_refuses_a_bad_steady_ms_before_needing_a_gpu(tmp_path, value):
    """`cutlass-aot tune --steady-ms` takes a finite number of ms, 0 or more:
    anything else is a usage error (exit 2) naming the option, before the
    tune looks for a GPU or a cache."""
    from click.testing import CliRunner  # noqa: PLC0415

    from cutlass_aot.cli import main  # noqa: PLC0415

    res = CliRunner().invoke(main, ["tune", "--cache-dir", str(tmp_path / "c"), "--shapes",
                                    str(tmp_path / "none.yaml"), "--steady-ms", value])
    assert res.exit_code == 2, res.output
    assert "--steady-ms" in res.output


def test_tune_ranks_heavy_problems_steady_by_default():
    """Since r73 `cutlass-aot tune` and the tuner re-time heavy problems at the
    power cap's clock unless asked for bursts (--steady-ms 0); the CLI's default
    is the tuner's, so the two entry points rank alike."""
    import inspect  # noqa: PLC0415

    from cutlass_aot.cli import tune as tune_cmd  # noqa: PLC0415
    from cutlass_aot.tune.tuner import DEFAULT_STEADY_MS, tune  # noqa: PLC0415

    option = next(p for p in tune_cmd.params if p.name == "steady_ms")
    assert option.default == DEFAULT_STEADY_MS == inspect.signature(tune).parameters["steady_ms"].default
    assert DEFAULT_STEADY_MS > 0


def test_tuner_refuses_a_bad_steady_ms_before_needing_a_gpu(tmp_path):
    from cutlass_aot.errors import UsageError  # noqa: PLC0415
    from cutlass_aot.tune.tuner import tune  # noqa: PLC0415

    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="steady_ms must be a finite number of ms"):
            tune(tmp_path, [], steady_ms=bad)


def test_a_steady_tune_re_times_the_leaders_and_the_long_k_walks_and_picks_among_them():
    """tune --steady-ms's choice (tuner.retime_set, tuner.ranking): on a heavy
    problem the leaders, the long-K walks wherever the burst screen put them,
    and a runner-up where one variant leads are re-timed steady, and the row
    comes from those alone: an option screened in a burst, faster than every
    steady figure, never wins. Without steady timing nothing changes."""
    from cutlass_aot.tune.tuner import leaders, ranking, retime_set  # noqa: PLC0415

    # burst screen, µs: options 0-2 lead (within CLOSE_LONG), 3 is a long-K
    # walk far behind in the burst, 4 is a slow option of another variant
    burst = [28000.0, 28500.0, 29000.0, 40000.0, 45000.0]
    variants = ["n8", "m8", "m1", "walk", "other"]
    assert 3 not in leaders(burst, variants)
    lead = retime_set(burst, variants, [3], heavy=True)
    assert sorted(lead) == [0, 1, 2, 3]
    assert retime_set(burst, variants, [3], heavy=False) == leaders(burst, variants)
    # steady figures for the re-timed ones; 4 keeps its burst figure
    times = list(burst)
    for i, t in zip(lead, (41000.0, 40500.0, 40800.0, 30500.0)):
        times[i] = t
    times[4] = 29000.0  # a burst figure below every steady one
    order = ranking(times, lead, heavy=True)
    assert order[0] == 3 and 4 not in order
    assert ranking(times, lead, heavy=False)[0] == 4  # the old rule would take it
    # the report's `retimed` (r55): what the row chose among, fastest first,
    # with the walk's margin over the others; never the burst-screened 4
    from cutlass_aot.tune.tuner import retimed_options  # noqa: PLC0415

    assert retimed_options(variants, times, order, lead) == [
        ["walk", 30500.0], ["m8", 40500.0], ["m1", 40800.0], ["n8", 41000.0]]
    # bursts: the leaders re-timed, listed as ranked among every option
    assert retimed_options(variants, burst, ranking(burst, [0, 1], False), [0, 1]) == [
        ["n8", 28000.0], ["m8", 28500.0]]
    # one variant leads alone: the next fastest of another variant joins it
    alone = [1000.0, 1003.0, 2000.0, 2500.0]
    assert retime_set(alone, ["a", "a", "b", "c"], [], heavy=True) == [0, 2]
    assert retime_set([1500.0], ["a"], [], heavy=True) == [0]


def test_steady_for_decides_per_problem_from_its_fastest_option():
    """timing.steady_for: tune and the held-out benchmark time a problem
    steady only when its fastest screened option takes STEADY_MIN_US or more."""
    from cutlass_aot.tune.timing import STEADY_MIN_US, steady_for  # noqa: PLC0415

    assert steady_for(300.0, STEADY_MIN_US) == 300.0
    assert steady_for(300.0, STEADY_MIN_US - 0.1) == 0.0
    assert steady_for(0.0, 50 * STEADY_MIN_US) == 0.0
