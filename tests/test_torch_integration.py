"""Torch integration on a CPU machine: the fallback reference, stats and the shape
log, the coverage CLI, the custom op (registration, fake impl, torch.compile on
meta tensors, opcheck) and nn.Linear / patch() against a real built cache.

GPU behaviour (the op's real implementation, fallback through dispatch, CUDA
graphs) is in tests/gpu/test_torch_integration_gpu.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import cutlass_aot
from cutlass_aot import knobs, shapelog
from cutlass_aot.builder.manifest import load_manifest
from cutlass_aot.builder.plan import plan
from cutlass_aot.cli import main as cli_main
from cutlass_aot.errors import ArgumentError, UsageError
from cutlass_aot.nn import Linear, check_linear, patch
from cutlass_aot.run import ops
from cutlass_aot.run.fallback import ACTIVATIONS, torch_gemm
from cutlass_aot.run.servable import gemm_signature, linear_signature, normalized, serves, serving_index
from cutlass_aot.run.stats import Stats, m_bucket, problem_dims
from cutlass_aot.signature import Signature
from tests.support import REPO, edit_index, run_cli, subprocess_env


# ------------------------------------------------------------ fallback
def _reference(a, b, c, bias, act, alpha, beta):
    acc = torch.matmul(a.double(), b.double()) * alpha
    if c is not None:
        acc = acc + beta * c.double()
    if bias is not None:
        acc = acc + bias.double()
    return {"none": lambda x: x, "relu": torch.relu, "silu": F.silu,
            "gelu": lambda x: F.gelu(x, approximate="tanh"), "gelu_erf": F.gelu}[act](acc)


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("rank", [2, 3])
def test_fallback_matches_float64(act, rank):
    g = torch.Generator().manual_seed(1)
    batch = (3,) if rank == 3 else ()
    a = torch.randn(*batch, 37, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(*batch, 48, 64, generator=g).to(torch.bfloat16)
    b = w.transpose(-1, -2)
    c = torch.randn(*batch, 37, 48, generator=g).to(torch.float32)
    bias = torch.randn(48, generator=g)
    out = torch.empty(*batch, 37, 48, dtype=torch.float32)
    got = torch_gemm(a, b, out, c=c, bias=bias, act=act, alpha=0.75, beta=-0.5)
    assert got is out
    ref = _reference(a, b, c, bias, act, 0.75, -0.5)
    err = ((got.double() - ref).norm() / ref.norm()).item()
    assert err < 8e-3, err  # one bf16 rounding of the product


def test_fallback_plain_and_default_out():
    a = torch.randn(16, 32, dtype=torch.bfloat16)
    b = torch.randn(32, 8, dtype=torch.bfloat16)
    assert torch.equal(torch_gemm(a, b), torch.matmul(a, b))
    out = torch.empty(16, 8, dtype=torch.bfloat16)
    assert torch_gemm(a, b, out, bias=torch.zeros(8, dtype=torch.bfloat16)) is out
    assert torch.allclose(out.float(), torch.matmul(a, b).float(), rtol=1e-2, atol=1e-2)
    # Without c, beta is ignored.
    assert torch.equal(torch_gemm(a, b, beta=3.0), torch.matmul(a, b))


def test_fallback_bad_epilogue_arguments_are_clear_errors():
    a = torch.randn(4, 16, dtype=torch.bfloat16)
    b = torch.randn(16, 8, dtype=torch.bfloat16)
    with pytest.raises(ArgumentError, match="unknown act 'tanh'"):
        torch_gemm(a, b, act="tanh")
    with pytest.raises(ArgumentError, match="length N=8") as exc:
        torch_gemm(a, b, bias=torch.zeros(7, dtype=torch.bfloat16))
    assert exc.value.tensor == "bias"
    with pytest.raises(ArgumentError, match="dtype"):
        torch_gemm(a, b, bias=torch.zeros(8, dtype=torch.float16))
    with pytest.raises(ArgumentError, match="is on meta"):
        torch_gemm(a, b, bias=torch.zeros(8, dtype=torch.bfloat16, device="meta"))


# ------------------------------------------------------------ stats
def test_stats_buckets_and_snapshot(monkeypatch):
    monkeypatch.delenv("CUTLASS_AOT_SHAPE_LOG", raising=False)
    assert [m_bucket(m) for m in (0, 1, 2, 3, 100, 128, 129)] == [0, 1, 2, 4, 128, 128, 256]
    assert problem_dims(torch.empty(5, 7, 3), torch.empty(5, 3, 9)) == (7, 9, 3, 5)
    assert problem_dims(torch.empty(7, 3), torch.empty(3, 9)) == (7, 9, 3, 1)
    s = Stats()
    sig = gemm_signature("sm_90a", a="bf16")
    slot = s.record_hit(sig, 100, 4096, 4096, 1)
    for _ in range(4):
        slot.hits += 1  # what the hot path does
    assert s.record_hit(sig, 120, 4096, 4096, 1) is slot  # same bucket (M <= 128)
    s.record_fallback(sig, 129, 4096, 4096, 1)
    s.record_miss(gemm_signature("sm_90a", a="f16"), 1, 8, 8, 1)
    s.record_hit(sig, 3, 4095, 4097, 1, staged=True)  # unaligned: served through aligned copies
    snap = s.snapshot()
    assert snap["totals"] == {"hits": 7, "staged": 1, "fallbacks": 1, "misses": 1}
    entry = snap["signatures"][sig.text()]
    assert entry["hits"] == 7 and entry["staged"] == 1 and entry["fallbacks"] == 1
    assert [(b["m_le"], b["hits"], b["staged"], b["fallbacks"]) for b in entry["buckets"]] == [
        (4, 1, 1, 0), (128, 6, 0, 0), (256, 0, 0, 1)]
    json.dumps(snap)
    s.reset()
    assert s.snapshot()["totals"] == {"hits": 0, "staged": 0, "fallbacks": 0, "misses": 0}
    slot.hits += 1
    assert s.snapshot()["totals"]["hits"] == 1  # dispatch's Slot stays wired after reset


def test_cache_stats_and_on_miss_policy(built_cache, monkeypatch):
    monkeypatch.delenv("CUTLASS_AOT_ON_MISS", raising=False)
    raising = cutlass_aot.open_cache(built_cache.path)
    torchy = cutlass_aot.open_cache(built_cache.path, on_miss="torch")
    assert raising.on_miss == "raise" and torchy.on_miss == "torch" and raising is not torchy
    assert cutlass_aot.open_cache(built_cache.path, on_miss="torch") is torchy
    assert raising.stats() == {"totals": {"hits": 0, "staged": 0, "fallbacks": 0, "misses": 0},
                               "signatures": {}}
    with pytest.raises(UsageError, match="on_miss='ignore'"):
        cutlass_aot.Cache(built_cache.path, on_miss="ignore")
    monkeypatch.setenv("CUTLASS_AOT_ON_MISS", "torch")
    assert knobs.on_miss() == "torch"
    monkeypatch.setenv("CUTLASS_AOT_ON_MISS", "fallback")
    with pytest.raises(UsageError, match="CUTLASS_AOT_ON_MISS"):
        knobs.on_miss()
    monkeypatch.setenv("CUTLASS_AOT_UNALIGNED", "pad")
    with pytest.raises(UsageError, match="CUTLASS_AOT_UNALIGNED='pad': use one of auto, staged, native"):
        knobs.unaligned_route()
    monkeypatch.setenv("CUTLASS_AOT_UNALIGNED", "native")
    assert knobs.unaligned_route() == "native"


# ------------------------------------------------------------ shape log
def test_shape_log_once_per_process_and_roundtrip(tmp_path, monkeypatch):
    log = tmp_path / "shapes.jsonl"
    shapelog.forget_logged()
    monkeypatch.delenv("CUTLASS_AOT_SHAPE_LOG", raising=False)
    sig = gemm_signature("sm_90a", a="bf16", bias="bf16", act="gelu")
    assert shapelog.log_shape(sig, 5, 64, 32, 1, "miss") is False  # knob unset: nothing
    monkeypatch.setenv("CUTLASS_AOT_SHAPE_LOG", str(log))
    assert shapelog.log_shape(sig, 5, 64, 32, 1, "miss") is True
    assert shapelog.log_shape(sig, 5, 64, 32, 1, "miss") is False  # once per process
    assert shapelog.log_shape(sig, 5, 64, 32, 1, "fallback") is True
    Stats().record_hit(sig, 6, 64, 32, 2)
    records, skipped = shapelog.read_shape_log(log)
    assert skipped == 0
    assert [(r.signature, r.shape, r.outcome) for r in records] == [
        (sig, (5, 64, 32, 1), "miss"), (sig, (5, 64, 32, 1), "fallback"), (sig, (6, 64, 32, 2), "hit")]
    assert all(r.pid == os.getpid() for r in records)
    assert all(len(line) < shapelog.LINE_LIMIT for line in log.read_bytes().splitlines())
    shapelog.forget_logged()


def test_shape_log_write_error_never_fails_the_call(tmp_path, monkeypatch):
    shapelog.forget_logged()
    monkeypatch.setenv("CUTLASS_AOT_SHAPE_LOG", str(tmp_path / "no-such-dir" / "log.jsonl"))
    before = shapelog.LOG_STATE["errors"]
    with pytest.warns(RuntimeWarning, match="cannot write the shape log") if before == 0 else _nothing():
        assert shapelog.log_shape(gemm_signature("sm_90a", a="f16"), 1, 8, 8, 1, "hit") is False
    assert shapelog.LOG_STATE["errors"] == before + 1
    shapelog.forget_logged()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


BAD_LINES = [
    b"garbage{\n",
    b"\x00\xff\xfe binary\n",
    b"[1, 2, 3]\n",
    b'{"v": 2, "outcome": "hit"}\n',                       # a newer version
    b'{"v": 1, "outcome": "exploded", "m": 1}\n',           # unknown outcome
    b'{"v": 1, "outcome": "hit", "m": -1, "n": 1, "k": 1, "l": 1, "sig": {}}\n',
    b'{"v": 1, "outcome": "hit", "m": 1, "n": 1, "k": 1, "l": 1, "sig": {"op": 3}}\n',
    b'{"v": 1, "outcome": "hit", "m": true, "n": 1, "k": 1, "l": 1}\n',
    b'{"v": 1, "outcome": "miss", "signature": "gemm[sm_90a](a=bf16', # truncated, no newline
]


def test_malformed_and_truncated_lines_are_skipped_and_counted(tmp_path):
    log = tmp_path / "log.jsonl"
    good = shapelog.format_line(gemm_signature("sm_90a", a="bf16"), 1, 2, 3, 1, "hit")
    log.write_bytes(good + b"\n" + b"".join(BAD_LINES[:-1]) + good + BAD_LINES[-1])
    records, skipped = shapelog.read_shape_log(log)
    assert len(records) == 2 and skipped == len(BAD_LINES)


def test_a_time_stamp_past_a_float_is_junk_not_a_crash(tmp_path):
    """'t' is read as a float: an int too large for one (and NaN) reads as no time."""
    rec = json.loads(shapelog.format_line(gemm_signature("sm_90a", a="bf16"), 7, 64, 32, 1, "miss"))
    log = tmp_path / "log.jsonl"
    lines = [json.dumps(dict(rec, t=10**400)), json.dumps(dict(rec, t=float("nan")))]
    log.write_text("\n".join(lines) + "\n")
    records, skipped = shapelog.read_shape_log(log)
    assert skipped == 0 and [r.t for r in records] == [None, None] and records[0].m == 7
    res = run_cli("coverage", log, "--json")
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                               max_size=4), max_leaves=12)
_keys = st.sampled_from(["v", "outcome", "signature", "sig", "m", "n", "k", "l", "pid", "t", "op",
                         "arch", "fields"])


_VALID = json.loads(shapelog.format_line(gemm_signature("sm_90a", a="bf16"), 1, 2, 3, 1, "hit"))


def _mutate(edit):
    """A valid record with one key (top level or in the signature) replaced or deleted."""
    where, key, value, delete = edit
    rec = json.loads(json.dumps(_VALID))
    target = rec if where == "top" else rec["sig"] if where == "sig" else rec["sig"]["fields"]
    if delete:
        target.pop(key, None)
    else:
        target[key] = value
    return json.dumps(rec).encode()


@given(st.binary(max_size=300)
       | st.dictionaries(_keys, _json, max_size=10).map(lambda d: json.dumps(d).encode())
       | st.tuples(st.sampled_from(["top", "sig", "fields"]), _keys, _json, st.booleans()).map(_mutate))
def test_any_line_parses_to_a_record_or_none(line):
    rec = shapelog.parse_line(line)
    assert rec is None or isinstance(rec, shapelog.ShapeRecord)


WRITER = r"""
import sys
from cutlass_aot.shapelog import log_shape
from cutlass_aot.signature import Signature
me, n = int(sys.argv[1]), int(sys.argv[2])
# a long signature, so each line is ~1.5 KB and torn writes would show
sig = Signature.make("gemm", "sm_90a", {"a": "bf16", "pad": "x" * 1200, "writer": me})
sys.stdin.readline()                      # start together
for i in range(n):
    assert log_shape(sig, i, 64, 32, 1, "miss")
