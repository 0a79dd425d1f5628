"""Merge: copy verified entries of other caches (shard builds) into one cache.

Build side. Owns what counts as a sound source entry and what a conflict is;
the writing itself is the store's commit (CacheStore.stage_entry/adopt), so
a merge is as safe as a build with builds and readers running on the same
destination: every key is locked, every entry lands by rename, and one index
write at the end makes all of them visible at once.

A source entry is sound when its artifact has the recorded size and sha256,
its ``entry.json`` is the full form of its index record, and the key is the
content hash of the record's ``key_inputs`` (so a record cannot be moved to
another key). A conflict is one key with two different artifacts (two
sources, or a source and the destination): keys name their inputs, so that
means a build that is not reproducible, and neither side is chosen.

Besides entries and runtimes, an index may list other files (the selection
table): any top-level section whose records carry ``path`` and ``sha256``.
``extra_files`` is the one place that finds them, for merge and for
push/pull alike.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CacheError, IntegrityError
from ..layout import (
    ENTRY_RECORD,
    file_records,
    index_path,
    read_index,
    resolve_inside,
    sha256_file,
    table_slot,
)
from ..tables import parse_table_bytes
from .store import CacheStore, check_record


def extra_files(index: dict) -> list[tuple[str, str | None, dict]]:
    """Files an index lists outside entries/runtimes: (section, name, record).

    HOOK for future cache files (the selection table): layout.file_records
    finds them (a top-level section that is itself a record ``{"path",
    "sha256", ...}`` gives name None; a section that maps names to such
    records gives one item per name), and validate_index has checked each
    (content-addressed at ``<section>/<sha256>[.ext]``). A record whose path
    is null (not bundled) is skipped. Merge, push and pull move exactly
    these, verified by their sha256, and commit the records back under the
    same section and name.
    """
    return [(section, name, rec) for section, name, rec in file_records(index)
            if isinstance(rec.get("path"), str)]


def _is_file_record(rec: Any) -> bool:
    return (isinstance(rec, dict) and isinstance(rec.get("path"), str)
            and isinstance(rec.get("sha256"), str))


# Selection tables (index["tables"][slot]) are extra files with one more
# rule: when both sides have a table for one GPU kind, their rows merge
# (CacheStore.publish_table(merge=True): the incoming rows win for problems
# both measured) instead of conflicting.
TABLES_SECTION = "tables"


def merge_table(store: CacheStore, path: Path) -> str:
    """Merge the table file at ``path`` into the store's table of its GPU."""
    doc = parse_table_bytes(path.read_bytes(), str(path))
    rec = store.publish_table(doc, merge=True)
    return f"{TABLES_SECTION}/{rec['path']} (rows merged: {rec['rows']})"


def check_extra_file(section: str, name: str | None, rec: dict, path: Path, where: str) -> None:
    """IntegrityError unless the verified bytes at ``path`` are what their record
    says beyond the hash: a selection table parses, validates, and measured
    the GPU its slot and record name. Called before anything is committed."""
    if section != TABLES_SECTION:
        return
    doc = parse_table_bytes(path.read_bytes(), where)
    if name != table_slot(doc["gpu"]) or rec.get("gpu") != doc["gpu"]:
        raise IntegrityError(
            f"selection table {where} measured {table_slot(doc['gpu'])!r} but is listed under "
            f"{name!r} (record gpu {rec.get('gpu')!r}); refusing it: a table must sit in its own "
            "GPU's slot", path=where)


def get_extra(index: dict, section: str, name: str | None) -> dict | None:
    value = index.get(section)
    if name is None:
        return value if _is_file_record(value) else None
    return value.get(name) if isinstance(value, dict) else None


def set_extra(index: dict, section: str, name: str | None, rec: dict) -> None:
    if name is None:
        index[section] = rec
    else:
        index.setdefault(section, {})[name] = rec


@dataclass
class MergeReport:
    added: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    conflicts: list[dict] = field(default_factory=list)
    corrupt: list[dict] = field(default_factory=list)
    runtimes_added: list[str] = field(default_factory=list)
    files_added: list[str] = field(default_factory=list)
    tables_to_merge: list[Path] = field(default_factory=list)
    checked: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.conflicts and not self.corrupt

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "added": len(self.added),
            "present": len(self.present),
            "conflicts": self.conflicts,
            "corrupt": self.corrupt,
            "runtimes_added": self.runtimes_added,
            "files_added": self.files_added,  # tables whose rows merged say so
            "seconds": round(self.seconds, 3),
        }


