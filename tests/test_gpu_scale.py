"""GPU-scale conformance on the CPU: large draws stay valid, the grid is favored, the parallel runner works.

The GPU run itself (`make test-gpu`) draws `CaseContext.large` cases against a reference on the GPU; here
`large` is forced on the CPU, and the drawn cases go through the public functions' contract checks into a
provider that runs nothing (a float64 reference of 8192-token attention would take minutes on 2 cores).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fakes import cpu_capability, fresh_env, registered
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import infiniops_py as io
from infiniops_py import runtime
from infiniops_py.operators import OPERATORS
from infiniops_py.testing.case import CaseContext
from infiniops_py.testing.conformance import copies, run_conformance
from infiniops_py.testing.strategies import STRATEGIES
from infiniops_py.testing.strategies import flash_attn as attention_strategies

ROOT = Path(__file__).resolve().parents[1]
DTYPE = torch.bfloat16


@pytest.fixture(autouse=True)
def _clean_runtime() -> Iterator[None]:
    yield
    io.reload()


def _triton_impl(op: str) -> Any:
    """The Triton implementation of `op` (its declared limits shape the draws, as on the GPU); the torch
    provider's for an operator Triton does not implement (the all_reduce collective)."""
    for name in ("triton", "torch"):
        provider = runtime.get_resolver().providers.get(name)
        if provider is None or provider.error:
            pytest.fail(f"the {name} provider is not loaded: {provider and provider.error}")
        impls = [i for i in provider.implementations if i.op == op]
        if impls:
            return impls[0]
    pytest.fail(f"neither the triton nor the torch provider implements {op}")


def _noop(*args: Any, **kwargs: Any) -> None:
    """An implementation that runs nothing: the case only has to pass the contract checks."""


def _draw_and_call(op: str, examples: int) -> list[str]:
    """Draw `examples` large cases of `op` and call the public function on each; returns their notes."""
    spec, impl, notes = OPERATORS[op], _triton_impl(op), []

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def body(data: st.DataObject) -> None:
        ctx = CaseContext(torch.device("cpu"), DTYPE, spec, impl, data.draw, large=True)
        case = STRATEGIES[op](ctx)
        notes.append(case.note)
        with io.use("noop"):
            spec.function(*case.args, **case.kwargs)  # a ContractError here is a strategy bug

    with registered(("noop", [(op, cpu_capability(dtypes=("bfloat16",)), 1, _noop)])):
        body()
    return notes


@pytest.mark.parametrize("op", sorted(STRATEGIES))
def test_large_cases_pass_the_contract_checks(op: str) -> None:
    assert len(_draw_and_call(op, 6)) == 6


@pytest.mark.parametrize("op", ["flash_attn_varlen", "flash_attn_with_kvcache"])
def test_long_attention_cases_reach_8192_tokens_and_stay_bounded(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention_strategies, "_long", lambda ctx: True)
    notes = _draw_and_call(op, 3)
    assert any("8192" in n or "8191" in n or "4097" in n or "4096" in n or "2048" in n for n in notes), notes


def test_large_runs_favor_issue_3s_grid() -> None:
    spec, impl = OPERATORS["flash_attn_varlen"], _triton_impl("flash_attn_varlen")
    seen: dict[bool, list[Any]] = {False: [], True: []}

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.data())
    def body(data: st.DataObject) -> None:
        for large in (False, True):
            ctx = CaseContext(torch.device("cpu"), DTYPE, spec, impl, data.draw, large=large)
            seen[large].append(ctx.pick("head_dim", attention_strategies._HEAD_DIMS, (64, 128, 256)))

    body()
    share = {large: sum(values.count(d) for d in (64, 128, 256)) / len(values) for large, values in seen.items()}
    assert {64, 128, 256} <= set(seen[True])
    assert share[True] > share[False] + 0.1, share  # (deterministic: derandomized draws)


def test_large_end_to_end_on_cheap_operators() -> None:
    # the whole path (strategy, float64 reference, comparison) at GPU sizes, on operators cheap on a CPU
    report = run_conformance("torch", ops=["add", "rms_norm"], dtypes=["bfloat16"], max_examples=3, large=True,
                             gates=False, seed=3)
    assert report.ok, report.render()
    assert max(report.ops[1].coverage["hidden_size"]) >= 768


