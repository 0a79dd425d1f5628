"""The dispatch entry's C++ half (run/fastpath.cc, loaded by run/fastpath.py).

Real library, real tvm-ffi calls: the "artifacts" registered here are tvm-ffi
Functions made from Python callables, so the table's keying, the argument
order it calls with, the split-K scratch it allocates and the errors it
passes on are checked without a GPU (tests/gpu run it with real artifacts).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cutlass_aot import knobs
from cutlass_aot.errors import UsageError
from cutlass_aot.run import fastpath

ROOT = Path(__file__).resolve().parent.parent

needs_compiler = pytest.mark.skipif(
    not (shutil.which("c++") or shutil.which("g++")),
    reason="no C++ compiler: the fast path is not built (dispatch stays all Python)")


@pytest.fixture(scope="module")
def fast():
    if not fastpath.LIBRARY.is_file():
        subprocess.run([sys.executable, str(ROOT / "build_scripts/build_fastpath.py"), "--require"],
                       check=True)
    lib, why = fastpath.load_library(fastpath.LIBRARY)
    assert lib is not None, why
    return lib


def _linear(m=128, n=512, k=256, dt=torch.bfloat16):
    a = torch.randn(m, k, dtype=dt)
    b = torch.randn(n, k, dtype=dt).t()
    return a, b, torch.empty(m, n, dtype=dt)


@needs_compiler
def test_a_registered_layout_is_served_with_the_artifact_abi(fast):
    table = fastpath.new_table()
    a, b, out = _linear()
    seen = []
    artifact = _artifact(seen)
    assert fast.call(table, a, b, out, 1.5) == 0  # nothing registered: a miss
    assert fast.register(table, a, b, out, artifact, 132, -1, 0) == 1
    assert fast.size(table) == 1
    # the same key again replaces its entry, and says so (dispatch counts
    # only new keys toward its clear)
    assert fast.register(table, a, b, out, artifact, 132, -1, 0) == 2
    assert fast.size(table) == 1
    assert fast.call(table, a, b, out, 1.5) == 1
    args = seen[-1]
    assert len(args) == 5 and args[3:] == (1.5, 132)  # a, b, d, alpha, sm_count
    assert [tuple(t.shape) for t in args[:3]] == [(128, 256), (256, 512), (128, 512)]
    # Other tensors of the same layout are served too (the key is metadata).
    a2, b2, out2 = _linear()
    assert fast.call(table, a2, b2, out2, 1.0) == 1 and len(seen) == 2


@needs_compiler
def test_every_tensor_field_is_in_the_key(fast):
    """A call that differs in any of a's, b's or out's dtype, shape or
    strides, or in the table, is a miss: never another layout's artifact."""
    table = fastpath.new_table()
    a, b, out = _linear()
    seen = []
    fast.register(table, a, b, out, _artifact(seen), 132, -1, 0)
    m, n, k = 128, 512, 256
    others = [
        (a.half(), b, out),                                  # a's dtype
        (a, b.contiguous(), out),                            # b's strides (majorness)
        (a, b, out.float()),                                 # out's dtype
        (torch.randn(m + 1, k, dtype=a.dtype), b, torch.empty(m + 1, n, dtype=a.dtype)),  # M
        (torch.randn(m, k, dtype=a.dtype).t().contiguous().t(), b, out),  # a column-major
        (torch.randn(m, 2 * k, dtype=a.dtype)[:, :k], b, out),             # a's row pitch
        (a.unsqueeze(0), b.unsqueeze(0), out.unsqueeze(0)),  # rank
    ]
    for args in others:
        assert fast.call(table, *args, 1.0) == 0, [tuple(t.stride()) for t in args]
    assert fast.call(fastpath.new_table(), a, b, out, 1.0) == 0  # another runner's table
    assert not seen


@needs_compiler
def test_what_it_does_not_key_is_a_miss_not_an_error(fast):
    table = fastpath.new_table()
    a, b, out = _linear()
    fast.register(table, a, b, out, _artifact([]), 132, -1, 0)
    assert fast.call(table, a, b, 3, 1.0) == 0            # not a tensor
    assert fast.call(table, a, b, out) == 0                # wrong arity
    assert fast.call("t", a, b, out, 1.0) == 0             # not a table id
    scalar = torch.tensor(1.0)
    assert fast.call(table, scalar, b, out, 1.0) == 0      # rank 0
    assert fast.register(table, scalar, b, out, _artifact([]), 132, -1, 0) == 0
    with pytest.raises(TypeError):
        fast.register(table, a, b, out)


