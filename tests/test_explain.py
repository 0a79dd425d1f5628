"""`cutlass-aot explain` on a real built cache (the session's tiny manifest), no GPU.

It must say what dispatch's pure resolution says (select.choose over the
signature's candidates and the GPU's bound table rows): a table row for the
problem, a row at a smaller M whose tiles cover it, else the model's first
option; refuse bad problems and GPUs with exit 2 and a message naming the
fix; and never import torch.
"""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from cutlass_aot import tables
from cutlass_aot.cli import main as cli
from cutlass_aot.explain import parse_problem
from cutlass_aot.run.load import Cache

from .support import copy_cache

GPU = tables.gpu_identity("NVIDIA H200", 132, "9.0")


def _explain(cache, *args):
    res = CliRunner().invoke(cli, ["explain", "--cache-dir", str(cache), *args])
    return res.exit_code, res.output


def _with_table(built_cache, tmp_path, m=64, n=256, k=512):
    """A copy of the tiny cache that ships an H200 table with one row for the
    nn.Linear (b_major k) variant at MxNxK, published by `build --tuning`."""
    cache = copy_cache(built_cache.path, tmp_path / "cache")
    idx = json.loads((cache / "index.json").read_text())
    rec = next(r for r in idx["entries"].values()
               if "b_major=k" in r["signature_text"] and "c=-" in r["signature_text"])
    v = rec["variant"]
    row = {"signature": rec["signature_text"], "family": rec["family"],
           "kernel_sources": rec["kernel_sources"], "artifact": rec["sha256"],
           "m": m, "n": n, "k": k, "l": 1, "splits": 1, "us": 3.5,
           "runner_up": "64x64/1x1/m1", "margin": 1.04,
           "variant": {f: v.get(f) for f in ("tile", "cluster", "raster", "swizzle", "swap_ab",
                                             "split_k")}}
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"format": tables.TABLE_FORMAT, "version": 1, "gpu": GPU,
                                 "rows": [row]}))
    res = CliRunner().invoke(cli, ["build", str(built_cache.manifest), "--cache-dir", str(cache),
                                   "--tuning", str(table)])
    assert res.exit_code == 0, res.output
    return cache, rec


def test_parse_problem_takes_mxnxk_and_a_batch():
    assert parse_problem("4096x14336x4096") == (4096, 14336, 4096, 1)
    assert parse_problem(" 8X512x512x64 ") == (8, 512, 512, 64)


def test_explain_names_the_table_row_the_row_below_and_the_model(built_cache, tmp_path):
    cache, rec = _with_table(built_cache, tmp_path)
    label = f"{rec['variant']['tile']}/{rec['variant']['cluster']}/m1"
    rc, out = _explain(cache, "--json", "64x256x512", "100x256x512", "64x384x512", "300x256x512")
    assert rc == 0, out
    rep = json.loads(out)
    assert rep["gpu"]["name"] == "NVIDIA H200" and rep["gpu"]["arch"] == "sm_90a"
    assert rep["table_status"]["used"] == 1, rep["table_status"]
    exact, below, other_n, past = rep["problems"]
    # the row itself, with what its tune measured next
    assert (exact["source"], exact["runs"]) == ("table", label), exact
    assert (exact["runner_up"], exact["margin"]) == ("64x64/1x1/m1", 1.04)
    # M = 100 sits in the row's one 128-row tile: the row at M = 64 carries
    assert (below["source"], below["runs"]) == ("table-below", label), below
    # another N, or an M past the row's tiles: the model, whose pick leads its order
    for p in (other_n, past):
        assert p["source"] == "model" and p["runs"] == p["model"][0]["label"], p
        assert p["runner_up"] is None and "b_major=k" in p["signature"]
    rc, text = _explain(cache, "--gpu", "h200", "64x256x512")
    assert rc == 0 and f"runs {label}: the table's row for this problem" in text, text
    assert "measured next: 64x64/1x1/m1, 1.040x" in text


