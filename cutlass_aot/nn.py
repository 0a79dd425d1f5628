"""cutlass_aot.nn: a drop-in ``torch.nn.Linear`` served by the cache, and ``patch``.

Run side: imports torch and the run side only (never the DSL or the build
side). Importing it registers ``torch.ops.cutlass_aot.gemm`` (run/ops.py).

* ``Linear`` is a subclass of ``torch.nn.Linear`` with the same parameters
  and state dict (checkpoints load either way), whose forward on CUDA input
  of the weight's dtype is ``torch.ops.cutlass_aot.gemm(x2, weight.t(),
  bias=bias, act=act)``: the input's leading dims flattened to M (a
  row-major [M,K] A), ``weight.t()`` as B (b_major "k"), the bias and an
  optional activation fused into the epilogue. The custom op keeps it
  traceable by torch.compile(fullgraph=True) and capturable in CUDA graphs;
  in eager mode the forward calls the op's implementation directly
  (``ops.gemm_eager``: same checks and result, no dispatcher cost). Under
  torch.compile it calls the out= form, ``torch.ops.cutlass_aot.gemm_out``,
  into a ``new_empty`` output, which Inductor turns into one of its planned
  (reused) buffers.
  Other input (CPU tensors, another dtype, e.g. under autocast) runs through
  ``F.linear``, as nn.Linear would; meta tensors take the op (shape only).
  So does a forward that autograd records (training: grad mode on and a
  parameter or the input requiring grad): the op has no backward, and
  torch's kernels give the gradients. Inference (``torch.no_grad()``,
  ``torch.inference_mode()``) runs the cache.
* ``patch(model, cache=...)`` swaps every nn.Linear the cache can serve (its
  parameters are shared, not copied; hooks and training mode carried) and
  returns a ``PatchReport`` of what it swapped and why it skipped the rest.
  Whether the cache serves a module is decided from the cache index alone
  (run/servable.py), with no GPU call. With ``fuse_act=True`` a ReLU, GELU or
  SiLU module that directly follows a swapped Linear in an nn.Sequential is
  folded into its epilogue (and replaced by nn.Identity) when the cache
  serves the fused signature.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from .archs import call_alignment
from .archs import runnable_archs as _runnable
from .errors import ArgumentError
from .run import ops
from .run.fallback import ACTIVATIONS, apply_act
from .run.load import Cache, open_cache
from .run.select import signature_order, staged
from .run.servable import ALIGN_ELEMENTS, linear_signature, serves, serving_index
from .signature import ARCH_BY_CAPABILITY

_DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
# Activation modules a Linear's epilogue can absorb, by the act name they compute.
_KERNEL_DTYPES = (torch.float16, torch.bfloat16)  # what every family takes (ops.output_meta)
_ACT_MODULES = {nn.ReLU: lambda m: "relu", nn.SiLU: lambda m: "silu",
                nn.GELU: lambda m: "gelu" if m.approximate == "tanh" else "gelu_erf"}


def _cache_args(cache: Cache | str | os.PathLike | None) -> tuple[str | None, str | None]:
    """(path, on_miss) strings the op takes for a Cache, a path or None (default cache).

    A Cache object is bound to those strings (ops.bind_cache), so that the
    op's calls go through it: its stats, autotune and routing settings are
    the model's. A path is made absolute here: a later chdir must not move it.
    """
    if cache is None:
        return None, None
    if isinstance(cache, Cache):
        return ops.bind_cache(cache), cache.on_miss
    if not isinstance(cache, (str, os.PathLike)):
        raise ArgumentError(f"cache must be a Cache, a cache path or None, got {type(cache).__name__}",
                            reason="cache")
    return str(Path(cache).expanduser().absolute()), None


class Linear(nn.Linear):
    """``torch.nn.Linear`` whose CUDA forward runs a cutlass-aot GEMM (see module docstring).

    ``cache``: a Cache, a cache path, or None for the default cache.
    ``act``: an activation applied in the epilogue ("none" for nn.Linear's
    exact behaviour).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 *, cache: Cache | str | os.PathLike | None = None, act: str = "none"):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._set_serving(cache, act)

    def _set_serving(self, cache, act: str) -> None:
        if act not in ACTIVATIONS:
            raise ArgumentError(f"act must be one of {', '.join(ACTIVATIONS)}, got {act!r}", reason="act")
        self.cache_path, self.on_miss = _cache_args(cache)
        self.act = act

    @classmethod
    def from_linear(cls, module: nn.Linear, cache: Cache | str | os.PathLike | None = None,
                    act: str = "none") -> Linear:
        """A Linear sharing ``module``'s parameters, buffers, hooks and mode."""
        new = cls.__new__(cls)
        # Parameters, buffers and submodules dicts are copied shallowly, so
        # the Parameter objects are the same ones (tied weights stay tied)
        # while the old module's dicts stay its own. Hook dicts are shared:
        # a handle registered before the patch (a profiler's, accelerate's)
        # holds a weak reference to its dict, and must still remove the hook
        # from the module that now serves the model.
        new.__dict__.update({k: copy.copy(v) if isinstance(v, dict) and "hook" not in k else v
                             for k, v in module.__dict__.items()})
        new._set_serving(cache, act)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        # meta tensors take the op too: its fake implementation is its meta kernel.
        # With autograd recording (training), torch computes forward and backward.
        # So do calls no kernel takes (fp32 after .float(); a width that is not
        # in_features, where torch raises its own error) and forward-mode AD,
        # which the op has no formula for.
        if (x.device.type not in ("cuda", "meta") or x.dtype != w.dtype or w.dtype not in _KERNEL_DTYPES
                or x.dim() == 0 or x.shape[-1] != self.in_features
                or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                                 or (self.bias is not None and self.bias.requires_grad)))
                or (not torch.compiler.is_compiling() and ops.forward_ad_active())):
            return apply_act(F.linear(x, w, self.bias), self.act)
        flat = x.dim() == 2
        # math.prod, not -1: a zero-element x (in_features 0) has no -1 to infer
        x2 = x if flat else x.reshape(math.prod(x.shape[:-1]), self.in_features)
        if x2.stride(-1) != 1:
            # a transposed or strided x (x.t(), x[:, ::2]): patch() checked the
            # row-major signature, which F.linear's callers may not match
            x2 = x2.contiguous()
        if torch.compiler.is_compiling():
            # torch.compile: the out= op, so that Inductor allocates the output
            # as one of its planned buffers (reused across layers) rather than
            # the op allocating a tensor per call.
            y = x2.new_empty((x2.shape[0], self.out_features))
            ops.gemm_out(x2, w.t(), y, bias=self.bias, act=self.act, cache=self.cache_path,
                         on_miss=self.on_miss)
        else:
            # Eager calls take the op's own implementation, without the torch
            # dispatcher's per-call cost (about 4 us, benchmarks/bench_host.py);
            # tensor subclasses (a tracer's fake tensors, DTensor) take the op.
            eager = type(x) is torch.Tensor and x.device.type == "cuda"
            y = (ops.gemm_eager if eager else ops.gemm)(
                x2, w.t(), bias=self.bias, act=self.act, cache=self.cache_path, on_miss=self.on_miss)
        return y if flat else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        act = "" if self.act == "none" else f", act={self.act}"
        return f"{super().extra_repr()}{act}, cache={self.cache_path or 'default'}"