@needs_compiler
@pytest.mark.parametrize("splits, elems", [(6, 4096), (0, 2048)])
def test_split_k_gets_fp32_scratch_from_the_callers_allocator(fast, splits, elems):
    """The split-K ABI, split count 0 included (its stream-K schedule; the
    plain ABI is -1): seven arguments, the scratch from the caller's allocator."""
    table = fastpath.new_table()
    a, b, out = _linear()
    seen = []
    fast.register(table, a, b, out, _artifact(seen), 132, splits, elems)
    assert fast.call(table, a, b, out, 2.0) == 1
    args = seen[-1]
    assert len(args) == 7 and args[4:] == (2.0, splits, 132)  # a, b, d, workspace, alpha, splits, sms
    ws = torch.from_dlpack(args[3])
    assert ws.shape == (elems,) and ws.dtype == torch.float32 and ws.device == out.device


@needs_compiler
def test_register_refuses_a_split_count_or_scratch_it_cannot_mean(fast):
    table = fastpath.new_table()
    a, b, out = _linear()
    for splits, elems in ((-2, 0), (2, -1)):
        with pytest.raises(ValueError, match="splits is -1"):
            fast.register(table, a, b, out, _artifact([]), 132, splits, elems)
    assert fast.size(table) == 0


@needs_compiler
def test_artifact_errors_surface_with_their_kind(fast):
    """An artifact's refusal reaches dispatch as the ValueError/TypeError it
    raised (dispatch then resolves the call in full)."""
    table = fastpath.new_table()
    a, b, out = _linear()

    def refuse(*args):
        raise ValueError("misaligned a")

    fast.register(table, a, b, out, _tvm_ffi().convert(refuse), 132, -1, 0)
    with pytest.raises(ValueError, match="misaligned a"):
        fast.call(table, a, b, out, 1.0)


@needs_compiler
def test_clear_drops_only_its_own_table(fast):
    t1, t2 = fastpath.new_table(), fastpath.new_table()
    a, b, out = _linear()
    fast.register(t1, a, b, out, _artifact([]), 132, -1, 0)
    fast.register(t2, a, b, out, _artifact([]), 132, -1, 0)
    fast.register(t2, a.half(), b.half(), out.half(), _artifact([]), 132, -1, 0)
    assert (fast.size(t1), fast.size(t2)) == (1, 2)
    assert fast.clear(t2) == 2
    assert (fast.size(t1), fast.size(t2)) == (1, 0)
    assert fast.call(t1, a, b, out, 1.0) == 1 and fast.call(t2, a, b, out, 1.0) == 0


@needs_compiler
@pytest.mark.parametrize("splits, elems", [(-1, 0), (4, 1024)])
def test_a_bias_call_is_served_with_the_bias_after_out(fast, splits, elems):
    """call_bias: the artifact of a variant with a bias takes the call's own
    vector after out, in the plain ABI and in split-K's (before the scratch)."""
    table = fastpath.new_table()
    a, b, out = _linear()
    bias = torch.randn(512, dtype=a.dtype)
    gelu = fastpath.ACT_CODES["gelu"]
    seen = []
    assert fast.call_bias(table, a, b, out, bias, gelu, 1.0) == 0
    assert fast.register_bias(table, a, b, out, bias, gelu, _artifact(seen), 132, splits,
                              elems) == 1
    bias2 = torch.randn(512, dtype=a.dtype)  # another vector of the same layout
    assert fast.call_bias(table, a, b, out, bias2, gelu, 0.5) == 1
    args = seen[-1]
    assert torch.equal(torch.from_dlpack(args[3]), bias2)
    if splits < 0:
        assert len(args) == 6 and args[4:] == (0.5, 132)  # a, b, d, bias, alpha, sm_count
    else:
        assert len(args) == 8 and args[5:] == (0.5, splits, 132)  # ..., bias, ws, alpha, ...
        assert torch.from_dlpack(args[4]).shape == (elems,)


