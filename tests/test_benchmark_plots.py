"""The benchmarks' machine-readable records (benchmarks/_common.py: `record`, `write_records`, `perf_records`,
the scripts' ``--json``), the charts benchmarks/plots.py draws from them or from RESULTS.md's tables, and
benchmarks/gpu_kernelize.py run on the CPU with a tiny model. No GPU."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _load(name: str) -> ModuleType:
    """A benchmarks/ script loaded by its path (it puts benchmarks/ on sys.path for `_common` itself)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


plots = _load("plots")
common = sys.modules["_common"]


def _operator(provider: str, shape: str, roofline: float | None, **kw: Any) -> dict[str, Any]:
    rate = None if roofline is None else 4000 * roofline
    return common.record("operator", "benchmarks/ops.py", shape.split()[0], provider, shape, rate=rate, metric="GB/s",
                         ms=None if rate is None else 1.0 / rate, roofline=roofline, **kw)


def _synthetic() -> list[dict[str, Any]]:
    return [
        _operator("torch", "rms_norm [32768, 4096]", 0.27),
        _operator("triton", "rms_norm [32768, 4096]", 0.94),
        _operator("cupy", "causal_conv1d B8 D4096 L4096 W4", None, note="gated: not served"),
        _operator("triton", "causal_conv1d B8 D4096 L4096 W4", 0.84),
        common.record("model", "benchmarks/gpu_kernelize.py", "Qwen3-0.6B shape", "transformers", "decode batch 1",
                      role="peer", ms=70.0, rate=14.3, metric="tok/s"),
        common.record("model", "benchmarks/gpu_kernelize.py", "Qwen3-0.6B shape", "transformers + kernelize",
                      "decode batch 1", ms=20.0, rate=50.0, metric="tok/s"),
        common.record("model", "benchmarks/gpu_infinilm.py", "Qwen3-0.6B shape", "infinilm", "batch-1 decode",
                      ms=3.2, rate=308.0, metric="tok/s", timing="graph replay"),
        common.record("operator", "benchmarks/gpu_host_cost.py", "add", "triton", "add [16384, 8192]", ms=0.05,
                      timing="host"),
        common.record("operator", "benchmarks/gpu_host_cost.py", "add", "torch.add", "add [16384, 8192]",
                      role="peer", ms=0.009, timing="host"),
    ]


def _png(path: Path) -> tuple[int, int]:
    """The size of a valid PNG at `path` (PIL reads and verifies it)."""
    with Image.open(path) as image:
        assert image.format == "PNG", path
        size = image.size
        image.verify()
    with Image.open(path) as image:  # verify() leaves the image unusable: read it again for its pixels
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 10, f"{path}: a blank image"
    return size


def test_plots_write_each_chart_as_a_png_of_its_pixel_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "records.json"
    common.write_records(records, _synthetic(), "cpu")
    out = tmp_path / "plots"
    assert plots.main([str(records), "--out", str(out)]) == 0
    sizes = {p.name: _png(p) for p in out.iterdir()}
    assert sizes == {"roofline_ops.png": plots.ROOFLINE_PX, "model_throughput.png": plots.MODEL_PX,
                     "host_cost.png": plots.HOST_PX}
    printed = capsys.readouterr().out.splitlines()
    assert sorted(printed[1:]) == sorted(f"wrote {out / name}" for name in sizes)  # after write_records' line
    # nothing that fits a chart: no file, exit 1, saying why
    empty = tmp_path / "empty.json"
    common.write_records(empty, [common.record("operator", "x", "add", "triton", "add", note="crashed")], "cpu")
    assert plots.main([str(empty), "--out", str(tmp_path / "none")]) == 1
    assert "no chart written" in capsys.readouterr().err
    assert not list((tmp_path / "none").iterdir())