@dataclass
class PatchReport:
    """What ``patch`` did. ``model`` is the patched model (a new object only if it was itself a Linear)."""

    model: nn.Module
    # {"name", "signature", "act", "in", "out"[, "staged": why its calls are copied]}
    swapped: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # {"name", "reason", "detail"}
    fused: list[str] = field(default_factory=list)     # names of activation modules folded

    @property
    def coverage(self) -> float:
        """Fraction of nn.Linear modules swapped (1.0 when there were none)."""
        total = len(self.swapped) + len(self.skipped)
        return len(self.swapped) / total if total else 1.0

    def as_dict(self) -> dict:
        return {"swapped": self.swapped, "skipped": self.skipped, "fused": self.fused,
                "coverage": self.coverage}

    def __str__(self) -> str:
        lines = [f"patched {len(self.swapped)} of {len(self.swapped) + len(self.skipped)} nn.Linear "
                 f"modules ({self.coverage:.0%}); {len(self.fused)} activations fused"]
        lines += [f"  swapped {s['name'] or '<root>'}: {s['signature']}"
                  + (f" ({s['staged']})" if "staged" in s else "") for s in self.swapped]
        lines += [f"  skipped {s['name'] or '<root>'} ({s['reason']}): {s['detail']}" for s in self.skipped]
        return "\n".join(lines)


