"""How far each option's result lies from an fp64 reference at long K, beside cuBLAS's.

r68's random-width with-C run stopped at 21 x 18832 x 45888 (bf16): the
new pick's largest elementwise error, |out - ref| / (|ref| + 1), was 0.0204,
over the 2e-2 sanity bound the benchmarks share; in f16 the same shape read
0.017, and shapes of K near 28672 had read 0.013 since r66. Output rounding
gives at most 2^-8 (bf16) or 2^-11 (f16) on that scale, so what remains is
accumulation: the question is whether an option accumulates worse than
cuBLAS does on the same operands, or whether the bound is too tight for K
this long.

For each shape and dtype it draws fresh N(0, 1) operands (A, B and, with
``--with-c``, C with beta 0.5), computes the reference in fp64 on the GPU,
and for each option (the pick of each ``--cache`` and every ``--options``
label, at its split count) and for cuBLAS (``torch.addmm`` / ``torch.mm``
into a NaN-poisoned out) reports:

* max elementwise error, |out - ref| / (|ref| + 1) (the benchmarks' check);
* Frobenius relative error, ||out - ref|| / ||ref|| (the GPU tests' check);
* signed bias, mean((out - ref) * sign(ref)) / mean(|ref|): below zero, the
  result is pulled toward zero (truncating accumulation).

    python3 benchmarks/accuracy_probe.py --shapes MxNxK,... [--dtypes bf16,f16] [--with-c]
        [--cache DIR ...] [--options LABEL,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import os

import torch
from _common import header, max_rel_err, write
from with_c_edge import shapes_arg

import cutlass_aot
from cutlass_aot.run import select
from cutlass_aot.run.dispatch import device_info, launch_choice
from cutlass_aot.signature import gemm_signature
from cutlass_aot.tune.timing import TORCH_DTYPES


def errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
    """(max elementwise, Frobenius relative, signed bias) of ``out`` against
    the fp64 ``ref`` (module docstring); NaN anywhere gives NaN."""
    d = out.double() - ref
    elem = max_rel_err(out, ref)
    frob = (d.norm() / ref.norm().clamp_min(1e-30)).item()
    bias = ((d * ref.sign()).mean() / ref.abs().mean().clamp_min(1e-30)).item()
    if not torch.isfinite(out).all():
        return float("nan"), float("nan"), float("nan")
    return elem, frob, bias


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", type=shapes_arg, required=True)
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--with-c", action="store_true", help="D = A·B + 0.5·C")
    ap.add_argument("--cache", action="append", default=None,
                    help="a cache whose dispatch pick is measured (repeatable; default $CUTLASS_AOT_CACHE_DIR)")
    ap.add_argument("--options", default="", help="labels (Choice.label) from the first cache, at their splits")
    ap.add_argument("--seed", type=int, default=68)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not dtypes or any(d not in TORCH_DTYPES or d == "f32" for d in dtypes):
        ap.error(f"--dtypes: bf16 and/or f16, got {args.dtypes!r}")
    caches = args.cache or [os.environ.get("CUTLASS_AOT_CACHE_DIR")]
    if None in caches:
        ap.error("no cache: pass --cache or set CUTLASS_AOT_CACHE_DIR")
    opened = [(path, cutlass_aot.open_cache(path)) for path in caches]
    labels = [x for x in args.options.split(",") if x]
    arch, sms, gpu_name, _ = device_info(0)
    torch.manual_seed(args.seed)
    lines = []
    for dn in dtypes:
        dt = TORCH_DTYPES[dn]
        sig = gemm_signature(arch, a=dn, b=dn, d=dn, c=dn if args.with_c else None, a_major="k",
                             b_major="k", d_major="n", rank=2)
        cands = opened[0][1].gemm.runner._candidates_for(sig)
        for m, n, k in args.shapes:
            a = torch.randn(m, k, device="cuda", dtype=dt)
            b = torch.randn(n, k, device="cuda", dtype=dt).t()
            c = torch.randn(m, n, device="cuda", dtype=dt) if args.with_c else None
            ref = a.double() @ b.double()
            if c is not None:
                ref += 0.5 * c.double()
            rows = []
            out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
            if c is None:
                torch.mm(a, b, out=out)
            else:
                torch.addmm(c, a, b, beta=0.5, out=out)
            rows.append(("cuBLAS " + ("addmm" if c is not None else "mm"), errors(out, ref)))
            for path, cache in opened:
                out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
                cache.gemm(a, b, out, c=c, beta=0.5)
                ch = cache.gemm.runner.choice_for(a, b, out, c=c)
                rows.append((f"pick of {path}: {ch.label() if ch else '?'}", errors(out, ref)))
            for label in labels:
                opt = select.option_of_label(cands, label)
                if opt is None:
                    rows.append((f"{label} (not in the cache)", (float("nan"),) * 3))
                    continue
                run = launch_choice(opened[0][1], select.Choice(opt[0], opt[1], "probe"), sms, m, n, 1, k=k)
                out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
                if c is None:
                    run(a, b, out)
                    got = errors(out, ref)
                else:
                    # launch_choice adds C at beta 1: its own reference
                    run(a, b, out, c)
                    got = errors(out, ref + 0.5 * c.double())
                rows.append((label, got))
            for name, (elem, frob, bias) in rows:
                lines.append(f"| {dn} | {m}x{n}x{k} | {name} | {elem:.2e} | {frob:.2e} | {bias:+.2e} |")
                print(lines[-1], flush=True)
            del a, b, c, ref, out
            torch.cuda.empty_cache()
    what = "D = A·B + 0.5·C" if args.with_c else "D = A·B"
    text = header(f"Accuracy at long K: options and cuBLAS against an fp64 reference ({what})")
    text += (f"GPU {gpu_name}; caches: {', '.join(caches)}; operands N(0, 1), seed {args.seed}. elementwise: "
             "max |out - ref| / (|ref| + 1), the benchmarks' 2e-2 check; Frobenius: ||out - ref|| / ||ref||; "
             "bias: mean((out - ref)·sign(ref)) / mean|ref| (< 0: pulled toward zero). Options by label "
             "launch with C at beta 1 (dispatch.launch_choice) and are compared with their own reference.\n\n"
             "| dtype | MxNxK | option | elementwise | Frobenius | bias |\n|---|---|---|---|---|---|\n")
    text += "\n".join(lines) + "\n"
    print(text)
    print("wrote", write("accuracy_probe.md", text, args.out))


if __name__ == "__main__":
    main()
