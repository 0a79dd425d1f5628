"""Does a long, heavy GEMM hold its pace? Options and cuBLAS under sustained load, with the GPU's clocks and power (GPU).

bench_selection.py re-times each shape's best option minutes after its
sweep. r52's H100 re-timed three 9-28 ms f16 shapes at 1.38-1.49x their
own sweep times (5740x51864x31288: 28.2 ms swept, 41.9 ms re-timed) while
cuBLAS, interleaved with it, held 28.2 ms. Two readings fit: the machine's
clocks moved (power or thermal limits) and cuBLAS's rounds fell in the good
moments, or our kernel draws more power per unit of work than cuBLAS's and
is the one the power limit slows under sustained load. The second would be
a kernel property to fix; the first, a harness one.

This probe tells them apart. Per shape it runs each listed option and
cuBLAS back to back for ``--seconds`` each, alternating over ``--rounds``
(tune.timing's round order), on one operand set (at these sizes L2 does
not matter), timing windows of about ``--window-ms`` with CUDA events. A
background ``nvidia-smi`` samples the SM clock, power draw, temperature,
memory-busy share and the active clock-event reasons every ``--sample-ms``:
read-only queries, no clock or power setting is touched. Per phase it
reports µs per call in the first and last quarter of its windows, the
median SM clock, power and memory-busy share over the phase, the peak
temperature and the event reasons seen; ``--harness`` adds tune's own
``time_us`` figures around the phase (after ``--cool-s`` of idle, with
``--steady-ms`` of warm-up, and after the run). ``--raw`` keeps every
window and sample.

Reading it (r53, benchmarks/results/2026-12-05_h100_r53_notes.md): every
phase, ours and cuBLAS's, ran at the power cap, so the question is the work
each does per joule. An option slower than cuBLAS at a clock as high or
higher, with the memory near 100% busy, is spending the cap's watts on
DRAM traffic: what the 128x256 walks did at long K.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import threading
import time
from pathlib import Path

from _common import header, linear_candidates, write
from option_retime import shapes_arg

# nvidia-smi's clock-event (formerly throttle) reason bits, as nvml.h names them
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
FIELDS = ("clocks.sm", "power.draw", "temperature.gpu", "utilization.memory")
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def reason_names(mask: int) -> list[str]:
    """The names of the reason bits set in ``mask``; an unknown bit as its hex value."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    if rest:
        names.append(hex(rest))
    return names


