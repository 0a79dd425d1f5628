"""The `cutlass-aot` command: build, ls, info, verify, gc, tune, coverage, merge, push, pull.

Owns argument parsing, output (text, progress bar or --json) and exit codes:
0 ok, 1 a build or verify failure, 2 usage or bad input (a bad manifest, a
foreign cache). Library errors are turned into click errors only here.
The build side is imported inside the commands that need it, so `ls`/`info`
stay light.
"""

from __future__ import annotations

import errno
import importlib.metadata as md
import json
import math
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import click

from . import __version__, knobs
from .errors import CacheError, CutlassAotError, UsageError
from .layout import index_path, read_index
from .signature import GEMM_ACTS, format_params


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=1, sort_keys=True))


def _fail(exc: CutlassAotError, as_json: bool) -> None:
    if as_json:
        _emit_json({"ok": False, "error": type(exc).__name__, "message": exc.message})
    else:
        click.echo(f"error: {exc.message}", err=True)
    sys.exit(exc.exit_code)


def _cache_dir(value: str | None) -> Path:
    return Path(value).expanduser() if value else knobs.default_cache_dir()


cache_option = click.option(
    "--cache-dir", type=click.Path(file_okay=False), default=None,
    help="Cache directory (default: $CUTLASS_AOT_CACHE_DIR or the platform cache dir).")
def _note_json(ctx, param, value):
    ctx.meta["cutlass_aot.as_json"] = value  # for errors the group reports (_Main)
    return value


json_option = click.option("--json", "as_json", is_flag=True, callback=_note_json,
                           help="Print one JSON document.")

# What the filesystem says when a writer cannot go on, in words a user acts on.
_DISK_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                errno.EROFS: "the filesystem is read-only", errno.EIO: "the disk reported an I/O error",
                errno.EFBIG: "the file size limit (ulimit -f) or the filesystem's largest file is exceeded"}


