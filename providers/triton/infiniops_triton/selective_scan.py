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

A packed row (``cu_seqlens``) is cut into chunks that never span two sequences, as vLLM's varlen SSD cuts
them (`varlen_table`: at most ``L // chunk + S`` chunks, a bound known from the shapes, so nothing is read
on the host; the trailing ones are empty). Step 1 runs on those chunks; then, on the device, each
sequence's first chunk gets its initial state's decayed contribution added to its end state and a
restart flag (``carry = -1``), so step 2 passes no state from one sequence to the next; step 3 starts each
sequence's first chunk from its initial state; each sequence's final state is the state at the end of its
last chunk. The entering states are not presplit there.

Inputs with an inf or NaN: they propagate within their sequence as in the reference; across a
``seq_idx`` restart the entering state is dropped (never multiplied by 0), but a non-finite x of one
sequence can still reach the later rows of another sequence in the same chunk (``0 * inf`` inside the
chunk scan's tile product).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from infiniops_py import Between, Capability, ComputeCapability, Implementation, OneOf
from infiniops_py.operators.selective_scan import ScanVarlen
from infiniops_triton._common import PRIORITY, base_constraints
from infiniops_triton._ssd_bmm import chunk_cb
from infiniops_triton._ssd_chunk_scan import STATE_PRODUCT, chunk_scan
from infiniops_triton._ssd_chunk_state import chunk_state
from infiniops_triton._ssd_common import ROUND, SPLIT
from infiniops_triton._ssd_state_passing import state_passing
from infiniops_triton.state_update import IMPLEMENTATIONS as STATE_UPDATE_IMPLEMENTATIONS

__all__ = ["IMPLEMENTATIONS", "MAX_D_STATE", "MAX_HEAD_DIM", "PRESPLIT", "kernel_chunk", "scan_stages",
           "selective_scan", "varlen_table"]

MIN_CHUNK, MAX_CHUNK = 16, 256  # 16: tl.dot's smallest tile; 256: the largest tuned
MAX_D_STATE = 256  # the chunk-scan kernel holds all of N in one tile
MAX_HEAD_DIM = 256
PRESPLIT = False  # 16-bit inputs: step 2 stores the states split for step 3's products; not yet measured on a GPU


def kernel_chunk(chunk_size: int) -> int:
    """The chunk length the kernels run for a requested `chunk_size` (see the module docstring)."""
    return min(MAX_CHUNK, max(MIN_CHUNK, 1 << (max(1, chunk_size).bit_length() - 1)))


Stage = tuple[str, Callable[[], None]]  # (kernel name, launch)


def varlen_table(cu_seqlens: torch.Tensor, length: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunks of a packed row: ``(table, last)``, computed on the device without a host sync.

    `table` is int32 ``[4, nc]`` with ``nc = length // chunk + S``: each chunk's first token, its length
    (0 for the trailing unused chunks), whether it starts a sequence, and its sequence; sequence i takes
    ``ceil(len_i / chunk)`` consecutive chunks of its own. `last` is int64 ``[S]``: the last chunk of each
    sequence (-1 for an empty one). The bounds are first clamped into ``[0, length]`` and made
    non-decreasing, so a cu_seqlens that does not cut the row (unchecked) gives unspecified numbers, never
    an out-of-bounds access (the chunks then still number at most ``nc``). Needs S >= 1.
    """
    device = cu_seqlens.device
    cu = cu_seqlens.long().clamp(0, length).cummax(0).values
    sequences = cu.shape[0] - 1
    lens = (cu[1:] - cu[:-1]).clamp(min=0)
    counts = -(-lens // chunk)
    ends = counts.cumsum(0)
    firsts = ends - counts
    nc = length // chunk + sequences
    c = torch.arange(nc, device=device)
    seq = torch.searchsorted(ends, c, right=True)
    used = seq < sequences
    seq = seq.clamp(max=sequences - 1)
    j = c - firsts[seq]
    start = torch.where(used, cu[seq] + j * chunk, length).clamp(0, length)
    size = torch.minimum(cu[seq + 1] - start, torch.full_like(start, chunk)).clamp(min=0)
    size = torch.where(used, torch.minimum(size, length - start), 0)
    table = torch.stack([start, size, (used & (j == 0)).long(), seq]).to(torch.int32)
    return table, torch.where(counts > 0, ends - 1, -1)


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
    varlen: ScanVarlen | None = None,
) -> list[Stage]:
    """The launches of one prefill, in order, on a freshly allocated workspace (`selective_scan` runs
    them; a benchmark can time each). Arguments as `selective_scan`'s, with at least one token; `configs`
    maps a stage name to the fixed launch configuration its launcher takes instead of the default
    (benchmarks/gpu_sweep_scan.py), and ``configs["layout"]["PRESPLIT"]`` overrides `PRESPLIT`. A packed
    row (`varlen`) adds two device-side steps of torch glue: ``varlen_restart`` after step 1 and
    ``varlen_states`` after step 2."""
    cfg = configs or {}
    bt, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    chunk = kernel_chunk(chunk_size)
    table = last = None
    if varlen is None:
        nchunks = -(-seqlen // chunk)
    else:
        table, last = varlen_table(varlen.cu_seqlens, seqlen, chunk)
        nchunks = table.shape[1]
    presplit = (bool(cfg.get("layout", {}).get("PRESPLIT", PRESPLIT)) and C.dtype in (torch.float16, torch.bfloat16)
                and varlen is None)
    state_size = bt * nchunks * nheads * headdim * dstate
    sizes = (state_size,  # fp32 states: each chunk's local, then end state
             state_size if presplit else 0,  # the entering states split in two 16-bit halves (same bytes)
             bt * nchunks * ngroups * chunk * chunk,  # fp32 C B^T per chunk and group
             2 * bt * nheads * nchunks * chunk,  # fp32 processed dt and its chunk-relative cumsum
             bt * nheads * nchunks,  # fp32 carry
             bt * nchunks * chunk if seq_idx is not None else 0)  # int32 segment numbers
    work = torch.empty(sum(sizes), device=x.device, dtype=torch.float32)  # one allocation per call
    states, split, cb, per_token, carry, seg = work.split_with_sizes(sizes)  # torch.split's Python layers skipped
    states = states.view(bt, nchunks, nheads, headdim, dstate)
    hilo = split.view(C.dtype).view(bt, nchunks, nheads, 2, headdim, dstate) if presplit else None
    cb = cb.view(bt, nchunks, ngroups, chunk, chunk)
    per_token = per_token.view(2, bt, nheads, nchunks, chunk)
    carry = carry.view(bt, nheads, nchunks)
    segs = seg.view(torch.int32).view(bt, nchunks, chunk) if seq_idx is not None else None
    passed_init = initial_states if varlen is None else None  # a packed row's enter through varlen_restart
    # A chunk scan that rounds the presplit state to 16 bits reads its high halves alone: the low ones go unwritten.
    store_lo = cfg.get("chunk_scan", {}).get("STATE_PRODUCT", STATE_PRODUCT.get(C.dtype, SPLIT)) != ROUND
    stages: list[Stage] = [
        ("chunk_state", lambda: chunk_state(x, dt, A, B, dt_bias, dt_softplus, dt_limit, seq_idx, chunk, states,
                                            per_token[0], per_token[1], segs if segs is not None else carry,
                                            carry, cfg.get("chunk_state"), table)),
        ("chunk_cb", lambda: chunk_cb(C, B, chunk, cb, table)),
    ]
    if table is not None:
        stages.append(("varlen_restart", lambda: _varlen_restart(states, carry, table, initial_states)))
    want_states = varlen is not None and varlen.varlen_states is not None
    if nchunks > 1 or final_states is not None or want_states or (presplit and passed_init is not None):
        stages.append(("state_passing", lambda: state_passing(states, carry, passed_init, final_states,
                                                              cfg.get("state_passing"), hilo, store_lo)))
    if want_states:
        stages.append(("varlen_states", lambda: _varlen_states(states, last, initial_states, varlen.varlen_states)))
    stages.append(("chunk_scan", lambda: chunk_scan(x, z, C, D, cb, states, initial_states, per_token[0],
                                                    per_token[1], segs, chunk, out, cfg.get("chunk_scan"), hilo,
                                                    table)))
    return stages


def _varlen_restart(states: torch.Tensor, carry: torch.Tensor, table: torch.Tensor,
                    initial_states: torch.Tensor | None) -> None:
    """Each sequence's first chunk: add its initial state, decayed over the chunk, to the chunk's end state
    (unless a seq_idx restart in the chunk drops it: carry < 0), and mark the chunk a restart (carry = -1)."""
    opens = table[2].bool()  # [nc]
    if initial_states is not None:
        decay = torch.where(opens & (carry[0] >= 0), carry[0], 0.0)  # [H, nc]
        states[0].add_(decay.t()[:, :, None, None] * initial_states.index_select(0, table[3].long()))
    carry.masked_fill_(opens.view(1, 1, -1), -1.0)


def _varlen_states(states: torch.Tensor, last: torch.Tensor, initial_states: torch.Tensor | None,
                   varlen_states: torch.Tensor) -> None:
    """Each sequence's final state: the state at the end of its last chunk (an empty one keeps its initial
    state, or zeros)."""
    ends = states[0].index_select(0, last.clamp(min=0))  # [S, H, P, N]
    empty = (last < 0).view(-1, 1, 1, 1)
    first = torch.zeros_like(ends) if initial_states is None else initial_states.to(ends.dtype)
    varlen_states.copy_(torch.where(empty, first, ends))


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
    varlen: ScanVarlen | None = None,
) -> None:
    """Mamba-2 SSD prefill into `out` (and `final_states`), with the operator's calling convention.

    Shapes: x, z, out ``[Bt, L, H, P]``; dt ``[Bt, L, H]``; A ``[H]`` fp32; B, C ``[Bt, L, G, N]``;
    D ``[H]`` or ``[H, P]``; dt_bias ``[H]``; seq_idx int32 ``[Bt, L]``; states fp32 ``[Bt, H, P, N]``.
    Any strides; `chunk_size` goes through `kernel_chunk`. States and every product stay fp32 (16-bit
    operands times fp32 ones run as two tensor-core products); only `out` is rounded to x's dtype. A packed
    row (`varlen`, Bt == 1) takes per-sequence initial states ``[S, H, P, N]`` and fills the sequences'
    final states (see the module docstring). Peer: mamba_ssm's ``mamba_chunk_scan_combined``.

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
    if varlen is not None and varlen.cu_seqlens.shape[0] == 1:  # tokens but no sequence (unchecked mode): none
        out.zero_()
        return
    for _, launch in scan_stages(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, seq_idx,
                                 chunk_size, out, final_states, varlen=varlen):
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
