"""Compile: one variant -> a linked shared library in a private temp dir.

Build side; runs in worker processes (``spawn``: the parent never imports the
CuTe DSL, and MLIR is not fork-safe). A worker imports the DSL once and
compiles many variants. Results are plain dicts so they pickle; failures come
back as data (the variant, the key, the compiler's root cause and its full
output, without terminal colour codes), never as a dead pool. A worker that
dies outright (a signal, the OOM killer) is handled by the driver.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import tempfile
import threading
import time
import traceback
import warnings
from typing import Any

from ..layout import ARTIFACT_NAME
from .family import load_family
from .plan import LINKER, link_argv

# Colour and cursor sequences the DSL puts into its diagnostics.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _quiet_numpy_warning() -> None:
    # torch, imported by the DSL, warns "Failed to initialize NumPy" when NumPy
    # is absent. Nothing in a build uses NumPy; the warning only looks like an
    # error in the middle of a progress bar.
    warnings.filterwarnings("ignore", message=r"Failed to initialize NumPy", category=UserWarning)


def runtime_libraries() -> list[str]:
    """libcute_dsl_runtime.so and libtvm_ffi.so, as the DSL itself picks them."""
    import cutlass.cute as cute  # noqa: PLC0415 - build workers only

    return list(cute.runtime.find_runtime_libraries(enable_tvm_ffi=True))


def root_cause(exc: BaseException) -> str:
    """One line naming the innermost cause of a failure, with its file:line.

    The DSL wraps a user's error (a NameError in a kernel, say) in a
    DSLUserCodeError whose text starts with a blank line and colour codes;
    the useful part is the exception it was raised from.
    """
    chain, seen = [exc], {id(exc)}
    while True:
        nxt = chain[-1].__cause__ or chain[-1].__context__
        if nxt is None or id(nxt) in seen:
            break
        chain.append(nxt)
        seen.add(id(nxt))
    inner = chain[-1]
    text = next((ln.strip() for ln in strip_ansi(str(inner)).splitlines() if ln.strip()), "")
    line = f"{type(inner).__name__}: {text}" if text else type(inner).__name__
    tb = traceback.extract_tb(inner.__traceback__) if inner.__traceback__ else []
    if tb:
        line += f" ({tb[-1].filename}:{tb[-1].lineno} in {tb[-1].name})"
    if inner is not exc:
        line = f"{type(exc).__name__}: {line}"
    return line[:500]


def build_variant(job: dict[str, Any], tmp_root: str) -> dict[str, Any]:
    """Compile, export and link one variant into a new dir under tmp_root.

    Returns {"key", "ok", "dir", "seconds", "runtime_libs"} or {"key", "ok":
    False, "error", "output"}. Never raises for a compile failure.
    ``runtime_libs`` are the libraries the artifact was linked against; the
    first is libcute_dsl_runtime.so, which the cache records.
    """
    _quiet_numpy_warning()
    t0 = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix=f"build-{job['key'][:12]}-", dir=tmp_root)
    try:
        family = load_family(job["family"])
        compiled = family.compile(job["params"], job["arch"], job["options"])
        obj = os.path.join(workdir, "kernel.o")
        compiled.export_to_c(obj, function_name=job["symbol"])
        lib = os.path.join(workdir, ARTIFACT_NAME)
        runtime_libs = runtime_libraries()
        link = subprocess.run(link_argv(lib, obj, runtime_libs), capture_output=True, text=True)
        if link.returncode != 0:
            raise RuntimeError(f"link failed ({LINKER} exit {link.returncode}): {link.stderr.strip()}")
        os.unlink(obj)
        return {"key": job["key"], "ok": True, "dir": workdir, "seconds": time.perf_counter() - t0,
                "runtime_libs": runtime_libs}
    except Exception as exc:  # noqa: BLE001 - every failure is reported as data
        _remove_tree(workdir)
        output = strip_ansi(f"{type(exc).__name__}: {exc}\n" + traceback.format_exc())
        return {
            "key": job["key"],
            "ok": False,
            "error": root_cause(exc),
            "output": output[-20000:],
            "seconds": time.perf_counter() - t0,
        }


def _remove_tree(path: str) -> None:
    import shutil  # noqa: PLC0415

    shutil.rmtree(path, ignore_errors=True)


def exit_with_parent(poll_s: float = 1.0) -> None:
    """End this worker when the build that started it is gone.

    A pool worker waits on its job queue forever when the build dies without
    shutting the pool down (SIGTERM from `timeout` or a CI runner, SIGKILL,
    the OOM killer); measured here, two workers outlived a SIGTERM'd build
    by an hour, each holding the DSL's half a gigabyte. A daemon thread
    compares the parent's pid with the one that spawned us, once a second.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    expected = parent.pid

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != expected:
                os._exit(1)  # no result can reach a dead build; a later build sweeps its temp dir

    threading.Thread(target=watch, name="cutlass-aot-exit-with-parent", daemon=True).start()


def run_alone(job: dict[str, Any], tmp_root: str, conn) -> None:
    """Entry point of a one-job process (a retry after a worker died)."""
    warm_worker()
    conn.send(build_variant(job, tmp_root))
    conn.close()


def warm_worker() -> None:
    """Pool initializer: import the DSL once per worker, before the first job."""
    exit_with_parent()
    _quiet_numpy_warning()
    import cutlass.cute  # noqa: F401, PLC0415