"""


def test_eight_processes_append_at_once_without_torn_lines(tmp_path):
    log = tmp_path / "shared.jsonl"
    env = subprocess_env(CUTLASS_AOT_SHAPE_LOG=str(log))
    per = 200
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(w), str(per)], cwd=REPO, env=env,
                              stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(8)]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        p.stdin.close()
        assert p.wait(timeout=120) == 0, p.stderr.read()
    records, skipped = shapelog.read_shape_log(log)
    assert skipped == 0
    assert len(records) == 8 * per
    seen = {(r.signature.get("writer"), r.m) for r in records}
    assert seen == {(w, i) for w in range(8) for i in range(per)}
    assert log.read_bytes().count(b"\n") == 8 * per


# ------------------------------------------------------------ coverage
def _write_log(path, rows):
    with open(path, "ab") as f:
        for sig, m, n, k, l, outcome in rows:  # noqa: E741
            f.write(shapelog.format_line(sig, m, n, k, l, outcome))


SERVED = gemm_signature("sm_90a", a="bf16")                                   # in the tiny cache
GAP = gemm_signature("sm_90a", a="f16", d="f32", c="f32", rank=3, a_major="m")  # buildable, not built
ALIEN = gemm_signature("sm_90a", a="bf16", d="e4m3")                             # no family builds it


@pytest.fixture
def logs(tmp_path):
    one, two = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write_log(one, [(SERVED, 128, 256, 64, 1, "hit"), (GAP, 64, 128, 64, 4, "fallback"),
                     (GAP, 64, 128, 64, 4, "miss"), (ALIEN, 8, 8, 8, 1, "miss")])
    _write_log(two, [(GAP, 100, 128, 64, 2, "fallback")])
    with open(two, "ab") as f:
        f.write(b"not json\n" + shapelog.format_line(SERVED, 1, 2, 3, 1, "hit")[:40])
    return one, two


def test_coverage_cli_reports_gaps_and_writes_a_manifest_build_accepts(logs, tmp_path):
    out = tmp_path / "patch.yaml"
    res = CliRunner().invoke(cli_main, ["coverage", *map(str, logs), "--manifest-out", str(out), "--json"])
    assert res.exit_code == 1, res.output  # gaps remain
    data = json.loads(res.output)
    assert data["ok"] is False and data["records"] == 5 and data["skipped"] == 2 and data["gaps"] == 2
    by_sig = {s["signature"]: s for s in data["signatures"]}
    gap = by_sig[GAP.text()]
    assert gap["counts"] == {"hit": 0, "fallback": 2, "miss": 1} and gap["gap"]
    assert [(s["m"], s["l"], s["fallback"], s["miss"]) for s in gap["shapes"]] == [(64, 4, 1, 1), (100, 2, 1, 0)]
    assert gap["family"] == "sm90_gemm"
    assert gap["params"] == {"a": "f16", "d": "f32", "with_c": True, "a_major": "m", "rank": 3}
    assert by_sig[ALIEN.text()]["unmappable"] and by_sig[ALIEN.text()]["params"] is None
    assert not by_sig[SERVED.text()]["gap"]
    assert data["manifests"] == [str(out)]
    # The patch is a manifest the builder accepts, and it plans exactly the gap.
    manifest = load_manifest(out)
    assert manifest.arch == "sm_90a" and len(manifest.variants) == 1
    assert [normalized(job.signature) for job in plan([manifest])] == [GAP]


def test_coverage_against_a_cache_and_exit_codes(logs, built_cache, tmp_path):
    only_served = tmp_path / "served.jsonl"
    _write_log(only_served, [(SERVED, 1, 2, 3, 1, "hit"),
                             # missed at the time, served by the cache now (legacy signature fields)
                             (gemm_signature("sm_90a", a="bf16", c="bf16"), 9, 16, 16, 1, "fallback")])
    res = run_cli("coverage", only_served, "--cache-dir", built_cache.path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "served now" in res.stdout and "0 gap(s)" in res.stdout
    res = run_cli("coverage", *logs, "--cache-dir", built_cache.path)
    assert res.returncode == 1 and "GAP" in res.stdout and "unmappable" in res.stdout
    assert "M=64 N=128 K=64 L=4: fallback=1 miss=1" in res.stdout
    res = run_cli("coverage", tmp_path / "missing.jsonl", "--json")
    assert res.returncode == 2 and json.loads(res.stdout)["error"] == "UsageError"
    res = run_cli("coverage", logs[0], "--cache-dir", tmp_path / "no-cache")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    res = run_cli("coverage")
    assert res.returncode == 2  # LOGS are required
    res = run_cli("coverage", logs[0], "--manifest-out", tmp_path / "no-dir" / "x.yaml")
    assert res.returncode == 2 and "cannot write" in res.stderr


def test_coverage_survives_garbage_logs(tmp_path):
    log = tmp_path / "garbage.jsonl"
    log.write_bytes(os.urandom(20000) + b"\n".join(BAD_LINES))
    res = CliRunner().invoke(cli_main, ["coverage", str(log), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["records"] == 0 and data["skipped"] > 0 and data["ok"]


def test_coverage_manifest_out_never_leaves_an_earlier_runs_patch(logs, tmp_path):
    """A patch at --manifest-out is the answer of the run that wrote it: once
    its gaps are closed (or its arches change), a later run removes it, so a
    CI step that builds the file never rebuilds stale gaps. Files coverage
    did not write, and patches under other names, are left alone."""
    out = tmp_path / "gaps.yaml"
    two_arch = tmp_path / "two.jsonl"
    _write_log(two_arch, [(GAP, 64, 128, 64, 4, "miss"),
                          (gemm_signature("sm_80", a="f16"), 64, 128, 64, 1, "miss")])
    res = CliRunner().invoke(cli_main, ["coverage", str(two_arch), "--manifest-out", str(out)])
    assert res.exit_code == 1, res.output
    per_arch = sorted(p.name for p in tmp_path.glob("gaps.*.yaml"))
    assert per_arch == ["gaps.sm_80.yaml", "gaps.sm_90a.yaml"] and not out.exists()
    other = tmp_path / "gaps.old.yaml"      # another run's patch under its own name
    other.write_text((tmp_path / "gaps.sm_80.yaml").read_text())
    # One arch now: the answer is gaps.yaml, and the per-arch patches go.
    res = CliRunner().invoke(cli_main, ["coverage", str(logs[1]), "--manifest-out", str(out), "--json"])
    data = json.loads(res.output)
    assert data["manifests"] == [str(out)] and out.exists()
    assert sorted(data["removed"]) == [str(tmp_path / "gaps.sm_80.yaml"), str(tmp_path / "gaps.sm_90a.yaml")]
    assert other.exists()
    # No gaps: the patch goes too, and the text report says so.
    served = tmp_path / "served.jsonl"
    _write_log(served, [(SERVED, 1, 2, 3, 1, "hit")])
    res = CliRunner().invoke(cli_main, ["coverage", str(served), "--manifest-out", str(out)])
    assert res.exit_code == 0 and not out.exists() and f"removed {out}" in res.output
    # A file coverage did not write is never removed.
    out.write_text("arch: sm_90a\nkernels: []\n")
    res = CliRunner().invoke(cli_main, ["coverage", str(served), "--manifest-out", str(out)])
    assert res.exit_code == 0 and out.read_text() == "arch: sm_90a\nkernels: []\n"
    assert other.exists()


def test_coverage_text_escapes_control_characters_and_lists_only_missed_shapes(tmp_path):
    """A log's strings are data: an escape sequence in a logged signature is
    printed escaped, never sent to the terminal. A gap's shape list holds the
    shapes that missed or fell back, not the ones served."""
    hostile = Signature.make("gemm", "sm_90a", {"a": "\x1b[2J\x1b[31mPWNED\x1b[0m"})
    log = tmp_path / "hostile.jsonl"
    _write_log(log, [(hostile, 1, 1, 1, 1, "miss"), (GAP, 8, 8, 8, 1, "hit"), (GAP, 16, 8, 8, 1, "miss")])
    res = CliRunner().invoke(cli_main, ["coverage", str(log)])
    assert res.exit_code == 1
    assert "\x1b" not in res.output and "\\x1b[2J" in res.output
    assert "M=16 N=8 K=8 L=1: fallback=0 miss=1" in res.output
    assert "M=8 N=8" not in res.output


def test_coverage_names_a_missing_cache_directory(logs, tmp_path):
    res = CliRunner().invoke(cli_main, ["coverage", str(logs[0]), "--cache-dir", str(tmp_path / "typo")])
    assert res.exit_code == 2
    assert "does not exist" in res.output and "empty" not in res.output
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(cli_main, ["coverage", str(logs[0]), "--cache-dir", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "the cache is empty" in res.output


def test_shape_log_writer_refuses_what_its_reader_skips(tmp_path, monkeypatch):
    """A record the reader would skip as malformed (a negative or non-integer
    dim) is never written: format_line refuses it, and log_shape drops it
    (counted) without failing the call."""
    sig = gemm_signature("sm_90a", a="bf16")
    for bad in (-1, 2.0, True, None):
        with pytest.raises(ValueError, match="dim m"):
            shapelog.format_line(sig, bad, 8, 8, 1, "hit")
    assert shapelog.parse_line(shapelog.format_line(sig, 0, 8, 8, 1, "hit")).shape == (0, 8, 8, 1)
    shapelog.forget_logged()
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("CUTLASS_AOT_SHAPE_LOG", str(log))
    before = shapelog.LOG_STATE["dropped"]
    assert shapelog.log_shape(sig, 4, -8, 8, 1, "miss") is False
    assert shapelog.LOG_STATE["dropped"] == before + 1 and not log.exists()
    shapelog.forget_logged()


# ------------------------------------------------------------ servable
def test_servable_matches_legacy_and_epilogue_signatures():
    legacy = Signature.make("gemm", "sm_90a", {"a": "bf16", "b": "bf16", "d": "bf16", "c": None,
                                               "a_major": "k", "b_major": "k", "d_major": "n",
                                               "rank": 2, "align": 16})
    index = serving_index({legacy: ["entry"]})
    assert serves(index, linear_signature("sm_90a", "bf16", has_bias=False))
    assert not serves(index, linear_signature("sm_90a", "bf16", has_bias=True))
    assert not serves(index, linear_signature("sm_90a", "bf16", has_bias=False, act="relu"))
    assert not serves(index, linear_signature("sm_80", "bf16", has_bias=False))
    assert not serves(serving_index({legacy: []}), linear_signature("sm_90a", "bf16", False))


# ------------------------------------------------------------ the custom op
def test_op_registration_is_idempotent_and_has_the_schema():
    assert ops.register() is ops.gemm is torch.ops.cutlass_aot.gemm
    schema = str(torch.ops.cutlass_aot.gemm.default._schema)
    assert schema.startswith("cutlass_aot::gemm(Tensor a, Tensor b, Tensor? c=None, Tensor? bias=None")
    assert "-> Tensor" in schema
    tags = torch.ops.cutlass_aot.gemm.default.tags
    assert torch.Tag.needs_exact_strides in tags or torch.Tag.needs_fixed_stride_order in tags
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import torch, cutlass_aot.nn, cutlass_aot.run.ops as ops
        assert ops.register() is torch.ops.cutlass_aot.gemm
        print(torch.ops.cutlass_aot.gemm.default._schema)
        """)], cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == schema


