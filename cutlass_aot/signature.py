"""Argument signatures: what a call must look like for an artifact to serve it.

Core module: standard library only. Shared by the build side (each variant
declares the signature it serves), the cache index (entries are grouped by
signature) and the run side (a call's tensors are mapped to a signature).

A signature is an operation name, the exact target arch string and a flat set
of named fields whose values are short strings, ints or bools (None for "not
present"). Its canonical text, ``op[arch](k=v,...)`` with keys sorted, is how
it is written in the index, in error messages and in ``cutlass-aot ls``.

Naming of GEMM fields (``op == "gemm"``):

| field   | values                         | meaning                                  |
| ------- | ------------------------------ | ---------------------------------------- |
| a, b    | f16, bf16                      | input dtypes                             |
| d       | f16, bf16, f32                 | output dtype                             |
| c       | f16, bf16, f32, None           | dtype of the optional C input            |
| a_major | k, m                           | contiguous dim of a[M,K]                 |
| b_major | k, n                           | contiguous dim of b[K,N]                 |
| d_major | n, m                           | contiguous dim of d[M,N] (and of C)      |
| rank    | 2, 3                           | 2: [M,K]@[K,N]; 3: batched [L,M,K]@...   |
| align   | 16                             | bytes: pointers and leading dims         |
| bias    | f16, bf16, f32 (absent: none)  | dtype of a per-column bias vector [N]    |
| act     | relu, gelu, gelu_erf, silu     | activation after the epilogue (absent:   |
|         | (absent: none)                 | none)                                    |

``bias`` and ``act`` appear only when set, so the plain signatures read the
same as before they existed. ``gemm_signature`` builds every GEMM signature
(the family's and the run side's) and ``gemm_abi_args`` is the one place that
says in which order an artifact takes its arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

Value = Union[str, int, bool, None]

# dtype names used in manifests, signatures and the index, with their widths.
# The artifacts' alignment checks are compiled from these widths, and this
# file is not hashed into keys: a change needs new ABI names in layout.py
# (tests/test_keys.py's RECORDED_ABI holds the line).
DTYPE_BITS = {
    "f16": 16,
    "bf16": 16,
    "f32": 32,
    "e4m3": 8,
    "e5m2": 8,
}

# The one arch string each compute capability is served by. sm_90a (with the
# wgmma/setmaxnreg features) is not sm_90: an sm_90 artifact would be a
# different signature.
ARCH_BY_CAPABILITY = {
    (8, 0): "sm_80",
    (8, 6): "sm_86",
    (8, 9): "sm_89",
    (9, 0): "sm_90a",
    (10, 0): "sm_100a",
}


@dataclass(frozen=True)
class Signature:
    """An operation, a target arch and named, canonical fields."""

    op: str
    arch: str
    fields: tuple[tuple[str, Value], ...]

    @classmethod
    def make(cls, op: str, arch: str, fields: Mapping[str, Value]) -> Signature:
        for name, value in fields.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"signature field name must be a non-empty str: {name!r}")
            if value is not None and not isinstance(value, (str, int, bool)):
                raise TypeError(
                    f"signature field {name!r} has value {value!r} of type "
                    f"{type(value).__name__}; only str, int, bool and None are allowed"
                )
        return cls(op, arch, tuple(sorted(fields.items())))

    def get(self, name: str) -> Value:
        for k, v in self.fields:
            if k == name:
                return v
        raise KeyError(name)

    def as_dict(self) -> dict:
        return {"op": self.op, "arch": self.arch, "fields": dict(self.fields)}

    @classmethod
    def from_dict(cls, data: Mapping) -> Signature:
        return cls.make(data["op"], data["arch"], data["fields"])

    def text(self) -> str:
        body = ",".join(f"{k}={_fmt(v)}" for k, v in self.fields)
        return f"{self.op}[{self.arch}]({body})"

    def __str__(self) -> str:
        return self.text()

    def distance(self, other: Signature) -> int:
        """How many fields (op and arch included) differ; for "nearest" hints."""
        mine, theirs = dict(self.fields), dict(other.fields)
        names = set(mine) | set(theirs)
        diff = sum(1 for n in names if mine.get(n, "?") != theirs.get(n, "?"))
        return diff + (self.op != other.op) * 10 + (self.arch != other.arch)


GEMM_ACTS = ("none", "relu", "gelu", "gelu_erf", "silu")


def gemm_signature(
    arch: str, *, a: str, b: str, d: str, c: str | None, a_major: str, b_major: str,
    d_major: str, rank: int, align: int = 16, bias: str | None = None, act: str = "none",
) -> Signature:
    """The signature of a GEMM call or variant (the schema above, written once)."""
    fields: dict[str, Value] = {
        "a": a, "b": b, "d": d, "c": c, "a_major": a_major, "b_major": b_major,
        "d_major": d_major, "rank": rank, "align": align,
    }
    if bias is not None:
        fields["bias"] = bias
    if act != "none":
        fields["act"] = act
    return Signature.make("gemm", arch, fields)


def gemm_abi_args(*, with_c: bool, bias: bool, split_k: bool) -> tuple[str, ...]:
    """Argument order of a GEMM artifact (the kernel's entry points follow it).

    Compiled into every artifact, but this file is not hashed into keys: a
    change needs new ABI names in layout.py (tests/test_keys.py's
    RECORDED_ABI fails until it has them).

    ``a, b, d[, c][, bias][, workspace], alpha[, beta][, splits], sm_count``:
    tensors first, then scalars; C brings beta, split-K brings its scratch
    workspace (fp32, from the caller) and the run-time split count.
    """
    args = ["a", "b", "d"]
    args += ["c"] if with_c else []
    args += ["bias"] if bias else []
    args += ["workspace"] if split_k else []
    args += ["alpha"]
    args += ["beta"] if with_c else []
    args += ["splits"] if split_k else []
    return (*args, "sm_count")


def splitk_tail_tiles(tiles: int, slots: int) -> int:
    """Cluster tiles a split-K variant splits: those of the last partial wave.

    With ``tiles`` cluster tiles on ``slots`` co-resident clusters (the SM
    count over the cluster size), the kernel runs the first
    ``floor(tiles / slots) * slots`` whole (data-parallel) and splits the
    rest; with fewer tiles than slots, all of them.
    """
    if slots < 1:
        raise ValueError(f"slots (SMs per cluster) must be >= 1, not {slots}")
    return tiles - (tiles // slots) * slots


# K-block of the split-K kernels (sm90_gemm's _K_BLOCK): stream-K deals
# whole k-blocks.
K_BLOCK = 64


@dataclass(frozen=True)
class StreamKPlan:
    """How a stream-K call (split count 0, split-K ABI v3) deals out the last
    partial wave (kernels/sm90_gemm.py computes the same in device integers).

    The ``tail`` cluster tiles' k-blocks, numbered tile after tile (``work``
    = tail x ``k_blocks`` of them), go to ``workers`` clusters (the slots,
    fewer when there are fewer k-blocks), worker w taking the run
    [w * work // workers, (w + 1) * work // workers). A tile's pieces are
    the runs that touch it; ``stride`` bounds them and sizes the workspace.
    """

    tail: int
    k_blocks: int
    work: int
    workers: int
    stride: int

    def run(self, worker: int) -> tuple[int, int]:
        """Worker ``worker``'s first and end k-block (empty past ``workers``)."""
        if worker >= self.workers:
            return self.work, self.work
        return worker * self.work // self.workers, (worker + 1) * self.work // self.workers

    def owner(self, block: int) -> int:
        """The worker whose run holds k-block ``block``."""
        return ((block + 1) * self.workers - 1) // max(self.work, 1)

    def pieces(self, tile: int) -> int:
        """How many runs touch tail tile ``tile`` (1: one worker ran it whole)."""
        first = tile * self.k_blocks
        return self.owner(first + self.k_blocks - 1) - self.owner(first) + 1


def streamk_plan(tail: int, k_blocks: int, slots: int) -> StreamKPlan:
    """The stream-K plan of ``tail`` cluster tiles of ``k_blocks`` k-blocks on
    ``slots`` co-resident clusters."""
    work = tail * k_blocks
    workers = max(min(slots, work), 1)
    least = max(work // workers, 1)
    return StreamKPlan(tail, k_blocks, work, workers, -(-k_blocks // least) + 1)


def splitk_workspace_elems(m: int, n: int, batch: int, splits: int, *, tile_m: int,
                           tile_n: int, cluster_m: int, cluster_n: int, swap_ab: bool,
                           sm_count: int, k: int = 0) -> int:
    """fp32 elements of scratch a split-K call needs (at least 1).

    One partial CTA tile per (split CTA tile, split): the split tiles are
    the CTAs of the last partial wave's cluster tiles (``splitk_tail_tiles``),
    in the kernel's (swapped, if swap-AB) M and N. ``splits`` = 0 is
    stream-K (``streamk_plan``, which needs ``k``): ``stride`` slots per tile.
    """
    if swap_ab:
        m, n = n, m
    size = cluster_m * cluster_n
    clusters = ceil_div(ceil_div(m, tile_m), cluster_m) * ceil_div(ceil_div(n, tile_n), cluster_n)
    slots = sm_count // size
    tail = splitk_tail_tiles(clusters * batch, slots)
    if splits == 0:
        splits = streamk_plan(tail, ceil_div(k, K_BLOCK), slots).stride
    return max(1, tail * size * splits * tile_m * tile_n)


def ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def _fmt(v: Value) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def yaml_scalar(v: Value) -> str:
    """A parameter value as a manifest writes it: null, true, false, 16, bf16."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def format_params(params: dict, names=None) -> str:
    """``k=v`` pairs (sorted by name, or in ``names`` order), values as in YAML."""
    keys = [k for k in names if k in params] if names is not None else sorted(params)
    return " ".join(f"{k}={yaml_scalar(params[k])}" for k in keys)
