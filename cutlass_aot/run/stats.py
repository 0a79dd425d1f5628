"""Stats: what a cache served, fell back on, or missed, per signature and shape bucket.

Run side: standard library and the core modules only (no torch), so it can
be tested and read anywhere.

One ``Stats`` object lives on each opened ``Cache`` (``cache.stats()`` is its
``snapshot()``). Dispatch feeds it from its slow path only:

* ``stats.record_hit(sig, m, n, k, l)`` when it resolves a new dispatch key
  that an artifact serves. So ``hits`` counts dispatch keys (the first call
  of each output shape and layout), not calls: the hot path pays nothing. A
  dispatcher that wants per-call hits keeps the returned ``Slot`` with the
  memoized function and does ``slot.hits += 1`` per call (pass ``count=0``).
  ``staged=True`` also counts the key in ``staged``: a call whose operands
  are not 16-byte aligned, served by a 16-byte variant through copies into
  aligned scratch (run/dispatch.py), so the copies are visible;
* ``stats.record_fallback(sig, m, n, k, l, count=0)`` when it resolves a
  key no artifact serves under ``on_miss="torch"``; the torch launcher then
  does ``slot.fallbacks += 1`` per call (that path runs a torch matmul, so
  fallbacks are counted per call);
* ``stats.record_miss(sig, m, n, k, l)`` per call no artifact serves under
  ``on_miss="raise"`` (those calls raise KernelNotFoundError and are never
  memoized, so each one takes the slow path).

Each ``record_*`` also writes the shape log (``shapelog.log_shape``: once per
process per record, only when CUTLASS_AOT_SHAPE_LOG is set).

Shape bucket: ``(m_bucket, n, k, l)`` where ``m_bucket`` is the next power
of two at or above M (0 stays 0). M is what varies with batch and sequence
length in a model; N and K are a layer's widths, kept exact so each layer
stays visible. Counts are plain Python ints updated without a lock: under
several threads an increment can be lost (the GIL does not make ``+=``
atomic); they are statistics, not accounting.
"""

from __future__ import annotations

import threading

from ..shapelog import log_shape
from ..signature import Signature


def problem_dims(a, b) -> tuple[int, int, int, int]:
    """(M, N, K, L) of a call ``a @ b`` (L = 1 for rank 2), read from the operands' shapes."""
    return a.shape[-2], b.shape[-1], a.shape[-1], (a.shape[0] if len(a.shape) == 3 else 1)


def m_bucket(m: int) -> int:
    """The next power of two >= m (0 for 0)."""
    return 0 if m <= 0 else 1 << (int(m) - 1).bit_length()


class Slot:
    """Counters of one (signature, shape bucket)."""

    __slots__ = ("hits", "staged", "fallbacks", "misses")

    def __init__(self) -> None:
        self.hits = 0
        self.staged = 0
        self.fallbacks = 0
        self.misses = 0


class Stats:
    """Per-(signature, shape bucket) counters of one cache."""

    def __init__(self) -> None:
        self._slots: dict[tuple[Signature, tuple[int, int, int, int]], Slot] = {}
        self._lock = threading.Lock()

    def slot(self, sig: Signature, m: int, n: int, k: int, l: int) -> Slot:  # noqa: E741
        """The Slot of (sig, bucket of M, N, K, L), created on first use."""
        key = (sig, (m_bucket(m), int(n), int(k), int(l)))
        slot = self._slots.get(key)
        if slot is None:
            with self._lock:
                slot = self._slots.setdefault(key, Slot())
        return slot

    def record_hit(self, sig: Signature, m: int, n: int, k: int, l: int, count: int = 1,  # noqa: E741
                   staged: bool = False) -> Slot:
        """A new dispatch key an artifact serves; returns its Slot for the hot path.

        ``count`` is the number of calls to add now (1: the resolving call
        itself; 0 if the caller increments the Slot on every call, this one
        included). ``staged``: served through aligned copies (also counted
        in ``staged``).
        """
        slot = self.slot(sig, m, n, k, l)
        slot.hits += count
        if staged:
            slot.staged += count
        log_shape(sig, m, n, k, l, "hit")
        return slot

    def record_fallback(self, sig: Signature, m: int, n: int, k: int, l: int, count: int = 1) -> Slot:  # noqa: E741
        """A call no artifact serves ran through torch."""
        slot = self.slot(sig, m, n, k, l)
        slot.fallbacks += count
        log_shape(sig, m, n, k, l, "fallback")
        return slot

    def record_miss(self, sig: Signature, m: int, n: int, k: int, l: int) -> Slot:  # noqa: E741
        """A call no artifact serves raised KernelNotFoundError."""
        slot = self.slot(sig, m, n, k, l)
        slot.misses += 1
        log_shape(sig, m, n, k, l, "miss")
        return slot

    def reset(self) -> None:
        """Zero every counter (Slots held by dispatch stay valid)."""
        with self._lock:
            for slot in self._slots.values():
                slot.hits = slot.staged = slot.fallbacks = slot.misses = 0

    def snapshot(self) -> dict:
        """A JSON-ready copy of the counters.

        ``{"totals": {"hits", "staged", "fallbacks", "misses"}, "signatures":
        {text: {"hits", "staged", "fallbacks", "misses", "buckets": [{"m_le",
        "n", "k", "l", "hits", "staged", "fallbacks", "misses"}]}}}``, buckets
        sorted by shape. ``staged`` counts are also in ``hits``.
        """
        names = Slot.__slots__
        with self._lock:
            items = [(sig, shape, tuple(getattr(slot, n) for n in names))
                     for (sig, shape), slot in self._slots.items()]
        sigs: dict[str, dict] = {}
        totals = dict.fromkeys(names, 0)
        for sig, (mb, n, k, batch), counts in sorted(items, key=lambda x: (x[0].text(), x[1])):
            entry = sigs.setdefault(sig.text(), {**dict.fromkeys(names, 0), "buckets": []})
            entry["buckets"].append({"m_le": mb, "n": n, "k": k, "l": batch, **dict(zip(names, counts))})
            for name, value in zip(names, counts):
                entry[name] += value
                totals[name] += value
        return {"totals": totals, "signatures": sigs}
