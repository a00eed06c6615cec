"""Host cost and no-sync behaviour of every public entry point on the GPU, against each operator's peer.

    python3 benchmarks/gpu_host_cost.py [--write FILE] [--json FILE] [--only gemm,add,...] [--calls 50] [--rounds 5]
    python3 benchmarks/gpu_host_cost.py --smoke [--only ...]   # every case on the CPU at small sizes (a dry run)
    python3 benchmarks/gpu_host_cost.py --only flash_attn_with_kvcache --profile 200   # where the host time goes

One row per case (bf16; the sizes are in each case's name: a Llama-8B-class layer as in benchmarks/ops.py,
Mamba-2-130m's for the SSM operators), our public call (``infiniops_py.<op>``, the resolver's choice unless
``--provider``, index checks at their CUDA default: off) and the peer's own entry point on the same inputs,
each timed three ways:

- host us: ``time.perf_counter`` around `calls` back-to-back calls with no synchronization inside (the
  device is synchronized before the clock starts and again after it stops), per call: the CPU time a call
  takes to return, i.e. its issue cost;
- b2b us: CUDA events around `calls` back-to-back calls, per call: the throughput a caller gets (the issue
  cost where that is longer than the kernels);
- host us, plain launch: the host column again with the Triton provider's fast launch path off
  (``infiniops_triton._fastlaunch.set_enabled(False)``: every kernel through ``kernel[grid](...)``), so one
  run shows that path's gain ("-" where the path is not in use, e.g. ``INFINIOPS_TRITON_FASTLAUNCH=0``);
- graph us: the call captured once in a ``torch.cuda.CUDAGraph``, CUDA events around `calls` replays, per
  replay: the device time without launch overhead.

Each figure is the median of `rounds` rounds, after a warm-up (Triton compiles and autotunes there), with
the garbage collector off. Then, for our call (sync-free for the peer's too):

- checked us: wall time per call (synchronized after the last one) under ``infiniops_py.checked_indices()``,
  the synchronous opt-in range checks, for the entry points with index tensors;
- sync-free: one warm call under ``torch.cuda.set_sync_debug_mode("error")``: "yes" when it raised nothing
  (the mode sees PyTorch's implicit synchronizations: ``.item()``, ``.tolist()``, blocking copies; not an
  explicit ``torch.cuda.synchronize()``). The checked call is run so too, as the mode's control: it must
  report "syncs".

Targets (our call; PASS/MISS, "-" where they do not apply):

- host: <= the peer's host time + 10 us where the peer is one PyTorch op, <= the peer's where it is a
  Python function of several kernels or a Triton launcher;
- b2b: within 5% of graph replay where the replay takes >= 50 us.

Peers: rms_norm ``F.rms_norm``; add ``torch.add``; gemm ``F.linear`` (``trans_b``: the ``nn.Linear`` weight);
reshape_and_cache_flash two ``index_copy_`` into the caches viewed as ``[slots, Hkv, D]``; flash_attn_varlen
``F.scaled_dot_product_attention(is_causal=True)`` on ``[B, H, L, D]`` views of the same q/k/v;
flash_attn_with_kvcache SDPA (``enable_gqa``) over a dense ``[B, Hkv, ctx, D]`` cache of the same bytes;
selective_scan and selective_state_update state-spaces/mamba's Triton ``mamba_chunk_scan_combined`` and
``selective_state_update`` (tied head dims as stride-0 views), imported from ``.peers/`` at the repository
root when that folder exists ("peer not importable: ..." otherwise); causal_conv1d ``F.conv1d`` (groups = D,
padding W - 1, sliced) then ``F.silu``; causal_conv1d_update a gather of the state rows, ``torch.cat`` of the
new column, ``index_put_`` of the shifted window, multiply-sum, bias and ``F.silu``; fused_add_rms_norm
``add_``, ``F.rms_norm``, ``copy_``; fused_qk_norm ``F.rms_norm`` + ``copy_`` of the Q and the K heads;
silu_and_mul vLLM's ``forward_native`` (``F.silu(gate) * up``); rotary_embedding vLLM's ``forward_native``
(``index_select``, ``chunk``, ``cat``) + ``copy_`` for the Q and the K heads; fused_qk_norm_rope ``F.rms_norm``,
then that, for each;
rms_norm_gated transformers' ``MambaRMSNormGated`` (per group); gemm_swiglu ``F.linear`` then SiLU-and-multiply;
gemm_add_rms_norm ``F.linear``, the in-place residual add, then ``F.rms_norm`` with the weight;
rms_norm_gemm ``F.rms_norm`` with the weight, then ``F.linear``;
top_k_top_p_sampling_from_logits a sort-based sampler (topk, softmax, cumsum, multinomial);
all_reduce ``torch.distributed.all_reduce`` over a one-rank gloo group (the host cost of the call alone).

``--profile N`` also prints, after each row, a cProfile of N more calls of ours (the functions with the most
self time, microseconds per call under the profiler, which inflates Python's share): where the host time goes.
``--write`` saves the table with the date, device and versions. Exit status: 0 when every target passed and
nothing of ours crashed or synchronized, 1 otherwise, 2 without a CUDA device. `run(device="cpu",
small=True)` runs every case on the CPU at small sizes (no graph or sync-free columns; the targets mean
nothing there) for the test of this script.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import datetime
import gc
import io
import math
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import infiniops_py as ops
from infiniops_py.dispatch import Dispatched, observing

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py, also when a test loads this file by its path
from _common import Record, captured, json_option, randn, record, write_records

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / ".peers"  # state-spaces/mamba's mamba_ssm/ops/triton (not part of the project, not committed)
BF16 = torch.bfloat16
HOST_SLACK_US = 10.0  # over a one-op peer's host time
GRAPH_SLACK = 1.05  # back-to-back over graph replay
GRAPH_MIN_US = 50.0  # the b2b target applies from this replay time on


@dataclass
class Env:
    """Where and how large the cases are built: `small` sizes (CPU test) or the GPU ones."""

    device: str
    small: bool
    gen: torch.Generator

    def pick(self, full: int, small: int) -> int:
        """`full` on the GPU, `small` for the small run."""
        return small if self.small else full

    def randn(self, *shape: int, dtype: torch.dtype = BF16, scale: float = 1.0) -> torch.Tensor:
        """Standard normal draws times `scale`, in `dtype` (float32 draws, then cast)."""
        return randn(*shape, dtype=dtype, device=self.device, gen=self.gen, scale=scale)

    def perm(self, n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
        """`k` distinct values of ``range(n)`` in random order, as `dtype`."""
        return torch.randperm(n, generator=self.gen, device=self.device)[:k].to(dtype)


@dataclass
class Case:
    """One row: our public call and the peer's on the same inputs (no-argument callables).

    `peer_one_op`: the peer is one PyTorch op (host target: ours <= peer + 10 us), else a Python function
    of several kernels or a Triton launcher (ours <= peer). `indexed`: the call has index tensors (the
    checked column). `peer_error`: why there is no peer call (then `peer` is None).
    """

    name: str
    op: str
    ours: Callable[[], Any]
    peer: Callable[[], Any] | None
    peer_name: str
    peer_one_op: bool
    indexed: bool = False
    peer_error: str = ""


@dataclass
class Timing:
    """Microseconds per call (NaN when not measured), the sync-free verdict, and what failed."""

    host: float = math.nan
    b2b: float = math.nan
    graph: float = math.nan
    sync_free: str = "-"
    errors: list[str] = field(default_factory=list)


@dataclass
class Row:
    """A measured case: our timings, the peer's (None without a peer call), the checked column, our
    call's provider."""

    case: Case
    ours: Timing
    peer: Timing | None
    checked: float = math.nan
    checked_sync: str = "-"
    provider: str = "-"
    plain_host: float = math.nan
    profile: str = ""


