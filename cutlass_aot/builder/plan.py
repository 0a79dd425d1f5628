"""Plan: turn manifests into keyed jobs, and say which are already cached.

Build side. Owns the key inputs of a variant (cache_layout.md, "The key"):
the signature it serves, its parameters, the family and its source digest,
the exact arch and compile options, the CuTe DSL's compile-affecting
environment, the link command, the build-side modules that shape an
artifact (by digest), and the whole toolchain (every installed
nvidia-cutlass-dsl* distribution, apache-tvm-ffi, cutlass-aot itself, and the
linker). Nothing here imports the CuTe DSL.

The key fails closed: every ``CUTE_DSL_*`` (and ``CUTE_EXPERIMENTAL_DSL_*``)
environment variable that is set is keyed, except the few that the DSL's own
environment manager marks as not affecting compilation (logging, dump and
cache locations; ``DSL_ENV_NOT_COMPILE``, checked against the installed DSL by
the test suite). A variable the DSL adds in a later release is therefore keyed
until someone shows it cannot change the bytes.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import BuildError, ManifestError, UsageError
from ..keys import content_key
from ..layout import GEMM_ABI
from ..signature import Signature
from .family import KernelFamily, abi_problem, files_digest, load_family
from .manifest import Manifest, Variant

LINKER = "gcc"
# Flags of the link step (the rest of its argv is paths; see link_argv).
LINK_FLAGS: tuple[str, ...] = ("-shared",)

# Prefixes of the CuTe DSL's environment settings (its CUTLASS_FAMILY_DSL_PREFIXES).
DSL_ENV_PREFIXES = ("CUTE_DSL_", "CUTE_EXPERIMENTAL_DSL_")
# Settings the DSL's environment manager declares with affects_compile=False:
# they change logging, dumps and the DSL's own JIT cache, never the bytes.
# Anything else with a DSL prefix is keyed.
DSL_ENV_NOT_COMPILE = frozenset({
    "JIT_TIME_PROFILING", "LOG_TO_CONSOLE", "LOG_TO_FILE", "LOG_LEVEL",
    "PRINT_AFTER_PREPROCESSOR", "PRINT_IR", "SHOW_STACKTRACE", "FILTER_STACKTRACE",
    "NO_CACHE", "JIT_CACHE_MAX_ELEMS", "DUMP_DIR", "CACHE_DIR", "WARNINGS_IGNORE",
    "ENABLE_OPTIMIZATION_WARNINGS", "DISABLE_FILE_CACHING",
})

# Build-side modules whose code shapes an artifact's bytes (how a variant is
# compiled, exported and linked). Their digest is keyed, so editing them
# (say, the link flags) never serves bytes built by the old code.
BUILD_SOURCES = ("compile.py", "family.py", "plan.py")


def compile_options(arch: str) -> str:
    return f"--enable-tvm-ffi --gpu-arch {arch}"


def link_argv(lib: str, obj: str, runtime_libs: list[str]) -> list[str]:
    """The link command for one artifact (compile.py runs exactly this)."""
    return [LINKER, *LINK_FLAGS, "-o", lib, obj, *runtime_libs]


def dsl_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The CuTe DSL settings in the environment that may change an artifact."""
    env = os.environ if environ is None else environ
    out = {}
    for name, value in env.items():
        for prefix in DSL_ENV_PREFIXES:
            if name.startswith(prefix) and name[len(prefix):] not in DSL_ENV_NOT_COMPILE:
                out[name] = value
    return dict(sorted(out.items()))


@functools.lru_cache(maxsize=1)
def build_sources_digest() -> str:
    """Digest of the build-side modules listed in BUILD_SOURCES."""
    here = Path(__file__).resolve().parent
    return files_digest([here / name for name in BUILD_SOURCES])


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
    abi = family.abi_for(variant.param_dict)
    if abi_problem(abi):
        raise ManifestError(f"kernel family {variant.family_ref!r}, variant at {variant.source}: "
                            f"{abi_problem(abi)}", field="family")
    return {
        "family": variant.family_ref,
        "abi": abi,
        "symbol": family.symbol,
        "params": dict(variant.params),
        "signature": sig.as_dict(),
        "arch": variant.arch,
        "options": compile_options(variant.arch),
        "sources": _sources(variant.family_ref),
        "dsl_env": dsl_environment(),
        "link": link_argv("<artifact>", "<object>", ["<runtime libraries>"]),
        "build_sources": build_sources_digest(),
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


# ------------------------------------------------------------------ shards
# `build --shard I/N` splits one plan across N machines (CI jobs). Every
# machine must compute the same split from the same manifests, so it may
# depend only on the keys and on costs that are pure functions of a variant:
# never on manifest order, the local cache, the clock or the host.


@dataclass(frozen=True)
class Shard:
    """Slice ``index`` (1-based) of ``count``, as given by ``--shard I/N``."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"I/N"`` with 1 <= I <= N; raises UsageError otherwise."""
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
        if not m or not (1 <= int(m.group(1)) <= int(m.group(2))):
            raise UsageError(
                f"--shard {text!r} is not I/N with 1 <= I <= N (e.g. --shard 2/4 is the "
                "second of four slices)", shard=text)
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def expected_cost(job: Job) -> float:
    """The family's estimate of the job's compile time (relative units).

    Families may define ``build_cost(params) -> float``; without one, every
    variant counts 1.0 and the shards are balanced by count.
    """
    estimate = getattr(_family(job.variant.family_ref), "build_cost", None)
    if estimate is None:
        return 1.0
    cost = float(estimate(job.variant.param_dict))
    return cost if cost > 0 else 1.0


def assign_shards(jobs: list[Job], count: int) -> list[list[Job]]:
    """Split jobs into ``count`` disjoint slices that together cover them all.

    Longest-processing-time-first over (cost desc, key asc): each job goes to
    the slice with the least expected cost so far, ties to the lowest slice.
    The order is fixed by the keys, so every machine gets the same split, and
    reordering or duplicating manifests changes nothing.
    """
    slices: list[list[Job]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for job in sorted(jobs, key=lambda j: (-expected_cost(j), j.key)):
        i = min(range(count), key=lambda s: (loads[s], s))
        slices[i].append(job)
        loads[i] += expected_cost(job)
    return slices


def shard_jobs(jobs: list[Job], shard: Shard) -> tuple[list[Job], dict[str, Any]]:
    """This shard's jobs (in plan order) and a report of the split."""
    slices = assign_shards(jobs, shard.count)
    mine = {j.key for j in slices[shard.index - 1]}
    chosen = [j for j in jobs if j.key in mine]
    report = {
        "index": shard.index,
        "count": shard.count,
        "planned": len(jobs),
        "keys": len(chosen),
        "expected_cost": round(sum(expected_cost(j) for j in chosen), 3),
        "expected_costs": [round(sum(expected_cost(j) for j in s), 3) for s in slices],
        "sizes": [len(s) for s in slices],
    }
    return chosen, report


__all__ = ["Job", "plan", "key_inputs", "toolchain", "compile_options", "link_argv", "dsl_environment",
           "GEMM_ABI", "Shard", "assign_shards", "shard_jobs", "expected_cost"]