def test_reference_copies_keep_views_on_the_reference_device() -> None:
    qkv = torch.randn(4, 12, dtype=torch.bfloat16)
    q, v = copies((qkv[:, :4], qkv[:, 8:]), torch.float64, torch.device("cpu"))
    assert q.dtype == torch.float64 and q.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    assert run_conformance("torch", ops=["add"], max_examples=2, reference_device="cpu", gates=False).ok


def _gpu_check(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu",
               "--logs", str(tmp_path / "logs"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=fresh_env(INFINIOPS_PROVIDERS="torch"))


def test_parallel_runner_runs_each_operator_and_summarizes(tmp_path: Path) -> None:
    run = _gpu_check(tmp_path, "torch", "--op", "add", "--op", "rms_norm", "--dtype", "float32",
                     "--max-examples", "3", "--jobs", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    summary = run.stdout.strip().splitlines()
    assert any("torch" in line and "add" in line and "float32" in line and " ok" in line for line in summary)
    assert any("rms_norm" in line for line in summary)
    reports = sorted((tmp_path / "logs").glob("*.json"))
    assert len(reports) == 2
    assert all(json.loads(p.read_text())["ok"] for p in reports)
    assert (tmp_path / "logs" / "torch-add-float32.log").read_text().strip()


def test_parallel_runner_kills_stragglers_past_its_budget(tmp_path: Path) -> None:
    run = _gpu_check(tmp_path, "torch", "--op", "selective_scan", "--max-examples", "100000", "--budget", "5")
    assert run.returncode == 1
    assert "budget" in run.stdout
    assert "selective_scan" in run.stdout


def test_parallel_runner_shards_heavy_operators_and_totals_them(tmp_path: Path) -> None:
    run = _gpu_check(tmp_path, "torch", "--op", "flash_attn_with_kvcache", "--dtype", "float32",
                     "--max-examples", "4", "--shards", "2", "--seed", "11", "--jobs", "2", timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert any("float32 [1/2]" in line and " 2 " in line for line in lines), run.stdout
    assert any("float32 [2/2]" in line for line in lines), run.stdout
    total = [line for line in lines if "float32 total" in line]
    assert len(total) == 1 and total[0].split()[4] == "4" and total[0].split()[10] == "ok", run.stdout
    log = (tmp_path / "logs" / "torch-flash_attn_with_kvcache-float32-s2.log").read_text()
    assert "#2 " in log  # the per-example progress lines


def test_a_killed_job_reports_the_examples_it_passed(tmp_path: Path) -> None:
    run = _gpu_check(tmp_path, "torch", "--op", "add", "--dtype", "float32", "--max-examples", "100000",
                     "--budget", "20")
    assert run.returncode == 1
    killed = [line for line in run.stdout.splitlines() if "killed (budget) after" in line and "add" in line]
    assert killed, run.stdout
    assert int(killed[-1].split("after")[1].split()[0]) > 0


def _gpu_check_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _report_row(dtype: str, examples: int) -> dict[str, Any]:
    return {"op": "selective_scan", "dtype": dtype, "examples": examples, "gated": 0, "failed": 0, "worst": 0.1,
            "worst_allowed": 0.2, "seconds": 1.0, "coverage": {}, "failures": []}


def test_a_total_is_incomplete_when_a_shard_running_every_dtype_left_no_report(tmp_path: Path) -> None:
    gc = _gpu_check_module()
    done = gc.Job("torch", "selective_scan", None, 10, tmp_path, shard="1/2", seed=1, status="ok",
                  report={"ok": True, "ops": [_report_row(d, 10) for d in ("float16", "float32")]})
    killed = gc.Job("torch", "selective_scan", None, 10, tmp_path, shard="2/2", seed=2, status="killed (budget)")
    totals = [r for r in gc.rows([done, killed]) if r[2].endswith("total")]
    assert [(r[2], r[3], r[9]) for r in totals] == [("float16 total", "10", "INCOMPLETE"),
                                                    ("float32 total", "10", "INCOMPLETE")]
    both = gc.Job("torch", "selective_scan", None, 10, tmp_path, shard="2/2", seed=2, status="ok",
                  report={"ok": True, "ops": [_report_row(d, 10) for d in ("float16", "float32")]})
    assert [r[9] for r in gc.rows([done, both]) if r[2].endswith("total")] == ["ok", "ok"]


def test_a_killed_job_counts_the_examples_of_every_dtype_it_ran(tmp_path: Path) -> None:
    gc = _gpu_check_module()
    log = tmp_path / "job.log"
    log.write_text("".join(f"add {d} #{i} 0.01s ok | shape\n" for d in ("float16", "float32") for i in (1, 2, 3))
                   + "add float32 #4 0.02s result: 1/8 elements break | shape\nconformance of torch\n")
    assert gc._examples_logged(log) == 7


def _host_cost_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_host_cost", ROOT / "benchmarks" / "gpu_host_cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_host_cost"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# The host-cost cases whose peer computes our output from the same tensors (the others mutate state, or
# attend over a dense cache of other values).
_SAME_RESULT = ("rms_norm", "add", "gemm", "flash_attn_varlen", "causal_conv1d")


def test_host_cost_benchmark_measures_every_entry_point_and_its_peer_on_the_cpu() -> None:
    hc = _host_cost_module()
    rows = hc.run("cpu", small=True, calls=2, rounds=1, keep_calls=True)
    assert {r.case.op for r in rows} == set(OPERATORS) == set(hc.BUILDERS)
    assert [r.case.op for r in rows].count("gemm") == 3  # M 1, 32 and the large M
    for r in rows:
        assert r.ours.errors == [], (r.case.name, r.ours.errors)
        assert r.ours.host > 0 and r.ours.b2b > 0 and math.isnan(r.ours.graph), r.case.name  # no graph on the CPU
        assert r.provider == "torch", r.case.name
        assert math.isfinite(r.checked) == r.case.indexed, r.case.name
        if r.case.op in ("selective_scan", "selective_state_update") and r.case.peer is None:
            assert r.case.peer_error.startswith("peer not importable: "), r.case.peer_error
        else:
            assert r.peer is not None and r.peer.errors == [] and r.peer.host > 0, (r.case.name, r.peer)
    assert {r.case.op for r in rows if r.case.indexed} == {"reshape_and_cache_flash", "flash_attn_varlen",
                                                           "flash_attn_with_kvcache", "causal_conv1d_update",
                                                           "selective_state_update", "rotary_embedding",
                                                           "fused_qk_norm_rope"}
    table = hc.format_table(rows).splitlines()
    assert len(table) == 2 + len(rows) and {line.count("|") for line in table} == {len(hc.COLUMNS) + 1}
    with torch.no_grad():  # the peers compute what we compute, on the very same tensors
        for r in rows:
            if r.case.op in _SAME_RESULT:
                got, want = r.case.ours(), r.case.peer()
                if r.case.op == "flash_attn_varlen":  # SDPA's [B, H, L, D] back to the packed [B * L, H, D]
                    want = want.transpose(1, 2).reshape(got.shape)
                torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_host_cost_benchmark_without_cuda_exits_2_and_rejects_unknown_entry_points(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    hc = _host_cost_module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hc.main(["--only", "gemm,add", "--calls", "3"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        hc.main(["--only", "gemm,bogus"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "unknown entry point(s) bogus" in err and "selective_state_update" in err
    with pytest.raises(KeyError, match="bogus"):
        hc.run("cpu", small=True, only=["bogus"])


def test_host_cost_targets_allow_10_us_over_a_one_op_peer_and_5_percent_over_graph_replay() -> None:
    hc = _host_cost_module()
    assert [hc.host_target(ours, 5.0, True) for ours in (15.0, 15.5)] == ["PASS", "MISS"]
    assert [hc.host_target(ours, 5.0, False) for ours in (5.0, 5.5)] == ["PASS", "MISS"]
    assert hc.host_target(5.0, math.nan, True) == "-"  # no peer
    assert [hc.b2b_target(b2b, 100.0) for b2b in (105.0, 106.0)] == ["PASS", "MISS"]
    assert hc.b2b_target(500.0, 49.0) == "-"  # a launch-bound call: the target does not apply
    case = hc.Case("c", "add", lambda: None, lambda: None, "torch.add", True)
    passing = hc.Row(case, hc.Timing(host=12.0, b2b=104.0, graph=100.0, sync_free="yes"), hc.Timing(host=3.0))
    assert hc.ok([passing])
    slow = hc.Row(case, hc.Timing(host=14.0, b2b=104.0, graph=100.0, sync_free="yes"), hc.Timing(host=3.0))
    syncs = hc.Row(case, hc.Timing(host=12.0, sync_free="syncs"), hc.Timing(host=3.0))
    assert not hc.ok([passing, slow]) and not hc.ok([syncs])
    assert hc.cells(slow)[hc.COLUMNS.index("host target")] == "MISS"