# --- the cases ------------------------------------------------------------------------------------------------


def _rms_norm(e: Env) -> list[Case]:
    t, h = e.pick(32768, 64), e.pick(4096, 256)
    x, w = e.randn(t, h), 1 + 0.1 * e.randn(h)
    return [Case(f"rms_norm [{t}, {h}]", "rms_norm", lambda: ops.rms_norm(x, w, 1e-6),
                 lambda: F.rms_norm(x, (h,), w, 1e-6), "F.rms_norm", True)]


def _add(e: Env) -> list[Case]:
    t, h = e.pick(16384, 64), e.pick(8192, 256)
    x, y = e.randn(t, h), e.randn(t, h)
    return [Case(f"add [{t}, {h}]", "add", lambda: ops.add(x, y), lambda: torch.add(x, y), "torch.add", True)]


def _gemm(e: Env) -> list[Case]:
    k, n = e.pick(4096, 64), e.pick(12288, 96)
    w = e.randn(n, k, scale=k**-0.5)
    cases = []
    for m in (1, 32, e.pick(8192, 128)):
        a = e.randn(m, k)
        cases.append(Case(f"gemm M{m} K{k} N{n} trans_b", "gemm",
                          lambda a=a: ops.gemm(a, w, trans_b=True), lambda a=a: F.linear(a, w), "F.linear", True))
    return cases


def _reshape_and_cache_flash(e: Env) -> list[Case]:
    t, hkv, d, bs = e.pick(65536, 48), 8, e.pick(128, 32), 16
    key, value = e.randn(t, hkv, d), e.randn(t, hkv, d)
    blocks = t // bs + 64
    kc = torch.zeros(blocks, bs, hkv, d, device=e.device, dtype=BF16)
    vc = torch.zeros_like(kc)
    slots = e.perm(blocks * bs, t, torch.int64)
    kflat, vflat = kc.view(-1, hkv, d), vc.view(-1, hkv, d)

    def peer() -> None:
        kflat.index_copy_(0, slots, key)
        vflat.index_copy_(0, slots, value)

    return [Case(f"reshape_and_cache_flash T{t} {hkv}h D{d} bs{bs}", "reshape_and_cache_flash",
                 lambda: ops.reshape_and_cache_flash(key, value, kc, vc, slots), peer, "2x index_copy_", False,
                 indexed=True)]


def _flash_attn_varlen(e: Env) -> list[Case]:
    b, s, h, d = 4, e.pick(4096, 32), e.pick(32, 4), e.pick(128, 32)
    q, k, v = e.randn(b * s, h, d), e.randn(b * s, h, d), e.randn(b * s, h, d)
    cu = torch.arange(0, (b + 1) * s, s, device=e.device, dtype=torch.int32)
    q4, k4, v4 = (t.view(b, s, h, d).transpose(1, 2) for t in (q, k, v))  # [B, H, L, D] views, same bytes
    return [Case(f"flash_attn_varlen causal {b}x{s} {h}h D{d}", "flash_attn_varlen",
                 lambda: ops.flash_attn_varlen(q, k, v, cu, cu, s, s, causal=True),
                 lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True), "SDPA causal", True,
                 indexed=True)]


