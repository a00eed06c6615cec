"""The fast launch path (`infiniops_triton._fastlaunch`) on CUDA: every kernel switched to it gives the plain
``kernel[grid](...)`` launch's output, bit for bit (the same binary on the same inputs), at several shapes,
dtypes and alignments (a misaligned view, an int argument equal to 1), on a second stream and inside a CUDA
graph; a call of another specialization compiles its own kernel instead of reusing the wrong one.

    python3 -m pytest -q tests/test_triton_fastlaunch_gpu.py     # skipped without CUDA or off Triton 3.6
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

import infiniops_py as ops
from tests.test_triton_fastlaunch import switched_launchers

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

if torch.cuda.is_available():
    from infiniops_triton import (
        _fastlaunch,
        _gemv,
        add,
        causal_conv1d,
        flash_attn,
        fused_qk_norm,
        fused_qk_norm_rope,
        gemm_add_rms_norm,
        gemm_swiglu,
        paged_cache,
        rms_norm,
        rms_norm_gated,
        rms_norm_gemm,
        rotary_embedding,
        silu_and_mul,
        state_update,
    )

    if not _fastlaunch.supported():
        pytestmark.append(pytest.mark.skip(reason="no fast path here (Triton version, interpreter or switch)"))

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
VARIANTS = ("aligned", "misaligned", "one")  # "one": a size argument of 1 (Triton makes it a constant)


def _rand(*shape: int, dtype: torch.dtype, gen: torch.Generator, offset: int = 0) -> torch.Tensor:
    """A random CUDA tensor; with `offset`, a view starting `offset` elements into a larger buffer (so its
    data pointer is not 16-byte aligned for an odd offset)."""
    numel = 1
    for s in shape:
        numel *= s
    flat = torch.randn(numel + offset, generator=gen, device="cpu").to("cuda", dtype)
    return flat[offset:].view(shape)


def _like(t0: torch.Tensor, offset: int) -> torch.Tensor:
    """A fresh CUDA copy of `t0`, `offset` elements into its buffer (allocated on the device: capturable)."""
    return torch.empty(t0.numel() + offset, dtype=t0.dtype, device="cuda")[offset:].view(t0.shape).copy_(t0)


Case = Callable[[], list[torch.Tensor]]  # runs the operator on fresh copies of its inputs, returns the outputs


def _rms_norm(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    t = 1 if variant == "one" else 37
    off = 1 if variant == "misaligned" else 0
    x, w = _rand(t, 1000, dtype=dtype, gen=gen, offset=off), _rand(1000, dtype=dtype, gen=gen)

    def run() -> list[torch.Tensor]:
        out = torch.full_like(x, float("nan"))
        return [rms_norm.rms_norm(x, w, 1e-6, out)]

    return run


def _fused_add_rms_norm(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    t = 1 if variant == "one" else 19
    off = 3 if variant == "misaligned" else 0
    x0, r0 = _rand(t, 2048, dtype=dtype, gen=gen, offset=off), _rand(t, 2048, dtype=dtype, gen=gen)
    w = _rand(2048, dtype=dtype, gen=gen)

    def run() -> list[torch.Tensor]:
        x, r = _like(x0, off), _like(r0, 0)
        rms_norm.fused_add_rms_norm(x, r, w, 1e-5)
        return [x, r]

    return run


def _silu_and_mul(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    t = 1 if variant == "one" else 9
    off = 1 if variant == "misaligned" else 0
    x = _rand(t, 2 * 1376, dtype=dtype, gen=gen, offset=off)

    def run() -> list[torch.Tensor]:
        out = torch.full((t, 1376), float("nan"), dtype=dtype, device="cuda")
        return [silu_and_mul.silu_and_mul(x, out)]

    return run


def _qk_norm_rope(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    t = 1 if variant == "one" else 5
    hq, hkv, d = (4, 1, 128) if variant == "one" else (8, 2, 128)  # one kv head too
    off = 1 if variant == "misaligned" else 0
    qkv0 = _rand(t, (hq + 2 * hkv) * d, dtype=dtype, gen=gen, offset=off)
    qw, kw = _rand(d, dtype=dtype, gen=gen), _rand(d, dtype=dtype, gen=gen)
    cache = _rand(64, d, dtype=dtype, gen=gen)
    positions = torch.randint(0, 64, (t,), generator=gen).cuda()

    def run() -> list[torch.Tensor]:
        qkv = _like(qkv0, off)
        fused_qk_norm_rope.fused_qk_norm_rope(qkv, qw, kw, cache, positions, hq, hkv, d, 1e-6, variant != "one")
        return [qkv]

    return run


def _reshape_and_cache(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    t = 1 if variant == "one" else 11
    hkv, d, bs = (1, 64, 16) if variant == "one" else (4, 128, 16)
    off = 1 if variant == "misaligned" else 0
    key, value = _rand(t, hkv, d, dtype=dtype, gen=gen, offset=off), _rand(t, hkv, d, dtype=dtype, gen=gen)
    slots = torch.randperm(4 * bs, generator=gen)[:t].cuda()
    slots[0] = -1  # a padding token

    def run() -> list[torch.Tensor]:
        kc = torch.zeros(4, bs, hkv, d, dtype=dtype, device="cuda")
        vc = torch.zeros_like(kc)
        paged_cache.reshape_and_cache_flash(key, value, kc, vc, slots)
        return [kc, vc]

    return run


def _gemv_case(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    m = 1 if variant == "one" else 7
    off = 1 if variant == "misaligned" else 0
    a = _rand(m, 1024, dtype=dtype, gen=gen, offset=off)
    weight = _rand(768, 1024, dtype=dtype, gen=gen)  # nn.Linear layout [N, K]
    bias = _rand(768, dtype=dtype, gen=gen)

    def run() -> list[torch.Tensor]:
        out = torch.full((m, 768), float("nan"), dtype=dtype, device="cuda")
        return [_gemv.gemv(a, weight.t(), None, bias, 1.0, 0.0, out)]

    return run


def _gemm_swiglu(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    m = 1 if variant == "one" else 4
    off = 1 if variant == "misaligned" else 0
    x = _rand(m, 512, dtype=dtype, gen=gen, offset=off)
    weight = _rand(2 * 384, 512, dtype=dtype, gen=gen)

    def run() -> list[torch.Tensor]:
        out = torch.full((m, 384), float("nan"), dtype=dtype, device="cuda")
        return [gemm_swiglu.gemm_swiglu(x, weight, None, out)]

    return run


def _rms_norm_gemm(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    m = 1 if variant == "one" else 4
    off = 1 if variant == "misaligned" else 0
    x = _rand(m, 768, dtype=dtype, gen=gen, offset=off)
    nw = _rand(768, dtype=dtype, gen=gen)
    weight = _rand(3352, 768, dtype=dtype, gen=gen)  # Mamba-2-130m's in_proj

    def run() -> list[torch.Tensor]:
        out = torch.full((m, 3352), float("nan"), dtype=dtype, device="cuda")
        rms_norm_gemm.rms_norm_gemm(x, nw, weight, None, 1e-6, False, out)
        return [out]

    return run


def _gemm_add_rms_norm(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    m = 1 if variant == "one" else 4
    off = 1 if variant == "misaligned" else 0
    x = _rand(m, 1536, dtype=dtype, gen=gen, offset=off)
    weight = _rand(768, 1536, dtype=dtype, gen=gen)  # Mamba-2-130m's out_proj
    r0, nw = _rand(m, 768, dtype=dtype, gen=gen), _rand(768, dtype=dtype, gen=gen)

    def run() -> list[torch.Tensor]:
        out = torch.full((m, 768), float("nan"), dtype=dtype, device="cuda")
        residual = _like(r0, off)
        gemm_add_rms_norm.gemm_add_rms_norm(x, weight, None, residual, nw, 1e-6, out)
        return [out, residual]

    return run


def _decode(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    batch = 1 if variant == "one" else 3
    hq, hkv, d, page = 8, 2, 128, 16
    off = 1 if variant == "misaligned" else 0
    q = _rand(batch, 1, hq, d, dtype=dtype, gen=gen, offset=off)
    k_cache0 = _rand(12, page, hkv, d, dtype=dtype, gen=gen)
    v_cache0 = _rand(12, page, hkv, d, dtype=dtype, gen=gen)
    table = torch.randperm(12, generator=gen)[: batch * 4].view(batch, 4).to("cuda", torch.int32)
    lens = torch.randint(1, 60, (batch,), generator=gen).to("cuda", torch.int32)
    k_new, v_new = _rand(batch, 1, hkv, d, dtype=dtype, gen=gen), _rand(batch, 1, hkv, d, dtype=dtype, gen=gen)

    def run() -> list[torch.Tensor]:
        kc, vc = k_cache0.clone(), v_cache0.clone()
        out = torch.full((batch, 1, hq, d), float("nan"), dtype=dtype, device="cuda")
        flash_attn.flash_attn_with_kvcache(q, kc, vc, lens, table, k_new, v_new, d**-0.5, True, (-1, -1), 0.0, out)
        return [out, kc, vc]

    return run


def _decode_separate(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    """The decode path's other kernels: the append kernel (a dense cache) and the separate combine."""
    run = _decode_dense(dtype, variant, gen)

    def separate() -> list[torch.Tensor]:
        fused, flash_attn.FUSED_COMBINE = flash_attn.FUSED_COMBINE, False
        try:
            return run()
        finally:
            flash_attn.FUSED_COMBINE = fused

    return separate