@pytest.mark.parametrize("case", ["rank2", "rank3", "c_f32", "out_dtype", "bias_act"])
def test_fake_impl_under_fake_tensor_mode(case):
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415 - torch internals

    with FakeTensorMode():
        bf = torch.bfloat16
        kwargs = {}
        if case == "rank3":
            a, b = torch.empty(4, 7, 64, dtype=bf), torch.empty(4, 64, 32, dtype=bf)
            want = ((4, 7, 32), bf)
        else:
            a, b = torch.empty(7, 64, dtype=bf), torch.empty(32, 64, dtype=bf).t()
            want = ((7, 32), bf)
        if case == "c_f32":
            kwargs["c"] = torch.empty(7, 32, dtype=torch.float32)
            want = ((7, 32), torch.float32)
        if case == "out_dtype":
            kwargs["out_dtype"] = torch.float32
            want = ((7, 32), torch.float32)
        if case == "bias_act":
            kwargs.update(bias=torch.empty(32, dtype=bf), act="gelu")
        y = torch.ops.cutlass_aot.gemm(a, b, **kwargs)
        assert (tuple(y.shape), y.dtype) == want
        assert y.is_contiguous()


def test_fake_impl_refuses_what_the_kernel_would():
    a = torch.empty(7, 64, dtype=torch.bfloat16, device="meta")
    b = torch.empty(64, 32, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ArgumentError, match="shapes do not agree"):
        torch.ops.cutlass_aot.gemm(a, b[:48])
    with pytest.raises(ArgumentError, match="length N=32"):
        torch.ops.cutlass_aot.gemm(a, b, bias=torch.empty(31, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(ArgumentError, match="unknown act"):
        torch.ops.cutlass_aot.gemm(a, b, act="gelu_tanh")
    with pytest.raises(ArgumentError, match="c must have the output's shape"):
        torch.ops.cutlass_aot.gemm(a, b, c=torch.empty(7, 31, dtype=torch.bfloat16, device="meta"))


def test_fake_impl_refuses_inputs_no_kernel_takes():
    """fp32 inputs (a Linear after .float()) and two input dtypes: the kernels
    take neither (nor does torch.matmul the second), so the fake refuses them
    while tracing, with the real implementation's message."""
    a32, b32 = _meta(7, 64, dtype=torch.float32), _meta(64, 32, dtype=torch.float32)
    with pytest.raises(ArgumentError, match="one dtype, float16 or bfloat16; got torch.float32"):
        torch.ops.cutlass_aot.gemm(a32, b32)
    with pytest.raises(ArgumentError, match="got torch.bfloat16 and torch.float16"):
        torch.ops.cutlass_aot.gemm(_meta(7, 64), _meta(64, 32, dtype=torch.float16))
    # The plan memo holds b's dtype too: a valid call first, then the mix.
    torch.ops.cutlass_aot.gemm(_meta(5, 64), _meta(64, 16))
    with pytest.raises(ArgumentError, match="one dtype"):
        torch.ops.cutlass_aot.gemm(_meta(5, 64), _meta(64, 16, dtype=torch.float16))


def test_compiled_calls_that_need_gradients_fail_while_tracing():
    """AOTAutograd traces the fake impl: without the autograd check there, a
    compiled graph through the op gave no gradients, silently (eager raised)."""
    # Meta tensors run the fake impl (it is the op's meta kernel); a CPU-only
    # torch cannot attach autograd to fake CUDA tensors.
    x = _meta(8, 64).requires_grad_(True)
    w = _meta(32, 64)
    with pytest.raises(ArgumentError, match="has no backward"):
        torch.ops.cutlass_aot.gemm(x, w.t())
    with pytest.raises(ArgumentError, match="has no backward"):
        torch.ops.cutlass_aot.gemm_out(x, w.t(), _meta(8, 32))
    with torch.no_grad():
        assert torch.ops.cutlass_aot.gemm(x, w.t()).shape == (8, 32)

    def f(x, w):
        return torch.ops.cutlass_aot.gemm(x, w.t()).float().sum()

    x, w = _meta(8, 64), _meta(32, 64)
    x.requires_grad_(True)
    with pytest.raises(Exception, match="has no backward"):
        torch.compile(f, backend="aot_eager", fullgraph=True)(x, w)


def test_forward_mode_ad_never_goes_through_the_op():
    """The op has no forward-AD formula (its tangent came back zero): under a
    dual level it refuses, and cutlass_aot.nn.Linear computes with torch."""
    import torch.autograd.forward_ad as fwad  # noqa: PLC0415

    lin = Linear(64, 32, bias=False, device="meta", dtype=torch.bfloat16).requires_grad_(False)
    x, t = _meta(4, 64), _meta(4, 64)
    with torch.no_grad(), fwad.dual_level():
        with pytest.raises(ArgumentError, match="no forward-mode AD formula"):
            torch.ops.cutlass_aot.gemm(x, lin.weight.t())
        y = lin(fwad.make_dual(x, t))
        assert fwad.unpack_dual(y).tangent is not None
    with torch.no_grad():
        assert torch.ops.cutlass_aot.gemm(x, lin.weight.t()).shape == (4, 32)


def test_linear_takes_torch_for_calls_no_kernel_serves():
    """A Linear at fp32 (or after .float()) runs F.linear, as its docstring
    says, instead of sending fp32 to the op; an input of the wrong width gets
    torch's own error, as from nn.Linear, zero rows included."""
    lin = Linear(64, 32, device="meta", dtype=torch.float32)
    with torch.no_grad():
        assert lin(_meta(4, 64, dtype=torch.float32)).dtype == torch.float32
        lin16 = Linear(8, 16, device="meta", dtype=torch.bfloat16)
        for bad in [(2, 3, 5), (2, 0, 5)]:
            with pytest.raises(RuntimeError):
                lin16(_meta(*bad))


def test_the_fallback_keeps_a_bf16_product_in_fp32_until_the_epilogue():
    """The kernels add C and write an fp32 D from the fp32 accumulator; the
    fallback rounded a bf16 product to bf16 first: 257 became 256, and a
    residual that cancels it gave 0 for 1."""
    a = torch.tensor([[1.0, 1.0]], dtype=torch.bfloat16)
    b = torch.tensor([[256.0], [1.0]], dtype=torch.bfloat16)
    c = torch.tensor([[-256.0]], dtype=torch.bfloat16)
    assert torch_gemm(a, b, torch.empty(1, 1, dtype=torch.bfloat16), c).item() == 1.0
    assert torch_gemm(a, b, torch.empty(1, 1, dtype=torch.float32)).item() == 257.0
    assert torch_gemm(a, b).item() == 256.0  # plain into bf16: the output's own rounding
    mixed = torch_gemm(a, b.half(), torch.empty(1, 1, dtype=torch.float32))
    assert mixed.item() == 257.0


def test_fake_impl_refuses_a_device_mix_when_traced():
    """The dispatcher refuses operands on two devices; the fake impls do too, so
    torch.compile fails while tracing rather than on the graph's first run."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415 - torch internals

    with FakeTensorMode():
        a = torch.empty(7, 64, dtype=torch.bfloat16, device="cuda")
        b = torch.empty(64, 32, dtype=torch.bfloat16, device="cpu")
        b_gpu = torch.empty(64, 32, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(ArgumentError, match="one device; got a=cuda.*b=cpu"):
            torch.ops.cutlass_aot.gemm(a, b)
        bias = torch.empty(32, dtype=torch.bfloat16, device="cpu")
        with pytest.raises(ArgumentError, match="bias is on cpu"):
            torch.ops.cutlass_aot.gemm(a, b_gpu, bias=bias)
        out = torch.empty(7, 32, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(ArgumentError, match="one device"):
            torch.ops.cutlass_aot.gemm_out(a, b, out)
        ok = torch.ops.cutlass_aot.gemm(a, b_gpu)
        assert ok.device.type == "cuda" and tuple(ok.shape) == (7, 32)


def _meta(*shape, dtype=torch.bfloat16, device="meta"):
    return torch.empty(*shape, dtype=dtype, device=device)


def _message(fn):
    with pytest.raises(ArgumentError) as exc:
        fn()
    return str(exc.value)


def test_op_plan_memo_never_lets_a_bad_call_pass():
    """The real implementation memoizes its checks per call key: each bad call,
    made after a good one of the same shapes was memoized, still raises the
    checks' own error, and again on a second call."""
    a, b = _meta(7, 64), _meta(32, 64).t()
    bias = _meta(32)
    good = ops.call_plan(a, b, None, bias, "silu", None)
    assert good[:3] == ((7, 32), (32, 1), torch.bfloat16)
    assert ops.call_plan(a, b, None, bias, "silu", None) is good  # memoized
    bad = {
        "shapes do not agree": (a, _meta(32, 48).t(), None, bias, "silu", None),
        "a\\[M,K\\] @ b\\[K,N\\]": (_meta(64), b, None, bias, "silu", None),
        "length N=32": (a, b, None, _meta(31), "silu", None),
        "bias has dtype torch.float16": (a, b, None, _meta(32, dtype=torch.float16), "silu", None),
        "bias is on cpu": (a, b, None, _meta(32, device="cpu"), "silu", None),
        "bias must be a torch.Tensor": (a, b, None, [0.0] * 32, "silu", None),
        "unknown act 'gelu_tanh'": (a, b, None, bias, "gelu_tanh", None),
        "unknown act \\['silu'\\]": (a, b, None, bias, ["silu"], None),  # unhashable: no key
        "c must have the output's shape": (a, b, _meta(7, 31), bias, "silu", None),
        "c must have the output's shape .* torch.float32": (a, b, _meta(7, 32), bias, "silu",
                                                             torch.float32),
    }
    for pattern, args in bad.items():
        want = _message(lambda args=args: ops.output_meta(*args))
        for _ in range(2):
            assert _message(lambda args=args: ops.call_plan(*args)) == want
            # the op's kernel: same error, before it looks for a cache
            with pytest.raises(ArgumentError, match=pattern) as exc:
                ops._gemm_impl(*args[:4], act=args[4], out_dtype=args[5], cache="/nonexistent")
            assert str(exc.value) == want
    # A valid key next to the bad ones is still served from the memo.
    assert ops.call_plan(a, b, None, bias, "silu", None) is good


def test_op_plan_memo_gives_each_key_its_own_meta():
    """Calls that differ in strides, dtypes, ranks, c or out_dtype get the meta
    output_meta gives them, and contiguous strides as torch computes them."""
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    a = _meta(7, 64)
    calls = [
        (a, _meta(32, 64).t(), None, None, "none", None),              # b_major k
        (a, _meta(64, 32), None, None, "none", None),                  # b_major n: same meta
        (a.t().contiguous().t(), _meta(64, 32), None, None, "none", None),  # a_major m
        (_meta(7, 64, dtype=f16), _meta(64, 32, dtype=f16), None, None, "none", None),
        (a, _meta(64, 32), None, None, "none", f32),
        (a, _meta(64, 32), _meta(7, 32, dtype=f32), None, "none", None),
        (a, _meta(64, 32), None, _meta(32, dtype=f32), "gelu", None),
        (_meta(3, 7, 64), _meta(3, 64, 32), None, None, "none", None),
        (_meta(3, 0, 64), _meta(3, 64, 32), None, None, "none", None),  # an empty batch row
        (_meta(7, 64, device="cpu"), _meta(64, 32, device="cpu"), None, None, "none", None),
    ]
    for _ in range(2):  # the second round comes from the memo
        for args in calls:
            shape, strides, dtype, device, like_a = ops.call_plan(*args)
            assert (shape, dtype) == ops.output_meta(*args)
            assert strides == torch.empty(shape, device="meta").stride()
            assert device == args[0].device and like_a == (dtype == args[0].dtype)
    assert ops.call_plan(*calls[3])[2] == f16 and ops.call_plan(*calls[4])[2] == f32
    assert ops.call_plan(*calls[0])[2] == bf and ops.call_plan(*calls[-1])[3].type == "cpu"


def test_op_kernel_refuses_cpu_tensors_and_autograd_on_every_call(built_cache, monkeypatch):
    """The checks the memo skips are its own; the dispatcher's (CUDA only) and
    the grad guard run on every call, and the memo stays bounded."""
    a, w = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):
            with pytest.raises(ArgumentError, match="CUDA"):
                ops._gemm_impl(a, w.t(), cache=str(built_cache.path))
    a.requires_grad_(True)
    for _ in range(2):
        with pytest.raises(ArgumentError, match="no backward"):
            ops._gemm_impl(a, w.t(), cache=str(built_cache.path))
    monkeypatch.setattr(ops, "_PLAN_LIMIT", 4)
    for m in range(1, 11):
        ops.call_plan(_meta(m, 64), _meta(64, 32), None, None, "none", None)
        assert len(ops._PLANS) <= 4


def test_gemm_out_op_schema_checks_and_fake_impl(built_cache):
    schema = str(torch.ops.cutlass_aot.gemm_out.default._schema)
    assert schema.startswith("cutlass_aot::gemm_out(Tensor a, Tensor b, Tensor(a!) out, Tensor? c=None")
    assert schema.endswith("-> ()") and ops.gemm_out is torch.ops.cutlass_aot.gemm_out
    tags = torch.ops.cutlass_aot.gemm_out.default.tags
    assert torch.Tag.needs_exact_strides in tags or torch.Tag.needs_fixed_stride_order in tags
    a, b = _meta(7, 64), _meta(32, 64).t()
    assert ops.gemm_out(a, b, _meta(7, 32), bias=_meta(32), act="relu") is None  # the fake, on meta
    ops.gemm_out(a, b, _meta(7, 32, dtype=torch.float32))  # out's dtype is the output's
    for out, pattern in ((_meta(7, 31), "out must have the output's shape \\(7, 32\\) on meta; got \\(7, 31\\)"),
                         (_meta(32, 7), "got \\(32, 7\\)"),
                         (_meta(7, 32, device="cpu"), "on meta; got \\(7, 32\\) on cpu")):
        with pytest.raises(ArgumentError, match=pattern):
            ops.gemm_out(a, b, out)
    with pytest.raises(ArgumentError, match="c must have the output's shape .* torch.float32"):
        ops.gemm_out(a, b, _meta(7, 32, dtype=torch.float32), c=_meta(7, 32))  # c: out's dtype
    # The real kernel: the same checks on every call (its memo shared with gemm's),
    # then the dispatcher's own (CUDA only).
    x, w = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):
            with pytest.raises(ArgumentError, match="CUDA"):
                ops._gemm_out_impl(x, w.t(), torch.empty(8, 32, dtype=torch.bfloat16),
                                   cache=str(built_cache.path))
            with pytest.raises(ArgumentError, match="out must have the output's shape \\(8, 32\\)"):
                ops._gemm_out_impl(x, w.t(), torch.empty(8, 33, dtype=torch.bfloat16),
                                   cache=str(built_cache.path))
    for _ in range(2):
        with pytest.raises(ArgumentError, match="no backward"):
            ops._gemm_out_impl(x, w.t(), torch.empty(8, 32, dtype=torch.bfloat16, requires_grad=True),
                               cache=str(built_cache.path))


