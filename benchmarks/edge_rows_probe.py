"""One option, plain and with C, at token counts that leave its last row of tiles part empty.

r65 call C read a residual GEMM on 128x128 tiles in 2x1 clusters at 36.9 µs
for 424x4096x4096 and 30.2 µs for 475x4096x4096, while the same option took
26.3 µs at 512 tokens, the same four rows of tiles with none of them cut.
This probe times one option (``--option``, a label as the table writes it)
at each M of ``--ms`` for the plain nn.Linear signature and for its with-C
twin (beta 1, C of D's dtype), interleaved per M under CUDA graph replay over
cold operand sets (``tune.timing``), so the cost of a cut row of tiles shows
with C and without it in one run. Each result is checked against an fp32
reference on a poisoned ``out`` first.

    python3 benchmarks/edge_rows_probe.py --option 128x128/2x1/m1 --nk 4096x4096
        --ms 384,400,424,448,475,500,512 [--dtype bf16] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import os

import torch
from _common import header, max_rel_err, write

import cutlass_aot
from cutlass_aot.run import select
from cutlass_aot.run.dispatch import device_info, launch_choice
from cutlass_aot.signature import gemm_signature
from cutlass_aot.tune.timing import TORCH_DTYPES, copies_for, interleaved, l2_bytes


def choice_of(cands, label: str) -> select.Choice:
    """The candidate and split count a table label names (``Choice.label``)."""
    option = select.option_of_label(cands, label)
    if option is None:
        raise SystemExit(f"edge_rows_probe.py: no candidate {label!r} in this signature")
    return select.Choice(*option, "probe")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--option", required=True)
    ap.add_argument("--nk", required=True, help="NxK, e.g. 4096x4096")
    ap.add_argument("--ms", required=True, help="comma-separated token counts")
    ap.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ms = [int(x) for x in args.ms.split(",")]
    cache = cutlass_aot.open_cache(args.cache_dir)
    arch, sms, gpu_name, _ = device_info(0)
    n, k = (int(x) for x in args.nk.lower().split("x"))
    dn = args.dtype
    runner = cache.gemm.runner
    plain_sig, c_sig = (gemm_signature(arch, a=dn, b=dn, d=dn, c=c, a_major="k", b_major="k", d_major="n",
                                       rank=2) for c in (None, dn))
    plain = choice_of(runner._candidates_for(plain_sig), args.option)
    with_c = choice_of(runner._candidates_for(c_sig), args.option)
    dt = TORCH_DTYPES[dn]
    lines = []
    # The first M is timed twice and its first reading dropped: r66's first
    # run of this probe read times falling steadily over its first shapes,
    # plain and with C alike (a GPU coming up from idle), which would read
    # as a cost of the cut rows.
    for i, m in enumerate([ms[0], *ms]):
        count = copies_for(2 * (m * k + n * k + 2 * m * n), l2_bytes(0))
        sets = [(torch.randn(m, k, device="cuda", dtype=dt), torch.randn(n, k, device="cuda", dtype=dt).t(),
                 torch.randn(m, n, device="cuda", dtype=dt), torch.empty(m, n, device="cuda", dtype=dt))
                for _ in range(count)]
        run_p = launch_choice(cache, plain, sms, m, n, 1, k=k)
        run_c = launch_choice(cache, with_c, sms, m, n, 1, k=k)
        a, b, c, out = sets[0]
        prod = a.float() @ b.float()
        for with_ in (False, True):
            out.fill_(float("nan"))
            if with_:
                run_c(a, b, out, c)
            else:
                run_p(a, b, out)
            ref = prod + c.float() if with_ else prod
            err = max_rel_err(out, ref)
            if not err < 2e-2:  # NaN fails too
                raise SystemExit(f"edge_rows_probe.py: {m}x{n}x{k}: result off (max relative error {err})")
        fns = [[functools.partial(run_p, s[0], s[1], s[3]) for s in sets],
               [functools.partial(run_c, s[0], s[1], s[3], s[2]) for s in sets]]
        t_p, t_c = interleaved(fns, rounds=args.rounds, graph=True)
        tile_m = plain.candidate.tile_n if plain.candidate.swap_ab else plain.candidate.tile_m
        cut = -m % tile_m
        row = f"| {m} | {cut} | {t_p:.1f} | {t_c:.1f} | {t_c / t_p:.3f} |"
        print(row + (" (warm-up, dropped)" if i == 0 else ""), flush=True)
        if i:
            lines.append(row)
        del sets, a, b, c, out, fns, prod
        torch.cuda.empty_cache()
    text = header(f"{args.option} at {args.dtype} Mx{n}x{k}, plain and with C, as M cuts its last row of tiles")
    text += (f"CUDA graph replay over cold operand sets, {args.rounds} rounds interleaved (plain, with C); "
             f"µs per call, median of rounds; {gpu_name}. rows cut: the tile's rows past M in the last "
             "row of tiles.\n\n| M | rows cut | plain µs | with C µs | with C / plain |\n|---|---|---|---|---|\n")
    text += "\n".join(lines) + "\n"
    print(text)
    print("wrote", write("edge_rows_probe.md", text, args.out))


if __name__ == "__main__":
    main()
