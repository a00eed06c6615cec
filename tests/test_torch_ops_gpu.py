"""Every entry point on CUDA (``make test-gpu`` runs these; skipped without a CUDA device), Triton provider,
bf16: eager calls never synchronize with the device, and ``torch.compile(mode="reduce-overhead")`` (CUDA
graphs) of a function calling every entry point runs and matches eager.

Sizes are small but inside every Triton limit (head dim 64, paged blocks of 16), so ``use("triton")``
serves every call and nothing falls back to a provider that reads lengths on the host.
"""

from __future__ import annotations

import pytest
import torch

import infiniops_py as ops
from tests.test_torch_ops import decode_fusions

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

T, HQ, HKV, D = 6, 4, 2, 64  # two sequences of 3 tokens
BS = 16  # paged-cache block size
BF16 = torch.bfloat16
_FP32 = ("sA", "st", "sD", "sbias")  # the SSM decay rates, states, skip and bias terms stay float32


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    """Every argument, made on the CPU from one seed, then moved to CUDA: floats as bf16 (except `_FP32`),
    index tensors as they are."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    i = {
        "a": r(T, 64), "w": r(96, 64, scale=0.125), "bias": r(96), "nw": r(64) * 0.1 + 1,
        "qkv": r(T, (HQ + 2 * HKV) * D), "qw": r(D) * 0.1 + 1, "kw": r(D) * 0.1 + 1,
        "kc": r(4, BS, HKV, D), "vc": r(4, BS, HKV, D), "slots": torch.tensor([0, 1, 2, 16, 17, 18]),
        "cu": torch.tensor([0, 3, 6], dtype=torch.int32), "table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        "seqlens": torch.tensor([5, 9], dtype=torch.int32),
        "x": r(2, 64, 40), "cw": r(64, 4, scale=0.5), "cb": r(64), "cstate": r(3, 64, 3),
        "cidx": torch.tensor([2, 0], dtype=torch.int32),
        "sx": r(2, 64, 4, 16), "sdt": r(2, 64, 4, scale=0.5), "sA": -torch.rand(4, generator=gen) - 0.5,
        "sB": r(2, 64, 1, 16), "sC": r(2, 64, 1, 16), "sD": r(4), "sbias": r(4, scale=0.1),
        "st": r(3, 4, 16, 16), "ux": r(2, 4, 16), "udt": r(2, 4, scale=0.5), "uB": r(2, 1, 16), "uC": r(2, 1, 16),
        "sidx": torch.tensor([1, 2], dtype=torch.int32),
        "gu": r(T, 2 * 48), "pos": torch.tensor([0, 1, 2, 5, 6, 7]), "rope": r(8, D),
    }
    return {k: v.to("cuda", dtype=BF16 if v.is_floating_point() and k not in _FP32 else v.dtype)
            for k, v in i.items()}


def _every_entry_point(i: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Calls every entry point but `all_reduce` (which needs a process group: tests/test_all_reduce.py compiles
    it), and the out=/final-state forms, on CUDA; returns every output and mutated
    tensor. Makes no tensor from host data, so the only synchronizations possible are the calls' own."""
    h = ops.gemm(i["a"], i["w"], bias=i["bias"], trans_b=True)
    h2 = torch.empty_like(h)
    ops.gemm(i["a"], i["w"], trans_b=True, out=h2)
    s = ops.add(h, h2, alpha=0.5)
    s2 = torch.empty_like(s)
    ops.add(s, h, out=s2)
    n = ops.rms_norm(i["a"], i["nw"], 1e-6)
    n2 = torch.empty_like(n)
    ops.rms_norm(i["a"], i["nw"], 1e-5, out=n2)
    x2, r2 = i["a"] * 0.5, i["a"] * 2.0
    ops.fused_add_rms_norm(x2, r2, i["nw"], 1e-6)
    qkv = ops.fused_qk_norm(i["qkv"].clone(), i["qw"], i["kw"], num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=1)
    q, k, v = q.reshape(T, HQ, D), k.reshape(T, HKV, D), v.reshape(T, HKV, D)
    kc, vc = i["kc"].clone(), i["vc"].clone()
    ops.reshape_and_cache_flash(k, v, kc, vc, i["slots"])
    o = ops.flash_attn_varlen(q, k, v, i["cu"], i["cu"], 3, 3, causal=True)
    kc2, vc2 = kc.clone(), vc.clone()  # paged: sequence b owns blocks table[b]; 3 new tokens appended
    o2 = ops.flash_attn_with_kvcache(q.reshape(2, 3, HQ, D), kc2, vc2, k=k.reshape(2, 3, HKV, D),
                                     v=v.reshape(2, 3, HKV, D), cache_seqlens=i["seqlens"], block_table=i["table"])
    y = ops.causal_conv1d(i["x"], i["cw"], i["cb"], activation="silu")
    y2, fs = ops.causal_conv1d(i["x"], i["cw"], return_final_states=True)
    cs = i["cstate"].clone()
    u = ops.causal_conv1d_update(i["x"][:, :, 0], cs, i["cw"], i["cb"], activation="silu",
                                 conv_state_indices=i["cidx"])
    sy = ops.selective_scan(i["sx"], i["sdt"], i["sA"], i["sB"], i["sC"], D=i["sD"], dt_bias=i["sbias"],
                            dt_softplus=True)
    sy2, sf = ops.selective_scan(i["sx"], i["sdt"], i["sA"], i["sB"], i["sC"], return_final_states=True,
                                 chunk_size=32, dt_limit=(0.0, 2.0))
    st = i["st"].clone()
    su = ops.selective_state_update(st, i["ux"], i["udt"], i["sA"], i["uB"], i["uC"], D=i["sD"],
                                    dt_bias=i["sbias"], dt_softplus=True, state_batch_indices=i["sidx"])
    return [h, h2, s, s2, n, n2, x2, r2, qkv, kc, vc, o, kc2, vc2, o2, y, y2, fs, cs, u, sy, sy2, sf, st, su,
            *decode_fusions(i, q, k, HQ, HKV, D)]


