"""The C++ half of the dispatch entry: loading it, and why it is on or off.

Run side: standard library and tvm_ffi only. ``run/fastpath.cc``, built by
``build_scripts/build_fastpath.py`` into ``run/_fastpath.so`` (``make
install`` builds it), keeps a memo from a call's full tensor metadata (device,
dtype, shape and strides of a, b, out, the bias and c, and the activation) to
a loaded artifact, and calls it, unless ``out`` shares memory with what the
kernel reads (select.check_no_alias: such a call falls to the Python path,
which names the operand);
run/dispatch.py resolves each new call in Python and registers the answer
there. A call then costs one tvm-ffi call plus a hash lookup in C++, instead
of the Python key (five tensor reads, a tuple hash) and a dict lookup.

The split follows a common pattern for cheap calls into compiled kernels:
resolve and check once in the host language, then serve repeats from a
native cache keyed on the arguments' metadata (torch.compile's guards in
front of a compiled graph, Triton's generated C launcher). Here the native
side keys on every tensor field, so it never needs a guard of its own.

It is used only when the library's stamp (the sha256 of the fastpath.cc it
was built from, and the tvm-ffi version) matches the installed source and
tvm-ffi: a stale or foreign library is refused, never called. Without it,
or with ``CUTLASS_AOT_FASTPATH=0``, dispatch is the Python entry, with the
same results. ``cutlass-aot info`` says which, and why.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path

from .. import knobs
from ..signature import GEMM_ACTS

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fastpath.cc"
LIBRARY = HERE / "_fastpath.so"


def expected_stamp() -> str:
    """The stamp a library built from the installed source carries."""
    import tvm_ffi  # noqa: PLC0415

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return f"{digest}+tvm-ffi-{tvm_ffi.__version__}"


# The activation codes call_bias and register_bias key on: an activation's
# place in signature.GEMM_ACTS, None as "none". An act not here (a typo) is
# never looked up; the Python path raises its ArgumentError.
ACT_CODES: dict = {None: 0, **{name: i for i, name in enumerate(GEMM_ACTS)}}
# The code the plain entry (``call``: no bias, no activation) keys on, below
# every activation's (fastpath.cc's kNoAct).
NO_ACT = -1
# call_c's codes: an activation's code plus this (fastpath.cc's kWithC), so a
# missed call with C registers through register_c.
WITH_C = 1 << 16


@dataclass(frozen=True)
class FastPath:
    """The loaded library's entry points (tvm_ffi Functions)."""

    call: object      # call(table, a, b, out, alpha) -> 1 launched, 0 miss
    register: object  # register(table, a, b, out, fn, sms, splits, workspace_elems) -> 1 new, 2 replaced, 0
    clear: object     # clear(table) -> that table's entries dropped
    size: object      # size(table) -> that table's entries
    module: object    # keeps the library loaded
    call_bias: object      # call_bias(table, a, b, out, bias|None, act, alpha) -> 1 or 0
    register_bias: object  # register_bias(table, a, b, out, bias|None, act, fn, sms, splits,
    #                        workspace_elems) -> 1, or 0
    call_c: object      # call_c(table, a, b, out, bias|None, act, c, alpha, beta) -> 1 or 0
    register_c: object  # register_c(table, a, b, out, bias|None, act, c, fn, sms, splits,
    #                     workspace_elems) -> 1, or 0


_TABLES = itertools.count(1)


def new_table() -> int:
    """A table id for one runner: a call only hits what its runner registered."""
    return next(_TABLES)


_STATE: dict[str, object] = {}


def load() -> FastPath | None:
    """The fast path, or None (``status()`` says why); loaded once per process."""
    if "fast" not in _STATE:
        _STATE["fast"], _STATE["why"] = load_library(LIBRARY)
    return _STATE["fast"]  # type: ignore[return-value]


def load_library(path: Path) -> tuple[FastPath | None, str]:
    """(the library at ``path`` if this process may use it, else None; "on" or
    "off: <why>"). Reads CUTLASS_AOT_FASTPATH."""
    if not knobs.fastpath():
        return None, "off: CUTLASS_AOT_FASTPATH=0"
    if not path.is_file():
        return None, (f"off: {path.name} is not built (run `make install` or "
                      "`python build_scripts/build_fastpath.py`)")
    try:
        import tvm_ffi  # noqa: PLC0415

        module = tvm_ffi.load_module(str(path))
        stamp, want = str(module["stamp"]()), expected_stamp()
    except (OSError, RuntimeError, AttributeError, ValueError) as exc:
        return None, f"off: {path.name} did not load ({type(exc).__name__}: {exc})"
    if stamp != want:
        return None, (f"off: {path.name} was built from another source or tvm-ffi ({stamp}; "
                      f"installed {want}): rebuild it with `python build_scripts/build_fastpath.py`")
    return FastPath(module["call"], module["register"], module["clear"], module["size"],
                    module, module["call_bias"], module["register_bias"], module["call_c"],
                    module["register_c"]), "on"


def status() -> str:
    """"on", or "off: <why>"."""
    load()
    return str(_STATE["why"])