def test_records_are_checked_when_built_and_when_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"timing = 'replay'; it must be one of eager, graph replay, host"):
        common.record("operator", "x", "add", "triton", "add", timing="replay")
    assert common.record("operator", "x", "add", "triton", "add", ms=math.nan, rate=math.inf)["ms"] is None
    good = tmp_path / "good.json"
    common.write_records(good, [common.record("operator", "x", "add", "triton", "add", ms=1.0)], "cpu")
    (rec,) = json.loads(good.read_text())
    assert rec["device"] == "cpu" and rec["versions"]["torch"] == torch.__version__ and len(rec["date"]) == 10
    del rec["shape"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([rec]))
    with pytest.raises(ValueError, match=r"bad.json: record 0: keys missing: shape; unknown keys: none"):
        plots.load_records(bad)
    bad.write_text(json.dumps([{**rec, "shape": "add", "ms": "1.0"}]))
    with pytest.raises(ValueError, match=r"record 0: ms = '1.0' \(str\); it must be float or null"):
        plots.load_records(bad)
    bad.write_text(json.dumps({"records": []}))
    assert plots.main([str(bad), "--out", str(tmp_path / "p")]) == 2
    assert "expected a JSON list of records, got a dict" in capsys.readouterr().err


def test_perf_rows_give_a_record_per_timed_call_at_the_rows_ceiling() -> None:
    # Triton 100 GB/s at 50% of the row's ceiling (200 GB/s): the torch provider's 50 GB/s is 25%, the measured
    # SDPA baseline's 80 GB/s 40%; a row without times (a crash) and a quoted baseline give no record
    row = common.perf_row("attention", "decode B64", "GB/s", 100.0, 50.0, "SDPA", 80.0, 0.5, "t", True, "",
                          op="flash_attn_with_kvcache", ms={"triton": 1.0, "torch": 2.0, "SDPA": 1.25})
    quoted = common.perf_row("ssm", "scan 8x2048", "Mtok/s", 45.0, 4.5, "mamba_ssm", 26.0, 0.3, "t", True, "",
                             op="selective_scan", ms={"triton": 0.36, "torch": 3.6})
    crashed = {"kind": "perf", "family": "ssm", "case": "scan", "status": "MISS", "note": "crashed: ..."}
    got = common.perf_records([row, quoted, crashed], "benchmarks/gpu_x.py")
    assert [(r["operator"], r["provider"], r["role"], r["ms"], r["rate"]) for r in got] == [
        ("flash_attn_with_kvcache", "triton", "ours", 1.0, 100.0),
        ("flash_attn_with_kvcache", "torch", "ours", 2.0, 50.0),
        ("flash_attn_with_kvcache", "SDPA", "peer", 1.25, 80.0),
        ("selective_scan", "triton", "ours", 0.36, 45.0),
        ("selective_scan", "torch", "ours", 3.6, 4.5),
    ]
    assert [r["roofline"] for r in got] == pytest.approx([0.5, 0.25, 0.4, 0.3, 0.03])
    assert {r["timing"] for r in got} == {"eager"} and {r["source"] for r in got} == {"benchmarks/gpu_x.py"}


def test_bench_main_json_writes_the_family_tables_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")

    def run(results: list[dict[str, Any]]) -> None:
        results.append(common.perf_row("dense", "add [16384x8192] bf16", "GB/s", 4200.0, 4270.0, "torch", 4270.0,
                                       0.98, "t", False, "", op="add", ms={"triton": 0.19, "torch": 0.187}))

    path = tmp_path / "dense.json"
    assert common.bench_main("gpu_dense", run, lambda rows: "table", argv=["--json", str(path)]) == 1  # a MISS
    recs = plots.load_records(path)
    assert [(r["provider"], r["source"], r["device"]) for r in recs] == [
        ("triton", "benchmarks/gpu_dense.py", "NVIDIA H200"), ("torch", "benchmarks/gpu_dense.py", "NVIDIA H200")]
    with pytest.raises(SystemExit) as stop:
        common.bench_main("gpu_dense", run, lambda rows: "table", argv=["--jsn", "x"])
    assert stop.value.code == 2 and "--jsn" in capsys.readouterr().err