def test_gemm_out_opcheck_on_meta_tensors():
    a, w, bias = _meta(16, 64), _meta(32, 64), _meta(32)
    result = torch.library.opcheck(ops.gemm_out, (a, w.t(), _meta(16, 32)), {"bias": bias, "act": "silu"})
    assert set(result.values()) == {"SUCCESS"}, result


def test_inductor_plans_gemm_out_buffers_and_reuses_them():
    """What Inductor generates for a chain of gemm_out calls (CPU tensors; its
    code only, not run: the kernel serves CUDA tensors): each call writes an
    Inductor buffer in place, with no copy, and dead buffers are reused."""
    from torch._inductor.utils import get_code  # noqa: PLC0415 - torch internals

    ws = [torch.randn(64, 64, dtype=torch.bfloat16) for _ in range(4)]

    def f(x):
        for w in ws:
            y = x.new_empty((x.shape[0], 64))
            torch.ops.cutlass_aot.gemm_out(x, w.t(), y, act="relu", cache="/some/cache")
            x = y
        return x

    try:
        # no compile caches: a cached graph would skip the code generation get_code reads
        with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
            code = get_code(torch.compile(f, fullgraph=True, backend="inductor"),
                            torch.randn(8, 64, dtype=torch.bfloat16))[0]
    finally:
        torch._dynamo.reset()
    call = code[code.index("def call("):]
    assert call.count("torch.ops.cutlass_aot.gemm_out.default(") == 4
    assert call.count("empty_strided_cpu(") == 2 and call.count("# reuse") == 2, call
    for copy_op in ("clone", "copy_", "auto_functionalized"):
        assert copy_op not in call, call


