"""Select: every dispatch decision, as pure functions of plain data.

Run side, and pure: imports the standard library and the core modules only
(no torch, no tvm_ffi), so all of it is tested on a CPU. The hot path
(run/dispatch.py) reads tensor metadata, hands it here as ints, tuples and
strings, and launches what comes back.

What is decided here:

* the call's signature, from dtypes, shapes and strides (``call_signature``);
* whether the shapes agree, whether ``out`` overlaps itself, and whether it
  shares a byte with an operand (``views_overlap``: exact, by arithmetic);
* which signatures serve a call, and whether the call must be staged
  through 16-byte aligned copies (``signature_order``, ``staged``);
* the candidates of a signature (one per schedule; the newest build wins);
* the variant and split count for one problem (``choose``):

  1. the selection table's row for this exact (M, N, K, L), if the table was
     measured on this GPU and names a variant the cache has;
  2. else the row of the largest smaller M at the same N, K and L whose
     variant (or, within 5% of it at that M, its runner-up) runs the same
     tiles at both M (``row_below``);
  3. else, for a residual (with-C) signature only (``row_above_serves``),
     the row of a larger M at the same N, K and L whose variant runs the
     same tiles at both M, when its time there is within ``ROW_ABOVE_BOUND``
     of the time of the nearest row below (``row_above``);
  4. else the analytic model (``estimate_us``) over every candidate and
     every split count of ``SPLIT_CHOICES``;

  and from ``PROMOTE_FROM_K`` on, whichever rule chose, the promoted
  sibling of the schedule where the cache has one (``promoted``: the same
  tile, its accumulators promoted out of the tensor core, r71);

Rule 2 is the one way a row reaches another shape, and it follows from two
facts, not from a fit: a variant whose tile grid is the same at M as at
M' < M does the same tiles, waves and k-blocks (only A's extra rows
differ, a few KB for decode), and no option runs faster on a larger M
(its grid only grows). So the row's winner at M' is still within its
margin at M. It covers the M a service calls between its tuned buckets
(2-7 tokens under a row at 1, when the row's swapped tile is 16 tokens
wide). Replayed on the decode grid's recorded sweeps (every option timed;
three runs, r11 and r14), it took the 44 problems between the table's M
buckets from the model's picks (regret up to 1.26) to the rows' winners
(regret at most 1.046), pick / cuBLAS 1.026 -> 1.051 in r14
(benchmarks/results/2026-12-01_h200_r14_notes.md).

Rule 3 (r65) is the same fact seen from above, with a bound instead of a
guarantee. A variant whose tile grid is the same at M as at M'' > M does
the same tiles with fewer rows, so it runs M in at most its time at M''.
Another option may run M faster still, but none runs it faster than the
fastest option at a smaller M' (again: no option runs faster on a larger
M), which the row at M' measured. So the row above's winner is within
t(M'') / t(M') of the best at M, and the rule takes it only where that
ratio is at most ``ROW_ABOVE_BOUND``: between two tuned token counts whose
times are close, which is where a service's batch sizes fall. The model
carries no such bound: with C, at 72 tokens of 4096x14336 on an H100 it
took a split 128x256 tile at 62.6 us where the 128-token row's 128x64
K-cluster tile, 45.1 us at 128 tokens, covers 72 tokens on the same tiles
(r65 call C, cuBLAS's addmm 48.6 us). Rows timed at the power cap's clock
(``steady_ms``) take no part: their times are of another regime.

The bound is not a guarantee on this hardware, and the rule serves
residual calls only (r66 call F, H100, benchmarks/results/2026-12-06_r66_notes.md).
With C, a cut last row of tiles cost more than the whole row: 453 x 4096 x
14336 ran 108.4 us on the pingpong 128x128 tile its 512-token row timed at
83.3 (1.30x; 0.74 of addmm), 169 tokens 66.3 on the 256-token row's 128x80
1x4 (59.7). Yet at a fresh held-out seed (66, bf16) the rule moved 8 of 32
residual picks, 0.972x their time (worst 1.138x, 169 tokens), and took the
sample from 1.002 to 1.012 of addmm: between 65 and 128 tokens it keeps the
K-cluster tile the model gives up for r66's wider twins. Its A/B on plain
calls never ran (the script's bug, fixed since), so plain calls keep rules
1, 2 and 4 until one does.

A table row is not carried over to nearby shapes otherwise. Until 2026-11-30 the
nearest measured shape within a log distance of 0.5 lent its variant, but
tile and wave quantization make a winner at one shape a poor bet a few
percent away (128 -> 160 tokens, 4096 -> 4816 columns: another wave of
tiles). Measured, with the 180-row table: leaving each of 76 table problems
out, the nearest rule picked at a geomean regret of 1.57 (24 picks), the
model at 1.05; on the fit sample the model alone was as good or better.
``distance`` remains for reports.

Distance between problems: ``sum(|log2(x / x')|)`` over M, N and K, plus 4
if L differs (a batched problem is only near another of the same batch).
A factor of two in one dimension is a distance of 1.

The model (``estimate_us``), after the idea of analytic GEMM heuristics such
as NVIDIA's nvMatmulHeuristics and the wave-quantization arithmetic of
stream-K papers: a problem of T output tiles, each split S ways along K, is
T*S work units on P persistent CTAs, so it takes ceil(T*S / P) waves; a
unit's time is the larger of its tensor-core time (tile efficiency times the
SM's share of peak) and its operand traffic (the SM's share of L2/HBM
bandwidth), plus a fixed cost per unit (prologue and epilogue); the whole
problem cannot beat its HBM traffic: the operands once, plus what a raster
order reads again when the L2 cannot hold it across waves, and D once
(``_reread_bytes``; a share of the re-read's time is paid on top, since it
competes with the tile stores, and among orders the model times alike the
one reading less again ranks first). At short K a cooperative tile's store
is a large share of its time: a share of it is exposed, at the SM's share
of HBM bandwidth while every SM stores, and the pingpong schedule hides most
of it; operands that fit in L2 feed the SMs faster than HBM would. A split-K variant is
a hybrid: its whole waves of tiles run full-K, only the T mod P tiles of the
last partial wave are split (T mod P times S units of K/S), which adds their
partials' traffic and a second kernel. A pingpong variant overlaps one
tile's epilogue with the next tile's mainloop, so only a share of the fixed
cost per unit stays exposed (``PINGPONG``). A gemv-family variant (``GEMV``,
``gemv_estimate_us``) is a weight stream instead: the weight read from HBM
once at the rate its loads in flight sustain, its warps' chain of
latency-bound segments, or its fp32 FMAs on CUDA cores, whichever is
longest. Its constants (``MODEL``) were fitted
on a seeded random shape sample measured on the H200 and are reported on a
different, held-out sample (benchmarks/bench_selection.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from .. import archs
from ..errors import ArgumentError
from ..layout import GEMM_ABIS, GEMM_SPLITK_ABI
from ..signature import Signature, ceil_div, gemm_signature, splitk_tail_tiles, streamk_plan

# Split counts the run side may choose for a split-K variant (1 is the
# variant's own data-parallel behaviour and never worth its second pass).
SPLIT_CHOICES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# A split takes at least this many 64-deep k-blocks.
MIN_K_BLOCKS_PER_SPLIT = 2
# Scratch larger than this (fp32 elements) is never chosen: int32 indexing.
MAX_WORKSPACE_ELEMS = 2**31 - 1

# Constants of the analytic model (module docstring), fitted by
# benchmarks/fit_model.py (--max-efficiency 0.95) on the fit sample (seed
# 1001) measured on the H200 with cold L2, two runs together: r7 (b7f1103,
# 165 bf16 shapes) and r8 (13e1d7f, 166, with the 256-row tiles). Reported
# by replay on the held-out raws (benchmarks/replay_selection.py;
# benchmarks/results/2026-11-30_h200_r8_replay_refit.md). The PINGPONG
# constants and the untouched tiles keep earlier fits (45040e2, b86a3b0).
MODEL = {
    "peak_tflops": 989.0,        # dense bf16/f16 tensor-core peak of the H200 (132 SMs)
    "hbm_tbps": 4.224,            # effective HBM bandwidth, TB/s
    "sm_gbps": 64.152,             # operand bandwidth one SM can pull, GB/s
    "unit_us": 0.3283,            # fixed cost per work unit (prologue, epilogue)
    "launch_us": 2.2118,            # fixed cost per kernel on the stream
    "splitk_pass_us": 1.4,         # split-K's second kernel
    "splitk_fill_us": 2.0,         # ... and more, the more SMs the split units fill (below)
    "reduce_split_us": 0.54,        # latency of one step of split loads in the reduce pass
    "l2_share": 1.4256,             # operand reuse through L2 when many SMs read at once
    "swap_penalty": 0.9,         # factor for a swapped variant
    "kcluster_us": 0.5,          # a K-cluster's exchange of partials per tile (_estimate)
    "kcluster_kb_us": 0.01,      # ... and per KiB of fp32 partials pushed to the first CTA
    "kcluster_wide": 0.05,       # a K-cluster of 3 or 4 CTAs: this factor per CTA beyond 2
    # 4-CTA clusters (2x2, 1x4, 4x1). Until r32 a factor of 1.32 on each
    # stood for their fewer co-resident clusters; since r32 ``_estimate``
    # counts those (``cluster_slots``: 29 on 132 SMs, not 33), and what is
    # left was refitted (below): 1.0 for 2x2 and 1x4.
    "cluster4_factor": 1.0,
    # r33: 1x4 (four tiles along N sharing the A tile by multicast) apart
    # from 2x2. On the fit sweeps with the 3-4 CTA options re-timed on the
    # resident grid (587 problems, cluster_grid_probe.py --from-raw), 0.93-
    # 0.97 read objective 0.0753-0.0758 against 0.0775 at 1.0, 0.85 0.0845
    # (benchmarks/results/2026-12-03_h200_r33_notes.md).
    "cluster14_factor": 0.95,
    # Swapped tiles in clusters along the weight (2x1, 4x1: the token panel
    # multicast; configs/sm90.yaml's mid-m-clusters), grid-searched by
    # benchmarks/fit_terms.py on r24's fit-sample probe (tile_probe.py --raw:
    # 54 bf16 shapes, M 17..512, the probed options and the old best; every
    # other constant held): objective 0.0723 -> 0.0627, regret median 1.046 ->
    # 1.035. Every 4x1 value from 1.25 to 1.5 picks the same (they differ only
    # in the estimates' error, 0.0625-0.0637), so 4x1 keeps 2x2's 1.32.
    # Replayed on the held-out probe (126 shapes, never fitted): median 1.042
    # -> 1.039, p90 1.204 -> 1.191 (benchmarks/results/2026-12-02_h200_r24_notes.md).
    #
    # r32: the first fit sample could not tell 4x1 factors of 1.0-1.32 apart
    # (objective 0.0726-0.0730), so a second fit sample was swept (fit2,
    # seed 3003: 112 bf16 shapes with 17 <= M <= 512, every option;
    # ..._r32_selection_fit2_285cf1c.md). On both fit samples and the fit
    # probes (1173 problems), with the co-resident clusters counted, the grid
    # (4x1 1.0-1.32, 2x2/1x4 1.0-1.45, 2x1-swap 1.0-1.2, a 4x1 split-K
    # factor of its own 1.0-1.5) chose 4x1 1.05, 2x2/1x4 1.0, 2x1-swap 1.1
    # and split-K 4x1 >= 1.2 (kept at 1.32): objective 0.0772 -> 0.0759.
    # Below 1.2 the split-K 4x1 forms are picked where they lose (fit
    # regret worst 1.651 -> 1.679). Replayed on the held-out probes (1254
    # problems, never fitted): regret median 1.029 -> 1.025, p90 1.167 ->
    # 1.153, geomean 1.0558 -> 1.0511 (benchmarks/results/2026-12-03_h200_r32_notes.md).
    "swap_cluster2_factor": 1.1,  # a swapped tile in a 2x1 cluster
    # r34: two terms for swapped forms the fit residuals showed running
    # slower than modelled. A 256-row swapped tile alone in its cluster
    # (256x144/160/176/192: the weight rows on the 256-row side), split-K
    # or not: residuals (log, against the same problem's unswapped options
    # near its best) +0.03-0.12 plain in 8 of 9 M bands, +0.06-0.16
    # split-K in all. And a swapped tile in a 1x2 cluster past 1024 tokens:
    # the 256-row ones read +0.08-0.15 past 512 (-0.08-+0.01 below; the
    # grid tied 512 and 1024); r29's 128-row token pairs, mixed
    # (-0.06-+0.02), so this term rests on the live check below.
    # Grid-searched on r33's fit data (587 problems) with r31's token-pair
    # probe of the fit sample (132 shapes, its 3-4 CTA options left out:
    # timed before the resident grid): objective 0.0717 -> 0.0688 (the
    # 256-row pair, flat over 1.05-1.1 and 1.15-1.3) -> 0.0680 (with the
    # 1x2 term). Replayed on 469 held-out problems, never fitted: regret
    # geomean 1.0534 -> 1.0487, median 1.023 -> 1.018, p90 1.173 -> 1.153.
    # Timed live, the 56 picks the two move, new against old in pairs:
    # 0.964 (fit 0.988, held-out 0.949); the held-out sample's worst
    # regret against its best known option and two 3-4 CTA rivals, 1.393
    # -> 1.253 (benchmarks/results/2026-12-04_h200_r34_notes.md). A first
    # form, a transposed-store cost per 128 tokens of a swapped tile with
    # the swap factor 0.85, read 0.0652 on the fit data and gained in
    # replay, but its 110 moved picks timed 1.000 and the held-out worst
    # rose to 1.407: not taken.
    "swap256_factor": 1.05,
    "swap256_split": 1.15,
    "swap12_wide_factor": 1.2,
    "swap_wide_min_m": 1024,
    "cluster41_factor": 1.05,     # a plain (not split-K) tile in a 4x1 cluster
    "cluster41_split": 1.32,      # a split-K tile in a 4x1 cluster
    "streamk_us": 3.0,           # stream-K's pass beyond split-K's (_estimate)
    "streamk_seg": 8.0,          # ... and its fixed cost per tile edge a run crosses, in unit_us
    "unit_192": 4.0,             # the fixed cost per unit of a 192-row tile, in unit_us (below)
    # Three terms for short K, grid-searched together (every other constant
    # held) on the r9 and r16 fit sweeps and r18's small-M fit sweep (248
    # problems): objective 0.0595 -> 0.0527, fit regret worst 1.456 -> 1.290
    # (benchmarks/results/2026-12-02_h200_r21_notes.md).
    "l2_resident_share": 1.7,    # l2_share when A and B together fit in L2_REUSE_BYTES
    "reread_add": 0.25,          # share of the re-read bytes' HBM time paid beyond the floor
    "epi_hbm": 0.25,             # share of a unit's tile store exposed at its SM's share of HBM
}
# Relative mainloop throughput of each CTA tile (wgmma shape, warpgroups), as
# fitted (for memory-bound decode tiles the value mostly ranks them).
TILE_EFFICIENCY = {
    (128, 256): 0.81, (256, 128): 0.869, (128, 192): 0.7776, (128, 160): 0.666,
    (128, 144): 0.5184, (128, 128): 0.72, (64, 256): 0.66, (64, 128): 0.58, (128, 64): 0.56,
    (64, 64): 0.42, (128, 32): 0.2138, (64, 32): 0.168, (128, 16): 0.20, (64, 16): 0.09,
    # The 256-row narrow tiles (first fitted alone with --only-tiles on the
    # r8 run, then with every constant on both runs, as above).
    (256, 144): 0.6188, (256, 160): 0.6875, (256, 192): 0.5625,
    # The 192-row tiles (three consumer warpgroups), with MODEL["unit_192"]:
    # grid-searched together (every other constant held) on the fit sample's
    # 106 bf16 shapes with M >= 257, timed with the 192-row options next to
    # the best option r16 recorded (benchmarks/tile_probe.py, r20): objective
    # 0.0648 -> 0.0465. Their epilogue runs twelve 16-column chunks behind
    # two 384-thread barriers each, hence the larger fixed cost. Replayed on
    # the held-out sample's 196 pairs with M >= 257, never fitted on: model
    # pick / cuBLAS 0.890 -> 0.901, p90 regret 1.168 -> 1.155, worst
    # unchanged (benchmarks/results/2026-12-02_h200_r20_notes.md).
    (192, 128): 0.8, (192, 160): 0.8, (192, 192): 0.8,
    # r25's widths 80, 96 and 112, interpolated linearly between the fitted
    # 64x64 and 64x128, 128x64 and 128x128 (not fitted).
    (64, 80): 0.46, (64, 96): 0.50, (64, 112): 0.54,
    (128, 80): 0.60, (128, 96): 0.64, (128, 112): 0.68,
    # r27's 48-wide tiles (decode panels unswapped, 33..48 tokens swapped),
    # interpolated linearly between the fitted 32- and 64-wide ones.
    (64, 48): 0.29, (128, 48): 0.39,
    # r27's widths 176..240 (configs/sm90.yaml's narrow-fit), interpolated
    # linearly between the fitted 128x160, 128x192 and 128x256, and kept so:
    # fitted alone on the fit sample's probe of them (fit_model.py
    # --only-tiles, M >= 129, 123 bf16 shapes) 224 and 240 came out at 0.71
    # and 0.72, objective 0.0805 -> 0.0781 (regret geomean 1.066 -> 1.065),
    # and the held-out probe (112 shapes, never fitted) read worse with the
    # fitted values than the interpolated ones (1.070 against 1.064):
    # within noise, not taken (benchmarks/results/2026-12-02_h200_r27_notes.md).
    (128, 176): 0.72, (128, 208): 0.786, (128, 224): 0.794, (128, 240): 0.802,
    # The 256x176 tile (configs/sm90.yaml's wave-fit-tall), fitted alone
    # (fit_model.py --only-tiles 256x176) on r28's fit-sample probe of it
    # (123 bf16 shapes, M >= 129): 0.625 interpolated -> 0.5625, objective
    # 0.0559 -> 0.0555. Replayed on the held-out probes (112 shapes a dtype,
    # never fitted): regret geomean 1.0435 -> 1.0408 (bf16), 1.0436 ->
    # 1.0412 (f16), p90 1.130 -> 1.112 and 1.118 -> 1.113
    # (benchmarks/results/2026-12-02_h200_r28_notes.md). It rarely wins:
    # best of both / best before moved on 4 of 347 probed shapes by > 2%.
    (256, 176): 0.5625,
}
# Pingpong variants (two warpgroups on alternate tiles): their own mainloop
# throughput per tile, and the share of the fixed cost per unit that stays
# exposed (the epilogue runs under the other warpgroup's mainloop). Fitted
# alone (fit_model.py --only-pingpong, the constants above held) on the fit
# sample re-measured at b86a3b0 (148 bf16 shapes). A refit of every constant
# on that raw lowered the fit objective further but put the cooperative
# 128x128 tile at 1.15x the tensor-core peak, so it was not taken.
PINGPONG = {
    "efficiency": {(128, 128): 0.68, (64, 256): 0.64},
    "unit_share": 0.35,
}


@dataclass(frozen=True)
class Candidate:
    """One schedule of one signature in the cache."""

    key: str
    tile_m: int
    tile_n: int
    cluster_m: int
    cluster_n: int
    raster: str = "m"
    swizzle: int = 1
    swap_ab: bool = False
    split_k: bool = False
    # Other tuning parameters of a family (sm80_gemm: warps, bk, stages),
    # as sorted (name, value) pairs; they tell its variants apart.
    extra: tuple = ()
    # sm90_gemm's pingpong schedule: two warpgroups on alternate tiles.
    pingpong: bool = False
    # The gemv family: a CUDA-core weight stream; tile_m x tile_n is its CTA's
    # tokens x weight rows (its tiles are below 64 rows, so its schedules never
    # collide with a wgmma tile's).
    gemv: bool = False
    # sm90_gemm's K-cluster: CTAs of a cluster sharing each tile's K.
    k_cluster: int = 1
    # sm90_gemm's accumulator promotion: k-stages between promotions (0: off).
    promote: int = 0

    @property
    def cluster_size(self) -> int:
        """CTAs in one cluster, K-cluster CTAs included: what the kernel
        divides its persistent grid by (run/occupancy.py)."""
        return self.cluster_m * self.cluster_n * self.k_cluster

    @property
    def schedule(self) -> tuple:
        """What tells this variant apart from the others of its signature (a
        table row's identity: tables.schedule_of), the family's extra
        parameters included."""
        return (self.tile_m, self.tile_n, self.cluster_m, self.cluster_n, self.raster,
                self.swizzle, self.swap_ab, self.split_k, self.pingpong, self.k_cluster,
                self.promote, self.extra)

    def label(self) -> str:
        if self.gemv:
            return f"gemv{self.tile_m}x{self.tile_n}"
        text = (f"{self.tile_m}x{self.tile_n}/{self.cluster_m}x{self.cluster_n}/"
                f"{self.raster}{self.swizzle}")
        text += "".join(f"/{k}{v}" for k, v in self.extra)
        return (text + ("/swap" if self.swap_ab else "") + (f"/pr{self.promote}" if self.promote else "")
                + ("/splitk" if self.split_k else "")
                + ("/pp" if self.pingpong else "")
                + (f"/kc{self.k_cluster}" if self.k_cluster > 1 else ""))

    def variant_fields(self) -> dict:
        """The schedule as manifest parameters (how a table row names it)."""
        if self.gemv:
            return {"tile": f"{self.tile_m}x{self.tile_n}", "cluster": "1x1", "gemv": True}
        return {"tile": f"{self.tile_m}x{self.tile_n}",
                "cluster": f"{self.cluster_m}x{self.cluster_n}",
                "raster": self.raster, "swizzle": self.swizzle,
                "swap_ab": self.swap_ab, "split_k": self.split_k, "pingpong": self.pingpong,
                "k_cluster": self.k_cluster, **({"promote": self.promote} if self.promote else {}),
                **dict(self.extra)}


# Where a choice came from when the selection table made it: the exact row,
# the row below (``row_below``) or a row above (``row_above``). Autotune
# leaves these alone.
TABLE_SOURCES = ("table", "table-below", "table-above")


@dataclass(frozen=True)
class Choice:
    """What to launch: a candidate, its split count, and why it was chosen."""

    candidate: Candidate
    splits: int
    source: str  # one of TABLE_SOURCES, or "model"
    staged: bool = False  # served through 16-byte aligned copies (dispatch's staged route)

    def label(self) -> str:
        text = self.candidate.label()
        if self.candidate.split_k:
            # split count 0: the same artifact's stream-K schedule
            text = text.replace("/splitk", "/streamk") if self.splits == 0 else f"{text}x{self.splits}"
        return ("staged:" if self.staged else "") + text


_EXTRA_FIELDS = ("warps", "bk", "stages")  # tables.EXTRA_FIELDS


def candidate_from_variant(key: str, variant: Mapping) -> Candidate:
    """The schedule of an index record's variant parameters (any GEMM family)."""
    tm, tn = (int(x) for x in str(variant["tile"]).split("x"))
    cm, cn = (int(x) for x in str(variant.get("cluster", "1x1")).split("x"))
    extra = tuple((f, variant[f]) for f in _EXTRA_FIELDS if f in variant)
    return Candidate(key, tm, tn, cm, cn, str(variant.get("raster", "m")),
                     int(variant.get("swizzle", 1)), bool(variant.get("swap_ab", False)),
                     bool(variant.get("split_k", False)), extra,
                     bool(variant.get("pingpong", False)), bool(variant.get("gemv", False)),
                     int(variant.get("k_cluster", 1)), int(variant.get("promote", 0)))


def candidates(records: Iterable[tuple[str, Mapping, str]]) -> list[Candidate]:
    """One candidate per schedule from (key, variant, built_at); the newest build wins."""
    uniq: dict[tuple, Candidate] = {}
    for key, variant, _ in sorted(records, key=lambda r: r[2]):
        cand = candidate_from_variant(key, variant)
        uniq[(cand.schedule, cand.extra)] = cand
    return list(uniq.values())


def gemm_entries(entries: Iterable) -> list:
    """The cache entries (run/load.py ``Entry``) with a GEMM calling convention:
    a user family with op "gemm" but another ABI must not be called this way."""
    return [e for e in entries if e.record["abi"] in GEMM_ABIS]


def entry_candidates(entries: Iterable) -> list[Candidate]:
    """``candidates`` of a signature's cache entries that have a GEMM calling
    convention (a split-K entry is one by its ABI)."""
    return candidates((e.key, dict(e.variant, split_k=e.record["abi"] == GEMM_SPLITK_ABI),
                       e.record["built_at"]) for e in gemm_entries(entries))


def signature_order(call_sig: Signature, call_align: int, device_archs: Sequence[str]
                    ) -> list[Signature]:
    """Signatures that can serve a call, preferred first.

    The 16-byte aligned signatures (the TMA + wgmma family on the device's
    exact arch, then the other archs the device runs) come first, whatever
    the call's alignment: a call below 16 bytes is served by them *staged*
    (``staged``: its misaligned operands copied into 16-byte pitched scratch,
    and out copied back). Then every low alignment the call allows, widest
    first (wider copies are faster), in ``runnable_archs`` order.

    For a call below 16 bytes that a cache serves both ways, dispatch then
    weighs the staged route against the first low-alignment signature here
    (``prefer_staged``); with only one of them, that one serves.
    """
    out = []
    for align in (16, *(a for a in (8, 4, 2) if a <= call_align)):
        for arch in device_archs:
            out.append(Signature(call_sig.op, arch, tuple(
                (k, align if k == "align" else v) for k, v in call_sig.fields)))
    return out


def staged(sig: Signature, call_align: int) -> bool:
    """Whether serving a call of ``call_align`` bytes with ``sig`` needs staging copies."""
    return int(dict(sig.fields).get("align", 16)) > call_align


# ------------------------------------------------------------ the signature
def major(strides: Sequence[int], shape: Sequence[int], last: str, first: str) -> str | None:
    """Which of the last two dims has stride 1 (the last one first), or None."""
    if strides[-1] == 1:
        return last
    if strides[-2] == 1:
        return first
    return None


def call_signature(arch: str, dtypes: Mapping[str, str], shapes: Mapping[str, tuple],
                   strides: Mapping[str, tuple], act: str = "none") -> Signature:
    """The signature of a call, from its tensors' metadata as plain data.

    ``dtypes``/``shapes``/``strides`` map "a", "b", "out" (and "c", "bias"
    when given) to dtype names (f16, bf16, f32), shape and stride tuples.
    Raises ArgumentError naming the tensor and the fix.
    """
    rank = len(shapes["a"])
    mats = [n for n in ("a", "b", "out", "c") if n in shapes]
    if rank not in (2, 3) or any(len(shapes[n]) != rank for n in mats):
        raise ArgumentError(
            "gemm takes 2-D a[M,K], b[K,N], out[M,N] or 3-D a[L,M,K], b[L,K,N], out[L,M,N] "
            "(c like out); got ranks " + ", ".join(f"{n}={len(shapes[n])}" for n in mats))
    for n in ("a", "b"):
        if dtypes[n] not in ("f16", "bf16"):
            raise ArgumentError(f"gemm: {n} has dtype {dtypes[n]}; inputs must be float16 or "
                                "bfloat16", tensor=n)
    majors = {}
    for n, last, first in (("a", "k", "m"), ("b", "n", "k"), ("out", "n", "m"), ("c", "n", "m")):
        if n not in shapes:
            continue
        mj = major(strides[n], shapes[n], last, first)
        if mj is None:
            raise ArgumentError(
                f"gemm: {n} has strides {tuple(strides[n])}: neither of its last two dims is "
                "contiguous; pass a row- or column-major view (e.g. .contiguous())", tensor=n)
        majors[n] = mj
    if "c" in shapes and (dtypes["c"] != dtypes["out"] or majors["c"] != majors["out"]):
        raise ArgumentError(
            f"gemm: c must have out's dtype and layout (out: {dtypes['out']}, "
            f"{'row' if majors['out'] == 'n' else 'column'}-major); got {dtypes['c']}, "
            f"strides {tuple(strides['c'])}", tensor="c")
    bias = None
    if "bias" in shapes:
        if len(shapes["bias"]) != 1 or shapes["bias"][0] != shapes["out"][-1]:
            raise ArgumentError(
                f"gemm: bias must be a vector of length N = {shapes['out'][-1]}; got shape "
                f"{tuple(shapes['bias'])}", tensor="bias")
        if dtypes["bias"] not in (dtypes["out"], "f32"):
            raise ArgumentError(
                f"gemm: bias must have out's dtype ({dtypes['out']}) or float32; got "
                f"{dtypes['bias']}", tensor="bias")
        bias = dtypes["bias"]
    return gemm_signature(
        arch, a=dtypes["a"], b=dtypes["b"], d=dtypes["out"], c=dtypes.get("c"),
        a_major=majors["a"], b_major=majors["b"], d_major=majors["out"], rank=rank,
        align=16, bias=bias, act=act)


def check_shapes(a: tuple, b: tuple, out: tuple, c: tuple | None) -> tuple[int, int, int, int]:
    """(M, N, K, L) of agreeing shapes; raises ArgumentError otherwise."""
    *la, m, k = a
    *lb, k2, n = b
    want = (*la, m, n)
    if k != k2 or la != lb or tuple(out) != want or (c is not None and tuple(c) != want):
        raise ArgumentError(
            f"gemm shapes do not agree: a{tuple(a)} @ b{tuple(b)} -> out{tuple(out)}"
            + ("" if c is None else f", c{tuple(c)}")
            + f"; expected out (and c) of shape {want}")
    return m, n, k, (la[0] if la else 1)


def check_no_internal_overlap(shape: Sequence[int], strides: Sequence[int]) -> None:
    """Refuse an output whose elements share memory (stride 0, overlapping rows).

    The artifact's checks accept any 16-byte-divisible stride, 0 included, so
    such an output would launch and race on itself. Sufficient test: ordered
    by stride, each dim of size > 1 must step past the whole extent of the
    dims inside it.
    """
    dims = sorted((s, n) for s, n in zip(strides, shape) if n > 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            raise ArgumentError(
                f"gemm: out of shape {tuple(shape)} and strides {tuple(strides)} has elements "
                "that share memory (a broadcast or overlapping view); write into a tensor "
                "whose rows do not overlap", tensor="out", reason="overlap")
        extent = stride * size


@functools.lru_cache(maxsize=1024)
def _layout(shape: tuple, strides: tuple, item: int) -> tuple[int, int, int, tuple]:
    """A non-empty view's bytes as blocks of evenly pitched rows.

    Returns (rows, pitch, width, blocks): each block is ``rows`` runs of
    ``width`` contiguous bytes, ``pitch`` apart, and ``blocks`` holds the
    (count, step in bytes) dims that place the blocks, outermost last (empty
    for a view that is one block). A row is the unit-stride dim's elements
    (one element where no dim has unit stride); the other dims, ordered by
    stride, merge where each steps exactly the extent of the one inside it,
    and a dim that steps at most the row width widens the row (rows that
    meet or overlap are one run). Of the dims left, the largest is the
    block's rows, so the fewest blocks are walked. Dims of size 1 and
    stride-0 (broadcast) dims add no bytes and are dropped. A layout, not a
    pointer: cached, as a process sees few layouts.
    """
    dims = sorted((s, n) for s, n in zip(strides, shape) if n > 1 and s != 0)
    width = item
    if dims and dims[0][0] == 1:
        width = dims[0][1] * item
        dims = dims[1:]
    runs: list[list[int]] = []  # [count, step], merged
    for stride, size in dims:
        step = stride * item
        if runs and step == runs[-1][0] * runs[-1][1]:
            runs[-1][0] *= size
        else:
            runs.append([size, step])
    while runs and runs[0][1] <= width:
        count, step = runs.pop(0)
        width += (count - 1) * step
    if not runs:
        return 1, width, width, ()
    rows, pitch = max(runs, key=lambda r: r[0])
    runs.remove([rows, pitch])
    return rows, pitch, width, tuple((count, step) for count, step in runs)


def _row_hits(start: int, end: int, first: int, rows: int, pitch: int, width: int) -> bool:
    """Whether rows first + i * pitch (i < rows), each ``width`` bytes, touch [start, end)."""
    # row i touches it when first + i * pitch < end and first + i * pitch + width > start
    lo = (start - width - first) // pitch + 1
    hi = -((first - end) // pitch) - 1  # ceil((end - first) / pitch) - 1
    return max(lo, 0) <= min(hi, rows - 1)


def _floor_sum(n: int, m: int, a: int, b: int) -> int:
    """Sum of floor((a * t + b) / m) over t in [0, n), for a >= 0 and m > 0.

    Euclid's algorithm on the line's slope: take the whole parts of a / m
    and b / m out, then count the lattice points under the line with the
    axes swapped (the floor-sum reduction, as in the AtCoder Library). Steps
    are logarithmic in m.
    """
    total = 0
    while n > 0:
        if a >= m:
            total += (a // m) * (n * (n - 1) // 2)
            a %= m
        if not 0 <= b < m:
            total += (b // m) * n
            b %= m
        top = a * n + b
        if top < m:
            break
        n, b, m, a = top // m, top % m, a, m
    return total


def _rows_meet(fx: int, nx: int, px: int, wx: int, fy: int, ny: int, py: int, wy: int) -> bool:
    """Whether pitched rows x (fx + i * px, i < nx) and y share a byte; rows ``w`` bytes wide."""
    if nx == 1:
        return _row_hits(fx, fx + wx, fy, ny, py, wy)
    if ny == 1:
        return _row_hits(fy, fy + wy, fx, nx, px, wx)
    if px == py:
        # row j of y against row i of x: offset d + t * pitch, t = j - i
        d = fy - fx
        lo = (-wy - d) // px + 1
        hi = -((d - wx) // px) - 1
        return max(lo, -(nx - 1)) <= min(hi, ny - 1)
    # Row i of x meets row j of y when j * py lies in [lo_i, hi_i] (lo_i =
    # c + i * px - wy + 1, hi_i = c + i * px + wx - 1, c = fx - fy), a window
    # that moves with i. A window that holds y's first or last row's offset
    # is a hit; the windows strictly between them (a run of i) hold a
    # multiple of py as often as floor(hi_i / py) - floor((lo_i - 1) / py)
    # says, summed over the run by _floor_sum.
    last = (ny - 1) * py
    if (_row_hits(fy, fy + wy, fx, nx, px, wx)
            or _row_hits(fy + last, fy + last + wy, fx, nx, px, wx)):
        return True
    c = fx - fy
    i0 = max((wy - 1 - c) // px + 1, 0)
    i1 = min(-((c + wx - 1 - last) // px) - 1, nx - 1)  # ceil((last - wx + 1 - c) / px) - 1
    if i0 > i1:
        return False
    n, base = i1 - i0 + 1, c + i0 * px
    return _floor_sum(n, py, px, base + wx - 1) > _floor_sum(n, py, px, base - wy)


# Block pairs views_overlap tests before it answers "cannot tell": a pair of
# views placed in more blocks than this whose byte ranges interleave.
_BLOCK_PAIRS = 4096


def _block_firsts(first: int, blocks: tuple) -> list[int]:
    """The first byte of every block, from the view's first byte and its block dims."""
    firsts = [first]
    for count, step in blocks:
        firsts = [f + i * step for i in range(count) for f in firsts]
    return firsts


def views_overlap(x: tuple, y: tuple) -> bool | None:
    """Whether two strided views share a byte: True, False, or None (cannot tell).

    ``x`` and ``y`` are (data pointer, shape, strides, element size), strides
    in elements and >= 0 (torch makes no others). Views whose byte ranges do
    not meet are apart. Otherwise each view is blocks of evenly pitched rows
    (_layout; one block for a dense tensor, a slice of rows or columns, a
    padded or transposed view, a batch with no gap between batches), and
    each pair of blocks whose byte ranges meet is answered by arithmetic,
    not by a walk over rows: two row pitches by a floor sum (_rows_meet).
    The answer is exact. Only views whose byte ranges interleave across more
    than _BLOCK_PAIRS pairs of blocks give None, the answer torch's own
    overlap check gives pairs it cannot prove (it refuses only the overlaps
    it can).
    """
    if 0 in x[1] or 0 in y[1]:
        return False  # an empty view has no bytes
    lo_x, hi_x = _span(*x)
    lo_y, hi_y = _span(*y)
    if hi_x <= lo_y or hi_y <= lo_x:
        return False
    nx, px, wx, bx = _layout(tuple(x[1]), tuple(x[2]), x[3])
    ny, py, wy, by = _layout(tuple(y[1]), tuple(y[2]), y[3])
    if not bx and not by:
        return _rows_meet(lo_x, nx, px, wx, lo_y, ny, py, wy)
    return _blocks_meet((lo_x, nx, px, wx, bx), (lo_y, ny, py, wy, by))


def _blocks_meet(lx: tuple, ly: tuple) -> bool | None:
    """views_overlap for views in blocks: (first byte, rows, pitch, width, blocks) each."""
    if math.prod(c for c, _ in ly[4]) > math.prod(c for c, _ in lx[4]):
        lx, ly = ly, lx
    (fx0, nx, px, wx, bx), (fy0, ny, py, wy, by) = lx, ly
    ext_x, ext_y = (nx - 1) * px + wx, (ny - 1) * py + wy
    # Walk y's blocks (the fewer), and for each x's blocks whose bytes meet
    # it: a range of the one block index, or a filtered list where x has
    # several block dims. Every block walked, filter step and pair tested
    # spends budget.
    budget = _BLOCK_PAIRS - math.prod(c for c, _ in by)
    many = None
    if len(bx) > 1:
        budget -= math.prod(c for c, _ in bx) * math.prod(c for c, _ in by)
        if budget >= 0:
            many = _block_firsts(fx0, bx)
    if budget < 0:
        return None
    for fy in _block_firsts(fy0, by):
        if many is not None:
            firsts = [f for f in many if f < fy + ext_y and fy < f + ext_x]
        elif bx:
            (count, step), = bx
            lo = max((fy - ext_x - fx0) // step + 1, 0)
            hi = min(-((fx0 - fy - ext_y) // step) - 1, count - 1)
            firsts = range(fx0 + lo * step, fx0 + hi * step + 1, step) if lo <= hi else ()
        else:
            firsts = (fx0,) if fx0 < fy + ext_y and fy < fx0 + ext_x else ()
        for fx in firsts:
            budget -= 1
            if budget < 0:
                return None
            if _rows_meet(fx, nx, px, wx, fy, ny, py, wy):
                return True
    return False


def byte_extent(shape: Sequence[int], strides: Sequence[int], item: int) -> int:
    """Bytes from a non-empty view's first element to one past its last (strides >= 0)."""
    return (sum((n - 1) * s for n, s in zip(shape, strides)) + 1) * item


def _span(ptr: int, shape: Sequence[int], strides: Sequence[int], item: int) -> tuple[int, int]:
    """[first byte, one past the last byte) of a non-empty view with strides >= 0."""
    return ptr, ptr + byte_extent(shape, strides, item)


def check_no_alias(out: tuple, operands: dict[str, tuple | None]) -> None:
    """Refuse an ``out`` that shares memory with an operand, other than ``out`` is ``c``.

    ``out`` and each operand are (data pointer, shape, strides, element
    size), as views_overlap takes them; an operand of None is absent. A
    kernel reads its operands tile by tile while it writes ``out``, so any
    shared byte gives a wrong result, except one: ``c`` that is exactly
    ``out`` (same pointer, shape, strides and dtype size), an in-place
    residual, which every schedule reads each element of before it writes
    it (tests/gpu check it). The pairs views_overlap cannot tell (blocks
    whose byte ranges interleave past its budget of block pairs) are let
    through, as torch does.
    """
    for name, view in operands.items():
        if view is None:
            continue
        if name == "c" and view == out:
            continue
        if views_overlap(out, view):
            raise ArgumentError(
                f"gemm: out shares memory with {name} (out at {out[0]:#x}, shape "
                f"{tuple(out[1])}, strides {tuple(out[2])}; {name} at {view[0]:#x}, shape "
                f"{tuple(view[1])}, strides {tuple(view[2])}): the kernel would read "
                f"{name} while it writes out, a wrong result; write into a separate tensor"
                + (" (out may be c itself: the same view, for an in-place residual)"
                   if name == "c" else ""),
                tensor=name, reason="alias")


def misalignment(name: str, data_ptr: int, shape: Sequence[int], strides: Sequence[int],
                 item: int) -> ArgumentError | None:
    """The 16-byte alignment problem of one tensor, as an error, or None."""
    if data_ptr % 16:
        return ArgumentError(
            f"gemm: {name}'s data pointer is not 16-byte aligned (offset {data_ptr % 16}); the "
            "kernels use TMA, which needs 16-byte alignment: pass a tensor that starts on an "
            "aligned address", tensor=name, reason="alignment")
    for dim, s in enumerate(strides):
        if s != 1 and (s * item) % 16 and shape[dim] > 1:
            return ArgumentError(
                f"gemm: {name} has stride {s} in dim {dim} ({s * item} bytes), not a multiple "
                "of 16 bytes; pad its leading dimension (e.g. allocate with a row pitch "
                f"rounded up to {16 // item} elements)", tensor=name, reason="alignment")
    return None


# ---------------------------------------------------------------- the model
def _tiles(c: Candidate, m: int, n: int, batch: int) -> tuple[int, int, int]:
    if c.swap_ab:
        m, n = n, m
    tiles_m = ceil_div(ceil_div(m, c.tile_m), c.cluster_m) * c.cluster_m
    tiles_n = ceil_div(ceil_div(n, c.tile_n), c.cluster_n) * c.cluster_n
    return tiles_m, tiles_n, tiles_m * tiles_n * batch


# The artifacts declare every dynamic shape and stride as a 32-bit CuTe
# integer (kernels/gemm_decl.py), and CuTe computes a layout's element
# offsets in that width (NVIDIA/cutlass#2312): an operand a kernel indexes
# through its layout must end below 2**31 elements from its pointer. Each
# artifact checks that every dim and stride fits 32 bits, not that their
# products do. TMA is exempt: its descriptor holds 64-bit byte strides and
# per-dim coordinates (r2's fit sample ran A of 59932 x 44200 through it).
INDEX_LIMIT = 1 << 31


def element_span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from a view's first to one past its last (0 if it is empty)."""
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(shape, strides))


def layout_indexed(c: Candidate) -> tuple[str, ...]:
    """The operands ``c``'s kernel addresses through 32-bit layout offsets:
    all of them for the gemv and sm80_gemm families (CUDA-core and cp.async
    copies), only C for sm90_gemm (A, B and D move by TMA)."""
    return ("a", "b", "out", "c") if c.gemv or c.extra else ("c",)


def smem_bytes(c: Candidate, in_bytes: int) -> int | None:
    """Shared memory of an sm80_gemm candidate's A/B ring (stages x (tile M +
    tile N) x bk x element bytes, as kernels/sm80.py sizes it); None for a
    family whose variants carry no such parameters."""
    extra = dict(c.extra)
    if "stages" not in extra or "bk" not in extra:
        return None
    return int(extra["stages"]) * (c.tile_m + c.tile_n) * int(extra["bk"]) * in_bytes


def fits_device(cands: Sequence[Candidate], device_arch: str, in_bytes: int) -> list[Candidate]:
    """The candidates whose shared memory fits one CTA on ``device_arch``
    (archs.SMEM_OPTIN): an sm_80 build of 163 KiB is binary-compatible with
    sm_86/sm_89, whose SMs give a CTA 99 KiB, and would fail to launch there."""
    cap = archs.SMEM_OPTIN.get(device_arch)
    if cap is None:
        return list(cands)
    return [c for c in cands if (smem_bytes(c, in_bytes) or 0) <= cap]


def within_index_limit(cands: Sequence[Candidate], spans: Mapping[str, int]) -> list[Candidate]:
    """The candidates whose layout-indexed operands (``layout_indexed``) all
    span fewer than INDEX_LIMIT elements; ``spans`` maps a, b, out, c to
    ``element_span`` (a missing operand spans nothing)."""
    return [c for c in cands if all(spans.get(name, 0) <= INDEX_LIMIT for name in layout_indexed(c))]


def split_choices(c: Candidate, m: int, n: int, k: int, batch: int,
                  sms: int | None = None) -> tuple[int, ...]:
    """Split counts worth considering for a candidate (1 for a plain variant).

    With ``sms``, a split-K variant whose tiles fill whole waves exactly has
    no tail to split, so it offers none (its plain sibling does the same
    work without the second pass).
    """
    if not c.split_k:
        return (1,)
    k_blocks = -(-k // 64)
    _, _, tiles = _tiles(c, m, n, batch)
    if sms is not None:
        tiles = _split_tail(c, tiles, sms)
        if tiles == 0:
            return ()
    out = []
    for s in SPLIT_CHOICES:
        if k_blocks < s * MIN_K_BLOCKS_PER_SPLIT:
            break
        if tiles * s * c.tile_m * c.tile_n > MAX_WORKSPACE_ELEMS:
            break
        out.append(s)
    if sms is not None and _streamk_ok(c, tiles, k_blocks, sms):
        out.append(0)  # stream-K
    return tuple(out)


def _streamk_ok(c: Candidate, tail: int, k_blocks: int, sms: int) -> bool:
    """Whether stream-K (split count 0) is an option: at least two k-blocks a
    tile, a workspace in range, and the kernel's 32-bit plan arithmetic
    (k-block x workers) in range."""
    if k_blocks < MIN_K_BLOCKS_PER_SPLIT:
        return False
    size = c.cluster_m * c.cluster_n
    plan = streamk_plan(tail // size, k_blocks, max(1, sms // size))
    return (tail * plan.stride * c.tile_m * c.tile_n <= MAX_WORKSPACE_ELEMS
            and (plan.work + 1) * plan.workers < 2**31)


# Clusters of 2, 3 and 4 CTAs the H200 (132 SMs) runs at once, one CTA per
# SM: the driver's answer there (cuOccupancyMaxActiveClusters, r33;
# run/occupancy.py), which is also the persistent grid the run side now
# launches (``cluster_slots``).
CLUSTER_SLOTS_132 = {1: 132, 2: 66, 3: 39, 4: 30}


def cluster_slots(size: int, sms: int) -> int:
    """Clusters of ``size`` CTAs (one per SM) the GPU runs at once: the
    waves of K-clusters, and since r32 of every 4-CTA cluster (``_estimate``).

    Fewer than sms // size: a cluster's CTAs must be co-scheduled in one GPC
    (the H200's 132 SMs sit in GPCs of 16-18), so SMs are left over. The
    counts are ``CLUSTER_SLOTS_132``, scaled by the SM count for another
    GPU. Until r33 they were fitted (benchmarks/fit_kcluster.py, r15: 37
    and 29, objective 0.0623 against 0.0633 with 44 and 33): 3-CTA options
    over 40-41 tiles ran 1.6-1.8x their one-wave estimate, 4-CTA options
    over 32 tiles 1.39x. The cause was the kernels' grid of sm_count // size
    clusters, whose clusters beyond the resident ones ran late; since r33
    the run side launches the resident count (run/occupancy.py), and these
    are the driver's counts, 39 and 30, not fitted. On the fit raws with the
    3-4 CTA options re-timed on that grid (benchmarks/cluster_grid_probe.py
    --from-raw; 587 problems), 39/30 against 37/29: fit objective 0.0758
    against 0.0748, held-out replay 0.0674 against 0.0693
    (benchmarks/results/2026-12-03_h200_r33_notes.md).
    """
    if size in CLUSTER_SLOTS_132:
        return max(1, CLUSTER_SLOTS_132[size] * sms // 132)
    return max(1, sms // size)


def _split_tail(c: Candidate, tiles: int, sms: int) -> int:
    """CTA tiles a split-K candidate splits: the last partial wave's cluster
    tiles (signature.splitk_tail_tiles), times the cluster size. The waves
    are of the resident clusters (``cluster_slots``), the persistent grid
    the run side launches since r33 (run/occupancy.py)."""
    size = c.cluster_m * c.cluster_n
    return splitk_tail_tiles(tiles // size, cluster_slots(size, sms)) * size


def _reduce_step(c: Candidate) -> int:
    """Splits the second kernel loads at once (sm90_gemm._reduce_chunks): 16
    when a consumer thread holds at most 32 accumulators of the tile, else 8."""
    if c.tile_m == 192:
        threads = 384  # three consumer warpgroups (sm90_gemm.Sm90GemmConfig.consumer_wgs)
    else:
        threads = 256 if c.tile_m >= 128 and c.tile_m * c.tile_n > 128 * 128 else 128
    return 16 if c.tile_m * c.tile_n // threads <= 32 else 8


def _unit_us(c: Candidate, k_unit: int, active: int, in_bytes: int, model: Mapping,
             resident: bool = False, store_bytes: int = 2) -> float:
    """One work unit's time: the larger of its tensor-core time and its
    operand traffic (the SM's share of bandwidth with ``active`` SMs
    reading; a larger share when the operands stay ``resident`` in L2),
    plus the fixed cost per unit and the exposed part of its tile store
    (``store_bytes`` an element: D's, or fp32 for a split unit's partial),
    written while every active SM writes its own."""
    eff = TILE_EFFICIENCY.get((c.tile_m, c.tile_n), 0.5)
    fixed = (model["unit_us"] * (model["unit_192"] if c.tile_m == 192 else 1.0)
             + model["epi_hbm"] * c.tile_m * c.tile_n * store_bytes * max(active, 1)
             / (model["hbm_tbps"] * 1e12) * 1e6)
    if c.pingpong:
        eff = PINGPONG["efficiency"].get((c.tile_m, c.tile_n), eff)
        fixed *= PINGPONG["unit_share"]
    peak_sm = model["peak_tflops"] * 1e12 / 132.0
    mma_us = 2.0 * c.tile_m * c.tile_n * k_unit / (peak_sm * eff) * 1e6
    # Operand bytes a unit pulls into its SM; a cluster shares one copy of
    # the operand it multicasts.
    load_bytes = _cta_rows(c) * k_unit * in_bytes
    share = model["l2_resident_share"] if resident else model["l2_share"]
    sm_bw = min(model["sm_gbps"] * 1e9, model["hbm_tbps"] * 1e12 / max(active, 1) * share)
    return max(mma_us, load_bytes / sm_bw * 1e6) + fixed


# The gemv family (kernels/gemv_kernel.py, the resident grid since r40):
# at most two 256-thread CTAs an SM; every warp takes (block of tile_n
# weight rows, pass of tile_m tokens) items in turn. Per item a lane loads
# segments of U 16-byte chunks of each row and of each token, (R + T) x U
# <= 16 loads (8 above 4 outputs a warp) before it multiplies, so a
# segment costs one memory round trip, ``seg_us`` on an idle GPU and
# ``seg_load_us`` more with every warp slot busy. A call is the longest of
# * the latency chain: each warp's items one after another, a round trip a
#   segment;
# * the weight's stream at the rate its loads in flight sustain (Little's
#   law: the busy warps' weight chunks x 512 bytes a round trip), at most
#   ``hbm_share`` of MODEL["hbm_tbps"]; every pass of tokens after the
#   first re-reads the weight from L2, ``l2_factor`` times as fast;
# * the fp32 FMAs on CUDA cores (``fma_tflops``, conversions included);
# plus the launch and the activations' traffic. r40 set the constants from
# its gemv_floor runs (one token, K = 4096, N = 1024..28672; 1x1 within 2% of
# every time there). r41 fitted them (benchmarks/fit_gemv.py, a grid over
# all six) on the fit sample's 130 small-M pairs (M <= 16, every option
# timed on the resident kernel:
# ``benchmarks/results/2026-12-04_h200_r41_selection_fit_smallm_73755d4.md``):
# objective 0.0667 -> 0.0517, regret p90 1.150 -> 1.128. Replayed on r40's
# held-out small-M sweep, never fitted on: median regret 1.036 -> 1.027, p90
# 1.140 -> 1.088, pick / cuBLAS 1.148 -> 1.155, worst unchanged (1.258);
# live on its 104 small-M pairs (bf16 and f16), worst regret 1.245
# (``..._r41_selection_heldout_smallm_da736cc.md``). The gain rides on
# ``hbm_share``: held at 1.03, the same fit replays at p90 1.136. The price
# is absolute: at gemv_floor's one-token points the estimates read about 9%
# under the measured times (9.06 against 9.93 µs at 4096 x 4096, 51.6 against
# 56.5 at 28672 x 4096), where the table, not the model, serves the decode
# widths. r9's model (a CTA per block of rows)
# priced the one-token tile at 2.6x its measured time, so a tune's
# shortlist never held it.
GEMV = {
    "hbm_share": 1.12,        # the stream's ceiling, a share of MODEL["hbm_tbps"]
    "seg_us": 0.95,           # a segment's round trip (loads, then its multiplies), idle GPU
    "seg_load_us": 0.6,       # more with every warp slot of the GPU busy
    "l2_factor": 9.0,         # a further pass's re-read from L2, times the stream's bandwidth
    "fma_tflops": 6.0,        # fp32 FMAs per second (x 1e12) over the GPU, with conversions
    "fixed_us": -0.25,        # per call, beyond MODEL["launch_us"]
}
GEMV_WARPS = 8                # warps a CTA (kernels/gemv_kernel.py _WARPS)
GEMV_CTAS_PER_SM = 2          # resident CTAs an SM at most (_CTAS_PER_SM)


def gemv_chunks(tile_m: int, tile_n: int) -> int:
    """U: the 16-byte chunks of each row a lane loads per segment (as the
    kernel sizes it)."""
    in_flight = 16 if tile_m * tile_n <= 4 else 8
    return max(1, in_flight // (tile_m + tile_n))


def gemv_estimate_us(c: Candidate, m: int, n: int, k: int, batch: int, sms: int,
                     in_bytes: int = 2, out_bytes: int = 2, model: Mapping = MODEL,
                     gemv: Mapping = GEMV) -> float:
    """Modelled time of a gemv call, in µs (the comment above GEMV): the
    longest of the warps' latency chain, the weight's stream and the FMAs,
    plus the launch and the activations' traffic."""
    passes = -(-m // c.tile_m)
    items = -(-n // c.tile_n) * passes
    slots = GEMV_CTAS_PER_SM * sms
    ctas = min(-(-items // GEMV_WARPS), slots)
    resident = min(ctas * batch, slots)  # CTAs on the GPU at once
    waves = -(-(ctas * batch) // slots)
    per_warp = -(-items // (ctas * GEMV_WARPS))
    u = gemv_chunks(c.tile_m, c.tile_n)
    segs = max(1, -(-(k // 8) // (32 * u)))  # the kernel's segments over K's whole 16-byte chunks
    trip_us = gemv["seg_us"] + gemv["seg_load_us"] * (resident / slots)
    chain_us = waves * per_warp * segs * trip_us
    in_flight = resident * GEMV_WARPS * c.tile_n * u * 512
    tbps = min(model["hbm_tbps"] * gemv["hbm_share"], in_flight / trip_us * 1e-6)
    w_bytes = n * k * in_bytes * batch
    stream_us = w_bytes * (1 + (passes - 1) / gemv["l2_factor"]) / (tbps * 1e12) * 1e6
    fma_us = passes * c.tile_m * n * k * batch / (gemv["fma_tflops"] * 1e12) * 1e6
    io_us = (m * k * in_bytes + m * n * out_bytes) * batch / (model["hbm_tbps"] * 1e12) * 1e6
    return model["launch_us"] + gemv["fixed_us"] + max(chain_us, stream_us, fma_us) + io_us


def estimate_us(c: Candidate, splits: int, m: int, n: int, k: int, batch: int, sms: int,
                in_bytes: int = 2, out_bytes: int = 2, model: Mapping = MODEL) -> float:
    """Modelled time of one call, in µs (see the module docstring)."""
    return _estimate(c, splits, m, n, k, batch, sms, in_bytes, out_bytes, model)[0]


def _estimate(c: Candidate, splits: int, m: int, n: int, k: int, batch: int, sms: int,
              in_bytes: int, out_bytes: int, model: Mapping) -> tuple[float, float]:
    """``estimate_us``, and the operand bytes its walk reads from HBM again
    (``_reread_bytes``; 0 for a gemv variant)."""
    if c.gemv:
        return gemv_estimate_us(c, m, n, k, batch, sms, in_bytes, out_bytes, model), 0.0
    tiles_m, tiles_n, tiles = _tiles(c, m, n, batch)
    cluster = c.cluster_m * c.cluster_n
    # A cluster's CTAs must share a GPC, so fewer clusters of 4 are resident
    # than SMs / 4 (``cluster_slots``, at least 1; for 1 and 2 CTAs it is
    # SMs / size).
    slots = cluster_slots(cluster, sms) * cluster
    k_blocks = -(-k // 64)
    resident = (m + n) * k * in_bytes * batch <= L2_REUSE_BYTES
    # Split-K variants are a hybrid: whole waves run full-K, the last
    # partial wave's tiles are split.
    tail = _split_tail(c, tiles, sms) if c.split_k else 0
    full = tiles - tail
    t = model["launch_us"]
    if c.k_cluster > 1:
        # A K-cluster: waves of tiles over the clusters the GPU holds at once
        # (``cluster_slots``), each CTA a unit of its share of K, plus the
        # exchange of partials per tile (a fixed part and one per KiB the
        # other CTAs push), and a factor per CTA beyond 2. The terms and the
        # slot counts were grid-searched (benchmarks/fit_kcluster.py, every
        # other constant held) on the fit sample's small-M shapes re-measured
        # with the K-cluster variants (r15), the decode grid and the table's
        # problems (r14): objective 0.0915 (no K-cluster picks) -> 0.0623.
        # Replayed on the held-out raws, never fitted on, worst regret 1.406
        # -> 1.253, 1.522 -> 1.220, 1.389 -> 1.270, and on r15's live sweep
        # of the held-out's small-M pairs 1.448 (the first r15 form, slots
        # from a GPC count) -> 1.251
        # (benchmarks/results/2026-12-01_h200_r15_notes.md). A first form
        # (r11: a fixed exchange alone, slots = SMs / cluster size) picked
        # them at short K where they lost, up to 1.56x.
        slots = cluster_slots(c.k_cluster, sms)
        waves = -(-tiles // slots)
        k_unit = -(-k_blocks // c.k_cluster) * 64
        partial_kb = (c.k_cluster - 1) * c.tile_m * c.tile_n * 4 / 1024
        exchange = model["kcluster_us"] + model["kcluster_kb_us"] * partial_kb
        t += waves * (_unit_us(c, k_unit, min(tiles, slots) * c.k_cluster, in_bytes, model, resident,
                               out_bytes)
                      + exchange)
    else:
        waves = -(-full // slots)
        if full:
            t += waves * _unit_us(c, k_blocks * 64, min(full, slots), in_bytes, model, resident, out_bytes)
    # Nothing beats the HBM traffic: the operands once, what the walk reads
    # again, and D once.
    mm, nn = (n, m) if c.swap_ab else (m, n)
    hbm_bytes = ((mm * k + nn * k) * in_bytes + mm * nn * out_bytes) * batch
    again = _reread_bytes(c, mm, nn, k, tiles_m, tiles_n, slots, in_bytes, out_bytes) * batch
    hbm_bytes += again
    if tail and splits == 0:
        # Stream-K (signature.streamk_plan): one wave in which every worker
        # runs an even share of the tail's k-blocks, one fixed cost per tile
        # its run crosses into, at most two partial pieces per worker. The
        # two stream-K terms were grid-searched (benchmarks/fit_streamk.py,
        # every other constant held) on the fit sample's first 81 bf16
        # shapes timed with the stream-K options (r16): objective 0.0586
        # (no stream-K picks) -> 0.0540, fit regret median 1.020 -> 1.012.
        # The fixed costs come out large: every piece is an fp32 tile
        # written and read back, which is what stream-K's balance costs.
        plan = streamk_plan(tail // cluster, k_blocks, slots // cluster)
        per = -(-plan.work // plan.workers)
        active = plan.workers * cluster
        waves += 1
        t += (_unit_us(c, per * 64, active, in_bytes, model, resident, 4) + model["streamk_us"]
              + model["streamk_seg"] * model["unit_us"] * (per - 1) / max(k_blocks, 1))
        units = min(plan.tail + plan.workers - 1, 2 * plan.workers) * cluster
        partial_bytes = 2.0 * units * c.tile_m * c.tile_n * 4
        hbm_bytes += partial_bytes
        reduce_us = -(-(plan.stride - 1) // _reduce_step(c)) * model["reduce_split_us"]
        t += (model["splitk_pass_us"] + model["splitk_fill_us"] * active / slots + reduce_us
              + partial_bytes / (model["hbm_tbps"] * 1e12) * 1e6)
    elif tail:
        units = tail * splits
        split_waves = -(-units // slots)
        waves += split_waves
        k_unit = -(-k_blocks // splits) * 64
        t += split_waves * _unit_us(c, k_unit, min(units, slots), in_bytes, model, resident, 4)
        partial_bytes = 2.0 * units * c.tile_m * c.tile_n * 4
        hbm_bytes += partial_bytes
        # The second kernel: several CTAs per tile, each loading a step of
        # splits at once, so its latency grows with the number of steps,
        # its traffic with the partials.
        reduce_us = -(-splits // _reduce_step(c)) * model["reduce_split_us"]
        # The second pass costs more the more SMs the last wave's split
        # units fill: on the fit samples (r7-r9) the split options' time
        # over this model without the term ran from -1.4 µs (a few units)
        # to +1.6 µs (90-120 units) and +3.8 µs (121-131). Likely cause: the
        # reduce CTAs, launched early (PDL), wait on the SMs the GEMM leaves
        # idle, so with none idle their launch is no longer hidden. The two
        # constants were chosen on the fit samples (grid search, objective
        # 0.0577 -> 0.0558), then replayed on the held-out raws.
        last = units - (split_waves - 1) * slots
        t += (model["splitk_pass_us"] + model["splitk_fill_us"] * last / slots + reduce_us
              + partial_bytes / (model["hbm_tbps"] * 1e12) * 1e6)
    t = max(t, hbm_bytes / (model["hbm_tbps"] * 1e12) * 1e6 + model["launch_us"])
    t += model["reread_add"] * again / (model["hbm_tbps"] * 1e12) * 1e6
    if c.swap_ab:
        t *= model["swap_penalty"]
        if c.tile_m == 256 and cluster == 1:
            t *= model["swap256_split"] if c.split_k else model["swap256_factor"]
        if m > model["swap_wide_min_m"] and (c.cluster_m, c.cluster_n) == (1, 2):
            t *= model["swap12_wide_factor"]
    if c.cluster_m == 4:
        t *= model["cluster41_split"] if c.split_k else model["cluster41_factor"]
    elif cluster >= 4:
        t *= model["cluster14_factor"] if c.cluster_n == 4 else model["cluster4_factor"]
    elif c.swap_ab and c.cluster_m == 2:
        t *= model["swap_cluster2_factor"]
    if c.k_cluster > 2:
        t *= 1.0 + model["kcluster_wide"] * (c.k_cluster - 2)
    return t / _raster_gain(c, tiles_m, tiles_n, waves), again


# Bytes of operand reuse the L2 is taken to hold across waves: less than the
# H200's 60 MiB (as the device reports it), since its L2 is two partitions
# and the output written between two visits passes through it too. Chosen on the fit samples (r7,
# r8, r9): 30 and 40 MB replay the same; at 50 MB the tall short-K shape
# below keeps its slow plain walk.
L2_REUSE_BYTES = 40e6


def _reread_bytes(c: Candidate, mm: int, nn: int, k: int, tiles_m: int, tiles_n: int,
                  slots: int, in_bytes: int, out_bytes: int) -> float:
    """Operand bytes a schedule fetches from HBM again, per batch entry.

    A raster-m walk with swizzle W covers the tiles in bands of W cluster
    columns, walking all of A inside each band (kernels/sm90_gemm.py,
    ``_tile_coords``); raster n swaps A and B. A band's first wave finds the
    walked operand's tiles in L2 only if what was touched since their last
    use (the whole walked operand, plus the band's share of the other
    operand and of D) fits in ``L2_REUSE_BYTES``; if not, every band after
    those running in the first wave reads it from HBM again. At
    33476x4728x432 (fit sample), the plain M-first walk of a 128x256 tile
    re-reads 29 MB of A for each of its 19 columns and ran 1.15-1.20x
    slower than the N-first walk of the same tile.
    """
    if c.raster == "m":
        walked, other, extent = mm * k * in_bytes, nn * k * in_bytes, nn
        major, minor = tiles_m // c.cluster_m, tiles_n // c.cluster_n
        band_extent = c.swizzle * c.cluster_n * c.tile_n
    else:
        walked, other, extent = nn * k * in_bytes, mm * k * in_bytes, mm
        major, minor = tiles_n // c.cluster_n, tiles_m // c.cluster_m
        band_extent = c.swizzle * c.cluster_m * c.tile_m
    bands = -(-minor // c.swizzle)
    clusters_per_wave = slots / (c.cluster_m * c.cluster_n)
    again = bands - max(1.0, clusters_per_wave / (major * c.swizzle))
    if again <= 0:
        return 0.0
    touched = walked + (mm * nn * out_bytes + other) * min(1.0, band_extent / extent)
    return again * walked if touched > L2_REUSE_BYTES else 0.0


# From this K on, a promoted variant (sm90_gemm ``promote``) goes before its
# unpromoted sibling, which the model gives the same estimate: r71's H100
# probe read the tensor core's own accumulation at 0.010-0.018 elementwise
# from K ~ 28,000 (0.02-0.027 past 45,000), promotion at the output's
# rounding (0.0039), for 0.5% of a decode tile's time (32 pairs, at most 3.6%).
PROMOTE_FROM_K = 16384


def rank_key(c: Candidate, splits: int, m: int, n: int, k: int, batch: int, sms: int,
             in_bytes: int = 2, out_bytes: int = 2) -> tuple[float, float, int, str, float, str]:
    """How the model orders options: estimated time, then HBM bytes read
    again (the swizzled orders of one tile have the same estimate unless
    one of them reads again, which costs it time), then promoted variants
    first from PROMOTE_FROM_K on and last below it, then the label, so the
    order never depends on the order entries were built in; but among
    options that differ only in their cluster, the one whose CTAs load
    fewer operand rows first (``_cta_rows``)."""
    est, again = _estimate(c, splits, m, n, k, batch, sms, in_bytes, out_bytes, MODEL)
    label = Choice(c, splits, "model").label()
    # The label less its cluster field ("TMxTN/CMxCN/..."): equal exactly
    # for options that differ only in their cluster; different tiles keep
    # the whole label's order, and within a tile the fields after the
    # cluster now come before it (on the fit and held-out samples this
    # moves the same 6 picks as the tie-break alone).
    tile, _, rest = label.partition("/")
    off_k = int(bool(c.promote) != (k >= PROMOTE_FROM_K))  # promoted last below PROMOTE_FROM_K
    return est, again, off_k, tile + "/" + rest.partition("/")[2], _cta_rows(c), label


def _cta_rows(c: Candidate) -> float:
    """Operand rows one CTA pulls into its SM per k: its tile's rows and
    columns, less what its cluster multicasts (the A tile shared along N,
    the B tile along M). ``_unit_us`` prices a unit's operand traffic by it.

    Where the tensor cores bound a unit, ``_unit_us`` gives a tile the same
    estimate in every cluster shape, and the label used to break the tie
    (1x1 first). On the fit data (r33's 587 problems and r31's token-pair
    probe), where the model tied a 1x1 and a 1x2 of one tile, the 1x2 ran
    0.93-0.95x its time (geomean; faster by more than 2% on 36-56% of
    them, slower on 4-10%), and a 2x1 0.93-0.98x: loads the model counts
    as hidden still contend for L2. So the cluster that loads less goes
    first among ties (r34; benchmarks/results/2026-12-04_h200_r34_notes.md).
    """
    return c.tile_m / c.cluster_n + c.tile_n / c.cluster_m


# Measured on the fit sample (same tile and cluster, >= 3 waves): a raster-m
# band that holds all of N (fewer than 8 tiles along N) reads A once and
# runs about 10% faster than the plain M-first walk; elsewhere the banded
# and raster-n orders won or lost a few percent either way, which the model
# cannot tell apart (the table can), so it prefers the plain order.
_BAND_GAIN = 1.10


def _raster_gain(c: Candidate, tiles_m: int, tiles_n: int, waves: int) -> float:
    if (c.raster, c.swizzle) == ("m", 1):
        return 1.0
    if c.raster == "m" and waves >= 3 and tiles_n < 8:
        return _BAND_GAIN
    return 1 / 1.01


# Tiles whose constants were fitted on a band of problem rows only (the
# kernel's M: the caller's N under swap-AB): the model ranks them after every
# other option outside it. The 192-row tiles were timed on the fit sample's
# shapes with M >= 257 only (benchmarks/tile_probe.py, r20); below that
# their estimate is unmeasured, and live it misled at least once (a 142-row
# problem, held-out: 192x128/1x2 ran 1.2-1.3x slower than the 128x144
# swapped tile the model picked without them; pick_ab.py, r20).
FITTED_MIN_ROWS = {192: 257}


def in_fitted_domain(c: Candidate, m: int, n: int) -> bool:
    """Whether the model's constants for ``c``'s tile were fitted on problems
    with as many rows (``FITTED_MIN_ROWS``)."""
    rows = n if c.swap_ab else m
    return rows >= FITTED_MIN_ROWS.get(c.tile_m, 0)


# Long K over many tiles both ways: the 1x2 walks of the 256-row tiles
# first (r53, benchmarks/results/2026-12-05_h100_r53_notes.md). Under
# sustained load a GPU runs at the clock its power cap allows, and there the
# model's favourites at long K, the 128x256 tiles walked in 1x1 and 2x1
# clusters, read 15-25x their operands from DRAM (Nsight Compute: 106 GB at
# 5740x51864x31288 against 27 GB for 256x160/1x2, 48 GB for cuBLAS's
# 208x192/1x2), keep the memory 80-100% busy and fell to 0.64-0.79 of
# cuBLAS on an H100; the 1x2 plain walk of a 256-row tile shares each A
# tile by multicast and held. The bounds come from the fit sample's ten
# long-K shapes, timed sustained (sustained_probe.py, H100): the picks they
# move went 0.736 -> 0.986, 0.637 -> 0.977, 1.001 -> 1.293 and 0.943 ->
# 0.924 of cuBLAS; M and N from 5000 keep out the suite's 4096x8192x28672,
# where the H200's sweeps timed 256x192/1x2 1.22x slower than the 2x1 walk
# in a burst. On the held-out sample's six long-K shapes it moves (never
# fitted), sustained on the H100: 0.869 -> 1.086 of cuBLAS (geomean), the
# worst 0.651 -> 0.932; on the H200 two shapes timed both ways, 0.934 ->
# 0.982 and 0.950 -> 1.013 sustained, faster in a burst too. The model's
# burst-fitted constants put these tiles 1.3-1.5x slower than the 2x1 walks
# there (TILE_EFFICIENCY's 256x192 comes from shorter problems), hence an
# order, not a constant.
#
# The walk runs along the shorter side (r57): raster m walks the grid down
# the kernel's M, so where the problem's M has more tiles than its N the
# swapped walk (D^T = B^T A^T, the same tile down N) goes first. On an H200
# at the power cap (2026-12-06_h200_r57_notes.md; bf16, cuBLAS over ours):
# 16384x8192x28672 0.963 -> 1.035, 52383x5160x53936 0.941 -> 0.976,
# 12337x5264x53992 0.947 -> 0.974, and the transposed control
# 8192x16384x28672 1.032 unswapped against 0.961 swapped; the slower walk's
# memory read 37-50% busy against 21-29%. r56 on an H100 had read the walk
# at 0.954 at 16384x8192x28672. A signature whose swapped walks are not
# cached runs the other side's (rank below). Any M > N swaps (r58, H100 at
# the cap, 2026-12-06_r58_notes.md): on twelve fresh seeded (shape, dtype)
# pairs with M 1.03-1.97x N the swap was faster at eleven (0.1-5.1%) and
# 0.5-0.9% slower at one; within about 1.3x the two walks are within 1% and
# trade places round to round. r57 had waited for M >= 1.5 N on burst sweeps
# (r22) that had the swap 2-4% slower at two near-square shapes. M = N keeps
# the unswapped walk.
#
# The walk runs in bands where the cache has them (r59): 256x192 in 1x2
# clusters with swizzle 8 goes before the plain walk. The plain walk (raster
# m, swizzle 1) runs a wave of 66 clusters down one or two whole columns of
# tiles, so each k-block loads about 66 tiles of one operand; a band of eight
# cluster columns keeps the wave near square, about 25. Under sustained load
# on an H100 (bf16, sustained_probe.py; 2026-12-06_r59_notes.md) the banded
# walk was 0.3-6.8% faster than the plain one at all fourteen long-K shapes
# tried on both sides (nine fresh seeded ones among them). Where the plain
# walk trailed cuBLAS (0.940-0.997, eight shapes) the band read 0.970-1.019,
# at or above 1.00 at five (17264x16744x55712: 0.954 -> 1.007;
# 12408x10200x42904: 0.940 -> 1.007). Swizzle 4 ran within 1.1% of 8. r35's
# finding that bands lose at long K was about 128x256 tiles in 1x1 and 2x1
# clusters (their walks read 15-25x their operands); it does not carry over to
# the 1x2 256-row walk. A cache without the banded variants (built before
# r59) runs the plain walk as before.
LONGK_MIN_K = 16384
LONGK_MIN_MN = 5000
# (tile_m, tile_n, swizzle) of the walks, first first; each in 1x2 clusters, raster m
LONGK_WALKS = ((256, 192, 8), (256, 192, 1), (256, 160, 1))
# The walks whose split-K hybrid (split_k: the last partial wave split or
# streamed along K over the SMs it leaves idle) shares their place (r60): the
# estimate then picks between the whole walk and a split count, as it does
# anywhere. A walk whose tiles fill whole waves has no tail to split and
# offers no split count (split_choices). At the power cap on an H100
# (2026-12-06_r60_notes.md) the split tail of the band ran 1.0-9.4% faster
# than the whole band at five M > N shapes where the band trailed cuBLAS:
# 5008x5000x16392 (a last wave a quarter full) 0.916 -> 1.002,
# 20000x5000x20000 0.980 -> 0.998, 11416x7376x19280 0.995 -> 1.009.
LONGK_SPLIT_WALKS = ((256, 192, 8),)
# ... where the last wave leaves at least this share of the resident clusters
# idle; elsewhere the split form stands after the walks. Near a full last wave
# the fix-up costs more than the few idle SMs save (r60, H100 at the cap:
# last waves 82-85% full, the split 0.5-1.0% slower at three shapes of four;
# 6-70% full, 0.2% slower at one of 12, faster at the rest; on twelve fresh
# seeded shapes it chose the faster form at 9, and lost at most 0.8% at 3).
LONGK_SPLIT_MIN_IDLE = 0.25


def longk_applies(m: int, n: int, k: int, batch: int) -> bool:
    """Whether the long-K order (above) ranks this problem's options."""
    return k >= LONGK_MIN_K and min(m, n) >= LONGK_MIN_MN and batch == 1


def _walk_place(c: Candidate, m: int, n: int, swap_first: bool | None = None) -> int | None:
    """``c``'s place among the long-K walks (its index in LONGK_WALKS, plus
    len(LONGK_WALKS) on the side that goes second: swapped unless
    ``swap_first``, by default M > N, the shorter side), or None for an
    option that is not one of them (not a 1x2 raster-m walk of those tiles
    and swizzles: K-cluster, pingpong, raster n, another band width or
    another cluster, or split-K outside LONGK_SPLIT_WALKS). A walk's split-K
    form takes the walk's own place."""
    form = (c.tile_m, c.tile_n, c.swizzle)
    if (c.gemv or c.pingpong or c.k_cluster != 1 or (c.cluster_m, c.cluster_n) != (1, 2)
            or c.raster != "m" or form not in LONGK_WALKS
            or (c.split_k and form not in LONGK_SPLIT_WALKS)):
        return None
    other_side = c.swap_ab != ((m > n) if swap_first is None else swap_first)
    return LONGK_WALKS.index(form) + (len(LONGK_WALKS) if other_side else 0)


# The walks run along the side where the band takes fewer waves
# (``_band_waves``), the shorter side on a tie (r60-r61): with the last wave
# streamed, the waves count the padded tiles each side's 256x192 grid holds,
# and the sides' paddings differ. r58's shorter-side rule was measured on
# whole walks, whose last waves take a whole tile's time on either side (both
# 10 waves at 8878x6480). H100 at the cap (2026-12-06_r60_notes.md,
# 2026-12-06_r61_notes.md): f16, the held-out pairs where the other side's
# split form had re-timed 5% faster, 8878x6480x57336 (9.02 waves against
# 9.45) 0.947x the shorter side's time, 5740x51864x31288 (46.1 against 47.4)
# 0.961x. r60 flipped only below 0.98 of the shorter side's waves; its first
# seven fresh seeded flips (seed 7171, ratios 0.968-0.980) were all faster,
# 0.976x. r61 timed the band it had kept (ratios 0.98-1): seven seeded shapes
# (seed 8181) ran 0.994x on the other side, faster at five; ten fresh ones
# drawn after those seven had pointed this way (seed 9292) ran 0.997x, faster
# at seven, the other three within 1.9%.
@functools.lru_cache(maxsize=4096)
def _longk_swap_first(m: int, n: int, sms: int) -> bool:
    """Whether the long-K walks run swapped first: on the side where the band
    takes fewer waves (``_band_waves``), along the shorter side (M > N
    swaps) on a tie."""
    short = m > n
    return short != (_band_waves(m, n, not short, sms) < _band_waves(m, n, short, sms))


def _band_waves(m: int, n: int, swap: bool, sms: int) -> float:
    """The waves the first long-K walk (LONGK_WALKS[0] in 1x2 clusters, on
    the ``swap`` side) takes: its whole waves plus the last wave's share of
    the slots where its split form would stream that wave (at least
    LONGK_SPLIT_MIN_IDLE idle), else its waves rounded up (the whole walk's
    last wave takes a whole tile's time)."""
    tm, tn, swizzle = LONGK_WALKS[0]
    waves, idle = _last_wave(Candidate("", tm, tn, 1, 2, "m", swizzle, swap, True), m, n, sms)
    return waves if idle >= LONGK_SPLIT_MIN_IDLE else math.ceil(waves)


def longk_walk(c: Candidate, m: int, n: int, k: int, batch: int) -> bool:
    """Whether ``c`` is one of the walks the long-K order puts first for this
    problem, along either side (none where the order does not apply): what
    tune and the benchmarks time even where the estimate ranks it out."""
    return longk_applies(m, n, k, batch) and _walk_place(c, m, n) is not None


def autotune_defers(choice: Choice, m: int, n: int, k: int, batch: int) -> bool:
    """Whether autotune keeps ``choice`` (the model's) untimed: the long-K
    order's walk on a problem the order covers. Autotune times bursts
    (run/autotune.py), and at long K a burst ranks first the 128x256 walks in
    1x1 and 2x1 clusters that lose once the power cap holds the clock, the
    ranking the long-K order exists to overrule (r53). r55, on an H100 at the
    held-out 8878x6480x57336: autotune took 128x256/2x1/n8, 1.36x the walk's
    time re-timed after 300 ms back to back. A split count of a walk's
    split-K form (LONGK_SPLIT_WALKS) is the walk too."""
    return longk_walk(choice.candidate, m, n, k, batch)


def longk_rank(c: Candidate, m: int, n: int, k: int, batch: int, sms: int) -> int:
    """Where ``c`` stands under the long-K order (above): for a problem with
    K >= LONGK_MIN_K, M and N >= LONGK_MIN_MN and one batch entry, its place
    among the walks (``_walk_place``: first the side where the band takes
    fewer waves on ``sms`` SMs, ``_longk_swap_first``, then the other side's),
    else 2 * len(LONGK_WALKS), after every walk; a walk's split-K form whose
    last wave leaves less than LONGK_SPLIT_MIN_IDLE of the clusters idle
    stands there too. For any other problem 0 (the model's order alone), but
    1 for the band's split form, timed only under the order (r60), so it
    stands last: on pick_identity.py's sample the estimate ranked it first
    at one shape out of the order (339x26144x31272)."""
    if not longk_applies(m, n, k, batch):
        return int(c.split_k and _walk_place(c, m, n) is not None)
    place = _walk_place(c, m, n, _longk_swap_first(m, n, sms))
    if place is None or (c.split_k and _last_wave(c, m, n, sms)[1] < LONGK_SPLIT_MIN_IDLE):
        return 2 * len(LONGK_WALKS)
    return place


def _last_wave(c: Candidate, m: int, n: int, sms: int) -> tuple[float, float]:
    """(waves, idle) of ``c`` on a one-entry problem: its clusters over the
    resident cluster slots, and the share of the slots its last wave leaves
    idle (0 where the clusters fill whole waves)."""
    size = c.cluster_m * c.cluster_n
    slots = cluster_slots(size, sms)
    clusters = _tiles(c, m, n, 1)[2] // size
    tail = splitk_tail_tiles(clusters, slots)
    return clusters / slots, 0.0 if tail == 0 else 1 - tail / slots


def order_key(c: Candidate, splits: int, m: int, n: int, k: int, batch: int, sms: int,
              in_bytes: int = 2, out_bytes: int = 2) -> tuple:
    """The model's order: options outside their fitted domain last, then the
    long-K order (``longk_rank``), then ``rank_key`` (whose first item is
    the estimate; the key's last item). The fit scripts rank by it too, so
    a fit sees the picks dispatch makes."""
    return (not in_fitted_domain(c, m, n), longk_rank(c, m, n, k, batch, sms),
            rank_key(c, splits, m, n, k, batch, sms, in_bytes, out_bytes))


def _options(cands: Sequence[Candidate], m: int, n: int, k: int, batch: int,
             sms: int) -> list[tuple[Candidate, int]]:
    """Every (candidate, split count) ``split_choices`` offers. When that is
    none, only split-K variants serve the signature and none has a split
    worth making here (K under two k-blocks a split, or tiles that fill whole
    waves): each then runs as one split, data-parallel (tests/gpu call every
    split-K artifact with splits 1), rather than the call failing."""
    # a cluster needs as many SMs as it has CTAs: the persistent grid is
    # sms // size, which is 0 on a GPU (or MIG slice) smaller than the cluster
    cands = [c for c in cands if c.cluster_size <= sms]
    options = [(c, s) for c in cands for s in split_choices(c, m, n, k, batch, sms)]
    return options or [(c, 1) for c in cands if c.split_k]


def ranked_choices(cands: Sequence[Candidate], m: int, n: int, k: int, batch: int, sms: int,
                   in_bytes: int = 2, out_bytes: int = 2,
                   source: str = "model") -> list[tuple[float, Choice]]:
    """Every (estimated µs, choice) the candidates offer, the model's pick
    first: options inside their fitted domain (``in_fitted_domain``) by
    ``rank_key``, then the others by ``rank_key``.
    """
    ranked = [(order_key(c, s, m, n, k, batch, sms, in_bytes, out_bytes), Choice(c, s, source))
              for c, s in _options(cands, m, n, k, batch, sms)]
    ranked.sort(key=lambda t: t[0])
    return [(key[-1][0], ch) for key, ch in ranked]


def model_pick(options: Sequence[tuple], m: int, n: int, k: int, batch: int, sms: int,
               in_bytes: int = 2, out_bytes: int = 2) -> tuple:
    """The option the model picks among ``options``, tuples that start with
    (candidate, splits), such as timings recorded per option: the first in
    ``ranked_choices``' order. How replays and fits stand in for
    ``model_choice``."""
    return min(options, key=lambda o: order_key(o[0], o[1], m, n, k, batch, sms, in_bytes, out_bytes))


def model_choice(cands: Sequence[Candidate], m: int, n: int, k: int, batch: int, sms: int,
                 in_bytes: int = 2, out_bytes: int = 2) -> Choice:
    """The candidate and split count the model ranks fastest."""
    options = _options(cands, m, n, k, batch, sms)
    if not options:
        raise ValueError("no candidate can serve this problem")
    c, s = model_pick(options, m, n, k, batch, sms, in_bytes, out_bytes)
    return Choice(c, s, "model")


def _splits_ok(c: Candidate, splits: int, m: int, n: int, k: int, batch: int, sms: int) -> bool:
    """Whether a table row's split count is one this candidate can run on this
    problem: one the model would offer (``split_choices``: enough k-blocks a
    split, the fp32 workspace under 2**31 elements, stream-K's plan in
    range), or 1, data-parallel (``_options``' fallback). A row is data, so
    its count is checked as the model's are (r50: a row's splits of 600 took
    a 2.6e9-element workspace past the kernel's 32-bit offsets)."""
    if not c.split_k:
        return splits == 1
    return splits == 1 or splits in split_choices(c, m, n, k, batch, sms)


def distance(p: Sequence[int], q: Sequence[int]) -> float:
    """Distance between two (M, N, K, L) problems (module docstring)."""
    d = sum(abs(math.log2(max(x, 1) / max(y, 1))) for x, y in zip(p[:3], q[:3]))
    return d + (4.0 if p[3] != q[3] else 0.0)


def choose(cands: Sequence[Candidate], m: int, n: int, k: int, batch: int, sms: int,
           rows: Mapping[tuple, tuple] | None = None, in_bytes: int = 2,
           out_bytes: int = 2, *, above: bool = False) -> Choice:
    """The variant and split count for one problem (module docstring).

    ``rows`` maps (M, N, K, L) to (schedule, splits, runner-up label, margin,
    us) for this signature (``tables.bind``), from the selection table after
    it was bound to this GPU and this cache. ``above`` lets rule 3 take part:
    dispatch passes ``row_above_serves`` of the signature (residual calls
    only); benchmarks/row_above_ab.py times the rule against its absence.
    """
    row_choice = _row_choice(cands, rows, m, n, k, batch, sms, above) if rows else None
    if row_choice is not None:
        return promoted(row_choice, cands, k)
    return model_choice(cands, m, n, k, batch, sms, in_bytes, out_bytes)


def _row_choice(cands: Sequence[Candidate], rows: Mapping[tuple, tuple], m: int, n: int, k: int,
                batch: int, sms: int, above: bool) -> Choice | None:
    """Rules 1-3 of ``choose``: what a table row serves, or None."""
    by_schedule = {c.schedule: c for c in cands}
    hit = rows.get((m, n, k, batch))
    if hit is not None and hit[0] in by_schedule and _splits_ok(by_schedule[hit[0]], hit[1], m, n,
                                                                k, batch, sms):
        return Choice(by_schedule[hit[0]], hit[1], "table")
    below = row_below(by_schedule, rows, m, n, k, batch, sms)
    if below is not None or not above:
        return below
    return row_above(by_schedule, rows, m, n, k, batch, sms)


def promoted(choice: Choice, cands: Sequence[Candidate], k: int) -> Choice:
    """``choice``, or from PROMOTE_FROM_K on its promoted sibling where
    ``cands`` has one: the same schedule, its accumulators promoted (the
    model orders its own picks that way, ``rank_key``; a table row names the
    schedule it timed; the siblings ran 1.005x its time in r71, at most 1.036x)."""
    c = choice.candidate
    if k < PROMOTE_FROM_K or c.promote or c.gemv:
        return choice
    sibling = next((x for x in cands if x.promote and replace(x, key=c.key, promote=0) == c), None)
    return choice if sibling is None else replace(choice, candidate=sibling)


# A row's runner-up stands in for its winner below (``row_below``) only when
# the tune measured it this close to the winner at the row's M.
RUNNER_UP_MARGIN = 1.05


def _runner_up(cands: Iterable[Candidate], row: tuple) -> tuple | None:
    """(candidate, splits) of a bound row's runner-up (``tables.bind``: the
    third and fourth fields, its Choice label and margin), when it was within
    RUNNER_UP_MARGIN of the winner and ``cands`` has it; else None. The label
    is read back as ``Choice.label`` writes it."""
    if len(row) < 4 or not row[2] or row[3] is None or row[3] > RUNNER_UP_MARGIN:
        return None
    return option_of_label(cands, row[2])


def option_of_label(cands: Iterable[Candidate], label: str) -> tuple | None:
    """(candidate, splits) that ``Choice.label`` writes as ``label``
    (``/splitkxS``: S splits; ``/streamk``: 0) among ``cands``; else None."""
    splits = 1
    if "/streamk" in label:
        label, splits = label.replace("/streamk", "/splitk"), 0
    elif "/splitk" in label:
        head, _, count = label.rpartition("x")
        if not count.isdigit():
            return None
        label, splits = head, int(count)
    return next(((c, splits) for c in cands if c.label() == label), None)


def _row_options(by_schedule: Mapping, row: tuple):
    """A bound row's winner, then (looked up only if asked for) its close
    runner-up: the options ``row_below`` tries in turn."""
    yield by_schedule.get(row[0]), row[1]
    runner = _runner_up(by_schedule.values(), row)
    if runner is not None:
        yield runner


def row_below(by_schedule: Mapping, rows: Mapping[tuple, tuple], m: int, n: int, k: int,
              batch: int, sms: int) -> Choice | None:
    """The winner of a smaller M at this N, K and L whose tiles also cover M
    (module docstring), as a ``"table-below"`` choice; None if no row does.

    Of the rows at (M' < M, N, K, L) whose variant runs on the same tile
    grid at M as at M', the largest M' wins. Why its variant still wins at
    M: it does the same tiles, waves and k-blocks (only A's few extra rows
    differ), while no other option gets faster on a larger M. When a row's
    winner does not cover M but its runner-up does, and the tune measured
    the runner-up within RUNNER_UP_MARGIN of the winner, the runner-up
    carries instead (a 1-token row won by a one-token GEMV by 0.4%, whose
    runner-up is a 16-token swapped tile, serves 2..16 tokens).
    """
    best = None
    for (rm, rn, rk, rl), row in rows.items():
        if rn != n or rk != k or rl != batch or rm >= m or (best is not None and rm <= best[0]):
            continue
        for c, splits in _row_options(by_schedule, row):
            if c is None or not _splits_ok(c, splits, m, n, k, batch, sms):
                continue
            if _tiles(c, rm, n, batch)[2] == _tiles(c, m, n, batch)[2]:
                best = (rm, c, splits)
                break
    return None if best is None else Choice(best[1], best[2], "table-below")


def row_above_serves(fields: Mapping) -> bool:
    """Whether rule 3 (``row_above``) takes part for a signature of these
    fields: residual (with-C) signatures only, the calls it was measured on
    (module docstring)."""
    return fields.get("c") not in (None, "-")


# Rule 3's bound (module docstring): a row above serves M only where its
# time is at most this much over the nearest row below's, the least any
# option can take at M, so the rule's regret is at most this (the selection
# benchmark's worst-regret goal is 1.25). On the H100's table of r65 (tuned
# token counts 1, 2, 8, 32, 64, 128, [160,] 256, [288,] 512, ...) a step up
# to 64 tokens costs at most 1.05x, 64 to 128 1.0-1.16x (median 1.04), 128 to
# 256 with C 1.11-1.36x, and from 512 tokens on each doubling about 2x: the
# rule serves the decode and small-batch gaps and leaves the wide ones to
# the model.
ROW_ABOVE_BOUND = 1.15


def _row_us(row: tuple) -> float | None:
    """A bound row's winner time (``tables.bind``), or None (a steady-clock
    row, or a row tuple from before r65 without it)."""
    return row[4] if len(row) > 4 else None


def row_above(by_schedule: Mapping, rows: Mapping[tuple, tuple], m: int, n: int, k: int,
              batch: int, sms: int) -> Choice | None:
    """The winner of a larger M at this N, K and L whose tiles also cover M,
    within ``ROW_ABOVE_BOUND`` of the nearest row below, as a
    ``"table-above"`` choice; None if no row qualifies (module docstring).

    The floor is the time of the row at the largest M' < M (the least any
    option can take at M). Of the rows at M'' > M whose winner (or, within
    RUNNER_UP_MARGIN, runner-up, taken at the winner's time times the
    margin) runs the same tiles at M as at M'', the one with the least time
    is taken if that time over the floor is at most the bound.
    """
    floor = None
    for (rm, rn, rk, rl), row in rows.items():
        if rn == n and rk == k and rl == batch and rm < m and (floor is None or rm > floor[0]):
            floor = (rm, _row_us(row))
    if floor is None or floor[1] is None:
        return None
    best = None
    for (rm, rn, rk, rl), row in rows.items():
        us = _row_us(row)
        if rn != n or rk != k or rl != batch or rm <= m or us is None:
            continue
        for rank, (c, splits) in enumerate(_row_options(by_schedule, row)):
            if c is None or not _splits_ok(c, splits, m, n, k, batch, sms):
                continue
            t = us * (row[3] if rank else 1.0)  # a runner-up: the winner's time times its margin
            if _tiles(c, rm, n, batch)[2] == _tiles(c, m, n, batch)[2]:
                if best is None or t < best[0]:
                    best = (t, c, splits)
                break
    if best is None or best[0] > ROW_ABOVE_BOUND * floor[1]:
        return None
    return Choice(best[1], best[2], "table-above")


# ------------------------------------------------- unaligned calls: two routes
# A call below 16-byte alignment can run staged (its misaligned operands
# copied into 16-byte pitched scratch for the TMA variants) or natively on
# a low-alignment variant (sm80_gemm, cp.async/register copies). Staging
# costs a copy kernel per misaligned operand, which dominates small problems;
# the low-alignment kernels are several times slower than the model's wgmma
# figures, more so the narrower their copies. Constants fitted by
# benchmarks/fit_unaligned.py on the `fit` sample of bench_unaligned.py
# (H200, 32 shapes, at 320bbac), reported on its `heldout` sample: replayed,
# the rule reached 0.639x cuBLAS there against 0.657x for the per-shape best
# of the two routes and 0.523x for staging alone.
UNALIGNED_MODEL = {
    "stage_us": 12.0,         # per staged operand: scratch allocation and a copy kernel (host-bound)
    "copy_tbps": 3.0,         # torch's strided copy: read and write, TB/s
    # A low-alignment kernel, modelled as the wgmma model with its per-SM
    # operand bandwidth scaled by the width of its copies (by alignment in
    # bytes; constrained monotone in the fit) and its tensor-core peak
    # scaled for mma.sync.
    "native_gbps": {8: 0.15, 4: 0.1, 2: 0.08},
    "native_peak": 0.3,
}


def staged_estimate_us(aligned_us: float, copy_bytes: Sequence[int],
                       model: Mapping = UNALIGNED_MODEL) -> float:
    """The staged route: the aligned variant's estimate plus each copy (read + write)."""
    return (aligned_us + len(copy_bytes) * model["stage_us"]
            + 2.0 * sum(copy_bytes) / (model["copy_tbps"] * 1e12) * 1e6)


def native_estimate_us(c: Candidate, align: int, m: int, n: int, k: int, batch: int, sms: int,
                       in_bytes: int = 2, out_bytes: int = 2, model: Mapping = UNALIGNED_MODEL) -> float:
    """A low-alignment variant of ``align`` bytes: ``estimate_us`` under a slower machine."""
    native = dict(MODEL, sm_gbps=MODEL["sm_gbps"] * model["native_gbps"][min(int(align), 8)],
                  peak_tflops=MODEL["peak_tflops"] * model["native_peak"])
    return estimate_us(c, 1, m, n, k, batch, sms, in_bytes, out_bytes, native)


def prefer_staged(aligned: Choice, native: Choice | None, native_align: int, copy_bytes: Sequence[int],
                  m: int, n: int, k: int, batch: int, sms: int, in_bytes: int = 2,
                  out_bytes: int = 2, model: Mapping = UNALIGNED_MODEL) -> bool:
    """Whether an unaligned call runs staged on ``aligned`` rather than natively on ``native``."""
    if native is None:
        return True
    staged = staged_estimate_us(
        estimate_us(aligned.candidate, aligned.splits, m, n, k, batch, sms, in_bytes, out_bytes),
        copy_bytes, model)
    return staged <= native_estimate_us(native.candidate, native_align, m, n, k, batch, sms,
                                        in_bytes, out_bytes, model)


__all__ = [
    "Candidate", "Choice", "MODEL", "SPLIT_CHOICES", "call_signature",
    "candidate_from_variant", "candidates", "check_no_internal_overlap", "check_shapes",
    "choose", "distance", "estimate_us", "misalignment", "model_choice", "model_pick",
    "native_estimate_us",
    "ranked_choices",
    "prefer_staged", "signature_order", "split_choices", "staged", "staged_estimate_us",
]
