"""cutlass-aot: ahead-of-time CuTe DSL GEMM kernels, served from an on-disk cache.

This is the run side's public API, what an inference service imports. It
imports only the standard library, torch and (at the first artifact load)
tvm_ffi: never the CuTe DSL, never the build side (``cutlass_aot.builder`` and
``cutlass_aot.cli`` are imported only by the ``cutlass-aot`` command).

    import cutlass_aot
    y = cutlass_aot.gemm(x, w.t())                      # default cache
    cache = cutlass_aot.open_cache("/opt/kernels")      # explicit cache
    cache.gemm(x, w.t(), out=y)
"""

from __future__ import annotations

from ._version import __version__
from .errors import (
    ArgumentError,
    BuildError,
    CacheError,
    CutlassAotError,
    IntegrityError,
    KernelNotFoundError,
    LaunchError,
    ManifestError,
)
from .run.load import Cache, open_cache

_default_runner = None


def gemm(a, b, out=None, *, c=None, bias=None, act=None, alpha=1.0, beta=1.0):
    """D = act(alpha * a @ b + beta * c + bias) from the default cache; returns ``out``.

    2-D a[M,K] @ b[K,N] -> out[M,N] or batched 3-D a[L,M,K] @ b[L,K,N];
    ``bias`` a vector of length N; ``act`` none, relu, gelu, gelu_erf or silu.
    The default cache is CUTLASS_AOT_CACHE_DIR or the platform cache dir.
    """
    runner = _default_runner
    if runner is None:
        runner = _init_default()
    return runner(a, b, out, c=c, bias=bias, act=act, alpha=alpha, beta=beta)


def _init_default():
    global _default_runner
    _default_runner = open_cache().gemm
    return _default_runner


__all__ = [
    "__version__",
    "gemm",
    "open_cache",
    "Cache",
    "CutlassAotError",
    "ArgumentError",
    "BuildError",
    "CacheError",
    "IntegrityError",
    "KernelNotFoundError",
    "LaunchError",
    "ManifestError",
]
