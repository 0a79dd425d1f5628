"""How many clusters of n CTAs a live GPU runs at once: the persistent grid's size.

The SM90 kernels are persistent (kernels/sm90_gemm.py): a launch sizes its
grid to ``sm_count // cluster size`` clusters, a runtime argument, and each
cluster walks its share of the tiles in a loop. That is right only when
every cluster of the grid is resident at once. A cluster's CTAs must share
a GPC, so an H200's 132 SMs hold fewer clusters of 4 than 33. Until r33
the kernels were handed the SM count itself, so the clusters beyond the
resident ones waited for a whole walk to end before they began theirs: a
second, late wave. On the fit probes a 4x1 cluster over more than four
waves of tiles ran 1.27x its 2x1 sibling where the model, which already
counted the resident clusters, expected 0.91
(benchmarks/results/2026-12-03_h200_r33_notes.md).

This module owns the count handed to a launch: ``grid_sms(device, size,
sms)``, the resident clusters times the cluster size, so that the kernel's
``sm_count // size`` is the resident count. The count is asked of the CUDA
driver (``cuOccupancyMaxActiveClusters``, through ctypes on libcuda) once
per device and size, for an empty kernel whose shared memory (the device's
opt-in maximum) holds one CTA per SM, as the GEMM kernels' do. Where the
driver cannot answer (no libcuda, a driver before CUDA 12, a GPU before
sm_90 with no clusters), ``select.cluster_slots``' fitted counts stand in.

Run side: the standard library only (ctypes), plus select.
"""

from __future__ import annotations

import ctypes
import threading

from . import select

# The driver's enum values this module passes (cuda.h, CUDA 12).
_ATTR_MAX_SMEM_OPTIN = 97        # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
_ATTR_CC_MAJOR = 75              # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
_ATTR_CC_MINOR = 76
_FUNC_MAX_DYNAMIC_SMEM = 8       # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_LAUNCH_ATTR_CLUSTER_DIM = 4     # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
_KERNEL = b"cutlass_aot_occupancy_probe"
_SIZES = (1, 2, 3, 4)            # the cluster sizes (CTAs) the manifests build


class _Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("cluster", _Dim3)]


class _LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", _Dim3), ("block", _Dim3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttr)),
                ("n_attrs", ctypes.c_uint)]


_LOCK = threading.Lock()
_ANSWERS: dict[int, dict[int, int] | None] = {}  # device -> {size: resident clusters}, or None


def query(device: int) -> dict[int, int] | None:
    """The driver's resident-cluster count per cluster size (1-4 CTAs, one
    CTA per SM) on CUDA device ``device``, or None where it cannot answer.
    Uncached: ``grid_sms`` asks once per device."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if not hasattr(cuda, "cuOccupancyMaxActiveClusters"):
        return None

    def ok(status: int) -> bool:
        return status == 0

    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if not (ok(cuda.cuInit(0)) and ok(cuda.cuDeviceGet(ctypes.byref(dev), device))):
        return None
    major, minor, smem = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    for out, attr in ((major, _ATTR_CC_MAJOR), (minor, _ATTR_CC_MINOR), (smem, _ATTR_MAX_SMEM_OPTIN)):
        if not ok(cuda.cuDeviceGetAttribute(ctypes.byref(out), attr, dev)):
            return None
    if major.value < 9:
        return None  # no clusters before sm_90
    if not ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)):
        return None
    module = ctypes.c_void_p()
    try:
        if not ok(cuda.cuCtxPushCurrent_v2(ctx)):
            return None
        try:
            isa = "8.0" if major.value == 9 else "8.7"  # the first PTX ISA that names the arch
            ptx = (f".version {isa}\n.target sm_{major.value}{minor.value}\n"
                   f".address_size 64\n.visible .entry {_KERNEL.decode()}()\n{{\n  ret;\n}}\n")
            fn = ctypes.c_void_p()
            if not (ok(cuda.cuModuleLoadData(ctypes.byref(module), ptx.encode() + b"\0"))
                    and ok(cuda.cuModuleGetFunction(ctypes.byref(fn), module, _KERNEL))
                    and ok(cuda.cuFuncSetAttribute(fn, _FUNC_MAX_DYNAMIC_SMEM, smem.value))):
                return None
            answers = {}
            for size in _SIZES:
                attr = _LaunchAttr(id=_LAUNCH_ATTR_CLUSTER_DIM)
                attr.value.cluster = _Dim3(size, 1, 1)
                config = _LaunchConfig(grid=_Dim3(size, 1, 1), block=_Dim3(128, 1, 1),
                                       smem=smem.value, stream=None,
                                       attrs=ctypes.pointer(attr), n_attrs=1)
                count = ctypes.c_int()
                if not ok(cuda.cuOccupancyMaxActiveClusters(ctypes.byref(count), fn,
                                                             ctypes.byref(config))):
                    return None
                if count.value < 1:
                    return None
                answers[size] = count.value
            return answers
        finally:
            if module.value:
                cuda.cuModuleUnload(module)
            cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    finally:
        cuda.cuDevicePrimaryCtxRelease_v2(dev)


def resident_clusters(device: int, size: int, sms: int) -> int:
    """Clusters of ``size`` CTAs that device ``device`` (``sms`` SMs) runs at
    once: the driver's answer, asked once per device, else
    ``select.cluster_slots``."""
    if size <= 1:
        return sms
    answers = _ANSWERS.get(device, False)
    if answers is False:
        with _LOCK:
            answers = _ANSWERS.get(device, False)
            if answers is False:
                answers = _ANSWERS[device] = query(device)
    if answers and size in answers:
        return max(1, min(answers[size], sms // size))
    return select.cluster_slots(size, sms)


def grid_sms(device: int, size: int, sms: int) -> int:
    """The SM count a launch of a cluster of ``size`` CTAs is handed, so that
    the kernel's persistent grid (``sm_count // size`` clusters) is the
    resident count: at most ``sms``."""
    return min(sms, resident_clusters(device, size, sms) * max(size, 1))
