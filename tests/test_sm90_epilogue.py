"""sm90_gemm's bias read-ahead (``Sm90Gemm._bias_slots``), on the CPU.

The kernel calls it at trace time with the static layout of a thread's share
of the broadcast bias; here a plain function of the element index stands in
for that layout. The GPU suite checks the kernels that use it
(tests/gpu/test_gemm_gpu.py, ``test_bias_on_every_tile_of_a_persistent_walk``).
"""

from __future__ import annotations

from cutlass_aot.kernels.sm90_gemm import Sm90Gemm


def _wgmma_bias_offset(i: int, tile_n: int = 256) -> int:
    """The column offset of accumulator ``i`` of one thread of a 64 x tile_n
    wgmma tile, bias broadcast over rows: values in pairs of adjacent columns,
    a second row (+8) of the same columns, then the next 8 columns."""
    pair, group = i % 2, i // 4  # (i // 2) % 2, the row, does not move the offset
    assert group < tile_n // 8
    return pair + 8 * group


def test_bias_slots_keep_each_distinct_column_once():
    distinct, slot, first = Sm90Gemm._bias_slots(_wgmma_bias_offset, 128)
    # 128 accumulators, 64 columns: every column read once, in address order.
    assert distinct == sorted({_wgmma_bias_offset(i) for i in range(128)})
    assert len(distinct) == 64
    assert [distinct[s] for s in slot] == [_wgmma_bias_offset(i) for i in range(128)]
    # An edge tile masks each column by its first reader's coordinate.
    assert [_wgmma_bias_offset(i) for i in first] == distinct
    assert all(slot[i] == j and i == min(x for x in range(128) if slot[x] == j)
               for j, i in enumerate(first))


def test_bias_slots_under_swap_ab_are_rows():
    # Swap-AB broadcasts over the kernel's columns: a thread needs its rows only.
    def offset(i: int) -> int:
        return 8 * ((i // 2) % 2) + 64 * (i // 64)

    distinct, slot, first = Sm90Gemm._bias_slots(offset, 128)
    assert distinct == [0, 8, 64, 72]
    assert all(distinct[s] == offset(i) for i, s in enumerate(slot))
    assert first == [0, 2, 64, 66]


def test_bias_slots_refuse_an_offset_known_only_at_run_time():
    class Dynamic:  # what the DSL returns for a non-constant offset
        pass

    assert Sm90Gemm._bias_slots(lambda i: Dynamic() if i == 3 else i, 8) is None
