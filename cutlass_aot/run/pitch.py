"""Pitch: the staged route's scratch, and its copies between a tensor and 16-byte pitched scratch.

Run side: the standard library (ctypes), torch and the core modules.

A call below 16-byte alignment runs staged (run/dispatch.py): each
misaligned operand is copied into a tensor of the same shape, dtype and
majorness whose pointer and strides are 16-byte multiples, which TMA takes.
This module owns that layout (``pitched_strides``, ``pitched_like``), the
per-call check (``aligned16``) and the copy (``copy``).

The copy is one strided 2-D copy of rows: the contiguous dim's extent in
bytes is the width, the other dims' rows the height, each side with its own
pitch. Where the CUDA driver can be reached (``libcuda.so.1``, through
ctypes) and both tensors lie on the current device with evenly pitched rows,
it is ``cuMemcpy2DAsync`` on torch's current stream: one driver call where
``Tensor.copy_`` on a strided tensor builds a TensorIterator first (host
time is what a staged call of a small problem is made of), captured by CUDA
graphs like any stream work. Otherwise, or if the driver refuses (no context
current on this thread, say), ``Tensor.copy_``.
"""

from __future__ import annotations

import ctypes

import torch

from .. import archs

# CUDA_MEMCPY2D (cuda.h, the _v2 layout); CU_MEMORYTYPE_DEVICE = 2.
_DEVICE_MEMORY = 2


class _Memcpy2D(ctypes.Structure):
    _fields_ = [
        ("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t),
        ("srcMemoryType", ctypes.c_int), ("srcHost", ctypes.c_void_p),
        ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t),
        ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
        ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p),
        ("dstDevice", ctypes.c_uint64), ("dstArray", ctypes.c_void_p),
        ("dstPitch", ctypes.c_size_t),
        ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t),
    ]


_driver: list = []  # [cuMemcpy2DAsync_v2 or None], resolved on first use


def _memcpy2d():
    """The driver's cuMemcpy2DAsync_v2, or None where the driver cannot be loaded."""
    if not _driver:
        try:
            fn = ctypes.CDLL("libcuda.so.1").cuMemcpy2DAsync_v2
            fn.argtypes = [ctypes.POINTER(_Memcpy2D), ctypes.c_void_p]
            fn.restype = ctypes.c_int
            _driver.append(fn)
        except (OSError, AttributeError):
            _driver.append(None)
    return _driver[0]


def _raw_stream(index: int) -> int:
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(index) if get is not None else torch.cuda.current_stream(index).cuda_stream


def pitched_strides(shape: tuple, strides: tuple, item: int) -> tuple:
    """Strides of a 16-byte pitched tensor of ``shape`` with the same majorness.

    The contiguous dim (archs.contiguous_dim: the last when its stride is 1,
    else the one before, as select.major reads it, so the signature does not
    change) keeps stride 1; the other of the last two steps by the
    contiguous extent rounded up to 16 bytes; a batch dim by a whole matrix.
    The caching allocator's blocks start 512-byte aligned, so pointer and
    every stride are 16-byte multiples. The padding is never read: TMA
    bounds every copy by the logical shape.
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
    shape = tuple(t.shape)
    return torch.empty_strided(shape, pitched_strides(shape, t.stride(), t.element_size()),
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


def _rows(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(width in bytes, rows, pitch in bytes) of t as one 2-D array of rows, or None.

    Rows are the contiguous dim's runs; a rank-3 tensor is one array when
    its batch stride is a whole matrix of rows (its batches are evenly
    pitched). A single row may have any pitch.
    """
    st, shape, item = t.stride(), t.shape, t.element_size()
    inner = archs.contiguous_dim(st)
    if inner is None:
        return None
    outer = len(st) - 2 if inner == len(st) - 1 else len(st) - 1
    width, rows, pitch = shape[inner] * item, shape[outer], st[outer] * item
    if len(st) == 3:
        if shape[0] > 1 and st[0] != rows * st[outer]:
            return None
        rows *= shape[0]
    if rows <= 1:
        pitch = width
    if pitch < width:
        return None
    return width, rows, pitch


def copy(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src) for tensors of one shape, dtype and majorness (see the module docstring)."""
    fn = _memcpy2d()
    dev = dst.device
    if fn is not None and dev.type == "cuda" and src.device == dev and dev.index == torch.cuda.current_device():
        a, b = _rows(src), _rows(dst)
        if a is not None and b is not None and a[:2] == b[:2]:
            width, rows, _ = a
            if width == 0 or rows == 0:
                return dst
            p = _Memcpy2D(srcMemoryType=_DEVICE_MEMORY, srcDevice=src.data_ptr(), srcPitch=a[2],
                          dstMemoryType=_DEVICE_MEMORY, dstDevice=dst.data_ptr(), dstPitch=b[2],
                          WidthInBytes=width, Height=rows)
            if fn(ctypes.byref(p), ctypes.c_void_p(_raw_stream(dev.index))) == 0:
                return dst
    return dst.copy_(src)


__all__ = ["aligned16", "copy", "pitched_like", "pitched_strides"]
