"""What the fused epilogue itself costs: one form, three signatures (GPU).

bench_epilogue.py compares the dispatcher's fused call with its plain call,
but the two may run different forms: the bias signatures build fewer tiles
than the plain one, and their table rows were tuned on their own. This
script takes named forms (``--forms``, labels as the reports print them,
data-parallel only) and, at each shape, times each form as a plain GEMM, with
a bias and with bias+GELU, interleaved with torch.mm, under CUDA graph replay
with cold L2 (tune.timing's rules). A form the bias signature does not build
is timed plain only. The report gives each form's bias and bias+GELU time
over its own plain time: the epilogue's cost with the GEMM held fixed.

    python benchmarks/epilogue_same_form.py --dtype bf16 \\
        --forms 128x256/2x1/m1,128x192/2x1/m1 --shapes 4096x4096x4096
    python benchmarks/epilogue_same_form.py --from-raw raw.json [--from-raw raw2.json]

``--raw FILE`` keeps the timings (JSON, one record per dtype and shape);
``--from-raw`` renders such files (or their .xz) again without a GPU (several: one
report).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import lzma
import statistics
from pathlib import Path

from _common import commit, gmean, header, linear_candidates, machine, write
from option_retime import shapes_arg

EPILOGUES = ("plain", "bias", "gelu")


def render(records: list[dict]) -> str:
    """The report's tables from the raw records (GPU-free)."""
    text = ("Per shape: fresh operands (nn.Linear layout, cold L2), each (form, epilogue) and "
            "torch.mm timed interleaved, CUDA graph replay; µs are medians over the rounds. "
            "'bias' and 'bias+GELU' are each form's fused time over its own plain time.\n")
    for dtype in sorted({r["dtype"] for r in records}):
        rows = [r for r in records if r["dtype"] == dtype]
        forms = list(dict.fromkeys(f for r in rows for f in r["us"] if f != "torch.mm"))
        text += f"\n## {dtype}\n\n| MxNxK | torch.mm µs |"
        text += "".join(f" {f} plain µs | bias | bias+GELU |" for f in forms) + "\n"
        text += "|---|---|" + "---|---|---|" * len(forms) + "\n"
        ratios: dict[str, list[float]] = {"bias": [], "gelu": []}
        for r in rows:
            text += f"| {r['m']}x{r['n']}x{r['k']} | {r['us']['torch.mm']:.1f} |"
            for f in forms:
                us = r["us"].get(f, {})
                plain = us.get("plain")
                text += f" {plain:.1f} |" if plain else " - |"
                for e in ("bias", "gelu"):
                    if plain and us.get(e):
                        ratios[e].append(us[e] / plain)
                        text += f" {us[e] / plain:.3f} |"
                    else:
                        text += " - |"
            text += "\n"
        for e, name in (("bias", "bias"), ("gelu", "bias+GELU")):
            xs = ratios[e]
            if xs:
                text += (f"\n- {name} over plain, every (form, shape): geomean {gmean(xs):.3f}, "
                         f"median {statistics.median(xs):.3f}, range {min(xs):.3f}-{max(xs):.3f} "
                         f"(n={len(xs)})")
        text += "\n"
    return text


def measure(args) -> list[dict]:
    import torch  # noqa: PLC0415 - GPU part only: --help and --from-raw run without CUDA

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run import select  # noqa: PLC0415
    from cutlass_aot.run.dispatch import launch_choice  # noqa: PLC0415
    from cutlass_aot.tune.timing import cold_operands, interleaved, rotate  # noqa: PLC0415

    cache = cutlass_aot.open_cache(args.cache_dir)
    sms, plain = linear_candidates(cache, args.dtype)
    cands = {"plain": plain, "bias": linear_candidates(cache, args.dtype, bias=args.dtype)[1],
             "gelu": linear_candidates(cache, args.dtype, bias=args.dtype, act="gelu")[1]}
    by_label = {e: {select.Choice(c, 1, "model").label(): c for c in cs} for e, cs in cands.items()}
    missing = [f for f in args.forms if f not in by_label["plain"]]
    if missing:
        raise SystemExit(f"epilogue_same_form: {', '.join(missing)}: not a data-parallel form of "
                         f"the plain {args.dtype} nn.Linear signature in this cache")
    records = []
    for m, n, k in args.shapes:
        sets = cold_operands((args.dtype,) * 3 + ("k", "k", "n", 2), m, n, k, 1)
        bias = torch.randn(n, device="cuda", dtype=sets[0][0].dtype)
        fns, names = [], []
        for form in args.forms:
            for e in EPILOGUES:
                c = by_label[e].get(form)
                if c is not None:
                    ch = select.Choice(c, 1, "model")
                    fns.append(rotate(launch_choice(cache, ch, sms, m, n, 1, None if e == "plain" else bias,
                                                    k=k), sets))
                    names.append((form, e))
        fns.append(rotate(lambda a, b, out: torch.mm(a, b, out=out), sets))
        ts = interleaved(fns, rounds=args.rounds, reps=3, graph=True)
        us: dict = {"torch.mm": ts[-1]}
        for (form, e), t in zip(names, ts):
            us.setdefault(form, {})[e] = t
        records.append({"dtype": args.dtype, "m": m, "n": n, "k": k, "us": us, "machine": machine(),
                        "commit": commit(),
                        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")})
        print(f"{m}x{n}x{k}: " + ", ".join(
            f"{f} {v['plain']:.1f} µs"
            + "".join(f" {e} {v[e] / v['plain']:.3f}" for e in ("bias", "gelu") if e in v)
            for f, v in us.items() if f != "torch.mm"), flush=True)
        if args.raw:  # after every shape: a run cut short keeps what it measured
            Path(args.raw).write_text(json.dumps(records))
        sets = fns = None
        torch.cuda.empty_cache()
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    ap.add_argument("--forms", type=lambda s: [f.strip() for f in s.split(",") if f.strip()],
                    default="128x256/2x1/m1,128x192/2x1/m1,128x256/2x1/m8,128x208/2x1/m1")
    ap.add_argument("--shapes", type=shapes_arg, default=None, help="MxNxK[,MxNxK...]")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--raw", default=None, help="write the timings here (JSON)")
    ap.add_argument("--from-raw", action="append", default=[], help="render these raws (no GPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.from_raw:
        records = []
        for f in args.from_raw:
            raw = lzma.open(f, "rt").read() if f.endswith(".xz") else Path(f).read_text()
            records += json.loads(raw)
    else:
        if not args.shapes:
            ap.error("give --shapes (or --from-raw)")
        if args.rounds < 1:
            ap.error("--rounds must be at least 1")
        records = measure(args)
    title = "The fused epilogue's cost on a fixed form: plain, bias, bias+GELU"
    if args.from_raw and records and "machine" in records[0]:
        # where and when it was measured, not where it was rendered
        first = records[0]
        text = (f"# {title}\n\n- date: {first['date']}\n- machine: {first['machine']}\n"
                f"- commit: {first['commit']}\n- rendered from {', '.join(args.from_raw)}\n\n")
    else:
        text = header(title)
    text += render(records)
    print(text)
    write("epilogue_same_form.md", text, args.out)


if __name__ == "__main__":
    main()
