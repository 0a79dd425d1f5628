"""GPU correctness of the schedules: swizzle bands, split-K, swap-AB, epilogues.

Self-contained like test_gemm_gpu.py (run with `pytest --noconftest tests/gpu`
on the device machine, cache in CUTLASS_AOT_CACHE_DIR). Fresh random inputs,
NaN-poisoned outputs, a float64 reference; NaN never passes.
"""

from __future__ import annotations

import threading

import pytest
import torch
from test_gemm_gpu import (
    TOL,
    TORCH,
    _entries,
    _label,
    assert_replays_fresh,
    assert_two_streams,
    capture,
    device_cache,
    raw_caller,
    rel_err,
    run_case,
)

from cutlass_aot.layout import GEMM_SPLITK_ABI
from cutlass_aot.run import occupancy
from cutlass_aot.run.dispatch import _memo_entry
from cutlass_aot.run.select import Candidate, Choice

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def cache():
    return device_cache()


def _check_cases(e, call, sig: dict, cases, nb: int, failures: list, tag: str = "") -> int:
    """run_case for each (M, N, K) of ``cases``; a failure is recorded, not
    raised, so one run shows the whole pattern. Returns how many ran."""
    for m, n, k in cases:
        try:
            run_case(call, sig, m, n, k, nb, with_c=sig["c"] is not None)
        except AssertionError as exc:
            failures.append(f"{e.signature} {_label(e)}{tag} M={m} N={n} K={k}: {exc}")
    return len(cases)


def _same_bits_three_runs(call, sig: dict, m: int, n: int, k: int) -> bool:
    """Three runs of ``call`` on the same fresh inputs (a[M,K], a weight [N,K]
    as b = w.t() or its row-major copy, per b_major), each into a
    NaN-poisoned output: finite, and the same bits every run."""
    dt = TORCH[sig["a"]]
    a = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(n, k, device="cuda", dtype=dt)
    b = w.t() if sig["b_major"] == "k" else w.t().contiguous()
    outs = []
    for _ in range(3):
        d = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
        call(a, b, d, None, 1.0, 0.0)
        outs.append(d)
    torch.cuda.synchronize()
    return bool(torch.isfinite(outs[0]).all()) and all(torch.equal(outs[0], o) for o in outs[1:])


def _tile(e):
    tm, tn = (int(x) for x in e.variant["tile"].split("x"))
    cm, cn = (int(x) for x in e.variant["cluster"].split("x"))
    return tm, tn, cm, cn


