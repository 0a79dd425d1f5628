"""Compile: one variant -> a linked shared library in a private temp dir.

Build side; runs in worker processes (``spawn``: the parent never imports the
CuTe DSL, and MLIR is not fork-safe). A worker imports the DSL once and
compiles many variants. Results are plain dicts so they pickle; failures come
back as data (the variant, the key, the compiler's message), never as a dead
pool.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import traceback
from typing import Any

from ..layout import ARTIFACT_NAME
from .family import load_family
from .plan import LINKER


def runtime_libraries() -> list[str]:
    """libcute_dsl_runtime.so and libtvm_ffi.so of the installed toolchain."""
    import cutlass.cute as cute  # noqa: PLC0415 - build workers only

    return list(cute.runtime.find_runtime_libraries(enable_tvm_ffi=True))


def build_variant(job: dict[str, Any], tmp_root: str) -> dict[str, Any]:
    """Compile, export and link one variant into a new dir under tmp_root.

    Returns {"key", "ok", "dir", "seconds"} or {"key", "ok": False, "error",
    "output"}. Never raises for a compile failure.
    """
    t0 = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix=f"build-{job['key'][:12]}-", dir=tmp_root)
    try:
        family = load_family(job["family"])
        compiled = family.compile(job["params"], job["arch"], job["options"])
        obj = os.path.join(workdir, "kernel.o")
        compiled.export_to_c(obj, function_name=job["symbol"])
        lib = os.path.join(workdir, ARTIFACT_NAME)
        link = subprocess.run(
            [LINKER, "-shared", "-o", lib, obj, *runtime_libraries()],
            capture_output=True,
            text=True,
        )
        if link.returncode != 0:
            raise RuntimeError(f"link failed ({LINKER} exit {link.returncode}): {link.stderr.strip()}")
        os.unlink(obj)
        return {"key": job["key"], "ok": True, "dir": workdir, "seconds": time.perf_counter() - t0}
    except Exception as exc:  # noqa: BLE001 - every failure is reported as data
        _remove_tree(workdir)
        message = f"{type(exc).__name__}: {exc}".strip()
        return {
            "key": job["key"],
            "ok": False,
            "error": message.splitlines()[0][:500] if message else type(exc).__name__,
            "output": (message + "\n" + traceback.format_exc())[-20000:],
            "seconds": time.perf_counter() - t0,
        }


def _remove_tree(path: str) -> None:
    import shutil  # noqa: PLC0415

    shutil.rmtree(path, ignore_errors=True)


def warm_worker() -> None:
    """Pool initializer: import the DSL once per worker, before the first job."""
    import cutlass.cute  # noqa: F401, PLC0415