def _decode_dense(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    batch = 1 if variant == "one" else 2
    hq, hkv, d = 4, 1 if variant == "one" else 2, 64
    off = 1 if variant == "misaligned" else 0
    q = _rand(batch, 1, hq, d, dtype=dtype, gen=gen, offset=off)
    k_cache0, v_cache0 = _rand(batch, 128, hkv, d, dtype=dtype, gen=gen), _rand(batch, 128, hkv, d, dtype=dtype,
                                                                              gen=gen)
    lens = torch.randint(1, 100, (batch,), generator=gen).to("cuda", torch.int32)
    k_new, v_new = _rand(batch, 1, hkv, d, dtype=dtype, gen=gen), _rand(batch, 1, hkv, d, dtype=dtype, gen=gen)

    def run() -> list[torch.Tensor]:
        kc, vc = k_cache0.clone(), v_cache0.clone()
        out = torch.full((batch, 1, hq, d), float("nan"), dtype=dtype, device="cuda")
        flash_attn.flash_attn_with_kvcache(q, kc, vc, lens, None, k_new, v_new, d**-0.5, True, (-1, -1), 0.0, out,
                                           splits=4)
        return [out, kc, vc]

    return run


def _add(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    """The flat kernel (same-shape contiguous operands) and the strided one (a broadcast row)."""
    n = 1 if variant == "one" else 3000
    off = 1 if variant == "misaligned" else 0
    a, b = _rand(n, dtype=dtype, gen=gen, offset=off), _rand(n, dtype=dtype, gen=gen)
    m, row = _rand(5, 96, dtype=dtype, gen=gen, offset=off), _rand(96, dtype=dtype, gen=gen)

    def run() -> list[torch.Tensor]:
        out, out2 = torch.full_like(a, float("nan")), torch.full_like(m, float("nan"))
        return [add.add(a, b, 0.5, out), add.add(m, row, 1.0, out2)]

    return run


def _rotary(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    t = 1 if variant == "one" else 6
    hq, hkv, d = 8, 1 if variant == "one" else 2, 128
    off = 1 if variant == "misaligned" else 0
    q0, k0 = _rand(t, hq, d, dtype=dtype, gen=gen, offset=off), _rand(t, hkv, d, dtype=dtype, gen=gen)
    cache = _rand(32, d, dtype=dtype, gen=gen)
    positions = torch.randint(0, 32, (t,), generator=gen).cuda()

    def run() -> list[torch.Tensor]:
        q, k = _like(q0, off), _like(k0, 0)
        rotary_embedding.rotary_embedding(positions, q, k, cache, variant != "one")
        return [q, k]

    return run


def _qk_norm(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    t = 1 if variant == "one" else 4
    hq, hkv, d = (4, 1, 64) if variant == "one" else (8, 2, 128)
    off = 1 if variant == "misaligned" else 0
    qkv0 = _rand(t, (hq + 2 * hkv) * d, dtype=dtype, gen=gen, offset=off)
    qw, kw = _rand(d, dtype=dtype, gen=gen), _rand(d, dtype=dtype, gen=gen)

    def run() -> list[torch.Tensor]:
        qkv = _like(qkv0, off)
        fused_qk_norm.fused_qk_norm(qkv, qw, kw, hq, hkv, d, 1e-6)
        return [qkv]

    return run


def _conv_update(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    batch = 1 if variant == "one" else 3
    dim, width = 256, 4
    off = 1 if variant == "misaligned" else 0
    x = _rand(batch, dim, 1, dtype=dtype, gen=gen, offset=off)
    state0 = _rand(4, dim, width - 1, dtype=dtype, gen=gen)
    weight, bias = _rand(dim, width, dtype=dtype, gen=gen), _rand(dim, dtype=dtype, gen=gen)
    index = torch.tensor([2, 0, 3][:batch], dtype=torch.int32, device="cuda")

    def run() -> list[torch.Tensor]:
        state = state0.clone()
        out = torch.full_like(x, float("nan"))
        causal_conv1d.causal_conv1d_update(x, state, weight, bias, "silu", index, out)
        return [out, state]

    return run


def _state_update(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    batch = 1 if variant == "one" else 2
    heads, p, n, groups = 4, 16, 32, 1
    off = 1 if variant == "misaligned" else 0
    state0 = _rand(3, heads, p, n, dtype=torch.float32, gen=gen)
    x = _rand(batch, heads, p, dtype=dtype, gen=gen, offset=off)
    dt = _rand(batch, heads, dtype=dtype, gen=gen)
    a = -torch.rand(heads, generator=gen).cuda() - 0.5
    b, c = _rand(batch, groups, n, dtype=dtype, gen=gen), _rand(batch, groups, n, dtype=dtype, gen=gen)
    d, bias = _rand(heads, dtype=torch.float32, gen=gen), _rand(heads, dtype=torch.float32, gen=gen)
    index = torch.tensor([2, 0][:batch], dtype=torch.int32, device="cuda")

    def run() -> list[torch.Tensor]:
        state = state0.clone()
        out = torch.full_like(x, float("nan"))
        state_update.selective_state_update(state, x, dt, a, b, c, d, None, bias, True, index, out)
        return [out, state]

    return run


def _conv(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    """The prefill convolution's paths: channel-first, channel-last, and with ``seq_idx`` (both layouts)."""
    batch, dim, length, width = (1, 64, 1, 4) if variant == "one" else (2, 128, 37, 4)
    off = 1 if variant == "misaligned" else 0
    first = _rand(batch, dim, length, dtype=dtype, gen=gen, offset=off)
    last = _rand(batch, length, dim, dtype=dtype, gen=gen, offset=off).transpose(1, 2)
    weight, bias = _rand(dim, width, dtype=dtype, gen=gen), _rand(dim, dtype=dtype, gen=gen)
    seq_idx = (torch.arange(length, dtype=torch.int32, device="cuda") >= length // 2).to(torch.int32)
    seq_idx = seq_idx.expand(batch, length).contiguous()

    def run() -> list[torch.Tensor]:
        outs = []
        for x, seq in ((first, None), (last, None), (first, seq_idx), (last, seq_idx)):
            out = torch.full_like(x, float("nan"))
            final = torch.full((batch, dim, width - 1), float("nan"), dtype=dtype, device="cuda")
            causal_conv1d.causal_conv1d(x, weight, bias, "silu", seq, None, out, final)
            outs += [out, final]
        return outs

    return run


def _conv_tuned(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    """The prefill convolution's autotuned channel-first path (``TUNE_MIN_NUMEL`` elements or more)."""
    batch, dim, length, width = 1, 1024, 16384, 4  # "one" is "aligned" here: the tuned path needs the size
    assert batch * dim * length >= causal_conv1d.TUNE_MIN_NUMEL
    off = 1 if variant == "misaligned" else 0
    x = _rand(batch, dim, length, dtype=dtype, gen=gen, offset=off)
    weight, bias = _rand(dim, width, dtype=dtype, gen=gen), _rand(dim, dtype=dtype, gen=gen)

    def run() -> list[torch.Tensor]:
        out = torch.full_like(x, float("nan"))
        final = torch.full((batch, dim, width - 1), float("nan"), dtype=dtype, device="cuda")
        causal_conv1d.causal_conv1d(x, weight, bias, "silu", None, None, out, final)
        return [out, final]

    return run


def _rms_norm_gated(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    t = 1 if variant == "one" else 10
    h, group = 1024, 256
    off = 1 if variant == "misaligned" else 0
    x, z = _rand(t, h, dtype=dtype, gen=gen, offset=off), _rand(t, h, dtype=dtype, gen=gen)
    w, b = _rand(h, dtype=dtype, gen=gen), _rand(h, dtype=dtype, gen=gen)

    def run() -> list[torch.Tensor]:
        out = torch.full((t, h), float("nan"), dtype=dtype, device="cuda")
        return [rms_norm_gated.rms_norm_gated(x, w, b, z, 1e-5, group, variant != "one", out)]

    return run


def _sampling(dtype: torch.dtype, variant: str, gen: torch.Generator) -> Case:
    rows = 1 if variant == "one" else 5
    off = 1 if variant == "misaligned" else 0
    logits = _rand(rows, 1000, dtype=dtype, gen=gen, offset=off)
    seed = torch.arange(rows, dtype=torch.int64, device="cuda") + 7

    def run() -> list[torch.Tensor]:
        with ops.use("triton"):
            ids = ops.top_k_top_p_sampling_from_logits(logits, 50, 0.9, temperature=0.8, seed=seed, offset=3)
        return [ids]

    return run


CASES: dict[str, Callable[[torch.dtype, str, torch.Generator], Case]] = {
    "rms_norm": _rms_norm, "fused_add_rms_norm": _fused_add_rms_norm, "silu_and_mul": _silu_and_mul,
    "fused_qk_norm_rope": _qk_norm_rope, "reshape_and_cache_flash": _reshape_and_cache, "gemv": _gemv_case,
    "gemm_swiglu": _gemm_swiglu, "gemm_add_rms_norm": _gemm_add_rms_norm, "rms_norm_gemm": _rms_norm_gemm,
    "flash_attn_with_kvcache": _decode,
    "decode_append_combine": _decode_separate,
    "add": _add, "rotary_embedding": _rotary, "fused_qk_norm": _qk_norm, "causal_conv1d_update": _conv_update,
    "selective_state_update": _state_update, "causal_conv1d": _conv, "causal_conv1d_tuned": _conv_tuned,
    "rms_norm_gated": _rms_norm_gated,
    "top_k_top_p_sampling_from_logits": _sampling,
}


@pytest.fixture
def misses(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every launch that went through Triton instead of the fast path, as (launcher, key)."""
    seen: list[Any] = []
    miss = _fastlaunch.Launcher._miss

    def counted(self: Any, key: Any, *rest: Any) -> None:
        seen.append((self, key))
        miss(self, key, *rest)

    monkeypatch.setattr(_fastlaunch.Launcher, "_miss", counted)
    for launcher in switched_launchers():  # every test starts with no kernel kept
        launcher.clear()
    previous = _fastlaunch.set_enabled(True)
    yield seen
    _fastlaunch.set_enabled(previous)


def _plain(run: Case) -> list[torch.Tensor]:
    _fastlaunch.set_enabled(False)
    try:
        return run()
    finally:
        _fastlaunch.set_enabled(True)


def _assert_same(got: list[torch.Tensor], expected: list[torch.Tensor], what: str) -> None:
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert not e.isnan().any(), f"{what}: the plain launch left output {i} unwritten"
        assert torch.equal(g, e), f"{what}: output {i} differs by {(g.float() - e.float()).abs().max().item()}"


# the autotuned ones tune once per dtype and row class (several compiles each): two dtypes
_TUNED = ("gemv", "gemm_swiglu", "gemm_add_rms_norm", "rms_norm_gemm", "flash_attn_with_kvcache",
          "decode_append_combine", "causal_conv1d_tuned")
PARAMS = [pytest.param(name, dtype, variant, id=f"{name}-{str(dtype).removeprefix('torch.')}-{variant}")
          for name in CASES for dtype in (DTYPES[1:] if name in _TUNED else DTYPES) for variant in VARIANTS]


@pytest.mark.parametrize(("name", "dtype", "variant"), PARAMS)
def test_the_fast_path_gives_the_plain_launchs_output(name: str, dtype: torch.dtype, variant: str,
                                                      misses: list[Any]) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name} {dtype} {variant}".encode()))
    run = CASES[name](dtype, variant, gen)
    expected = _plain(run)  # compiles and tunes as before
    run()  # the fast path's first call of each key goes through Triton and keeps the kernel
    first = len(misses)
    assert first > 0, f"{name}: no launcher took the fast path"
    got = run()
    assert len(misses) == first, f"{name}: the second call missed: {misses[first:]}"
    _assert_same(got, expected, f"{name} {dtype} {variant}")
    got = run()  # the planned call (tensors passed as addresses), made at the first hit
    assert len(misses) == first, f"{name}: the third call missed: {misses[first:]}"
    _assert_same(got, expected, f"{name} {dtype} {variant}, planned")

    side = torch.cuda.Stream()  # another stream: the launch must follow the current one
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = run()
    torch.cuda.current_stream().wait_stream(side)
    assert len(misses) == first
    _assert_same(got, expected, f"{name} {dtype} {variant} on a side stream")


@pytest.mark.parametrize("name", list(CASES))
def test_a_captured_fast_launch_replays_on_the_capture_stream(name: str, misses: list[Any]) -> None:
    """A launch on another stream than the capturing one is an error during capture, or missing from the
    graph: the replayed outputs equal the plain launch's."""
    gen = torch.Generator().manual_seed(1)
    make = CASES[name](torch.bfloat16, "aligned", gen)
    expected = _plain(make)
    make()  # warm: every key kept
    first = len(misses)
    outputs: list[torch.Tensor] = []
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        make()  # warm on the side stream (allocator pools), as torch.cuda.graphs asks
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        outputs = make()
    assert len(misses) == first
    for o in outputs:
        o.fill_(float("nan") if o.is_floating_point() else -7)  # the sampler's ids are >= -1
    graph.replay()
    torch.cuda.synchronize()
    _assert_same(outputs, expected, f"{name} replayed")


def test_another_specialization_compiles_its_own_kernel(misses: list[Any]) -> None:
    """Aligned, then misaligned, then a size of 1 through one launcher: three keys, three kernels, each
    output the plain launch's."""
    gen = torch.Generator().manual_seed(2)
    launcher = rms_norm._RMS_NORM
    for count, variant in enumerate(("aligned", "misaligned", "one"), start=1):
        run = _rms_norm(torch.float16, variant, gen)
        expected = _plain(run)
        _assert_same(run(), expected, f"rms_norm {variant}")  # a miss: through Triton, kept
        assert len(launcher._cache) == count, (variant, list(launcher._cache))
        _assert_same(run(), expected, f"rms_norm {variant}, second call")  # a hit of its own key
        assert len(launcher._cache) == count
    assert len({key for who, key in misses if who is launcher}) == 3
    assert len({id(b.compiled) for b in launcher._cache.values()}) == 3  # not one binary for three keys


def test_raw_stream_is_the_current_streams_handle() -> None:
    from infiniops_triton._common import raw_stream

    device = torch.device("cuda", torch.cuda.current_device())
    assert raw_stream(device) == torch.cuda.current_stream().cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert raw_stream(device) == side.cuda_stream != 0
        assert raw_stream(torch.device("cuda")) == side.cuda_stream  # no index: the current device
