"""causal_conv1d and its decode step as Triton kernels (Dao-AILab/causal-conv1d semantics, the contract's
decisions on ``seq_idx`` runs, initial and final states).

Prefill: a program computes a ``[BLOCK_D, BLOCK_L]`` tile of one row as ``W`` shifted loads of x (the
overlap hits L1/L2, so memory is read about once), fp32 accumulation, bias and SiLU fused. Either layout is
read through strides; the tile's long side follows the unit-stride dim so loads stay coalesced. With
``seq_idx`` a tap ``j`` positions back counts only while ``seq_idx`` has not changed between it and the
output position (a chain of ``W - 1`` equality tests); positions before 0 read ``initial_states`` and
belong to the row's first sequence. The last time tile of each row also writes the final states.
Channel-first input without ``seq_idx`` (W <= 8) takes a second kernel: there the shifted windows would be
misaligned loads along the unit stride, so it loads the tile and the 8 columns before each group of 8
(two aligned vector loads) and picks the taps from registers (`_conv_taps`); above `TUNE_MIN_NUMEL`
elements it autotunes its tile among a few shapes and warp counts. Channel-last input without
``seq_idx`` (W <= 8) takes a third: a program owns a run of time rows of a block of channels
(`ChannelLastTile`: 128 rows of up to 512 channels, 4 warps, by default) and walks it 8 rows at a time,
each row one coalesced vector load held in registers, carrying the last W-1 rows in registers to the next
8; only the W-1 rows before the run are loaded twice, so x is read about once (the generic kernel's W
shifted loads mostly miss L1 and cost W times the traffic in L2; 8-row programs reloaded (W-1)/8 of x and
the taps). The default tile was measured best on the H200 by benchmarks/gpu_sweep_conv.py: 86% of the
copy bandwidth on bf16 ``[8, 4096, 4096]``, W=4, bias and SiLU (64x1024 took 80%, 8-row programs 64%;
loading the next 8 rows while the current 8 compute lost on every tile, 64-83%). SiLU divides
approximately (2 ulp).

Size arguments are compiled for their value class (1, a multiple of 16, other) only where that decides the
vector width: a size that bounds a mask along the unit stride (D channel-last, L channel-first; the generic
kernel, which reads either layout, is compiled twice, once per layout); the others are
``do_not_specialize``, so the many shapes of a conformance run do not each compile a kernel.

Decode: a program owns ``BLOCK_D`` channels of one row: it reads the slot's ``S`` state columns and the
row's ``L`` new columns, writes the ``L`` outputs, then (after a barrier, since it overwrites what it
read) the last ``S`` columns back into the slot; with ``cache_seqlens`` the slot is circular: the taps
read the W-1 columns before the write position and the new columns are written from it on, mod S. A
negative or out-of-range slot outputs 0 and touches no state.

The packed form of the prefill (vLLM's, ``query_start_loc``) is not served here: the capability gates it
(``varlen``) to the torch provider.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from infiniops_py import Between, Capability, Implementation, OneOf
from infiniops_py.operators.causal_conv1d import MAX_WIDTH, MIN_WIDTH
from infiniops_triton._common import INTERPRET, PRIORITY, base_constraints, cdiv, next_power_of_2, sm_count
from infiniops_triton._conv_kernels import (
    _conv_channel_first_kernel,
    _conv_channel_last_kernel,
    _conv_kernel,
    _conv_kernel_unit_l,
    _update_kernel,
)
from infiniops_triton._fastlaunch import Launcher
from infiniops_triton._launch import Tuned

__all__ = ["IMPLEMENTATIONS", "causal_conv1d", "causal_conv1d_update"]

MAX_STATE_LEN = 1024  # the decode step holds a slot's state columns in registers
_FAST_MAX_WIDTH = 8  # the channel-first kernel reads taps from the previous group of 8 columns only
_ELEMS_PER_PROGRAM = 4096
# The decode step's grid holds at least about this many programs (0: no minimum): one row of a Mamba-2 layer
# (D ~1800) in programs of 1024 channels kept two SMs busy (benchmarks/gpu_conv_update.py on the H200: 256 the
# best overall of 0, 32, 64, 128, 256 at batch 1, 8 and 64).
UPDATE_PROGRAMS = 256
TUNE_MIN_NUMEL = 1 << 24  # channel-first inputs this large autotune their tile (once per D and size class)


def _channel_first_config(block_d: int, block_l: int, warps: int) -> triton.Config:
    return triton.Config({"BLOCK_D": block_d, "BLOCK_L": block_l}, num_warps=warps)


# Large channel-first problems autotune among these once per (D, size class of L); longer rows waste less of
# the misaligned `prev` load's first sector, fewer warps give each thread more loads in flight.
_CHANNEL_FIRST_CANDIDATES = (_channel_first_config(16, 256, 8), _channel_first_config(8, 512, 8),
                             _channel_first_config(4, 1024, 8), _channel_first_config(16, 256, 4))


def _prune_channel_first(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """The candidates whose time tile is no longer than the row (at least the shortest)."""
    length = next_power_of_2(named_args["L"])
    fits = [c for c in configs if c.kwargs["BLOCK_L"] <= max(8, length)]
    return fits or [min(configs, key=lambda c: c.kwargs["BLOCK_L"])]


_conv_channel_first_tuned = triton.autotune(
    list(_CHANNEL_FIRST_CANDIDATES), key=["D", "size_class"],
    prune_configs_by={"early_config_prune": _prune_channel_first})(_conv_channel_first_kernel)
_CHANNEL_FIRST_TUNED = Tuned(_conv_channel_first_tuned)  # tuned once per key, then the fast launch


@dataclass(frozen=True)
class ChannelLastTile:
    """The channel-last kernel's work per program: `rows` time rows (a multiple of 8) of `channels` channels
    (a power of 2) with `warps` warps; rows that would leave fewer than `min_programs_per_sm` programs per SM
    are halved (down to 8) first, so short inputs still fill the GPU (0: never). The default is the tile
    measured best on the H200 (benchmarks/gpu_sweep_conv.py: 86% of the copy bandwidth on bf16
    ``[8, 4096, 4096]``, W=4)."""

    rows: int = 128
    channels: int = 512
    warps: int = 4
    min_programs_per_sm: float = 2.0

    def __post_init__(self) -> None:
        if self.rows < 8 or self.rows % 8 or self.channels < 1 or self.channels & (self.channels - 1) or \
                self.warps not in (1, 2, 4, 8, 16) or self.min_programs_per_sm < 0:
            raise ValueError(f"ChannelLastTile: rows a multiple of 8, channels a power of 2, warps 1-16: {self}")


# The tile the launcher uses; benchmarks/gpu_sweep_conv.py assigns other tiles here to time them.
CHANNEL_LAST_TILE = ChannelLastTile()


_CHANNEL_LAST = Launcher(_conv_channel_last_kernel)
_CHANNEL_FIRST = Launcher(_conv_channel_first_kernel)
_CONV = Launcher(_conv_kernel)
_CONV_UNIT_L = Launcher(_conv_kernel_unit_l)


def channel_last_launch(tile: ChannelLastTile, batch: int, dim: int, length: int,
                        sm_count: int) -> tuple[int, int, int]:
    """(rows, channels, warps) per program for `tile` on a ``[batch, dim, length]`` input: channels at most
    the next power of 2 of `dim` (the warps shrink with them, keeping the tile's channels per thread), rows
    at most the input's and halved while the grid is short."""
    block_d = min(tile.channels, next_power_of_2(dim))
    warps = max(1, tile.warps * block_d // tile.channels)
    rows = min(tile.rows, 8 * cdiv(length, 8))
    columns = batch * cdiv(dim, block_d)
    while rows > 8 and columns * cdiv(length, rows) < tile.min_programs_per_sm * sm_count:
        rows = 8 * cdiv(rows, 16)
    return rows, block_d, warps


def _sm_count(device: torch.device) -> int:
    """The device's SM count (132 on the H200; a CPU under the interpreter counts as one)."""
    return sm_count(device) if device.type == "cuda" else 1


def _tile(dim: int, other: int, unit_stride_along_d: bool) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_L) of about `_ELEMS_PER_PROGRAM` elements, the long side along the unit stride."""
    if unit_stride_along_d:
        block_d = min(next_power_of_2(dim), 64)
        return block_d, min(next_power_of_2(other), max(1, _ELEMS_PER_PROGRAM // block_d))
    block_l = min(next_power_of_2(other), 256)
    return min(next_power_of_2(dim), max(1, _ELEMS_PER_PROGRAM // block_l)), block_l


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    out: torch.Tensor,
    final_states: torch.Tensor | None,
) -> None:
    """Depthwise causal conv1d over ``[B, D, L]`` (causal-conv1d's ``causal_conv1d_fn``), fp32 arithmetic.

    Args:
        x: ``[B, D, L]`` float16/bfloat16/float32, channel-first or a channel-last view.
        weight: ``[D, W]`` float, ``2 <= W <= 16``; bias: ``[D]`` or None.
        activation: None or ``"silu"``.
        seq_idx: int32 ``[B, L]`` or None: taps never cross a change of id; ids < 0 output 0.
        initial_states: ``[B, D, W-1]`` or None (zeros).
        out: ``[B, D, L]`` to fill, any strides.
        final_states: ``[B, D, W-1]`` to fill with the last ``W-1`` inputs (exact copies), or None.
    """
    batch, dim, length = x.shape
    width = weight.shape[1]
    if batch == 0 or dim == 0 or length == 0:
        return
    channel_last = x.stride(1) == 1 and x.stride(2) != 1
    block_d, block_l = _tile(dim, length, channel_last)
    dummy = out
    init = initial_states if initial_states is not None else dummy
    final = final_states if final_states is not None else dummy
    span = max(1 + (dim - 1) * abs(t.stride(1)) + (length - 1) * abs(t.stride(2)) for t in (x, out))
    flags = {"W": width, "HAS_BIAS": bias is not None, "SILU": activation == "silu",
             "HAS_INIT": initial_states is not None, "HAS_FINAL": final_states is not None, "WIDE": span >= 2**31}
    common = (*weight.stride(), *(init.stride() if initial_states is not None else (0, 0, 0)), *out.stride())
    final_strides = final.stride() if final_states is not None else (0, 0, 0)
    blocks = {"BLOCK_D": block_d, "BLOCK_L": max(8, block_l), "BLOCK_W": next_power_of_2(width - 1),
              "num_warps": 8 if block_d * block_l >= 4096 else 4}
    grid = (cdiv(length, blocks["BLOCK_L"]), cdiv(dim, block_d), batch)
    bias_arg = bias if bias is not None else weight
    if channel_last and seq_idx is None and width <= _FAST_MAX_WIDTH:
        rows, block_d, warps = channel_last_launch(CHANNEL_LAST_TILE, batch, dim, length, _sm_count(x.device))
        _CHANNEL_LAST((cdiv(length, rows), cdiv(dim, block_d), batch),
            x, weight, bias_arg, init, out, final, dim, length, *x.stride(), *common, *final_strides, **flags,
            BLOCK_D=block_d, BLOCK_W=blocks["BLOCK_W"], num_warps=warps,
        )
        return
    if not channel_last and seq_idx is None and width <= _FAST_MAX_WIDTH:
        args = (x, weight, bias_arg, init, out, final, dim, length, length.bit_length(), *x.stride(), *common,
                *final_strides)
        if x.numel() >= TUNE_MIN_NUMEL and not INTERPRET:
            # the autotuner's own key: D, the size class of L and every tensor's dtype
            key = (dim, args[8], x.dtype, weight.dtype, bias_arg.dtype, init.dtype, out.dtype, final.dtype)
            _CHANNEL_FIRST_TUNED.launch(key, lambda meta: (cdiv(length, meta["BLOCK_L"]), cdiv(dim, meta["BLOCK_D"]),
                                                           batch), *args, **flags, BLOCK_W=blocks["BLOCK_W"])
        else:
            _CHANNEL_FIRST(grid, *args, **flags, **blocks)
        return
    seq = seq_idx if seq_idx is not None else dummy
    seq_strides = seq.stride()[:2] if seq_idx is not None else (0, 0)
    launcher = _CONV_UNIT_L if x.stride(2) == 1 else _CONV
    launcher(grid,
        x, weight, bias_arg, seq, init, out, final, dim, length, *x.stride(), *common[:2], *seq_strides,
        *common[2:], *final_strides, HAS_SEQ=seq_idx is not None, **flags, **blocks,
    )


_UPDATE = Launcher(_update_kernel)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    conv_state_indices: torch.Tensor | None,
    out: torch.Tensor,
    cache_seqlens: torch.Tensor | None = None,
) -> None:
    """Decode step(s) against a rolling state, or a circular one with `cache_seqlens` (causal-conv1d's
    ``causal_conv1d_update``), fp32 arithmetic.

    Args:
        x: ``[B, D, L]`` float16/bfloat16/float32, any strides.
        conv_state: ``[slots, D, S]``, ``W-1 <= S <= MAX_STATE_LEN``, updated in place (exact copies).
        weight: ``[D, W]``; bias: ``[D]`` or None; activation: None or ``"silu"``.
        conv_state_indices: int32/int64 ``[B]`` or None (row b uses slot b); negative or ``>= slots``
            (unchecked mode): output 0, state untouched.
        out: ``[B, D, L]`` to fill.
        cache_seqlens: int ``[B]`` or None: the circular state's write position per row (taken mod S).

    Raises:
        ValueError: ``S > MAX_STATE_LEN`` (the capability gates it first).
    """
    batch, dim, length = x.shape
    slots, _, state_len = conv_state.shape
    if state_len > MAX_STATE_LEN:
        raise ValueError(f"triton causal_conv1d_update: state length {state_len} > {MAX_STATE_LEN}")
    if batch == 0 or dim == 0 or length == 0:
        return
    block_l = next_power_of_2(length)
    block_s = next_power_of_2(state_len)
    block_d = min(next_power_of_2(dim), max(16, _ELEMS_PER_PROGRAM // max(block_l, block_s)))
    if UPDATE_PROGRAMS and (per := batch * dim // UPDATE_PROGRAMS) < block_d:
        block_d = max(16, 1 << max(per.bit_length() - 1, 0))  # a power of two: about UPDATE_PROGRAMS programs or more
    index = conv_state_indices.contiguous() if conv_state_indices is not None else out  # read with unit stride
    seqlens = cache_seqlens.contiguous() if cache_seqlens is not None else out
    _UPDATE((batch, cdiv(dim, block_d)),
        x, conv_state, weight, bias if bias is not None else weight, index, seqlens, out, dim, length, state_len,
        slots, *x.stride(), *conv_state.stride(), *weight.stride(), *out.stride(),
        W=weight.shape[1], HAS_BIAS=bias is not None, SILU=activation == "silu",
        HAS_INDEX=conv_state_indices is not None, CIRCULAR=cache_seqlens is not None, BLOCK_D=block_d,
        BLOCK_L=block_l, BLOCK_S=block_s, num_warps=4,
    )


_DTYPES = OneOf("dtype", ("float16", "bfloat16", "float32"))
_WIDTH = Between("width", MIN_WIDTH, MAX_WIDTH)

IMPLEMENTATIONS = [
    Implementation("causal_conv1d", "triton", "triton.causal_conv1d",
                   Capability(*base_constraints(), _DTYPES, _WIDTH,
                              OneOf("varlen", (False,), fix="use the torch provider for vLLM's packed form "
                                                            "(query_start_loc): not written in Triton yet")),
                   PRIORITY, causal_conv1d),
    Implementation("causal_conv1d_update", "triton", "triton.causal_conv1d_update",
                   Capability(*base_constraints(), _DTYPES, _WIDTH,
                              Between("state_len", 1, MAX_STATE_LEN, fix="use the torch provider")),
                   PRIORITY, causal_conv1d_update),
]
