"""Load: open a cache read-only and hand out verified, loaded artifacts.

Run side: imports only the standard library, tvm_ffi (lazily, at first
artifact load) and the core modules. Never imports the CuTe DSL or the build
side, never writes to the cache, never takes a lock, so a read-only cache
(a container image layer) works.

* ``open_cache`` checks the directory is trustworthy (not world-writable,
  owned by this user or root), reads ``index.json`` once and sorts entries
  into usable ones (known ABI, matching tvm-ffi, one runtime library) and
  unusable ones with the reason.
* ``Cache.function(key)`` loads an artifact on first use: checks that
  ``entries/<key>/`` is trustworthy too, resolves its path inside the cache,
  reads its bytes and checks size and sha256 against the index *before*
  dlopen, loads libcute_dsl_runtime.so (the cache's bundled copy, under a
  trusted ``runtime/`` and ``runtime/<sha>/``, CUTLASS_AOT_RUNTIME_LIB, or
  the installed DSL libs package, checked against the sha256 the artifacts
  were built with), then loads the artifact through tvm_ffi. Both libraries
  are loaded from the very bytes that were hashed (an anonymous memfd), so a
  file swapped in after the check is never what runs. Where memfd or a
  private temp dir is unavailable, loading is refused unless
  CUTLASS_AOT_ALLOW_PATH_LOAD=1 accepts loading the checked path instead.
  Loaded functions are kept for the life of the process.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.metadata as md
import importlib.util
import mmap
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from .. import knobs, tables
from ..archs import archs_text, runnable_archs
from ..errors import CacheError, IntegrityError, KernelNotFoundError, UsageError
from ..layout import (
    BUILD_HINT,
    GEMM_ABIS,
    check_trusted_dir,
    check_trusted_paths,
    read_index,
    resolve_inside,
)
from ..signature import Signature
from .stats import Stats

SUPPORTED_ABIS = set(GEMM_ABIS)

# One libcute_dsl_runtime.so per process (it is loaded RTLD_GLOBAL by soname).
_RUNTIME_LOCK = threading.Lock()
_RUNTIME_LOADED: dict[str, Any] = {}


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _installed_tvm_ffi() -> str | None:
    try:
        return md.version("apache-tvm-ffi")
    except md.PackageNotFoundError:
        return None


class Entry:
    """One usable artifact record (read-only view of the index)."""

    __slots__ = ("key", "record", "signature", "variant")

    def __init__(self, key: str, record: dict, interned: dict | None = None):
        self.key = key
        self.record = record
        # Many entries share a signature: intern it by its text, but only
        # after checking that the text is what the validated signature says
        # (a record whose text disagrees would otherwise borrow another
        # entry's signature and be dispatched to calls it cannot serve).
        text = record.get("signature_text")
        hit = interned.get(text) if interned is not None and text else None
        if hit is not None and hit[0] == record["signature"]:
            sig = hit[1]
        else:
            sig = Signature.from_dict(record["signature"])
            if text is not None and text != sig.text():
                raise IntegrityError(
                    f"index record {key[:16]} has signature_text {text!r}, but its signature "
                    f"is {sig.text()!r}; {BUILD_HINT} to repair", key=key)
            if interned is not None:
                interned[sig.text()] = (record["signature"], sig)
        self.signature = sig
        self.variant = record["variant"]


class Cache:
    """A cutlass-aot cache opened for reading.

    ``on_miss`` says what a call no artifact serves does: ``"raise"``
    (KernelNotFoundError) or ``"torch"`` (run through torch, see
    run/fallback.py, and count it). Bad arguments raise either way.
    """

    def __init__(self, path: str | os.PathLike, on_miss: str = "raise"):
        if on_miss not in knobs.ON_MISS_CHOICES:
            raise UsageError(f"on_miss={on_miss!r}: use one of {', '.join(knobs.ON_MISS_CHOICES)}",
                             on_miss=on_miss)
        self.on_miss = on_miss
        # Hits, fallbacks and misses per signature and shape bucket (run/stats.py).
        self.counters = Stats()
        # absolute now: entries load lazily, and a later chdir must not move them
        self.path = Path(path).expanduser().absolute()
        if not self.path.is_dir():
            what = "is not a directory" if self.path.exists() else "does not exist"
            raise CacheError(
                f"cutlass-aot cache {self.path} {what}; {BUILD_HINT} "
                "with --cache-dir pointing there, or set CUTLASS_AOT_CACHE_DIR",
                cache_dir=str(self.path),
            )
        check_trusted_dir(self.path)
        index = read_index(self.path, missing_ok=False)
        self.generation = index.get("generation")
        self.runtimes: dict[str, dict] = index["runtimes"]
        self.tables: dict[str, dict] = index.get("tables", {})
        # (gpu name, SM count, capability) -> (rows by signature text, status)
        self._bound_tables: dict[tuple, tuple[dict, dict]] = {}
        self.entries: dict[str, Entry] = {}
        self.by_signature: dict[Signature, list[Entry]] = {}
        self.unusable: dict[str, str] = {}
        self._functions: dict[str, Any] = {}
        self._load_lock = threading.Lock()
        try:
            self._sort(index["entries"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # validate_index checks records; this is the backstop for a field
            # it does not know about.
            raise IntegrityError(
                f"cache index {self.path / 'index.json'} has a malformed record "
                f"({type(exc).__name__}: {exc}); {BUILD_HINT} to repair",
                path=str(self.path)) from None

    @functools.cached_property
    def gemm(self):
        """This cache's GEMM function: ``cache.gemm(a, b, out=None, *, c=None, bias=None, act=None, alpha=1.0, beta=1.0)``.

        See run/dispatch.py; ``cache.gemm.runner`` is the GemmRunner behind it.
        """
        from .dispatch import GemmRunner  # noqa: PLC0415 - dispatch imports torch; load does not

        return GemmRunner(self).entry()

    def stats(self) -> dict:
        """Hits, fallbacks and misses per signature and shape bucket (see run/stats.py)."""
        return self.counters.snapshot()

    # ------------------------------------------------------------ indexing
    def _sort(self, records: dict[str, dict]) -> None:
        tvm = _installed_tvm_ffi()
        tvm_minor = _minor(tvm) if tvm is not None else None
        # Prefer the runtime library most entries were built with; entries
        # tied to another runtime cannot share this process.
        counts: dict[str, int] = {}
        for rec in records.values():
            counts[rec["runtime"]] = counts.get(rec["runtime"], 0) + 1
        signatures: dict[str, tuple[dict, Signature]] = {}  # text -> (record's dict, Signature)
        loaded = next(iter(_RUNTIME_LOADED), None)
        self.runtime_sha = loaded or (max(counts, key=counts.get) if counts else None)
        for key, rec in records.items():
            reason = None
            built_tvm = rec["tvm_ffi"]
            if rec["abi"] not in SUPPORTED_ABIS and not rec["abi"].startswith("user:"):
                reason = f"ABI {rec['abi']!r} is not one this cutlass-aot can call"
            elif tvm_minor is not None and built_tvm != tvm and _minor(built_tvm) != tvm_minor:
                reason = (f"built with apache-tvm-ffi {built_tvm}, this process has {tvm}: "
                          f"rebuild ({BUILD_HINT}) with the tvm-ffi you deploy")
            elif rec["runtime"] != self.runtime_sha:
                reason = (f"built against another libcute_dsl_runtime "
                          f"({rec['runtime'][:12]}, this process uses {str(self.runtime_sha)[:12]}): "
                          f"rebuild ({BUILD_HINT}) with one nvidia-cutlass-dsl version")
            if reason:
                self.unusable[key] = reason
                continue
            entry = Entry(key, rec, signatures)
            self.entries[key] = entry
            self.by_signature.setdefault(entry.signature, []).append(entry)

    def signatures(self) -> list[Signature]:
        return sorted(self.by_signature, key=str)

    def nearest(self, sig: Signature, n: int = 3) -> list[Signature]:
        return sorted(self.by_signature, key=lambda s: (sig.distance(s), str(s)))[:n]

    def not_found(self, sig: Signature, extra: str = "") -> KernelNotFoundError:
        near = self.nearest(sig)
        skipped = [
            f"  {k[:12]}: {why}"
            for k, why in self.unusable.items()
        ][:3]
        lines = [f"no cutlass-aot artifact for {sig} in cache {self.path}."]
        if extra:
            lines.append(extra)
        fields = dict(sig.fields)
        if sig.op == "gemm" and fields.get("b") not in (None, fields.get("a")):
            lines.append(f"a is {fields.get('a')} and b is {fields.get('b')}: no builtin family takes "
                         "two input dtypes (wgmma and mma.sync take one, as torch.matmul does); "
                         "convert one of them.")
        if near:
            lines.append("nearest signatures in this cache:")
            lines += [f"  {s}" for s in near]
        else:
            lines.append("the cache has no usable entries.")
        if skipped:
            lines.append("entries skipped in this process:")
            lines += skipped
        if self.tables:
            gpus = ", ".join(sorted(f"{r['gpu']['name']} ({r['rows']} rows)" for r in self.tables.values()))
            lines.append(f"selection tables in this cache (used only on their GPU): {gpus}")
        lines.append(
            f"to add it: a manifest entry for arch {sig.arch} with "
            + ", ".join(f"{k}: {v if v is not None else 'null'}" for k, v in sig.fields)
            + f", then {BUILD_HINT}."
        )
        return KernelNotFoundError(
            "\n".join(lines), signature=str(sig), nearest=[str(s) for s in near],
            cache_dir=str(self.path),
        )

    # ---------------------------------------------------- selection tables
    def table_rows(self, sig: Signature, name: str, sm_count: int, capability: str):
        """Measured rows for ``sig`` on this GPU, {(M, N, K, L): (schedule, splits,
        runner-up label, margin, us)} (``tables.bind``), or None.

        The table is read, verified (size, sha256, format) and bound to this
        cache's entries once per GPU kind. A missing, corrupt or foreign
        table is not an error for a service: selection falls back to the
        model, and ``table_status`` says why (``cutlass-aot info`` shows it).
        """
        gpu = (name, sm_count, capability)
        bound = self._bound_tables.get(gpu)
        if bound is None:
            with self._load_lock:
                bound = self._bound_tables.get(gpu)
                if bound is None:
                    bound = self._bind_table(*gpu)
                    self._bound_tables[gpu] = bound
        return bound[0].get(sig.text())

    def table_status(self, name: str, sm_count: int, capability: str) -> dict:
        """How the selection table for this GPU was used: rows used, dropped and why."""
        self.table_rows(Signature.make("gemm", "-", {}), name, sm_count, capability)
        return self._bound_tables[(name, sm_count, capability)][1]

    def _bind_table(self, name: str, sm_count: int, capability: str) -> tuple[dict, dict]:
        matching = [rec for rec in self.tables.values()
                    if tables.gpu_matches(rec["gpu"], name, sm_count, capability)]
        if not matching:
            others = sorted({rec["gpu"].get("name", "?") for rec in self.tables.values()})
            why = ("no selection table in this cache" if not others else
                   f"the cache's tables were measured on {', '.join(others)}, not {name} "
                   f"({sm_count} SMs, sm {capability}): run `cutlass-aot tune` on this GPU")
            return {}, {"table": None, "reason": why}
        rec = matching[0]
        try:
            path = resolve_inside(self.path, rec["path"])
            data = path.read_bytes()
            if len(data) != rec["size"] or hashlib.sha256(data).hexdigest() != rec["sha256"]:
                raise IntegrityError(f"selection table {path} does not match its index record")
            doc = tables.parse_table_bytes(data, str(path))
            if doc["gpu"] != rec["gpu"]:  # store.read_table refuses this too (verify reports it)
                raise IntegrityError(f"selection table {path} was measured on {doc['gpu']}, but its "
                                     f"index record files it under {rec['gpu']}")
            entries = tables.entries_of((e.record, e.signature.text()) for e in self.entries.values())
            bound, counts = tables.bind(doc["rows"], entries)
        except (OSError, IntegrityError, TypeError, ValueError, KeyError) as exc:
            # whatever is wrong with the table, a call falls back to the model
            # (once: the answer is cached per GPU), never raises from it
            reason = f"selection table not used: {exc}; selection falls back to the model"
            warnings.warn(f"cutlass-aot: {reason}", RuntimeWarning, stacklevel=3)
            return {}, {"table": rec["path"], "reason": reason}
        return bound, {"table": rec["path"], "reason": None, **counts}

    def archs(self) -> list[str]:
        """The archs of this cache's usable entries, sorted."""
        return sorted({s.arch for s in self.by_signature})

    def arch_not_found(self, sig: Signature, device_arch: str) -> KernelNotFoundError | None:
        """The error for a call on a device no entry of this cache can run on.

        Returns None when some usable entry targets an arch in
        ``runnable_archs(device_arch)`` (the call then misses on its fields,
        and ``not_found`` says which); otherwise a KernelNotFoundError naming
        the device's arch, the archs it can run and the archs the cache holds,
        with the manifest to build. The dispatcher raises what this returns.
        """
        have = self.archs()
        runnable = runnable_archs(device_arch)
        if any(a in runnable for a in have):
            return None
        lines = [
            f"no cutlass-aot artifact in cache {self.path} runs on this GPU: the device is "
            f"{device_arch}, which runs code built for {', '.join(runnable)}; the cache holds "
            f"entries for {archs_text(have)}.",
            f"the call's signature: {sig}.",
            f"to serve it, build a manifest with `arch: {device_arch}` (the shipped one is "
            f"configs/{_config_for(device_arch)}) into this cache: `cutlass-aot build "
            f"configs/{_config_for(device_arch)} --cache-dir {self.path}`.",
        ]
        return KernelNotFoundError(
            "\n".join(lines), signature=str(sig), device_arch=device_arch,
            cache_archs=have, cache_dir=str(self.path),
        )

    # ------------------------------------------------------------- loading
    def function(self, key: str):
        """The loaded tvm_ffi function of an entry (verified, loaded once)."""
        fn = self._functions.get(key)
        if fn is not None:
            return fn
        with self._load_lock:
            fn = self._functions.get(key)
            if fn is None:
                fn = self._load(key)
                self._functions[key] = fn
        return fn

    def _load(self, key: str):
        entry = self.entries.get(key)
        if entry is None:
            why = self.unusable.get(key, "not in the index")
            raise KernelNotFoundError(f"cache entry {key[:16]} cannot be used: {why}", key=key)
        rec = entry.record
        lib = resolve_inside(self.path, rec["path"])
        check_trusted_paths(self.path, [lib.parent])
        try:
            size = lib.stat().st_size
        except FileNotFoundError:
            raise IntegrityError(
                f"artifact {lib} listed in the index is missing; {BUILD_HINT} to repair",
                path=str(lib), key=key,
            ) from None
        data = lib.read_bytes() if size == rec["size"] else b""
        if hashlib.sha256(data).hexdigest() != rec["sha256"]:
            raise IntegrityError(
                f"artifact {lib} does not match its index record (size or sha256); "
                f"refusing to load it. Run `cutlass-aot verify` and {BUILD_HINT} to repair",
                path=str(lib), key=key,
            )
        self._ensure_runtime(rec["runtime"])
        module = _load_verified(lib, data)
        try:
            return getattr(module, rec["symbol"])
        except AttributeError:
            raise IntegrityError(
                f"artifact {lib} has no function {rec['symbol']!r}; {BUILD_HINT} to repair",
                path=str(lib), key=key) from None

    def _ensure_runtime(self, sha: str) -> None:
        with _RUNTIME_LOCK:
            if sha in _RUNTIME_LOADED:
                return
            if _RUNTIME_LOADED:
                raise CacheError(
                    f"this process already loaded another libcute_dsl_runtime "
                    f"({next(iter(_RUNTIME_LOADED))[:12]}); entries built against "
                    f"{sha[:12]} cannot share it: rebuild with one nvidia-cutlass-dsl version"
                )
            path, held = self._find_runtime(sha)
            _RUNTIME_LOADED[sha] = _dlopen_verified(path, held)

    def _find_runtime(self, sha: str) -> tuple[Path, int | bytes]:
        """The first candidate whose bytes hash to ``sha``: (its path, those
        bytes held in a memfd, or in memory where there is no memfd;
        ``_runtime_bytes``)."""
        candidates: list[Path] = []
        rec = self.runtimes.get(sha)
        if rec and rec.get("path"):
            bundled = resolve_inside(self.path, rec["path"])
            # The bundled copy is code from the cache: its directories get the
            # same trust check as the cache root.
            check_trusted_paths(self.path, [bundled.parent.parent, bundled.parent])
            candidates.append(bundled)
        explicit = knobs.get("RUNTIME_LIB")
        if explicit:
            candidates.append(Path(explicit))
        spec = importlib.util.find_spec("nvidia_cutlass_dsl")
        if spec is not None and spec.submodule_search_locations:
            for base in spec.submodule_search_locations:
                candidates += sorted(Path(base).glob("cu*/lib/libcute_dsl_runtime.so"))
        for cand in candidates:
            held = _runtime_bytes(cand, sha) if cand.is_file() else None
            if held is not None:
                return cand, held
        tried = ", ".join(str(c) for c in candidates) or "nothing"
        raise CacheError(
            f"no libcute_dsl_runtime.so with sha256 {sha[:16]}... (the one these "
            f"artifacts were built against) was found; tried {tried}. Build with the "
            "runtime bundled (the default), set CUTLASS_AOT_RUNTIME_LIB, or install "
            "the matching nvidia-cutlass-dsl-libs package",
            sha256=sha,
        )


