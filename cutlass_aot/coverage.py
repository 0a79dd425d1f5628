"""Coverage: what shape logs say the cache missed, and the manifest that would serve it.

CLI side (``cutlass-aot coverage``): imports the core, the run side's pure
``servable`` module, PyYAML, and the build side's family registry (to invert
a family's ``signature()`` into manifest params; families import the CuTe DSL
only to compile, so this works without it). Never imports torch.

Input: shape logs (cutlass_aot/shapelog.py). Each record is one process
meeting one (signature, M, N, K, L) with an outcome: ``hit`` (an artifact
served it), ``fallback`` (torch served it, ``on_miss="torch"``) or ``miss``
(KernelNotFoundError). "How often" below counts records, that is processes
that met the shape, not calls (the log is written once per process).

A signature is a *gap* if some record of it is a fallback or a miss, unless
``cache_dir`` is given and that cache now serves it (it was built since).
Each gap is mapped back to manifest params: the builtin families are asked,
for every combination of their non-tuning params (tuning params stay at the
family defaults), which signature it serves, and the combination with the
fewest non-default values wins. Gaps no family serves are reported as
unmappable, with the reason.
"""

from __future__ import annotations

import datetime as dt
import glob
import itertools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .layout import read_index
from .run.servable import normalized, serves, serving_index
from .shapelog import OUTCOMES, ShapeRecord, read_shape_log
from .signature import Signature

# Parameters that choose how a variant runs, not which calls it serves.
TUNING_PARAMS = frozenset({"tile", "cluster", "raster", "swizzle", "acc", "swap_ab", "split_k", "pingpong",
                           "warps", "bk", "stages"})


@dataclass
class SignatureCoverage:
    """Every record of one signature."""

    signature: Signature
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    shapes: dict[tuple[int, int, int, int], dict[str, int]] = field(default_factory=dict)
    served_now: bool | None = None  # by --cache-dir; None when no cache was given
    family: str | None = None
    params: dict | None = None
    unmappable: str | None = None

    @property
    def gap(self) -> bool:
        missed = self.counts["fallback"] + self.counts["miss"] > 0
        return missed and not self.served_now

    def as_dict(self) -> dict:
        return {
            "signature": self.signature.text(), "arch": self.signature.arch,
            "counts": dict(self.counts), "gap": self.gap, "served_now": self.served_now,
            "shapes": [{"m": m, "n": n, "k": k, "l": batch, **c}
                       for (m, n, k, batch), c in sorted(self.shapes.items())],
            "family": self.family, "params": self.params, "unmappable": self.unmappable,
        }


@dataclass
class CoverageReport:
    logs: list[dict]                      # {"path", "records", "skipped"}
    signatures: list[SignatureCoverage]
    cache_dir: str | None = None
    manifests: list[str] = field(default_factory=list)  # paths written
    removed: list[str] = field(default_factory=list)    # earlier runs' patches, now stale

    @property
    def records(self) -> int:
        return sum(x["records"] for x in self.logs)

    @property
    def skipped(self) -> int:
        return sum(x["skipped"] for x in self.logs)

    @property
    def gaps(self) -> list[SignatureCoverage]:
        return [s for s in self.signatures if s.gap]

    def as_dict(self) -> dict:
        return {
            "ok": not self.gaps, "logs": self.logs, "records": self.records, "skipped": self.skipped,
            "cache_dir": self.cache_dir, "gaps": len(self.gaps),
            "signatures": [s.as_dict() for s in self.signatures], "manifests": self.manifests,
            "removed": self.removed,
        }


def aggregate(records: list[ShapeRecord]) -> list[SignatureCoverage]:
    """Records grouped by (normalized) signature, sorted by signature text."""
    by_sig: dict[Signature, SignatureCoverage] = {}
    for rec in records:
        sig = normalized(rec.signature)
        cov = by_sig.get(sig)
        if cov is None:
            cov = by_sig[sig] = SignatureCoverage(sig)
        cov.counts[rec.outcome] += 1
        shape = cov.shapes.setdefault(rec.shape, dict.fromkeys(OUTCOMES, 0))
        shape[rec.outcome] += 1
    return sorted(by_sig.values(), key=lambda c: c.signature.text())