def test_explain_serves_other_layouts_and_the_model_alone(built_cache):
    rc, out = _explain(built_cache.path, "--sms", "132", "--json", "--b-major", "n", "--top", "2",
                       "512x1024x256")
    assert rc == 0, out
    p = json.loads(out)["problems"][0]
    assert "b_major=n" in p["signature"] and p["source"] == "model" and len(p["model"]) <= 2
    assert p["autotune_keeps"] is False  # not the long-K walk (select.autotune_defers)
    rc, out = _explain(built_cache.path, "--sms", "132", "--json", "--with-c", "512x1024x256")
    assert rc == 0 and "c=bf16" in json.loads(out)["problems"][0]["signature"], out
    # an odd N leaves D's and w's rows 2-byte aligned: explained by the
    # 16-byte route, and said to be staged (or low-alignment) by dispatch
    rc, out = _explain(built_cache.path, "--sms", "132", "--json", "512x1023x256", "512x1024x256")
    assert rc == 0 and [p["alignment"] for p in json.loads(out)["problems"]] == [2, 16], out
    rc, out = _explain(built_cache.path, "--sms", "132", "512x1023x256")
    assert "rows 2-byte aligned, not 16: dispatch stages the call" in out, out
    # the tiny cache has no f16 variant: the miss names the signature (exit 1)
    rc, out = _explain(built_cache.path, "--sms", "132", "--dtype", "f16", "512x1024x256")
    assert rc == 1 and "a=f16" in out, out


def test_explain_refuses_bad_problems_and_gpus_with_the_fix(built_cache, tmp_path):
    cache, _ = _with_table(built_cache, tmp_path)
    for args, words in [(("1x2",), "not MxNxK"), (("0x8x8",), "at least 1"),
                        (("8x8x8x0",), "at least 1"),
                        (("--gpu", "A100", "8x8x8"), "NVIDIA H200 (132 SMs); name one of those"),
                        (("--gpu", "h200", "--sms", "132", "8x8x8"), "not both"),
                        (("--arch", "sm_80", "8x8x8"), "--arch goes with --sms"),
                        (("--sms", "132", "--arch", "sm9", "8x8x8"), "not an arch string")]:
        rc, out = _explain(cache, *args)
        assert rc == 2 and words in out, (args, out)
    # no table at all: name a GPU or the model
    rc, out = _explain(built_cache.path, "8x8x8")
    assert rc == 2 and "--sms N explains the model alone" in out, out
    rc, out = _explain(tmp_path / "none", "8x8x8")
    assert rc == 2 and "does not exist" in out, out


