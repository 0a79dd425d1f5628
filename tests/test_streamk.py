"""Stream-K's plan, checked on the CPU with the kernel's own arithmetic.

sm90_gemm's ``_sk_walk`` / ``_sk_unit`` (the walk every CTA of a split-K
variant runs) are integer arithmetic with one uniform branch on the split
count; ``cute.jit`` stages that branch on the GPU, and its undecorated
originals (``__wrapped__``) run here on Python ints. Every case checks that the
units the workers run cover each tile's k-blocks exactly once, that whole
tiles go to D and pieces to distinct workspace slots inside the run side's
workspace (``signature.splitk_workspace_elems``), and that the reduce pass
sums exactly the pieces written. The same walk decodes the split-K hybrid
(split counts >= 1), which is checked against its own definition.
"""

from __future__ import annotations

import pytest

from cutlass_aot.kernels.sm90_gemm import Sm90Gemm, Sm90GemmConfig
from cutlass_aot.run import select
from cutlass_aot.signature import ceil_div, splitk_workspace_elems, streamk_plan


def _gemm(cluster_m: int = 1) -> Sm90Gemm:
    return Sm90Gemm(Sm90GemmConfig(128, 128, cluster_m, 1, True, 1, False, split_k=True), 2)


# The walk's helpers as written, before cute.jit stages them.
_SK_WALK = Sm90Gemm._sk_walk.__wrapped__
_SK_UNIT = Sm90Gemm._sk_unit.__wrapped__