def test_op_opcheck_on_meta_tensors():
    a = torch.randn(16, 64, dtype=torch.bfloat16, device="meta")
    w = torch.randn(32, 64, dtype=torch.bfloat16, device="meta")
    bias = torch.randn(32, dtype=torch.bfloat16, device="meta")
    result = torch.library.opcheck(ops.gemm, (a, w.t()), {"bias": bias, "act": "silu"})
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_traces_the_op_without_graph_breaks(backend):
    def f(x, w, bias):
        h = torch.ops.cutlass_aot.gemm(x, w.t(), bias=bias, act="gelu")
        return torch.ops.cutlass_aot.gemm(h, w, alpha=0.5) + 1

    x = torch.empty(8, 64, dtype=torch.bfloat16, device="meta")
    w = torch.empty(64, 64, dtype=torch.bfloat16, device="meta")
    bias = torch.empty(64, dtype=torch.bfloat16, device="meta")
    y = torch.compile(f, fullgraph=True, backend=backend)(x, w, bias)
    assert y.shape == (8, 64) and y.device.type == "meta"
    explained = torch._dynamo.explain(f)(x, w, bias)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


# ------------------------------------------------------------ nn.Linear and patch
def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 128, bias=False),  # served (bf16, b_major k, no bias)
        nn.GELU(approximate="tanh"),
        nn.Linear(128, 64),              # bias: no bias entry in the tiny cache
        nn.Linear(64, 60, bias=False),   # staged (N=60: out copied through aligned scratch)
        nn.Sequential(nn.Linear(60, 64, bias=False)),  # staged (K=60: x and weight copied)
    ).to(torch.bfloat16)


