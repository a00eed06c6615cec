"""Every entry point is a PyTorch custom operator: torch.compile(fullgraph=True) with no graph break, torch.export
(strict and non-strict), meta and FakeTensor inputs, and the provider still chosen when the graph runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import infiniops_py as ops
from infiniops_py.operators._torch_library import SCHEMAS
from tests.fakes import cpu_capability, registered

T, HQ, HKV, D = 6, 4, 2, 16


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    return {
        "a": r(T, 32), "w": r(48, 32), "bias": r(48), "nw": r(32) + 1,
        "qkv": r(T, (HQ + 2 * HKV) * D), "qw": r(D) + 1, "kw": r(D) + 1,
        "kc": r(4, 4, HKV, D), "vc": r(4, 4, HKV, D), "slots": torch.tensor([0, 1, 2, 4, 5, 6]),
        "cu": torch.tensor([0, 3, 6], dtype=torch.int32), "seqlens": torch.tensor([1, 2], dtype=torch.int32),
        "x": r(2, 8, 10), "cw": r(8, 4), "cb": r(8), "cstate": r(3, 8, 3),
        "cidx": torch.tensor([2, 0], dtype=torch.int32),
        "sx": r(2, 12, 4, 8), "sdt": r(2, 12, 4), "sA": -torch.rand(4, generator=gen) - 0.1,
        "sB": r(2, 12, 1, 16), "sC": r(2, 12, 1, 16),
        "st": r(3, 4, 8, 16), "ux": r(2, 4, 8), "udt": r(2, 4), "uB": r(2, 1, 16), "uC": r(2, 1, 16),
        "sidx": torch.tensor([1, 2], dtype=torch.int32),
        "gu": r(T, 2 * 48), "pos": torch.tensor([0, 1, 2, 5, 6, 7]), "rope": r(8, D),
    }


def _every_entry_point(i: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Calls every entry point but `all_reduce` (which needs a process group: tests/test_all_reduce.py compiles
    it), and the out=/final-state forms; returns every output and mutated tensor."""
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
    gn = ops.rms_norm_gated(i["a"], i["nw"], None, r2, 1e-6, 8, False)
    gn2 = torch.empty_like(gn)
    ops.rms_norm_gated(i["a"], i["nw"], i["nw"], None, 1e-5, out=gn2)
    tok = ops.top_k_top_p_sampling_from_logits(i["a"], 5, 0.9, temperature=0.7, seed=i["pos"], offset=3)
    qkv = ops.fused_qk_norm(i["qkv"].clone(), i["qw"], i["kw"], num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=1)
    q, k, v = q.reshape(T, HQ, D), k.reshape(T, HKV, D), v.reshape(T, HKV, D)
    kc, vc = i["kc"].clone(), i["vc"].clone()
    ops.reshape_and_cache_flash(k, v, kc, vc, i["slots"])
    o = ops.flash_attn_varlen(q, k, v, i["cu"], i["cu"], 3, 3, causal=True)
    kc2, vc2 = kc.reshape(2, 8, HKV, D).clone(), vc.reshape(2, 8, HKV, D).clone()
    o2 = ops.flash_attn_with_kvcache(q.reshape(2, 3, HQ, D), kc2, vc2, k=k.reshape(2, 3, HKV, D),
                                     v=v.reshape(2, 3, HKV, D), cache_seqlens=i["seqlens"], causal=True)
    y = ops.causal_conv1d(i["x"], i["cw"], i["cb"], activation="silu")
    y2, fs = ops.causal_conv1d(i["x"], i["cw"], return_final_states=True)
    cs = i["cstate"].clone()
    u = ops.causal_conv1d_update(i["x"][:, :, 0], cs, i["cw"], i["cb"], activation="silu",
                                 conv_state_indices=i["cidx"])
    sy = ops.selective_scan(i["sx"], i["sdt"], i["sA"], i["sB"], i["sC"], dt_softplus=True, chunk_size=4)
    sy2, sf = ops.selective_scan(i["sx"], i["sdt"], i["sA"], i["sB"], i["sC"], return_final_states=True,
                                 chunk_size=4, dt_limit=(0.0, 2.0))
    st = i["st"].clone()
    su = ops.selective_state_update(st, i["ux"], i["udt"], i["sA"], i["uB"], i["uC"], dt_softplus=True,
                                    state_batch_indices=i["sidx"])
    return [h, h2, s, s2, n, n2, x2, r2, gn, gn2, tok, qkv, kc, vc, o, kc2, vc2, o2, y, y2, fs, cs, u, sy, sy2, sf,
            st, su, *decode_fusions(i, q, k, HQ, HKV, D)]