def test_every_entry_point_runs_on_cuda_without_synchronizing() -> None:
    """Under ``torch.cuda.set_sync_debug_mode("error")`` (which raises on PyTorch's implicit
    synchronizations: ``.item()``, ``.tolist()``, blocking device-to-host copies) a warm loop over every
    entry point raises nothing, and a call with the opt-in index checks does raise (the mode's control).

    The first call is warmed up outside the mode: a first call of an autotuned Triton kernel (gemm, add,
    conv, attention) does synchronize, since Triton's autotuner times its configurations with
    ``torch.cuda.synchronize()`` and CUDA events. That sync is allowed once (the mode would not even see it:
    an explicit ``torch.cuda.synchronize()`` is not one of the operations it checks).
    """
    i = _inputs()
    with ops.use("triton"):
        _every_entry_point(i)  # compile and autotune, outside the mode
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            outs = _every_entry_point(i)
            with ops.checked_indices(), pytest.raises(RuntimeError, match="synchronizing"):
                ops.reshape_and_cache_flash(i["kc"][0, :3], i["vc"][0, :3], outs[9], outs[10], i["slots"][:3])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert all(bool(o.isfinite().all()) for o in outs)


def test_reduce_overhead_compile_of_every_entry_point_matches_eager() -> None:
    """``torch.compile(mode="reduce-overhead", fullgraph=True)`` records the calls (one custom-op node each)
    into a CUDA graph and replays it; the third call (a replay) matches eager within bf16 rounding, and
    no graph was skipped from CUDA-graph capture."""
    from torch._dynamo.utils import counters

    i = _inputs(1)
    torch._dynamo.reset()
    counters.clear()
    with ops.use("triton"):
        eager = _every_entry_point(i)
        compiled = torch.compile(_every_entry_point, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):  # warm-up run, recording, replay
            got = [t.clone() for t in compiled(i)]
    torch.cuda.synchronize()
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    assert len(got) == len(eager)
    for n, (g, e) in enumerate(zip(got, eager)):
        assert g.shape == e.shape and g.dtype == e.dtype, n
        torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2, msg=lambda m, n=n: f"output {n}: {m}")