class _Main(click.Group):
    """The command group; a full, read-only or failing disk under any writer
    (build, gc, merge, pull, tune), or a rename across filesystems (EXDEV: a
    cache dir mounted elsewhere), is a clear CacheError, not a traceback.
    Writers publish by rename, so what finished before it stays usable."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            # Ctrl-C: one line and the shell's 128 + SIGINT, not click's
            # "Aborted!" with status 1. Writers publish by rename: an
            # interrupted one leaves only tmp/ staging, which gc sweeps.
            # A second Ctrl-C while it says so changes nothing.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            if ctx.meta.get("cutlass_aot.as_json", False):
                _emit_json({"ok": False, "error": "Interrupted",
                            "message": "interrupted; what finished before is kept"})
            click.echo("interrupted: what finished before is kept; run the command again to "
                       "finish the rest", err=True)
            sys.exit(130)
        except OSError as exc:
            as_json = ctx.meta.get("cutlass_aot.as_json", False)
            if exc.errno == errno.EXDEV:  # a rename across filesystems: tmp/ mounted elsewhere
                where = " to ".join(str(p) for p in (exc.filename, exc.filename2) if p) or "a file"
                _fail(CacheError(
                    f"cannot move {where}: they are on different filesystems ({exc.strerror}); a "
                    "cache's tmp/, entries/ and runtime/ must all be on the cache's filesystem: "
                    "make tmp/ a plain directory there, then run the command again (what it "
                    "finished is kept)", path=str(exc.filename or "")), as_json)
                return
            why = _DISK_ERRNOS.get(exc.errno)
            if why is None:
                raise
            # a copy's error names its source first (shutil.copyfile): the target is filename2
            target = exc.filename2 or exc.filename or "the cache"
            _fail(CacheError(
                f"cannot write {target}: {why} ({exc.strerror}); free space or "
                "choose another --cache-dir, then run the command again (what it finished is "
                "kept)", path=target), as_json)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cutlass-aot")
def main() -> None:
    """Ahead-of-time CuTe DSL GEMM kernels in an on-disk cache."""


def _positive_jobs(ctx, param, value):
    if value is None:
        try:
            return knobs.default_jobs()
        except CutlassAotError as exc:
            raise click.UsageError(exc.message) from None
    if value < 1:
        raise click.BadParameter("must be at least 1")
    return value


@main.command(short_help="Compile MANIFESTS (default: the shipped configs) into the cache.")
@click.argument("manifests", nargs=-1, type=click.Path(dir_okay=False))
@cache_option
@click.option("--jobs", "-j", type=int, default=None, callback=_positive_jobs,
              help="Parallel compile workers (default: all cores, or $CUTLASS_AOT_JOBS).")
@click.option("--arch", "archs", multiple=True, help="Only manifests for this arch (repeatable).")
@click.option("--bundle-runtime/--no-bundle-runtime", default=True, show_default=True,
              help="Copy libcute_dsl_runtime.so into the cache so services need no DSL.")
@click.option("--tuning", "tuning_files", multiple=True, type=click.Path(dir_okay=False),
              help="A selection table measured elsewhere (`cutlass-aot tune`) to ship in the "
                   "cache (repeatable; manifests may name theirs with `tuning:`).")
@click.option("--max-variants", type=click.IntRange(min=1), default=None,
              help="Refuse a plan of more variants than this (default: $CUTLASS_AOT_MAX_VARIANTS or 2000).")
@click.option("--yes", "-y", "assume_yes", is_flag=True,
              help="Build however many variants the manifests plan.")
@click.option("--shard", "shard_text", default=None, metavar="I/N",
              help="Build only slice I of N (1-based) of the planned keys; see `merge`.")
@json_option
def build(manifests, cache_dir, jobs, archs, bundle_runtime, tuning_files, max_variants, assume_yes,
          shard_text, as_json):
    """Compile every variant of MANIFESTS (default: the shipped configs/) into the cache."""
    from .builder.driver import build as run_build  # noqa: PLC0415 - build side on demand
    from .builder.manifest import default_manifests, load_manifests  # noqa: PLC0415
    from .builder.plan import plan  # noqa: PLC0415

    paths = list(manifests) or [str(p) for p in default_manifests()]
    if not paths:
        _fail(UsageError(
            "no manifests given, and this installation ships no default manifests "
            "(cutlass_aot/configs/*.yaml): pass manifest paths, e.g. `cutlass-aot build "
            "my.yaml`, or reinstall cutlass-aot from a wheel or checkout that includes them"), as_json)
    try:
        knobs.lock_timeout()  # a knob that does not parse fails now, not mid-build
        shard = None
        if shard_text is not None:
            from .builder.plan import Shard  # noqa: PLC0415

            shard = Shard.parse(shard_text)
        limit = max_variants if max_variants is not None else knobs.max_variants()
        # the limit stops the expansion itself: a manifest of a million
        # variants is refused before they are made, not after
        loaded = load_manifests(paths, max_variants=None if assume_yes else limit, archs=tuple(archs))
        if archs and not any(m.arch in archs for m in loaded):
            have = sorted({m.arch for m in loaded})
            raise UsageError(
                f"--arch {', '.join(archs)} matches no manifest: they target {', '.join(have)}; "
                "fix the arch string or drop --arch", archs=list(archs), available=have)
        # Tables are checked before compiling: a bad --tuning file fails fast.
        # Rows of later files win: the manifests' shipped tables first, then
        # the --tuning files, so a freshly tuned table (`tune --out new.json`,
        # then `build --tuning new.json`) overrides the rows it re-measured
        # (r50: the manifest's table came last and silently won).
        tunings = _load_tunings([str(t) for m in loaded if not archs or m.arch in archs for t in m.tunings]
                                + list(tuning_files))
        target = _cache_dir(cache_dir)
        planned = plan(loaded, tuple(archs))
        total = len(planned)
        if total > limit and not assume_yes:
            raise UsageError(
                f"the manifests plan {total} variants, more than the limit of {limit} "
                "(--max-variants, or CUTLASS_AOT_MAX_VARIANTS); check them for lists you did not "
                "mean, or pass --yes (or --max-variants N) to build them all",
                planned=total, limit=limit)
        if not as_json:
            click.echo(f"planned {total} variants from {len(paths)} manifest(s) -> {target}", err=True)
        show_bar = not as_json and sys.stdout.isatty()
        # A shard builds an unknown part of `total`: it prints lines, not a bar.
        bar = click.progressbar(length=total, label="building") if show_bar and shard is None else None

        def progress(event: str, job, info: dict) -> None:
            if bar is not None:
                bar.update(1)
                if event == "failed":
                    click.echo(f"\nFAILED {job.describe()}: {info['error']}", err=True)
            elif not as_json:
                extra = f" ({info['seconds']:.1f}s)" if event == "built" else ""
                extra += f": {info['error']}" if event == "failed" else ""
                click.echo(f"{event:7s} {job.key[:12]} {job.signature} {job.describe()}{extra}")

        if bar is not None:
            with bar:
                report = run_build(loaded, target, jobs=jobs, arch_filter=tuple(archs),
                                   bundle_runtime=bundle_runtime, progress=progress, planned=planned,
                                   shard=shard)
        else:
            report = run_build(loaded, target, jobs=jobs, arch_filter=tuple(archs),
                               bundle_runtime=bundle_runtime, progress=progress, planned=planned,
                                   shard=shard)
        # One read of the index the build left, for both reports below.
        built = read_index(target, missing_ok=True)["entries"]
        tables_published = _publish_tunings(target, tunings, built)
        superseded = _superseded(built, {job.key for job in planned})
    except CutlassAotError as exc:
        _fail(exc, as_json)
        return
    summary = report.as_dict()
    summary["tables"] = tables_published
    summary["superseded"] = superseded
    summary["cache_dir"] = str(target)
    summary["manifests"] = paths
    summary["skipped_unsupported"] = sum(len(m.skipped) for m in loaded)
    if as_json:
        summary["ok"] = not report.failed
        _emit_json(summary)
    else:
        for note in report.repaired:
            click.echo(f"repaired: {note}")
        for fail in report.failed:
            click.echo(f"FAILED {fail['variant']} ({fail['manifest']}): {fail['error']}", err=True)
        for line in _table_warnings(tables_published):
            click.echo(line, err=True)
        dropped = [(v, why) for m in loaded for v, why in m.skipped]
        if dropped:  # said, not silent: an entry whose every combination is dropped builds nothing
            variant, why = dropped[0]
            click.echo(
                f"note: {len(dropped)} combination(s) skipped as unsupported (skip_unsupported: true); "
                f"the first, {variant.source} {format_params(variant.param_dict)}: {why}", err=True)
        if superseded:
            click.echo(
                f"note: {superseded} entries are older builds of variants this run planned (their "
                "keys changed, e.g. after a kernel-source edit); dispatch runs the newest, and "
                f"`cutlass-aot gc {' '.join(paths)} --cache-dir {target}` removes them", err=True)
        if report.shard is not None:
            sh = report.shard
            click.echo(f"shard {sh['index']}/{sh['count']}: {sh['keys']} of {sh['planned']} planned keys")
        click.echo(
            f"{summary['total']} variants: {summary['built']} built, {summary['cached']} cached, "
            f"{summary['failed']} failed in {summary['seconds']:.1f}s -> {target}")
    sys.exit(1 if report.failed else 0)


def _superseded(entries: dict, planned_keys: set[str]) -> int:
    """Index entries that are older builds of a planned variant: the same signature, family
    and variant parameters as a planned key's entry, under another key."""

    def identity(rec: dict) -> tuple:
        params = rec.get("variant") or {}
        return (rec.get("signature_text"), rec.get("family"),
                tuple(sorted((k, repr(v)) for k, v in params.items())))

    planned = {identity(rec) for key, rec in entries.items() if key in planned_keys}
    return sum(1 for key, rec in entries.items() if key not in planned_keys and identity(rec) in planned)