def _flash_attn_with_kvcache(e: Env) -> list[Case]:
    batch, ctx, hq, hkv, d, bs = e.pick(64, 4), e.pick(4096, 64), e.pick(32, 4), e.pick(8, 2), e.pick(128, 32), 16
    per = ctx // bs
    kc, vc = e.randn(batch * per, bs, hkv, d), e.randn(batch * per, bs, hkv, d)
    table = e.perm(batch * per, batch * per, torch.int32).view(batch, per)
    lens = torch.full((batch,), ctx, device=e.device, dtype=torch.int32)
    q = e.randn(batch, 1, hq, d)
    kd, vd = e.randn(batch, hkv, ctx, d), e.randn(batch, hkv, ctx, d)  # the dense cache: as many bytes
    qd = q.transpose(1, 2)  # [B, Hq, 1, D]
    return [Case(f"flash_attn_with_kvcache B{batch} {hq}/{hkv}h ctx{ctx} bs{bs}", "flash_attn_with_kvcache",
                 lambda: ops.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table),
                 lambda: F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True), "SDPA gqa, dense cache",
                 True, indexed=True)]


def _mamba(name: str) -> tuple[Callable[..., Any] | None, str]:
    """state-spaces/mamba's Triton function `name` from ``.peers/``, or None and why it is not importable."""
    if PEERS.is_dir() and str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    try:
        if name == "mamba_chunk_scan_combined":
            from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as fn
        else:
            from mamba_ssm.ops.triton.selective_state_update import selective_state_update as fn
    except Exception as err:  # ImportError (no .peers, no einops) or a version clash at import
        where = "" if PEERS.is_dir() else f" ({PEERS} is missing)"
        return None, f"peer not importable: {type(err).__name__}: {err}{where}"
    return fn, ""


def _selective_scan(e: Env) -> list[Case]:
    bt, ln, h, p, n, chunk = e.pick(8, 2), e.pick(2048, 64), e.pick(24, 4), e.pick(64, 16), e.pick(128, 16), 256
    x, dt = e.randn(bt, ln, h, p), e.randn(bt, ln, h, scale=0.5)
    a = -torch.rand(h, generator=e.gen, device=e.device) - 0.5
    b, c = e.randn(bt, ln, 1, n), e.randn(bt, ln, 1, n)
    d, dt_bias = e.randn(h, dtype=torch.float32), e.randn(h, dtype=torch.float32, scale=0.1)
    fn, error = _mamba("mamba_chunk_scan_combined")
    peer = None if fn is None else (lambda: fn(x, dt, a, b, c, chunk, D=d, dt_bias=dt_bias, dt_softplus=True))
    return [Case(f"selective_scan {bt}x{ln} H{h} P{p} N{n} G1 chunk{chunk}", "selective_scan",
                 lambda: ops.selective_scan(x, dt, a, b, c, D=d, dt_bias=dt_bias, dt_softplus=True, chunk_size=chunk),
                 peer, "mamba_chunk_scan_combined", False, peer_error=error)]


def _selective_state_update(e: Env) -> list[Case]:
    batch, slots, h, p, n = e.pick(64, 4), e.pick(256, 8), e.pick(24, 4), e.pick(64, 16), e.pick(128, 16)
    state = e.randn(slots, h, p, n, dtype=torch.float32)
    x, dt = e.randn(batch, h, p), e.randn(batch, h, scale=0.5)
    a = -torch.rand(h, generator=e.gen, device=e.device) - 0.5
    b, c = e.randn(batch, 1, n), e.randn(batch, 1, n)
    d, dt_bias = e.randn(h, dtype=torch.float32), e.randn(h, dtype=torch.float32, scale=0.1)
    idx = e.perm(slots, batch, torch.int32)
    fn, error = _mamba("selective_state_update")
    # mamba's per-(head, dim) arguments, tied along the head dim as stride-0 views (as its Mamba2 module does)
    dt_t, a_t = dt[:, :, None].expand(batch, h, p), a[:, None, None].expand(h, p, n)
    d_t, bias_t = d[:, None].expand(h, p), dt_bias[:, None].expand(h, p)
    peer = None if fn is None else (lambda: fn(state, x, dt_t, a_t, b, c, D=d_t, dt_bias=bias_t, dt_softplus=True,
                                               state_batch_indices=idx))
    return [Case(f"selective_state_update B{batch} of {slots} H{h} P{p} N{n} fp32 state", "selective_state_update",
                 lambda: ops.selective_state_update(state, x, dt, a, b, c, D=d, dt_bias=dt_bias, dt_softplus=True,
                                                    state_batch_indices=idx),
                 peer, "mamba selective_state_update", False, indexed=True, peer_error=error)]


def _causal_conv1d(e: Env) -> list[Case]:
    b, dim, ln, width = e.pick(8, 2), e.pick(4096, 64), e.pick(2048, 40), 4
    x, w, bias = e.randn(b, dim, ln), e.randn(dim, width, scale=0.5), e.randn(dim)
    w3 = w.unsqueeze(1)  # [D, 1, W]: F.conv1d's depthwise weight
    return [Case(f"causal_conv1d B{b} D{dim} L{ln} W{width} silu", "causal_conv1d",
                 lambda: ops.causal_conv1d(x, w, bias, activation="silu"),
                 lambda: F.silu(F.conv1d(x, w3, bias, padding=width - 1, groups=dim)[..., :ln]), "F.conv1d + F.silu",
                 False)]