def test_ops_and_host_cost_records_hold_each_providers_time_and_rate() -> None:
    ops = _load("ops")
    bench = ops.Bench("rms_norm [32768, 4096]", "rms_norm", lambda: None, 2 * 32768 * 4096 * 2, "GB/s")
    recs = ops.side_by_side_records([(bench, {"torch": 1136.0, "triton": 3994.0, "cupy": "gated: not served"})],
                                    4268.0, 687.0)
    assert [(r["provider"], r["note"]) for r in recs] == [("torch", ""), ("triton", ""), ("cupy", "gated: not served")]
    assert recs[1]["ms"] == pytest.approx(bench.amount / 3994.0 / 1e6) and recs[2]["ms"] is None
    assert recs[1]["roofline"] == pytest.approx(3994 / 4268) and recs[2]["roofline"] is None

    hc = _load("gpu_host_cost")
    rows = hc.run("cpu", small=True, only=["add"], calls=2, rounds=1)
    recs = hc.records(rows)
    assert len(recs) == 6 * len(rows)  # host, eager (back to back), graph replay; ours and the peer's
    for r, (role, timing) in zip(recs, [(s, t) for s in ("ours", "peer") for t in ("host", "eager", "graph replay")]):
        assert (r["role"], r["timing"], r["operator"]) == (role, timing, "add")
    timing = rows[0].ours
    assert [r["ms"] for r in recs[:3]] == [pytest.approx(timing.host / 1e3), pytest.approx(timing.b2b / 1e3), None]
    assert recs[3]["provider"] == rows[0].case.peer_name and recs[0]["provider"] == rows[0].provider == "torch"


RESULTS_EXCERPT = """\
# Benchmark results

## Operators, providers side by side (`python3 benchmarks/ops.py`)

Date: 2026-11-30. Device: NVIDIA H200. torch 2.11.0+cu130, triton 3.6.0, cupy 14.2.0, Python 3.12.3.

Measured ceilings: copy 4000 GB/s, bf16 matmul 700 TFLOP/s.

| operator (bf16) | metric | torch | triton | cupy | roofline of best | triton vs best other |
|---|---|---|---|---|---|---|
| gemm 8192^3 linear + bias | TFLOP/s | 700 | 560 | 597 | 100% | 0.80x |
| causal_conv1d B8 D4096 L4096 W4 | GB/s | 200 | 3600 | gated: not served | 90% | 18.00x |

| case (bf16) | status | measured | target |
|---|---|---|---|
| rms_norm [32768x4096] | PASS | 3981 GB/s = 93% of copy | >= 85% copy |

### infinilm, Qwen3-0.6B shape (random weights, bf16), NVIDIA H200, torch 2.11.0+cu130

input 128 tokens; cuda graphs: on (decode batch sizes 1..32, 6 graphs)

| metric | infinilm | transformers generate | ratio |
|---|---|---|---|
| batch-1 decode (tok/s) | 308 | 14 | 21.3x |
| decode step p50, batch 1 / 32 (ms) | 3.23 / 3.66 | | |
| prefill, batch 32 (tok/s) | 2234 | | |

### infinilm, mamba2-130m shape (random weights, initializer_range 0.02, bf16), NVIDIA H200, torch 2.11.0+cu130

| metric | infinilm | transformers | ratio |
|---|---|---|---|
| prefill 2048 tokens, batch 1 (tok/s), CUDA graph | 416698 | 4492 | 92.8x |
| batch-1 decode (tok/s) | 834 | 56 | 14.8x |

## Host cost (`python3 benchmarks/gpu_host_cost.py`)

Date: 2026-12-01. Device: NVIDIA H200. torch 2.11.0+cu130, triton 3.6.0, Python 3.12.3.

| case | peer | host us ours | host us peer | b2b us ours | b2b us peer | graph us ours | graph us peer | served by |
|---|---|---|---|---|---|---|---|---|
| add [16384, 8192] | torch.add | 50.5 | 9.1 | 188 | 185 | 187 | - | triton |
"""


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return r["source"].removeprefix("benchmarks/"), r["provider"], r["shape"], r["timing"]