def _load_tunings(files: list[str]) -> list[dict]:
    """Selection tables to ship, validated, one per GPU (rows of later files win)."""
    from .layout import table_slot  # noqa: PLC0415
    from .tables import load_table_file, merge_rows  # noqa: PLC0415

    by_slot: dict[str, dict] = {}
    for f in files:
        doc = load_table_file(f)
        slot = table_slot(doc["gpu"])
        if slot in by_slot:
            doc = dict(doc, rows=merge_rows(by_slot[slot]["rows"], doc["rows"]))
        by_slot[slot] = doc
    return list(by_slot.values())


def _publish_tunings(target: Path, docs: list[dict], entries: dict) -> list[dict]:
    """Publish selection tables into a built cache, merged with its rows for
    the same GPU; each record gets ``binding``: how its rows bind to what the
    cache now holds (``entries``, its index entries; tables.bind's counts), which
    ``build`` reports."""
    from .builder.store import CacheStore  # noqa: PLC0415 - build side on demand
    from .tables import bind, entries_of  # noqa: PLC0415

    if not docs:
        return []
    store = CacheStore(target)
    records = [store.publish_table(doc, merge=True) for doc in docs]
    listed = entries_of((r, None) for r in entries.values())
    for rec in records:
        doc = store.table_doc(rec["gpu"])
        rec["binding"] = bind(doc["rows"] if doc else [], listed)[1]
    return records


def _table_warnings(records: list[dict]) -> list[str]:
    """What build says of a shipped table whose rows do not all bind: those
    problems dispatch by the model, which a CI job should hear of then, not
    a service later (r16 shipped a table 3 of whose 300 rows bound)."""
    out = []
    for rec in records:
        b = rec.get("binding") or {}
        stale, gone = b.get("stale_source", 0), b.get("missing_variant", 0)
        if not (stale or gone):
            continue
        gpu = rec["gpu"]
        out.append(
            f"warning: selection table for {gpu['name']} ({gpu['sm_count']} SMs, sm "
            f"{gpu['capability']}): {b.get('used', 0)} of {rec['rows']} rows bind; {stale} measured "
            f"older kernel code and {gone} name variants this cache lacks. Those problems dispatch "
            "by the model: re-run `cutlass-aot tune` on that GPU, or, after an edit that left the "
            "code unchanged, build_scripts/restamp_table.py")
    return out


def _require_cache(cache_dir: Path) -> None:
    """Raise CacheError unless cache_dir holds a cutlass-aot index.

    Commands that read or prune a cache must never create one, or write
    into a directory that is something else.
    """
    if not cache_dir.is_dir():
        raise CacheError(
            f"cache {cache_dir} does not exist; run `cutlass-aot build --cache-dir {cache_dir}` "
            "first, or pass the right --cache-dir", cache_dir=str(cache_dir))
    if not index_path(cache_dir).is_file():
        raise CacheError(
            f"{cache_dir} is not a cutlass-aot cache (no index.json); pass the directory "
            "`cutlass-aot build` wrote to", cache_dir=str(cache_dir))