@needs_compiler
def test_the_bias_entry_keys_the_bias_and_the_activation(fast):
    """A bias call that differs in its vector's dtype, length, strides or
    presence, or in the activation, is a miss; and the plain and bias
    entries never serve each other's registrations."""
    table = fastpath.new_table()
    a, b, out = _linear()
    bias = torch.randn(512, dtype=a.dtype)
    codes = fastpath.ACT_CODES
    seen = []
    fast.register_bias(table, a, b, out, bias, codes["gelu"], _artifact(seen), 132, -1, 0)
    misses = [
        (bias.float(), codes["gelu"]),                       # dtype
        (torch.randn(513, dtype=a.dtype), codes["gelu"]),    # length
        (torch.randn(1024, dtype=a.dtype)[::2], codes["gelu"]),  # stride
        (None, codes["gelu"]),                               # no bias
        (bias, codes["relu"]),                               # activation
        (bias, codes["none"]),                               # no activation
        (bias, fastpath.NO_ACT),                             # the plain entry's code
        (bias, "gelu"),                                      # not a code at all
    ]
    for vec, code in misses:
        assert fast.call_bias(table, a, b, out, vec, code, 1.0) == 0, (vec, code)
    assert fast.call(table, a, b, out, 1.0) == 0           # the plain entry
    assert fast.call_bias(table, a, b, out, bias, codes["gelu"]) == 0  # wrong arity
    assert not seen
    # An activation without a bias: the artifact takes the plain ABI.
    fast.register_bias(table, a, b, out, None, codes["relu"], _artifact(seen), 132, -1, 0)
    assert fast.call_bias(table, a, b, out, None, codes["relu"], 2.0) == 1
    assert len(seen[-1]) == 5 and seen[-1][3:] == (2.0, 132)
    fast.register(table, a, b, out, _artifact([]), 132, -1, 0)
    assert fast.call_bias(table, a, b, out, None, codes["none"], 1.0) == 0
    with pytest.raises(TypeError):
        fast.register_bias(table, a, b, out, bias, codes["gelu"], _artifact([]), 132, -1)


def test_activation_codes_cover_every_activation():
    """The codes the bias entry keys on: one per activation, None the same as
    "none", and none of them the plain entry's."""
    from cutlass_aot.signature import GEMM_ACTS  # noqa: PLC0415

    codes = fastpath.ACT_CODES
    assert set(codes) == {None, *GEMM_ACTS} and codes[None] == codes["none"]
    assert len({codes[a] for a in GEMM_ACTS}) == len(GEMM_ACTS) and min(codes.values()) == 0
    assert fastpath.NO_ACT < 0  # the plain entry's: never an activation's


@needs_compiler
def test_a_library_of_another_source_is_refused(tmp_path):
    """The stamp binds the library to the installed fastpath.cc and tvm-ffi:
    a stale build is never called."""
    import tvm_ffi.libinfo  # noqa: PLC0415

    lib = tmp_path / "_fastpath.so"
    cxx = shutil.which("c++") or shutil.which("g++")
    subprocess.run([cxx, "-O1", "-std=c++17", "-shared", "-fPIC",
                    f"-I{tvm_ffi.libinfo.find_include_path()}",
                    f"-I{tvm_ffi.libinfo.find_dlpack_include_path()}",
                    '-DCUTLASS_AOT_FASTPATH_STAMP="0000000000000000+tvm-ffi-0"',
                    "-o", str(lib), str(fastpath.SOURCE)], check=True)
    fast, why = fastpath.load_library(lib)
    assert fast is None and "another source" in why and "build_fastpath.py" in why
    fast, why = fastpath.load_library(tmp_path / "missing.so")
    assert fast is None and "not built" in why
    (tmp_path / "junk.so").write_bytes(b"\x7fELF not really")
    fast, why = fastpath.load_library(tmp_path / "junk.so")
    assert fast is None and "did not load" in why