def test_swizzled_and_rastered_schedules_on_1_2_3_tiles(cache):
    """Every raster/swizzle variant on problems with 1, 2 and 3 tiles (and a
    ragged edge) along each dimension: the band walk covers each tile once.
    Those fit in one wave, where the kernel walks plainly; so each variant
    also runs grids of more than a wave of clusters (1, 2 and 3 cluster
    columns or rows, a ragged last band), where the banded walk runs."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    failures, checked = [], 0
    for e in _entries(cache):
        v = e.variant
        if e.record["family"] != "sm90_gemm":
            continue  # sm80_gemm's own schedule: tests/gpu/test_sm80_gpu.py
        if (v.get("raster", "m"), int(v.get("swizzle", 1))) == ("m", 1) or v.get("split_k"):
            continue
        sig = dict(e.signature.fields)
        tm, tn, cm, cn = _tile(e)
        call = raw_caller(cache, e)
        for tiles_m in (1, 2, 3):
            for tiles_n in (1, 2, 3):
                m, n = tm * tiles_m - 5, tn * tiles_n - 8
                checked += 1
                try:
                    run_case(call, sig, m, n, 200, 2, with_c=sig["c"] is not None)
                except AssertionError as exc:
                    failures.append(f"{e.signature} {_label(e)} M={m} N={n}: {exc}")
        # More than a wave: few cluster columns (rows) and enough rows
        # (columns) for slots + 5 clusters; one batch, short K.
        slots = sms // (cm * cn)
        cases = []
        for few in (1, 2, 3):
            many = -(-(slots + 5) // few)
            cases.append((many * cm * tm - 5, few * cn * tn - 8, 64))
            cases.append((few * cm * tm - 5, many * cn * tn - 8, 64))
        checked += _check_cases(e, call, sig, cases, 1, failures, " (waves > 1)")
    for line in failures:
        print("FAIL", line)
    assert checked and not failures, f"{len(failures)} of {checked} failed"


def test_pingpong_alternate_tiles_and_ring_skips(cache):
    """Every pingpong variant where the two warpgroups' shares differ: one
    tile (the second warpgroup idle), a wave plus one tile (one CTA's second
    warpgroup gets the extra), several tiles a CTA with an odd count, and K
    from one k-block to many more than the ring's stages (the skip over the
    other warpgroup's k-blocks wraps the ring's phase)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    failures, checked = [], 0
    for e in _entries(cache):
        if e.record["family"] != "sm90_gemm" or not e.variant.get("pingpong"):
            continue
        sig = dict(e.signature.fields)
        tm, tn, cm, cn = _tile(e)
        slots = sms // (cm * cn)
        call = raw_caller(cache, e)
        cases = [(tm - 3, tn - 5, 72)]
        # A wave plus one cluster tile; three waves and a bit, at long K.
        for waves, extra, k in ((1, 1, 520), (3, 5, 1500), (2, 0, 64)):
            clusters = waves * slots + extra
            cols = 4 * cn
            rows = -(-clusters // 4) * cm
            cases.append((rows * tm - 7, cols * tn - 8, k))
        checked += _check_cases(e, call, sig, cases, 2, failures)
    for line in failures:
        print("FAIL", line)
    assert checked, "the cache holds no pingpong variant"
    assert not failures, f"{len(failures)} of {checked} failed"


def test_split_k_edges_and_sm_multiples(cache):
    """Split-K and stream-K (splits 0): M in {1, 7, 64, 129}, K not a multiple
    of splits x 64, K below splits x the k-block, tile counts just above a
    multiple of the SM count, and fewer tiles than SMs with a long K (stream-K
    runs that start and end inside tiles). The workspace is NaN-poisoned."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    failures, checked = [], 0
    for e in _entries(cache):
        if e.record["abi"] != GEMM_SPLITK_ABI:
            continue
        sig = dict(e.signature.fields)
        tm, tn, _, _ = _tile(e)
        swap = bool(e.variant.get("swap_ab"))
        cases = [(m, 392, 1000) for m in (1, 7, 64, 129)] + [(33, 200, 100)]
        # (sms + 1) tiles along the kernel's M: one whole wave, then a
        # tail of one tile that the hybrid splits.
        wide = tm * (sms + 1) - 3
        cases.append((16, wide, 320) if swap else (wide, tn, 320))
        # sms + 6 tiles over two tile columns, partial edges both ways: a
        # tail of 6 tiles, split, next to a full data-parallel wave.
        tall, two = tm * (sms // 2 + 3) - 5, tn + 7
        cases.append((two, tall, 1000) if swap else (tall, two, 1000))
        # 70 tiles of 47 k-blocks: no split count fits one wave, stream-K
        # gives each SM about 25 k-blocks, most runs crossing a tile edge.
        cases.append((tn - 3, tm * 70 - 9, 2990) if swap else (tm * 35 - 9, 2 * tn - 3, 2990))
        for splits in (2, 4, 7, 0):
            call = raw_caller(cache, e, splits)
            checked += _check_cases(e, call, sig, cases, 1, failures, f" splits={splits}")
    for line in failures:
        print("FAIL", line)
    assert checked and not failures, f"{len(failures)} of {checked} failed"


def test_split_k_is_bit_identical_run_to_run(cache):
    """The partials are summed in split order by one thread each: the same
    inputs give the same bits, every run."""
    checked = 0
    for e in _entries(cache):
        if e.record["abi"] != GEMM_SPLITK_ABI:
            continue
        sig = dict(e.signature.fields)
        if sig["c"] is not None or sig.get("bias"):
            continue
        # Every tile split, then a whole wave plus a split tail (hybrid);
        # the same under stream-K (splits 0).
        for m, k in ((48, 8192), (2900, 2048)):
            for splits in (6, 0):
                assert _same_bits_three_runs(raw_caller(cache, e, splits), sig, m, 1536, k), \
                    f"{_label(e)} M={m} splits={splits}: results not finite or differ run to run"
                checked += 1
    assert checked


def test_k_cluster_edges_and_bit_identical(cache):
    """K-cluster variants (partials summed in the first CTA's shared memory):
    M in {1, 7, 64, 129}; K not a multiple of k_cluster x 64 and K below it
    (a CTA with no k-blocks pushes zeros); tile counts just above a multiple
    of the clusters the GPU holds, and several tiles per cluster (the
    exchange's barriers change phase tile to tile); the same bits run to run."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    failures, checked, identical = [], 0, 0
    for e in _entries(cache):
        kc = int(e.variant.get("k_cluster", 1))
        if e.record["family"] != "sm90_gemm" or kc == 1:
            continue
        sig = dict(e.signature.fields)
        tm, tn, _, _ = _tile(e)
        swap = bool(e.variant.get("swap_ab"))
        slots = sms // kc
        cases = [(m, 392, 1000) for m in (1, 7, 64, 129)] + [(5, 300, 64 * kc - 8), (9, 200, 40)]
        # One tile past a whole wave of clusters; then three tiles a cluster.
        for tiles, k in ((slots + 1, 520), (3 * slots + 2, 1480)):
            wide = tm * tiles - 3
            cases.append((13, wide, k) if swap else (wide, 13, k))
        call = raw_caller(cache, e)
        checked += _check_cases(e, call, sig, cases, 1, failures)
        if sig["c"] is None and not sig.get("bias") and sig["rank"] == 2:
            if not _same_bits_three_runs(call, sig, 24, tm * (2 * slots + 1), 4160):
                failures.append(f"{_label(e)}: results not finite or differ run to run")
            identical += 1
    for line in failures:
        print("FAIL", line)
    assert checked and identical and not failures, f"{len(failures)} of {checked} failed"


def test_resident_grid_of_3_and_4_cta_clusters(cache):
    """Since r33 a cluster of 3 or 4 CTAs is launched with the resident
    clusters' SM count (run/occupancy.py), a smaller persistent grid than
    SMs // size: every such variant (plain, split-K and stream-K, K-cluster)
    on grids just past a whole number of resident clusters and of several
    tiles per cluster, NaN-poisoned output and scratch. The driver's answer
    is checked against what a cluster of each size can hold."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    answers = occupancy.query(0)
    assert answers is not None, "the driver gave no resident-cluster count on an sm_90 GPU"
    assert answers[1] >= sms and all(1 <= answers[s] <= sms // s for s in (2, 3, 4)), answers
    # The dispatcher's memo entry hands a 4-CTA cluster the resident grid.
    fn_key = next(e.key for e in _entries(cache) if e.record["family"] == "sm90_gemm")
    four = Choice(Candidate(fn_key, 128, 128, 4, 1), 1, "model")
    assert _memo_entry(cache, four, sms, 4096, 4096, 1, False, k=512)[1] == 4 * answers[4]
    failures, checked = [], 0
    for e in _entries(cache):
        v = e.variant
        if e.record["family"] != "sm90_gemm":
            continue  # gemv and sm80_gemm: one CTA per output tile, no clusters
        tm, tn, cm, cn = _tile(e)
        kc = int(v.get("k_cluster", 1))
        size = cm * cn * kc
        if size < 3:
            continue
        grid = occupancy.grid_sms(0, size, sms)
        clusters = grid // size
        sig = dict(e.signature.fields)
        swap = bool(v.get("swap_ab"))
        # Tiles along the kernel's M (cm of them per cluster): one past a
        # whole resident wave, then about three clusters' walks each.
        cases = []
        for walks, k in ((1, 520), (3, 1480)):
            wide = tm * cm * (walks * clusters + 1) - 3
            narrow = tn * cn - 5
            cases.append((narrow, wide, k) if swap else (wide, narrow, k))
        split = e.record["abi"] == GEMM_SPLITK_ABI
        for splits in ((3, 0) if split else (1,)):
            call = raw_caller(cache, e, splits, sm_count=grid)
            checked += _check_cases(e, call, sig, cases, 1, failures, f" grid={grid} splits={splits}")
    for line in failures:
        print("FAIL", line)
    assert checked and not failures, f"{len(failures)} of {checked} failed"


def _decode_tensors(m=4, n=4096, k=8192, dt=torch.bfloat16):
    a = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(n, k, device="cuda", dtype=dt)
    return a, w


def test_dispatch_decode_uses_a_narrow_or_split_schedule_and_is_right(cache):
    a, w = _decode_tensors()
    runner = cache.gemm.runner
    choice = runner.choice_for(a, w.t())
    out = cache.gemm(a, w.t())
    torch.cuda.synchronize()
    print("decode pick:", choice.label(), choice.source)
    assert rel_err(out, a.double() @ w.double().t()) < TOL["bf16"]


def test_split_k_under_graph_capture_two_streams_two_threads(cache):
    """Scratch comes from torch's allocator on the current stream: graph
    replay with new inputs, two streams and two threads stay correct."""
    from cutlass_aot.run import select  # noqa: PLC0415 - local to this test
    from cutlass_aot.run.dispatch import _split_k_launcher  # noqa: PLC0415

    runner = cache.gemm.runner
    a, w = _decode_tensors(m=8, n=2048, k=16384)
    out = torch.empty(8, 2048, device="cuda", dtype=torch.bfloat16)
    choice = runner.choice_for(a, w.t(), out)
    print("dispatcher's pick for 8x2048x16384:", choice.label(), choice.source)
    if not choice.candidate.split_k:
        # Make the memo hold a split-K launch for this key, so the captured
        # call exercises the scratch path whatever the model prefers.
        key = next(k for k in runner._memo if k[0] == out.shape and k[4] == 16384)
        sig = next(s for s in runner._candidates
                   if any(x.key == choice.candidate.key for x in runner._candidates[s]))
        sk = [c for c in runner._candidates_for(sig) if c.split_k]
        assert sk, "no split-K candidate for the bf16 nn.Linear signature"
        forced = select.Choice(sk[0], 4, "test")
        fn = cache.function(sk[0].key)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        runner._memo[key] = (fn, sms, _split_k_launcher(fn, sms, forced, 8, 2048, 1))
        # ... and keep the C++ entry (run/fastpath.py) from serving the
        # model's choice for it: this test runs the Python launcher's scratch
        # (tests/gpu/test_fastpath_gpu.py runs the C++ entry's).
        runner._fast_regs.pop(key, None)
    cache.gemm(a, w.t(), out)
    torch.cuda.synchronize()
    g = capture(lambda: cache.gemm(a, w.t(), out))
    assert_replays_fresh(g, (a, w), out, lambda: a.double() @ w.double().t(), TOL["bf16"])
    assert_two_streams(cache.gemm, lambda: _decode_tensors(m=8, n=2048, k=16384), (8, 2048),
                       torch.bfloat16, TOL["bf16"])

    errors = []

    def worker(i):
        try:
            x, y = _decode_tensors(m=8, n=2048, k=16384)
            for _ in range(10):
                o = cache.gemm(x, y.t())
            torch.cuda.synchronize()
            assert rel_err(o, x.double() @ y.double().t()) < TOL["bf16"]
        except Exception as exc:  # reported below
            errors.append(f"thread {i}: {exc!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_stream_k_under_graph_capture_and_two_streams(cache):
    """Stream-K through dispatch's launcher: its scratch is taken inside the
    capture (the graph's pool), replays with new inputs stay right, and two
    streams at once do too."""
    from cutlass_aot.run import select  # noqa: PLC0415 - local to this test
    from cutlass_aot.run.dispatch import _split_k_launcher  # noqa: PLC0415

    entry = next(e for e in _entries(cache) if e.record["abi"] == GEMM_SPLITK_ABI
                 and dict(e.signature.fields)["a"] == "bf16" and dict(e.signature.fields)["c"] is None
                 and not dict(e.signature.fields).get("bias") and dict(e.signature.fields)["rank"] == 2
                 and dict(e.signature.fields)["b_major"] == "k")
    cand = select.candidate_from_variant(entry.key, dict(entry.variant, split_k=True))
    fn = cache.function(entry.key)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    m, n, k = 300, 2056, 6000
    launch = _split_k_launcher(fn, sms, select.Choice(cand, 0, "test"), m, n, 1, k=k)
    a, w = _decode_tensors(m=m, n=n, k=k)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    launch(a, w.t(), out, None, None, 1.0, 0.0)
    torch.cuda.synchronize()
    g = capture(lambda: launch(a, w.t(), out, None, None, 1.0, 0.0))
    assert_replays_fresh(g, (a, w), out, lambda: a.double() @ w.double().t(), TOL["bf16"],
                         what=_label(entry))
    assert_two_streams(lambda x, wt, o: launch(x, wt, o, None, None, 1.0, 0.0),
                       lambda: _decode_tensors(m=m, n=n, k=k), (m, n), torch.bfloat16, TOL["bf16"],
                       what=_label(entry))


def test_beta_zero_does_not_read_c(cache):
    """BLAS semantics: beta = 0 means C is not read, so NaN in C is harmless."""
    a = torch.randn(300, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    c = torch.full((300, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = cache.gemm(a, w.t(), c=c, alpha=1.5, beta=0.0)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    assert rel_err(out, 1.5 * (a.double() @ w.double().t())) < TOL["bf16"]


def test_k_zero_is_beta_c_or_zeros(cache):
    a = torch.randn(64, 0, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, 0, device="cuda", dtype=torch.bfloat16)
    out = torch.full((64, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    cache.gemm(a, w.t(), out)
    torch.cuda.synchronize()
    assert (out == 0).all()
    c = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    out.fill_(float("nan"))
    cache.gemm(a, w.t(), out, c=c, beta=2.0)
    torch.cuda.synchronize()
    assert torch.equal(out, (2.0 * c.float()).to(torch.bfloat16))


@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_erf", "silu"])
def test_bias_and_activation_through_dispatch(cache, act):
    sigs = [s for s in cache.signatures() if s.get("a") == "bf16" and "bias" in dict(s.fields)
            and dict(s.fields).get("act", None) == act]
    if not sigs:
        pytest.skip(f"the cache has no bias variant with act={act}")
    for m, n, k in [(1, 4096, 4096), (77, 1000, 520), (2048, 3072, 1024)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 16
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        cache.gemm(a, w.t(), out, bias=bias, act=act)
        torch.cuda.synchronize()
        ref = a.double() @ w.double().t() + bias.double()
        ref = {None: lambda x: x, "relu": torch.relu,
               "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
               "gelu_erf": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}[act](ref)
        assert torch.isfinite(out).all()
        assert rel_err(out, ref) < TOL["bf16"], (m, n, k, act)


def test_bias_of_wrong_length_or_device_and_unknown_act_are_clear_errors(cache):
    from cutlass_aot import ArgumentError  # noqa: PLC0415 - local to this test

    a = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ArgumentError, match="length N"):
        cache.gemm(a, w.t(), bias=torch.randn(127, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ArgumentError, match="CUDA"):
        cache.gemm(a, w.t(), bias=torch.randn(128, dtype=torch.bfloat16))
    with pytest.raises(ArgumentError, match="unknown act"):
        cache.gemm(a, w.t(), act="tanh")
