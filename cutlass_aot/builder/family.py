"""The kernel-family interface: what the builder needs from a family of kernels.

Build side. A family names its parameters and their allowed values, rejects
combinations it cannot build (with a reason), says which signature each
variant serves, lists its source files (hashed into every key), and compiles a
variant to a CuTe DSL object that can ``export_to_c``. The builder, the cache
and the loader know nothing else about it, so a user's own CuTe DSL kernel
plugs in from a manifest as ``family: package.module:Class``.

Contract:

* ``params`` maps each parameter to a tuple of allowed values (YAML scalars:
  str, int, bool or None); ``defaults`` gives values for parameters a manifest
  may omit.
* ``reject(variant, arch)`` returns None or a one-line reason; it must not
  import the CuTe DSL (manifest validation runs without it).
* ``signature(variant, arch)`` is pure and cheap.
* ``compile(variant, arch, options)`` runs in a worker process, may import the
  CuTe DSL, and raises on failure (the builder reports the message).
* ``abi`` names the calling convention of the exported function (the run side
  uses only ABIs it knows; a user family's artifacts are reached through
  ``Cache.function``) and ``symbol`` its exported name.

``load_family`` checks this declaration when it loads a family (allowed
values are YAML scalars, defaults are allowed values, the ABI is one the run
side can call, the symbol is declared), so a broken plugin fails at manifest
load with ManifestError, not after a build of unusable entries.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ..errors import ManifestError
from ..layout import GEMM_ABIS
from ..signature import Signature, format_params


class KernelFamily:
    """Base class for kernel families; subclass and fill in the class fields."""

    name: ClassVar[str] = ""
    archs: ClassVar[tuple[str, ...]] = ()
    abi: ClassVar[str] = ""
    symbol: ClassVar[str] = ""  # must be declared: no silent default name
    params: ClassVar[Mapping[str, tuple]] = {}
    defaults: ClassVar[Mapping[str, Any]] = {}
    docs: ClassVar[Mapping[str, str]] = {}

    def reject(self, variant: Mapping[str, Any], arch: str) -> str | None:
        return None

    def signature(self, variant: Mapping[str, Any], arch: str) -> Signature:
        raise NotImplementedError

    def abi_for(self, variant: Mapping[str, Any]) -> str:
        """The calling convention of one variant (a family may have several)."""
        return self.abi

    def source_files(self) -> list[Path]:
        raise NotImplementedError

    def compile(self, variant: Mapping[str, Any], arch: str, options: str) -> Any:
        raise NotImplementedError

    # ---- helpers shared by every family
    def sources_digest(self) -> str:
        """sha256 over the family's source files, names and bytes."""
        return files_digest(self.source_files())

    def describe(self, variant: Mapping[str, Any]) -> str:
        return format_params(dict(variant))


def files_digest(paths: list[Path]) -> str:
    """sha256 over files sorted by path: for each, basename, length and bytes."""
    h = hashlib.sha256()
    for path in sorted(Path(p) for p in paths):
        data = path.read_bytes()
        h.update(path.name.encode() + b"\0%d\0" % len(data) + data)
    return h.hexdigest()


_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

# Families shipped with cutlass-aot, by manifest name.
BUILTIN = {
    "sm90_gemm": "cutlass_aot.kernels.sm90:Sm90GemmFamily",
    "sm80_gemm": "cutlass_aot.kernels.sm80:Sm80GemmFamily",
}


def load_family(ref: str) -> KernelFamily:
    """Instantiate a family by builtin name or ``package.module:Class``."""
    target = BUILTIN.get(ref, ref)
    if ":" not in target:
        raise ManifestError(
            f"unknown kernel family {ref!r}: use one of {sorted(BUILTIN)} or "
            "'package.module:Class' for your own family",
            field="family",
            allowed=sorted(BUILTIN),
        )
    module_name, _, cls_name = target.partition(":")
    if not (_DOTTED.match(module_name) and cls_name.isidentifier()):
        raise ManifestError(
            f"kernel family {ref!r} is not 'package.module:Class' (dotted module path, "
            f"then a class name) nor one of {sorted(BUILTIN)}",
            field="family",
            allowed=sorted(BUILTIN),
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a user module may fail to import in any way
        raise ManifestError(
            f"kernel family {ref!r}: cannot import module {module_name!r} ({exc}); "
            "is the package installed and on PYTHONPATH?",
            field="family",
        ) from None
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, KernelFamily)):
        raise ManifestError(
            f"kernel family {ref!r}: {module_name}.{cls_name} is not a "
            "cutlass_aot.builder.family.KernelFamily subclass",
            field="family",
        )
    family = cls()
    problem = _declaration_problem(family)
    if problem:
        raise ManifestError(f"kernel family {ref!r} ({module_name}.{cls_name}) is declared wrongly: "
                            f"{problem}", field="family")
    return family


_SCALARS = (str, int, bool, type(None))


def abi_problem(abi: Any) -> str | None:
    """Why the run side could never call artifacts of this ABI, or None."""
    if isinstance(abi, str) and (abi in GEMM_ABIS or (abi.startswith("user:") and len(abi) > 5)):
        return None
    return (f"abi {abi!r} is not one the run side can call: use one of {list(GEMM_ABIS)} "
            "or a 'user:<name>-v<n>' string of your own")


def _declaration_problem(family: KernelFamily) -> str | None:
    """What is wrong with a family's class fields, or None."""
    if abi_problem(family.abi):
        return abi_problem(family.abi)
    if not (isinstance(family.symbol, str) and family.symbol.isidentifier()):
        return (f"symbol {family.symbol!r} is not declared as an identifier: set `symbol = \"<name>\"`, "
                "the function name the artifact exports")
    if not (isinstance(family.archs, tuple) and family.archs and all(isinstance(a, str) for a in family.archs)):
        return f"archs {family.archs!r} must be a non-empty tuple of arch strings"
    if not isinstance(family.params, Mapping) or not family.params:
        return "params must be a non-empty mapping {name: tuple of allowed values}"
    for name, allowed in family.params.items():
        if not isinstance(name, str) or not name.isidentifier():
            return f"parameter name {name!r} is not an identifier"
        if not isinstance(allowed, tuple) or not allowed:
            return f"params[{name!r}] must be a non-empty tuple of allowed values"
        bad = [v for v in allowed if not isinstance(v, _SCALARS)]
        if bad:
            return f"params[{name!r}] allows {bad[0]!r}: values must be str, int, bool or None"
    if not isinstance(family.defaults, Mapping):
        return "defaults must be a mapping {name: value}"
    for name, value in family.defaults.items():
        if name not in family.params:
            return f"defaults[{name!r}] is not a parameter in params"
        if not any(type(value) is type(a) and value == a for a in family.params[name]):
            return (f"defaults[{name!r}] = {value!r} is not one of the allowed values "
                    f"{family.params[name]!r}")
    return None
