"""Triton selective_scan (chunked SSD) and selective_state_update on the CPU under the Triton interpreter.

The conformance suite first, then what its small draws rarely reach: several chunks per row with a
chunk-crossing restart of ``seq_idx`` (including a value that comes back), a packed row whose sequences
span several chunks (empty ones, per-sequence initial states, a seq_idx change on a sequence's first
token), the head-dim tiling, the requested chunk sizes the kernels round, an inf kept inside its own
sequence, unchecked out-of-range slots, the state update's untied layouts, 16-bit states and unclamped
negative steps, the gates, and the GPU benchmark script's code paths at tiny sizes.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from interp_helpers import assert_conformant, check, randn

import infiniops_py
from infiniops_py import GateError
from infiniops_py.operators.selective_scan import selective_scan, selective_state_update
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

OPS = ("selective_scan", "selective_state_update")
EXAMPLES = 4
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@pytest.mark.parametrize("op", OPS)
def test_conformance(op: str) -> None:
    assert_conformant(op, EXAMPLES)


def _scan_inputs(batch: int, length: int, heads: int, head_dim: int, groups: int, d_state: int,
                 dtype: torch.dtype) -> tuple[tuple[torch.Tensor, ...], dict[str, object]]:
    x = randn(batch, length, heads, head_dim, seed=1, dtype=dtype)
    dt = randn(batch, length, heads, seed=2, dtype=dtype, scale=0.5)
    A = -torch.exp(randn(heads, seed=3, scale=0.5))
    B = randn(batch, length, groups, d_state, seed=4, dtype=dtype)
    C = randn(batch, length, groups, d_state, seed=5, dtype=dtype)
    kwargs: dict[str, object] = {
        "D": randn(heads, head_dim, seed=6), "z": randn(batch, length, heads, head_dim, seed=7, dtype=dtype),
        "dt_bias": torch.log(torch.expm1(0.01 + 0.05 * torch.rand(heads, generator=torch.Generator().manual_seed(8)))),
        "dt_softplus": True, "initial_states": randn(batch, heads, head_dim, d_state, seed=9),
        "return_final_states": True,
    }
    return (x, dt, A, B, C), kwargs


def _run_scan(args: tuple[torch.Tensor, ...], kwargs: dict[str, object]) -> tuple[tuple[torch.Tensor, ...], ...]:
    with infiniops_py.use("triton"):
        got = selective_scan(*args, **kwargs)
    ref_kwargs = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                  for k, v in kwargs.items()}
    with infiniops_py.use("reference"):
        ref = selective_scan(*(a.double() for a in args), **ref_kwargs)
    return got, ref


@pytest.mark.parametrize("dtype", DTYPES)
def test_scan_many_chunks_and_restarts(dtype: torch.dtype) -> None:
    # 58 tokens in chunks of 16: four chunks, the last one short; P=20 spans two 16-wide tiles.
    args, kwargs = _scan_inputs(2, 58, 1, 20, 1, 16, dtype)
    seq_idx = torch.zeros(2, 58, dtype=torch.int32)
    seq_idx[0, 16:] = 1  # a restart on a chunk boundary
    seq_idx[0, 37:] = 2  # one inside a chunk
    seq_idx[0, 42:] = 1  # a value that comes back is a new sequence too
    seq_idx[1, 53:] = 5  # a restart in the short last chunk
    kwargs.update(seq_idx=seq_idx, chunk_size=16, dt_limit=(0.0, 0.08))
    (out, final), (ref, ref_final) = _run_scan(args, kwargs)
    check("selective_scan", out, ref)
    check("selective_scan", final, ref_final)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scan_factored_decays_with_restarts_and_strong_decay(dtype: torch.dtype,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The separable decays of the full blocks (FACTORED, a launch switch): chunks of 64 hold three full
    # 16-row blocks; head 1 decays so fast (A = -400) that its cs leave FACTOR_LIMIT and take the direct form.
    from infiniops_triton import _ssd_chunk_scan

    monkeypatch.setattr(_ssd_chunk_scan, "FACTORED", True)
    args, kwargs = _scan_inputs(1, 150, 2, 16, 1, 16, dtype)
    A = args[2].clone()
    A[1] = -400.0
    seq_idx = torch.zeros(1, 150, dtype=torch.int32)
    seq_idx[0, 40:] = 1  # a restart inside the first chunk
    seq_idx[0, 100:] = 2  # and one inside the second
    kwargs.update(seq_idx=seq_idx, chunk_size=64)
    (out, final), (ref, ref_final) = _run_scan((*args[:2], A, *args[3:]), kwargs)
    check("selective_scan", out, ref)
    check("selective_scan", final, ref_final)


def _forms(monkeypatch: pytest.MonkeyPatch, state: int, scan: int, scan_state: int, presplit: bool) -> None:
    """Set the 16-bit product forms of the SSD kernels' defaults (and PRESPLIT) for one test."""
    from infiniops_triton import _ssd_chunk_scan, _ssd_chunk_state
    from infiniops_triton import selective_scan as triton_scan

    for module, name, form in ((_ssd_chunk_state, "PRODUCT", state), (_ssd_chunk_scan, "PRODUCT", scan),
                               (_ssd_chunk_scan, "STATE_PRODUCT", scan_state)):
        monkeypatch.setattr(module, name, dict.fromkeys((torch.float16, torch.bfloat16), form))
    monkeypatch.setattr(triton_scan, "PRESPLIT", presplit)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