def test_patch_report_on_a_cpu_model(built_cache):
    model = _model()
    model.add_module("head", nn.Linear(64, 64, bias=False))   # float32: dtype
    model.add_module("tied", model[0])                         # the same module twice
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    ref = model[:5](x)
    report = patch(model, built_cache.path)
    assert report.model is model
    assert [s["name"] for s in report.swapped] == ["0", "3", "4.0"]
    assert {s["signature"] for s in report.swapped} == {linear_signature("sm_90a", "bf16", False).text()}
    assert {s["name"]: s["reason"] for s in report.skipped} == {"2": "no-entry", "head": "dtype"}
    assert "staged" not in report.swapped[0] and "out_features=60" in report.swapped[1]["staged"]
    assert "in_features=60" in report.swapped[2]["staged"]
    assert report.fused == []  # the cache has no gelu epilogue: the GELU module stays
    assert isinstance(model[1], nn.GELU)
    assert type(model[0]) is Linear and model.tied is model[0]  # both parents rewired
    assert report.coverage == pytest.approx(3 / 5)
    assert "patched 3 of 5" in str(report) and "(staged: out_features=60" in str(report)
    json.dumps(report.as_dict())
    # CPU input runs through F.linear: the same numbers as before the patch.
    assert torch.equal(model[:5](x), ref)
    assert patch(model, built_cache.path).skipped[0] == {
        "name": "0", "reason": "patched", "detail": "already a cutlass_aot.nn.Linear"}


def test_patched_state_dict_is_interchangeable(built_cache):
    model = _model()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model[0].weight
    patch(model, built_cache.path)
    assert model[0].weight is weight  # shared, not copied
    assert model.state_dict().keys() == state.keys()
    plain = _model()
    plain.load_state_dict(model.state_dict())
    fresh = nn.Sequential(Linear(64, 128, bias=False, cache=built_cache.path, dtype=torch.bfloat16))
    fresh[0].load_state_dict(nn.Linear(64, 128, bias=False, dtype=torch.bfloat16).state_dict())
    model.load_state_dict(state)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_patch_skips_subclasses_and_parametrized_linears(built_cache):
    class Lora(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    model = nn.Sequential(Lora(64, 64, bias=False), nn.Linear(64, 64, bias=False)).to(torch.bfloat16)
    nn.utils.parametrizations.weight_norm(model[1])
    report = patch(model, built_cache.path)
    assert report.swapped == []
    assert [(s["name"], s["reason"]) for s in report.skipped] == [("0", "subclass"), ("1", "subclass")]
    assert "parametrization" in report.skipped[1]["detail"]


def test_patch_of_a_bare_linear_and_hooks(built_cache):
    lin = nn.Linear(64, 64, bias=False, dtype=torch.bfloat16)
    calls = []
    lin.register_forward_hook(lambda mod, args, out: calls.append(type(mod).__name__))
    report = patch(lin, cutlass_aot.open_cache(built_cache.path))
    assert type(report.model) is Linear and report.model is not lin
    report.model(torch.randn(2, 64, dtype=torch.bfloat16))
    assert calls == ["Linear"] and isinstance(report.model, nn.Linear)


def _claim_gelu(cache_copy, has_bias: bool = False):
    """Edit a copy's index so that its C-less entry with a row-major B (one no
    nn.Linear calls, so the plain nn.Linear entry stays) claims the fused
    (bias +) GELU nn.Linear signature: patch's decisions need no GPU. Until
    r62 it took the first C-less entry in key order, and r62's kernel edit
    reordered the keys: the plain nn.Linear entry was claimed instead."""
    fused = linear_signature("sm_90a", "bf16", has_bias=has_bias, act="gelu")

    def claim(index):
        rec = next(r for r in index["entries"].values()
                   if r["signature"]["fields"]["c"] is None and r["signature"]["fields"]["b_major"] == "n")
        rec["signature"] = fused.as_dict()
        rec["signature_text"] = fused.text()

    edit_index(cache_copy, claim)
    return cutlass_aot.Cache(cache_copy), fused


def test_patch_fuses_an_activation_the_cache_serves(cache_copy):
    """An index whose entry claims the bias+gelu epilogue signature: the GELU is folded.

    Only the decision is tested here (no GPU); the forward is a GPU test.
    """
    cache, fused = _claim_gelu(cache_copy, has_bias=True)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(approximate="tanh"), nn.Linear(128, 64), nn.ReLU(),
                          nn.Linear(64, 64), nn.GELU()).to(torch.bfloat16)
    report = patch(model, cache)
    assert report.fused == ["1"]
    assert [s["name"] for s in report.swapped] == ["0"] and report.swapped[0]["act"] == "gelu"
    assert isinstance(model[1], nn.Identity) and isinstance(model[3], nn.ReLU)
    assert {s["name"] for s in report.skipped} == {"2", "4"}
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    # CPU forward (F.linear + the act) equals the unfused module pair.
    assert torch.equal(model[0](x), F.gelu(F.linear(x, model[0].weight, model[0].bias), approximate="tanh"))
    index = serving_index(cache.by_signature)
    assert check_linear(nn.Linear(64, 128, dtype=torch.bfloat16), index, None, {"sm_90a"}, "gelu")[0] == fused.text()