def cache_signatures(cache_dir: str | os.PathLike) -> dict[Signature, list]:
    """``{Signature: [key]}`` of a cache's index (read and validated; nothing loaded)."""
    index = read_index(Path(cache_dir), missing_ok=False)
    out: dict[Signature, list] = {}
    for key, rec in index["entries"].items():
        out.setdefault(Signature.from_dict(rec["signature"]), []).append(key)
    return out


class ParamFinder:
    """Inverts the builtin families' ``signature()``: signature -> (family, params)."""

    def __init__(self) -> None:
        self._tables: dict[str, dict[Signature, tuple[str, dict]]] = {}

    def _table(self, arch: str) -> dict[Signature, tuple[str, dict]]:
        table = self._tables.get(arch)
        if table is not None:
            return table
        from .builder.family import BUILTIN, load_family  # noqa: PLC0415 - only when mapping gaps

        table = {}
        for name in sorted(BUILTIN):
            family = load_family(name)
            if arch not in family.archs:
                continue
            free = [p for p in family.params if p not in TUNING_PARAMS]
            best: dict[Signature, tuple[int, dict]] = {}
            for combo in itertools.product(*(family.params[p] for p in free)):
                variant = dict(family.defaults) | dict(zip(free, combo))
                if family.reject(variant, arch):
                    continue
                sig = normalized(family.signature(variant, arch))
                given = {p: v for p, v in zip(free, combo)
                         if p not in family.defaults or family.defaults[p] != v}
                if sig not in best or len(given) < best[sig][0]:
                    best[sig] = (len(given), given)
            for sig, (_, given) in best.items():
                table.setdefault(sig, (name, given))
        self._tables[arch] = table
        return table

    def find(self, sig: Signature) -> tuple[str, dict] | None:
        return self._table(sig.arch).get(normalized(sig))


def analyze(paths: list[str | os.PathLike], cache_dir: str | os.PathLike | None = None) -> CoverageReport:
    """Read the logs (OSError for a file that cannot be read), aggregate, map gaps."""
    logs, records = [], []
    for p in paths:
        recs, skipped = read_shape_log(p)
        logs.append({"path": str(p), "records": len(recs), "skipped": skipped})
        records += recs
    sigs = aggregate(records)
    if cache_dir is not None:
        index = serving_index(cache_signatures(cache_dir))
        for cov in sigs:
            cov.served_now = serves(index, cov.signature)
    finder = ParamFinder()
    for cov in sigs:
        if not cov.gap:
            continue
        found = finder.find(cov.signature)
        if found is None:
            cov.unmappable = (f"no builtin kernel family builds {cov.signature.op} for "
                              f"{cov.signature.arch} with these fields")
        else:
            cov.family, cov.params = found
    return CoverageReport(logs=logs, signatures=sigs, cache_dir=None if cache_dir is None else str(cache_dir))


def manifest_texts(report: CoverageReport) -> dict[str, str]:
    """``{arch: YAML text}``: one manifest per arch holding an entry per mappable gap."""
    per_arch: dict[str, list[SignatureCoverage]] = {}
    for cov in report.gaps:
        if cov.params is not None:
            per_arch.setdefault(cov.signature.arch, []).append(cov)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    texts = {}
    for arch, covs in sorted(per_arch.items()):
        doc = {
            "arch": arch,
            "description": "calls the cache missed or served through torch (cutlass-aot coverage)",
            "kernels": [{"name": cov.signature.text(), "family": cov.family, "params": dict(cov.params)}
                        for cov in covs],
        }
        head = (f"{PATCH_MARK} at {now} from {len(report.logs)} shape log(s):\n"
                f"# {len(covs)} signature(s) that missed or fell back. Tuning params (tile, cluster,\n"
                "# raster, swizzle, ...) are the family defaults; add more, or let\n"
                "# `cutlass-aot tune --from-log` choose them. Build with `cutlass-aot build THIS_FILE`.\n")
        texts[arch] = head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1000)
    return texts