@needs_compiler
def test_a_runner_that_goes_away_takes_its_entries(fast, built_cache):
    """What a GemmRunner registered is dropped with it (weakref.finalize),
    so a process that opens and drops caches does not keep their artifacts."""
    import gc  # noqa: PLC0415

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run.dispatch import GemmRunner  # noqa: PLC0415

    runner = GemmRunner(cutlass_aot.open_cache(built_cache.path))
    assert runner._fast is not None
    table = runner._fast_table
    a, b, out = _linear()
    fast.register(table, a, b, out, _artifact([]), 132, -1, 0)
    assert fast.size(table) == 1 and runner.fast_entries() == 1
    del runner
    gc.collect()
    assert fast.size(table) == 0
    assert GemmRunner(cutlass_aot.open_cache(built_cache.path), fast=False).fast_entries() == 0


def test_the_knob_turns_it_off_and_refuses_junk():
    with knobs.override(FASTPATH="0"):
        fast, why = fastpath.load_library(fastpath.LIBRARY)
        assert fast is None and why == "off: CUTLASS_AOT_FASTPATH=0"
    with knobs.override(FASTPATH="maybe"), pytest.raises(UsageError) as exc:
        fastpath.load_library(fastpath.LIBRARY)
    assert "CUTLASS_AOT_FASTPATH" in str(exc.value)


def _tvm_ffi():
    import tvm_ffi  # noqa: PLC0415

    return tvm_ffi


def _artifact(seen: list):
    """A tvm-ffi Function standing in for an artifact: records its arguments."""

    def artifact(*args):
        seen.append(args)

    return _tvm_ffi().convert(artifact)


