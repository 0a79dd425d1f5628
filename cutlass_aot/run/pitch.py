"""Pitch: the staged route's 16-byte pitched scratch, and the check that says who needs it.

Run side: torch and the core modules.

A call below 16-byte alignment runs staged (run/dispatch.py): each
misaligned operand is copied into a tensor of the same shape, dtype and
majorness whose pointer and strides are 16-byte multiples, which TMA takes.
This module owns that layout (``pitched_strides``, ``pitched_like``) and the
per-call check (``aligned16``).

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


__all__ = ["aligned16", "pitched_like", "pitched_strides"]
