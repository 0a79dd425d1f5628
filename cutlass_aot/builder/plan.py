"""Plan: turn manifests into keyed jobs, and say which are already cached.

Build side. Owns the key inputs of a variant (cache_layout.md, "The key"):
the signature it serves, its parameters, the family and its source digest,
the exact arch and compile options, and the whole toolchain (every installed
nvidia-cutlass-dsl* distribution, apache-tvm-ffi, cutlass-aot itself, and the
linker). Nothing here imports the CuTe DSL.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import subprocess
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..errors import BuildError
from ..keys import content_key
from ..layout import GEMM_ABI
from ..signature import Signature
from .family import KernelFamily, load_family
from .manifest import Manifest, Variant

LINKER = "gcc"


def compile_options(arch: str) -> str:
    return f"--enable-tvm-ffi --gpu-arch {arch}"


@functools.lru_cache(maxsize=1)
def toolchain() -> dict[str, Any]:
    """Versions of everything that shapes an artifact's bytes."""
    dsl = {
        dist.metadata["Name"].lower(): dist.version
        for dist in md.distributions()
        if (dist.metadata["Name"] or "").lower().startswith("nvidia-cutlass-dsl")
    }
    if not dsl:
        raise BuildError(
            "nvidia-cutlass-dsl is not installed: building needs it "
            "(pip install nvidia-cutlass-dsl, or `make install` in a checkout)"
        )
    try:
        tvm_ffi = md.version("apache-tvm-ffi")
    except md.PackageNotFoundError:
        raise BuildError("apache-tvm-ffi is not installed: building needs it") from None
    try:
        linker = subprocess.run(
            [LINKER, "--version"], capture_output=True, text=True, check=True
        ).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        raise BuildError(f"the linker {LINKER!r} is not available: install gcc") from None
    return {
        "cutlass_dsl": dict(sorted(dsl.items())),
        "tvm_ffi": tvm_ffi,
        "cutlass_aot": __version__,
        "linker": linker,
    }


@dataclass(frozen=True)
class Job:
    """A variant with everything needed to build and record it."""

    key: str
    variant: Variant
    signature: Signature
    symbol: str
    abi: str
    key_inputs: dict

    def describe(self) -> str:
        ref = self.variant.family_ref
        return f"{ref} {_family(ref).describe(self.variant.param_dict)}"


@functools.cache
def _family(ref: str) -> KernelFamily:
    return load_family(ref)


@functools.cache
def _sources(ref: str) -> str:
    return _family(ref).sources_digest()


def key_inputs(variant: Variant) -> dict:
    family = _family(variant.family_ref)
    sig = family.signature(variant.param_dict, variant.arch)
    return {
        "family": variant.family_ref,
        "abi": family.abi_for(variant.param_dict),
        "symbol": family.symbol,
        "params": dict(variant.params),
        "signature": sig.as_dict(),
        "arch": variant.arch,
        "options": compile_options(variant.arch),
        "sources": _sources(variant.family_ref),
        "toolchain": toolchain(),
    }


def plan(manifests: list[Manifest], arch_filter: tuple[str, ...] = ()) -> list[Job]:
    """Every variant of the manifests as a keyed job, in manifest order."""
    jobs: dict[str, Job] = {}
    for manifest in manifests:
        if arch_filter and manifest.arch not in arch_filter:
            continue
        for variant in manifest.variants:
            inputs = key_inputs(variant)
            key = content_key(inputs)
            if key in jobs:  # same variant listed by two manifests
                continue
            family = _family(variant.family_ref)
            jobs[key] = Job(
                key=key,
                variant=variant,
                signature=Signature.from_dict(inputs["signature"]),
                symbol=family.symbol,
                abi=inputs["abi"],
                key_inputs=inputs,
            )
    return list(jobs.values())


__all__ = ["Job", "plan", "key_inputs", "toolchain", "compile_options", "GEMM_ABI"]