def _causal_conv1d_update(e: Env) -> list[Case]:
    b, slots, dim, width = e.pick(64, 4), e.pick(256, 8), e.pick(4096, 64), 4
    x, w, bias = e.randn(b, dim), e.randn(dim, width, scale=0.5), e.randn(dim)
    state = e.randn(slots, dim, width - 1)
    idx = e.perm(slots, b, torch.int32)

    def peer() -> torch.Tensor:
        window = torch.cat([state[idx], x.unsqueeze(-1)], dim=-1)  # [B, D, W]
        state[idx] = window[..., 1:]
        return F.silu((window * w).sum(-1) + bias)

    return [Case(f"causal_conv1d_update B{b} of {slots} D{dim} W{width} silu", "causal_conv1d_update",
                 lambda: ops.causal_conv1d_update(x, state, w, bias, activation="silu", conv_state_indices=idx),
                 peer, "gather, cat, index_put_, sum, F.silu", False, indexed=True)]


def _fused_add_rms_norm(e: Env) -> list[Case]:
    t, h = e.pick(32768, 64), e.pick(4096, 256)
    x, r, w = e.randn(t, h), e.randn(t, h), 1 + 0.1 * e.randn(h)

    def peer() -> None:
        r.add_(x)
        x.copy_(F.rms_norm(r, (h,), w, 1e-6))

    return [Case(f"fused_add_rms_norm [{t}, {h}]", "fused_add_rms_norm", lambda: ops.fused_add_rms_norm(x, r, w, 1e-6),
                 peer, "add_, F.rms_norm, copy_", False)]


def _fused_qk_norm(e: Env) -> list[Case]:
    t, hq, hkv, d = e.pick(24576, 16), e.pick(32, 4), e.pick(8, 2), e.pick(128, 32)
    qkv = e.randn(t, (hq + 2 * hkv) * d)
    qw, kw = 1 + 0.1 * e.randn(d), 1 + 0.1 * e.randn(d)

    def peer() -> None:
        q, k = qkv[:, :hq * d].view(t, hq, d), qkv[:, hq * d:(hq + hkv) * d].view(t, hkv, d)
        q.copy_(F.rms_norm(q, (d,), qw, 1e-6))
        k.copy_(F.rms_norm(k, (d,), kw, 1e-6))

    return [Case(f"fused_qk_norm T{t} {hq}/{hkv}h D{d}", "fused_qk_norm",
                 lambda: ops.fused_qk_norm(qkv, qw, kw, num_q_heads=hq, num_kv_heads=hkv, head_dim=d),
                 peer, "2x (F.rms_norm, copy_)", False)]


def _silu_and_mul(e: Env) -> list[Case]:
    t, d = e.pick(4096, 32), e.pick(14336, 96)
    x = e.randn(t, 2 * d)
    return [Case(f"silu_and_mul [{t}, 2x{d}]", "silu_and_mul", lambda: ops.silu_and_mul(x),
                 lambda: F.silu(x[:, :d]) * x[:, d:], "F.silu * (vLLM forward_native)", False)]


def _gemm_swiglu(e: Env) -> list[Case]:
    t, k, d = e.pick(1, 1), e.pick(1024, 32), e.pick(3072, 48)  # a Qwen3-0.6B decode MLP row
    x, w = e.randn(t, k), e.randn(2 * d, k, scale=k**-0.5)

    def peer() -> torch.Tensor:
        gu = F.linear(x, w)
        return F.silu(gu[:, :d]) * gu[:, d:]

    return [Case(f"gemm_swiglu [{t}, {k}] x [{2 * d}, {k}]", "gemm_swiglu", lambda: ops.gemm_swiglu(x, w), peer,
                 "F.linear, F.silu * (HF's act_fn(gate) * up)", False)]


def _gemm_add_rms_norm(e: Env) -> list[Case]:
    t, k, n = e.pick(1, 1), e.pick(3072, 48), e.pick(1024, 32)  # a Qwen3-0.6B down projection into the residual
    x, w, r, nw = e.randn(t, k), e.randn(n, k, scale=k**-0.5), e.randn(t, n), e.randn(n)

    def peer() -> torch.Tensor:
        r.add_(F.linear(x, w))
        return F.rms_norm(r, (n,), nw, 1e-6)

    return [Case(f"gemm_add_rms_norm [{t}, {k}] x [{n}, {k}]", "gemm_add_rms_norm",
                 lambda: ops.gemm_add_rms_norm(x, w, r, nw, 1e-6), peer,
                 "F.linear, add_, F.rms_norm (vLLM's fused_add_rms_norm after the projection)", False)]


def _rms_norm_gemm(e: Env) -> list[Case]:
    t, k, n = e.pick(1, 1), e.pick(1024, 32), e.pick(4096, 48)  # a Qwen3-0.6B qkv projection after its norm
    x, nw, w = e.randn(t, k), e.randn(k), e.randn(n, k, scale=k**-0.5)
    return [Case(f"rms_norm_gemm [{t}, {k}] x [{n}, {k}]", "rms_norm_gemm", lambda: ops.rms_norm_gemm(x, nw, w),
                 lambda: F.linear(F.rms_norm(x, (k,), nw, 1e-6), w),
                 "F.rms_norm, F.linear (vLLM's RMSNorm then the linear layer)", False)]


def _sampling(e: Env) -> list[Case]:
    b, v = e.pick(32, 4), e.pick(151936, 256)
    logits = e.randn(b, v)
    seed = torch.arange(b, dtype=torch.int64, device=e.device)

    def peer() -> torch.Tensor:  # a sort-based sampler: temperature, top-k, top-p, one multinomial
        z = (logits.float() / 0.8).topk(50, dim=-1)
        probs = torch.softmax(z.values, -1)
        keep = probs.cumsum(-1) - probs < 0.9
        return z.indices.gather(1, torch.multinomial(probs * keep, 1))

    return [Case(f"top_k_top_p_sampling_from_logits [{b}, {v}]", "top_k_top_p_sampling_from_logits",
                 lambda: ops.top_k_top_p_sampling_from_logits(logits, 50, 0.9, temperature=0.8, seed=seed,
                                                              offset=seed),
                 peer, "topk, softmax, cumsum, multinomial (a sort-based sampler)", False)]