def parse_sample(line: str) -> dict | None:
    """One ``nvidia-smi --format=csv,noheader,nounits`` line of FIELDS (and
    a reasons field, where the driver has one) as numbers; a field the
    driver reports as ``[N/A]`` or ``[Not Supported]`` is None. A line of
    another shape (a warning, an error) is None."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) not in (len(FIELDS), len(FIELDS) + 1):
        return None
    out: dict = {}
    for name, cell in zip((*FIELDS, "reasons"), cells):
        if cell.startswith("["):
            out[name] = None
            continue
        try:
            out[name] = int(cell, 16) if name == "reasons" else float(cell)
        except ValueError:
            return None
    return out


def phase_stats(windows: list[tuple[float, float]], samples: list[tuple[float, dict]],
                start: float, end: float) -> dict:
    """One phase's figures: ``windows`` are (monotonic end time, µs per call),
    ``samples`` (monotonic arrival time, parse_sample's dict); only samples
    between ``start`` and ``end`` count. µs: the median of the first and of
    the last quarter of the windows (at least one window each)."""
    us = [u for _, u in windows]
    q = max(1, len(us) // 4)
    inside = [s for t, s in samples if start <= t <= end]

    def med(field):
        xs = [s[field] for s in inside if s.get(field) is not None]
        return statistics.median(xs) if xs else None

    temps = [s["temperature.gpu"] for s in inside if s.get("temperature.gpu") is not None]
    mask = 0
    for s in inside:
        mask |= s.get("reasons") or 0
    return {"us_first": statistics.median(us[:q]) if us else None,
            "us_last": statistics.median(us[-q:]) if us else None,
            "windows": len(us), "samples": len(inside),
            "sm_mhz": med("clocks.sm"), "power_w": med("power.draw"),
            "mem_util": med("utilization.memory"),
            "temp_max": max(temps) if temps else None, "reasons": reason_names(mask)}


class Sampler:
    """``nvidia-smi -lms`` in the background: each line it prints, parsed and
    stamped with time.monotonic() on arrival. Queries only."""

    def __init__(self, gpu_id: str | None, period_ms: int):
        self.samples: list[tuple[float, dict]] = []
        self.fields = base = None
        # The reasons field's name changed with the driver (clocks_throttle_ ->
        # clocks_event_): the first this driver answers, else none. A GPU id
        # nvidia-smi does not take is dropped (the device machine has one GPU).
        for gid in dict.fromkeys((gpu_id, None)):
            base = ["nvidia-smi", *(["--id=" + gid] if gid else []), "--format=csv,noheader,nounits"]
            for extra in ((REASON_FIELDS[0],), (REASON_FIELDS[1],), ()):
                query = "--query-gpu=" + ",".join((*FIELDS, *extra))
                got = subprocess.run([*base, query], capture_output=True, text=True, timeout=30)
                lines = got.stdout.strip().splitlines()
                if got.returncode == 0 and lines and parse_sample(lines[0]) is not None:
                    self.fields = (*FIELDS, *extra)
                    break
            if self.fields is not None:
                break
        if self.fields is None:
            raise SystemExit(f"sustained_probe: nvidia-smi answered no query of {', '.join(FIELDS)}: "
                             f"{got.stderr.strip() or got.stdout.strip()}")
        self.proc = subprocess.Popen([*base, "--query-gpu=" + ",".join(self.fields),
                                      f"--loop-ms={period_ms}"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            s = parse_sample(line)
            if s is not None:
                self.samples.append((time.monotonic(), s))

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.thread.join(timeout=10)


def num(x, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", required=True, type=shapes_arg, help="MxNxK[,MxNxK...]")
    ap.add_argument("--dtype", default="f16", choices=("bf16", "f16"))
    ap.add_argument("--options", default="",
                    help="comma-separated option labels (as the reports print them); the "
                         "label 'pick' is the model's first option for each shape, 'dispatch' "
                         "what cache.gemm runs (the GPU's table row where one covers the shape); "
                         "default: the model's pick")
    ap.add_argument("--seconds", type=float, default=4.0, help="each phase's sustained run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window-ms", type=float, default=100.0)
    ap.add_argument("--sample-ms", type=int, default=100)
    ap.add_argument("--cool-s", type=float, default=0.0,
                    help="idle seconds before each phase (a phase then starts from a cooler GPU)")
    ap.add_argument("--harness", action="store_true",
                    help="also time each phase's function with tune.timing.time_us (graph replay) "
                         "after the pause, after a second pause with --steady-ms, and after the "
                         "sustained run")
    ap.add_argument("--steady-ms", type=float, default=300.0,
                    help="time_us's steady_ms for --harness's second figure")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--raw", default=None, help="every window and sample, as JSON")
    args = ap.parse_args()
    if (args.seconds <= 0 or args.rounds < 1 or args.window_ms <= 0 or args.sample_ms < 10
            or args.cool_s < 0 or args.steady_ms < 0):
        ap.error("--seconds and --window-ms must be positive, --rounds at least 1, "
                 "--sample-ms at least 10, --cool-s and --steady-ms not negative")

    import torch  # noqa: PLC0415 - GPU part only: --help and argument errors run without CUDA

    import cutlass_aot  # noqa: PLC0415
    from cutlass_aot.run import select  # noqa: PLC0415
    from cutlass_aot.run.dispatch import launch_choice  # noqa: PLC0415
    from cutlass_aot.tune.timing import operands, round_order, time_us  # noqa: PLC0415

    cache = cutlass_aot.open_cache(args.cache_dir)
    sms, cands = linear_candidates(cache, args.dtype)
    props = torch.cuda.get_device_properties(0)
    uuid = str(getattr(props, "uuid", "") or "")
    sampler = Sampler(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}" if uuid else None, args.sample_ms)
    wanted = [s.strip() for s in args.options.split(",") if s.strip()]
    text = header(f"Sustained load: options and cuBLAS with the GPU's clocks and power ({args.dtype})")
    text += (f"Per shape: one operand set (nn.Linear layout); each phase runs one function back to "
             f"back for {args.seconds:g} s, timed in windows of ~{args.window_ms:g} ms (CUDA events), "
             f"phases alternating over {args.rounds} rounds. nvidia-smi sampled every "
             f"{args.sample_ms} ms ({', '.join(sampler.fields)}); queries only, no setting touched. "
             "µs first / last: median per call over the phase's first / last quarter of windows. "
             "mem busy %: nvidia-smi's utilization.memory, the share of the sample period in which "
             "device memory was read or written (coarse: a DRAM-bound phase reads near 100).\n")
    raw = []
    try:
        for m, n, k in args.shapes:
            ranked = select.ranked_choices(cands, m, n, k, 1, sms)
            by_label = {ch.label(): ch for _, ch in ranked}
            missing = [w for w in wanted if w not in by_label and w not in ("pick", "dispatch")]
            if missing:
                raise SystemExit(f"sustained_probe: {m}x{n}x{k} has no option {', '.join(missing)} "
                                 f"in this cache (the model's first: {ranked[0][1].label()})")
            a, b, out = operands((args.dtype,) * 3 + ("k", "k", "n", 2), m, n, k, 1)
            # what cache.gemm runs on these operands: the table's row where one
            # covers the problem, else the model's pick
            served = cache.gemm.runner.choice_for(a, b, out) if "dispatch" in wanted else None
            if "dispatch" in wanted and served is None:
                raise SystemExit(f"sustained_probe: cache.gemm runs no artifact at {m}x{n}x{k}")
            picked = [ranked[0][1] if w == "pick" else served if w == "dispatch" else by_label[w]
                      for w in wanted or ["pick"]]
            opts = list({ch.label(): ch for ch in picked}.values())  # 'pick' may name a listed one
            fns = {ch.label(): functools.partial(launch_choice(cache, ch, sms, m, n, 1, k=k), a, b, out)
                   for ch in opts}
            fns["cuBLAS"] = functools.partial(torch.mm, a, b, out=out)
            names = list(fns)
            flop = 2 * m * n * k
            phases = []
            for r in range(args.rounds):
                for i in round_order(len(names), r):
                    name, fn = names[i], fns[names[i]]
                    fn()
                    torch.cuda.synchronize()
                    time.sleep(args.cool_s)
                    # tune's own figure (graph replay, a burst of a few calls) from
                    # the state the pause left, then again after the sustained run
                    harness_cool = harness_steady = None
                    if args.harness:
                        harness_cool = time_us(fn, graph=True)
                        time.sleep(args.cool_s)
                        harness_steady = time_us(fn, graph=True, steady_ms=args.steady_ms)
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    fn()
                    e1.record()
                    e1.synchronize()
                    per = max(1, int(args.window_ms * 1000 / max(e0.elapsed_time(e1) * 1000, 1.0)))
                    windows = []
                    start = time.monotonic()
                    while time.monotonic() - start < args.seconds:
                        e0.record()
                        for _ in range(per):
                            fn()
                        e1.record()
                        e1.synchronize()
                        windows.append((time.monotonic(), e0.elapsed_time(e1) * 1000 / per))
                    end = time.monotonic()
                    harness_hot = time_us(fn, graph=True) if args.harness else None
                    st = phase_stats(windows, sampler.samples, start, end)
                    st.update(harness_cool=harness_cool, harness_steady=harness_steady,
                              harness_hot=harness_hot)
                    phases.append({"round": r, "name": name, **st})
                    raw.append({"dtype": args.dtype, "m": m, "n": n, "k": k, "round": r, "name": name,
                                **st, "window_trace": windows,
                                "sample_trace": [s for s in sampler.samples if start <= s[0] <= end]})
            runs = "" if served is None else f"; dispatch runs {served.label()} ({served.source})"
            # the harness columns only where --harness timed them
            heads = ["round", "function", "µs first", "µs last", "TFLOP/s last", "SM MHz", "W",
                     "mem busy %", "°C max", "clock-event reasons"]
            if args.harness:
                heads += ["harness µs after the pause",
                          f"harness µs, steady_ms={args.steady_ms:g}, after a pause",
                          "harness µs after the run"]
            text += (f"\n## {m}x{n}x{k}\n\nThe model's pick: {ranked[0][1].label()}{runs}.\n\n"
                     f"| {' | '.join(heads)} |\n|{'---|' * len(heads)}\n")
            for p in phases:
                tf = None if not p["us_last"] else flop / p["us_last"] / 1e6
                cells = [str(p["round"]), p["name"], num(p["us_first"], ".1f"), num(p["us_last"], ".1f"),
                         num(tf, ".0f"), num(p["sm_mhz"], ".0f"), num(p["power_w"], ".0f"),
                         num(p["mem_util"], ".0f"), num(p["temp_max"], ".0f"),
                         ", ".join(p["reasons"]) or "none"]
                if args.harness:
                    cells += [num(p["harness_cool"], ".1f"), num(p["harness_steady"], ".1f"),
                              num(p["harness_hot"], ".1f")]
                text += f"| {' | '.join(cells)} |\n"
            cub = [p["us_last"] for p in phases if p["name"] == "cuBLAS"]
            for name in names[:-1]:
                ours = [p["us_last"] for p in phases if p["name"] == name]
                text += (f"\n{name}: last-quarter µs median {statistics.median(ours):.1f}, cuBLAS "
                         f"{statistics.median(cub):.1f}: cuBLAS / ours "
                         f"{statistics.median(cub) / statistics.median(ours):.3f}\n")
            print(text.split(f"## {m}x{n}x{k}")[-1], flush=True)
            if args.raw:  # after every shape: a run cut short keeps what it measured
                Path(args.raw).write_text(json.dumps(raw))
            a = b = out = fns = None
            torch.cuda.empty_cache()
    finally:
        sampler.stop()
    write("sustained_probe", text, args.out)


if __name__ == "__main__":
    main()
