"""Build driver: manifests -> plan -> (locked) compiles -> published cache entries.

Build side. For each planned key that is not already a verified entry, the
builder takes the key's lock *before* compiling and re-reads the index after
acquiring it (another builder may have published meanwhile), so concurrent
builds on one cache never compile the same key twice. Keys another process
holds are waited for after our own compiles, then re-checked; if that
process died, we build them. Compiles run in ``spawn`` worker processes.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

from filelock import Timeout

from ..errors import BuildError
from . import compile as compile_stage
from .manifest import Manifest
from .plan import Job, compile_options, plan
from .store import CacheStore


@dataclass
class BuildReport:
    built: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    seconds: float = 0.0
    total: int = 0

    def as_dict(self) -> dict:
        return {
            "total": self.total,
            "built": len(self.built),
            "cached": len(self.cached),
            "failed": len(self.failed),
            "failures": self.failed,
            "repaired": self.repaired,
            "seconds": round(self.seconds, 3),
        }


Progress = Callable[[str, Job, dict], None]


def _job_payload(job: Job) -> dict:
    return {
        "key": job.key,
        "family": job.variant.family_ref,
        "params": job.variant.param_dict,
        "arch": job.variant.arch,
        "options": compile_options(job.variant.arch),
        "symbol": job.symbol,
    }


def _record(job: Job, seconds: float) -> dict:
    return {
        "key": job.key,
        "symbol": job.symbol,
        "abi": job.abi,
        "family": job.variant.family_ref,
        "signature": job.signature.as_dict(),
        "signature_text": job.signature.text(),
        "variant": job.variant.param_dict,
        "key_inputs": job.key_inputs,
        # The family's kernel-source digest: what binds selection-table rows
        # to this variant (tables.bind), whatever else the key covers.
        "kernel_sources": job.key_inputs["sources"],
        "manifest": job.variant.source,
        "build_seconds": round(seconds, 3),
    }


def build(
    manifests: list[Manifest],
    cache_dir: Path,
    *,
    jobs: int,
    arch_filter: tuple[str, ...] = (),
    bundle_runtime: bool = True,
    progress: Progress | None = None,
) -> BuildReport:
    """Build every variant of the manifests that the cache lacks."""
    t0 = time.perf_counter()
    report = BuildReport()
    store = CacheStore(cache_dir)
    store.ensure()
    todo_all = plan(manifests, arch_filter)
    report.total = len(todo_all)
    notify = progress or (lambda *_: None)

    store.sweep_tmp(older_than_s=86400)
    index, notes = store.load_index()
    report.repaired.extend(notes)
    if notes:
        # Persist the repaired index now: a build with nothing to compile
        # must still leave a readable cache behind.
        store.update_index(lambda idx: idx.update(entries=index["entries"], runtimes=index["runtimes"]))
    store.init_index()
    missing: list[Job] = []
    for job in todo_all:
        if store.entry_ok(index, job.key):
            report.cached.append(job.key)
            notify("cached", job, {})
        else:
            if job.key in index["entries"]:
                report.repaired.append(f"entry {job.key[:16]} failed verification; rebuilding")
            missing.append(job)
    if not missing:
        report.seconds = time.perf_counter() - t0
        return report

    runtime = None
    ctx = multiprocessing.get_context("spawn")
    held: dict[str, object] = {}
    deferred: list[Job] = []
    with ProcessPoolExecutor(
        max_workers=max(1, min(jobs, len(missing))),
        mp_context=ctx,
        initializer=compile_stage.warm_worker,
    ) as pool:
        futures: dict[Future, Job] = {}

        def submit(job: Job) -> None:
            futures[pool.submit(compile_stage.build_variant, _job_payload(job), store.tmp_dir())] = job

        def claim(job: Job, timeout: float) -> bool:
            """Lock the key; True if we must build it (no one else has)."""
            lock = store.key_lock(job.key)
            try:
                lock.acquire(timeout=timeout)
            except Timeout:
                return False
            fresh, _ = store.load_index()
            if store.entry_ok(fresh, job.key):
                lock.release()
                report.cached.append(job.key)
                notify("cached", job, {"by": "another build"})
                return False
            held[job.key] = lock
            return True

        for job in missing:
            if claim(job, timeout=0):
                submit(job)
            elif job.key not in report.cached:
                deferred.append(job)

        def drain(block_all: bool) -> None:
            nonlocal runtime
            while futures:
                done, _ = wait(list(futures), return_when=FIRST_COMPLETED)
                for fut in done:
                    job = futures.pop(fut)
                    try:
                        result = fut.result()
                    except BrokenProcessPool as exc:
                        result = {"key": job.key, "ok": False,
                                  "error": f"compiler worker died ({exc})", "output": ""}
                    try:
                        if result["ok"]:
                            if runtime is None:
                                runtime = store.ensure_runtime(_runtime_lib(), bundle_runtime)
                            store.publish(job.key, result["dir"], _record(job, result["seconds"]), runtime)
                            report.built.append(job.key)
                            notify("built", job, result)
                        else:
                            fail = {
                                "key": job.key,
                                "variant": job.describe(),
                                "manifest": job.variant.source,
                                "error": result["error"],
                                "output": result.get("output", ""),
                            }
                            report.failed.append(fail)
                            notify("failed", job, fail)
                    finally:
                        lock = held.pop(job.key, None)
                        if lock is not None:
                            lock.release()
                if not block_all:
                    return

        drain(block_all=True)
        # Keys another builder was compiling: wait for its lock, re-check.
        for job in deferred:
            try:
                must_build = claim(job, timeout=store.key_lock(job.key).timeout)
            except Timeout:
                must_build = False
            if must_build:
                submit(job)
                drain(block_all=True)
            elif job.key not in report.cached:
                report.failed.append({
                    "key": job.key, "variant": job.describe(), "manifest": job.variant.source,
                    "error": "timed out waiting for another build's lock "
                             "(CUTLASS_AOT_LOCK_TIMEOUT)", "output": "",
                })
    report.seconds = time.perf_counter() - t0
    return report


def _runtime_lib() -> str | None:
    """Path of libcute_dsl_runtime.so from the installed DSL (no DSL import)."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        for lib in sorted(Path(base).glob("cu*/lib/libcute_dsl_runtime.so")):
            return str(lib)
    return None


__all__ = ["build", "BuildReport", "BuildError"]