def _arch_of(weight: torch.Tensor, arch: str | None, cache_archs: set[str]) -> tuple[str | None, str]:
    """(arch, why not) for a module whose weight lives on weight.device."""
    dev = weight.device
    if dev.type == "cuda" and (arch is None or torch.cuda.is_available()):
        cap = torch.cuda.get_device_capability(dev)
        found = ARCH_BY_CAPABILITY.get(cap, f"sm_{cap[0]}{cap[1]}")
        if arch is not None and arch != found:
            return None, f"weights are on {dev} ({found}), but arch={arch} was asked for"
        return found, ""
    if dev.type not in ("cpu", "meta", "cuda"):
        return None, f"weights are on {dev}; the cache serves CUDA GPUs"
    if arch is not None:
        return arch, ""
    # The cache's device arch: the one arch whose device runs every arch the
    # cache holds (sm_90a for a cache of sm_90a and sm_90 entries).
    covering = [a for a in cache_archs if cache_archs <= set(_runnable(a))]
    if len(covering) == 1:
        return covering[0], ""
    return None, (f"weights are on {dev} and the cache serves archs {sorted(cache_archs) or 'none'}: "
                  "pass patch(..., arch=...) for the GPU the model will run on")


def check_linear(module: nn.Module, index, arch: str | None, cache_archs: set[str],
                 act: str = "none") -> tuple[str | None, str, str]:
    """(signature text or None, reason, detail) for one module; pure apart from reading it.

    ``index`` is a ``servable.serving_index`` of the cache. Reasons:
    ``subclass`` (also parametrized), ``patched``, ``shape`` (a weight or bias
    whose shape is not the module's features), ``dtype``, ``alignment``, ``device``,
    ``no-entry``; "" when the cache serves it (then ``detail`` is "" or, for
    widths that are not 16-byte multiples served by 16-byte variants, says
    which operands each call copies through aligned scratch: "staged: ...").
    """
    if isinstance(module, Linear):
        return None, "patched", "already a cutlass_aot.nn.Linear"
    if type(module).forward is not nn.Linear.forward:
        return None, "subclass", f"{type(module).__name__} overrides nn.Linear.forward"
    if parametrize.is_parametrized(module):
        return None, "subclass", "its weight is computed by a parametrization (e.g. weight_norm)"
    w = module.weight
    for name, t in (("weight", w), ("bias", module.bias)):
        if isinstance(t, torch.Tensor) and type(t) not in (torch.Tensor, nn.Parameter):
            # DTensor, a quantized weight, a fake: DLPack gives no pointer
            # to the values the module computes with
            return None, "subclass", (f"its {name} is a {type(t).__name__}, a tensor subclass "
                                      "whose values the kernels cannot read; torch computes it")
    if not isinstance(w, torch.Tensor) or tuple(w.shape) != (module.out_features, module.in_features):
        return None, "shape", (f"weight of shape {tuple(getattr(w, 'shape', ()))} is not "
                               f"(out_features, in_features) = ({module.out_features}, "
                               f"{module.in_features})")
    if module.bias is not None and tuple(module.bias.shape) != (module.out_features,):
        return None, "shape", (f"bias of shape {tuple(module.bias.shape)} is not "
                               f"(out_features,) = ({module.out_features},)")
    dtype = _DTYPE_NAMES.get(w.dtype)
    if dtype not in ("f16", "bf16"):
        return None, "dtype", f"weight dtype {w.dtype}; the GEMM kernels take float16 or bfloat16"
    if module.bias is not None and module.bias.dtype != w.dtype:
        return None, "dtype", f"bias dtype {module.bias.dtype} differs from the weight's {w.dtype}"
    target, why = _arch_of(w, arch, cache_archs)
    if target is None:
        return None, "device", why
    sig = linear_signature(target, dtype, module.bias is not None, act)
    # Row pitches in bytes: x[M,K] and weight[N,K] step by K, out[M,N] by N
    # (fresh tensors; the data pointers themselves are 16-byte aligned).
    elem = 2
    align = call_alignment([(0, (module.in_features, 1), elem), (0, (module.out_features, 1), elem)])
    order = signature_order(sig, align, _runnable(target))
    served = next((s for s in order if serves(index, s)), None)
    odd = {name: v for name, v in (("in_features", module.in_features),
                                   ("out_features", module.out_features)) if v % ALIGN_ELEMENTS[dtype]}
    bad = [f"{name}={v}" for name, v in odd.items()]
    if served is not None:
        if not staged(served, align):
            return served.text(), "", ""
        copied = " and ".join((["x", "weight"] if "in_features" in odd else [])
                              + (["out"] if "out_features" in odd else []))
        return served.text(), "", (
            f"staged: {', '.join(bad)} not a multiple of {ALIGN_ELEMENTS[dtype]}, so each call "
            f"copies {copied} through 16-byte pitched scratch, unless the model prefers a "
            "low-alignment variant the cache has")
    if align < 16:
        return None, "alignment", (
            f"{', '.join(bad)} not a multiple of {ALIGN_ELEMENTS[dtype]}: {dtype} rows are {align}-byte "
            f"aligned, and the cache has neither the 16-byte variants (which serve such calls "
            f"through aligned copies: {order[0]}) nor a variant for align {align} or less")
    return None, "no-entry", f"the cache has no entry for {sig}"


