"""Manifest: parse and validate a YAML file of kernel configurations.

Build side. Everything is checked before any compile: unknown keys, wrong
types, values a family does not allow, duplicate keys and duplicate variants
are ManifestErrors naming the file, the line, the field and what is allowed.
The YAML is read with the safe composer and walked node by node (so lines are
known and no tag can construct Python objects).

Schema (see README "Manifest"):

    arch: sm_90a                  # exact target arch string
    description: optional text
    kernels:                      # list of entries; each expands to variants
      - family: sm90_gemm         # builtin name or package.module:Class
        name: optional label
        skip_unsupported: false   # true: drop combinations the family rejects
        params:                   # each value: one allowed value or a list
          a: [f16, bf16]
          tile: [128x256, 128x128]
"""

from __future__ import annotations

import itertools
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import CutlassAotError, ManifestError, UsageError
from ..signature import Signature
from .family import BUILTIN, KernelFamily, load_family

# Shipped families reached only by their module path, by the names README's
# sections use for them: a hint in the unknown-family error.
_FAMILY_HINTS = {"gemv": "cutlass_aot.kernels.gemv:GemvFamily",
                 "gemv_kernel": "cutlass_aot.kernels.gemv:GemvFamily"}

# `package.module:Class` of each builtin family -> its builtin name.
BUILTIN_BY_TARGET = {target: name for name, target in BUILTIN.items()}

_TOP_KEYS = {"arch", "description", "kernels", "tune", "tuning"}
_ENTRY_KEYS = {"family", "name", "params", "skip_unsupported"}
_KNOWN_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a")
# Safe constructor for single scalar nodes: no tag can build a Python object.
_CONSTRUCTOR = yaml.constructor.SafeConstructor()
# The most parameter combinations one load may expand, whatever the variant
# limit: past this no build is feasible (tens of seconds per variant), and
# expanding it would only exhaust memory. Checked before expanding.
MAX_COMBINATIONS = 1_000_000
# The largest manifest file read (checked before reading: `build /dev/zero`
# must not read forever, nor a stray data file fill memory).
MAX_MANIFEST_BYTES = 8 << 20


@dataclass(frozen=True)
class Variant:
    """One buildable kernel: a family, its full parameter set, an arch."""

    family_ref: str
    params: tuple[tuple[str, Any], ...]
    arch: str
    source: str  # "file:line" of the manifest entry that produced it
    label: str

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)


@dataclass
class Manifest:
    path: Path
    arch: str
    description: str
    variants: list[Variant] = field(default_factory=list)
    skipped: list[tuple[Variant, str]] = field(default_factory=list)
    # The `tune:` section's problems (tune/shapes.py) and the `tuning:` table
    # files (one or a list, relative to the manifest) that `build` ships into
    # the cache: one per GPU, each bound to the GPU it was measured on.
    tune: list = field(default_factory=list)
    tunings: list[Path] = field(default_factory=list)


class _Budget:
    """How many variants one load may expand; shared by the manifests of a load.

    ``limit`` (build's --max-variants, None for --yes) counts distinct
    variants of the manifests whose arch is in ``archs`` (all if empty), as
    plan() will: a variant two manifests list counts once. Past it no more
    variants are made (``over``): the rest of the load only multiplies list
    lengths, so the refusal (``check``: UsageError) can say how many the
    manifests ask for, and a manifest of a million variants costs no more
    than ``limit`` of them. Independently, the products of every entry's
    lists may not pass MAX_COMBINATIONS (ManifestError), checked before an
    entry is expanded.
    """

    def __init__(self, limit: int | None = None, archs: tuple[str, ...] = ()):
        self.limit, self.archs = limit, tuple(archs)
        self.combinations = 0
        self.asked = 0  # combinations of the counted archs, duplicates included
        self.seen: set[tuple] = set()
        self.over = False

    def entry(self, path: Path, node: yaml.Node, choices: dict[str, list], arch: str) -> None:
        product = math.prod(len(v) for v in choices.values())
        self.combinations += product
        if not self.archs or arch in self.archs:
            self.asked += product
        if self.combinations > MAX_COMBINATIONS:
            lists = " x ".join(f"{n}:{len(v)}" for n, v in choices.items() if len(v) > 1)
            raise _err(path, node, f"this entry's lists multiply to {product} combinations ({lists}), "
                       f"more than the {MAX_COMBINATIONS} one build may expand; no build that size "
                       "is feasible: narrow the lists, or split them over entries you build "
                       "separately", field="params", combinations=product, limit=MAX_COMBINATIONS)

    def variant(self, arch: str, ident: tuple) -> None:
        """Count one expanded variant; past the limit, ``over`` stops the expansion."""
        if self.limit is None or (self.archs and arch not in self.archs):
            return
        self.seen.add((arch, ident))
        self.over = len(self.seen) > self.limit

    def check(self) -> None:
        """The refusal of a load that passed the limit (after every entry was counted)."""
        if self.over:
            raise UsageError(
                f"the manifests plan more than the limit of {self.limit} variants (their lists "
                f"multiply to {self.asked} variants, duplicates included; --max-variants, or "
                "CUTLASS_AOT_MAX_VARIANTS); check them for lists you did not mean, or pass --yes "
                "(or --max-variants N) to build them all",
                planned=self.asked, limit=self.limit)