def _memfd(name: str, data: bytes) -> int | None:
    """An anonymous in-memory file holding ``data``, or None where there is none."""
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None
    try:
        _write_all(fd, data)
    except OSError:
        os.close(fd)
        return None
    return fd


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` at ``fd``'s offset (os.write may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _runtime_bytes(path: Path, sha: str) -> int | bytes | None:
    """``path``'s bytes if they hash to ``sha``: in a memfd (its descriptor;
    the caller closes it), or in memory where there is no memfd; None if they
    do not match or cannot be read.

    The runtime is 40+ MB and every process loads it once, so its bytes go
    file -> memfd inside the kernel (``sendfile``) and are hashed from a
    read-only map of the memfd: what is hashed is what ``_dlopen_verified``
    loads, with no copy through Python (r44: 0.09 s of a cold first GEMM on
    the H200 went to reading, hashing and writing these bytes, 0.03 s of it to
    the two copies). The memfd is then sealed against writes.
    """
    try:
        fd = os.memfd_create("cutlass-aot-runtime", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError):
        fd = None
    if fd is None:
        try:
            data = path.read_bytes()
        except OSError:
            return None
        return data if data and hashlib.sha256(data).hexdigest() == sha else None
    try:
        with open(path, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            done = 0
            try:
                while done < size:
                    sent = os.sendfile(fd, src.fileno(), done, size - done)
                    if sent == 0:
                        break
                    done += sent
            except OSError:  # a file system that refuses sendfile: copy through user space
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                data = src.read()
                _write_all(fd, data)
                done = len(data)
        if done == 0 or done != os.fstat(fd).st_size:
            raise OSError("short copy")
        with mmap.mmap(fd, done, prot=mmap.PROT_READ) as view:
            digest = hashlib.sha256(view).hexdigest()
        if digest != sha:
            raise OSError("digest")
        import fcntl  # noqa: PLC0415 - POSIX only, as memfd is

        if hasattr(fcntl, "F_ADD_SEALS"):  # a Python built without the seals: the memfd is private anyway
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                        | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    except (OSError, ValueError):
        os.close(fd)
        return None
    return fd


def _path_load_refused(path: Path, why: str) -> CacheError:
    return CacheError(
        f"cannot load {path} from its verified bytes ({why}); loading the file by its "
        "path would let it be swapped between the check and dlopen. Refusing: give this "
        "process a memfd-capable Linux kernel and a writable temp dir, or set "
        "CUTLASS_AOT_ALLOW_PATH_LOAD=1 to accept loading the checked path",
        path=str(path))


def _dlopen_verified(path: Path, held: int | bytes):
    """dlopen (RTLD_GLOBAL) exactly the bytes that were hashed: ``held`` is a
    memfd holding them (``_runtime_bytes``; closed here) or the bytes.

    The runtime has a SONAME (libcute_dsl_runtime.so), so artifacts that
    list it as DT_NEEDED resolve to this copy whatever path it was opened by.
    """
    fd = held if isinstance(held, int) else _memfd("cutlass-aot-runtime", held)
    if fd is None:
        if not knobs.allow_path_load():
            raise _path_load_refused(path, "memfd_create is unavailable")
        return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    try:
        return ctypes.CDLL(f"/proc/self/fd/{fd}", mode=ctypes.RTLD_GLOBAL)
    finally:
        os.close(fd)


def _config_for(device_arch: str) -> str:
    """The shipped manifest for a device arch: sm_90a -> sm90.yaml."""
    return f"sm{device_arch[3:].rstrip('a')}.yaml"


def _load_verified(lib: Path, data: bytes):
    """tvm_ffi-load exactly the bytes that were hashed.

    The bytes go into an anonymous memfd and are loaded through a private
    symlink named *.so (tvm_ffi picks its loader by extension), so a file
    swapped in the cache between the hash check and dlopen cannot be what
    runs. Where memfd or a private temp dir is unavailable (non-Linux, no
    writable temp), loading is refused unless CUTLASS_AOT_ALLOW_PATH_LOAD=1.
    """
    import tempfile  # noqa: PLC0415 - first artifact load only

    import tvm_ffi  # noqa: PLC0415 - loaded with the first artifact, not at import

    fd = _memfd("cutlass-aot-artifact", data)
    if fd is None:
        if not knobs.allow_path_load():
            raise _path_load_refused(lib, "memfd_create is unavailable")
        return tvm_ffi.load_module(str(lib))
    try:
        try:
            tmp = tempfile.mkdtemp(prefix="cutlass-aot-load-")
        except OSError as exc:
            if not knobs.allow_path_load():
                raise _path_load_refused(lib, f"no private temp dir: {exc.strerror}") from None
            return tvm_ffi.load_module(str(lib))
        link = os.path.join(tmp, "kernel.so")
        try:
            os.symlink(f"/proc/self/fd/{fd}", link)
            return tvm_ffi.load_module(link)
        finally:
            try:
                os.unlink(link)
            except OSError:
                pass
            os.rmdir(tmp)
    finally:
        os.close(fd)


_OPEN: dict[tuple[str, str], Cache] = {}
_OPEN_LOCK = threading.Lock()


def open_cache(path: str | os.PathLike | None = None, on_miss: str | None = None) -> Cache:
    """Open (once per process and on_miss policy) the cache at ``path`` or the default location.

    ``on_miss``: ``"raise"`` or ``"torch"`` (see Cache); None takes
    $CUTLASS_AOT_ON_MISS, default ``"raise"``. The two policies get two Cache
    objects (each with its own stats) over the same directory.
    """
    target = (Path(path) if path is not None else knobs.default_cache_dir()).expanduser().absolute()
    policy = knobs.on_miss() if on_miss is None else on_miss
    key = (str(target), policy)
    cache = _OPEN.get(key)
    if cache is None:
        with _OPEN_LOCK:
            cache = _OPEN.get(key)
            if cache is None:
                cache = Cache(target, on_miss=policy)
                _OPEN[key] = cache
    return cache