@pytest.mark.parametrize(("state", "scan", "scan_state", "presplit"),
                         [("tf32", "tf32", "tf32", False), ("round", "round", "round", False),
                          ("split", "round", "tf32", False), ("round", "tf32", "round", True)])
def test_scan_product_forms(dtype: torch.dtype, state: str, scan: str, scan_state: str, presplit: bool,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    # The fp32-by-16-bit product forms (_ssd_common: split, tf32, round; launch defaults per dtype, here set
    # for one test): three chunks of 64 with restarts, an initial state, full and diagonal blocks; the last
    # case presplits the states with the chunk scan rounding them (the low halves left unwritten). The output
    # keeps its dtype's tolerance; the fp32 final states take the problem's dtype entry (the conformance
    # suite's rule) once the chunk state rounds, which drops them to 16-bit accuracy.
    from infiniops_triton._ssd_common import PRODUCTS

    args, kwargs = _scan_inputs(2, 150, 2, 16, 1, 16, dtype)
    seq_idx = torch.zeros(2, 150, dtype=torch.int32)
    seq_idx[0, 40:] = 1
    seq_idx[1, 100:] = 2
    kwargs.update(seq_idx=seq_idx, chunk_size=64)
    _forms(monkeypatch, 0, 0, 0, False)
    with infiniops_py.use("triton"):
        split_out, split_final = selective_scan(*args, **kwargs)
    _forms(monkeypatch, PRODUCTS[state], PRODUCTS[scan], PRODUCTS[scan_state], presplit)
    (out, final), (ref, ref_final) = _run_scan(args, kwargs)
    check("selective_scan", out, ref)
    _, failure = compare("final_states", final, ref_final,
                         tolerance("selective_scan", "float32" if state == "split" else str(dtype)[6:]))
    assert failure is None, failure
    assert not torch.equal(out, split_out)  # the forms ran: the rounding differs from the split products
    assert torch.equal(final, split_final) == (state == "split")


@pytest.mark.parametrize("dtype", DTYPES)
def test_scan_packed_sequences_across_chunks(dtype: torch.dtype) -> None:
    # cu_seqlens: 70 tokens in chunks of 16, sequences of 20, 0, 33, 1 and 16 tokens (each starting a chunk of
    # its own: 2 + 3 + 1 + 1 chunks of the 9 the bound allows); seq_idx restarts inside the third sequence and
    # changes value on the first token of the fourth (a sequence start, not a second restart)
    lengths = (20, 0, 33, 1, 16)
    args, kwargs = _scan_inputs(1, sum(lengths), 2, 20, 1, 16, dtype)
    seq_idx = torch.zeros(1, sum(lengths), dtype=torch.int32)
    seq_idx[0, 40:] = 1
    seq_idx[0, 53:] = 2
    kwargs.update(seq_idx=seq_idx, chunk_size=16, cu_seqlens=torch.tensor([0, *lengths]).cumsum(0),
                  initial_states=randn(len(lengths), 2, 20, 16, seed=10), return_varlen_states=True)
    (out, final, varlen), (ref, ref_final, ref_varlen) = _run_scan(args, kwargs)
    check("selective_scan", out, ref)
    check("selective_scan", final, ref_final)
    check("selective_scan", varlen, ref_varlen)
    assert torch.equal(varlen[1], kwargs["initial_states"][1])  # the empty sequence keeps its initial state


@pytest.mark.parametrize("dtype", DTYPES)
def test_state_update_untied_layouts_16bit_states_and_negative_steps(dtype: torch.dtype) -> None:
    # mamba's untied dt [B, H, P], A [H, P, N], dt_bias [H, P] with negative steps (never clamped), the state
    # in the inputs' dtype; P = 40 spans two programs of the tile
    batch, heads, head_dim, d_state = 3, 2, 40, 16
    state = randn(4, heads, head_dim, d_state, seed=11, dtype=dtype)
    x = randn(batch, heads, head_dim, seed=12, dtype=dtype)
    dt = (0.1 * randn(batch, heads, head_dim, seed=13) - 0.05).to(dtype)
    A = -torch.exp(randn(heads, head_dim, d_state, seed=14, scale=0.5))
    B = randn(batch, 1, d_state, seed=15, dtype=dtype)
    C = randn(batch, 1, d_state, seed=16, dtype=dtype)
    kwargs = {"D": randn(heads, head_dim, seed=17), "dt_bias": 0.05 * randn(heads, head_dim, seed=18),
              "state_batch_indices": torch.tensor([2, -1, 0])}
    got_state = state.clone()
    with infiniops_py.use("triton"):
        out = selective_state_update(got_state, x, dt, A, B, C, **kwargs)
    ref_state = state.double()
    with infiniops_py.use("reference"):
        ref = selective_state_update(ref_state, x.double(), dt.double(), A, B.double(), C.double(),
                                     **{k: v.double() if v.is_floating_point() else v for k, v in kwargs.items()})
    assert got_state.dtype == dtype and bool(((dt.float() + kwargs["dt_bias"]) < 0).any())
    check("selective_state_update", out, ref)
    check("selective_state_update", got_state, ref_state)
    assert torch.equal(got_state[[1, 3]], state[[1, 3]])


@pytest.mark.parametrize("initial", [True, False])
def test_scan_one_chunk_without_final_states(initial: bool) -> None:
    # one chunk, no final states: the state passing runs only to split the initial state (16-bit inputs)
    args, kwargs = _scan_inputs(2, 10, 2, 16, 1, 16, torch.bfloat16)
    kwargs.update(chunk_size=16, return_final_states=False)
    if not initial:
        del kwargs["initial_states"]
    out, ref = _run_scan(args, kwargs)
    check("selective_scan", out, ref)


@pytest.mark.parametrize(("chunk_size", "length"), [(1, 20), (24, 50), (1000, 33)])
def test_scan_rounds_any_chunk_size(chunk_size: int, length: int) -> None:
    # chunk_size is a performance knob: every value >= 1 is served (rounded to a power of two in [16, 256])
    args, kwargs = _scan_inputs(1, length, 2, 8, 2, 8, torch.float32)
    kwargs["chunk_size"] = chunk_size
    (out, final), (ref, ref_final) = _run_scan(args, kwargs)
    check("selective_scan", out, ref)
    check("selective_scan", final, ref_final)


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul")  # inf * 0 inside the own sequence
def test_scan_keeps_an_inf_inside_its_sequence() -> None:
    args, kwargs = _scan_inputs(1, 48, 2, 8, 1, 16, torch.float32)
    x = args[0].clone()
    x[0, 5, 0, 0] = math.inf  # sequence 0 of head 0 blows up; the state of sequence 1 starts clean
    seq_idx = torch.zeros(1, 48, dtype=torch.int32)
    seq_idx[0, 16:] = 1
    kwargs.update(seq_idx=seq_idx, chunk_size=16)
    (out, final), (ref, ref_final) = _run_scan((x, *args[1:]), kwargs)
    assert not torch.isfinite(out[0, 5:16, 0]).all()
    assert torch.isfinite(out[0, 16:]).all() and torch.isfinite(final).all()
    check("selective_scan", out[0, 16:], ref[0, 16:])
    check("selective_scan", final, ref_final)


@pytest.mark.parametrize("dtype", DTYPES)
def test_state_update_head_dim_tiles_and_unchecked_slots(dtype: torch.dtype) -> None:
    # N=16 packs P=200 into two 128-row programs; slot 9 is out of range (unchecked): skipped, output 0.
    batch, heads, head_dim, groups, d_state, slots = 3, 2, 200, 1, 16, 6
    state = randn(slots, heads, head_dim, d_state, seed=1)
    x = randn(batch, heads, head_dim, seed=2, dtype=dtype)
    dt = randn(batch, heads, seed=3, dtype=dtype)
    A = -torch.exp(randn(heads, seed=4))
    B = randn(batch, groups, d_state, seed=5, dtype=dtype)
    C = randn(batch, groups, d_state, seed=6, dtype=dtype)
    index = torch.tensor([4, 9, 0])
    kwargs = {"D": randn(heads, seed=7), "z": randn(batch, heads, head_dim, seed=8, dtype=dtype),
              "state_batch_indices": index}
    got_state = state.clone()
    with infiniops_py.unchecked_indices(), infiniops_py.use("triton"):
        out = selective_state_update(got_state, x, dt, A, B, C, **kwargs)
    ref_state = state.double()
    with infiniops_py.unchecked_indices(), infiniops_py.use("reference"):
        ref = selective_state_update(ref_state, x.double(), dt.double(), A, B.double(), C.double(),
                                     **{k: v.double() if v.is_floating_point() else v for k, v in kwargs.items()})
    check("selective_state_update", out, ref)
    check("selective_state_update", got_state, ref_state)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    untouched = [1, 2, 3, 5]
    assert torch.equal(got_state[untouched], state[untouched])


def test_scan_unchecked_cu_seqlens_that_do_not_cut_the_row_never_index_out_of_bounds() -> None:
    # past the row, decreasing, or no sequence for the row's tokens: unspecified numbers, no index past the
    # chunk table (the host-side gathers would assert on the device)
    (x, dt, A, B, C), kwargs = _scan_inputs(1, 40, 2, 16, 1, 16, torch.float32)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("initial_states", "return_final_states")}
    for cu in ([0, 2**31 - 1, 3], [0, 90], [30, 2, 40], [0]):
        init = randn(len(cu) - 1, 2, 16, 16, seed=9)
        with infiniops_py.unchecked_indices(), infiniops_py.use("triton"):
            y, varlen = selective_scan(x, dt, A, B, C, 16, **kwargs, initial_states=init,
                                       cu_seqlens=torch.tensor(cu, dtype=torch.int32), return_varlen_states=True)
        assert y.shape == x.shape and varlen.shape == init.shape, cu


