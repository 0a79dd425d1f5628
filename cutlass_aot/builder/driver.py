"""Build driver: manifests -> plan -> (locked) compiles -> published cache entries.

Build side. For each planned key that is not already a verified entry, the
builder takes the key's lock *before* compiling and re-reads the index after
acquiring it (another builder may have published meanwhile), so concurrent
builds on one cache never compile the same key twice. Keys another process
holds are polled while our own compiles run, and built here (in parallel with
the rest) if that process died without publishing them. Locks are taken
lazily, as compile slots free up (at most ``jobs`` beyond those in flight):
each is an open file, so a plan of thousands of keys needs no more of them
than a small one.

Compiles run in ``spawn`` worker processes, at most ``jobs`` at a time. A
worker that dies outright (SIGSEGV, the OOM killer) breaks a
ProcessPoolExecutor and fails every job it holds; the driver then starts a
new pool for the jobs not yet started, and runs each job that was in flight
once more alone in its own process. The one whose own process dies again is
reported failed with its signal; the innocent ones are built. Every key lock
the driver takes is released on every path out of ``build``.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import multiprocessing.connection
import resource
import shutil
import signal
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

from .. import knobs
from ..errors import BuildError, CacheError, UsageError
from ..layout import RUNTIME_LIB_NAME
from . import compile as compile_stage
from .manifest import Manifest
from .plan import Job, Shard, compile_options, plan, shard_jobs
from .store import CacheStore, trace

# How often keys held by another builder are polled.
_POLL_S = 0.25


@dataclass
class BuildReport:
    built: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    seconds: float = 0.0
    total: int = 0
    shard: dict | None = None  # shard_jobs' report under --shard I/N

    def as_dict(self) -> dict:
        extra = {"shard": self.shard} if self.shard is not None else {}
        return extra | {
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


def _death(exitcode: int | None) -> str:
    """Words for how a worker process ended without a result."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (the OOM killer sends SIGKILL: lower --jobs or add memory)" if name == "SIGKILL" else ""
        return f"the compiler process was killed by {name}{hint}"
    return f"the compiler process exited with status {exitcode} without a result"


