"""GPU correctness of every artifact in a built cache (runs on the device machine).

Self-contained (no conftest) so it runs where only torch, tvm_ffi and this
package exist: `pytest --noconftest tests/gpu`. The cache comes from
CUTLASS_AOT_CACHE_DIR (build_scripts/gpu_suite.sh points it at the carried
cache). Every check draws fresh random inputs, poisons the output (NaN inside
the problem, a sentinel in the padding), and compares with a float64
reference by relative Frobenius error; NaN never passes.
"""

from __future__ import annotations

import os
import random
import threading

import pytest
import torch

import cutlass_aot
from cutlass_aot.layout import GEMM_SPLITK_ABI
from cutlass_aot.run.dispatch import DTYPE_NAMES
from cutlass_aot.signature import gemm_abi_args, splitk_workspace_elems

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TORCH = {v: k for k, v in DTYPE_NAMES.items()}
# Relative Frobenius error bounds against a float64 reference (fp32 accumulate).
TOL = {"f16": 4e-3, "bf16": 2e-2, "f32": 1e-4}
SENTINEL = 12288.0  # exact in bf16, f16 and f32


def device_cache():
    """The cache the GPU suite runs against ($CUTLASS_AOT_CACHE_DIR), or skip.

    Each GPU test file's module-scoped ``cache`` fixture returns this (the
    files run with --noconftest, so they share the function, not a fixture)."""
    path = os.environ.get("CUTLASS_AOT_CACHE_DIR")
    if not path:
        pytest.skip("CUTLASS_AOT_CACHE_DIR is not set")
    return cutlass_aot.open_cache(path)


@pytest.fixture(scope="module")
def cache():
    return device_cache()


