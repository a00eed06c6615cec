"""Selective scan (Mamba-2 chunked SSD) in four Triton launches (three for one chunk without final states),
and the one-step state update.

The prefill follows the state-space-duality algorithm of Mamba-2 (the semantics of state-spaces/mamba's
``mamba_chunk_scan_combined``), with its dt/cumsum kernel folded into the chunk-state one:

1. `_ssd_chunk_state`: dt processing, the decay cumsum and each chunk's local end state (one kernel);
2. `_ssd_state_passing`: the state entering each chunk (fp32 in place, or for 16-bit inputs split in two
   16-bit halves for step 3: `PRESPLIT`), and the final state;
   `_ssd_bmm`: ``C B^T`` within each chunk, once per group;
3. `_ssd_chunk_scan`: the outputs, D and the z gate fused.

``seq_idx`` resets the state wherever it changes between neighbouring tokens (any int32 values, not only
non-decreasing ones). ``chunk_size`` is a performance knob (the result does not depend on it beyond
rounding): a power of two in [16, 256] is used as given, any other value as the largest power of two
below it, kept within [16, 256] (`kernel_chunk`).

Inputs with an inf or NaN: they propagate within their sequence as in the reference; across a
``seq_idx`` restart the entering state is dropped (never multiplied by 0), but a non-finite x of one
sequence can still reach the later rows of another sequence in the same chunk (``0 * inf`` inside the
chunk scan's tile product).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from infiniops_py import Between, Capability, ComputeCapability, Implementation, OneOf
from infiniops_triton._common import PRIORITY, base_constraints
from infiniops_triton._ssd_bmm import chunk_cb
from infiniops_triton._ssd_chunk_scan import chunk_scan
from infiniops_triton._ssd_chunk_state import chunk_state
from infiniops_triton._ssd_state_passing import state_passing
from infiniops_triton.state_update import IMPLEMENTATIONS as STATE_UPDATE_IMPLEMENTATIONS

__all__ = ["IMPLEMENTATIONS", "MAX_D_STATE", "MAX_HEAD_DIM", "PRESPLIT", "kernel_chunk", "scan_stages",
           "selective_scan"]

MIN_CHUNK, MAX_CHUNK = 16, 256  # 16: tl.dot's smallest tile; 256: the largest tuned
MAX_D_STATE = 256  # the chunk-scan kernel holds all of N in one tile
MAX_HEAD_DIM = 256
PRESPLIT = False  # 16-bit inputs: step 2 stores the states split for step 3's products; not yet measured on a GPU


def kernel_chunk(chunk_size: int) -> int:
    """The chunk length the kernels run for a requested `chunk_size` (see the module docstring)."""
    return min(MAX_CHUNK, max(MIN_CHUNK, 1 << (max(1, chunk_size).bit_length() - 1)))


Stage = tuple[str, Callable[[], None]]  # (kernel name, launch)


def scan_stages(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
    initial_states: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    chunk_size: int,
    out: torch.Tensor,
    final_states: torch.Tensor | None,
    configs: dict[str, dict[str, int]] | None = None,
) -> list[Stage]:
    """The launches of one prefill, in order, on a freshly allocated workspace (`selective_scan` runs
    them; a benchmark can time each). Arguments as `selective_scan`'s, with at least one token; `configs`
    maps a stage name to the fixed launch configuration its launcher takes instead of the default
    (benchmarks/gpu_sweep_scan.py), and ``configs["layout"]["PRESPLIT"]`` overrides `PRESPLIT`."""
    cfg = configs or {}
    bt, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    chunk = kernel_chunk(chunk_size)
    nchunks = -(-seqlen // chunk)
    presplit = bool(cfg.get("layout", {}).get("PRESPLIT", PRESPLIT)) and C.dtype in (torch.float16, torch.bfloat16)
    state_size = bt * nchunks * nheads * headdim * dstate
    sizes = (state_size,  # fp32 states: each chunk's local, then end state
             state_size if presplit else 0,  # the entering states split in two 16-bit halves (same bytes)
             bt * nchunks * ngroups * chunk * chunk,  # fp32 C B^T per chunk and group
             2 * bt * nheads * nchunks * chunk,  # fp32 processed dt and its chunk-relative cumsum
             bt * nheads * nchunks,  # fp32 carry
             bt * nchunks * chunk if seq_idx is not None else 0)  # int32 segment numbers
    work = torch.empty(sum(sizes), device=x.device, dtype=torch.float32)  # one allocation per call
    states, split, cb, per_token, carry, seg = torch.split(work, sizes)
    states = states.view(bt, nchunks, nheads, headdim, dstate)
    hilo = split.view(C.dtype).view(bt, nchunks, nheads, 2, headdim, dstate) if presplit else None
    cb = cb.view(bt, nchunks, ngroups, chunk, chunk)
    per_token = per_token.view(2, bt, nheads, nchunks, chunk)
    carry = carry.view(bt, nheads, nchunks)
    segs = seg.view(torch.int32).view(bt, nchunks, chunk) if seq_idx is not None else None
    stages: list[Stage] = [
        ("chunk_state", lambda: chunk_state(x, dt, A, B, dt_bias, dt_softplus, dt_limit, seq_idx, chunk, states,
                                            per_token[0], per_token[1], segs if segs is not None else carry,
                                            carry, cfg.get("chunk_state"))),
        ("chunk_cb", lambda: chunk_cb(C, B, chunk, cb)),
    ]
    if nchunks > 1 or final_states is not None or (presplit and initial_states is not None):  # else none reads
        stages.append(("state_passing", lambda: state_passing(states, carry, initial_states, final_states,
                                                              cfg.get("state_passing"), hilo)))
    stages.append(("chunk_scan", lambda: chunk_scan(x, z, C, D, cb, states, initial_states, per_token[0],
                                                    per_token[1], segs, chunk, out, cfg.get("chunk_scan"), hilo)))
    return stages


def selective_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
    initial_states: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    chunk_size: int,
    out: torch.Tensor,
    final_states: torch.Tensor | None,
) -> None:
    """Mamba-2 SSD prefill into `out` (and `final_states`), with the operator's calling convention.

    Shapes: x, z, out ``[Bt, L, H, P]``; dt ``[Bt, L, H]``; A ``[H]`` fp32; B, C ``[Bt, L, G, N]``;
    D ``[H]`` or ``[H, P]``; dt_bias ``[H]``; seq_idx int32 ``[Bt, L]``; states fp32 ``[Bt, H, P, N]``.
    Any strides; `chunk_size` goes through `kernel_chunk`. States and every product stay fp32 (16-bit
    operands times fp32 ones run as two tensor-core products); only `out` is rounded to x's dtype.
    Peer: mamba_ssm's ``mamba_chunk_scan_combined``.

    Raises:
        ValueError: N or P above 256 (the capability gates them first).
    """
    headdim, dstate = x.shape[-1], B.shape[-1]
    if dstate > MAX_D_STATE or headdim > MAX_HEAD_DIM:
        raise ValueError(f"triton selective_scan: d_state={dstate} or head_dim={headdim} above 256")
    if x.shape[0] == 0 or x.shape[1] == 0:
        if final_states is not None:
            if initial_states is None:
                final_states.zero_()
            else:
                final_states.copy_(initial_states)
        return
    for _, launch in scan_stages(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, seq_idx,
                                 chunk_size, out, final_states):
        launch()


IMPLEMENTATIONS = [
    Implementation(
        "selective_scan", "triton", "triton.ssd_chunked",
        Capability(
            *base_constraints(),
            ComputeCapability((8, 0)),  # bf16 and TF32 tensor cores (fp32 runs as tf32x3)
            OneOf("dtype", ("float16", "bfloat16", "float32")),
            Between("head_dim", 1, MAX_HEAD_DIM),
            Between("d_state", 1, MAX_D_STATE, fix="use the torch provider for d_state > 256"),
        ),
        PRIORITY,
        selective_scan,
    ),
    *STATE_UPDATE_IMPLEMENTATIONS,
]