@needs_compiler
def test_an_out_that_shares_memory_with_an_operand_is_a_miss(fast):
    """The C++ entry launches nothing whose out shares a byte with a, b or
    the bias (the Python path then names it); disjoint blocks of one buffer
    are served. Its answers are select.views_overlap's, on seeded random
    layouts of one buffer, batched ones with gaps between batches included."""
    import random  # noqa: PLC0415

    from cutlass_aot.run import select  # noqa: PLC0415

    def view(t):
        return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.element_size())

    table = fastpath.new_table()
    seen = []
    artifact = _artifact(seen)
    buf = torch.empty(256, 384, dtype=torch.bfloat16)
    a, out = buf[:, :128], buf[:, 128:256]
    b = torch.randn(256, 128, dtype=torch.bfloat16).t()
    fast.register(table, a, b, out, artifact, 132, -1, 0)
    assert fast.call(table, a, b, out, 1.0) == 1  # column blocks of one buffer
    assert fast.call(table, buf[:, 64:192], b, out, 1.0) == 0  # a's columns overlap out's
    bias = torch.empty(256, dtype=torch.bfloat16)
    fast.register_bias(table, a, b, out, bias, 2, artifact, 132, -1, 0)
    assert fast.call_bias(table, a, b, out, bias, 2, 1.0) == 1
    assert fast.call_bias(table, a, b, out, buf[5, 128:384], 2, 1.0) == 0  # bias inside out
    rng = random.Random(11)
    storage = torch.empty(1 << 14, dtype=torch.bfloat16)
    hits = misses = 0
    for _ in range(800):
        m, n, k = rng.randint(1, 40), rng.randint(1, 40), rng.randint(1, 40)
        # rows padded, dense, transposed, or overlapping (a pitch under the
        # row: one run of bytes, which both halves widen the row into)
        a = storage.as_strided((m, k), rng.choice([(k, 1), (1, m), (k + 8, 1), (max(k // 2, 1), 1)]),
                               rng.randint(0, 12000))
        b = storage.as_strided((k, n), rng.choice([(1, k), (n, 1)]), rng.randint(0, 12000))
        out = storage.as_strided((m, n), rng.choice([(n, 1), (n + 8, 1), (1, m)]), rng.randint(0, 12000))
        fast.register(table, a, b, out, artifact, 132, -1, 0)
        aliased = any(select.views_overlap(view(out), view(t)) for t in (a, b))
        got = fast.call(table, a, b, out, 1.0)
        assert got == (0 if aliased else 1), (view(a), view(b), view(out))
        hits, misses = hits + got, misses + (1 - got)
    assert hits > 100 and misses > 100, (hits, misses)
    # Batches with a gap (a batch stride that is not rows x pitch) are
    # blocks of rows: this half walks them as select does, serves exactly
    # the calls whose out shares no byte with a or b, and misses the rest.
    missed = served = 0
    for _ in range(400):
        L, m, n, k = rng.randint(2, 4), rng.randint(1, 24), rng.randint(1, 24), rng.randint(1, 24)
        gap = rng.choice([0, 8, 40])
        a = storage.as_strided((L, m, k), (m * (k + 8) + gap, k + 8, 1), rng.randint(0, 9000))
        b = storage.as_strided((L, k, n), (k * n, n, 1), rng.randint(0, 9000))
        out = storage.as_strided((L, m, n), (m * (n + 8) + gap, n + 8, 1), rng.randint(0, 9000))
        fast.register(table, a, b, out, artifact, 132, -1, 0)
        want = int(all(select.views_overlap(view(out), view(t)) is False for t in (a, b)))
        got = fast.call(table, a, b, out, 1.0)
        assert got == want, (view(a), view(b), view(out))
        missed, served = missed + (1 - got), served + got
    assert missed > 20 and served > 20, (missed, served)
    # A view with no unit-stride dim can leave two dims of blocks, which
    # this half does not walk: where byte ranges meet it misses, though
    # select answers the pair (apart, here), and the Python path serves it.
    a = storage.as_strided((2, 3, 4), (100, 32, 2))
    out = storage.as_strided((2, 3, 4), (100, 32, 2), 1)
    b = storage.as_strided((2, 4, 4), (16, 4, 1), 2000)
    assert select._layout((2, 3, 4), (100, 32, 2), 2)[3] == ((3, 64), (2, 200))
    assert select.views_overlap(view(out), view(a)) is False
    fast.register(table, a, b, out, artifact, 132, -1, 0)
    assert fast.call(table, a, b, out, 1.0) == 0


@needs_compiler
@pytest.mark.parametrize("splits, elems, with_bias", [(-1, 0, False), (-1, 0, True), (3, 512, False),
                                                      (0, 256, True)])
def test_a_call_with_c_is_served_with_c_after_out_and_beta_after_alpha(fast, splits, elems,
                                                                      with_bias):
    """call_c: c after out (then the bias), beta after alpha, in the plain
    ABI and split-K's (signature.gemm_abi_args); c's layout is in the key,
    and c may be out itself (an in-place residual), never another view of it."""
    table = fastpath.new_table()
    a, b, out = _linear()
    c = torch.randn(128, 512, dtype=a.dtype)
    bias = torch.randn(512, dtype=a.dtype) if with_bias else None
    code = fastpath.ACT_CODES[None]
    seen = []
    assert fast.call_c(table, a, b, out, bias, code, c, 1.0, 0.5) == 0
    assert fast.register_c(table, a, b, out, bias, code, c, _artifact(seen), 132, splits, elems) == 1
    c2 = torch.randn(128, 512, dtype=a.dtype)
    assert fast.call_c(table, a, b, out, bias, code, c2, 2.0, 0.5) == 1
    args = seen[-1]
    assert torch.equal(torch.from_dlpack(args[3]), c2)
    rest = args[4:]
    if with_bias:
        assert torch.equal(torch.from_dlpack(rest[0]), bias)
        rest = rest[1:]
    if splits < 0:
        assert rest == (2.0, 0.5, 132)  # alpha, beta, sm_count
    else:
        assert torch.from_dlpack(rest[0]).shape == (elems,) and rest[1:] == (2.0, 0.5, splits, 132)
    # c's layout, the entries' separation, and out against c.
    assert fast.call_c(table, a, b, out, bias, code, c2.t().contiguous().t(), 2.0, 0.5) == 0
    assert fast.call_bias(table, a, b, out, bias, code, 2.0) == 0
    assert fast.call_c(table, a, b, out, bias, code + 1, c2, 2.0, 0.5) == 0  # another activation
    assert fast.call_c(table, a, b, out, bias, code, c2, 2.0) == 0  # wrong arity
    n = len(seen)
    assert fast.call_c(table, a, b, out, bias, code, out, 2.0, 0.5) == 1  # in place: c is out
    assert len(seen) == n + 1
    wide = torch.empty(128, 520, dtype=a.dtype)
    fast.register_c(table, a, b, wide[:, 8:], bias, code, wide[:, :512], _artifact(seen), 132,
                    splits, elems)
    assert fast.call_c(table, a, b, wide[:, 8:], bias, code, wide[:, :512], 2.0, 0.5) == 0
    assert len(seen) == n + 1