def _leave_sigint_to_the_parent() -> None:
    """In a compile process: ignore SIGINT, then take the signal mask it was
    started with (SIGINT blocked, ``_sigint_blocked``) off, so a Ctrl-C that
    came while it started is dropped rather than raised mid-import."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT held back in this thread (it stays pending, and is raised when
    the block ends). A process started inside inherits the block, so it can
    never see a Ctrl-C before ``_leave_sigint_to_the_parent`` runs."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _pool_worker() -> None:
    """Pool initializer. A terminal's Ctrl-C reaches the whole process group:
    the workers leave it to the parent, which stops them (``_Pool.kill``) and
    reports once, instead of each printing a KeyboardInterrupt traceback."""
    _leave_sigint_to_the_parent()
    compile_stage.warm_worker()


def _run_alone_worker(payload: dict, tmp_root: str, conn) -> None:
    """A one-job process (a retry after a worker died), SIGINT left to the parent."""
    _leave_sigint_to_the_parent()
    compile_stage.run_alone(payload, tmp_root, conn)


class _Pool:
    """A ProcessPoolExecutor that is replaced when a worker dies."""

    def __init__(self, workers: int):
        self.workers = workers
        self.ctx = multiprocessing.get_context("spawn")
        self._pool: ProcessPoolExecutor | None = None
        self._alone: list = []  # run_alone's processes while they run

    def submit(self, *args) -> Future:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=self.ctx,
                                             initializer=_pool_worker)
        with _sigint_blocked():  # a submit may start a worker (spawn starts them on demand)
            return self._pool.submit(*args)

    def discard(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def kill(self) -> None:
        """Stop every worker now, mid-compile (an interrupted build), run_alone's
        processes too; nothing they held is published (the caller removes their
        work dirs: _Run._drop_staging)."""
        for proc in self._alone:
            proc.terminate()
        if self._pool is not None:
            # ProcessPoolExecutor has no public terminate before Python 3.14
            for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
                proc.terminate()
            self.discard()

    def run_alone(self, payloads: list[dict], tmp_root: str) -> list[dict]:
        """Run each payload in its own process, all at once; a death is a result."""
        running = []
        for payload in payloads:
            recv, send = self.ctx.Pipe(duplex=False)
            proc = self.ctx.Process(target=_run_alone_worker, args=(payload, tmp_root, send),
                                    daemon=True)
            with _sigint_blocked():
                proc.start()
            self._alone.append(proc)
            send.close()
            running.append((payload, proc, recv))
        results = []
        for payload, proc, recv in running:
            result = None
            try:
                multiprocessing.connection.wait([recv, proc.sentinel])
                if recv.poll():
                    result = recv.recv()
            except (EOFError, OSError):
                result = None
            proc.join()
            self._alone.remove(proc)
            recv.close()
            if result is None:
                why = _death(proc.exitcode)
                result = {"key": payload["key"], "ok": False, "error": why,
                          "output": f"{why}; it was retried alone after its worker pool broke, "
                                    "and its own process died again", "seconds": 0.0}
            results.append(result)
        return results


def build(
    manifests: list[Manifest],
    cache_dir: Path,
    *,
    jobs: int,
    arch_filter: tuple[str, ...] = (),
    bundle_runtime: bool = True,
    progress: Progress | None = None,
    planned: list[Job] | None = None,
    shard: Shard | None = None,
) -> BuildReport:
    """Build every variant of the manifests that the cache lacks.

    ``planned``: the jobs of ``plan(manifests, arch_filter)`` if the caller
    already made them (the CLI does, to show and check the count).
    With ``shard``, only that deterministic slice of the plan (plan.shard_jobs).
    """
    t0 = time.perf_counter()
    report = BuildReport()
    todo_all = planned if planned is not None else plan(manifests, arch_filter)
    if shard is not None:  # a bad slice count is refused before the cache is touched
        if shard.count > max(1, len(todo_all)):
            # shard_jobs makes N slices (and reports N sizes): an N past the
            # plan would only be empty slices, and a huge one exhausts memory.
            raise UsageError(
                f"--shard {shard}: the manifests plan {len(todo_all)} keys, too few for "
                f"{shard.count} slices; use N <= {len(todo_all)} (one slice per key at most)",
                shard=str(shard), planned=len(todo_all))
        todo_all, report.shard = shard_jobs(todo_all, shard)
    store = CacheStore(cache_dir)
    store.ensure()
    report.total = len(todo_all)
    notify = progress or (lambda *_: None)
    trace("build-start", total=len(todo_all))

    store.sweep_tmp(older_than_s=86400)
    index, notes = store.load_index()
    report.repaired.extend(notes)
    # Persist a repaired (or first, empty) index now: a build with nothing to
    # compile must still leave a readable cache behind. update_index repairs
    # again under the lock, from what is on disk then.
    if notes or not store.has_index():
        store.update_index(lambda idx: None)
    verified = {job.key for job in todo_all if store.entry_ok(index, job.key)}
    bad_runtimes = _restore_runtimes(store, index, verified, report) if bundle_runtime else set()
    missing: list[Job] = []
    for job in todo_all:
        if job.key in verified and index["entries"][job.key]["runtime"] not in bad_runtimes:
            report.cached.append(job.key)
            notify("cached", job, {})
        else:
            if job.key in verified:
                report.repaired.append(f"entry {job.key[:16]}: its bundled runtime is missing and no "
                                       "installed nvidia-cutlass-dsl has it; rebuilding")
            elif job.key in index["entries"]:
                report.repaired.append(f"entry {job.key[:16]} failed verification; rebuilding")
            missing.append(job)
    if missing:
        _Run(store, report, notify, jobs, bundle_runtime, bad_runtimes).run(missing)
    report.seconds = time.perf_counter() - t0
    trace("build-done")
    return report


def _restore_runtimes(store: CacheStore, index: dict, keys: set[str], report: BuildReport) -> set[str]:
    """Put back the bundled runtimes of verified entries whose file is gone or
    altered (store.restore_runtimes: from a copy with the same sha256, under
    the index lock), so that a bundling build never counts an entry cached
    that a host without the DSL cannot load. Returns the runtime shas no copy
    of was found: their entries are rebuilt, which bundles what they link."""
    used = {index["entries"][key]["runtime"] for key in keys}
    restored, bad = store.restore_runtimes(index, only=used)
    report.repaired.extend(f"runtime {sha[:16]} was missing or altered; restored from the installed "
                           "nvidia-cutlass-dsl" for sha in restored)
    return set(bad)


class _Run:
    """One build's compile-and-publish loop, and every key lock it holds."""

    def __init__(self, store: CacheStore, report: BuildReport, notify: Progress, jobs: int,
                 bundle_runtime: bool, bad_runtimes: set[str] | None = None):
        self.store, self.report, self.notify = store, report, notify
        self.bundle_runtime = bundle_runtime
        # Bundled runtimes found missing with no copy to restore: entries using
        # them are rebuilt, not taken as cached, until a publish re-places them.
        self.bad_runtimes = set(bad_runtimes or ())
        self.workers = max(1, jobs)
        self.held: dict[str, object] = {}
        self.runtimes: dict[str, dict] = {}

    def run(self, missing: list[Job]) -> None:
        pool = _Pool(min(self.workers, len(missing)))
        try:
            self._loop(missing, pool)
        except (OSError, CacheError) as exc:
            # A CacheError may be an OSError reworded (an unreadable index):
            # out of descriptors, its advice would be wrong.
            cause = exc if isinstance(exc, OSError) else exc.__cause__ or exc.__context__
            if isinstance(cause, OSError) and cause.errno in (errno.EMFILE, errno.ENFILE):
                raise _fd_limit_error(cause, self.workers) from None
            raise
        except KeyboardInterrupt:
            # a second Ctrl-C waits until the cleanup is done (then raises)
            with _sigint_blocked():
                pool.kill()  # not wait for compiles in flight; what was published stays
                self._drop_staging()
            raise
        finally:
            pool.discard()
            for lock in self.held.values():
                try:
                    lock.release()
                except Exception:  # noqa: BLE001 - release the rest whatever happens
                    pass
            self.held.clear()

    def _drop_staging(self) -> None:
        """Remove the work dirs of the compiles just killed: keys we hold
        locked, so no other build compiles them (compile.py names each
        ``build-<key[:12]>-*``)."""
        tmp = Path(self.store.tmp_dir())
        for key in self.held:
            for work in tmp.glob(f"build-{key[:12]}-*"):
                shutil.rmtree(work, ignore_errors=True)

    def _claim(self, job: Job, timeout: float) -> str:
        """Lock the key: "build" (we hold it), "cached" (someone built it) or "busy"."""
        lock = self.store.acquire_key(job.key, timeout)
        if lock is None:
            return "busy"
        try:
            fresh, _ = self.store.load_index()
            ok = self.store.entry_ok(fresh, job.key) and self._runtime_ok(fresh, job.key)
        except BaseException:
            lock.release()
            raise
        if ok:
            lock.release()
            self.report.cached.append(job.key)
            self.notify("cached", job, {"by": "another build"})
            return "cached"
        self.held[job.key] = lock
        return "build"

    def _runtime_ok(self, index: dict, key: str) -> bool:
        """False while the listed entry's bundled runtime is one found missing
        at the start and still not back in place (another build may put it back)."""
        sha = index["entries"][key]["runtime"]
        if sha not in self.bad_runtimes:
            return True
        rec = index["runtimes"].get(sha)
        if rec is None or not rec.get("path") or self.store.runtime_file_ok(rec):
            self.bad_runtimes.discard(sha)
            return True
        return False

    def _loop(self, missing: list[Job], pool: _Pool) -> None:
        # Keys are locked lazily, just before they can be compiled: at most
        # ``workers`` locks beyond the compiles in flight. Each lock is an open
        # file, so claiming a whole plan up front (960 keys for the shipped
        # configs) would exhaust a modest `ulimit -n`. The protocol is the
        # same: a key is locked before its compile and held until its publish.
        pending: deque[Job] = deque(missing)  # not yet tried: no lock held
        ready: deque[Job] = deque()  # locked by us, not yet submitted
        waiting: list[tuple[Job, float]] = []  # another process holds them: (job, deadline)
        inflight: dict[Future, Job] = {}
        tmp = self.store.tmp_dir()

        def room() -> bool:
            return len(ready) + len(inflight) < pool.workers

        while pending or ready or waiting or inflight:
            while pending and room():
                job = pending.popleft()
                state = self._claim(job, timeout=0)
                if state == "build":
                    ready.append(job)
                elif state == "busy":
                    waiting.append((job, time.monotonic() + knobs.lock_timeout()))
            while ready and len(inflight) < pool.workers:
                job = ready.popleft()
                try:
                    inflight[pool.submit(compile_stage.build_variant, _job_payload(job), tmp)] = job
                    trace("compile-start", key=job.key)
                except BrokenProcessPool:
                    ready.appendleft(job)
                    pool.discard()
            if waiting:
                # Polled while our own compiles run; claimed only when there is
                # room (a key found published meanwhile is resolved either way
                # once polled). A key still busy past its deadline fails.
                still = []
                for job, deadline in waiting:
                    if not room():
                        still.append((job, deadline))
                        continue
                    state = self._claim(job, timeout=0)
                    if state == "build":
                        ready.append(job)
                    elif state == "busy":
                        if time.monotonic() < deadline:
                            still.append((job, deadline))
                        else:
                            self._fail(job, "timed out waiting for another build's lock "
                                            "(CUTLASS_AOT_LOCK_TIMEOUT)", "")
                waiting = still
                if ready and len(inflight) < pool.workers:
                    continue
            if not inflight:
                if waiting and not pending and not ready:
                    time.sleep(_POLL_S)
                continue
            done, _ = wait(list(inflight), timeout=_POLL_S if waiting else None,
                           return_when=FIRST_COMPLETED)
            broken = False
            for fut in done:
                job = inflight.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    broken = True
                    inflight[fut] = job  # a suspect, with the rest in flight
                    continue
                self._finish(job, result)
            if broken:
                # Some worker died; every job in flight failed with it. Retry
                # each alone: its own process's exit status names the guilty.
                suspects = []
                for fut, job in inflight.items():
                    if fut.done() and fut.exception() is None:
                        self._finish(job, fut.result())  # finished before the break
                    else:
                        suspects.append(job)
                inflight.clear()
                pool.discard()
                trace("pool-broken", suspects=len(suspects))
                for job, result in zip(suspects, pool.run_alone([_job_payload(j) for j in suspects], tmp)):
                    self._finish(job, result)

    def _finish(self, job: Job, result: dict) -> None:
        try:
            if result["ok"]:
                runtime = self._runtime(result)
                self.store.publish(job.key, result["dir"], _record(job, result["seconds"]), runtime)
                self.report.built.append(job.key)
                self.notify("built", job, result)
            else:
                self._fail(job, result["error"], result.get("output", ""))
        except KeyboardInterrupt:
            # interrupted before its publish: its work dir would outlive the
            # key's lock, which _drop_staging reads (publish moved it if done)
            if result.get("dir"):
                shutil.rmtree(result["dir"], ignore_errors=True)
            raise
        finally:
            lock = self.held.pop(job.key, None)
            if lock is not None:
                lock.release()

    def _runtime(self, result: dict) -> dict:
        """The runtime record of the libcute_dsl_runtime.so the worker linked."""
        libs = [p for p in result.get("runtime_libs", ()) if Path(p).name == RUNTIME_LIB_NAME]
        path = libs[0] if libs else None
        if path not in self.runtimes:
            self.runtimes[path] = self.store.ensure_runtime(path, self.bundle_runtime)
        return self.runtimes[path]

    def _fail(self, job: Job, error: str, output: str) -> None:
        fail = {"key": job.key, "variant": job.describe(), "manifest": job.variant.source,
                "error": error, "output": output}
        self.report.failed.append(fail)
        self.notify("failed", job, fail)


def _fd_limit_error(exc: OSError, jobs: int) -> BuildError:
    """EMFILE/ENFILE as a BuildError that names the limit and what to do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    scope = ("the system-wide table of open files is full" if exc.errno == errno.ENFILE
             else f"this process may open {soft} files (`ulimit -n`; hard limit {hard})")
    return BuildError(
        f"the build ran out of file descriptors ({exc.strerror}): {scope}, and each compile "
        f"worker, key lock and pipe takes some. Raise the limit (e.g. `ulimit -n 4096`) or "
        f"lower --jobs (now {jobs}); finished entries are kept, so re-running the build "
        "continues where it stopped", open_files_limit=soft, jobs=jobs)


__all__ = ["build", "BuildReport", "BuildError"]