def test_results_tables_become_records_at_their_sections_ceilings_and_dates(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(RESULTS_EXCERPT)
    recs = {_key(r): r for r in plots.results_records(path)}
    assert len(recs) == 6 + 3 + 4 + 6  # the target table (no script header) is skipped
    gemm = recs["ops.py", "triton", "gemm 8192^3 linear + bias", "eager"]
    assert gemm["roofline"] == pytest.approx(560 / 700) and gemm["rate"] == 560 and gemm["ms"] is None
    conv = recs["ops.py", "triton", "causal_conv1d B8 D4096 L4096 W4", "eager"]
    assert conv["roofline"] == pytest.approx(3600 / 4000) and conv["operator"] == "causal_conv1d"
    gated = recs["ops.py", "cupy", "causal_conv1d B8 D4096 L4096 W4", "eager"]
    assert gated["rate"] is None and gated["note"] == "gated: not served"
    assert (gemm["date"], gemm["device"], gemm["versions"]["cupy"]) == ("2026-11-30", "NVIDIA H200", "14.2.0")
    # models: the section's "cuda graphs: on" makes infinilm's decode a graph replay, gpu_infinilm.py's prefill
    # is eager (no prefill graphs), a row label's suffix says it for mamba's prefill; a section that says
    # nothing leaves its decode unknown; transformers runs eagerly
    qwen = recs["gpu_infinilm.py", "infinilm", "batch-1 decode", "graph replay"]
    assert (qwen["operator"], qwen["rate"], qwen["kind"]) == ("Qwen3-0.6B shape", 308.0, "model")
    assert recs["gpu_infinilm.py", "transformers", "batch-1 decode", "eager"]["rate"] == 14.0
    assert recs["gpu_infinilm.py", "infinilm", "prefill, batch 32", "eager"]["rate"] == 2234.0
    assert recs["gpu_mamba2.py", "infinilm", "prefill 2048 tokens, batch 1", "graph replay"]["rate"] == 416698.0
    assert recs["gpu_mamba2.py", "infinilm", "batch-1 decode", "unknown"]["rate"] == 834.0
    host = recs["gpu_host_cost.py", "triton", "add [16384, 8192]", "host"]
    assert (host["ms"], host["role"], host["date"]) == (pytest.approx(0.0505), "ours", "2026-12-01")
    assert recs["gpu_host_cost.py", "torch.add", "add [16384, 8192]", "graph replay"]["ms"] is None
    assert plots.main(["--results", str(path), "--out", str(tmp_path / "plots")]) == 0
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"roofline_ops.png", "model_throughput.png",
                                                                "host_cost.png"}


def test_a_results_table_that_cannot_be_read_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(RESULTS_EXCERPT.replace("| 3600 |", "| 3.6k |"))
    with pytest.raises(ValueError, match=r"RESULTS.md line 12: cell '3.6k' is not a number"):
        plots.results_records(path)
    path.write_text(RESULTS_EXCERPT.replace("Measured ceilings", "Ceilings"))
    assert plots.main(["--results", str(path), "--out", str(tmp_path / "p")]) == 2
    assert "has no 'Measured ceilings: copy X GB/s" in capsys.readouterr().err


def test_the_repositorys_results_md_fills_every_chart(tmp_path: Path) -> None:
    # the committed benchmarks/plots/ PNGs are drawn from it: `python benchmarks/plots.py --results ...`
    recs = plots.results_records(BENCH / "RESULTS.md")
    written = plots.write_charts(recs, tmp_path)
    assert {p.name for p in written} >= {"roofline_ops.png", "model_throughput.png", "host_cost.png"}


