"""How sm90_gemm's edge tiles read C, in the PTX they compile to (CPU).

An edge tile (the last row or column of tiles, where the tile runs past D)
must not read C past its end (r62's fix), but until r65 it did so by putting
each element's load behind its own bounds branch, and the loads went out one
at a time: at token counts off the tile every tile is an edge tile, and a
residual call ran 1.2-1.5x its time at the next whole tile (r65 call B,
benchmarks/results/2026-12-06_r65_notes.md). Since r65 an edge tile loads C at
each coordinate clamped into D, unbranched, a group of loads in flight at
once, and the split-K reduce pass loads its C before the partials.

Real compiles (the CuTe DSL told to keep its PTX) of a with-C variant and a
split-K one are read: the GEMM's edge group is a run of C loads with no
branch among them, and the reduce pass issues its C loads before its first
workspace load. The GPU suite checks the values (test_every_artifact_direct:
odd sizes, C poisoned past D's edge nowhere, since C ends where D does).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

from tests.test_sm90_pdl import _COMPILE, _entries

# One instruction per line: a global load of 16-bit elements (C's bf16) and
# anything that branches.
_C_LOAD = re.compile(r"^\s*ld\.global\.b16\b")
_BRANCH = re.compile(r"^\s*(@!?%p\w+\s+)?bra(\.uni)?\b")
_WS_LOAD = re.compile(r"^\s*(@!?%p\w+\s+)?ld\.global\.(b32|f32)\b")


def _ptx_entries(tmp_path, variant: dict) -> dict[str, str]:
    env = dict(os.environ, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", _COMPILE, repr(variant)], check=True, env=env,
                   capture_output=True, text=True, timeout=600)
    entries = {}
    for path in glob.glob(os.path.join(tmp_path, "**", "*.ptx"), recursive=True):
        with open(path) as f:
            entries.update(_entries(f.read()))
    assert entries, f"no PTX kept under {tmp_path}"
    return entries


def _longest_unbranched_c_run(body: str) -> int:
    """The most ``ld.global.b16`` (scalar C loads) with no branch between them."""
    best = run = 0
    for line in body.splitlines():
        if _C_LOAD.match(line):
            run += 1
            best = max(best, run)
        elif _BRANCH.match(line):
            run = 0
    return best


def test_edge_tiles_load_c_unbranched(tmp_path):
    # 128x64 with 128 consumer threads: 64 accumulators a thread, two groups of 32
    entries = _ptx_entries(tmp_path, {"tile": "128x64", "cluster": "1x1", "with_c": True})
    (body,) = entries.values()
    run = _longest_unbranched_c_run(body)
    assert run >= 32, (
        f"the longest run of scalar C loads without a branch is {run}: an edge tile's C loads "
        "are behind branches again (one load in flight at a time)")


def test_reduce_pass_loads_c_before_the_partials(tmp_path):
    entries = _ptx_entries(tmp_path, {"tile": "128x128", "cluster": "1x1", "split_k": True,
                                      "with_c": True})
    reduce = [body for name, body in entries.items() if "reduce_kernel" in name]
    assert len(reduce) == 1, sorted(entries)
    lines = reduce[0].splitlines()
    first_c = next((i for i, line in enumerate(lines) if _C_LOAD.match(line)), None)
    first_ws = next((i for i, line in enumerate(lines) if _WS_LOAD.match(line)), None)
    assert first_c is not None and first_ws is not None, "the pattern is stale: no C or no workspace load"
    assert first_c < first_ws, (
        f"the reduce pass's first C load (line {first_c}) comes after its first partial's "
        f"(line {first_ws}): C's latency no longer hides behind the partials")
