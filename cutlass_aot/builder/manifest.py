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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ManifestError, UsageError
from .family import KernelFamily, load_family

_TOP_KEYS = {"arch", "description", "kernels", "tune", "tuning"}
_ENTRY_KEYS = {"family", "name", "params", "skip_unsupported"}
_KNOWN_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a")
# Safe constructor for single scalar nodes: no tag can build a Python object.
_CONSTRUCTOR = yaml.constructor.SafeConstructor()


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
    # file that `build` ships into the cache, relative to the manifest.
    tune: list = field(default_factory=list)
    tuning: Path | None = None


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


def load_manifest(path: str | Path) -> Manifest:
    """Read, validate and expand one manifest file."""
    path = Path(path)
    try:
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
    return _parse(path, root)


def _parse(path: Path, root: yaml.Node) -> Manifest:
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

        try:
            manifest.tune = parse_groups(yaml.safe_load(path.read_text()).get("tune"), f"{path}: tune")
        except UsageError as exc:
            raise _err(path, top["tune"][1], exc.message, field="tune") from None
    if "tuning" in top:
        rel = _scalar(path, top["tuning"][1], "tuning")
        if not isinstance(rel, str) or not rel:
            raise _err(path, top["tuning"][1], "tuning must name a selection table file",
                       field="tuning")
        manifest.tuning = (path.parent / rel).resolve()
        if not manifest.tuning.is_file():
            raise _err(path, top["tuning"][1],
                       f"tuning file {manifest.tuning} does not exist (run `cutlass-aot tune` "
                       "and save its table there, or drop the key)", field="tuning")
    seen: dict[tuple, str] = {}
    for entry_node in kernels_node.value:
        _expand_entry(path, arch, entry_node, manifest, seen)
    return manifest


def _expand_entry(path, arch, entry_node, manifest: Manifest, seen: dict) -> None:
    entry = _mapping(path, entry_node, "a kernels entry", _ENTRY_KEYS)
    if "family" not in entry:
        raise _err(path, entry_node, "kernels entry needs a 'family'", field="family")
    fam_node = entry["family"][1]
    family_ref = _scalar(path, fam_node, "family")
    if not isinstance(family_ref, str):
        raise _err(path, fam_node, "family must be a name", field="family")
    try:
        family = load_family(family_ref)
    except ManifestError as exc:
        raise _err(path, fam_node, exc.message, field="family") from None
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

    source = f"{path}:{entry_node.start_mark.line + 1}"
    names = list(choices)
    for combo in itertools.product(*(choices[n] for n in names)):
        params = dict(zip(names, combo))
        variant = Variant(family_ref, tuple(sorted(params.items())), arch, source, label)
        reason = family.reject(params, arch)
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
        manifest.variants.append(variant)


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


def load_manifests(paths: list[str | Path]) -> list[Manifest]:
    return [load_manifest(p) for p in paths]


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