def test_patch_never_fuses_inside_a_sequential_with_its_own_forward(cache_copy):
    """A Sequential subclass whose forward adds a residual uses the Linear's
    output twice: folding the GELU in would compute gelu(h) + gelu(h)."""

    class ResidualMLP(nn.Sequential):
        def forward(self, x):
            h = self[0](x)
            return self[1](h) + h

    cache, _ = _claim_gelu(cache_copy, has_bias=True)
    torch.manual_seed(0)
    model = ResidualMLP(nn.Linear(64, 64), nn.GELU(approximate="tanh")).to(torch.bfloat16)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    ref = model(x)
    report = patch(model, cache)
    assert report.fused == [] and isinstance(model[1], nn.GELU)
    assert torch.equal(model(x), ref)


def test_patch_never_fuses_across_a_module_that_repeats_in_its_sequential(cache_copy):
    """named_children() lists a repeated child once: in [drop, lin, drop, gelu]
    the Linear looked adjacent to the GELU, which was folded in, computing
    drop(gelu(lin(x))) for gelu(drop(lin(x))). The Sequential's own child
    list decides adjacency now."""
    cache, _ = _claim_gelu(cache_copy)
    sig = nn.Sigmoid()  # one module object used twice (a shared Dropout does the same)
    model = nn.Sequential(sig, nn.Linear(64, 64, bias=False), sig, nn.GELU(approximate="tanh")).to(torch.bfloat16)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    ref = model(x)
    report = patch(model, cache)
    assert report.fused == [] and isinstance(model[3], nn.GELU)
    assert [s["act"] for s in report.swapped] == ["none"]
    # Without the repeat, the same Linear and GELU are fused (the claim serves them).
    assert patch(nn.Sequential(nn.Linear(64, 64, bias=False), nn.GELU(approximate="tanh")).to(torch.bfloat16),
                 cache).fused == ["1"]
    assert torch.equal(model(x), ref)


@pytest.mark.parametrize("hook", ["linear_backward", "act_backward", "act_backward_pre", "global_forward"])
def test_patch_never_fuses_where_a_hook_would_see_the_difference(cache_copy, hook):
    """Folding an activation into its Linear drops the activation's call and
    moves the Linear's output past it: a backward hook on either, or a global
    module hook, would see that. Such pairs are swapped unfused."""
    cache, _ = _claim_gelu(cache_copy)
    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.GELU(approximate="tanh")).to(torch.bfloat16)
    handle = {
        "linear_backward": lambda: model[0].register_full_backward_hook(lambda m, gi, go: None),
        "act_backward": lambda: model[1].register_full_backward_hook(lambda m, gi, go: None),
        "act_backward_pre": lambda: model[1].register_full_backward_pre_hook(lambda m, go: None),
        "global_forward": lambda: nn.modules.module.register_module_forward_hook(lambda m, i, o: None),
    }[hook]()
    try:
        report = patch(model, cache)
    finally:
        handle.remove()
    assert report.fused == [] and isinstance(model[1], nn.GELU), hook
    # The same pair without the hook is fused (the claim serves it).
    plain = nn.Sequential(nn.Linear(64, 64, bias=False), nn.GELU(approximate="tanh")).to(torch.bfloat16)
    assert patch(plain, cache).fused == ["1"]


def test_patch_keeps_hook_handles_working_and_skips_misshapen_weights(built_cache):
    """A hook registered before the patch is removed by its handle after it;
    a Linear whose weight or bias is not (out, in) / (out,) is skipped with
    reason "shape", not swapped into a module that then fails."""
    model = nn.Sequential(nn.Linear(64, 64, bias=False, dtype=torch.bfloat16))
    seen = []
    h1 = model[0].register_forward_hook(lambda m, a, o: seen.append("fwd"))
    h2 = model[0].register_forward_pre_hook(lambda m, a: seen.append("pre"))
    patch(model, built_cache.path)
    assert type(model[0]) is Linear
    model(torch.randn(2, 64, dtype=torch.bfloat16))
    assert seen == ["pre", "fwd"]
    h1.remove()
    h2.remove()
    model(torch.randn(2, 64, dtype=torch.bfloat16))
    assert seen == ["pre", "fwd"], "a removed hook still fires on the patched module"
    flat = nn.Linear(64, 64, bias=False, dtype=torch.bfloat16)
    flat.weight = nn.Parameter(torch.empty(64, dtype=torch.bfloat16))
    pruned = nn.Linear(64, 64, bias=False, dtype=torch.bfloat16)
    pruned.weight = nn.Parameter(torch.empty(32, 64, dtype=torch.bfloat16))
    report = patch(nn.Sequential(flat, pruned), built_cache.path)
    assert report.swapped == [] and [s["reason"] for s in report.skipped] == ["shape", "shape"]


def test_a_cache_object_given_to_the_model_is_the_one_it_uses(built_cache, tmp_path, monkeypatch):
    """Linear(cache=Cache) routes the op through that Cache (its stats and
    settings); a relative path is made absolute when it is given, so a later
    chdir moves nothing."""
    cache = cutlass_aot.Cache(built_cache.path, on_miss="torch")
    lin = Linear(64, 64, cache=cache, dtype=torch.bfloat16)
    assert ops._runner(lin.cache_path, lin.on_miss).runner.cache is cache
    monkeypatch.chdir(built_cache.path.parent)
    rel = Linear(64, 64, cache=built_cache.path.name, dtype=torch.bfloat16)
    assert Path(rel.cache_path).is_absolute() and Path(rel.cache_path) == built_cache.path
    opened = cutlass_aot.open_cache(built_cache.path.name)
    assert opened.path.is_absolute()
    monkeypatch.chdir(tmp_path)
    assert opened.function(built_cache.keys[0]) is not None  # still loads from the right place
    with pytest.raises(ArgumentError, match="act must be one of"):
        Linear(64, 64, act="tanh")
    with pytest.raises(ArgumentError, match="cache must be"):
        Linear(64, 64, cache=5)
    with pytest.raises(ArgumentError, match="torch.nn.Module"):
        patch("not a model", built_cache.path)


