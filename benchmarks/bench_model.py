"""End to end in real models: eager torch, patched eager, torch.compile, patched + torch.compile.

Two models, bf16, random weights, on one GPU, in one process:

* ``llama``: Hugging Face transformers' ``LlamaForCausalLM`` from a
  ``LlamaConfig`` of Llama-3-8B width (hidden 4096, intermediate 14336, 32
  heads, 8 KV heads, vocab 128256) with ``--layers`` decoder layers (no hub
  download; no tokenizer);
* ``block``: transformer blocks built from torch modules with biases and a
  tanh GELU (Llama has neither), at the same width: LayerNorm, a fused QKV
  Linear with bias, SDPA, an output Linear with bias, LayerNorm, and an MLP
  ``nn.Sequential(Linear, GELU(tanh), Linear)`` whose GELU ``patch`` folds
  into the first Linear's epilogue when the cache serves it.

For each token count (batch 1 x sequence T, T from 1 = decode to 8192) the
four variants run interleaved, ``--rounds`` times ``--reps`` forwards each,
timed with CUDA events; the median per forward is reported. Outputs are
compared with eager torch (relative Frobenius error of the logits / block
output). Graph breaks are counted with torch._dynamo.explain (must be 0:
the compiled variants use fullgraph=True, so a break would fail them).

``--profile 2048,8192`` also runs one forward of each variant at those token
counts under torch.profiler and reports where the device time went: kernel
time summed by kind (ours, cuBLAS, attention, inductor's Triton kernels,
other), the GEMMs in launch order named after the products eager torch asks
for, and the heaviest kernels by name, so a gap between two variants can be
put on the kernels that make it. A kernel's time there is its share of the
stream, from the end of the kernel before it (``summarize_kernels``: ours
launch early and wait, and the profiler's span includes the wait).

    python3 benchmarks/bench_model.py [--cache-dir DIR] [--tokens 1,16,...] [--profile T,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch
import torch.nn.functional as F
from _common import cuda_kernel_events, header, write
from torch import nn

import cutlass_aot
from cutlass_aot.nn import patch

TOL = 3e-2  # relative Frobenius error vs eager bf16 torch, after several layers


class Block(nn.Module):
    """A pre-norm transformer block with biases and a tanh-GELU MLP."""

    def __init__(self, width: int, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(approximate="tanh"),
                                 nn.Linear(hidden, width))

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, w // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.ln2(x))


class Blocks(nn.Module):
    def __init__(self, layers: int, width: int, hidden: int, heads: int):
        super().__init__()
        self.layers = nn.ModuleList(Block(width, hidden, heads) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def build_llama(layers: int):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        raise SystemExit(f"bench_model.py --models llama needs transformers ({exc}); the device image "
                         "has 5.17.0, else carry its wheels, or run --models block") from None

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         max_position_embeddings=8192, rope_theta=500000.0)
    config._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    vocab = config.vocab_size

    def inputs(tokens: int):
        return (torch.randint(0, vocab, (1, tokens), device="cuda"),)

    def run(m, ids):
        return m(input_ids=ids, use_cache=False).logits

    return model, inputs, run


def build_block(layers: int):
    with torch.device("cuda"):
        model = Blocks(layers, 4096, 14336, 32).to(torch.bfloat16).eval()

    def inputs(tokens: int):
        return (torch.randn(1, tokens, 4096, device="cuda", dtype=torch.bfloat16),)

    def run(m, x):
        return m(x)

    return model, inputs, run


def rel_err(out, ref) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def time_ms(fn, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


KINDS = (  # (kind, substrings of a kernel's name, lower case), first match wins
    ("ours", ("cutlass_aot", "sm90gemm", "gemvkernel", "kernel_cutlass")),
    # before cuBLAS and attention: inductor names a kernel after the ops it
    # fused (triton_poi_fused_gemm_out_mul_silu_..., ..._scaled_dot_product_...)
    ("inductor (Triton)", ("triton",)),
    ("cuBLAS", ("nvjet", "gemm", "xmma", "cutlass")),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "other")


def kernel_times(fn) -> tuple[dict[str, tuple[float, int]], list[float], float]:
    """Each kernel name's share of the stream's time (µs) and launch count over
    one call of ``fn``; the GEMMs' shares (ours and cuBLAS's) in launch order,
    a split GEMM's reduction added to the GEMM before it; and the span, µs from
    the first kernel's start to the last one's end (the shares plus the gaps
    in which the stream ran nothing)."""
    return summarize_kernels(cuda_kernel_events(fn))


def summarize_kernels(events) -> tuple[dict[str, tuple[float, int]], list[float], float]:
    """``kernel_times`` from the profiler's kernel events (``name``,
    ``time_range.start`` and ``.elapsed_us()``), in any order, all on one stream.

    A kernel counts from the end of the kernel before it, not from its own
    start. Ours are programmatic dependent launches that let the next kernel
    launch as soon as they run (sm90_gemm's docstring): the next one's CTAs
    start early and wait, and the profiler's span for it holds that wait. r72
    read those spans as kernel time (k_proj at 2048 tokens "59-65 µs", twice
    what the option runs alone: r73's retime read 24-29 µs). Counted this way,
    the shares add up to the stream's busy time."""
    times: dict[str, tuple[float, int]] = {}
    gemms: list[float] = []
    busy_until = first = float("-inf")
    for evt in sorted(events, key=lambda e: e.time_range.start):
        start = evt.time_range.start
        first = start if first == float("-inf") else first
        end = start + evt.time_range.elapsed_us()
        own = max(0.0, end - max(start, busy_until))
        busy_until = max(busy_until, end)
        us, count = times.get(evt.name, (0.0, 0))
        times[evt.name] = (us + own, count + 1)
        if kernel_kind(evt.name) in ("ours", "cuBLAS"):
            if "reduce_kernel" in evt.name and gemms:
                gemms[-1] += own
            else:
                gemms.append(own)
    return times, gemms, (busy_until - first) if times else 0.0


class _GemmCalls(torch.overrides.TorchFunctionMode):
    """Records each matrix product torch is asked for: F.linear under the name
    of the nn.Linear running it, any other (the rotary embedding's matmul) as
    ``(matmul)``, with its MxNxK (batch dimensions folded into M) and dtype."""

    PRODUCTS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm,
                torch.bmm, torch.Tensor.bmm, torch.addmm, torch.baddbmm)

    def __init__(self, running: list[str]):
        super().__init__()
        self.running, self.calls = running, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            x, w = args[0], args[1]
            self.calls.append((self.running[-1] if self.running else "(linear)",
                               f"{x.numel() // max(1, x.shape[-1])}x{w.shape[0]}x{w.shape[1]}", str(x.dtype)))
        elif func in self.PRODUCTS:
            a, b = (args[1], args[2]) if func in (torch.addmm, torch.baddbmm) else (args[0], args[1])
            if a.dim() >= 2 and b.dim() >= 2:
                self.calls.append(("(matmul)", f"{a.numel() // a.shape[-1]}x{b.shape[-1]}x{a.shape[-1]}",
                                   str(a.dtype)))
        return func(*args, **(kwargs or {}))


def gemm_order(model, run, inputs) -> list[tuple[str, str, str]]:
    """(name, MxNxK, dtype) of each matrix product one eager forward asks torch
    for, in call order: each nn.Linear by its module name, other products (the
    rotary embedding's, which cuBLAS also runs) as ``(matmul)``. These name the
    rows of ``render_gemms``. Hooks are added and removed before anything is
    compiled."""
    running: list[str] = []
    handles = []

    def leave(mod, args, out):  # returns None: a forward hook's value would replace the output
        running.pop()
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            handles.append(mod.register_forward_pre_hook(lambda m, args, name=name: running.append(name)))
            handles.append(mod.register_forward_hook(leave))
    mode = _GemmCalls(running)
    try:
        with torch.no_grad(), mode:
            run(model, *inputs)
    finally:
        for h in handles:
            h.remove()
    return mode.calls


def render_gemms(variants: dict[str, list[float]],
                 order: list[tuple[str, str, str]] | None = None) -> str:
    """The GEMMs of one forward in launch order, a column a variant, each row
    named after the product eager torch asks for at that place (``order``,
    ``gemm_order``'s); a variant whose launch count differs from it launches
    in another order, and its rows say so."""
    names = list(variants)
    rows = max(len(v) for v in variants.values())
    order = order or []
    text = ("GEMMs in launch order (µs: each kernel's share of the stream, from the end of the kernel "
            "before it; a split GEMM with its reduction). A row is named after the product eager torch "
            "asks for at that place; inductor may launch a product no Linear makes (the rotary "
            "embedding's) a row or two later, so a compiled column can be off by that row.\n\n"
            "| # | product (MxNxK) | " + " | ".join(names) + " |\n"
            + "|---" * (len(names) + 2) + "|\n")
    for i in range(rows):
        what = f"`{order[i][0]}` {order[i][1]}" if i < len(order) else ""
        if i < len(order) and order[i][2] != "torch.bfloat16":
            what += f" {order[i][2].removeprefix('torch.')}"
        text += f"| {i + 1} | {what} | " + " | ".join(
            f"{variants[v][i]:.1f}" if i < len(variants[v]) else "" for v in names) + " |\n"
    off = [v for v in names if order and len(variants[v]) != len(order)]
    if off:
        text += (f"\n{', '.join(off)}: {'a launch count' if len(off) == 1 else 'launch counts'} other "
                 f"than the {len(order)} products, so the names do not hold for "
                 f"{'it' if len(off) == 1 else 'them'}.\n")
    return text + "\n"


def render_profile(tokens: int, prof: dict[str, tuple], top: int = 8,
                   order: list[tuple[str, str, str]] | None = None) -> str:
    """Kernel time by kind per variant (each kernel's share of the stream),
    each variant's GEMMs in launch order (named by ``order``, ``gemm_order``'s),
    then each variant's heaviest kernels."""
    gemms = {variant: got[1] for variant, got in prof.items()}
    by_name = {variant: got[0] for variant, got in prof.items()}
    spans = {variant: got[2] for variant, got in prof.items() if len(got) > 2}
    kinds = [k for k, _ in KINDS] + ["other"]
    text = (f"### Device time at {tokens} tokens (one forward under torch.profiler; ms: each kernel's "
            "share of the stream; span: the first kernel's start to the last one's end, and idle: the "
            "span's time in which the stream ran no kernel)\n\n"
            "| variant | " + " | ".join(f"{k} ms" for k in kinds) + " | kernels ms | span ms | idle ms | launches |\n"
            + "|---" * (len(kinds) + 5) + "|\n")
    for variant, times in by_name.items():
        per = {k: 0.0 for k in kinds}
        for name, (us, _) in times.items():
            per[kernel_kind(name)] += us
        busy = sum(per.values())
        span = (f"{spans[variant] / 1e3:.3f} | {(spans[variant] - busy) / 1e3:.3f}"
                if variant in spans else "|")
        text += (f"| {variant} | " + " | ".join(f"{per[k] / 1e3:.3f}" for k in kinds)
                 + f" | {busy / 1e3:.3f} | {span} | {sum(c for _, c in times.values())} |\n")
    text += "\n" + render_gemms(gemms, order)
    for variant, times in by_name.items():
        text += (f"\n{variant}, the {top} heaviest kernels:\n\n| kernel | kind | launches | ms |\n"
                 "|---|---|---|---|\n")
        for name, (us, count) in sorted(times.items(), key=lambda kv: -kv[1][0])[:top]:
            short = name if len(name) <= 90 else name[:87] + "..."
            text += f"| `{short}` | {kernel_kind(name)} | {count} | {us / 1e3:.3f} |\n"
    return text + "\n"


def bench_model(name, builder, args, cache):
    model, make_inputs, run = builder(args.layers)
    patched = copy.deepcopy(model)
    report = patch(patched, cache)
    print(f"[{name}] {report}", flush=True)
    # before anything compiles: the products eager torch asks for at each profiled token count
    orders = {t: gemm_order(model, run, make_inputs(t)) for t in sorted(args.profile)}
    probe = make_inputs(128)
    breaks = {}
    for label, m in (("unpatched", model), ("patched", patched)):
        explained = torch._dynamo.explain(lambda *a, m=m: run(m, *a))(*probe)
        breaks[label] = explained.graph_break_count
    torch._dynamo.reset()
    variants = {"eager": model, "patched": patched}
    if not args.no_compile:
        variants["compiled"] = torch.compile(model, fullgraph=True)
        variants["patched+compiled"] = torch.compile(patched, fullgraph=True)
    rows, profiles = [], {}
    for tokens in args.tokens:
        inp = make_inputs(tokens)
        with torch.no_grad():
            t0 = time.perf_counter()
            outs = {v: run(m, *inp) for v, m in variants.items()}  # warm-up (and compile)
            torch.cuda.synchronize()
            warm = time.perf_counter() - t0
            errs = {v: rel_err(o, outs["eager"]) for v, o in outs.items() if v != "eager"}
            del outs
            reps = max(3, min(args.reps, args.reps * 512 // tokens)) if tokens > 512 else args.reps
            samples = {v: [] for v in variants}
            for _ in range(args.rounds):  # interleaved: clocks drift, every variant sees the same drift
                for v, m in variants.items():
                    samples[v].append(time_ms(lambda m=m: run(m, *inp), reps))
            if tokens in args.profile:
                profiles[tokens] = {v: kernel_times(lambda m=m: run(m, *inp)) for v, m in variants.items()}
        med = {v: statistics.median(s) for v, s in samples.items()}
        rows.append((tokens, med, errs, warm))
        print(f"[{name}] T={tokens}: " + ", ".join(f"{v} {t:.3f} ms" for v, t in med.items())
              + "; rel err " + ", ".join(f"{v} {e:.1e}" for v, e in errs.items()), flush=True)
    del variants, patched, model
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return report, breaks, rows, (profiles, orders)


def render(name, report, breaks, rows, compiled: bool) -> str:
    text = f"## {name}\n\n"
    text += (f"patch coverage: {len(report.swapped)} of {len(report.swapped) + len(report.skipped)} "
             f"nn.Linear modules swapped ({report.coverage:.0%}), {len(report.fused)} activations "
             "fused into the epilogue.\n")
    reasons: dict[str, int] = {}
    for s in report.skipped:
        reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    if reasons:
        text += "skipped: " + ", ".join(f"{k} x{v}" for k, v in sorted(reasons.items())) + "; e.g. "
        text += "; ".join(f"`{s['name']}`: {s['detail']}" for s in report.skipped[:3]) + "\n"
    text += (f"\ngraph breaks (torch._dynamo.explain at T=128): unpatched {breaks['unpatched']}, "
             f"patched {breaks['patched']}.\n\n")
    cols = ["eager", "patched"] + (["compiled", "patched+compiled"] if compiled else [])
    text += ("| tokens | " + " | ".join(f"{c} ms" for c in cols) + " | patched / eager"
             + (" | patched+compiled / compiled | patched+compiled / eager" if compiled else "")
             + " | rel err " + " / ".join(c for c in cols[1:]) + " | warm-up s |\n")
    text += "|---" * (len(cols) + (4 if compiled else 2) + 1) + "|\n"
    for tokens, med, errs, warm in rows:
        cells = [f"{med[c]:.3f}" for c in cols]
        ratios = [f"{med['eager'] / med['patched']:.2f}x"]
        if compiled:
            ratios += [f"{med['compiled'] / med['patched+compiled']:.2f}x",
                       f"{med['eager'] / med['patched+compiled']:.2f}x"]
        err = " / ".join(f"{errs[c]:.1e}" + ("" if errs[c] < TOL else " FAIL") for c in cols[1:])
        text += f"| {tokens} | " + " | ".join(cells + ratios) + f" | {err} | {warm:.1f} |\n"
    text += "\nRatios are speedups (>1: the second variant is faster).\n\n"
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", default=os.environ.get("CUTLASS_AOT_CACHE_DIR"))
    ap.add_argument("--tokens", default="1,16,128,512,2048,8192")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--models", default="llama,block")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--profile", default="", metavar="T,...",
                    help="token counts (of --tokens) at which one forward of each variant is profiled")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
        args.profile = {int(t) for t in args.profile.split(",") if t}
    except ValueError:
        ap.error(f"--tokens {args.tokens!r} / --profile {args.profile!r}: want comma-separated integers")
    if not args.profile <= set(args.tokens):
        ap.error(f"--profile {sorted(args.profile)}: each must be one of --tokens {args.tokens}")
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    cache = cutlass_aot.open_cache(args.cache_dir)
    builders = {"llama": build_llama, "block": build_block}
    text = header("Real models: eager vs patched vs torch.compile (bf16, batch 1)")
    text += (f"{args.layers} layers, width 4096, MLP 14336; {args.rounds} interleaved rounds of "
             f"{args.reps} forwards (fewer above 512 tokens), median ms per forward (CUDA events). "
             f"Outputs vs eager torch: relative Frobenius error, tolerance {TOL:.0e}. "
             f"Cache: {cache.path}.\n\n")
    failed = False
    for name in args.models.split(","):
        report, breaks, rows, (profiles, orders) = bench_model(name, builders[name], args, cache)
        text += render(name, report, breaks, rows, not args.no_compile)
        text += "".join(render_profile(t, p, order=orders.get(t)) for t, p in sorted(profiles.items()))
        failed |= any(e >= TOL for _, _, errs, _ in rows for e in errs.values())
        failed |= breaks["patched"] != 0
    snap = cache.stats()
    text += f"cache.stats() totals after the run: {snap['totals']}.\n"
    print(text)
    print("wrote", write("model.md", text, args.out))
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