def test_gates_name_the_field() -> None:
    with infiniops_py.use("triton"), pytest.raises(GateError, match="d_state"):
        infiniops_py.resolve("selective_scan", device_type="cpu", dtype="bfloat16", d_state=512)
    with infiniops_py.use("triton"), pytest.raises(GateError, match="head_dim"):
        infiniops_py.resolve("selective_scan", device_type="cpu", dtype="float16", head_dim=320)
    with infiniops_py.use("triton"), pytest.raises(GateError, match="d_state"):
        infiniops_py.resolve("selective_state_update", device_type="cpu", dtype="float32", d_state=300)
    with infiniops_py.use("triton"), pytest.raises(GateError, match="dtype"):
        infiniops_py.resolve("selective_state_update", device_type="cpu", dtype="float64")
    with infiniops_py.use("triton"), pytest.raises(GateError, match="state_dtype"):
        infiniops_py.resolve("selective_state_update", device_type="cpu", dtype="float32", state_dtype="float64")


def test_gpu_benchmark_script_runs_end_to_end_at_small_sizes() -> None:
    # benchmarks/gpu_ssm.py runs on the H200 only; here every code path but the real timer runs on the CPU
    path = Path(__file__).parents[2] / "benchmarks" / "gpu_ssm.py"
    spec = importlib.util.spec_from_file_location("gpu_ssm", path)
    assert spec is not None and spec.loader is not None
    gpu_ssm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_ssm)
    results: list[dict] = []
    gpu_ssm.run(results, device="cpu", timer=lambda fn: (fn(), 1.0)[1], small=True)
    assert len(gpu_ssm.correctness_cases(torch.float32, "cpu", small=True)) == 2
    checks = [r for r in results if r["kind"] == "check"]
    perf = [r for r in results if r["kind"] == "perf"]
    assert len(checks) == len(gpu_ssm.correctness_cases(torch.bfloat16, "cpu", small=True))
    assert all(r["status"] == "PASS" for r in checks), gpu_ssm.format_table(checks)
    assert len(perf) == 4 and all("triton" in r for r in perf), gpu_ssm.format_table(perf)
    assert len(gpu_ssm.format_table(results).splitlines()) == len(results)