def _open_index(cache_dir: Path, as_json: bool) -> dict:
    try:
        _require_cache(cache_dir)
        return read_index(cache_dir)
    except CutlassAotError as exc:
        _fail(exc, as_json)
        raise  # unreachable


_LS_TUNING = ("tile", "cluster", "warps", "bk", "stages", "raster", "swizzle", "swap_ab", "split_k",
              "pingpong", "gemv")


def _arch_of(record: dict) -> str:
    return record["signature"]["arch"]


def _per_arch(entries: dict) -> dict[str, dict[str, int]]:
    """{arch: {"entries": n, "signatures": s}} of an index's entries."""
    out: dict[str, dict[str, Any]] = {}
    for r in entries.values():
        slot = out.setdefault(_arch_of(r), {"entries": 0, "signatures": set()})
        slot["entries"] += 1
        slot["signatures"].add(r.get("signature_text") or str(r["signature"]))
    return {a: {"entries": v["entries"], "signatures": len(v["signatures"])}
            for a, v in sorted(out.items())}


@main.command(name="ls")
@cache_option
@click.option("--arch", "archs", multiple=True, help="Only entries for ARCH. Repeatable.")
@json_option
def ls_cmd(cache_dir, archs, as_json):
    """List the cache's entries per arch: signature, variant, size."""
    target = _cache_dir(cache_dir)
    index = _open_index(target, as_json)
    rows = [
        {"key": k, "arch": _arch_of(r),
         "signature": r["signature_text"] if "signature_text" in r else str(r["signature"]),
         "variant": r["variant"], "size": r["size"], "built_at": r["built_at"]}
        for k, r in sorted(index["entries"].items(),
                           key=lambda kv: (_arch_of(kv[1]), kv[1].get("signature_text", ""), kv[0]))
        if not archs or _arch_of(r) in archs
    ]
    tables = [dict(rec, slot=slot) for slot, rec in sorted(index.get("tables", {}).items())]
    if as_json:
        _emit_json({"cache_dir": str(target), "entries": rows, "tables": tables})
        return
    arch = None
    for row in rows:
        if row["arch"] != arch:
            arch = row["arch"]
            count = sum(1 for r in rows if r["arch"] == arch)
            click.echo(f"{arch}: {count} entries")
        v = row["variant"]
        # The signature already shows what a call needs; show the tuning
        # parameters of sm90_gemm, or every parameter of another family.
        shown = format_params(v, _LS_TUNING) or format_params(v)
        click.echo(f"{row['key'][:12]}  {row['signature']}  {shown}  {row['size'] / 1024:.0f} KiB")
    for t in tables:
        g = t["gpu"]
        click.echo(f"selection table: {g['name']} ({g['sm_count']} SMs, sm {g['capability']}), "
                   f"{t['rows']} rows, {t['path']}")
    click.echo(f"{len(rows)} entries in {target}")


@main.command()
@cache_option
@json_option
def info(cache_dir, as_json):
    """Versions, cache dir, entry counts and bytes."""
    target = _cache_dir(cache_dir)
    versions = {"cutlass-aot": __version__}
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi", "torch"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    data: dict[str, Any] = {"cache_dir": str(target), "versions": versions, "exists": target.is_dir(),
                            "fastpath": _fastpath_status(), "knob_problems": knobs.problems()}
    if target.is_dir():
        try:
            index = read_index(target)
        except CutlassAotError as exc:
            _fail(exc, as_json)
            return
        entries = index["entries"]
        data["entries"] = len(entries)
        data["signatures"] = len({r.get("signature_text") for r in entries.values()})
        data["artifact_bytes"] = sum(r["size"] for r in entries.values())
        data["runtime_bytes"] = sum(r["size"] for r in index["runtimes"].values() if r.get("path"))
        data["generation"] = index.get("generation")
        data["tables"] = [dict(rec, slot=slot, binding=_table_binding(target, rec, entries))
                          for slot, rec in sorted(index.get("tables", {}).items())]
        data["archs"] = _per_arch(entries)
    if as_json:
        _emit_json(data)
        if data["knob_problems"]:
            sys.exit(2)
        return
    for name, value in versions.items():
        click.echo(f"{name:20s} {value or 'not installed'}")
    click.echo(f"{'dispatch C++ entry':20s} {data['fastpath']}")
    for problem in data["knob_problems"]:
        click.echo(f"{'bad knob':20s} {problem}", err=True)
    click.echo(f"{'cache dir':20s} {target}{'' if data['exists'] else ' (not created yet)'}")
    if data["exists"]:
        click.echo(f"{'entries':20s} {data['entries']} ({data['signatures']} signatures)")
        for arch, counts in data["archs"].items():
            click.echo(f"{'  ' + arch:20s} {counts['entries']} ({counts['signatures']} signatures)")
        click.echo(f"{'bytes':20s} {data['artifact_bytes']} artifacts + {data['runtime_bytes']} runtime")
        for t in data["tables"]:
            g = t["gpu"]
            click.echo(f"{'selection table':20s} {g['name']} ({g['sm_count']} SMs, sm {g['capability']}):"
                       f" {t['rows']} rows, {t['path']}")
            b = t["binding"]
            click.echo(f"{'':20s} " + (
                f"{b['used']} rows bind ({b['same_bytes']} by unchanged artifact bytes), "
                f"{b['missing_variant']} name variants this cache lacks, {b['stale_source']} measured "
                "older kernel code (run `cutlass-aot tune` to re-measure them)"
                if "error" not in b else f"not usable: {b['error']}"))
        if not data["tables"]:
            click.echo(f"{'selection table':20s} none (selection uses the model; see `cutlass-aot tune`)")
    if data["knob_problems"]:
        sys.exit(2)  # printed above, with the rest: info is where a bad knob is looked for