# The first line of every patch this module writes: how a later run knows a
# file at --manifest-out is its own (and may replace or remove it).
PATCH_MARK = "# Written by `cutlass-aot coverage`"


def _is_patch(path: Path) -> bool:
    """True if ``path`` is a file that an earlier `coverage --manifest-out` wrote."""
    try:
        with open(path, "rb") as f:
            return f.read(len(PATCH_MARK)) == PATCH_MARK.encode()
    except OSError:
        return False


def write_manifests(report: CoverageReport, out: str | os.PathLike) -> list[str]:
    """Write the manifest patch(es): ``out`` for one arch, ``<stem>.<arch><suffix>`` for several.

    The paths are this run's answer, so an earlier run's patch there must not
    outlive it: patches from an earlier run (files that start with
    ``PATCH_MARK``) at ``out`` or its per-arch names that this run does not
    write are removed (``report.removed``), so `cutlass-aot build` on them
    never rebuilds gaps that are closed. Other files are never touched.
    """
    texts = manifest_texts(report)
    out = Path(out)
    suffix = out.suffix or ".yaml"
    written = []
    for arch, text in texts.items():
        path = out if len(texts) == 1 else out.with_name(f"{out.stem}.{arch}{suffix}")
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
        written.append(str(path))
    # ``out`` and its per-arch names (<stem>.sm_NN[a]<suffix>) only: a patch
    # that an earlier run wrote under another name is not this run's to remove.
    per_arch = re.compile(re.escape(out.stem) + r"\.sm_[0-9]+[a-z]?" + re.escape(suffix))
    stale = [out, *sorted(p for p in out.parent.glob(f"{glob.escape(out.stem)}.sm_*{glob.escape(suffix)}")
                          if per_arch.fullmatch(p.name))]
    for path in stale:
        if str(path) not in written and path.is_file() and _is_patch(path):
            path.unlink(missing_ok=True)
            report.removed.append(str(path))
    report.manifests = written
    return written


def _shown(text: object) -> str:
    """``text`` safe for a terminal: a log's strings are data, and a control
    character in one (an escape sequence) is shown escaped, never sent raw."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def render_text(report: CoverageReport, max_shapes: int = 5) -> str:
    """The human-readable report."""
    lines = [f"read {len(report.logs)} log(s): {report.records} records, "
             f"{report.skipped} malformed line(s) skipped"]
    for log in report.logs:
        if log["skipped"]:
            lines.append(f"  {_shown(log['path'])}: {log['skipped']} line(s) skipped")
    for cov in report.signatures:
        c = cov.counts
        if cov.gap:
            status = "GAP"
        elif c["fallback"] + c["miss"]:
            status = "served now"
        else:
            status = "served"
        lines.append(f"{status:10s} {_shown(cov.signature)}  hit={c['hit']} fallback={c['fallback']} "
                     f"miss={c['miss']} shapes={len(cov.shapes)}")
        if cov.unmappable:
            lines.append(f"             unmappable: {_shown(cov.unmappable)}")
        if cov.gap:
            # Only shapes that missed or fell back: a shape some process served is no gap.
            missed = [(shape, counts) for shape, counts in cov.shapes.items()
                      if counts["fallback"] + counts["miss"]]
            worst = sorted(missed, key=lambda kv: -(kv[1]["fallback"] + kv[1]["miss"]))
            for (m, n, k, batch), counts in worst[:max_shapes]:
                lines.append(f"             M={m} N={n} K={k} L={batch}: fallback={counts['fallback']} "
                             f"miss={counts['miss']}")
            if len(worst) > max_shapes:
                lines.append(f"             ... {len(worst) - max_shapes} more shapes")
    gaps = report.gaps
    mapped = sum(1 for g in gaps if g.params is not None)
    lines.append(f"{len(report.signatures)} signature(s); {len(gaps)} gap(s), {mapped} with a manifest entry")
    for path in report.manifests:
        lines.append(f"wrote manifest patch {_shown(path)}: build it with `cutlass-aot build {_shown(path)}`")
    for path in report.removed:
        lines.append(f"removed {_shown(path)}: an earlier run's patch, which this run's answer replaces")
    return "\n".join(lines)
