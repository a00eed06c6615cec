"""Triton causal_conv1d and causal_conv1d_update on the CPU under the Triton interpreter: the conformance
suite, then what its small shapes do not reach (several time tiles with sequence runs and final states
crossing them, a weight in another dtype, unchecked out-of-range slots, the circular state with more new
columns than state columns and a strided index, gates: vLLM's packed form goes to the torch provider)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from interp_helpers import assert_conformant, check, randn

import infiniops_py
from infiniops_py import GateError

EXAMPLES = 8


@pytest.mark.parametrize("op", ["causal_conv1d", "causal_conv1d_update"])
def test_conformance(op: str) -> None:
    assert_conformant(op, EXAMPLES)


@pytest.mark.parametrize("channel_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_conv_runs_and_states_across_time_tiles(channel_last: bool, dtype: torch.dtype) -> None:
    batch, dim, length, width = 2, 20, 600, 4  # 3 time tiles channel-first, 5 channel-last
    x = (randn(batch, length, dim, dtype=dtype, seed=1).transpose(1, 2) if channel_last
         else randn(batch, dim, length, dtype=dtype, seed=1))
    weight = randn(dim, width, dtype=torch.float32, seed=2, scale=0.5)  # the weight's own dtype: fp32
    bias = randn(dim, dtype=torch.float32, seed=3)
    init = randn(batch, dim, width - 1, dtype=dtype, seed=4)
    seq = torch.zeros(batch, length, dtype=torch.int32)
    seq[0, 255:257] = 1  # a 2-token run astride the first tile edge, then id 0 again: runs, not values
    seq[0, 598:] = 2  # the last run is shorter than W-1: the older final-state columns are 0
    seq[1, 300:] = -1  # trailing padding
    kwargs = {"activation": "silu", "seq_idx": seq, "initial_states": init, "return_final_states": True}
    with infiniops_py.use("triton"):
        out, final = infiniops_py.causal_conv1d(x, weight, bias, **kwargs)
    with infiniops_py.use("reference"):
        ref_out, ref_final = infiniops_py.causal_conv1d(
            x.double(), weight.double(), bias.double(), **{**kwargs, "initial_states": init.double()})
    check("causal_conv1d", out, ref_out)
    assert torch.equal(final.double(), ref_final)
    assert torch.equal(final[0, :, 0], torch.zeros(dim, dtype=dtype))
    assert torch.equal(out[1, :, 300:], torch.zeros(dim, length - 300, dtype=dtype))


@pytest.mark.parametrize("channel_last", [False, True])
@pytest.mark.parametrize("width", [2, 5, 8])
def test_register_tap_kernels_across_time_tiles(width: int, channel_last: bool) -> None:
    # without seq_idx: the register-tap kernels; channel-first: 3 time tiles, a ragged last group of 8;
    # channel-last: 8 tiles of 8 rows, the last one ragged, 20 channels (no full 16-byte vector)
    batch, dim, length = 2, 20, 61 if channel_last else 597
    x = (randn(batch, length, dim, dtype=torch.bfloat16, seed=8).transpose(1, 2) if channel_last
         else randn(batch, dim, length, dtype=torch.bfloat16, seed=8))
    weight, bias = randn(dim, width, dtype=torch.bfloat16, seed=9), randn(dim, dtype=torch.bfloat16, seed=10)
    init = randn(batch, dim, width - 1, dtype=torch.bfloat16, seed=11)
    _silu_with_states_matches_reference(x, weight, bias, init)


def _silu_with_states_matches_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                                        init: torch.Tensor) -> None:
    """Triton's conv (silu, initial and final states) against the float64 reference: outputs within the
    tolerance, final states exact."""
    kwargs = {"activation": "silu", "return_final_states": True}
    with infiniops_py.use("triton"):
        out, final = infiniops_py.causal_conv1d(x, weight, bias, initial_states=init, **kwargs)
    with infiniops_py.use("reference"):
        ref_out, ref_final = infiniops_py.causal_conv1d(x.double(), weight.double(), bias.double(),
                                                        initial_states=init.double(), **kwargs)
    check("causal_conv1d", out, ref_out)
    assert torch.equal(final.double(), ref_final)

@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize(("rows", "channels", "warps"), [(16, 32, 1), (24, 64, 2), (64, 1024, 4), (None, 0, 0)])
def test_channel_last_time_runs(width: int, rows: int | None, channels: int, warps: int,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    # 61 rows: a ragged last group of 8 and a shorter last run (16 and 24 rows per program), or one run of 64;
    # 40 channels: a ragged channel block (32 per program) or one block past D; None: the channel-first kernel
    from infiniops_triton import causal_conv1d as triton_conv

    batch, dim, length = 2, 40, 61
    if rows is not None:
        monkeypatch.setattr(triton_conv, "CHANNEL_LAST_TILE", triton_conv.ChannelLastTile(rows, channels, warps, 0))
    x = randn(batch, length, dim, dtype=torch.bfloat16, seed=12)
    x = x.transpose(1, 2) if rows is not None else x.transpose(1, 2).contiguous()
    weight, bias = randn(dim, width, dtype=torch.float32, seed=13), randn(dim, dtype=torch.float32, seed=14)
    init = randn(batch, dim, width - 1, dtype=torch.bfloat16, seed=15)
    _silu_with_states_matches_reference(x, weight, bias, init)


def test_channel_last_launch_shapes() -> None:
    # plain Python: the tile the launcher derives from the config, the device and the shape
    from infiniops_triton.causal_conv1d import ChannelLastTile, channel_last_launch

    tile = ChannelLastTile(rows=64, channels=1024, warps=4, min_programs_per_sm=2.0)
    assert channel_last_launch(tile, 8, 4096, 4096, 132) == (64, 1024, 4)  # 2048 programs: as configured
    assert channel_last_launch(tile, 1, 4096, 4096, 132) == (32, 1024, 4)  # 4 x 64 < 264 programs: shorter
    assert channel_last_launch(tile, 1, 4096, 100, 132) == (8, 1024, 4)  # never below one group of 8
    assert channel_last_launch(tile, 4, 40, 20, 1) == (24, 64, 1)  # 64 channels, one warp; 20 rows -> 24
    assert channel_last_launch(tile, 8, 256, 4096, 132) == (64, 256, 1)  # 8 channels per thread, as the tile
    assert channel_last_launch(ChannelLastTile(48, 256, 8, 0), 1, 512, 4096, 132) == (48, 256, 8)
    # the default (the H200 sweep's best) runs as measured at the sweep's shape, and keeps 4 channels per thread
    assert channel_last_launch(ChannelLastTile(), 8, 4096, 4096, 132) == (128, 512, 4)
    assert channel_last_launch(ChannelLastTile(), 16, 256, 4096, 132) == (128, 256, 2)
    for bad in ({"rows": 12}, {"channels": 96}, {"warps": 3}, {"min_programs_per_sm": -1.0}):
        with pytest.raises(ValueError, match="ChannelLastTile"):
            ChannelLastTile(**bad)


def test_sweep_script_runs_end_to_end_at_small_sizes() -> None:
    # benchmarks/gpu_sweep_conv.py runs on the H200 only; here every code path but the real timer runs on the CPU
    path = Path(__file__).parents[2] / "benchmarks" / "gpu_sweep_conv.py"
    spec = importlib.util.spec_from_file_location("gpu_sweep_conv", path)
    assert spec is not None and spec.loader is not None
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    from infiniops_triton import causal_conv1d as triton_conv

    default = triton_conv.CHANNEL_LAST_TILE
    results: list[dict] = []
    sweep.run(results, device="cpu", timer=lambda fn: (fn(), 1.0)[1], small=True)
    assert triton_conv.CHANNEL_LAST_TILE is default  # every forced tile is put back
    assert len(results) == len(sweep.VARIANTS) + 2  # the variants, the default tile, channel-first
    assert all(r["check"] == "PASS" for r in results), sweep.format_table(results)
    table = sweep.format_table(results).splitlines()
    assert len(table) == len(results) + 1 and table[-1].startswith("best channel-last: ChannelLastTile(rows=")
    assert sum(line.startswith("*") for line in table) == 1
    # the fp32 conv1d reference is the contract's reference
    x = randn(2, 5, 9, dtype=torch.float32, seed=16)
    weight, bias = randn(5, 3, dtype=torch.float32, seed=17), randn(5, dtype=torch.float32, seed=18)
    with infiniops_py.use("reference"):
        ref = infiniops_py.causal_conv1d(x.double(), weight.double(), bias.double(), activation="silu")
    torch.testing.assert_close(sweep.reference(x, weight, bias).double(), ref, rtol=1e-5, atol=1e-6)


def test_update_skips_out_of_range_slots_when_unchecked() -> None:
    batch, dim, width, state_len = 3, 16, 4, 5
    x = randn(batch, dim, 2, dtype=torch.bfloat16, seed=5)
    state = randn(4, dim, state_len, dtype=torch.bfloat16, seed=6)
    weight = randn(dim, width, dtype=torch.bfloat16, seed=7)
    index = torch.tensor([2, 4, -1], dtype=torch.int32)  # 4 == slots: out of range, skipped like padding
    got_state = state.clone()
    with infiniops_py.use("triton"), infiniops_py.unchecked_indices():
        out = infiniops_py.causal_conv1d_update(x, got_state, weight, conv_state_indices=index)
    ref_state = state.double()
    with infiniops_py.use("reference"), infiniops_py.unchecked_indices():
        ref = infiniops_py.causal_conv1d_update(x.double(), ref_state, weight.double(), conv_state_indices=index)
    check("causal_conv1d_update", out, ref)
    assert torch.equal(out[1:], torch.zeros_like(out[1:]))
    assert torch.equal(got_state.double(), ref_state)
    assert torch.equal(got_state[[0, 1, 3]], state[[0, 1, 3]])


@pytest.mark.parametrize("length", [1, 3, 7])
def test_update_circular_state(length: int) -> None:
    # causal-conv1d's cache_seqlens: positions past S and a negative one (unchecked: taken mod S), more
    # new columns than state columns (L = 7 > S = 5: the later ones win), a strided index with padding
    batch, dim, width, state_len = 4, 20, 4, 5
    x = randn(batch, dim, length, dtype=torch.bfloat16, seed=12)
    state = randn(6, dim, state_len, dtype=torch.bfloat16, seed=13)
    weight, bias = randn(dim, width, dtype=torch.float32, seed=14), randn(dim, dtype=torch.float32, seed=15)
    index = torch.tensor([3, 0, -1, 9, 5, 1, 2, 7], dtype=torch.int32)[::2]  # slots 3, -1, 5, 2
    seqlens = torch.tensor([7, 12, 0, -3], dtype=torch.int32)
    got_state = state.clone()
    with infiniops_py.use("triton"), infiniops_py.unchecked_indices():
        out = infiniops_py.causal_conv1d_update(x, got_state, weight, bias, "silu", seqlens, index)
    ref_state = state.double()
    with infiniops_py.use("reference"), infiniops_py.unchecked_indices():
        ref = infiniops_py.causal_conv1d_update(x.double(), ref_state, weight.double(), bias.double(), "silu",
                                                seqlens, index)
    check("causal_conv1d_update", out, ref)
    assert torch.equal(got_state.double(), ref_state)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_update_gates_states_too_long_for_registers() -> None:
    with infiniops_py.use("triton"), pytest.raises(GateError, match="state_len"):
        infiniops_py.resolve("causal_conv1d_update", device_type="cpu", dtype="bfloat16", state_len=1025)


def test_packed_form_is_gated_to_the_torch_provider() -> None:
    with infiniops_py.use("triton"), pytest.raises(GateError, match="varlen"):
        infiniops_py.resolve("causal_conv1d", device_type="cpu", dtype="bfloat16", varlen=True)
    impl = infiniops_py.resolve("causal_conv1d", device_type="cpu", dtype="bfloat16", varlen=True)
    assert impl.provider == "torch"


def test_channel_first_autotune_candidates_fit_the_row() -> None:
    # the interpreter runs one config, so the GPU's candidate pruning is checked here as plain Python
    from infiniops_triton import causal_conv1d as triton_conv

    def tiles(length: int) -> list[int]:
        chosen = triton_conv._prune_channel_first(list(triton_conv._CHANNEL_FIRST_CANDIDATES), {"L": length})
        return sorted({c.kwargs["BLOCK_L"] for c in chosen})

    assert tiles(4096) == [256, 512, 1024]
    assert tiles(300) == [256, 512]
    assert tiles(3) == [256]  # nothing fits: the shortest tile


@pytest.mark.parametrize("programs", [0, 64])
def test_update_grid_minimum_splits_the_channels_and_matches_the_reference(
        monkeypatch: pytest.MonkeyPatch, programs: int) -> None:
    """`UPDATE_PROGRAMS` only re-tiles the channels: a one-row decode of 100 channels (a column view, as the Mamba-2
    layer passes it) in 16-channel programs (or one program: 0) gives the reference's output and state."""
    from infiniops_triton import causal_conv1d as triton_conv

    monkeypatch.setattr(triton_conv, "UPDATE_PROGRAMS", programs)
    seen: list[tuple[int, ...]] = []
    launch = triton_conv._UPDATE
    monkeypatch.setattr(triton_conv, "_UPDATE", lambda grid, *a, **kw: seen.append(grid) or launch(grid, *a, **kw))
    zx = randn(1, 260, dtype=torch.bfloat16, seed=20)
    x = zx[:, 60:160]
    state = randn(1, 100, 3, dtype=torch.bfloat16, seed=21)
    weight, bias = randn(100, 4, dtype=torch.bfloat16, seed=22), randn(100, dtype=torch.bfloat16, seed=23)
    got_state = state.clone()
    with infiniops_py.use("triton"):
        out = infiniops_py.causal_conv1d_update(x, got_state, weight, bias, "silu")
    ref_state = state.double()
    with infiniops_py.use("reference"):
        ref = infiniops_py.causal_conv1d_update(x.double(), ref_state, weight.double(), bias.double(), "silu")
    check("causal_conv1d_update", out, ref)
    assert torch.equal(got_state.double(), ref_state)
    assert seen == [(1, 7 if programs else 1)]


def test_conv_update_benchmark_checks_every_grid_at_tiny_sizes() -> None:
    """benchmarks/gpu_conv_update.py on the CPU (its timing needs CUDA graphs): every grid's output and state
    match the torch provider's."""
    path = Path(__file__).parents[2] / "benchmarks" / "gpu_conv_update.py"
    spec = importlib.util.spec_from_file_location("gpu_conv_update", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows, ok = bench.run(torch.device("cpu"), smoke=True)
    assert ok and len(rows) == 2
    assert all(r[f"triton {p or 'before'} check"] == "PASS" for r in rows for p in bench.PROGRAMS)
