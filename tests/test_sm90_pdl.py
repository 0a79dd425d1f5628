"""Programmatic dependent launch in sm90_gemm and gemv, read in the PTX they compile to (CPU).

Every kernel of an sm90_gemm or gemv artifact may start before the kernel ahead of it
on the stream has finished (kernels/sm90_gemm.py's module docstring), so it
must not touch global memory before ``griddepcontrol.wait``: a load before it
could read an operand the previous kernel is still writing, a store could be
overwritten. Here real compiles (the CuTe DSL told to keep its PTX) of a
plain, a split-K (two kernels: the GEMM and its reduce pass), a bias +
C variant and a decode GEMV with bias and C are read entry by entry: each waits before its first global or
bulk-tensor access and lets its dependents launch. The GPU suite runs them
(tests/gpu), under CUDA graphs and on two streams among others.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

_COMPILE = r"""
import sys
from cutlass_aot.kernels.gemv import GemvFamily
from cutlass_aot.kernels.sm90 import Sm90GemmFamily
variant = eval(sys.argv[1])
fam = GemvFamily() if variant.pop("gemv", False) else Sm90GemmFamily()
fam.compile(dict(fam.defaults) | {"a": "bf16"} | variant, "sm_90a",
            "--enable-tvm-ffi --gpu-arch sm_90a")
"""

# Instructions that read or write global memory (or go through it to L2).
_GLOBAL = re.compile(r"^\s*(@!?%p\w+\s+)?(ld\.global|st\.global|red\.global|atom\.global|"
                     r"cp\.async\.bulk\.tensor|cp\.reduce\.async\.bulk|ld\.volatile\.global|"
                     r"ld\.relaxed\.gpu\.global|ld\.acquire\.gpu\.global)", re.M)


def _entries(ptx: str) -> dict[str, str]:
    """Each ``.entry``'s name and body."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\w+)", ptx):
        start = m.end()
        nxt = ptx.find(".entry", start)
        out[m.group(1)] = ptx[start: nxt if nxt >= 0 else len(ptx)]
    return out


@pytest.mark.parametrize("variant", [
    {"tile": "128x64", "cluster": "1x1"},
    {"tile": "128x128", "cluster": "2x1", "split_k": True},
    {"tile": "128x128", "cluster": "1x1", "bias": "bf16", "act": "gelu", "with_c": True},
    {"gemv": True, "tile": "2x4", "bias": "bf16", "act": "silu", "with_c": True},
], ids=["plain", "split-k", "bias-gelu-c", "gemv"])
def test_every_kernel_waits_before_touching_global_memory(tmp_path, variant):
    variant = dict(variant)
    env = dict(os.environ, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", _COMPILE, repr(variant)], check=True, env=env,
                   capture_output=True, text=True, timeout=600)
    files = glob.glob(os.path.join(tmp_path, "**", "*.ptx"), recursive=True)
    assert files, f"no PTX kept under {tmp_path}"
    entries = {}
    for path in files:
        with open(path) as f:
            entries.update(_entries(f.read()))
    assert len(entries) == (2 if variant.get("split_k") else 1), sorted(entries)
    for name, body in entries.items():
        wait = body.find("griddepcontrol.wait")
        assert wait >= 0, f"{name}: no griddepcontrol.wait"
        assert "griddepcontrol.launch_dependents" in body, f"{name}: never lets its dependents launch"
        first = _GLOBAL.search(body)
        assert first is not None, f"{name}: no global access found (the pattern is stale)"
        assert wait < first.start(), (
            f"{name}: {first.group(2)} at offset {first.start()} before griddepcontrol.wait at {wait}")