def test_sweep_script_checks_each_variant_at_small_sizes() -> None:
    # benchmarks/gpu_sweep_scan.py runs on the H200 only; here its variants run (blocks shrunk) and are
    # checked against the reference, with a constant timer: the separable decays (FACTORED) run in the
    # full blocks, as do a fixed chunk_state and state_passing configuration
    path = Path(__file__).parents[2] / "benchmarks" / "gpu_sweep_scan.py"
    spec = importlib.util.spec_from_file_location("gpu_sweep_scan", path)
    assert spec is not None and spec.loader is not None
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    picks = [v for v in sweep.VARIANTS if v[1] in ("PRESPLIT off", "M64 K32 P64 NS32 w4 s3 r128 fact",
                                                   "P64 N64 K64 w4 s2 r128 wx", "BLOCK256 step4 w4")]
    rows: list[dict] = []
    torch_ms = sweep.run(rows, device="cpu", small=True, timer=lambda fn: 1.0, variants=picks)
    assert [r["kernel"] for r in rows] == ["default", "layout", "chunk_scan", "state_passing", "chunk_state", "best"]
    assert all(r["status"] == "PASS" for r in rows), sweep.format_table(rows, torch_ms)
    assert rows[-1]["configs"].keys() - {"layout"} == {k for k, _, _ in picks} - {"layout"}  # a constant timer
    assert all(rows[-1]["configs"][k] == sweep.shrink(c) for k, _, c in picks if k != "layout")
    assert len(sweep.format_table(rows, torch_ms).splitlines()) == len(rows) + 1
    spent: list[dict] = []  # no time left: every variant skipped, the defaults still run as the "best"
    sweep.run(spent, device="cpu", small=True, timer=lambda fn: 1.0, variants=picks, budget_s=0.0)
    assert [(r["kernel"], r["configs"], r["status"]) for r in spent] == [("best", {}, "PASS")]