def _fastpath_status() -> str:
    """Whether dispatch runs its C++ half here (run/fastpath.py), and if not, why."""
    from .run import fastpath  # noqa: PLC0415 - info only

    try:
        return fastpath.status()
    except UsageError as exc:  # a CUTLASS_AOT_FASTPATH value that does not parse
        return f"off: {exc}"


def _table_binding(target: Path, rec: dict, entries: dict) -> dict:
    """How a cache's table binds to its entries (tables.bind's counts), or the error that
    keeps the run side from reading it."""
    from . import tables  # noqa: PLC0415 - info only
    from .builder.store import CacheStore  # noqa: PLC0415

    doc, problem = CacheStore(target).read_table(rec)
    if doc is None:
        return {"error": f"{rec['path']}: {problem}; run `cutlass-aot verify`"}
    return tables.bind(doc["rows"], tables.entries_of((r, None) for r in entries.values()))[1]


@main.command()
@cache_option
@click.option("--repair", is_flag=True, help="Drop entries that fail (the next build rebuilds them).")
@json_option
def verify(cache_dir, repair, as_json):
    """Re-hash every entry; exit 1 on any mismatch."""
    from .builder.store import CacheStore  # noqa: PLC0415

    target = _cache_dir(cache_dir)
    try:
        if not (repair and target.is_dir() and any((target / "entries").glob("*/entry.json"))):
            _require_cache(target)  # --repair rebuilds a lost index from the entry records
        result = CacheStore(target).verify(repair=repair)
    except CutlassAotError as exc:
        _fail(exc, as_json)
        return
    result["ok"] = not result["problems"]
    result["cache_dir"] = str(target)
    if as_json:
        _emit_json(result)
    else:
        for p in result["problems"]:
            click.echo(f"BAD {p['what'][:16]}: {p['problem']}", err=True)
        tables = result.get("tables", 0)
        click.echo(f"verified {result['checked']} entries"
                   + (f" and {tables} selection table{'s' if tables != 1 else ''}" if tables else "")
                   + f": {len(result['problems'])} problems" + (" (repaired)" if result["repaired"] else ""))
    sys.exit(0 if result["ok"] else 1)


_AGE = re.compile(r"^(\d+)([smhd])$")


def _age_seconds(ctx, param, value):
    if value is None:
        return None
    m = _AGE.match(value)
    if not m:
        raise click.BadParameter("use a number and a unit, e.g. 30d, 12h, 90m")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


@main.command(short_help="Remove entries no MANIFESTS reference, or older than --older-than.")
@click.argument("manifests", nargs=-1, type=click.Path(dir_okay=False))
@cache_option
@click.option("--older-than", callback=_age_seconds, default=None,
              help="Also remove entries built longer ago than this (e.g. 30d).")
@json_option
def gc(manifests, cache_dir, older_than, as_json):
    """Remove entries no MANIFESTS reference (and/or older than --older-than)."""
    from .builder.manifest import load_manifests  # noqa: PLC0415
    from .builder.plan import plan  # noqa: PLC0415
    from .builder.store import CacheStore  # noqa: PLC0415

    if not manifests and older_than is None:
        raise click.UsageError("give manifests to keep, --older-than, or both")
    target = _cache_dir(cache_dir)
    try:
        _require_cache(target)
        keep = {job.key for job in plan(load_manifests(list(manifests)))} if manifests else None
        store = CacheStore(target)
        result = store.gc(keep, older_than)
        # Rows naming variants gc removed go too (the table is republished).
        result["table_rows_dropped"] = store.prune_tables()
    except CutlassAotError as exc:
        _fail(exc, as_json)
        return
    if as_json:
        _emit_json(result | {"ok": True})
    else:
        click.echo(f"removed {result['removed']} entries, freed {result['bytes_freed']} bytes, "
                   f"kept {result['kept']}")