def test_kernelize_benchmark_runs_on_the_cpu_and_writes_its_records(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    gk = _load("gpu_kernelize")
    assert gk.agreeing_prefix(torch.tensor([[1, 2, 3], [1, 2, 3]]), torch.tensor([[1, 2, 4], [0, 2, 3]])) == [2, 0]
    path = tmp_path / "kernelize.json"
    argv = ["--tiny", "--device", "cpu", "--batches", "1", "2", "--prompt-len", "8", "--new-tokens", "4",
            "--prefill-len", "16", "--repeats", "1", "--match-tokens", "2", "--static-batches", "1",
            "--json", str(path)]
    assert gk.main(argv) == 0
    out = capsys.readouterr().out
    # the logits check decides; greedy-token agreement of random bf16 weights is information (near-tied logits)
    assert "| decode, batch 2 (tok/s) |" in out and "PASS logits" in out and "greedy tokens" in out
    assert "attention: 2 module(s)" in out
    # transformers' static-cache compiled decode, both ways, with no graph break in the kernelized one
    assert "| decode, static cache, compiled, batch 1 (tok/s) |" in out
    assert "graph breaks in the compiled decode steps (both ways): 0" in out
    recs = plots.load_records(path)
    assert {(r["provider"], r["role"]) for r in recs} == {("transformers", "peer"),
                                                          ("transformers + kernelize", "ours")}
    assert len(recs) == 2 * (3 * 2 + 1)  # per way: generate and decode per batch (2 eager, 1 static), the prefill
    assert all(r["metric"] == "tok/s" for r in recs)
    # decode = (full-length time - 1-token time): on a loaded CPU that difference of two short timings can be
    # <= 0, which the script records as no rate (NaN -> None), never as a negative one
    decode = [r for r in recs if r["shape"].startswith("decode")]
    assert all(r["rate"] is None or r["rate"] > 0 for r in decode)
    assert all(r["rate"] > 0 and r["ms"] > 0 for r in recs if r not in decode)
    assert plots.model_chart(recs, tmp_path / "m.png") and _png(tmp_path / "m.png") == plots.MODEL_PX


def test_infinilm_benchmark_json_holds_each_engines_throughput(tmp_path: Path) -> None:
    path = tmp_path / "infinilm.json"
    assert _load("gpu_infinilm").main(["--smoke", "--input-len", "8", "--output-len", "4", "--hf-output-len", "6",
                                       "--json", str(path)]) in (0, 1)  # 1: the CPU misses the speed target
    recs = plots.load_records(path)
    assert [(r["provider"], r["shape"]) for r in recs] == [
        ("infinilm", "batch-1 decode"), ("transformers", "batch-1 decode"), ("infinilm", "batch-32 decode"),
        ("transformers", "batch-32 decode"), ("infinilm", "batch-32 prefill")]
    assert all(r["kind"] == "model" and r["timing"] == "eager" for r in recs)  # no CUDA graphs on a CPU
    assert all(r["rate"] > 0 for r in recs if r["provider"] == "infinilm")
    for r, batch in ((recs[1], 1), (recs[3], 32)):  # transformers: None where its timing noise beat the decode
        assert r["rate"] is None or r["ms"] == pytest.approx(1e3 * batch / r["rate"])  # ms per step


def test_hf_decode_rate_is_nan_not_negative_when_the_noise_exceeds_the_decode_time() -> None:
    import time

    class Model(torch.nn.Module):  # its 1-token generate is slower than its full one: noise, on a loaded CPU
        def generate(self, ids: torch.Tensor, max_new_tokens: int, **kwargs: Any) -> torch.Tensor:
            time.sleep({1: 0.03, 8: 0.01}.get(max_new_tokens, 0.0))
            return ids

    assert math.isnan(common.hf_generate_tokens_per_s(Model(), torch.ones(2, 3, dtype=torch.int64), 8))

    class Steady(Model):
        def generate(self, ids: torch.Tensor, max_new_tokens: int, **kwargs: Any) -> torch.Tensor:
            time.sleep(0.005 * max_new_tokens)
            return ids

    rate = common.hf_generate_tokens_per_s(Steady(), torch.ones(2, 3, dtype=torch.int64), 8)
    assert rate == pytest.approx(2 * 7 / (0.005 * 7), rel=0.5)  # 2 rows x 7 tokens over 7 x 5 ms