def _parity_script() -> Any:
    path = Path(__file__).parents[2] / "benchmarks" / "gpu_ssd_parity.py"
    spec = importlib.util.spec_from_file_location("gpu_ssd_parity", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parity_script_runs_end_to_end_at_small_sizes() -> None:
    # benchmarks/gpu_ssd_parity.py runs on the H200 only; here every code path but the timer, the CUDA graphs
    # and the profiler runs on the CPU, with our torch provider standing in for state-spaces/mamba's entry
    # point (the peer's calling convention), and two variants swept: the rounded chunk scan and the presplit
    # layout whose chunk scan reads the high halves alone
    parity = _parity_script()

    def stand_in(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                 chunk_size: int, **kwargs: Any) -> Any:
        assert kwargs.pop("return_final_states") is True
        with infiniops_py.use("torch"):
            return selective_scan(x, dt, A, B, C, chunk_size, **kwargs, return_final_states=True)

    picks = [v for v in parity.VARIANTS if v[1] in ({"chunk_scan": {"PRODUCT": 2, "STATE_PRODUCT": 2}},
                                                    {"layout": {"PRESPLIT": 1}, "chunk_scan": {"STATE_PRODUCT": 2}})]
    assert len(picks) == 2
    parity_rows, rows = parity.run("cpu", small=True, timer=lambda fn: (fn(), 1.0)[1], peer=stand_in,
                                   variants=picks)
    assert [r["size"] for r in parity_rows] == [f"{b}x{n}" for b, n in parity.SMALL_SIZES]
    for r in parity_rows:
        assert r["margin"] <= 1.0 and r["peer_margin"] <= 1.0, r
        assert 0.0 <= r["vs_peer"] < 0.1 and r["served"] == "triton", r
        assert all(r[f"{e}_{m}"] == 1.0 for e in ("public", "impl", "peer") for m in ("graph", "eager")), r
    assert [r["kernel"] for r in rows] == ["default", "chunk_scan", "layout", "best"]
    assert all(r["status"] == "PASS" and r["final_fp32"] <= 1.0 for r in rows), parity.sweep_table(rows,
                                                                                                   parity.SMALL_SIZES)
    assert rows[-1]["configs"] == {} and rows[-1]["fp16_margin"] <= 1.0  # a constant timer: nothing wins
    tables = (parity.parity_table(parity_rows), parity.profile_table(parity_rows),
              parity.sweep_table(rows, parity.SMALL_SIZES), parity.advice(rows, parity_rows, parity.SMALL_SIZES))
    assert [len(t.splitlines()) for t in tables] == [4, 4, 5, 1], tables
    assert parity.main(["--smoke", "--variant", "nonesuch"]) == 2


def test_parity_script_picks_the_fastest_passing_variant_of_each_kernel() -> None:
    # the selection alone, on made-up rows (ms at each of two sizes): a faster FAIL loses, a variant no faster than the
    # default's launch is not picked, the layout row wins on the whole prefill, overrides merge layout first;
    # the strict pick skips variants whose final states miss the fp32 entry
    parity = _parity_script()

    def row(kernel: str, configs: dict, kernel_ms: float, total: float, status: str = "PASS",
            fp32: float = 0.5) -> dict:
        return {"kernel": kernel, "configs": configs, "kernel_ms": [kernel_ms] * 2, "total": [total] * 2,
                "status": status, "final_fp32": fp32, "best": False}

    default = {**row("default", {}, 0.0, 1.0), "stage_ms": {"chunk_scan": 2.0, "chunk_state": 0.8,
                                                              "state_passing": 0.4}}  # summed over the sizes
    rows = [default,
            row("chunk_scan", {"chunk_scan": {"PRODUCT": 2}}, 0.3, 0.8, status="FAIL"),
            row("chunk_scan", {"chunk_scan": {"PRODUCT": 1}}, 0.4, 0.9),
            row("chunk_scan", {"chunk_scan": {"PRODUCT": 0}}, 0.45, 0.95),
            row("chunk_state", {"chunk_state": {"PRODUCT": 2}}, 0.1, 0.9, fp32=2.0),
            row("state_passing", {"state_passing": {"BLOCK": 512}}, 0.2, 1.0),  # as fast as the default: kept
            row("layout", {"layout": {"PRESPLIT": 1}, "chunk_scan": {"STATE_PRODUCT": 2}}, 0.9, 0.9)]
    best = parity.pick_best(rows)
    assert best == {"layout": {"PRESPLIT": 1}, "chunk_scan": {"STATE_PRODUCT": 2, "PRODUCT": 1},
                    "chunk_state": {"PRODUCT": 2}}
    assert [r["best"] for r in rows] == [False, False, True, False, True, False, True]
    strict = parity.pick_best(rows, strict=True)
    assert "chunk_state" not in strict and strict["chunk_scan"] == {"STATE_PRODUCT": 2, "PRODUCT": 1}