def _finite(ctx, param, value):
    """Click callback: refuse nan (FloatRange lets it through: nan < 1 is false)."""
    if value is not None and math.isnan(value):
        raise click.BadParameter("must be a number of seconds, not nan")
    return value


def _finite_ms(ctx, param, value):
    """Click callback: refuse nan and inf for a duration in ms."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"must be a finite number of ms, not {value}")
    return value


def _check_writable_file(path: str, what: str) -> None:
    """UsageError now, not after a long run, if ``path`` cannot be written."""
    parent = Path(path).expanduser().absolute().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {what} {path}: {parent} is not a writable directory; "
                         "create it or choose another path", path=path)


@main.command()
@click.argument("manifests", nargs=-1, type=click.Path(dir_okay=False))
@cache_option
@click.option("--shapes", "shape_files", multiple=True, type=click.Path(dir_okay=False),
              help="A shape file (YAML/JSON list of groups; see docs/cli.md, `cutlass-aot tune`).")
@click.option("--from-log", "logs", multiple=True, type=click.Path(dir_okay=False),
              help="A shape log recorded by a service (CUTLASS_AOT_SHAPE_LOG).")
@click.option("--budget-s", type=click.FloatRange(min=1), default=None, callback=_finite,
              help="Stop measuring after this many seconds (what was measured is kept).")
@click.option("--force", is_flag=True, help="Re-measure problems the table already has.")
@click.option("--steady-ms", type=click.FloatRange(min=0), default=300.0, show_default=True,
              callback=_finite_ms,
              help="Rank problems whose fastest option takes 1 ms or more at the clock the "
                   "GPU's power cap holds: their leaders are re-timed, each after this many ms "
                   "back to back (0: in bursts after a pause, the default before r73).")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None,
              help="Also write the table to this file (for `build --tuning` elsewhere).")
@json_option
def tune(manifests, cache_dir, shape_files, logs, budget_s, force, steady_ms, out_file, as_json):
    """Measure each signature's variants on this GPU and ship the winners in the cache.

    Problems come from the MANIFESTS' `tune:` sections, --shapes files and
    --from-log shape logs. Needs a CUDA GPU and a writable cache.
    """
    from .builder.manifest import load_manifests  # noqa: PLC0415 - tune side on demand
    from .tune.shapes import load_shape_file, read_shape_log  # noqa: PLC0415

    target = _cache_dir(cache_dir)
    try:
        _require_cache(target)
        problems = []
        for m in load_manifests(list(manifests)) if manifests else []:
            problems += m.tune
        for f in shape_files:
            problems += load_shape_file(f)
        skipped_lines = 0
        if logs:
            logged, skipped_lines = read_shape_log(logs)
            problems += [p for _, p in logged]
        if not problems and logs:
            raise UsageError(f"nothing to tune: the shape logs hold no GEMM call tune can time "
                             f"({skipped_lines} line(s) skipped as malformed, or calls below "
                             "16-byte alignment, of mixed dtypes or with a C of another dtype "
                             "than D, which tune does not time); check the paths, or give --shapes", skipped=skipped_lines)
        if not problems:
            raise UsageError("nothing to tune: give manifests with a `tune:` section, --shapes "
                             "or --from-log")
        problems = list(dict.fromkeys(problems))  # sources may share problems: time each once
        if out_file:
            _check_writable_file(out_file, "--out")
        from .tune.tuner import tune as run_tune  # noqa: PLC0415 - imports torch
        from .tune.tuner import tune_env_ok  # noqa: PLC0415

        tune_env_ok()
        report = run_tune(target, problems, budget_s=budget_s, force=force,
                          progress=not as_json and sys.stderr.isatty(), steady_ms=steady_ms)
        if out_file:
            try:
                Path(out_file).write_bytes((target / report["table"]["path"]).read_bytes())
            except OSError as exc:
                raise UsageError(f"cannot write --out {out_file} ({exc.strerror or exc}); the table "
                                 f"is published in the cache as {report['table']['path']}: copy "
                                 "it from there", path=out_file) from None
    except CutlassAotError as exc:
        _fail(exc, as_json)
        return
    report["log_lines_skipped"] = skipped_lines
    if as_json:
        _emit_json(report | {"ok": True})
        return
    retimed = {(r["signature"], r["m"], r["n"], r["k"], r["l"]): r for r in report.get("retimed", ())}
    for row in report["rows"]:
        click.echo(f"{row['signature']} {row['m']}x{row['n']}x{row['k']}x{row['l']}: {row['label']} "
                   f"{row['us']:.1f} us (next: {row['runner_up']}, x{row['margin']})")
        again = retimed.get((row["signature"], row["m"], row["n"], row["k"], row["l"]))
        if again and again["steady_ms"]:  # a heavy problem: every option the row chose among
            click.echo(f"  re-timed after {again['steady_ms']:g} ms back to back: " + ", ".join(
                f"{label} {us:.1f} us" for label, us in again["options"]))
    for s in report["skipped"]:
        dims = "x".join(map(str, s["dims"])) + " " if s.get("dims") else ""
        click.echo(f"skipped {s['signature']} {dims}: {s['reason']}", err=True)
    click.echo(f"measured {report['measured']}, kept {report['kept']}, resumed {report['resumed']}"
               f"{' (stopped by --budget-s)' if report['stopped_by_budget'] else ''}; table "
               f"{report['table']['path']} has {report['total_rows']} rows")


# ------------------------------------------------------------------ explain
@main.command()
@click.argument("problems", nargs=-1)
@cache_option
@click.option("--from-log", "logs", multiple=True, type=click.Path(dir_okay=False),
              help="A shape log (CUTLASS_AOT_SHAPE_LOG): how the calls it recorded are served now.")
@click.option("--gpu", default=None,
              help="A GPU the cache has a selection table for (a piece of its name, e.g. H200); "
                   "default: the cache's one table.")
@click.option("--sms", type=click.IntRange(min=1), default=None,
              help="Explain the model alone for a GPU of this many SMs (no table).")
@click.option("--arch", default="sm_90a", show_default=True, help="The GPU's arch, with --sms.")
@click.option("--dtype", type=click.Choice(("bf16", "f16")), default="bf16", show_default=True,
              help="A's and B's dtype.")
@click.option("--out-dtype", type=click.Choice(("bf16", "f16", "f32")), default=None, help="D's dtype (default: A's).")
@click.option("--b-major", type=click.Choice(("k", "n")), default="k", show_default=True,
              help="k: B is w.t() of a row-major weight (nn.Linear); n: B is row-major.")
@click.option("--bias", type=click.Choice(("bf16", "f16", "f32")), default=None, help="A bias vector's dtype.")
@click.option("--act", type=click.Choice(GEMM_ACTS), default="none", show_default=True)
@click.option("--with-c", is_flag=True, help="A residual C (beta != 0), laid out like D.")
@click.option("--top", type=click.IntRange(min=0), default=5, show_default=True,
              help="How many of the model's first options to list.")
@json_option
def explain(problems, cache_dir, logs, gpu, sms, arch, dtype, out_dtype, b_major, bias, act,
            with_c, top, as_json):
    """Say which prebuilt option dispatch runs for each problem (MxNxK or MxNxKxL), and why.

    No GPU needed: it reads the cache and its selection table for the named
    GPU, as a service's dispatch would for contiguous, 16-byte aligned
    operands. With --from-log instead: per signature, how many of the
    problems a service's shape log recorded are served by a table row and how
    many by the model (what `tune --from-log` would measure). Exit codes: 0;
    2 for a bad problem or option, a cache dir that does not exist, an
    unreadable log, or a GPU the cache has no table for; 1 where no variant
    in the cache serves a problem, or the cache is damaged.
    """
    from . import explain as ex  # noqa: PLC0415

    target = _cache_dir(cache_dir)
    try:
        _require_cache(target)
        if bool(problems) == bool(logs):
            raise UsageError("give problems (MxNxK ...) or --from-log LOG, one of the two")
        if sms is None and arch != "sm_90a":
            raise UsageError("--arch goes with --sms (a table names its GPU's arch itself)")
        if logs:
            report = ex.explain_logs(target, list(logs), gpu=gpu, sms=sms, arch=arch)
        else:
            report = ex.explain(target, [ex.parse_problem(p) for p in problems], dtype=dtype,
                                out_dtype=out_dtype, b_major=b_major, bias=bias, act=act,
                                with_c=with_c, gpu=gpu, sms=sms, arch=arch, top=top)
    except CutlassAotError as exc:
        _fail(exc, as_json)
        return
    if as_json:
        _emit_json(report | {"ok": True})
    else:
        click.echo(ex.render_logs_text(report) if logs else ex.render_text(report))


# ------------------------------------------------------------------ coverage
@main.command()
@click.argument("logs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Also check which gaps this cache serves now (only when given).")
@click.option("--manifest-out", type=click.Path(dir_okay=False), default=None,
              help="Write a manifest (YAML) whose variants serve the gaps.")
@json_option
def coverage(logs, cache_dir, manifest_out, as_json):
    """Report what shape LOGS say missed or fell back; write the manifest that serves it.

    Exit 0 when nothing missed, 1 when gaps remain, 2 for bad input.
    """
    from .coverage import analyze, render_text, write_manifests  # noqa: PLC0415 - this command only

    try:
        try:
            report = analyze(list(logs), Path(cache_dir).expanduser() if cache_dir else None)
        except OSError as exc:
            raise UsageError(f"cannot read shape log {exc.filename}: {exc.strerror}",
                             path=exc.filename) from None
        if manifest_out:
            try:
                write_manifests(report, manifest_out)
            except OSError as exc:
                raise UsageError(f"cannot write {manifest_out}: {exc.strerror or exc}",
                                 path=manifest_out) from None
    except CutlassAotError as exc:
        _fail(exc, as_json)
        return
    if as_json:
        _emit_json(report.as_dict())
    else:
        click.echo(render_text(report))
    sys.exit(1 if report.gaps else 0)


# ------------------------------------------------- beyond one machine
# merge, push and pull: shard caches and OCI registries (docs/distribution.md;
# README "Beyond one machine"). Exit 1 for refused entries and registry failures, 2 for bad input.


@main.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(file_okay=False))
@cache_option
@json_option
def merge(sources, cache_dir, as_json):
    """Verify every entry of SOURCES (caches) and copy what the cache lacks."""
    from .builder.merge import merge as run_merge  # noqa: PLC0415 - build side on demand

    def resolved(path: Path, what: str) -> Path:
        # a path that cannot resolve (a symlink loop, a NUL byte) is a CacheError naming it
        try:
            return path.resolve()
        except (RuntimeError, ValueError, OSError) as exc:
            raise CacheError(f"{what} {path} cannot be resolved ({type(exc).__name__}: {exc}); a "
                             "symlink loop? pass the cache's real directory", cache_dir=str(path)) from None

    target = _cache_dir(cache_dir)
    try:
        dst = resolved(target, "--cache-dir")
        for src in sources:
            if resolved(Path(src), "source") == dst:
                raise CacheError(f"source {src} is the destination --cache-dir itself", cache_dir=src)
        report = run_merge([Path(s) for s in sources], target)
    except CutlassAotError as exc:
        _fail(exc, as_json)
        return
    data = report.as_dict() | {"cache_dir": str(target), "sources": list(sources)}
    if as_json:
        _emit_json(data)
    else:
        for item in report.corrupt:
            click.echo(f"CORRUPT {item['key'][:16]} in {item['source']}: {item['problem']}", err=True)
        for item in report.conflicts:
            click.echo(f"CONFLICT {item['key'][:16]}: {item['problem']}", err=True)
        click.echo(f"checked {report.checked} entries of {len(sources)} caches: {len(report.added)} added, "
                   f"{len(report.present)} already present, {len(report.conflicts)} conflicts, "
                   f"{len(report.corrupt)} corrupt in {report.seconds:.1f}s -> {target}")
    sys.exit(0 if report.ok else 1)


def _remote_options(f):
    f = click.option("--plain-http", is_flag=True,
                     help="Speak HTTP, not HTTPS (a local registry only).")(f)
    f = click.option("--ca-file", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="CA bundle to trust for the registry (default: $CUTLASS_AOT_REGISTRY_CA, "
                          "then the system's).")(f)
    return f


def _emit_remote(report: dict, target: Path, as_json: bool) -> None:
    """The result of a push or pull, as JSON or one line of text."""
    if as_json:
        _emit_json(report | {"ok": True, "cache_dir": str(target)})
    else:
        click.echo(_remote_text(report))


def _remote_text(report: dict) -> str:
    mb = report["bytes"] / 1e6
    return (f"{report['blobs_transferred']} of {report['blobs']} blobs {report['verb']} "
            f"({mb:.1f} MB in {report['seconds']:.1f}s), {report['entries']} entries; "
            f"{report['reference']}@{report['digest']}")


@main.command()
@click.argument("ref")
@cache_option
@_remote_options
@json_option
def push(ref, cache_dir, plain_http, ca_file, as_json):
    """Upload the cache to an OCI registry as REF (host/repo:tag); only missing blobs."""
    from .remote.push import push as run_push  # noqa: PLC0415

    target = _cache_dir(cache_dir)
    try:
        _require_cache(target)
        report = run_push(target, ref, plain_http=plain_http, ca_file=ca_file)
    except CutlassAotError as exc:
        _fail(exc, as_json)
        return
    _emit_remote(report, target, as_json)


@main.command()
@click.argument("ref")
@cache_option
@click.option("--arch", "archs", multiple=True, help="Only entries for this arch (repeatable).")
@click.option("--signature", "signatures", multiple=True,
              help="Only entries of this signature text, or a glob of it (repeatable).")
@_remote_options
@json_option
def pull(ref, cache_dir, archs, signatures, plain_http, ca_file, as_json):
    """Download REF's entries the cache lacks (for --arch/--signature), verified."""
    from .remote.pull import pull as run_pull  # noqa: PLC0415

    target = _cache_dir(cache_dir)
    try:
        report = run_pull(ref, target, archs=tuple(archs), signatures=tuple(signatures),
                          plain_http=plain_http, ca_file=ca_file)
    except CutlassAotError as exc:
        _fail(exc, as_json)
        return
    _emit_remote(report, target, as_json)


if __name__ == "__main__":  # pragma: no cover
    main()