def _hooked(lin: nn.Module, actm: nn.Module) -> bool:
    """Whether folding ``actm`` into ``lin`` would change what a hook sees: a
    forward or backward hook on the Linear (it would see the activation's
    output and gradient), any hook on the activation (it would never run),
    or a global module hook (it would see one call fewer)."""
    from torch.nn.modules import module as _m  # noqa: PLC0415 - the global hook registries

    if lin._forward_hooks or lin._backward_hooks or lin._backward_pre_hooks:
        return True
    if (actm._forward_hooks or actm._forward_pre_hooks or actm._backward_hooks
            or actm._backward_pre_hooks):
        return True
    return any(getattr(_m, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks"))


def patch(model: nn.Module, cache: Cache | str | os.PathLike | None = None, *, arch: str | None = None,
          fuse_act: bool = True) -> PatchReport:
    """Swap every nn.Linear of ``model`` that ``cache`` serves for a cutlass_aot.nn.Linear.

    ``cache``: a Cache, a path (opened with open_cache) or None (the default
    cache). ``arch``: the target arch for modules whose weights are not on a
    GPU yet (default: the cache's only arch). Modules are changed in place;
    the returned report's ``model`` is ``model`` unless ``model`` itself was
    an nn.Linear.
    """
    if not isinstance(model, nn.Module):
        raise ArgumentError(f"patch takes a torch.nn.Module, got {type(model).__name__}", reason="model")
    if not isinstance(cache, Cache):
        cache = open_cache(_cache_args(cache)[0])
    index = serving_index(cache.by_signature)
    cache_archs = {sig.arch for sig in cache.by_signature}
    report = PatchReport(model=model)
    replaced: dict[int, nn.Module] = {}
    fold: dict[int, str] = {}  # id(activation module) -> its name, to become nn.Identity
    fused_act: dict[int, str] = {}  # id(Linear) -> act to fuse

    if fuse_act:
        parents: dict[int, int] = {}  # id(module) -> how many parents hold it
        for parent in model.modules():
            for child in parent._modules.values():
                parents[id(child)] = parents.get(id(child), 0) + 1
        for parent_name, parent in model.named_modules():
            # Only nn.Sequential's own forward chains each child into the
            # next; a subclass's forward may use a Linear's output elsewhere
            # (a residual), where the activation must not be folded in.
            if not isinstance(parent, nn.Sequential) or type(parent).forward is not nn.Sequential.forward:
                continue
            # _modules, not named_children(): the latter skips a child that
            # repeats, which would make a Linear look adjacent to a later module.
            kids = list(parent._modules.items())
            for (_, lin), (aname, actm) in zip(kids, kids[1:]):
                kind = _ACT_MODULES.get(type(actm))
                # Only a Linear whose output feeds nothing but this activation,
                # and no hook that would see the folded call (or its absence).
                if (kind is None or not isinstance(lin, nn.Linear) or _hooked(lin, actm)
                        or parents.get(id(lin)) != 1 or parents.get(id(actm)) != 1):
                    continue
                act = kind(actm)
                sig, _, _ = check_linear(lin, index, arch, cache_archs, act)
                if sig is not None:
                    fused_act[id(lin)] = act
                    fold[id(actm)] = f"{parent_name}.{aname}" if parent_name else aname

    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or id(module) in replaced:
            continue
        act = fused_act.get(id(module), "none")
        sig, reason, detail = check_linear(module, index, arch, cache_archs, act)
        if sig is None:
            report.skipped.append({"name": name, "reason": reason, "detail": detail})
            continue
        replaced[id(module)] = Linear.from_linear(module, cache, act)
        report.swapped.append({"name": name, "signature": sig, "act": act,
                               "in": module.in_features, "out": module.out_features}
                              | ({"staged": detail} if detail else {}))

    # Rewire every parent (a module shared by two parents is replaced in both).
    for parent in list(model.modules()):
        # _modules, not named_children(): the latter yields a shared child once.
        for child_name, child in list(parent._modules.items()):
            if id(child) in replaced:
                setattr(parent, child_name, replaced[id(child)])
            elif id(child) in fold:
                setattr(parent, child_name, nn.Identity())
    report.fused = sorted(fold.values())
    if id(model) in replaced:
        report.model = replaced[id(model)]
    return report


__all__ = ["Linear", "PatchReport", "check_linear", "patch"]