@dataclass
class _Candidate:
    source: Path
    rec: dict
    entry_json: bytes


def _read_source(src: Path) -> dict:
    if not index_path(src).is_file():
        raise CacheError(
            f"source {src} is not a cutlass-aot cache (no index.json); pass directories "
            "that `cutlass-aot build` wrote", cache_dir=str(src))
    return read_index(src)


def merge(sources: list[Path], dst: Path) -> MergeReport:
    """Verify every entry of every source; copy what ``dst`` lacks."""
    t0 = time.perf_counter()
    report = MergeReport()
    candidates: dict[str, _Candidate] = {}
    runtime_src: dict[str, tuple[Path, dict]] = {}
    extras: dict[tuple[str, str | None], tuple[Path, dict]] = {}
    for src in map(Path, sources):
        index = _read_source(src)  # a source whose index is unusable is refused whole
        for key, rec in sorted(index["entries"].items()):
            report.checked += 1
            try:
                lib = resolve_inside(src, rec["path"])
                if lib.stat().st_size != rec["size"] or sha256_file(lib) != rec["sha256"]:
                    raise IntegrityError(f"entry {key[:16]}: {rec['path']} does not match its sha256/size")
                entry_json = (lib.parent / ENTRY_RECORD).read_bytes()
                check_record(key, rec, entry_json)
                if rec["runtime"] not in index["runtimes"]:
                    raise IntegrityError(f"entry {key[:16]}: runtime {rec['runtime'][:16]} is not in the index")
            except (OSError, IntegrityError) as exc:
                report.corrupt.append({"source": str(src), "key": key, "problem": str(exc)})
                continue
            seen = candidates.get(key)
            if seen is not None and seen.rec["sha256"] != rec["sha256"]:
                report.conflicts.append({
                    "key": key, "problem": f"{seen.source} and {src} hold different artifacts "
                    f"({seen.rec['sha256'][:16]}... vs {rec['sha256'][:16]}...)"})
                candidates[key] = _Candidate(src, rec, b"")  # poisoned: copied from neither
                continue
            if seen is None:
                candidates[key] = _Candidate(src, rec, entry_json)
        for sha, rt in index["runtimes"].items():
            if rt.get("path"):
                try:
                    lib = resolve_inside(src, rt["path"])
                    ok = sha256_file(lib) == sha
                except (OSError, IntegrityError):
                    ok = False
                if not ok:
                    report.corrupt.append({"source": str(src), "key": f"runtime {sha[:16]}",
                                           "problem": f"{rt['path']} is missing or altered"})
                    continue
                runtime_src.setdefault(sha, (lib, rt))
            else:
                runtime_src.setdefault(sha, (None, rt))
        for section, name, rec in extra_files(index):
            where = f"{section}/{name}" if name else section
            try:
                path = resolve_inside(src, rec["path"])
                if sha256_file(path) != rec["sha256"]:
                    raise IntegrityError(f"{rec['path']} does not match its sha256")
                check_extra_file(section, name, rec, path, f"{src}/{rec['path']}")
            except (OSError, IntegrityError) as exc:
                report.corrupt.append({"source": str(src), "key": where, "problem": str(exc)})
                continue
            seen = extras.get((section, name))
            if seen is not None and seen[1]["sha256"] != rec["sha256"]:
                report.conflicts.append({"key": where, "problem": f"{seen[0]} and {src} list different files"})
                continue
            extras.setdefault((section, name), (path, rec))
    poisoned = {c["key"] for c in report.conflicts}

    store = CacheStore(dst)
    store.ensure()
    store.init_index()
    current, _ = store.load_index()
    staged: dict[str, tuple[Path, dict]] = {}
    try:
        for key, cand in sorted(candidates.items()):
            if key in poisoned:
                continue
            if store.entry_ok(current, key):
                if current["entries"][key]["sha256"] == cand.rec["sha256"]:
                    report.present.append(key)
                else:
                    report.conflicts.append({"key": key, "problem": f"{dst} already holds a different "
                                             f"artifact for it than {cand.source}"})
                continue
            lib = resolve_inside(cand.source, cand.rec["path"])
            try:
                staged[key] = (store.stage_entry(key, lib, cand.entry_json, cand.rec["sha256"],
                                                 cand.rec["size"]), cand.rec)
            except IntegrityError as exc:  # the source changed after it was checked
                report.corrupt.append({"source": str(cand.source), "key": key, "problem": str(exc)})
        runtimes, unavailable = _place_runtimes(store, current, {r["runtime"] for _, r in staged.values()},
                                                runtime_src, report)
        for key in [k for k, (_, r) in staged.items() if r["runtime"] in unavailable]:
            work, rec = staged.pop(key)
            shutil.rmtree(work, ignore_errors=True)
            report.corrupt.append({"source": str(candidates[key].source), "key": key, "problem": (
                f"its runtime {rec['runtime'][:16]} is damaged in every source that lists it, and "
                f"{dst} has no good copy; not copied (rebuild that source, or merge one whose "
                "runtime verifies)")})
        mutate = _extras_mutation(store, current, extras, report)
        result = store.adopt(staged, runtimes, mutate)
        for path in report.tables_to_merge:  # after the entries, so their rows bind at once
            report.files_added.append(merge_table(store, path))
    finally:
        for work, _ in staged.values():
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    report.added.extend(result["added"])
    report.present.extend(result["present"])
    report.conflicts.extend({"key": k, "problem": f"another writer published a different artifact to {dst}"}
                            for k in result["conflicts"])
    report.seconds = time.perf_counter() - t0
    return report