def _native_gated_norm(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor, groups: int) -> torch.Tensor:
    """transformers' ``MambaRMSNormGated.forward`` per group (mamba_ssm's ``norm_before_gate=False``)."""
    y = (x.float() * F.silu(z.float())).unflatten(-1, (groups, -1))
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5)
    return w * y.flatten(-2).to(x.dtype)


def _rms_norm_gated(e: Env) -> list[Case]:
    t, h, groups = e.pick(64, 4), e.pick(5120, 64), e.pick(8, 2)  # Mamba-2-2.7b's d_inner in 8 groups
    x, z, w = e.randn(t, h), e.randn(t, h), e.randn(h)
    return [Case(f"rms_norm_gated [{t}, {h}] / {groups} groups", "rms_norm_gated",
                 lambda: ops.rms_norm_gated(x, w, None, z=z, eps=1e-5, group_size=h // groups,
                                            norm_before_gate=False),
                 lambda: _native_gated_norm(x, z, w, groups), "MambaRMSNormGated (transformers)", False)]


def _native_rope(positions: torch.Tensor, x: torch.Tensor, head_dim: int, cache: torch.Tensor) -> torch.Tensor:
    """vLLM's ``RotaryEmbedding.forward_native`` (NeoX, whole head): a new ``[T, H * D]`` tensor."""
    cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
    x = x.reshape(positions.shape[0], -1, head_dim)
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(1)


def _rope_inputs(e: Env) -> tuple[int, int, int, int, torch.Tensor, torch.Tensor, torch.Tensor]:
    t, hq, hkv, d = e.pick(32768, 16), e.pick(32, 4), e.pick(8, 2), e.pick(128, 32)
    positions = torch.randint(0, 8192, (t,), generator=e.gen, device=e.device)  # the generator is on e.device
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.arange(8192, dtype=torch.float32)[:, None] * inv
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1).to(device=e.device, dtype=BF16)
    return t, hq, hkv, d, e.randn(t, (hq + 2 * hkv) * d), positions, cache


def _rotary_embedding(e: Env) -> list[Case]:
    t, hq, hkv, d, qkv, positions, cache = _rope_inputs(e)
    q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hkv) * d]

    def peer() -> None:
        q.copy_(_native_rope(positions, q, d, cache))
        k.copy_(_native_rope(positions, k, d, cache))

    return [Case(f"rotary_embedding T{t} {hq}/{hkv}h D{d} neox", "rotary_embedding",
                 lambda: ops.rotary_embedding(positions, q, k, d, cache, True), peer,
                 "2x (vLLM forward_native, copy_)", False, indexed=True)]


def _all_reduce(e: Env) -> list[Case]:
    import torch.distributed as dist

    from infiniops_py.testing.strategies.all_reduce import one_rank_group

    t, h, group = e.pick(32, 8), e.pick(4096, 64), one_rank_group()
    x = e.randn(t, h)
    return [Case(f"all_reduce [{t}, {h}] world size 1", "all_reduce", lambda: ops.all_reduce(x, group=group),
                 lambda: dist.all_reduce(x, group=group), "torch.distributed.all_reduce", True)]


def _fused_qk_norm_rope(e: Env) -> list[Case]:
    t, hq, hkv, d, qkv, positions, cache = _rope_inputs(e)
    qw, kw = 1 + 0.1 * e.randn(d), 1 + 0.1 * e.randn(d)
    q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hkv) * d]

    def peer() -> None:
        q.copy_(_native_rope(positions, F.rms_norm(q.view(t, hq, d), (d,), qw, 1e-6), d, cache))
        k.copy_(_native_rope(positions, F.rms_norm(k.view(t, hkv, d), (d,), kw, 1e-6), d, cache))

    return [Case(f"fused_qk_norm_rope T{t} {hq}/{hkv}h D{d} neox", "fused_qk_norm_rope",
                 lambda: ops.fused_qk_norm_rope(qkv, qw, kw, cache, positions, num_q_heads=hq, num_kv_heads=hkv,
                                                head_dim=d),
                 peer, "2x (F.rms_norm, vLLM forward_native, copy_)", False, indexed=True)]


# The entry points, in the order of the table; each builds its cases (inputs and both calls) when it runs.
BUILDERS: dict[str, Callable[[Env], list[Case]]] = {
    "rms_norm": _rms_norm,
    "add": _add,
    "gemm": _gemm,
    "reshape_and_cache_flash": _reshape_and_cache_flash,
    "flash_attn_varlen": _flash_attn_varlen,
    "flash_attn_with_kvcache": _flash_attn_with_kvcache,
    "selective_scan": _selective_scan,
    "selective_state_update": _selective_state_update,
    "causal_conv1d": _causal_conv1d,
    "causal_conv1d_update": _causal_conv1d_update,
    "fused_add_rms_norm": _fused_add_rms_norm,
    "fused_qk_norm": _fused_qk_norm,
    "silu_and_mul": _silu_and_mul,
    "gemm_swiglu": _gemm_swiglu,
    "gemm_add_rms_norm": _gemm_add_rms_norm,
    "rms_norm_gemm": _rms_norm_gemm,
    "rms_norm_gated": _rms_norm_gated,
    "top_k_top_p_sampling_from_logits": _sampling,
    "rotary_embedding": _rotary_embedding,
    "fused_qk_norm_rope": _fused_qk_norm_rope,
    "all_reduce": _all_reduce,
}


