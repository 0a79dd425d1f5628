"""Test-only kernel families, referenced from manifests as ``tests.families:Class``.

``ToyFamily`` is a complete user family whose ``compile`` always fails: it
exercises the builder's real failure path (a family's own code raising in a
spawn worker), not a stand-in for the CuTe DSL compiler. The other names are
things ``load_family`` must refuse.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cutlass_aot.builder.family import KernelFamily
from cutlass_aot.kernels.sm90 import Sm90GemmFamily
from cutlass_aot.signature import Signature

TOY_FAILURE = "toy kernels never compile"


class ToyFamily(KernelFamily):
    """Two parameters, one rejected combination, a compile that raises."""

    name = "toy"
    archs = ("sm_90a", "sm_80")
    abi = "user:toy-v1"
    symbol = "toy"
    params = {"x": (1, 2, 3), "mode": ("fast", "slow")}
    defaults = {"mode": "fast"}

    def reject(self, variant: Mapping[str, Any], arch: str) -> str | None:
        return "x=3 needs a wider register file" if variant["x"] == 3 else None

    def signature(self, variant: Mapping[str, Any], arch: str) -> Signature:
        return Signature.make("toy", arch, {"x": variant["x"], "mode": variant["mode"]})

    def source_files(self) -> list[Path]:
        return [Path(__file__)]

    def compile(self, variant: Mapping[str, Any], arch: str, options: str) -> Any:
        raise RuntimeError(f"{TOY_FAILURE} (x={variant['x']}, mode={variant['mode']}, arch={arch})")


class NotAFamily:
    """Has the right shape but does not subclass KernelFamily."""

    params = {"x": (1,)}


TOY_INSTANCE = ToyFamily()


class KillerGemmFamily(Sm90GemmFamily):
    """sm90_gemm, except that compiling tile 64x128 kills its own process.

    Exercises the builder's handling of a worker that dies outright (what a
    segfault in the compiler or the OOM killer does): the other variants are
    real CuTe DSL compiles and must still be built.
    """

    name = "killer_gemm"
    GUILTY_TILE = "64x128"

    def source_files(self) -> list[Path]:
        return [*super().source_files(), Path(__file__)]

    def compile(self, variant: Mapping[str, Any], arch: str, options: str) -> Any:
        if variant["tile"] == self.GUILTY_TILE:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().compile(variant, arch, options)


class BrokenJitFamily(ToyFamily):
    """A family whose CuTe DSL kernel has a NameError: what a user's typo does."""

    name = "broken_jit"

    def compile(self, variant: Mapping[str, Any], arch: str, options: str) -> Any:
        import cutlass  # noqa: PLC0415 - build workers only
        import cutlass.cute as cute  # noqa: PLC0415

        return cute.compile(_jit_broken_kernel(), cutlass.Int32(variant["x"]), options=options)


def _broken_kernel(x):
    y = undefined_name_in_kernel + x  # noqa: F821 - the defect under test
    return y


def _jit_broken_kernel():
    import cutlass.cute as cute  # noqa: PLC0415

    return cute.jit(_broken_kernel)


class SlowFailingFamily(ToyFamily):
    """ToyFamily whose compile takes a while before it fails (timing tests)."""

    name = "slow_toy"
    SECONDS = 3.0

    def compile(self, variant: Mapping[str, Any], arch: str, options: str) -> Any:
        import time  # noqa: PLC0415

        time.sleep(self.SECONDS)
        return super().compile(variant, arch, options)


# Families whose own methods raise or return what the builder cannot use:
# each must be a ManifestError naming the family and the method (exit 2),
# never a traceback from the plan.
class SignatureRaisesFamily(ToyFamily):
    name = "sig_raises"

    def signature(self, variant: Mapping[str, Any], arch: str) -> Signature:
        raise ValueError("oops in signature")


class SignatureNoneFamily(ToyFamily):
    name = "sig_none"

    def signature(self, variant: Mapping[str, Any], arch: str) -> Signature:
        return None  # type: ignore[return-value] - the defect under test


class RejectRaisesFamily(ToyFamily):
    name = "reject_raises"

    def reject(self, variant: Mapping[str, Any], arch: str) -> str | None:
        raise KeyError("tile")


class AbiForRaisesFamily(ToyFamily):
    name = "abi_for_raises"

    def abi_for(self, variant: Mapping[str, Any]) -> str:
        raise RuntimeError("no abi for you")


class MissingSourceFamily(ToyFamily):
    name = "missing_source"

    def source_files(self) -> list[Path]:
        return [Path("/nonexistent/cutlass-aot-test/kernel.py")]


class BuildCostRaisesFamily(ToyFamily):
    name = "build_cost_raises"

    def build_cost(self, params: Mapping[str, Any]) -> float:
        raise ZeroDivisionError("division by zero")
