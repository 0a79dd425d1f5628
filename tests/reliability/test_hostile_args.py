"""Hostile call arguments on a CPU machine: generated GemmRunner calls.

Every call gets CPU or meta tensors (or things that are not tensors) of
random dtypes, ranks 0-4, shapes with zero and odd sizes, transposed,
strided, broadcast (stride 0) and offset views, with or without ``out`` and
``c`` and odd ``alpha``/``beta``. None can run here, so each call must raise
a CutlassAotError (ArgumentError in practice): never another exception,
never a return. Calls go through ``cache.gemm`` and ``GemmRunner.__call__``.

Two targeted tests keep past escapes as regressions: tensors whose layout
has no strides or sizes (sparse CSR/CSC/BSR, nested), and an omitted
``out`` with mismatched, huge extents (it must not be allocated first).
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch

from cutlass_aot import CutlassAotError
from cutlass_aot.run.dispatch import GemmRunner
from cutlass_aot.run.load import Cache
from tests.support import record, scaled

SEED = 1234567
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2]
SIZES = [0, 1, 2, 3, 7, 8, 16, 17, 64, 128]
NOT_TENSORS = [None, 3, 1.5, "a", [[1.0, 2.0]], (1, 2), object(), b"x", {"a": 1}, torch.float16]


def _strided(rng: random.Random, device: str, huge_ok: bool) -> torch.Tensor:
    rank = rng.choice([0, 1, 2, 2, 2, 3, 3, 4])
    shape = [rng.choice(SIZES) for _ in range(rank)]
    if huge_ok and device == "meta" and rank and rng.random() < 0.2:
        shape[rng.randrange(rank)] = rng.choice([2**20, 2**31 + 1])
    dtype = rng.choice(DTYPES)
    view = rng.choice(["contiguous", "transpose", "as_strided", "slice", "expand", "offset"])
    if view == "as_strided" and rank:
        strides = [rng.choice([0, 1, 2, 3, 8, 9, 64, 1000]) for _ in range(rank)]
        extent = 1 + sum((s - 1) * st for s, st in zip(shape, strides) if s > 0)
        base = torch.empty(max(extent, 1) + 1, dtype=dtype, device=device)
        return base.as_strided(shape, strides, storage_offset=rng.choice([0, 1]))
    t = torch.empty(shape, dtype=dtype, device=device)
    if view == "transpose" and rank >= 2:
        return t.transpose(-1, -2)
    if view == "slice" and rank and shape[-1] > 1:
        return t[..., ::2]
    if view == "expand" and rank:
        return torch.empty([*shape[:-1], 1], dtype=dtype, device=device).expand(shape)
    if view == "offset" and rank:
        flat = torch.empty(t.numel() + 1, dtype=dtype, device=device)
        return flat[1:].view(shape)
    return t


def _arg(rng: random.Random, huge_ok: bool = True):
    r = rng.random()
    if r < 0.06:
        return rng.choice(NOT_TENSORS)
    if r < 0.09:
        dense = torch.zeros(rng.choice(SIZES[1:5]), rng.choice(SIZES[1:5]), dtype=rng.choice(DTYPES[:3]))
        return dense.to_sparse()  # COO: has sizes and (dense) strides
    return _strided(rng, rng.choice(["cpu", "cpu", "meta"]), huge_ok)


def _call(rng: random.Random, fns):
    fn = rng.choice(fns)
    with_out = rng.random() < 0.6
    a, b = _arg(rng), _arg(rng)
    kwargs = {}
    args = [a, b]
    if with_out:
        args.append(_arg(rng))
    if rng.random() < 0.3:
        kwargs["c"] = _arg(rng)
    if rng.random() < 0.3:
        kwargs["alpha"] = rng.choice([0.0, -1.0, float("nan"), float("inf"), 2, True, "x", None])
    if rng.random() < 0.2:
        kwargs["beta"] = rng.choice([0.0, 1e300, None, "y"])
    return fn, args, kwargs


def _run(calls: int, make_call, fns) -> tuple[int, list[str]]:
    rng = random.Random(SEED)
    lost, notes = 0, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's prototype/beta layout warnings
        for i in range(calls):
            fn, args, kwargs = make_call(rng, fns)
            try:
                fn(*args, **kwargs)
            except CutlassAotError:
                continue
            except Exception as exc:  # noqa: BLE001 - tallied as a loss
                lost += 1
                if len(notes) < 5:
                    notes.append(f"call {i}: {type(exc).__name__}: {str(exc)[:120]} for "
                                 f"{_describe(args, kwargs)}")
                continue
            lost += 1
            if len(notes) < 5:
                notes.append(f"call {i} returned for {_describe(args, kwargs)}")
    return lost, notes


def _describe(args, kwargs) -> str:
    def one(x):
        if isinstance(x, torch.Tensor):
            try:
                return f"Tensor({x.layout}, {x.device}, {x.dtype}, {tuple(x.shape)}, {x.stride()})"
            except RuntimeError:
                return f"Tensor({x.layout}, {x.device}, {x.dtype})"
        return type(x).__name__
    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


@pytest.fixture(scope="module")
def runners(built_cache):
    cache = Cache(built_cache.path)
    return [cache.gemm, GemmRunner(cache), cache.gemm.runner]


@pytest.mark.slow
def test_hostile_runtime_args_raise_cutlass_aot_errors(runners):
    calls = scaled(10_000)
    lost, notes = _run(calls, _call, runners)
    record("hostile runtime args (CPU/meta tensors, non-tensors)", calls, lost, notes)
    assert lost == 0, notes


def _layout_call(rng: random.Random, fns):
    dense = torch.zeros(rng.choice([2, 4, 8]), rng.choice([2, 4, 8]), dtype=torch.float16)
    exotic = rng.choice([
        lambda: dense.to_sparse_csr(),
        lambda: dense.to_sparse_csc(),
        lambda: dense.to_sparse_bsr((2, 2)),
        lambda: torch.nested.nested_tensor([dense, dense[:1]]),
    ])()
    args = [dense, dense.clone(), dense.clone()]
    args[rng.randrange(3)] = exotic
    return rng.choice(fns), args, {}


def test_strideless_layouts_raise_cutlass_aot_errors(runners):
    calls = scaled(200)
    lost, notes = _run(calls, _layout_call, runners)
    record("hostile runtime args: strideless layouts (sparse, nested)", calls, lost, notes)
    assert lost == 0, notes


def test_omitted_out_is_not_allocated_before_validation(runners):
    a = torch.zeros(16, 64, dtype=torch.bfloat16)                         # CPU
    b = torch.empty(32, 2**40, dtype=torch.bfloat16, device="meta")       # K mismatch, huge N
    with pytest.raises(CutlassAotError):
        runners[0](a, b)