# --- measurement ------------------------------------------------------------------------------------------------


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def host_us(fn: Callable[[], Any], device: str, calls: int, rounds: int) -> float:
    """Median over `rounds` of the host microseconds per call of `calls` back-to-back calls: the clock stops
    when the last call returns, the device catches up after that."""
    samples = []
    for _ in range(rounds):
        _sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        _sync(device)
    return statistics.median(samples)


def wall_us(fn: Callable[[], Any], device: str, calls: int, rounds: int) -> float:
    """Median over `rounds` of the wall microseconds per call of `calls` calls, the device synchronized
    before the clock starts and before it stops."""
    samples = []
    for _ in range(rounds):
        _sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def events_us(fn: Callable[[], Any], calls: int, rounds: int) -> float:
    """Median over `rounds` of CUDA-event microseconds per call of `calls` back-to-back calls (CUDA only)."""
    samples = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / calls)
    return statistics.median(samples)


def graph_us(fn: Callable[[], Any], calls: int, rounds: int) -> float:
    """Microseconds per replay of one call of `fn` captured in a CUDA graph (`events_us` of the replays).

    `fn` runs once on a side stream first, then is captured (`_common.captured`); the graph and its memory
    pool are dropped at return.
    """
    with captured(fn) as graph:
        return events_us(graph.replay, calls, rounds)