def test_explain_imports_neither_torch_nor_the_dsl(built_cache):
    code = ("import sys\nfrom click.testing import CliRunner\nfrom cutlass_aot.cli import main\n"
            f"r = CliRunner().invoke(main, ['explain', '--cache-dir', {str(built_cache.path)!r}, "
            "'--sms', '132', '64x64x64'])\n"
            "assert r.exit_code == 0, r.output\n"
            "print(sorted(m for m in ('torch', 'cutlass', 'tvm_ffi') if m in sys.modules))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout


def test_explain_from_a_shape_log_counts_what_rows_and_the_model_serve(built_cache, tmp_path):
    """--from-log: the problems a service logged as served (outcome hit), per
    signature, split by what answers them now: a table row, a row below, the
    model (listed, most met first, with the `tune --from-log` that measures
    them). Misses are coverage's; malformed lines are skipped and counted;
    a signature of another arch is listed apart, with why."""
    from cutlass_aot.shapelog import format_line  # noqa: PLC0415
    from cutlass_aot.signature import Signature  # noqa: PLC0415

    cache, rec = _with_table(built_cache, tmp_path)
    sig = next(s for s in Cache(cache).by_signature if s.text() == rec["signature_text"])
    foreign = Signature(sig.op, "sm_100a", sig.fields)
    log = tmp_path / "shapes.log"
    lines = [format_line(sig, 64, 256, 512, 1, "hit", pid=1, t=0),      # the table's row
             format_line(sig, 64, 256, 512, 1, "hit", pid=2, t=0),      # the same, another process
             format_line(sig, 100, 256, 512, 1, "hit", pid=1, t=0),     # the row below covers it
             format_line(sig, 300, 256, 512, 1, "hit", pid=1, t=0),     # the model
             format_line(sig, 300, 256, 512, 1, "hit", pid=3, t=0),
             format_line(sig, 512, 640, 128, 1, "hit", pid=1, t=0),     # the model, met once
             format_line(sig, 9, 9, 9, 1, "miss", pid=1, t=0),          # coverage's business
             format_line(foreign, 64, 64, 64, 1, "hit", pid=1, t=0),    # not runnable on sm_90a
             b'{"v": 1, "outcome": "hit", "m": \n', b"\x00garbage\n"]
    log.write_bytes(b"".join(lines))
    rc, out = _explain(cache, "--from-log", str(log), "--json")
    assert rc == 0, out
    rep = json.loads(out)
    assert (rep["records"], rep["skipped_lines"]) == (8, 2), rep
    (entry,) = rep["signatures"]
    assert (entry["table"], entry["table-below"], entry["model"]) == (1, 1, 2), entry
    assert [(p["m"], p["n"], p["k"], p["records"]) for p in entry["model_problems"]] == [
        (300, 256, 512, 2), (512, 640, 128, 1)]
    (apart,) = rep["unexplained"]
    assert apart["signature"] == foreign.text() and "sm_100a" in apart["reason"], apart
    rc, text = _explain(cache, "--from-log", str(log))
    assert rc == 0 and "the model picks for 2 problems: `cutlass-aot tune --from-log" in text, text
    for args, words in [(("--from-log", str(tmp_path / "none.log")), "cannot read shape log"),
                        (("--from-log", str(log), "8x8x8"), "one of the two"), ((), "one of the two")]:
        rc, out = _explain(cache, *args)
        assert rc == 2 and words in out, (args, out)


def test_explain_takes_a_row_above_for_residual_calls_only(built_cache, tmp_path):
    """r66: rule 3 (select.row_above) serves residual (with-C) signatures only,
    the calls call F measured it on; explain resolves as dispatch does. Rows at
    128 and 256 tokens for the plain and the residual 128x128 variant: 200
    tokens are two rows of tiles, as at 256 (one at 128), and 256's time is
    within the bound of 128's."""
    cache = copy_cache(built_cache.path, tmp_path / "cache")
    idx = json.loads((cache / "index.json").read_text())
    rows = []
    for rec in idx["entries"].values():
        text = rec["signature_text"]
        if "b_major=k" not in text:
            continue
        v = rec["variant"]
        for m, us in ((128, 3.0), (256, 3.2)):
            rows.append({"signature": text, "family": rec["family"], "kernel_sources": rec["kernel_sources"],
                         "artifact": rec["sha256"], "m": m, "n": 256, "k": 512, "l": 1, "splits": 1,
                         "us": us, "variant": {f: v.get(f) for f in ("tile", "cluster", "raster", "swizzle",
                                                                      "swap_ab", "split_k")}})
    assert len(rows) == 4
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"format": tables.TABLE_FORMAT, "version": 1, "gpu": GPU, "rows": rows}))
    res = CliRunner().invoke(cli, ["build", str(built_cache.manifest), "--cache-dir", str(cache),
                                   "--tuning", str(table)])
    assert res.exit_code == 0, res.output
    rc, out = _explain(cache, "--json", "200x256x512")
    assert rc == 0, out
    assert json.loads(out)["problems"][0]["source"] == "model", out
    rc, out = _explain(cache, "--json", "--with-c", "200x256x512")
    assert rc == 0, out
    assert json.loads(out)["problems"][0]["source"] == "table-above", out
