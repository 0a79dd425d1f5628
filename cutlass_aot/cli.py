"""The `cutlass-aot` command: build, ls, info, verify, gc.

Owns argument parsing, output (text, progress bar or --json) and exit codes:
0 ok, 1 a build or verify failure, 2 usage or bad input (a bad manifest, a
foreign cache). Library errors are turned into click errors only here.
The build side is imported inside the commands that need it, so `ls`/`info`
stay light.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import sys
from pathlib import Path
from typing import Any

import click

from . import __version__, knobs
from .errors import CacheError, CutlassAotError, UsageError
from .layout import index_path, read_index
from .signature import format_params


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
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("--max-variants", type=click.IntRange(min=1), default=None,
              help="Refuse a plan of more variants than this (default: $CUTLASS_AOT_MAX_VARIANTS or 1000).")
@click.option("--yes", "-y", "assume_yes", is_flag=True,
              help="Build however many variants the manifests plan.")
@json_option
def build(manifests, cache_dir, jobs, archs, bundle_runtime, max_variants, assume_yes, as_json):
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
        loaded = load_manifests(paths)
        if archs and not any(m.arch in archs for m in loaded):
            have = sorted({m.arch for m in loaded})
            raise UsageError(
                f"--arch {', '.join(archs)} matches no manifest: they target {', '.join(have)}; "
                "fix the arch string or drop --arch", archs=list(archs), available=have)
        target = _cache_dir(cache_dir)
        planned = plan(loaded, tuple(archs))
        total = len(planned)
        limit = max_variants if max_variants is not None else knobs.max_variants()
        if total > limit and not assume_yes:
            raise UsageError(
                f"the manifests plan {total} variants, more than the limit of {limit} "
                "(--max-variants, or CUTLASS_AOT_MAX_VARIANTS); check them for lists you did not "
                "mean, or pass --yes (or --max-variants N) to build them all",
                planned=total, limit=limit)
        if not as_json:
            click.echo(f"planned {total} variants from {len(paths)} manifest(s) -> {target}", err=True)
        show_bar = not as_json and sys.stdout.isatty()
        bar = click.progressbar(length=total, label="building") if show_bar else None

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
                                   bundle_runtime=bundle_runtime, progress=progress, planned=planned)
        else:
            report = run_build(loaded, target, jobs=jobs, arch_filter=tuple(archs),
                               bundle_runtime=bundle_runtime, progress=progress, planned=planned)
    except CutlassAotError as exc:
        _fail(exc, as_json)
        return
    summary = report.as_dict()
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
        click.echo(
            f"{summary['total']} variants: {summary['built']} built, {summary['cached']} cached, "
            f"{summary['failed']} failed in {summary['seconds']:.1f}s -> {target}")
    sys.exit(1 if report.failed else 0)


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


_LS_TUNING = ("tile", "cluster", "raster", "swizzle")


@main.command(name="ls")
@cache_option
@json_option
def ls_cmd(cache_dir, as_json):
    """List the cache's entries: signature, variant, size."""
    target = _cache_dir(cache_dir)
    index = _open_index(target, as_json)
    rows = [
        {"key": k, "signature": r["signature_text"] if "signature_text" in r else str(r["signature"]),
         "variant": r["variant"], "size": r["size"], "built_at": r["built_at"]}
        for k, r in sorted(index["entries"].items(), key=lambda kv: (kv[1].get("signature_text", ""), kv[0]))
    ]
    if as_json:
        _emit_json({"cache_dir": str(target), "entries": rows})
        return
    for row in rows:
        v = row["variant"]
        # The signature already shows what a call needs; show the tuning
        # parameters of sm90_gemm, or every parameter of another family.
        shown = format_params(v, _LS_TUNING) or format_params(v)
        click.echo(f"{row['key'][:12]}  {row['signature']}  {shown}  {row['size'] / 1024:.0f} KiB")
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
    data: dict[str, Any] = {"cache_dir": str(target), "versions": versions, "exists": target.is_dir()}
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
    if as_json:
        _emit_json(data)
        return
    for name, value in versions.items():
        click.echo(f"{name:20s} {value or 'not installed'}")
    click.echo(f"{'cache dir':20s} {target}{'' if data['exists'] else ' (not created yet)'}")
    if data["exists"]:
        click.echo(f"{'entries':20s} {data['entries']} ({data['signatures']} signatures)")
        click.echo(f"{'bytes':20s} {data['artifact_bytes']} artifacts + {data['runtime_bytes']} runtime")


@main.command()
@cache_option
@click.option("--repair", is_flag=True, help="Drop entries that fail (the next build rebuilds them).")
@json_option
def verify(cache_dir, repair, as_json):
    """Re-hash every entry; exit 1 on any mismatch."""
    from .builder.store import CacheStore  # noqa: PLC0415

    target = _cache_dir(cache_dir)
    try:
        _require_cache(target)
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
        click.echo(f"verified {result['checked']} entries: {len(result['problems'])} problems"
                   + (" (repaired)" if result["repaired"] else ""))
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
        result = CacheStore(target).gc(keep, older_than)
    except CutlassAotError as exc:
        _fail(exc, as_json)
        return
    if as_json:
        _emit_json(result | {"ok": True})
    else:
        click.echo(f"removed {result['removed']} entries, freed {result['bytes_freed']} bytes, "
                   f"kept {result['kept']}")


if __name__ == "__main__":  # pragma: no cover
    main()