def _round8(x: int) -> int:
    return -(-x // 8) * 8


def operand(batch, rows, cols, dtype, contiguous_last: bool, pad: int = 0, fill=None):
    """A [*batch, rows, cols] view with a padded leading dimension.

    contiguous_last: the last dim has stride 1 (row-major), else the
    second-to-last. The leading dimension is rounded up to 16 bytes plus
    ``pad`` extra elements (a multiple of 8), so odd sizes stay legal.
    """
    if contiguous_last:
        ld = _round8(cols) + pad
        base = torch.empty((*batch, rows, ld), dtype=dtype, device="cuda")
        view = base[..., :cols]
    else:
        ld = _round8(rows) + pad
        base = torch.empty((*batch, cols, ld), dtype=dtype, device="cuda")
        view = base.transpose(-1, -2)[..., :rows, :]
    if fill is None:
        base.copy_(torch.randn(base.shape, device="cuda", dtype=torch.float32).to(dtype))
    else:
        base.fill_(fill)
    return base, view


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def capture(call) -> torch.cuda.CUDAGraph:
    """``call()`` captured into a CUDA graph (torch's capture stream); warm it up first."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def assert_replays_fresh(graph, inputs, out, ref, tol, replays: int = 3, what: str = "") -> None:
    """Replay ``graph`` with fresh random ``inputs`` (refilled in place) and a
    NaN-poisoned ``out``; each replay must match ``ref()`` within ``tol``."""
    for _ in range(replays):
        for t in inputs:
            t.copy_(torch.randn_like(t))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), what
        assert rel_err(out, ref()) < tol, what


def assert_two_streams(call, make_pair, shape, dtype, tol, calls: int = 5, what: str = "") -> None:
    """Two side streams at once, each calling ``call(x, w.t(), out)`` ``calls``
    times on its own operands (``make_pair()``: x [M, K], w [N, K]) into its
    own NaN-poisoned ``out`` of ``shape``; both must match x @ w.t()."""
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    pairs = [make_pair() for _ in streams]
    outs = [torch.full(shape, float("nan"), device="cuda", dtype=dtype) for _ in streams]
    torch.cuda.synchronize()
    for s, (x, w), o in zip(streams, pairs, outs):
        with torch.cuda.stream(s):
            for _ in range(calls):
                call(x, w.t(), o)
    torch.cuda.synchronize()
    for (x, w), o in zip(pairs, outs):
        assert rel_err(o, x.double() @ w.double().t()) < tol, what


ACT_FLOOR = 0.01  # run_case: the error is relative to at least 1% of the activation's input

ACTS = {
    None: lambda x: x,
    "relu": torch.relu,
    "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "gelu_erf": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
}


def raw_caller(cache, entry, splits: int = 1, sm_count: int | None = None):
    """Call an artifact through its raw ABI (signature.gemm_abi_args order).

    Returns call(a, b, d, c, alpha, beta, bias=None); split-K variants get
    fp32 scratch from torch and ``splits`` (0: stream-K). ``sm_count``: the
    SM count handed to the artifact (default: the device's).
    """
    fn = cache.function(entry.key)
    sig = dict(entry.signature.fields)
    split_k = entry.record["abi"] == GEMM_SPLITK_ABI
    names = gemm_abi_args(with_c=sig["c"] is not None, bias=sig.get("bias") is not None,
                          split_k=split_k)
    sms = sm_count or torch.cuda.get_device_properties(0).multi_processor_count
    v = entry.variant

    def call(a, b, d, c, alpha, beta, bias=None):
        m, n = a.shape[-2], b.shape[-1]
        nb = a.shape[0] if a.dim() == 3 else 1
        vals = {"a": a, "b": b, "d": d, "c": c, "bias": bias, "alpha": alpha, "beta": beta,
                "splits": splits, "sm_count": sms}
        if split_k:
            tm, tn = (int(x) for x in v["tile"].split("x"))
            cm, cn = (int(x) for x in v["cluster"].split("x"))
            # NaN-poisoned: a slot the reduce pass reads but no CTA wrote fails.
            vals["workspace"] = torch.full((splitk_workspace_elems(
                m, n, nb, splits, tile_m=tm, tile_n=tn, cluster_m=cm, cluster_n=cn,
                swap_ab=bool(v.get("swap_ab")), sm_count=sms, k=a.shape[-1]),),
                float("nan"), dtype=torch.float32, device="cuda")
        fn(*(vals[x] for x in names))

    return call


def run_case(fn_call, sig: dict, m: int, n: int, k: int, nb: int, *, with_c: bool, pad: int = 0):
    """Build operands for a signature, call, and check against float64.

    A signature with a ``bias`` field gets a random bias vector (passed as
    ``bias=``), one with ``act`` is checked against torch's activation.
    """
    batch = (nb,) if sig["rank"] == 3 else ()
    a_base, a = operand(batch, m, k, TORCH[sig["a"]], sig["a_major"] == "k", pad)
    b_base, b = operand(batch, k, n, TORCH[sig["b"]], sig["b_major"] == "n", pad)
    d_base, d = operand(batch, m, n, TORCH[sig["d"]], sig["d_major"] == "n", pad + 8, fill=SENTINEL)
    d.fill_(float("nan"))
    alpha = random.uniform(0.5, 2.0)
    beta = random.uniform(-1.5, 1.5)
    c = None
    if with_c:
        _, c = operand(batch, m, n, TORCH[sig["d"]], sig["d_major"] == "n", pad)
    bias = None
    if sig.get("bias"):
        bias = torch.randn(n, device="cuda", dtype=TORCH[sig["bias"]])
        fn_call(a, b, d, c, alpha, beta, bias=bias)
    else:
        fn_call(a, b, d, c, alpha, beta)
    torch.cuda.synchronize()
    ref = alpha * (a.double() @ b.double())
    if with_c:
        ref = ref + beta * c.double()
    if bias is not None:
        ref = ref + bias.double()
    pre = ref
    ref = ACTS[sig.get("act")](ref)
    assert torch.isfinite(d).all(), "NaN/inf in output: unwritten elements or overflow"
    # Relative to the activation's input as well as its output: where every
    # input is far below zero (one element, say), GELU's output is ~1e-6 and
    # the kernel's fast tanh rounds it to 0, a relative error of 1 that is
    # 1e-6 absolute (r15 saw one such draw at M = N = 1, K = 8).
    err = ((d.double() - ref).norm() / max(ref.norm().item(), ACT_FLOOR * pre.norm().item(),
                                           1e-30)).item()
    assert err < TOL[sig["d"]], f"relative error {err:.2e} > {TOL[sig['d']]:.0e}"
    # Padding past N (or M for column-major D) must be untouched beyond the
    # next 16-byte boundary: TMA stores whole 16-byte chunks, so elements
    # between the edge and that boundary may be written (documented in the
    # README, "Alignment"); nothing further may be.
    per16 = 16 // d.element_size()
    mask = torch.ones_like(d_base, dtype=torch.bool)
    edge = n if sig["d_major"] == "n" else m
    mask[..., :-(-edge // per16) * per16] = False
    assert (d_base[mask].float() == SENTINEL).all(), "kernel wrote outside the output view"


def _entries(cache):
    # Only code this GPU can run (a multi-arch cache may hold sm_80 entries).
    from cutlass_aot.archs import runnable_archs  # noqa: PLC0415
    from cutlass_aot.signature import ARCH_BY_CAPABILITY  # noqa: PLC0415

    runnable = runnable_archs(ARCH_BY_CAPABILITY[torch.cuda.get_device_capability()])
    for sig, entries in sorted(cache.by_signature.items(), key=lambda kv: str(kv[0])):
        if sig.arch in runnable:
            yield from entries


def test_every_artifact_direct(cache):
    """Each variant, called through its raw ABI, at odd sizes and K < tile.

    Checks all variants before failing and prints one line per failure, so
    one run on the device shows the whole pattern.
    """
    sizes = [(129, 263, 72, 2), (1, 8, 8, 1), (1000, 128, 136, 3), (300, 520, 1024, 1),
             (256, 256, 64, 1), (7, 392, 1000, 1), (64, 4104, 520, 1)]
    failures, checked = [], 0
    for e in _entries(cache):
        sig = dict(e.signature.fields)
        with_c = sig["c"] is not None
        split_k = e.record["abi"] == GEMM_SPLITK_ABI
        # Split-K: an even split, an uneven one, and more splits than some
        # sizes have k-blocks (a split with no K contributes zeros).
        for splits in ((1, 2, 3, 5) if split_k else (1,)):
            call = raw_caller(cache, e, splits)
            for m, n, k, nb in sizes:
                if nb > 1 and sig["rank"] == 2:
                    nb = 1
                checked += 1
                try:
                    run_case(call, sig, m, n, k, nb, with_c=with_c)
                except AssertionError as exc:
                    failures.append(f"{e.signature} {_label(e)} splits={splits} "
                                    f"M={m} N={n} K={k} L={nb}: {str(exc).splitlines()[0]}")
    assert_cases_pass(failures, checked)



def test_bias_on_every_tile_of_a_persistent_walk(cache):
    """Every bias variant on a grid where each CTA walks several tiles, both
    inside D and on its edges (each thread's bias read into registers before
    the mainloop; on the last column of tiles, the last row under swap-AB,
    masked past the vector's end), in every order the walks take. K is
    short, so the bias is a large share of each output: an element given
    another column's bias, a previous tile's, or none, is off by about 1,
    far above bf16's rounding of outputs near 4."""
    m, n, k = 2063, 4104, 16
    failures, checked = [], 0
    for e in _entries(cache):
        sig = dict(e.signature.fields)
        if not sig.get("bias") or sig["c"] is not None or sig["rank"] != 2:
            continue
        split_k = e.record["abi"] == GEMM_SPLITK_ABI
        for splits in ((1, 3) if split_k else (1,)):
            _, a = operand((), m, k, TORCH[sig["a"]], sig["a_major"] == "k")
            _, b = operand((), k, n, TORCH[sig["b"]], sig["b_major"] == "n")
            _, d = operand((), m, n, TORCH[sig["d"]], sig["d_major"] == "n", fill=SENTINEL)
            d.fill_(float("nan"))
            bias = torch.randn(n, device="cuda", dtype=TORCH[sig["bias"]])
            raw_caller(cache, e, splits)(a, b, d, None, 1.0, 0.0, bias=bias)
            torch.cuda.synchronize()
            ref = ACTS[sig.get("act")](a.double() @ b.double() + bias.double())
            err = ((d.double() - ref).abs() - 0.02 * ref.abs()).max().item()
            checked += 1
            if not torch.isfinite(d).all() or err > 0.05:
                failures.append(f"{e.signature} {_label(e)} splits={splits}: "
                                f"max error {err:.3g} beyond 2% + 0.05")
    assert checked, "the cache has no bias variant"
    assert_cases_pass(failures, checked)


def assert_cases_pass(failures: list[str], checked: int, summary: str | None = None) -> None:
    """Print each failed case and a summary line, then fail if any case failed
    (the GPU suites collect every failure before they assert)."""
    for line in failures:
        print("FAIL", line)
    print(summary or f"checked {checked} (variant, size) cases, {len(failures)} failed")
    assert not failures, f"{len(failures)} of {checked} cases failed (see FAIL lines)"

def _label(e) -> str:
    v = e.variant
    return (f"{e.record['family']} {v['tile']}/{v.get('cluster', '-')}/"
            f"{v.get('raster', 'm')}{v.get('swizzle', 1)}"
            + ("/swap" if v.get("swap_ab") else "") + ("/splitk" if v.get("split_k") else "")
            + ("/pp" if v.get("pingpong") else "")
            + (f"/kc{v['k_cluster']}" if int(v.get("k_cluster", 1)) > 1 else ""))


ODD = [1, 7, 127, 129, 1000]


@pytest.mark.parametrize("m", ODD)
@pytest.mark.parametrize("n", [8, 136, 1000])
@pytest.mark.parametrize("k", [8, 40, 200])
def test_runner_odd_sizes(cache, m, n, k):
    """The dispatcher picks a variant for any size; results are right."""
    sig = {"a": "bf16", "b": "bf16", "d": "bf16", "c": None, "a_major": "k",
           "b_major": "k", "d_major": "n", "rank": 2}
    run_case(lambda a, b, d, c, al, be: cache.gemm(a, b, d, alpha=al), sig, m, n, k, 1,
             with_c=False, pad=8)


def test_runner_every_signature(cache):
    """Every signature through the public dispatcher, with C where served."""
    for sig_obj in cache.signatures():
        sig = dict(sig_obj.fields)
        with_c = sig["c"] is not None
        for m, n, k, nb in [(257, 392, 128, 2), (64, 64, 1000, 1)]:
            def call(a, b, d, c, al, be, bias=None, act=sig.get("act", None)):  # noqa: B008
                cache.gemm(a, b, d, c=c, bias=bias, act=act, alpha=al, beta=be)

            run_case(call, sig, m, n, k, nb, with_c=with_c, pad=16)


def _linear_sig():
    return {"a": "bf16", "b": "bf16", "d": "bf16", "c": None, "a_major": "k",
            "b_major": "k", "d_major": "n", "rank": 2}


def test_side_stream_and_default_alloc(cache):
    s = torch.cuda.Stream()
    a = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        out = cache.gemm(a, w.t())
    s.synchronize()
    assert out.shape == (512, 384) and out.dtype == torch.bfloat16
    assert rel_err(out, a.double() @ w.double().t()) < TOL["bf16"]


def test_module_level_gemm_uses_default_cache(cache):
    a = torch.randn(200, 64, device="cuda", dtype=torch.float16)
    w = torch.randn(96, 64, device="cuda", dtype=torch.float16)
    out = cutlass_aot.gemm(a, w.t())
    torch.cuda.synchronize()
    assert rel_err(out, a.double() @ w.double().t()) < TOL["f16"]


def test_cuda_graph_capture_and_replay(cache):
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(640, 512, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(256, 640, device="cuda", dtype=torch.bfloat16)
    cache.gemm(a, w.t(), out)  # first use (load) outside capture
    torch.cuda.synchronize()
    g = capture(lambda: cache.gemm(a, w.t(), out))
    assert_replays_fresh(g, (a, w), out, lambda: a.double() @ w.double().t(), TOL["bf16"])


def test_batched_3d(cache):
    a = torch.randn(5, 129, 72, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(5, 72, 200, device="cuda", dtype=torch.bfloat16)
    out = cache.gemm(a, b)
    torch.cuda.synchronize()
    assert rel_err(out, a.double() @ b.double()) < TOL["bf16"]


def test_threads_share_a_cache(cache):
    errors = []

    def work(seed):
        try:
            g = torch.Generator(device="cuda").manual_seed(seed)
            for _ in range(20):
                a = torch.randn(300, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                w = torch.randn(200, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                out = cache.gemm(a, w.t())
                torch.cuda.current_stream().synchronize()
                err = rel_err(out, a.double() @ w.double().t())
                assert err < TOL["bf16"], err
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ------------------------------------------------------------------ bad input
def test_misaligned_pointer_is_served_by_either_route(cache):
    """A 2 bytes past alignment: the 16-byte variants serve it staged (counted
    as staged); a low-alignment variant serves it natively where the cache
    has one; "auto" picks one of the two. All correct."""
    base = torch.randn(256 * 64 + 1, device="cuda", dtype=torch.bfloat16)
    a = base[1:].view(256, 64)  # data pointer 2 bytes past alignment
    w = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    runner = cache.gemm.runner
    aligned = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16)
    first = runner.choice_for(aligned, w.t())  # 16-byte aligned: a 16-byte family, unstaged
    assert cache.entries[first.candidate.key].signature.get("align") == 16 and not first.staged
    try:
        for route in ("staged", "native", "auto"):
            runner.set_unaligned(route)
            before = cache.stats()["totals"]["staged"]
            out = cache.gemm(a, w.t())
            torch.cuda.synchronize()
            assert rel_err(out, a.double() @ w.double().t()) < TOL["bf16"], route
            staged_now = cache.stats()["totals"]["staged"]
            choice = runner.choice_for(a, w.t())  # resolves again (and counts again)
            if route == "staged":
                assert staged_now == before + 1 and choice.staged
            if route == "native" and _low_align_served(cache):
                assert not choice.staged and cache.entries[choice.candidate.key].signature.get("align") < 16
    finally:
        runner.set_unaligned("auto")


def _low_align_served(cache) -> bool:
    """Whether the cache has 2-byte aligned bf16 nn.Linear variants (sm90-lowalign.yaml)."""
    return any(s.get("align") == 2 and s.get("a") == "bf16" and s.get("b_major") == "k"
               and s.get("c") is None and s.get("rank") == 2 for s in cache.signatures())


def test_unaligned_leading_dimension_is_served_staged(cache):
    a = torch.randn(256, 70, device="cuda", dtype=torch.bfloat16)  # 140-byte rows
    w = torch.randn(128, 70, device="cuda", dtype=torch.bfloat16)
    out = torch.full((256, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    cache.gemm(a, w.t(), out)
    torch.cuda.synchronize()
    assert rel_err(out, a.double() @ w.double().t()) < TOL["bf16"]


def test_shape_mismatch_is_a_clear_error(cache):
    a = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, 72, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(cutlass_aot.ArgumentError, match="shapes do not agree"):
        cache.gemm(a, w.t())
    out = torch.empty(255, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(cutlass_aot.ArgumentError, match="shapes do not agree"):
        cache.gemm(a, torch.randn(64, 128, device="cuda", dtype=torch.bfloat16), out)


def test_missing_signature_names_nearest_and_build_hint(cache):
    a = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    out = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)  # f16 in, bf16 out: not built
    with pytest.raises(cutlass_aot.KernelNotFoundError) as info:
        cache.gemm(a, b, out)
    msg = str(info.value)
    assert "nearest" in msg and "cutlass-aot build" in msg and "d=bf16" in msg


def test_cpu_and_mixed_devices_are_clear_errors(cache):
    a = torch.randn(64, 64, dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(cutlass_aot.ArgumentError, match="cuda"):
        cache.gemm(a, b)
    with pytest.raises(cutlass_aot.ArgumentError):
        cache.gemm(b, b, torch.empty(64, 64, dtype=torch.bfloat16))


def test_empty_problems_do_not_launch(cache):
    a = torch.randn(0, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    out = cache.gemm(a, b)
    assert out.shape == (0, 128)
    # K == 0: D = alpha * 0 (+ beta * C): the kernel still runs and writes.
    a = torch.randn(64, 0, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(0, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.full((64, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    try:
        cache.gemm(a, b, out)
        torch.cuda.synchronize()
        assert (out == 0).all()
    except cutlass_aot.ArgumentError:
        pass  # refusing K == 0 cleanly is acceptable too


def test_artifact_refuses_wrong_majorness(cache):
    """The dispatch key leaves A's majorness to the artifact's own checks."""
    sig_k = next(s for s in cache.signatures() if dict(s.fields) == {
        "a": "bf16", "b": "bf16", "d": "bf16", "c": None, "a_major": "k", "b_major": "k",
        "d_major": "n", "rank": 2, "align": 16})
    plain = next(e for e in cache.by_signature[sig_k] if e.record["abi"] != GEMM_SPLITK_ABI)
    fn = cache.function(plain.key)
    a_m = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16).t()  # [256, 64], M-major
    w = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(256, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError):
        fn(a_m, w.t(), out, 1.0, 132)


def test_same_shape_other_layout_takes_the_right_artifact(cache):
    """Same output shape and dtypes, A K-major then M-major then K-major again."""
    w = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(256, 128, device="cuda", dtype=torch.bfloat16)
    for a in (torch.randn(256, 64, device="cuda", dtype=torch.bfloat16),
              torch.randn(64, 256, device="cuda", dtype=torch.bfloat16).t(),
              torch.randn(256, 64, device="cuda", dtype=torch.bfloat16)):
        out.fill_(float("nan"))
        cache.gemm(a, w.t(), out)
        torch.cuda.synchronize()
        assert rel_err(out, a.double() @ w.double().t()) < TOL["bf16"]


def test_non_tensor_arguments_are_clear_errors(cache):
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    for bad in ("x", 3, None):
        with pytest.raises(cutlass_aot.ArgumentError):
            cache.gemm(a, bad, a.clone())


def test_alternating_input_dtypes_same_output_stay_correct(cache):
    """f32 output from bf16 then f16 inputs at one shape: the short key maps
    both to one memo slot; the artifact refuses the wrong dtype and the
    fallback re-resolves, so every result is right."""
    out = torch.empty(192, 320, device="cuda", dtype=torch.float32)
    for dt in (torch.bfloat16, torch.float16, torch.bfloat16, torch.float16):
        a = torch.randn(192, 96, device="cuda", dtype=dt)
        w = torch.randn(320, 96, device="cuda", dtype=dt)
        out.fill_(float("nan"))
        cache.gemm(a, w.t(), out)
        torch.cuda.synchronize()
        assert rel_err(out, a.double() @ w.double().t()) < TOL["f32"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_runs_on_the_gpu_holding_the_tensors_and_refuses_mixed(cache):
    with torch.cuda.device(0):  # current device 0, operands on GPU 1
        a = torch.randn(300, 128, device="cuda:1", dtype=torch.bfloat16)
        w = torch.randn(200, 128, device="cuda:1", dtype=torch.bfloat16)
        out = torch.full((300, 200), float("nan"), device="cuda:1", dtype=torch.bfloat16)
        cache.gemm(a, w.t(), out)
        torch.cuda.synchronize(1)
        assert rel_err(out, a.double() @ w.double().t()) < TOL["bf16"]
        with pytest.raises(cutlass_aot.ArgumentError, match="cuda"):
            cache.gemm(a, torch.randn(128, 200, device="cuda:0", dtype=torch.bfloat16))
        with pytest.raises(cutlass_aot.ArgumentError):
            cache.gemm(a, w.t().to("cuda:0"), out)  # out on 1, b on 0: the artifact refuses


def test_broadcast_output_is_refused_before_launch(cache):
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.zeros(1, 64, device="cuda", dtype=torch.bfloat16).expand(64, 64)  # stride (0, 1)
    with pytest.raises(cutlass_aot.ArgumentError, match="share memory"):
        cache.gemm(a, w.t(), out)
    assert (out == 0).all()
