"""ptxas resource report (registers, shared memory, spills) for every shipped sm80_gemm variant.

Runs on the build machine (no GPU): for each sm80_gemm variant of the shipped
manifests (configs/sm80.yaml, sm86.yaml, sm89.yaml, sm90-lowalign.yaml, or the
manifests given), compiles it with the CuTe DSL told to keep its PTX
(CUTE_DSL_KEEP=ptx), runs `ptxas -arch=<manifest arch> -v` on that PTX and
records registers per thread, spill bytes and stack frame. Shared memory is
dynamic (the A/B ring): its size is computed from the variant
(stages x (tile_m + tile_n) x bk x 2 bytes) and shown against the arch's limit.
The A100/L4 class cannot be measured on our machines; this is the record of
what each variant asks of those GPUs. Writes
benchmarks/results/<date>_sm80_resource_report.md (or --out).

    python3 benchmarks/resource_report_sm80.py [MANIFEST ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
from pathlib import Path

from _common import header, keep_ptx, ptxas_resources, write

REPO = Path(__file__).resolve().parent.parent
DEFAULT = ["configs/sm80.yaml", "configs/sm86.yaml", "configs/sm89.yaml", "configs/sm90-lowalign.yaml"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("manifests", nargs="*", default=DEFAULT)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dump = tempfile.mkdtemp(prefix="cutlass-aot-ptx-")
    keep_ptx(dump)
    # After the environment is set: the DSL reads it at import.
    from cutlass_aot.builder.manifest import load_manifest  # noqa: PLC0415
    from cutlass_aot.builder.plan import compile_options  # noqa: PLC0415
    from cutlass_aot.kernels.sm80 import SMEM_CAPACITY, Sm80GemmFamily, smem_bytes  # noqa: PLC0415

    fam = Sm80GemmFamily()
    rows = []
    for mpath in args.manifests:
        m = load_manifest(REPO / mpath)
        for v in m.variants:
            if v.family_ref != "sm80_gemm":
                continue
            p = v.param_dict
            fam.compile(p, m.arch, compile_options(m.arch))
            for r in ptxas_resources(dump, m.arch):
                regs = ",".join(r["registers"]) or "?"
                spills = "; ".join(f"{a}/{b}" for a, b in r["spills"]) or "?"
                stack = ",".join(r["stack"]) or "?"
                sig = fam.signature(p, m.arch)
                rows.append(
                    f"| {m.arch} | {p['a']} | {p['a_major']}{p['b_major']}{p['d_major']} | {sig.get('d')} "
                    f"| {'C' if p['with_c'] else '-'} | {p['rank']} | {p['align']} | {p['tile']} "
                    f"| {p['warps']} | {p['bk']} | {p['stages']} | {regs} | {smem_bytes(p)} / "
                    f"{SMEM_CAPACITY[m.arch]} | {stack} | {spills} |")
                print(rows[-1], flush=True)
    text = header("ptxas resource report, sm80_gemm (every shipped variant, every arch)")
    text += ("`ptxas -arch=<arch> -v` on the PTX the CuTe DSL emits for each variant (the artifact's "
             "cubin comes from the same PTX). Registers per thread; shared memory is dynamic (the A/B "
             "ring), computed from the variant and shown against the arch's per-CTA limit; spill "
             "stores/loads in bytes. These GPUs (A100, A10, L4, L40S) are not available to us: no "
             "throughput is claimed for them.\n\n")
    text += ("| arch | ab | majors (a b d) | d | C | rank | align | tile | warps | bk | stages "
             "| registers | smem bytes / limit | stack frame | spill st/ld |\n")
    text += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    day = dt.date.today().isoformat()
    print("wrote", write(f"{day}_sm80_resource_report.md", text, args.out))


if __name__ == "__main__":
    main()