def _err(path: Path, node: Any, msg: str, **data: Any) -> ManifestError:
    line = node.start_mark.line + 1 if node is not None else None
    where = f"{path}:{line}" if line else str(path)
    return ManifestError(f"{where}: {msg}", path=str(path), line=line, **data)


def _scalar(path: Path, node: yaml.Node, what: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise _err(path, node, f"{what} must be a single value, not a {_kind(node)}", field=what)
    try:
        return _CONSTRUCTOR.construct_object(node)
    except Exception as exc:  # noqa: BLE001 - PyYAML's constructors raise KeyError, IndexError, ...
        raise _err(path, node, f"{what}: cannot read value {node.value!r} "
                   f"(tag {node.tag}): {type(exc).__name__}", field=what) from None


def _tuning_file(path: Path, base: Path, node: yaml.Node) -> Path:
    """One `tuning:` item: an existing selection table file, relative to ``base``."""
    rel = _scalar(path, node, "tuning")
    if not isinstance(rel, str) or not rel:
        raise _err(path, node, "tuning must name a selection table file, or a list of them",
                   field="tuning")
    try:
        found = (base / rel).resolve()
        is_file = found.is_file()
    except (ValueError, RuntimeError, OSError) as exc:  # a NUL byte, a symlink loop
        raise _err(path, node, f"tuning: cannot use {rel!r:.200} as a file path "
                   f"({type(exc).__name__}: {exc}); name the selection table file "
                   "(relative to the manifest; to the working directory for a piped one)",
                   field="tuning") from None
    if not is_file:
        raise _err(path, node, f"tuning file {found} does not exist (run `cutlass-aot tune` "
                   "and save its table there, or drop it)", field="tuning")
    return found


def _kind(node: yaml.Node) -> str:
    return {
        yaml.MappingNode: "mapping",
        yaml.SequenceNode: "list",
        yaml.ScalarNode: "value",
    }.get(type(node), "node")


def _mapping(path: Path, node: yaml.Node, what: str, allowed: set[str] | None):
    if not isinstance(node, yaml.MappingNode):
        raise _err(path, node, f"{what} must be a mapping, not a {_kind(node)}", field=what)
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for knode, vnode in node.value:
        if knode.tag == "tag:yaml.org,2002:merge":
            raise _err(path, knode, f"{what}: YAML merge keys ('<<') are not read in a manifest; "
                       "write the keys out (an anchor and alias of a whole value, such as a "
                       "list of tiles, works)", field=what)
        key = _scalar(path, knode, f"a key of {what}")
        if not isinstance(key, str):
            raise _err(path, knode, f"{what}: key {key!r} must be a string", field=what)
        if key in out:
            raise _err(path, knode, f"{what}: duplicate key {key!r}", field=key)
        if allowed is not None and key not in allowed:
            raise _err(
                path, knode,
                f"{what}: unknown key {key!r} (allowed: {', '.join(sorted(allowed))})",
                field=key, allowed=sorted(allowed),
            )
        out[key] = (knode, vnode)
    return out


def _too_large(path: Path, size: int, at_least: bool = False) -> ManifestError:
    return ManifestError(
        f"{path}: {'at least ' if at_least else ''}{size} bytes, more than the {MAX_MANIFEST_BYTES} a manifest may have; "
        "a manifest lists parameter choices, never data: is this the right file?",
        path=str(path), line=None, size=size, limit=MAX_MANIFEST_BYTES)


def _read_pipe(path: Path) -> bytes:
    """A pipe's bytes, to its end. Opened without blocking, so a named FIFO
    that no process writes reads as empty at once (a plain open would wait
    for a writer forever); then read blocking, as much as a manifest may be."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_MANIFEST_BYTES:
                raise _too_large(path, size, at_least=True)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if not data.strip():
        raise ManifestError(f"{path}: a pipe with nothing written to it; a manifest needs 'arch' "
                            "and 'kernels'", path=str(path), line=None)
    return data


def load_manifest(path: str | Path, *, max_variants: int | None = None,
                  _budget: _Budget | None = None) -> Manifest:
    """Read, validate and expand one manifest file.

    ``max_variants``: stop (UsageError) as soon as it expands more distinct
    variants than this, before the rest are made (see _Budget).
    """
    path = Path(path)
    budget = _budget if _budget is not None else _Budget(max_variants)
    try:
        st = path.stat()
        base = path.parent  # what a relative `tuning:` is read against
        if stat.S_ISFIFO(st.st_mode):
            # a pipe: `build <(generate)` or `build /dev/stdin` (read once, capped);
            # its directory (/dev/fd, /proc/<pid>/fd) means nothing: the working one
            text = _read_pipe(path).decode("utf-8")
            base = Path.cwd()
        elif not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{path}: not a regular file or a pipe; a manifest is a YAML file",
                                path=str(path), line=None)
        else:
            if st.st_size > MAX_MANIFEST_BYTES:
                raise _too_large(path, st.st_size)
            text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such manifest file", path=str(path), line=None) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read manifest ({exc})", path=str(path), line=None) from None
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # its reader rejects control characters here
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError(
            f"{path}:{line}: not valid YAML: {problem}", path=str(path), line=line
        ) from None
    except RecursionError:
        raise ManifestError(f"{path}: YAML nested too deeply", path=str(path), line=None) from None
    except Exception as exc:  # noqa: BLE001 - PyYAML's scanner raises ValueError/OverflowError on bad escapes
        line = loader.line + 1 if loader is not None else None  # where the reader stopped
        raise ManifestError(f"{path}:{line}: not valid YAML: {type(exc).__name__}: {exc}",
                            path=str(path), line=line) from None
    finally:
        if loader is not None:
            loader.dispose()
    if root is None:
        raise ManifestError(f"{path}: manifest is empty; it needs 'arch' and 'kernels'",
                            path=str(path), line=None)
    manifest = _parse(path, root, budget, base)
    if _budget is None:
        budget.check()
    return manifest


def _parse(path: Path, root: yaml.Node, budget: _Budget, base: Path) -> Manifest:
    top = _mapping(path, root, "the manifest", _TOP_KEYS)
    for required in ("arch", "kernels"):
        if required not in top:
            raise _err(path, root, f"missing required key {required!r}", field=required)
    arch_node = top["arch"][1]
    arch = _scalar(path, arch_node, "arch")
    if arch not in _KNOWN_ARCHS:
        raise _err(
            path, arch_node, f"arch {arch!r} is not a known target (allowed: {', '.join(_KNOWN_ARCHS)})",
            field="arch", allowed=list(_KNOWN_ARCHS),
        )
    description = ""
    if "description" in top:
        description = _scalar(path, top["description"][1], "description")
        if not isinstance(description, str):
            raise _err(path, top["description"][1], "description must be text", field="description")
    kernels_node = top["kernels"][1]
    if not isinstance(kernels_node, yaml.SequenceNode) or not kernels_node.value:
        raise _err(path, kernels_node, "kernels must be a non-empty list of entries", field="kernels")

    manifest = Manifest(path=path, arch=arch, description=description)
    if "tune" in top:
        from ..tune.shapes import parse_groups  # noqa: PLC0415 - pure; only when present

        tune_node = top["tune"][1]
        try:
            # Only this node, with the safe constructor: a tag (!!python/...)
            # or an unhashable key is a manifest error, like anywhere else.
            tune_value = yaml.constructor.SafeConstructor().construct_document(tune_node)
        except Exception as exc:  # noqa: BLE001 - PyYAML raises ConstructorError, TypeError, RecursionError, ...
            problem = getattr(exc, "problem", None) or f"{type(exc).__name__}: {exc}"
            mark = getattr(exc, "problem_mark", None)
            raise _err(path, tune_node, f"tune: cannot read this section ({problem}"
                       f"{f' at line {mark.line + 1}' if mark else ''}); it must be plain YAML "
                       "lists and mappings of problem sizes", field="tune") from None
        try:
            manifest.tune = parse_groups(tune_value, f"{path}: tune")
        except UsageError as exc:
            raise _err(path, tune_node, exc.message, field="tune") from None
    if "tuning" in top:
        node = top["tuning"][1]
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        if not items:
            raise _err(path, node, "tuning must name a selection table file, or a list of them",
                       field="tuning")
        for item in items:
            manifest.tunings.append(_tuning_file(path, base, item))
    seen: dict[tuple, str] = {}
    for entry_node in kernels_node.value:
        _expand_entry(path, arch, entry_node, manifest, seen, budget)
    return manifest


def _expand_entry(path, arch, entry_node, manifest: Manifest, seen: dict, budget: _Budget) -> None:
    entry = _mapping(path, entry_node, "a kernels entry", _ENTRY_KEYS)
    if "family" not in entry:
        raise _err(path, entry_node, "kernels entry needs a 'family'", field="family")
    fam_node = entry["family"][1]
    family_ref = _scalar(path, fam_node, "family")
    if not isinstance(family_ref, str):
        raise _err(path, fam_node, "family must be a name", field="family")
    # A builtin named by its module path is the builtin: one spelling keys,
    # dedups and binds table rows (which name the family as records do).
    family_ref = BUILTIN_BY_TARGET.get(family_ref, family_ref)
    try:
        family = load_family(family_ref)
    except ManifestError as exc:
        hint = ""
        if family_ref in _FAMILY_HINTS:  # shipped families not in BUILTIN's short names
            hint = f" (the shipped {family_ref} family is family: {_FAMILY_HINTS[family_ref]})"
        raise _err(path, fam_node, exc.message + hint, field="family") from None
    if arch not in family.archs:
        raise _err(
            path, fam_node,
            f"family {family_ref!r} builds for {', '.join(family.archs)}, not {arch}",
            field="family",
        )
    label = ""
    if "name" in entry:
        label = _scalar(path, entry["name"][1], "name")
        if not isinstance(label, str):
            raise _err(path, entry["name"][1], "name must be text", field="name")
    skip = False
    if "skip_unsupported" in entry:
        skip = _scalar(path, entry["skip_unsupported"][1], "skip_unsupported")
        if not isinstance(skip, bool):
            raise _err(path, entry["skip_unsupported"][1], "skip_unsupported must be true or false",
                       field="skip_unsupported")
    if "params" not in entry:
        raise _err(path, entry_node, "kernels entry needs 'params'", field="params")
    params_node = entry["params"][1]
    given = _mapping(path, params_node, "params", set(family.params))
    choices: dict[str, list] = {}
    for name, allowed in family.params.items():
        if name not in given:
            if name in family.defaults:
                choices[name] = [family.defaults[name]]
                continue
            raise _err(
                path, params_node, f"params: missing {name!r} (allowed: {_show(allowed)})",
                field=name, allowed=list(allowed),
            )
        choices[name] = _values(path, name, given[name][1], allowed)

    budget.entry(path, entry_node, choices, arch)
    if budget.over:
        return  # past the variant limit: counted, not made
    source = f"{path}:{entry_node.start_mark.line + 1}"
    call = _FamilyCalls(path, entry_node, family_ref, family)
    call("sources_digest")  # plan keys every variant by it
    names = list(choices)
    for combo in itertools.product(*(choices[n] for n in names)):
        params = dict(zip(names, combo))
        variant = Variant(family_ref, tuple(sorted(params.items())), arch, source, label)
        reason = call("reject", params, arch)
        if reason:
            if skip:
                manifest.skipped.append((variant, reason))
                continue
            raise _err(
                path, entry_node,
                f"family {family_ref!r} cannot build {family.describe(params)}: {reason} "
                "(narrow the lists, or set skip_unsupported: true)",
                field="params",
            )
        ident = (family_ref, variant.params)
        if ident in seen:
            raise _err(
                path, entry_node,
                f"duplicate variant {family.describe(params)}: also produced by {seen[ident]}",
                field="params",
            )
        seen[ident] = source
        call.variant(params, arch)
        budget.variant(arch, ident)
        manifest.variants.append(variant)
        if budget.over:
            return


class _FamilyCalls:
    """A family's own methods, called for one manifest entry.

    A user family's code may raise anything, or return what the builder
    cannot use; either is a ManifestError naming the entry, the family, the
    method and what it raised, not a traceback from deep in the plan. Every
    method the plan calls (plan.key_inputs, plan.expected_cost) is called here
    first, on every variant, so the plan never meets a family that fails.
    """

    def __init__(self, path: Path, node: yaml.Node, ref: str, family: KernelFamily):
        self.path, self.node, self.ref, self.family = path, node, ref, family

    def __call__(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.family, method)(*args)
        except CutlassAotError as exc:  # the family's own error, with its own words
            raise _err(self.path, self.node, f"kernel family {self.ref!r}: {method}(): {exc.message}",
                       field="family", method=method) from None
        except Exception as exc:  # noqa: BLE001 - a user family may raise anything
            raise _err(self.path, self.node,
                       f"kernel family {self.ref!r}: its {method}() raised {type(exc).__name__}: "
                       f"{str(exc)[:500]}{self._which(args)}; fix the family (its methods must "
                       "not raise for values its params allow), or narrow the lists",
                       field="family", method=method, exception=type(exc).__name__) from None

    def _which(self, args: tuple) -> str:
        """Which variant a call was for, in the error's words (params as given)."""
        if not (args and isinstance(args[0], dict)):
            return ""
        return " (for " + " ".join(f"{k}={v}" for k, v in args[0].items()) + ")"

    def variant(self, params: dict, arch: str) -> None:
        """What plan asks of one accepted variant: signature, ABI, build cost."""
        sig = self("signature", params, arch)
        if not isinstance(sig, Signature):
            raise _err(self.path, self.node, f"kernel family {self.ref!r}: its signature() returned "
                       f"{type(sig).__name__} for {self.family.describe(params)}, not a Signature "
                       "(cutlass_aot.signature.Signature.make)", field="family", method="signature")
        self("abi_for", params)
        if getattr(self.family, "build_cost", None) is not None:
            cost = self("build_cost", params)
            try:
                float(cost)
            except (TypeError, ValueError, OverflowError):
                raise _err(self.path, self.node, f"kernel family {self.ref!r}: its build_cost() returned "
                           f"{cost!r:.80} for {self.family.describe(params)}, not a number",
                           field="family", method="build_cost") from None


def _values(path: Path, name: str, node: yaml.Node, allowed: tuple) -> list:
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    if isinstance(node, yaml.SequenceNode) and not items:
        raise _err(path, node, f"params.{name}: empty list (allowed: {_show(allowed)})",
                   field=name, allowed=list(allowed))
    out: list = []
    for item in items:
        value = _scalar(path, item, f"params.{name}")
        # bool is an int subclass: `rank: true` must not pass as rank 1.
        ok = any(value == a and type(value) is type(a) for a in allowed)
        if not ok:
            raise _err(
                path, item, f"params.{name}: {value!r} is not allowed (allowed: {_show(allowed)})",
                field=name, allowed=list(allowed),
            )
        if value in out:
            raise _err(path, item, f"params.{name}: {value!r} listed twice", field=name)
        out.append(value)
    return out


def _show(allowed: tuple) -> str:
    def one(v: Any) -> str:
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v)

    return ", ".join(one(v) for v in allowed)


def load_manifests(paths: list[str | Path], *, max_variants: int | None = None,
                   archs: tuple[str, ...] = ()) -> list[Manifest]:
    """Load each manifest. ``max_variants``: stop (UsageError) as soon as they
    expand more distinct variants than this, counting only manifests of
    ``archs`` (all if empty), as ``plan(manifests, archs)`` would."""
    budget = _Budget(max_variants, archs)
    loaded = [load_manifest(p, _budget=budget) for p in paths]
    budget.check()
    return loaded


def default_manifests() -> list[Path]:
    """The shipped manifests: cutlass_aot/configs/*.yaml of an installed copy
    (package data, from the checkout's configs/), else configs/*.yaml of the
    checkout this package runs from."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "configs"
    if installed.is_dir():
        return sorted(installed.glob("*.yaml"))
    checkout = package.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "configs").is_dir():
        return sorted((checkout / "configs").glob("*.yaml"))
    return []


__all__ = ["Manifest", "Variant", "load_manifest", "load_manifests", "default_manifests", "KernelFamily"]