def sync_free(fn: Callable[[], Any], errors: list[str]) -> str:
    """Whether one call of `fn` synchronizes, under ``torch.cuda.set_sync_debug_mode("error")``: "yes" (it
    raised nothing), "syncs" (the mode raised), or "?" after appending to `errors` what else `fn` raised.
    The mode is reset to "default" at return (CUDA only)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except Exception as err:
        if isinstance(err, RuntimeError) and "called a synchronizing" in str(err):
            return "syncs"
        errors.append(f"sync-free: {type(err).__name__}: {_first_line(err)}")
        return "?"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return "yes"


def _first_line(err: BaseException) -> str:
    text = str(err)
    return text.splitlines()[0][:100] if text else ""


def _attempt(timing: Timing, what: str, measure: Callable[[], Any]) -> Any:
    """`measure()`, or NaN after noting in `timing` why it failed: one failed column never stops a row."""
    try:
        return measure()
    except Exception as err:  # shown in the row's notes
        timing.errors.append(f"{what}: {type(err).__name__}: {_first_line(err)}")
        return math.nan


def measure(fn: Callable[[], Any], device: str, calls: int, rounds: int, warmup: int = 3) -> Timing:
    """Host, back-to-back and graph-replay microseconds per call of `fn`, and its sync-free verdict (the
    last two on CUDA only; back-to-back is `wall_us` on the CPU). A failing warm-up ends the measurement."""
    timing = Timing()
    _attempt(timing, "warm-up", lambda: [fn() for _ in range(warmup)])
    if timing.errors:
        return timing
    _sync(device)
    gc.disable()
    try:
        timing.host = _attempt(timing, "host", lambda: host_us(fn, device, calls, rounds))
        if device == "cuda":
            timing.b2b = _attempt(timing, "b2b", lambda: events_us(fn, calls, rounds))
            timing.graph = _attempt(timing, "graph", lambda: graph_us(fn, calls, rounds))
        else:
            timing.b2b = _attempt(timing, "b2b", lambda: wall_us(fn, device, calls, rounds))
    finally:
        gc.enable()
    if device == "cuda":
        timing.sync_free = sync_free(fn, timing.errors)
    return timing


def served_by(fn: Callable[[], Any]) -> str:
    """The providers that served one call of `fn` (comma-separated, in call order), observed for that call only."""
    seen: list[str] = []

    def record(call: Dispatched) -> None:
        if call.impl.provider not in seen:
            seen.append(call.impl.provider)

    with observing(record):
        fn()
    return ",".join(seen) or "-"


def checked_calls(calls: int) -> int:
    """Calls per round of the checked column: a fifth of `calls` (at least 1), each synchronizes."""
    return max(1, calls // 5)


def _checked(fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        with ops.checked_indices():
            return fn()

    return call


@contextlib.contextmanager
def plain_launch() -> Iterator[bool]:
    """Within: the Triton provider's fast launch path (``infiniops_triton._fastlaunch``) off. Yields whether
    that path was in use (False: not installed, the interpreter, ``INFINIOPS_TRITON_FASTLAUNCH=0``, another
    Triton), so that the comparison means something."""
    try:
        from infiniops_triton import _fastlaunch
    except ImportError:
        yield False
        return
    previous = _fastlaunch.set_enabled(False)
    try:
        yield previous
    finally:
        _fastlaunch.set_enabled(previous)


def measure_case(case: Case, device: str, calls: int, rounds: int) -> Row:
    """Every column of one case: ours, the peer's, and for an indexed case the checked wall time (fewer
    calls: each one synchronizes) and whether the checked call synchronizes."""
    row = Row(case, measure(case.ours, device, calls, rounds), None)
    if math.isfinite(row.ours.host):  # it ran
        provider = _attempt(row.ours, "provider", lambda: served_by(case.ours))
        row.provider = provider if isinstance(provider, str) else "?"
        if device == "cuda":  # the same call through Triton's own launch path (issue #25)
            with plain_launch() as compared:
                if compared:
                    gc.disable()
                    try:
                        row.plain_host = _attempt(row.ours, "plain launch",
                                                  lambda: host_us(case.ours, device, calls, rounds))
                    finally:
                        gc.enable()
        if case.indexed:
            checked = _checked(case.ours)
            row.checked = _attempt(row.ours, "checked", lambda: wall_us(checked, device, checked_calls(calls), rounds))
            if device == "cuda":
                row.checked_sync = sync_free(checked, row.ours.errors)
    if case.peer is not None:
        row.peer = measure(case.peer, device, calls, rounds)
    return row


def _freed() -> None:
    raise RuntimeError("this case's inputs were freed after it was measured (run(..., keep_calls=True) keeps them)")


def run(device: str = "cuda", small: bool = False, only: Sequence[str] | None = None, calls: int = 50,
        rounds: int = 5, provider: str | None = None, progress: bool = False, keep_calls: bool = False,
        profile: int = 0) -> list[Row]:
    """Build and measure the cases of `only` (entry point names; all when None) one entry point at a time,
    freeing its inputs (and the CUDA cache) before the next: each row's calls are then replaced by one that
    raises, unless `keep_calls`. `provider` forces one provider for our calls (``infiniops_py.use``). With
    `progress`, print each row as it is measured (and its profile). `profile` > 0: each row's `Row.profile` is
    `profiled` over that many calls of ours. Runs under ``no_grad``.

    Raises:
        KeyError: a name in `only` is not an entry point of `BUILDERS`.
    """
    names = list(BUILDERS) if only is None else list(only)
    for name in names:
        if name not in BUILDERS:
            raise KeyError(f"only: unknown entry point {name!r}; known: {', '.join(BUILDERS)}")
    env = Env(device, small, torch.Generator(device=device).manual_seed(0))
    rows: list[Row] = []
    with torch.no_grad(), (ops.use(provider) if provider else contextlib.nullcontext()):
        for name in names:
            rows += _measure_entry_point(name, env, calls, rounds, progress, keep_calls, profile)
            if device == "cuda":  # its inputs are gone with its local variables
                torch.cuda.empty_cache()
    return rows


def _measure_entry_point(name: str, env: Env, calls: int, rounds: int, progress: bool,
                         keep_calls: bool, profile: int = 0) -> list[Row]:
    rows = []
    for case in BUILDERS[name](env):
        row = measure_case(case, env.device, calls, rounds)
        if profile > 0 and math.isfinite(row.ours.host):
            row.profile = profiled(case.ours, env.device, profile)
        if not keep_calls:  # drop the closures, and with them the inputs
            row.case = dataclasses.replace(case, ours=_freed, peer=None if case.peer is None else _freed)
        rows.append(row)
        if progress:
            print(format_table([row], header=False), flush=True)
            if row.profile:
                print(row.profile, flush=True)
    return rows


def profiled(fn: Callable[[], Any], device: str, calls: int, top: int = 20) -> str:
    """A cProfile of `calls` back-to-back calls of `fn` (the device synchronized before and after, outside the
    profile): the `top` functions by self time, with microseconds per call of `fn`."""
    fn()
    _sync(device)
    prof = cProfile.Profile()
    gc.disable()
    try:
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
    finally:
        gc.enable()
    _sync(device)
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]  # type: ignore[attr-defined]
    out = io.StringIO()
    out.write(f"    profile of {calls} calls (us per call under cProfile: self, with callees; calls per call)\n")
    for (path, line, func), (_, ncalls, tottime, cumtime, _) in rows:
        where = func if path == "~" else f"{Path(path).name}:{line}({func})"
        out.write(f"    {tottime / calls * 1e6:8.2f} {cumtime / calls * 1e6:8.2f} {ncalls / calls:6.1f}  {where}\n")
    return out.getvalue().rstrip()


# --- the table ------------------------------------------------------------------------------------------------


def host_target(ours: float, peer: float, one_op: bool) -> str:
    """PASS when our host microseconds per call are at most the peer's (+ `HOST_SLACK_US` when the peer is
    one PyTorch op); "-" when either figure is missing."""
    if not (math.isfinite(ours) and math.isfinite(peer)):
        return "-"
    return "PASS" if ours <= peer + (HOST_SLACK_US if one_op else 0.0) else "MISS"


def b2b_target(b2b: float, graph: float) -> str:
    """PASS when back-to-back microseconds per call are within `GRAPH_SLACK` of graph replay; "-" when
    either is missing or the replay is under `GRAPH_MIN_US` (launch-bound: the target does not apply)."""
    if not (math.isfinite(b2b) and math.isfinite(graph)) or graph < GRAPH_MIN_US:
        return "-"
    return "PASS" if b2b <= GRAPH_SLACK * graph else "MISS"


def _us(v: float) -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if math.isfinite(a) and math.isfinite(b) and b > 0 else "-"


COLUMNS = ("case", "peer", "host us ours", "host us ours, plain launch", "host us peer", "host ours/peer",
           "host target", "b2b us ours",
           "b2b us peer", "b2b ours/peer", "graph us ours", "graph us peer", "b2b/graph ours", "b2b target",
           "checked us", "sync-free ours / peer", "served by", "notes")


def cells(row: Row) -> list[str]:
    """One table line's cells, in `COLUMNS` order."""
    o, p = row.ours, row.peer or Timing()
    notes = [*o.errors, *(f"peer {e}" for e in p.errors)]
    if row.case.peer_error:
        notes.append(row.case.peer_error)
    checked = "-" if not row.case.indexed else f"{_us(row.checked)} ({row.checked_sync})"
    return [row.case.name, row.case.peer_name, _us(o.host), _us(row.plain_host), _us(p.host),
            _ratio(o.host, p.host),
            host_target(o.host, p.host, row.case.peer_one_op), _us(o.b2b), _us(p.b2b), _ratio(o.b2b, p.b2b),
            _us(o.graph), _us(p.graph), _ratio(o.b2b, o.graph), b2b_target(o.b2b, o.graph), checked,
            f"{o.sync_free} / {p.sync_free if row.peer else '-'}", str(row.provider), "; ".join(notes)[:300]]


