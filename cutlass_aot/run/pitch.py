"""Pitch: the staged route's 16-byte pitched scratch, and the check that says who needs it.

Run side: torch and the core modules.

A call below 16-byte alignment runs staged (run/dispatch.py): each
misaligned operand is copied into a tensor of the same shape, dtype and
majorness whose pointer and strides are 16-byte multiples, which TMA takes.
This module owns that layout (``pitched_strides``, ``pitched_like``), the
per-call check (``aligned16``), and which outputs a 16-byte store would
write past (``odd_edge``, ``stores_whole_chunks``).

The edge: sm90_gemm's epilogue is a TMA store, which writes whole 16-byte
chunks. An ``out`` whose contiguous extent (N row-major, M column-major) is
not a 16-byte multiple, yet whose pointer and strides are (a padded view:
its rows end inside the pitch), would have the elements between its edge
and the next 16-byte boundary overwritten (r1's GPU table saw it; tests/gpu
test_gemm_gpu.py pins the artifact's behaviour). Dispatch serves such a
call with out staged: the variant writes pitched scratch, and torch copies
exactly the view back. Families that store each element under its own
bounds check (``EXACT_STORE_FAMILIES``) write the view in place.

The copies are torch's ``Tensor.copy_`` (a strided elementwise kernel on
the current stream). The CUDA driver's pitched ``cuMemcpy2DAsync`` (through
ctypes) was tried at e26f659 and measured slower on the H200 for the staged
route: 1.51x against 1.58x cuBLAS (bf16) on the issue's unaligned shapes,
0.42x against 0.54x on the held-out sample. Calls that copy out back lost
most (2x366x2228: 50 -> 93 us), two-copy small problems gained a little
(1000x1000x1001: 50 -> 38 us). benchmarks/results/2026-11-30_h200_r4_unaligned_driver_copy.md.
"""

from __future__ import annotations

import functools

import torch

from .. import archs


@functools.lru_cache(maxsize=1024)
def pitched_strides(shape: tuple, strides: tuple, item: int) -> tuple:
    """Strides of a 16-byte pitched tensor of ``shape`` with the same majorness.

    The contiguous dim (archs.contiguous_dim: the last when its stride is 1,
    else the one before, as select.major reads it, so the signature does not
    change) keeps stride 1; the other of the last two steps by the
    contiguous extent rounded up to 16 bytes; a batch dim by a whole matrix.
    The caching allocator's blocks start 512-byte aligned, so pointer and
    every stride are 16-byte multiples. The padding is never read: TMA
    bounds every copy by the logical shape. Memoized: the staged route asks
    once per misaligned operand per call, with a dispatch key's few layouts.
    """
    step = 16 // item
    inner = archs.contiguous_dim(strides)
    inner = len(shape) - 1 if inner is None else inner
    outer = len(shape) - 2 if inner == len(shape) - 1 else len(shape) - 1
    pitch = -(-shape[inner] // step) * step
    out = [0] * len(shape)
    out[inner], out[outer] = 1, pitch
    if len(shape) == 3:
        out[0] = pitch * shape[outer]
    return tuple(out)


def pitched_like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialized 16-byte pitched tensor of t's shape, dtype and majorness."""
    shape = t.shape
    return torch.empty_strided(shape, pitched_strides(tuple(shape), t.stride(), t.element_size()),
                               dtype=t.dtype, device=t.device)


def aligned16(t: torch.Tensor) -> bool:
    """Whether TMA takes t as it is: archs.tensor_alignment(...) >= 16, unrolled
    for ranks 2 and 3 (it runs per call on the staged route)."""
    if t.data_ptr() & 15:
        return False
    st, mask = t.stride(), 16 // t.element_size() - 1
    batch = st[0] if len(st) == 3 else 0
    if st[-1] == 1:
        return not (st[-2] | batch) & mask
    return st[-2] == 1 and not (st[-1] | batch) & mask


def odd_edge(t: torch.Tensor) -> bool:
    """Whether out's contiguous extent (archs.contiguous_dim's; the last dim
    when no stride is 1) is not a 16-byte multiple: a 16-byte store of its
    last chunk would run past it. A contiguous such tensor has misaligned
    strides too, so only a padded view is news here."""
    st = t.stride()
    inner = -1 if st[-1] == 1 or st[-2] != 1 else -2
    return bool((t.shape[inner] * t.element_size()) & 15)


# Families whose epilogue stores each element of D under its own bounds
# check, so they never write past out's edge: sm80_gemm (kernels/sm80_gemm.py,
# predicated element copies) and the gemv family (kernels/gemv_kernel.py,
# lane i stores output i). Keyed by the index record's ``family``, as the
# manifest spells it; any other family (sm90_gemm's TMA store, a user's
# family) is taken to store whole 16-byte chunks, the safe side.
EXACT_STORE_FAMILIES = frozenset({"sm80_gemm", "cutlass_aot.kernels.gemv:GemvFamily"})


def stores_whole_chunks(family: str) -> bool:
    """Whether a family's epilogue may write up to the next 16-byte boundary past out's edge."""
    return family not in EXACT_STORE_FAMILIES


__all__ = ["EXACT_STORE_FAMILIES", "aligned16", "odd_edge", "pitched_like", "pitched_strides",
           "stores_whole_chunks"]
