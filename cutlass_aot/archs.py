"""Target archs: which artifacts a device can run, what alignment a call has, and
what an artifact's embedded GPU code really targets.

Core module: standard library only (the run side and the build side both use
it; it must never import torch, tvm_ffi or the CuTe DSL). Everything here is
a pure function of plain data, tested on CPU.

Why an artifact built for one arch runs on another
--------------------------------------------------
A cutlass-aot artifact embeds a fatbinary with exactly one entry: a cubin
(SASS) for the manifest's arch, and no PTX (checked by ``embedded_targets``
on every shipped arch; see tests/test_sm80_family.py). Without PTX the driver
cannot JIT the code for a newer GPU, so the CUDA binary-compatibility rule
decides alone: SASS for compute capability X.y runs on X.z with z >= y, the
same major only. Hence:

* an ``sm_80`` cubin runs on sm_80, sm_86 and sm_89 devices; an ``sm_86`` one
  on sm_86 and sm_89; nothing built for major 8 runs on Hopper;
* an ``sm_90`` cubin runs on an sm_90 device (Hopper, which we name
  ``sm_90a``: ``ARCH_BY_CAPABILITY`` maps 9.0 to sm_90a). ``sm_90a`` code
  (wgmma, setmaxnreg) runs only on 9.0 and is preferred there.

``runnable_archs`` lists them exact arch first, then older minors newest
first, so a cache tuned for the device wins over a compatible fallback.
Caveat: binary compatibility says nothing about resources. An sm_80 variant
that uses more shared memory than an sm_86/sm_89 SM gives a CTA (99 KiB)
would fail to launch there: since r50 dispatch drops such candidates on those
devices (``SMEM_OPTIN``, select.fits_device). The shipped configs/sm80.yaml
stays within 99 KiB, so an sm_80-only cache serves the whole Ampere class.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Shared memory one CTA may use (the opt-in maximum), bytes, per arch: what
# decides whether an sm_80 variant that binary compatibility lets run on
# sm_86/sm_89 also fits there (the run side drops those that do not;
# kernels/sm80.py checks the manifest's own arch with the same figures).
SMEM_OPTIN = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024,
              "sm_90": 227 * 1024, "sm_90a": 227 * 1024}

# Archs the build side can target, by (major, minor) and feature suffix.
_ARCH_ORDER = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a")


def parse_arch(arch: str) -> tuple[int, int, bool]:
    """``"sm_90a"`` -> (9, 0, True). Raises ValueError for anything else."""
    if not isinstance(arch, str) or not arch.startswith("sm_"):
        raise ValueError(f"not an arch string: {arch!r} (expected e.g. 'sm_80', 'sm_90a')")
    body = arch[3:]
    accel = body.endswith("a")
    digits = body[:-1] if accel else body
    if not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"not an arch string: {arch!r} (expected e.g. 'sm_80', 'sm_90a')")
    return int(digits[:-1]), int(digits[-1]), accel


def runnable_archs(device_arch: str) -> list[str]:
    """Archs whose artifacts run on a device of ``device_arch``, preferred first.

    ``device_arch`` is the device's arch as ``ARCH_BY_CAPABILITY`` names it
    (``sm_90a`` for compute capability 9.0). Examples::

        sm_80  -> [sm_80]
        sm_86  -> [sm_86, sm_80]
        sm_89  -> [sm_89, sm_86, sm_80]
        sm_90a -> [sm_90a, sm_90]
        sm_100a -> [sm_100a, sm_100]

    Only archs the build side knows are listed (see the module docstring for
    the rule and its shared-memory caveat).
    """
    major, minor, _accel = parse_arch(device_arch)
    older = []
    for arch in _ARCH_ORDER:
        a_major, a_minor, a_accel = parse_arch(arch)
        # "a" code runs only on exactly its own arch; plain code on its major,
        # same or newer minor.
        if arch != device_arch and a_major == major and not a_accel and a_minor <= minor:
            older.append((a_minor, arch))
    return [device_arch] + [arch for _, arch in sorted(older, reverse=True)]


def archs_text(archs: Iterable[str]) -> str:
    """Sorted, comma-separated arch list for messages ("none" when empty)."""
    items = sorted(set(archs), key=lambda a: (_ARCH_ORDER.index(a) if a in _ARCH_ORDER else 99, a))
    return ", ".join(items) if items else "none"


# ----------------------------------------------------------------- alignment

ALIGNMENTS = (16, 8, 4, 2)  # bytes, the values of the signature's `align` field


def _pow2_divisor(value: int, cap: int = 16) -> int:
    """Largest power of two <= cap that divides ``value`` (cap for 0)."""
    value = abs(int(value))
    if value == 0:
        return cap
    return min(cap, value & -value)


def contiguous_dim(strides: Sequence[int]) -> int | None:
    """Index of the dim a GEMM kernel reads as contiguous: the last when its
    stride is 1, else the one before when its stride is 1 (select.major's
    rule), else None."""
    for dim in (len(strides) - 1, len(strides) - 2):
        if dim >= 0 and strides[dim] == 1:
            return dim
    return None


def tensor_alignment(data_ptr: int, strides: Sequence[int], elem_bytes: int,
                     cap: int = 16) -> int:
    """Bytes (a power of two, at most ``cap``) one tensor satisfies.

    That is the largest power of two dividing its data pointer and every
    stride in bytes except the contiguous dim's (``contiguous_dim``: an
    artifact requires that one to be 1 anyway). Another stride of 1 counts
    as 1 element: a [M, 1] tensor with strides (1, 1) has 2-byte rows for a
    bf16 kernel, whose TMA descriptor needs 16 (torch gives such strides to
    every contiguous tensor with a last dim of 1). ``strides`` are torch's,
    in elements. A tensor is at least ``elem_bytes`` aligned by construction.
    """
    align = _pow2_divisor(data_ptr, cap)
    inner = contiguous_dim(strides)
    for dim, s in enumerate(strides):
        if dim != inner:
            align = min(align, _pow2_divisor(s * elem_bytes, cap))
    return max(min(align, cap), min(elem_bytes, cap))


def call_alignment(tensors: Iterable[tuple[int, Sequence[int], int]], cap: int = 16) -> int:
    """Largest alignment (bytes) every tensor of a call satisfies.

    ``tensors`` holds ``(data_ptr, strides, elem_bytes)`` per tensor (a, b,
    d and, when given, c). The result is the signature ``align`` to look up:
    a variant with ``align <= call_alignment(...)`` can serve the call, and
    the widest such variant is the fastest. 16 is what the TMA family needs.
    """
    align = cap
    for ptr, strides, elem in tensors:
        align = min(align, tensor_alignment(ptr, strides, elem, cap))
    return align


def servable_aligns(call_align: int) -> list[int]:
    """Signature ``align`` values that can serve a call, widest (fastest) first."""
    return [a for a in ALIGNMENTS if a <= call_align]


# --------------------------------------------------- embedded code: fatbin/ELF

_FATBIN_MAGIC = 0xBA55ED50
_ELF_MAGIC = b"\x7fELF"
_EM_CUDA = 190
_KIND_PTX = 1
_KIND_ELF = 2
# Bit 0x800 of a CUDA ELF's e_flags (ABI v7) marks arch-specific ("a") code.
_EF_CUDA_ACCELERATORS = 0x800


@dataclass(frozen=True)
class EmbeddedCode:
    """One entry of a fatbinary found inside a host object or shared library."""

    kind: str  # "sass" (a cubin) or "ptx"
    arch: str  # e.g. "sm_90a"; for a cubin read from its ELF e_flags
    fatbin_arch: int  # the entry header's arch number (e.g. 90)


def _cubin_arch(cubin: bytes) -> str:
    """The target of a CUDA ELF, from e_machine and e_flags (ABI version 7)."""
    if cubin[:4] != _ELF_MAGIC or cubin[4] != 2:
        raise ValueError("embedded cubin is not a 64-bit ELF")
    (machine,) = struct.unpack_from("<H", cubin, 18)
    if machine != _EM_CUDA:
        raise ValueError(f"embedded ELF has e_machine {machine}, not EM_CUDA ({_EM_CUDA})")
    (flags,) = struct.unpack_from("<I", cubin, 48)
    sm = flags & 0xFF
    suffix = "a" if flags & _EF_CUDA_ACCELERATORS else ""
    return f"sm_{sm}{suffix}"


def embedded_targets(blob: bytes) -> list[EmbeddedCode]:
    """Every fatbinary entry in ``blob`` (a kernel.so or .o), with its target.

    Walks each fatbinary (header: magic, version, header size, payload size;
    entries: kind, header size, payload size, ..., arch at byte 28) and reads
    a cubin's arch from its own ELF header, which is what the driver checks.
    Raises ValueError on a truncated or malformed fatbinary.
    """
    found: list[EmbeddedCode] = []
    magic = struct.pack("<I", _FATBIN_MAGIC)
    pos = blob.find(magic)
    while pos >= 0:
        _, _version, header_size, fat_size = struct.unpack_from("<IHHQ", blob, pos)
        entry = pos + header_size
        end = entry + fat_size
        if end > len(blob):
            raise ValueError(f"fatbinary at {pos} runs past the end of the file")
        while entry < end:
            kind, _, e_header, size = struct.unpack_from("<HHIQ", blob, entry)
            (arch_num,) = struct.unpack_from("<I", blob, entry + 28)
            payload = blob[entry + e_header: entry + e_header + size]
            if kind == _KIND_ELF:
                found.append(EmbeddedCode("sass", _cubin_arch(payload), arch_num))
            elif kind == _KIND_PTX:
                found.append(EmbeddedCode("ptx", f"compute_{arch_num}", arch_num))
            else:
                raise ValueError(f"fatbinary entry of unknown kind {kind}")
            if e_header <= 0 or size < 0:
                raise ValueError("malformed fatbinary entry")
            entry += e_header + size
        pos = blob.find(magic, end)
    return found


__all__ = [
    "ALIGNMENTS",
    "EmbeddedCode",
    "archs_text",
    "call_alignment",
    "embedded_targets",
    "parse_arch",
    "runnable_archs",
    "servable_aligns",
    "contiguous_dim",
    "tensor_alignment",
]