def test_launchers_without_compiled_checks_refuse_operands_the_memo_key_leaves_out():
    """The torch fallback and the K = 0 launch run no artifact, so they check
    what the dispatch key leaves out (A's shape, C's and the bias's shape,
    dtypes, devices) on every call: a ValueError sends the call to a full
    resolution, which refuses a bad one. torch would broadcast it instead."""
    from cutlass_aot.run import dispatch  # noqa: PLC0415 - the launchers under test

    bf = torch.bfloat16
    a, b = torch.randn(4, 16, dtype=bf), torch.randn(16, 8, dtype=bf)
    c, out = torch.zeros(4, 8), torch.empty(4, 8)
    fallback = dispatch._torch_launcher(Stats().slot(GAP, 4, 8, 16, 1), "none", a, b, c, None)
    fallback(a, b, out, c, None, 1.0, 1.0)
    ref = a.double() @ b.double()
    assert ((out.double() - ref).abs().max() / ref.abs().max()) < 1e-2
    for bad in [(torch.randn(1, 16, dtype=bf), b, torch.zeros(4, 8)),   # 1 row of A for 4 of out
                (a, b, torch.arange(8.0)),                                 # C of shape [N]
                (a, b.half(), c)]:                                         # B of another dtype
        with pytest.raises(ValueError, match="operands differ"):
            fallback(bad[0], bad[1], out, bad[2], None, 1.0, 1.0)
    a0, b0 = torch.empty(4, 0, dtype=bf), torch.empty(0, 8, dtype=bf)
    k_zero = dispatch._k_zero_launcher(gemm_signature("sm_90a", a="bf16"), a0, b0, c.to(bf), None)
    k_zero(a0, b0, out, c.to(bf), None, 1.0, 2.0)
    assert torch.equal(out, torch.zeros(4, 8))
    for bad in [(torch.empty(7, 0, dtype=bf), c.to(bf)), (a0, torch.ones(8, dtype=bf)),
                (torch.empty(4, 0), c.to(bf))]:
        with pytest.raises(ValueError, match="operands differ"):
            k_zero(bad[0], b0, out, bad[1], None, 1.0, 2.0)


def test_linear_takes_zero_in_features_at_any_rank(built_cache):
    """reshape(-1, 0) cannot infer -1 for a zero-element input: rank-3 x with
    in_features 0 raised, where nn.Linear gives the bias (or zeros)."""
    for shape in [(2, 3, 0), (4, 0), (0,), (2, 0, 16)]:
        k = shape[-1]
        lin = Linear(k, 8, device="meta", dtype=torch.bfloat16, cache=str(built_cache.path))
        x = torch.empty(shape, device="meta", dtype=torch.bfloat16)
        with torch.no_grad():
            assert lin(x).shape == F.linear(x, lin.weight, lin.bias).shape, shape


def test_fallback_keeps_an_f16_product_in_fp32_until_the_epilogue():
    """a @ b = 102400 overflows f16, but alpha, C or an fp32 out bring it back
    into range: the kernels keep it in fp32, and so does the torch fallback.
    beta = 0 never reads C (a NaN C included)."""
    a = torch.full((4, 64), 40.0, dtype=torch.float16)
    b = torch.full((64, 8), 40.0, dtype=torch.float16)
    assert torch_gemm(a, b, torch.empty(4, 8))[0, 0].item() == 102400
    assert torch_gemm(a, b, torch.empty(4, 8, dtype=torch.float16), alpha=0.01)[0, 0].item() == 1024
    assert torch_gemm(a, b, torch.empty(4, 8), c=torch.full((4, 8), -102000.0))[0, 0].item() == 400
    nan_c = torch.full((4, 8), float("nan"))
    assert torch_gemm(a, b, torch.empty(4, 8), c=nan_c, beta=0.0)[0, 0].item() == 102400


def test_patch_device_rules(built_cache):
    meta = nn.Linear(64, 64, bias=False, device="meta", dtype=torch.bfloat16)
    index = serving_index(cutlass_aot.open_cache(built_cache.path).by_signature)
    sig, reason, detail = check_linear(meta, index, None, {"sm_90a", "sm_80"})
    assert sig is None and reason == "device" and "arch=" in detail
    assert check_linear(meta, index, "sm_90a", {"sm_90a", "sm_80"})[0] is not None
    assert check_linear(meta, index, "sm_80", {"sm_90a", "sm_80"})[1] == "no-entry"
    # sm_90 entries run on an sm_90a device: that cache has one device arch.
    assert check_linear(meta, index, None, {"sm_90a", "sm_90"})[0] is not None


def test_patch_serves_odd_widths_staged_or_from_low_alignment_variants():
    """Widths that are not 16-byte multiples: served by the 16-byte variants
    through aligned copies (the detail says which operands), else by an
    align-8 variant of the plain sm_90 arch, else skipped for alignment."""
    from cutlass_aot.signature import gemm_signature as core_signature  # noqa: PLC0415

    plain = dict(a="bf16", b="bf16", d="bf16", c=None, a_major="k", b_major="k", d_major="n", rank=2)
    aligned, low8 = core_signature("sm_90a", **plain), core_signature("sm_90", align=8, **plain)
    archs = {"sm_90a", "sm_90"}  # the cache's device arch is sm_90a: it runs both

    def check(index, i, o, bias=False):
        return check_linear(nn.Linear(i, o, bias=bias, dtype=torch.bfloat16), index, None, archs)

    both = serving_index({aligned: ["e1"], low8: ["e2"]})
    assert check(both, 64, 64) == (aligned.text(), "", "")
    sig, reason, detail = check(both, 64, 60)
    assert (sig, reason) == (aligned.text(), "") and detail.startswith("staged") \
        and "out_features=60" in detail and "copies out through" in detail
    assert "copies x and weight through" in check(both, 62, 64)[2]
    low_only = serving_index({low8: ["e2"]})
    assert check(low_only, 64, 60) == check(low_only, 60, 64) == (low8.text(), "", "")
    sig, reason, detail = check(low_only, 62, 64)  # 4-byte rows: no variant that narrow
    assert sig is None and reason == "alignment" and "in_features=62" in detail and "align 4" in detail
    assert check(low_only, 64, 60, bias=True)[1] == "alignment"  # no variant with a bias at all


def test_patched_model_compiles_fullgraph_on_meta(built_cache):
    model = nn.Sequential(nn.Linear(64, 128, bias=False), nn.SiLU(), nn.Linear(128, 64, bias=False))
    model = model.to(device="meta", dtype=torch.bfloat16)
    report = patch(model, built_cache.path)
    assert len(report.swapped) == 2
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.empty(2, 5, 64, device="meta", dtype=torch.bfloat16)
    with torch.no_grad():  # inference: the cache serves it (training runs F.linear)
        y = torch.compile(model, fullgraph=True, backend=backend)(x)
        assert torch._dynamo.explain(model)(x).graph_break_count == 0
    assert y.shape == (2, 5, 64)
    code = graphs[0].code
    # compiled, a Linear calls the out= op into a buffer the compiler owns
    assert code.count("torch.ops.cutlass_aot.gemm_out") == 2 and str(built_cache.path) in code
    assert code.count("torch.ops.cutlass_aot.gemm(") == 0


def test_op_refuses_to_be_differentiated_and_linear_trains_through_torch(built_cache):
    a = torch.randn(8, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.randn(64, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ArgumentError, match="no backward") as exc:
        ops._gemm_impl(a, w.t())  # the real kernel's guard (the fake one runs on meta)
    assert exc.value.reason == "autograd"
    with torch.no_grad(), pytest.raises(ArgumentError, match="CUDA"):
        # past the guard, the dispatcher refuses non-CUDA tensors as it always does
        ops._gemm_impl(a, w.t(), cache=str(built_cache.path))
    lin = Linear(64, 32, cache=built_cache.path, dtype=torch.bfloat16)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    lin(x).float().sum().backward()   # grad mode + parameters requiring grad: F.linear
    assert lin.weight.grad is not None and lin.bias.grad is not None


def test_tune_from_log_reads_the_shape_log(tmp_path):
    """`cutlass-aot tune --from-log` (tune/shapes.py) reads what the run side writes."""
    from cutlass_aot.tune.shapes import read_shape_log as tune_read  # noqa: PLC0415 - tune side

    log = tmp_path / "log.jsonl"
    sig = gemm_signature("sm_90a", a="bf16", bias="bf16", act="gelu")
    _write_log(log, [(sig, 128, 4096, 4096, 1, "hit"), (GAP, 64, 128, 64, 4, "miss")])
    with open(log, "ab") as f:
        f.write(b"torn line{\n")
    logged, skipped = tune_read([log])
    # the torn line; GAP, a call with C, is tuned on its own signature since r64
    assert skipped == 1
    assert sorted((text, p.dims, p.c) for text, p in logged) == sorted(
        [(sig.text(), (128, 4096, 4096, 1), None), (GAP.text(), (64, 128, 64, 4), "f32")])