def _walk(gemm: Sm90Gemm, tiles: int, k_tiles: int, slots: int, splits: int):
    """Every unit every worker runs, as the kernel's host code and walk compute them."""
    dp = (tiles // slots) * slots
    tail = tiles - dp
    units = dp + tail * splits
    persistent = min(units, slots)
    if splits == 0:
        persistent = max(min(units + tail * k_tiles, slots), 1)
    runs = []
    for w in range(persistent):
        walk = _SK_WALK(gemm, w, persistent, dp, tail, splits, k_tiles)
        for i in range(int(walk[0])):
            tile, (t_local, piece), first, count, partial = _SK_UNIT(
                gemm, i, w, persistent, dp, tail, splits, k_tiles, walk)
            runs.append((w, int(tile), int(t_local), int(piece), int(first), int(count),
                         int(partial), int(walk[6])))
    return dp, tail, persistent, runs


CASES = [  # (tiles, k-blocks per tile, slots)
    (76, 48, 132), (70, 23, 132), (1, 2, 132), (1, 300, 132), (5, 3, 132), (131, 7, 132),
    (133, 40, 132), (288, 95, 132), (264, 16, 132), (290, 2, 132), (3, 1000, 66),
    (40, 5, 37), (200, 64, 66), (7, 9, 8), (17, 17, 16),
]


@pytest.mark.parametrize("tiles,k_tiles,slots", CASES)
def test_stream_k_covers_every_k_block_once(tiles, k_tiles, slots):
    gemm = _gemm()
    dp, tail, persistent, runs = _walk(gemm, tiles, k_tiles, slots, 0)
    plan = streamk_plan(tail, k_tiles, slots)
    assert persistent == (slots if dp else plan.workers)
    covered: dict[int, list] = {}
    for w, tile, t_local, piece, first, count, partial, stride in runs:
        assert count >= 1
        covered.setdefault(tile, []).append((first, count, partial, piece, w, t_local))
        assert stride == plan.stride
    assert sorted(covered) == list(range(tiles))
    slots_used = set()
    for tile, units in covered.items():
        units.sort()
        assert [u[0] for u in units] == [sum(u[1] for u in units[:i]) for i in range(len(units))]
        assert sum(u[1] for u in units) == k_tiles
        if tile < dp:
            assert len(units) == 1 and units[0][2] == 0  # data-parallel: whole, to D
            continue
        t = tile - dp
        assert plan.pieces(t) == len(units)  # what the reduce pass will sum
        if len(units) == 1:
            assert units[0][2] == 0  # one worker ran it whole: straight to D
            continue
        assert [u[3] for u in units] == list(range(len(units)))  # pieces in worker order
        assert [u[4] for u in units] == sorted(u[4] for u in units)
        assert all(u[2] == 1 and u[5] == t for u in units)
        assert len(units) <= plan.stride
        slots_used.update(t * plan.stride + u[3] for u in units)
    # The slots fit the workspace the run side allocates (1x1 cluster, 128x128 tiles).
    elems = splitk_workspace_elems(tiles * 128, 128, 1, 0, tile_m=128, tile_n=128, cluster_m=1,
                                   cluster_n=1, swap_ab=False, sm_count=slots, k=k_tiles * 64)
    assert all((s + 1) * 128 * 128 <= elems for s in slots_used)
    # Balance: no worker runs more than its share rounded up.
    per_worker: dict[int, int] = {}
    for w, tile, *_rest in runs:
        if tile >= dp:
            per_worker[w] = per_worker.get(w, 0) + _rest[3]
    if per_worker:
        assert max(per_worker.values()) <= ceil_div(tail * k_tiles, plan.workers)


@pytest.mark.parametrize("tiles,k_tiles,slots", CASES + [(388, 596, 132), (124, 596, 132)])
def test_stream_k_slots_that_cross_a_tile_edge_run_in_step(tiles, k_tiles, slots):
    """A run that crosses a tile edge takes the later tile first, from k-block
    0, then the earlier one from k-block (k_tiles - run length): at step j of
    its run every crossing slot reads k-block j, or j + (k_tiles - run
    length), so neighbouring tail tiles read the same operand k-slice at the
    same time (the kernel's module docstring). 388 tiles of 596 k-blocks is
    r18's 24791x608x38128 at 256x160: 124 tail tiles on 132 SMs."""
    gemm = _gemm()
    dp, tail, persistent, runs = _walk(gemm, tiles, k_tiles, slots, 0)
    plan = streamk_plan(tail, k_tiles, slots)
    offsets = set()
    for w in range(persistent):
        pieces = [r for r in runs if r[0] == w and r[1] >= dp]
        assert len(pieces) <= 2
        if len(pieces) == 2:
            (_, later, *_a), (_, earlier, *_b) = pieces
            assert later == earlier + 1
            first_l, count_l = pieces[0][4], pieces[0][5]
            first_e, count_e = pieces[1][4], pieces[1][5]
            assert first_l == 0 and first_e + count_e == k_tiles  # t + 1 from its start, then t to its end
            offsets.add(first_e - count_l)
            assert first_e - count_l == k_tiles - (count_l + count_e)
    share = plan.work // plan.workers
    assert offsets <= {k_tiles - share, k_tiles - share - 1}  # one offset, up to the division's rounding


@pytest.mark.parametrize("tiles,k_tiles,slots", [(76, 48, 132), (288, 95, 132), (7, 9, 8)])
@pytest.mark.parametrize("splits", [1, 2, 3, 8])
def test_the_hybrid_walk_is_unchanged(tiles, k_tiles, slots, splits):
    """Split counts >= 1 decode as the hybrid always did: global unit
    ``worker + i * grid``, whole waves then each tail tile's splits."""
    gemm = _gemm()
    dp, tail, persistent, runs = _walk(gemm, tiles, k_tiles, slots, splits)
    units = dp + tail * splits
    assert len(runs) == units
    by_unit = sorted((w + i * persistent, r) for w in range(persistent)
                     for i, r in enumerate(x for x in runs if x[0] == w))
    for unit, (_, tile, t_local, split, first, count, partial, stride) in by_unit:
        assert stride == splits
        if unit < dp:
            assert (tile, first, count, partial) == (unit, 0, k_tiles, 0)
        else:
            j = unit - dp
            assert (t_local, split, partial) == (j % tail, j // tail, 1)
            lo, n = Sm90Gemm._k_range(k_tiles, splits, split)
            assert (tile, first, count) == (dp + t_local, lo, n)


def test_stream_k_is_offered_and_labelled():
    cand = select.Candidate("k" * 64, 128, 128, 1, 1, split_k=True)
    # 76 tiles of 48 k-blocks on 132 SMs: no split count fits (2 x 76 > 132), stream-K does.
    opts = select.split_choices(cand, 76 * 128, 128, 48 * 64, 1, 132)
    assert opts[-1] == 0
    assert select.Choice(cand, 0, "model").label() == "128x128/1x1/m1/streamk"
    assert select.Choice(cand, 4, "model").label() == "128x128/1x1/m1/splitkx4"
    # In the model it beats splitting in two there (two waves of half tiles).
    m, n, k = 4 * 128, 19 * 128, 48 * 64
    assert select.estimate_us(cand, 0, m, n, k, 1, 132) < select.estimate_us(cand, 2, m, n, k, 1, 132)
    # One k-block a tile: nothing to deal out.
    assert 0 not in select.split_choices(cand, 76 * 128, 128, 64, 1, 132)


def test_stream_k_registers_with_the_cpp_entry_on_the_split_k_abi():
    """The C++ entry takes split count -1 for the plain ABI, so a stream-K
    launch (split count 0 on the split-K ABI) registers as split-K, with its
    scratch size; until r24 the plain ABI was 0 and stream-K reached the
    artifact with the plain argument list."""
    from cutlass_aot.run.dispatch import PLAIN_ABI, _fast_registration, _split_k_launcher  # noqa: PLC0415

    cand = select.Candidate("k" * 64, 128, 64, 1, 1, swap_ab=True, split_k=True)
    fn = object()
    streamk = _split_k_launcher(fn, 132, select.Choice(cand, 0, "table"), 64, 10240, 1, k=8192)
    assert streamk.split_k[0] == 0 and streamk.split_k[1] > 0
    assert _fast_registration((fn, 132, streamk)) == (fn, 132, 0, streamk.split_k[1])
    split = _split_k_launcher(fn, 132, select.Choice(cand, 2, "table"), 64, 10240, 1, k=8192)
    assert _fast_registration((fn, 132, split)) == (fn, 132, 2, split.split_k[1])
    assert _fast_registration((fn, 132, None)) == (fn, 132, PLAIN_ABI, 0)
    assert PLAIN_ABI < 0


def test_stream_k_workspace_needs_k():
    with pytest.raises(ValueError, match="stream-K needs the call's K"):
        from cutlass_aot.run.dispatch import _split_k_launcher  # noqa: PLC0415
        cand = select.Candidate("k" * 64, 128, 128, 1, 1, split_k=True)
        _split_k_launcher(None, 132, select.Choice(cand, 0, "model"), 1000, 1000, 1)