def decode_fusions(i: dict[str, torch.Tensor], q: torch.Tensor, k: torch.Tensor, hq: int, hkv: int,
                   d: int) -> list[torch.Tensor]:
    """silu_and_mul (and its out= form), rotary_embedding (NeoX on q and k, GPT-J partial on q alone),
    fused_qk_norm_rope, gemm_swiglu, gemm_add_rms_norm and rms_norm_gemm (and their out= forms) on `i`'s ``gu``,
    ``pos``, ``rope``, ``qkv``, ``a``, ``w``, ``bias``, ``nw`` (`q`, `k`: ``[T, H, D]`` heads); returns every
    output and mutated tensor."""
    t = q.shape[0]
    g = ops.silu_and_mul(i["gu"])
    g2 = torch.empty_like(g)
    ops.silu_and_mul(i["gu"], out=g2)
    rq, rk = ops.rotary_embedding(i["pos"], q.reshape(t, hq * d).clone(), k.reshape(t, hkv * d).clone(), d, i["rope"],
                                  True)
    rq2, _ = ops.rotary_embedding(i["pos"], q.clone(), None, d, i["rope"][:, : d // 2].contiguous(), False)
    qkr = ops.fused_qk_norm_rope(i["qkv"].clone(), i["qw"], i["kw"], i["rope"], i["pos"], num_q_heads=hq,
                                 num_kv_heads=hkv, head_dim=d)
    sw = ops.gemm_swiglu(i["a"], i["w"], i["bias"])
    sw2 = torch.empty_like(sw)
    ops.gemm_swiglu(i["a"], i["w"], out=sw2)
    an_r, an_r2 = i["gu"][:, :48] * 0.5, i["gu"][:, 48:] * 2.0
    an, _ = ops.gemm_add_rms_norm(i["a"], i["w"], an_r, i["bias"] + 2, 1e-6, bias=i["bias"])
    an2 = torch.empty_like(an)
    ops.gemm_add_rms_norm(i["a"], i["w"], an_r2, i["bias"] + 2, 1e-5, out=an2)
    pn = ops.rms_norm_gemm(i["a"], i["nw"], i["w"], 1e-6, bias=i["bias"])
    pn2 = torch.empty(t, i["w"].shape[0] // 2, dtype=pn.dtype, device=pn.device)
    ops.rms_norm_gemm(i["a"], i["nw"], i["w"], 1e-5, swiglu=True, out=pn2)
    return [g, g2, rq, rk, rq2, qkr, sw, sw2, an, an_r, an2, an_r2, pn, pn2]


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for n, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, n
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=f"output {n}")


def test_every_entry_point_is_a_registered_custom_op_with_a_fake_kernel() -> None:
    public = {name for name in ops.OPERATORS}
    assert public <= {name.split(".")[0] for name in SCHEMAS}
    for name in SCHEMAS:
        base, _, overload = name.partition(".")
        packet = getattr(torch.ops.infiniops, base)
        assert getattr(packet, overload or "default")._schema is not None
    assert torch.ops.infiniops.reshape_and_cache_flash.default._schema.arguments[2].alias_info.is_write


@pytest.mark.parametrize("provider", ["torch", "reference"])
def test_fullgraph_compile_of_every_entry_point_has_no_graph_break_and_matches_eager(provider: str) -> None:
    i = _inputs()
    ops.reload()  # a cold resolver: the first call of each operator is made inside the compiled function
    torch._dynamo.reset()
    with ops.use(provider):
        explained = torch._dynamo.explain(_every_entry_point)(i)
        assert explained.graph_break_count == 0, explained.break_reasons
        torch._dynamo.reset()
        ops.reload()
        compiled = torch.compile(_every_entry_point, fullgraph=True, backend="inductor")(i)
        eager = _every_entry_point(i)
    _assert_close(compiled, eager)


def test_compiled_graph_chooses_the_provider_when_it_runs() -> None:
    """A graph compiled under one `use()` scope runs another scope's provider: nothing is baked in."""
    calls: list[str] = []

    def counting_add(input: torch.Tensor, other: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
        calls.append("mine")
        return torch.add(input, other, alpha=alpha, out=out)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.add(a, b) * 2

    a, b = torch.randn(5), torch.randn(5)
    with registered(("mine", [("add", cpu_capability(), -100, counting_add)])):
        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True, backend="eager")
        with ops.use("torch"):
            torch.testing.assert_close(compiled(a, b), (a + b) * 2)
        assert calls == []
        with ops.use("mine"):
            torch.testing.assert_close(compiled(a, b), (a + b) * 2)
        assert calls == ["mine"]


def test_contract_errors_raise_when_traced_and_when_the_graph_runs() -> None:
    """Value-free checks (shapes, dtypes) run when the call is traced, on meta copies, under torch.compile and
    FakeTensorMode alike; checks of index values run when the graph runs (CPU: checked by default)."""
    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, w, 1e-6)

    torch._dynamo.reset()
    with pytest.raises(Exception, match="rms_norm: weight: expected shape \\[8\\]"):
        torch.compile(norm, fullgraph=True, backend="eager")(torch.randn(3, 8), torch.randn(7))
    with FakeTensorMode(), pytest.raises(ops.ContractError, match="weight"):
        norm(torch.empty(3, 8), torch.empty(7))

    def write(k: torch.Tensor, kc: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        ops.reshape_and_cache_flash(k, k, kc, kc.clone(), slots)
        return kc

    k, kc = torch.randn(2, 1, 8), torch.zeros(2, 4, 1, 8)
    compiled = torch.compile(write, fullgraph=True, backend="eager")
    compiled(k, kc, torch.tensor([0, 5]))
    before = kc.clone()
    with pytest.raises(ops.ContractError, match="slot_mapping"):
        compiled(k * 2, kc, torch.tensor([1, 8]))  # slot 8 is past the 2 x 4 slots: refused before any write
    assert torch.equal(kc, before)


class _DecoderLayer(torch.nn.Module):
    """A decoder layer's attention half from gemm, rms_norm, fused_qk_norm, the cache write and varlen attention."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.norm = torch.nn.Parameter(torch.rand(32, generator=gen) + 0.5, requires_grad=False)
        self.qkv = torch.nn.Parameter(torch.randn((HQ + 2 * HKV) * D, 32, generator=gen) * 0.1, requires_grad=False)
        self.qn = torch.nn.Parameter(torch.rand(D, generator=gen) + 0.5, requires_grad=False)
        self.kn = torch.nn.Parameter(torch.rand(D, generator=gen) + 0.5, requires_grad=False)
        self.o = torch.nn.Parameter(torch.randn(32, HQ * D, generator=gen) * 0.1, requires_grad=False)

    def forward(self, h: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                cu: torch.Tensor) -> torch.Tensor:
        x = ops.rms_norm(h, self.norm, 1e-6)
        qkv = ops.fused_qk_norm(ops.gemm(x, self.qkv, trans_b=True), self.qn, self.kn, num_q_heads=HQ,
                                num_kv_heads=HKV, head_dim=D)
        q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=1)
        k, v = k.reshape(-1, HKV, D), v.reshape(-1, HKV, D)
        ops.reshape_and_cache_flash(k, v, k_cache, v_cache, slots)
        attn = ops.flash_attn_varlen(q.reshape(-1, HQ, D), k, v, cu, cu, 3, 3, causal=True)
        return ops.gemm(attn.reshape(-1, HQ * D), self.o, trans_b=True)


@pytest.mark.parametrize("strict", [True, False])
def test_export_of_a_decoder_layer_runs_and_matches_eager(strict: bool) -> None:
    layer = _DecoderLayer()
    gen = torch.Generator().manual_seed(4)
    h = torch.randn(T, 32, generator=gen)
    slots = torch.tensor([3, 0, 5, 7, 1, 2])
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)

    def caches() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(2, 4, HKV, D), torch.zeros(2, 4, HKV, D)

    with torch.no_grad():
        kc, vc = caches()
        exported = torch.export.export(layer, (h, kc, vc, slots, cu), strict=strict)
        targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
        assert any("infiniops.flash_attn_varlen" in t for t in targets), targets
        assert not any("aten.scaled_dot_product" in t for t in targets)
        ke, ve = caches()
        got = exported.module()(h, ke, ve, slots, cu)
        kw, vw = caches()
        want = layer(h, kw, vw, slots, cu)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ke, kw)  # the exported program wrote the caches in place, like eager
    torch.testing.assert_close(ve, vw)
    assert ke.abs().sum() > 0


def _on(i: dict[str, torch.Tensor], convert: Callable[[torch.Tensor], Any]) -> dict[str, Any]:
    return {k: convert(v) for k, v in i.items()}


def test_meta_and_fake_tensor_inputs_give_the_eager_shapes_dtypes_and_strides() -> None:
    i = _inputs()
    with ops.use("torch"):
        eager = _every_entry_point(i)
    meta = _every_entry_point(_on(i, lambda t: t.to("meta")))
    with FakeTensorMode() as mode:
        fake = _every_entry_point(_on(i, mode.from_tensor))
    for outs in (meta, fake):
        assert [(o.shape, o.dtype, o.stride()) for o in outs] == [(e.shape, e.dtype, e.stride()) for e in eager]
    assert all(o.is_meta for o in meta)