def _place_runtimes(store: CacheStore, current: dict, needed: set[str],
                    runtime_src: dict[str, tuple[Path | None, dict]], report: MergeReport
                    ) -> tuple[dict[str, dict], set[str]]:
    """Bundle the runtimes staged entries need: (their records, the shas no
    good copy exists of).

    A runtime DST already holds is not copied, but its source copy is noted
    (CacheStore.note_runtime_source): a concurrent ``gc`` may remove it from
    DST before adopt commits, and adopt then re-places it from there. A
    runtime whose every source copy failed its hash (reported as corrupt)
    is served by DST's own record if DST has a good one, else it is
    unavailable, and the caller drops the entries that need it.
    """
    records: dict[str, dict] = {}
    unavailable: set[str] = set()
    for sha in sorted(needed):
        have = current["runtimes"].get(sha)
        if sha not in runtime_src:
            if have and (not have.get("path") or store.runtime_file_ok(have)):
                records[sha] = dict(have)
            else:
                unavailable.add(sha)
            continue
        lib, rec = runtime_src[sha]
        if lib is None:  # built with --no-bundle-runtime: a record, no file
            # DST's bundled copy stays listed if adopt still finds it; if a gc
            # removed it meanwhile, the entries commit with the bare record.
            records[sha] = dict(have) if have and not have.get("path") else dict(rec)
            continue
        if have and have.get("path") and store.runtime_file_ok(have):
            store.note_runtime_source(sha, str(lib))
            records[sha] = dict(have)
            continue
        placed = store.ensure_runtime(str(lib), bundle=True)
        placed["source"] = rec.get("source", placed["source"])
        records[sha] = placed
        report.runtimes_added.append(sha)
    return records, unavailable


def _extras_mutation(store: CacheStore, current: dict, extras: dict, report: MergeReport):
    """Place extra files DST lacks; returns the index change that lists them."""
    todo = []
    for (section, name), (path, rec) in sorted(extras.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        where = f"{section}/{name}" if name else section
        have = get_extra(current, section, name)
        if have is not None and have.get("sha256") == rec["sha256"]:
            continue
        if have is not None:
            if section == TABLES_SECTION:  # two tunes of one GPU kind: rows merge
                report.tables_to_merge.append(path)
                continue
            report.conflicts.append({"key": where, "problem": f"{store.root} already lists a different file"})
            continue
        store.publish_file(rec["path"], path, rec["sha256"])
        todo.append((section, name, rec))
        report.files_added.append(where)
    if not todo:
        return None

    def mutate(idx: dict) -> None:
        for section, name, rec in todo:
            if get_extra(idx, section, name) is None:
                set_extra(idx, section, name, dict(rec))

    return mutate