def format_table(rows: list[Row], header: bool = True) -> str:
    """The markdown table of `rows` (with its header lines unless `header` is False)."""
    lines = [f"| {' | '.join(COLUMNS)} |", "|" + "---|" * len(COLUMNS)] if header else []
    lines += ["| " + " | ".join(c.replace("|", "/") for c in cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def ok(rows: list[Row]) -> bool:
    """No target MISSed, nothing of ours failed, every unchecked call of ours is sync-free and the mode saw
    every checked call synchronize (its control). The peers' failures are shown, not counted."""
    for r in rows:
        peer = r.peer or Timing()
        if "MISS" in (host_target(r.ours.host, peer.host, r.case.peer_one_op), b2b_target(r.ours.b2b, r.ours.graph)):
            return False
        if r.ours.errors or r.ours.sync_free not in ("yes", "-") or r.checked_sync not in ("syncs", "-"):
            return False
    return True


def versions(device: str) -> str:
    """Date, device, torch/triton/Python versions."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return (f"Date: {datetime.date.today().isoformat()}. Device: {name}. torch {torch.__version__}, "
            f"triton {triton_version}, Python {sys.version.split()[0]}.")


def report(rows: list[Row], device: str, calls: int, rounds: int, seconds: float) -> str:
    """The markdown section: title, versions, settings, the table and what the columns mean."""
    return "\n\n".join([
        "## Host cost and no-sync behaviour (`python3 benchmarks/gpu_host_cost.py`)",
        versions(device),
        f"Medians of {rounds} rounds of {calls} calls (checked: {checked_calls(calls)}); {seconds:.0f} s in all.",
        format_table(rows),
        "host: CPU time for a call to return (no synchronization inside the timed calls); plain launch: the "
        "same with the Triton provider's fast launch path off (every kernel through `kernel[grid](...)`). "
        "b2b: CUDA events "
        "around back-to-back calls. graph: one call captured in a CUDA graph, per replay. checked: wall time "
        "per call under `checked_indices()`, and whether `set_sync_debug_mode(\"error\")` saw its "
        "synchronization. sync-free: one warm call under `set_sync_debug_mode(\"error\")` raised nothing. "
        f"Targets: host <= peer + {HOST_SLACK_US:g} us (one-op peer) or <= peer (multi-kernel peer); b2b <= "
        f"{GRAPH_SLACK:g}x graph replay where the replay takes >= {GRAPH_MIN_US:g} us.",
    ])


def records(rows: list[Row]) -> list[Record]:
    """Per row, our call's and the peer's host, back-to-back ("eager") and graph-replay times as records (ms per
    call; no rate: the cases are timed, not sized); a figure not measured is None with the errors as note."""
    out = []
    for r in rows:
        sides = [("ours", r.provider, r.ours)] + ([("peer", r.case.peer_name, r.peer)] if r.peer else [])
        for role, who, t in sides:
            for timing, us in (("host", t.host), ("eager", t.b2b), ("graph replay", t.graph)):
                out.append(record("operator", "benchmarks/gpu_host_cost.py", r.case.op, who, r.case.name, role=role,
                                  ms=us / 1e3, timing=timing, note="; ".join(t.errors)[:300]))
    return out


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BUILDERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown entry point(s) {', '.join(unknown) or '(none given)'}; "
                                         f"known: {', '.join(BUILDERS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="write the table (markdown) to this file")
    parser.add_argument("--only", type=_names, help="comma-separated entry points (default: all)")
    parser.add_argument("--calls", type=int, default=50, help="calls per timed round (default 50)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds, the median is kept (default 5)")
    parser.add_argument("--provider", help="force this provider for our calls (default: the resolver's choice)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after each row, a cProfile of N more calls of ours (default 0: none)")
    parser.add_argument("--smoke", action="store_true",
                        help="a dry run: every case on the CPU at small sizes, 2 calls, 1 round (no CUDA needed)")
    json_option(parser)
    args = parser.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        parser.error(f"--calls and --rounds must be >= 1, got {args.calls} and {args.rounds}")
    if args.smoke:
        print(format_table([]), flush=True)
        rows = run("cpu", small=True, only=args.only, calls=2, rounds=1, provider=args.provider, progress=True,
                   profile=args.profile)
        failed = [r.case.name for r in rows if r.ours.errors or (r.peer is not None and r.peer.errors)]
        print(f"\n{len(rows)} cases on the CPU; failed: {', '.join(failed) or 'none'}")
        return 1 if failed else 0
    if not torch.cuda.is_available():
        print("benchmarks/gpu_host_cost.py needs a CUDA device", file=sys.stderr)
        return 2
    start = time.perf_counter()
    print(format_table([]), flush=True)
    rows = run("cuda", only=args.only, calls=args.calls, rounds=args.rounds, provider=args.provider, progress=True,
               profile=args.profile)
    text = report(rows, "cuda", args.calls, args.rounds, time.perf_counter() - start)
    print("\n" + text)
    if args.write:
        args.write.write_text(text + "\n")
    if args.json:
        write_records(args.json, records(rows), "cuda")
    return 0 if ok(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
