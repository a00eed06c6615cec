"""causal_conv1d, causal_conv1d_update, selective_scan and selective_state_update on CPU.

The reference and torch providers against the float64 reference (tolerance table), the identities the
contract promises (the chunked scan equals the sequential one for any chunk size, the state update is one
scan step, the conv update is the full conv's last column, packed sequences do not mix), empty inputs,
skipped padding rows, and one contract error per kind and entry point, naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import infiniops_py as io
from infiniops_py import ContractError, unchecked_indices
from infiniops_py.operators._base import dtype_name
from infiniops_py.operators.selective_scan import process_dt
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

PROVIDERS = ("reference", "torch")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
META = torch.device("meta")


class Rand:
    """Fresh normal tensors from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, *shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=self.gen) * scale).to(dtype)

    def uniform(self, *shape: int, low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(*shape, generator=self.gen)


def _f64(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.to(torch.float64) if tree.is_floating_point() else tree.clone()
    if isinstance(tree, dict):
        return {k: _f64(v) for k, v in tree.items()}
    return tree


def _check(op: str, got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, exact: bool = False) -> None:
    _, message = compare(op, got, ref, tolerance(op, dtype_name(dtype)), exact=exact)
    assert message is None, message


def _run(provider: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Run on `args` under `provider`, and on float64 copies under the reference; returns both, plus the
    float64 copies of the args (in-place outputs) as the third item of each pair."""
    args64, kwargs64 = tuple(_f64(a) for a in args), _f64(kwargs)
    with io.use("reference"):
        expected = fn(*args64, **kwargs64)
    with io.use(provider):
        got = fn(*args, **kwargs)
    return (got, args), (expected, args64)


# --- inputs ----------------------------------------------------------------------------------------

def _conv_inputs(r: Rand, dtype: torch.dtype, b: int, d: int, length: int, w: int) -> tuple[torch.Tensor, ...]:
    return r(b, d, length, dtype=dtype), r(d, w, dtype=dtype, scale=w**-0.5), r(d, dtype=dtype)


def _runs(b: int, length: int, starts: tuple[int, ...], pad: int = 0) -> torch.Tensor:
    ids = torch.zeros(b, length, dtype=torch.int32)
    for s in starts:
        ids[:, s:] += 1
    if pad:
        ids[:, length - pad:] = -1
    return ids


def _scan_inputs(r: Rand, dtype: torch.dtype, b: int, length: int, h: int, p: int, g: int, n: int
                 ) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    x, dt = r(b, length, h, p, dtype=dtype), r(b, length, h, dtype=dtype, scale=0.5)
    A = -torch.exp(r(h, scale=0.5))
    B, C = r(b, length, g, n, dtype=dtype), r(b, length, g, n, dtype=dtype)
    kwargs = {"D": r(h, p), "z": r(b, length, h, p, dtype=dtype), "dt_softplus": True,
              "dt_bias": torch.log(torch.expm1(r.uniform(h, low=1e-3, high=0.1)))}
    return (x, dt, A, B, C), kwargs


def _update_inputs(r: Rand, dtype: torch.dtype, slots: int, b: int, h: int, p: int, g: int, n: int
                   ) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    args = (r(slots, h, p, n), r(b, h, p, dtype=dtype), r(b, h, dtype=dtype, scale=0.5), -torch.exp(r(h, scale=0.5)),
            r(b, g, n, dtype=dtype), r(b, g, n, dtype=dtype))
    kwargs = {"D": r(h), "z": r(b, h, p, dtype=dtype), "dt_softplus": True,
              "dt_bias": torch.log(torch.expm1(r.uniform(h, low=1e-3, high=0.1)))}
    return args, kwargs


# --- agreement with the float64 reference ----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_causal_conv1d_matches_float64(provider: str, dtype: torch.dtype, packed: bool) -> None:
    r = Rand(1)
    b, d, length, w = 2, 40, 129 if packed else 151, 4 if packed else 3
    x, weight, bias = _conv_inputs(r, dtype, b, d, length, w)
    kwargs: dict[str, Any] = {"activation": "silu", "return_final_states": True}
    if packed:  # channel-last view, initial states, three sequences and trailing padding
        x = r(b, length, d, dtype=dtype).transpose(1, 2)
        kwargs |= {"seq_idx": _runs(b, length, (50, 90), pad=7), "initial_states": r(b, d, w - 1, dtype=dtype)}
    (got, _), (ref, _) = _run(provider, io.causal_conv1d, (x, weight, bias), kwargs)
    assert got[0].stride() == x.stride() or not packed
    _check("causal_conv1d", got[0], ref[0], dtype)
    _check("causal_conv1d", got[1], ref[1], dtype, exact=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_causal_conv1d_update_matches_float64(provider: str, dtype: torch.dtype) -> None:
    r = Rand(2)
    b, d, w, s, slots = 4, 24, 4, 6, 7
    state = r(slots, s, d, dtype=dtype).transpose(1, 2)  # vLLM's layout
    index = torch.tensor([5, -1, 0, 3], dtype=torch.int32)
    x, weight, bias = _conv_inputs(r, dtype, b, d, 2, w)
    (got, args), (ref, args64) = _run(provider, io.causal_conv1d_update, (x, state, weight, bias),
                                      {"activation": "silu", "conv_state_indices": index})
    _check("causal_conv1d_update", got, ref, dtype)
    _check("causal_conv1d_update", args[1], args64[1], dtype, exact=True)
    assert torch.equal(got[1], torch.zeros_like(got[1]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_selective_scan_matches_float64(provider: str, dtype: torch.dtype) -> None:
    r = Rand(3)
    b, length, h, p, g, n = 2, 100, 4, 8, 2, 16
    args, kwargs = _scan_inputs(r, dtype, b, length, h, p, g, n)
    kwargs |= {"initial_states": r(b, h, p, n), "seq_idx": _runs(b, length, (30, 61)), "chunk_size": 32,
               "return_final_states": True}
    (got, _), (ref, _) = _run(provider, io.selective_scan, args, kwargs)
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    _check("selective_scan", got[0], ref[0], dtype)
    _check("selective_scan", got[1], ref[1], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_selective_state_update_matches_float64(provider: str, dtype: torch.dtype) -> None:
    r = Rand(4)
    args, kwargs = _update_inputs(r, dtype, slots=6, b=3, h=4, p=16, g=2, n=8)
    kwargs["state_batch_indices"] = torch.tensor([4, -1, 1])
    before = args[0].clone()
    (got, args), (ref, args64) = _run(provider, io.selective_state_update, args, kwargs)
    _check("selective_state_update", got, ref, dtype)
    _check("selective_state_update", args[0], args64[0], dtype)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    assert torch.equal(args[0][[0, 2, 3, 5]], before[[0, 2, 3, 5]])


# --- identities ------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk_size", [16, 24, 7, 64, 256])
def test_chunked_scan_equals_sequential(chunk_size: int) -> None:
    r = Rand(5)
    args, kwargs = _scan_inputs(r, torch.float32, 2, 64, 4, 8, 1, 16)
    kwargs |= {"initial_states": r(2, 4, 8, 16), "seq_idx": _runs(2, 64, (20, 33)), "return_final_states": True,
               "chunk_size": chunk_size, "dt_limit": (1e-3, 0.08)}
    with io.use("torch"):
        chunked = io.selective_scan(*args, **kwargs)
    with io.use("reference"):
        sequential = io.selective_scan(*args, **kwargs)
    for got, ref in zip(chunked, sequential):
        _check("selective_scan", got, ref.double(), torch.float32)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_state_update_is_one_scan_step(provider: str) -> None:
    r = Rand(6)
    length = 9
    (x, dt, A, B, C), kwargs = _scan_inputs(r, torch.float32, 2, length, 4, 4, 2, 8)
    z = kwargs.pop("z")
    with io.use(provider):
        before = io.selective_scan(x[:, :-1], dt[:, :-1], A, B[:, :-1], C[:, :-1], **kwargs,
                                   z=z[:, :-1], return_final_states=True)[1]
        y, after = io.selective_scan(x, dt, A, B, C, **kwargs, z=z, return_final_states=True)
        state = before.clone()
        step = io.selective_state_update(state, x[:, -1], dt[:, -1], A, B[:, -1], C[:, -1], **kwargs,
                                         z=z[:, -1])
    _check("selective_state_update", step, y[:, -1].double(), torch.float32)
    _check("selective_state_update", state, after.double(), torch.float32)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("state_len", [3, 6])
def test_conv_update_is_last_column(provider: str, state_len: int) -> None:
    r = Rand(7)
    b, d, length, w = 2, 16, 12, 4
    x, weight, bias = _conv_inputs(r, torch.float32, b, d, length, w)
    with io.use(provider):
        full = io.causal_conv1d(x, weight, bias, activation="silu")
        state = x[:, :, length - 1 - state_len:length - 1].clone()
        last = io.causal_conv1d_update(x[:, :, -1], state, weight, bias, activation="silu")
    _check("causal_conv1d_update", last, full[:, :, -1].double(), torch.float32)
    assert torch.equal(state, x[:, :, -state_len:])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_seq_idx_does_not_mix_sequences(provider: str) -> None:
    r = Rand(8)
    d, w, la, lb = 8, 4, 11, 6
    x, weight, bias = _conv_inputs(r, torch.float32, 1, d, la + lb, w)
    (sx, sdt, A, B, C), kwargs = _scan_inputs(r, torch.float32, 1, la + lb, 2, 4, 1, 8)
    seq_idx, part = _runs(1, la + lb, (la,)), slice(la, None)
    with io.use(provider):
        packed, final = io.causal_conv1d(x, weight, bias, seq_idx=seq_idx, return_final_states=True)
        first = io.causal_conv1d(x[:, :, :la], weight, bias)
        second, second_final = io.causal_conv1d(x[:, :, part], weight, bias, return_final_states=True)
        y, state = io.selective_scan(sx, sdt, A, B, C, **kwargs, seq_idx=seq_idx, chunk_size=4,
                                     return_final_states=True)
        y1 = io.selective_scan(sx[:, :la], sdt[:, :la], A, B[:, :la], C[:, :la], **kwargs | {"z": kwargs["z"][:, :la]})
        y2, state2 = io.selective_scan(sx[:, part], sdt[:, part], A, B[:, part], C[:, part],
                                       **kwargs | {"z": kwargs["z"][:, part]}, return_final_states=True)
    torch.testing.assert_close(packed[:, :, :la], first)
    torch.testing.assert_close(packed[:, :, part], second)
    assert torch.equal(final, second_final)
    torch.testing.assert_close(y[:, :la], y1)
    torch.testing.assert_close(y[:, part], y2)
    torch.testing.assert_close(state, state2)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_conv_padding_and_final_states(provider: str) -> None:
    r = Rand(9)
    x, weight, bias = _conv_inputs(r, torch.float32, 1, 4, 10, 4)
    with io.use(provider):
        out, final = io.causal_conv1d(x, weight, bias, seq_idx=_runs(1, 10, (9,)), return_final_states=True)
        padded = io.causal_conv1d(x, weight, bias, seq_idx=_runs(1, 10, (), pad=3))
    assert torch.equal(final[:, :, :2], torch.zeros(1, 4, 2))  # before the last sequence: 0
    assert torch.equal(final[:, :, 2], x[:, :, 9])
    assert torch.equal(padded[:, :, 7:], torch.zeros(1, 4, 3))  # padding outputs 0
    assert torch.all(out[:, :, :9] != 0)


def test_dt_processing() -> None:
    dt = torch.tensor([[-3.0, 0.5, 25.0]], dtype=torch.float64)
    got = process_dt(dt, None, True, (0.0, math.inf), torch.float64)
    assert got[0, 2] == 25.0  # softplus passes values above 20 through
    torch.testing.assert_close(got[0, :2], F.softplus(dt[0, :2]))
    assert process_dt(dt, None, False, (0.0, math.inf), torch.float64)[0, 0] == 0.0  # negative steps clamp to 0
    assert process_dt(dt, torch.tensor([1.0]), False, (0.0, 2.0), torch.float64).tolist() == [[0.0, 1.5, 2.0]]
    assert process_dt(dt, None, False, None, torch.float64).tolist() == dt.tolist()  # no limit: no clamp


# --- mamba's and causal-conv1d's semantics and arguments ---------------------------------------------

def _mamba_step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mamba's ``selective_state_update_ref`` in float64, untied form (dt [B, H, P], A [H, P, N], dt_bias
    [H, P], D [H, P], B/C [B, H, N] per head): no softplus, no clamp; returns (out, new state)."""
    step = (dt + dt_bias)[..., None]  # [B, H, P, 1]
    new = state * torch.exp(step * A) + step * B[:, :, None, :] * x[..., None]
    return (new * C[:, :, None, :]).sum(-1) + x * D, new


@pytest.mark.parametrize("provider", PROVIDERS)
def test_state_update_never_clamps_a_negative_step(provider: str) -> None:
    """mamba's selective_state_update has no dt_limit: with dt_softplus=False a negative dt + dt_bias stays
    negative (the state grows by exp(|dt A|)); the SSD scan still clamps to its (0, inf) default."""
    r = Rand(30)
    b, h, p, n = 2, 3, 4, 8
    state, x, B, C = r(b, h, p, n), r(b, h, p), r(b, 1, n), r(b, 1, n)
    dt = torch.tensor([[-0.4, 0.2, -1.5], [0.3, -0.8, 0.1]])
    A, D, dt_bias = -torch.exp(r(h, scale=0.5)), r(h), torch.tensor([0.05, -0.1, 0.2])
    untied = dict(dt=dt[..., None].expand(b, h, p).double(), A=A[:, None, None].expand(h, p, n).double(),
                  dt_bias=dt_bias[:, None].expand(h, p).double(), D=D[:, None].expand(h, p).double())
    want, want_state = _mamba_step(state.double(), x.double(), untied["dt"], untied["A"], B.double().expand(b, h, n),
                                   C.double().expand(b, h, n), untied["D"], untied["dt_bias"])
    got_state = state.clone()
    with io.use(provider):
        got = io.selective_state_update(got_state, x, dt, A, B, C, D=D, dt_bias=dt_bias)
        scanned, scan_state = io.selective_scan(x[:, None], dt[:, None], A, B[:, None], C[:, None], D=D,
                                                dt_bias=dt_bias, initial_states=state, return_final_states=True)
    _check("selective_state_update", got, want, torch.float32)
    _check("selective_state_update", got_state, want_state, torch.float32)
    step = (untied["dt"] + untied["dt_bias"]).clamp(min=0.0)  # the scan's dt_limit (0, inf)
    scan_want, scan_want_state = _mamba_step(state.double(), x.double(), step, untied["A"],
                                             B.double().expand(b, h, n), C.double().expand(b, h, n), untied["D"],
                                             torch.zeros_like(untied["dt_bias"]))
    _check("selective_scan", scanned[:, 0], scan_want, torch.float32)
    _check("selective_scan", scan_state, scan_want_state, torch.float32)
    assert (want_state - scan_want_state).abs().max() > 0.1  # the two rules differ on this input


@pytest.mark.parametrize("provider", PROVIDERS)
def test_state_update_takes_mambas_untied_layouts(provider: str) -> None:
    """dt [B, H, P], A [H, P, N] and dt_bias [H, P], each on its own, follow mamba's per-channel recurrence;
    stride-0 views of per-head values (mamba's "tied" calls) equal the per-head call."""
    r = Rand(31)
    b, h, p, n, g = 3, 4, 4, 8, 2
    state, x, B, C = r(b, h, p, n), r(b, h, p), r(b, g, n), r(b, g, n)
    dt, A, dt_bias, D = r.uniform(b, h, p, low=-0.1, high=0.3), -r.uniform(h, p, n, low=0.1, high=2.0), \
        r(h, p, scale=0.1), r(h, p)
    rep = lambda t: t.double().repeat_interleave(h // g, dim=1)  # noqa: E731
    for form in ({"dt": dt}, {"A": A}, {"dt_bias": dt_bias}, {"dt": dt, "A": A, "dt_bias": dt_bias}):
        args = {"dt": dt.mean(2), "A": A.mean((1, 2)), "dt_bias": dt_bias.mean(1)} | form
        full = {"dt": args["dt"] if args["dt"].dim() == 3 else args["dt"][..., None].expand(b, h, p),
                "A": args["A"] if args["A"].dim() == 3 else args["A"][:, None, None].expand(h, p, n),
                "dt_bias": args["dt_bias"] if args["dt_bias"].dim() == 2 else args["dt_bias"][:, None].expand(h, p)}
        want, want_state = _mamba_step(state.double(), x.double(), full["dt"].double(), full["A"].double(), rep(B),
                                       rep(C), D.double(), full["dt_bias"].double())
        got_state = state.clone()
        with io.use(provider):
            got = io.selective_state_update(got_state, x, args["dt"], args["A"], B, C, D=D, dt_bias=args["dt_bias"])
        _check("selective_state_update", got, want, torch.float32)
        _check("selective_state_update", got_state, want_state, torch.float32)
    per_head, tied = state.clone(), state.clone()
    with io.use(provider):
        y = io.selective_state_update(per_head, x, dt[:, :, 0], A[:, 0, 0], B, C, D=D, dt_bias=dt_bias[:, 0])
        y_tied = io.selective_state_update(tied, x, dt[:, :, :1].expand(b, h, p), A[:, :1, :1].expand(h, p, n), B, C,
                                           D=D, dt_bias=dt_bias[:, :1].expand(h, p))
    assert torch.equal(y, y_tied) and torch.equal(per_head, tied)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_state_update_takes_untied_views_of_any_strides(provider: str) -> None:
    """dt [B, H, P] and A [H, P, N] may be any strided views (the contract: any strides): a permuted A whose
    densest dim is H, and a transposed dt, give the results of their contiguous copies."""
    r = Rand(38)
    b, h, p, n, g = 2, 4, 1, 5, 2
    state, x, B, C = r(b, h, p, n), r(b, h, p), r(b, g, n), r(b, g, n)
    A = -r.uniform(n, p, h, low=0.1, high=2.0).permute(2, 1, 0)  # [H, P, N], strides (1, H, H * P)
    dt = r.uniform(b, p, h, low=0.0, high=0.3).transpose(1, 2)  # [B, H, P]
    strided, dense = state.clone(), state.clone()
    with io.use(provider):
        y = io.selective_state_update(strided, x, dt, A, B, C)
        want = io.selective_state_update(dense, x, dt.contiguous(), A.contiguous(), B, C)
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(strided, dense, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_state_update_keeps_16bit_states(provider: str, dtype: torch.dtype) -> None:
    """A 16-bit state (mamba's kernel keeps any) is updated in fp32 and rounded once to its dtype; the
    output comes from the unrounded state, as from a float32 state holding the same values."""
    r = Rand(32)
    args, kwargs = _update_inputs(r, dtype, slots=3, b=3, h=4, p=8, g=2, n=8)
    state16 = args[0].to(dtype)
    state32 = state16.float()
    with io.use(provider):
        y16 = io.selective_state_update(state16, *args[1:], **kwargs)
        y32 = io.selective_state_update(state32, *args[1:], **kwargs)
    assert state16.dtype == dtype
    assert torch.equal(y16, y32)
    assert torch.equal(state16, state32.to(dtype))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_conv_update_circular_state_is_a_rotated_rolling_state(provider: str) -> None:
    """causal-conv1d's cache_seqlens: the slot, read from its write position on, is the rolling state of the
    plain update (same outputs), and after the step it is the new rolling state read from position + L;
    a padded row leaves its slot alone."""
    r = Rand(33)
    d, w, s = 8, 4, 5
    for length in (1, 3, 7):  # 7 > S: the later columns win
        x, weight, bias = _conv_inputs(r, torch.float32, 3, d, length, w)
        state = r(4, d, s)
        pos = torch.tensor([7, 0, 12], dtype=torch.int32)
        index = torch.tensor([2, -1, 0], dtype=torch.int32)
        rolled = [(int(q) + torch.arange(s)) % s for q in pos]
        rolling = torch.stack([state[int(i)][:, rolled[b]] for b, i in enumerate(index.clamp(min=0))])
        circ = state.clone()
        with io.use(provider):
            got = io.causal_conv1d_update(x, circ, weight, bias, "silu", pos, index)
            want = io.causal_conv1d_update(x, rolling, weight, bias, activation="silu")
        for b, i in enumerate(index.tolist()):
            if i < 0:
                assert torch.equal(got[b], torch.zeros_like(got[b]))
                continue
            torch.testing.assert_close(got[b], want[b])
            after = (int(pos[b]) + length + torch.arange(s)) % s
            assert torch.equal(circ[i][:, after], rolling[b])
        assert torch.equal(circ[[1, 3]], state[[1, 3]])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_conv_final_states_out_is_filled_and_returned(provider: str) -> None:
    """causal-conv1d's final_states_out: the final states are written into the caller's buffer (any layout)
    and it is the tensor returned; without return_final_states it is refused (the peer ignores it)."""
    r = Rand(34)
    x, weight, bias = _conv_inputs(r, torch.float32, 2, 6, 11, 4)
    buffer = torch.full((2, 3, 6), math.nan).transpose(1, 2)
    with io.use(provider):
        out, final = io.causal_conv1d(x, weight, bias, None, None, True, buffer, "silu")
        want_out, want_final = io.causal_conv1d(x, weight, bias, activation="silu", return_final_states=True)
    assert final is buffer
    assert torch.equal(buffer, want_final) and torch.equal(out, want_out)
    with pytest.raises(ContractError, match="final_states_out: is written only with return_final_states=True"):
        io.causal_conv1d(x, weight, bias, final_states_out=buffer)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_packed_conv_equals_one_update_per_sequence(provider: str) -> None:
    """vLLM's packed prefill: each sequence of x [D, T] is causal_conv1d_update of its columns against its
    slot (zeroed without an initial state), the slot keeping the last S columns; a padded sequence (-1)
    outputs 0 and leaves every slot alone; an empty one only resets its slot."""
    r = Rand(35)
    d, w, s, lengths = 8, 4, 5, (6, 0, 2, 9, 3)
    starts = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    x = r(sum(lengths), d).t()  # vLLM's channel-last layout
    weight, bias = r(d, w, scale=0.5), r(d)
    states = r(6, d, s)
    index = torch.tensor([4, 1, -1, 0, 2], dtype=torch.int32)
    initial = torch.tensor([True, False, True, False, True])
    packed = states.clone()
    with io.use(provider):
        out = io.causal_conv1d(x, weight, bias, activation="silu", conv_states=packed, query_start_loc=starts,
                               cache_indices=index, has_initial_state=initial)
        assert out.shape == x.shape and out.stride() == x.stride()
        for i, (lo, hi) in enumerate(zip(starts[:-1].tolist(), starts[1:].tolist())):
            slot = int(index[i])
            if slot < 0:
                assert torch.equal(out[:, lo:hi], torch.zeros(d, hi - lo))
                continue
            state = states[slot:slot + 1].clone() if initial[i] else torch.zeros(1, d, s)
            if hi > lo:
                want = io.causal_conv1d_update(x[None, :, lo:hi], state, weight, bias, activation="silu")
                torch.testing.assert_close(out[:, lo:hi], want[0])
            assert torch.equal(packed[slot], state[0])
    assert torch.equal(packed[[3, 5]], states[[3, 5]])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_packed_scan_equals_one_scan_per_sequence(provider: str) -> None:
    """mamba's packed row: each sequence of cu_seqlens starts from its own initial state (mamba's one-row
    form: the first sequence's, the others from zero), seq_idx restarts inside a sequence as well, the
    varlen states are each sequence's final state (an empty one's is its initial state), the final state
    is the last sequence's; results come in mamba's order."""
    r = Rand(36)
    lengths, h, p, g, n = (9, 0, 21, 5), 2, 4, 1, 8
    total = sum(lengths)
    (x, dt, A, B, C), kwargs = _scan_inputs(r, torch.float32, 1, total, h, p, g, n)
    cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    init = r(len(lengths), h, p, n)
    seq_idx = _runs(1, total, (3, 20))  # restarts inside sequences 0 and 2
    for initial in (init, init[:1]):
        with io.use(provider):
            y, final, varlen = io.selective_scan(x, dt, A, B, C, 8, **kwargs, initial_states=initial,
                                                 seq_idx=seq_idx, cu_seqlens=cu, return_final_states=True,
                                                 return_varlen_states=True)
            only_varlen = io.selective_scan(x, dt, A, B, C, 8, **kwargs, initial_states=initial, seq_idx=seq_idx,
                                            cu_seqlens=cu, return_varlen_states=True)
            for i, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
                own = initial[i:i + 1] if i < initial.shape[0] else torch.zeros(1, h, p, n)
                if hi == lo:
                    assert torch.equal(varlen[i], own[0])
                    continue
                part = slice(lo, hi)
                want, want_state = io.selective_scan(
                    x[:, part], dt[:, part], A, B[:, part], C[:, part], 16, **kwargs | {"z": kwargs["z"][:, part]},
                    initial_states=own, seq_idx=seq_idx[:, part], return_final_states=True)
                _check("selective_scan", y[:, part], want.double(), torch.float32)
                _check("selective_scan", varlen[i:i + 1], want_state.double(), torch.float32)
        assert torch.equal(final, varlen[-1:]) and final.shape == (1, h, p, n)
        assert len(only_varlen) == 2 and torch.equal(only_varlen[1], varlen)


def test_entry_points_take_the_peers_argument_order() -> None:
    """Positional calls written for the peers run unchanged: causal-conv1d's causal_conv1d_fn (x, weight,
    bias, seq_idx, initial_states, return_final_states, final_states_out, activation) and
    causal_conv1d_update (x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices),
    mamba's mamba_chunk_scan_combined (x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
    seq_idx, cu_seqlens, dt_softplus, dt_limit, return_final_states, return_varlen_states) and
    selective_state_update (state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)."""
    r = Rand(37)
    x, weight, bias = _conv_inputs(r, torch.float32, 2, 8, 10, 4)
    init = r(2, 8, 3)
    assert all(torch.equal(a, b) for a, b in zip(
        io.causal_conv1d(x, weight, bias, None, init, True, None, "silu"),
        io.causal_conv1d(x, weight, bias, initial_states=init, return_final_states=True, activation="silu")))
    state, index = r(3, 8, 3), torch.tensor([2, 0], dtype=torch.int32)
    s1, s2 = state.clone(), state.clone()
    assert torch.equal(io.causal_conv1d_update(x[:, :, 0], s1, weight, bias, "silu", None, index),
                       io.causal_conv1d_update(x[:, :, 0], s2, weight, bias, activation="silu",
                                               conv_state_indices=index))
    (sx, sdt, A, B, C), kw = _scan_inputs(r, torch.float32, 1, 12, 2, 4, 1, 8)
    positional = io.selective_scan(sx, sdt, A, B, C, 4, kw["D"], kw["z"], kw["dt_bias"], None, None, None, True,
                                   (0.0, math.inf), True, False)
    named = io.selective_scan(sx, sdt, A, B, C, chunk_size=4, **kw, return_final_states=True)
    assert all(torch.equal(a, b) for a, b in zip(positional, named))
    (st, ux, udt, uA, uB, uC), ukw = _update_inputs(r, torch.float32, slots=3, b=2, h=4, p=4, g=2, n=8)
    st2, idx = st.clone(), torch.tensor([2, 0])
    positional = io.selective_state_update(st, ux, udt, uA, uB, uC, ukw["D"], ukw["z"], ukw["dt_bias"], True, idx)
    assert torch.equal(positional, io.selective_state_update(st2, ux, udt, uA, uB, uC, **ukw, state_batch_indices=idx))


# --- empty inputs, unchecked indices ---------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_empty_inputs(provider: str) -> None:
    r = Rand(10)
    init = r(2, 3, 3)
    _, weight, bias = _conv_inputs(r, torch.float32, 2, 3, 1, 4)
    (x, dt, A, B, C), kwargs = _scan_inputs(r, torch.float32, 2, 0, 2, 4, 1, 8)
    states = r(2, 2, 4, 8)
    with io.use(provider):
        out, final = io.causal_conv1d(r(2, 3, 0), weight, bias, initial_states=init, return_final_states=True)
        y, final_scan = io.selective_scan(x, dt, A, B, C, **kwargs, initial_states=states, return_final_states=True)
        upd = io.causal_conv1d_update(r(0, 3), r(0, 3, 5), weight, bias)
        step = io.selective_state_update(r(0, 2, 4, 8), r(0, 2, 4), r(0, 2), A, r(0, 1, 8), r(0, 1, 8))
    assert out.shape == (2, 3, 0) and torch.equal(final, init)
    assert y.shape == (2, 0, 2, 4) and torch.equal(final_scan, states)
    assert upd.shape == (0, 3) and step.shape == (0, 2, 4)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_packed_scan_of_no_sequences_takes_mambas_one_row_initial_state(provider: str) -> None:
    """cu_seqlens [0] (no sequence, no token) with mamba's one-row initial state [1, H, P, N]: it belongs to
    no sequence; the varlen states are empty and the final state is zeros."""
    r = Rand(39)
    (x, dt, A, B, C), kwargs = _scan_inputs(r, torch.float32, 1, 0, 2, 4, 1, 8)
    with io.use(provider):
        y, final, varlen = io.selective_scan(x, dt, A, B, C, **kwargs, initial_states=r(1, 2, 4, 8),
                                             cu_seqlens=torch.zeros(1, dtype=torch.int32), return_final_states=True,
                                             return_varlen_states=True)
    assert y.shape == (1, 0, 2, 4) and varlen.shape == (0, 2, 4, 8)
    assert torch.equal(final, torch.zeros(1, 2, 4, 8))


def test_unchecked_cu_seqlens_that_do_not_cut_the_row_never_index_out_of_bounds() -> None:
    """Unchecked, cu_seqlens that break the contract (past the row, decreasing, or no sequence for the row's
    tokens) give unspecified numbers, never an out-of-range index (a device-side assert on CUDA)."""
    r = Rand(40)
    (x, dt, A, B, C), kwargs = _scan_inputs(r, torch.float32, 1, 6, 2, 4, 1, 8)
    for cu in ([0, 2**31 - 1, 3], [0, 13], [5, 2, 6], [0]):
        index = torch.tensor(cu, dtype=torch.int32)
        init = r(len(cu) - 1, 2, 4, 8)
        with io.use("torch"), unchecked_indices():
            y, varlen = io.selective_scan(x, dt, A, B, C, 2, **kwargs, initial_states=init, cu_seqlens=index,
                                          return_varlen_states=True)
        assert y.shape == x.shape and varlen.shape == init.shape, cu


def test_unchecked_indices_are_skipped() -> None:
    r = Rand(11)
    _, weight, bias = _conv_inputs(r, torch.float32, 2, 8, 1, 4)
    conv_state, ssm_args = r(3, 8, 3), _update_inputs(r, torch.float32, slots=3, b=2, h=2, p=4, g=1, n=8)
    (state, x, dt, A, B, C), kwargs = ssm_args
    conv_before, state_before = conv_state.clone(), state.clone()
    index = torch.tensor([7, -2], dtype=torch.int32)
    with io.use("torch"), unchecked_indices():
        out = io.causal_conv1d_update(r(2, 8), conv_state, weight, bias, conv_state_indices=index)
        y = io.selective_state_update(state, x, dt, A, B, C, **kwargs, state_batch_indices=index)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(conv_state, conv_before)
    assert torch.equal(y, torch.zeros_like(y)) and torch.equal(state, state_before)


# --- contract errors: one per kind and entry point, naming the argument -----------------------------

def _conv_args() -> dict[str, Any]:
    r = Rand(12)
    x, weight, bias = _conv_inputs(r, torch.float32, 2, 8, 10, 4)
    return {"x": x, "weight": weight, "bias": bias, "seq_idx": _runs(2, 10, (4,)), "initial_states": r(2, 8, 3)}


def _conv_call(**change: Any) -> Any:
    kw = _conv_args() | change
    return io.causal_conv1d(kw.pop("x"), kw.pop("weight"), kw.pop("bias"), **kw)


def _conv_update_args() -> dict[str, Any]:
    r = Rand(13)
    x, weight, bias = _conv_inputs(r, torch.float32, 2, 8, 1, 4)
    return {"x": x[:, :, 0], "conv_state": r(4, 8, 3), "weight": weight, "bias": bias,
            "conv_state_indices": torch.tensor([3, -1], dtype=torch.int32)}


def _conv_update_call(**change: Any) -> Any:
    kw = _conv_update_args() | change
    return io.causal_conv1d_update(kw.pop("x"), kw.pop("conv_state"), kw.pop("weight"), kw.pop("bias"), **kw)


def _scan_args() -> dict[str, Any]:
    args, kwargs = _scan_inputs(Rand(14), torch.float32, 2, 10, 4, 4, 2, 8)
    return dict(zip(("x", "dt", "A", "B", "C"), args)) | kwargs | {"initial_states": Rand(16)(2, 4, 4, 8)}


def _scan_call(**change: Any) -> Any:
    kw = _scan_args() | change
    return io.selective_scan(*[kw.pop(k) for k in ("x", "dt", "A", "B", "C")], **kw)


def _packed_conv_args() -> dict[str, Any]:
    r = Rand(17)
    return {"x": r(12, 8).t(), "weight": r(8, 4), "bias": r(8), "conv_states": r(4, 8, 3),
            "query_start_loc": torch.tensor([0, 5, 5, 12], dtype=torch.int32),
            "cache_indices": torch.tensor([3, -1, 0], dtype=torch.int32),
            "has_initial_state": torch.tensor([True, False, False])}


def _packed_conv_call(**change: Any) -> Any:
    kw = _packed_conv_args() | change
    return io.causal_conv1d(kw.pop("x"), kw.pop("weight"), kw.pop("bias"), activation="silu", **kw)


def _circular_update_args() -> dict[str, Any]:
    return _conv_update_args() | {"cache_seqlens": torch.tensor([4, 1], dtype=torch.int32)}


def _circular_update_call(**change: Any) -> Any:
    return _conv_update_call(**(_circular_update_args() | change))


def _packed_scan_args() -> dict[str, Any]:
    args, kwargs = _scan_inputs(Rand(18), torch.float32, 1, 10, 4, 4, 2, 8)
    return dict(zip(("x", "dt", "A", "B", "C"), args)) | kwargs | {
        "initial_states": Rand(19)(2, 4, 4, 8), "cu_seqlens": torch.tensor([0, 7, 10], dtype=torch.int32),
        "return_varlen_states": True}


def _packed_scan_call(**change: Any) -> Any:
    kw = _packed_scan_args() | change
    return io.selective_scan(*[kw.pop(k) for k in ("x", "dt", "A", "B", "C")], **kw)


def _update_args() -> dict[str, Any]:
    args, kwargs = _update_inputs(Rand(15), torch.float32, slots=4, b=2, h=4, p=4, g=2, n=8)
    return dict(zip(("state", "x", "dt", "A", "B", "C"), args)) | kwargs | {
        "state_batch_indices": torch.tensor([3, -1])}


def _update_call(**change: Any) -> Any:
    kw = _update_args() | change
    return io.selective_state_update(*[kw.pop(k) for k in ("state", "x", "dt", "A", "B", "C")], **kw)


_ERRORS: list[tuple[Callable[..., None], str, dict[str, Any]]] = [
    # causal_conv1d
    (_conv_call, "weight", {"weight": torch.randn(7, 4)}),
    (_conv_call, "weight", {"weight": torch.randn(8, 40)}),
    (_conv_call, "seq_idx", {"seq_idx": torch.zeros(2, 10, dtype=torch.int64)}),
    (_conv_call, "x", {"x": torch.randn(2, 8, 10, dtype=torch.float64).to(torch.int32)}),
    (_conv_call, "bias", {"bias": torch.randn(8, device=META)}),
    (_conv_call, "x", {"x": torch.randn(2, 16, 20)[:, ::2, ::2]}),
    (_conv_call, "activation", {"activation": "gelu"}),
    (_conv_call, "initial_states", {"initial_states": torch.randn(2, 8, 4)}),
    (_conv_call, "final_states_out", {"final_states_out": torch.randn(2, 8, 3)}),  # without return_final_states
    (_conv_call, "final_states_out", {"return_final_states": True, "final_states_out": torch.randn(2, 8, 2)}),
    (_conv_call, "final_states_out", {"return_final_states": True,
                                      "final_states_out": torch.randn(1, 8, 3).expand(2, 8, 3)}),
    (_conv_call, "conv_states", {"conv_states": torch.randn(2, 8, 3)}),  # without query_start_loc
    # causal_conv1d, vLLM's packed form
    (_packed_conv_call, "query_start_loc", {"query_start_loc": torch.tensor([0, 6, 5, 12], dtype=torch.int32)}),
    (_packed_conv_call, "query_start_loc", {"query_start_loc": torch.tensor([0, 5, 5, 11], dtype=torch.int32)}),
    (_packed_conv_call, "has_initial_state", {"has_initial_state": torch.tensor([1, 0, 0])}),
    (_packed_conv_call, "cache_indices", {"cache_indices": torch.tensor([3, 4, 0], dtype=torch.int32)}),
    (_packed_conv_call, "cache_indices", {"cache_indices": torch.tensor([0, -1, 0], dtype=torch.int32)}),
    (_packed_conv_call, "x", {"x": torch.randn(1, 8, 12)}),
    (_packed_conv_call, "seq_idx", {"seq_idx": torch.zeros(1, 12, dtype=torch.int32)}),
    (_packed_conv_call, "conv_states", {"conv_states": None}),
    (_packed_conv_call, "conv_states", {"conv_states": torch.randn(4, 8, 2)}),
    # causal_conv1d_update
    (_conv_update_call, "conv_state", {"conv_state": torch.randn(4, 8, 2)}),
    (_conv_update_call, "conv_state", {"conv_state": torch.randn(4, 8, 3, dtype=torch.float16)}),
    (_conv_update_call, "conv_state_indices", {"conv_state_indices": torch.tensor([0, 1], device=META)}),
    (_conv_update_call, "conv_state", {"conv_state": torch.randn(1, 8, 3).expand(4, 8, 3)}),
    (_conv_update_call, "x", {"x": torch.randn(2, 16, 3)[:, ::2, ::2]}),
    (_conv_update_call, "conv_state_indices", {"conv_state_indices": torch.tensor([4, 0], dtype=torch.int32)}),
    (_circular_update_call, "cache_seqlens", {"cache_seqlens": torch.tensor([-1, 0], dtype=torch.int32)}),
    (_circular_update_call, "cache_seqlens", {"cache_seqlens": torch.tensor([1, 0, 2], dtype=torch.int32)}),
    (_circular_update_call, "cache_seqlens", {"cache_seqlens": torch.tensor([1.0, 0.0])}),
    # selective_scan
    (_scan_call, "B", {"B": torch.randn(2, 10, 3, 8)}),
    (_scan_call, "dt", {"dt": torch.randn(2, 9, 4)}),
    (_scan_call, "A", {"A": torch.randn(4, dtype=torch.float16)}),
    (_scan_call, "C", {"C": torch.randn(2, 10, 2, 8, device=META)}),
    (_scan_call, "x", {"x": torch.randn(2, 10, 4, 8)[..., ::2]}),
    (_scan_call, "seq_idx", {"seq_idx": torch.zeros(2, 10)}),
    (_scan_call, "D", {"D": torch.randn(4, 3)}),
    (_scan_call, "dt_limit", {"dt_limit": (1.0, 0.0)}),
    (_scan_call, "chunk_size", {"chunk_size": 0}),
    (_scan_call, "return_varlen_states", {"return_varlen_states": True}),  # without cu_seqlens
    (_scan_call, "x", {"cu_seqlens": torch.tensor([0, 4, 10], dtype=torch.int32)}),  # Bt = 2
    # selective_scan, mamba's packed row
    (_packed_scan_call, "cu_seqlens", {"cu_seqlens": torch.tensor([0, 7, 9], dtype=torch.int32)}),
    (_packed_scan_call, "cu_seqlens", {"cu_seqlens": torch.tensor([0, 7, 10.0])}),
    (_packed_scan_call, "initial_states", {"initial_states": torch.randn(3, 4, 4, 8)}),
    # selective_state_update
    (_update_call, "C", {"C": torch.randn(2, 2, 9)}),
    (_update_call, "state", {"state": torch.zeros(4, 4, 4, 8, dtype=torch.int32)}),
    (_update_call, "dt", {"dt": torch.randn(2, 4, 3)}),
    (_update_call, "A", {"A": torch.randn(4, 4, 3)}),
    (_update_call, "dt_bias", {"dt_bias": torch.randn(4, 5)}),
    (_update_call, "z", {"z": torch.randn(2, 4, 4, device=META)}),
    (_update_call, "state", {"state": torch.randn(4, 4, 4, 16)[..., ::2]}),
    (_update_call, "state", {"state": torch.randn(1, 4, 4, 8).expand(4, 4, 4, 8)}),
    (_update_call, "state_batch_indices", {"state_batch_indices": torch.tensor([1, 4])}),
    (_update_call, "state_batch_indices", {"state_batch_indices": torch.tensor([1.0, 0.0])}),
]


@pytest.mark.parametrize(("call", "argument", "change"), _ERRORS,
                         ids=[f"{c.__name__.strip('_')}-{a}-{i}" for i, (c, a, _) in enumerate(_ERRORS)])
def test_contract_errors_name_the_argument(call: Callable[..., None], argument: str, change: dict[str, Any]) -> None:
    with pytest.raises(ContractError) as err:
        call(**change)
    assert err.value.argument == argument
    assert f": {argument}: " in str(err.value)


@pytest.mark.parametrize("call", [_conv_call, _packed_conv_call, _conv_update_call, _circular_update_call, _scan_call,
                                  _packed_scan_call, _update_call])
def test_valid_calls_of_the_error_table_pass(call: Callable[..., None]) -> None:
    call()


# --- repeated indices, meta inputs, inputs that require grad -----------------------------------------

_ENTRY_POINTS: dict[str, tuple[Callable[[], dict[str, Any]], Callable[..., Any]]] = {
    "causal_conv1d": (_conv_args, _conv_call),
    "causal_conv1d packed": (_packed_conv_args, _packed_conv_call),
    "causal_conv1d_update": (_conv_update_args, _conv_update_call),
    "causal_conv1d_update circular": (_circular_update_args, _circular_update_call),
    "selective_scan": (_scan_args, _scan_call),
    "selective_scan packed": (_packed_scan_args, _packed_scan_call),
    "selective_state_update": (_update_args, _update_call),
}


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(("op", "name", "state"), [("causal_conv1d_update", "conv_state_indices", "conv_state"),
                                                   ("selective_state_update", "state_batch_indices", "state")])
def test_repeated_state_index_is_rejected_when_checked(provider: str, op: str, name: str, state: str) -> None:
    """Two rows naming one slot would race (the reference runs the rows in order, the torch provider
    gathers every slot first: states and outputs differ), so checked mode rejects them before any write;
    negative padding indices may repeat."""
    make, call = _ENTRY_POINTS[op]
    states = make()[state]
    before = states.clone()
    with io.use(provider), io.checked_indices(), pytest.raises(ContractError) as err:
        call(**{state: states, name: torch.tensor([1, 1], dtype=torch.int32)})
    assert err.value.argument == name and "index 1 appears 2 times" in str(err.value)
    assert torch.equal(states, before)  # rejected before any write
    with io.use(provider), io.checked_indices():
        out = call(**{state: states, name: torch.tensor([-1, -1], dtype=torch.int32)})
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(states, before)


def _new_forms(i: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """final_states_out, the packed conv, the circular update and the packed scan (its three result forms);
    returns every result and mutated tensor."""
    buffer, states, circular = i["buffer"].clone(), i["states"].clone(), i["circular"].clone()
    y, final = io.causal_conv1d(i["x"], i["w"], i["b"], None, None, True, buffer, "silu")
    packed = io.causal_conv1d(i["px"], i["w"], i["b"], activation="silu", conv_states=states,
                              query_start_loc=i["qsl"], has_initial_state=i["has_init"])
    u = io.causal_conv1d_update(i["x"][:, :, 0], circular, i["w"], i["b"], "silu", i["pos"])
    args = (i["sx"], i["sdt"], i["sA"], i["sB"], i["sC"], 4)
    s1, v1 = io.selective_scan(*args, cu_seqlens=i["cu"], initial_states=i["init"], return_varlen_states=True)
    s2, f2, v2 = io.selective_scan(*args, cu_seqlens=i["cu"], return_final_states=True, return_varlen_states=True)
    s3, f3 = io.selective_scan(*args, cu_seqlens=i["cu"], return_final_states=True)
    return [y, final, buffer, packed, states, u, circular, s1, v1, s2, f2, v2, s3, f3]


def test_new_forms_are_custom_operators_for_compile_and_fake_tensors() -> None:
    """torch.compile(fullgraph=True) traces the new argument forms with no graph break (one custom operator
    each, the in-place states annotated) and matches eager; FakeTensor calls give the eager shapes."""
    r = Rand(20)
    i = {"x": r(2, 8, 6), "w": r(8, 4), "b": r(8), "buffer": r(2, 8, 3), "px": r(9, 8).t(), "states": r(3, 8, 3),
         "qsl": torch.tensor([0, 4, 4, 9], dtype=torch.int32), "has_init": torch.tensor([True, False, True]),
         "circular": r(2, 8, 5), "pos": torch.tensor([3, 9], dtype=torch.int32), "sx": r(1, 12, 2, 4),
         "sdt": r(1, 12, 2), "sA": -torch.rand(2) - 0.1, "sB": r(1, 12, 1, 8), "sC": r(1, 12, 1, 8),
         "cu": torch.tensor([0, 5, 12], dtype=torch.int32), "init": r(2, 2, 4, 8)}
    with io.use("torch"):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(_new_forms)(i)
        assert explained.graph_break_count == 0, explained.break_reasons
        torch._dynamo.reset()
        compiled = torch.compile(_new_forms, fullgraph=True, backend="aot_eager")(i)
        eager = _new_forms(i)
    assert len(compiled) == len(eager)
    for n, (got, want) in enumerate(zip(compiled, eager)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"output {n}")
    with FakeTensorMode() as mode:
        fake = _new_forms({k: mode.from_tensor(v) for k, v in i.items()})
    assert [(f.shape, f.dtype, f.stride()) for f in fake] == [(e.shape, e.dtype, e.stride()) for e in eager]


@pytest.mark.parametrize("op", list(_ENTRY_POINTS))
def test_meta_inputs_give_the_output_shapes_without_reading_values(op: str) -> None:
    """Every entry point on meta tensors, with the index checks forced on (they would read values): the
    outputs have the CPU call's shapes and dtypes, and nothing is read."""
    make, call = _ENTRY_POINTS[op]
    extra = {"return_final_states": True} if op in ("causal_conv1d", "selective_scan") else {}
    expected = call(**extra)
    meta = {k: v.to(META) if isinstance(v, torch.Tensor) else v for k, v in make().items()}
    with io.checked_indices():
        got = call(**meta, **extra)
    for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,),
                    strict=True):
        assert g.is_meta and g.shape == e.shape and g.dtype == e.dtype


@pytest.mark.parametrize("op", list(_ENTRY_POINTS))
def test_inputs_that_require_grad_are_rejected_before_any_kernel(op: str) -> None:
    """No operator has a backward: a tensor argument that requires grad (grad mode on) is a ContractError
    naming it, before any state is written (the torch provider failed inside ``out=`` instead), and so
    does the custom operator that FakeTensor and traced calls lower to (autograd warned there and gave no
    gradient); under ``torch.no_grad()`` the same call runs."""
    make, call = _ENTRY_POINTS[op]
    names = [k for k, v in make().items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    assert len(names) >= 4
    for name in names:
        args = make()
        args[name] = args[name].requires_grad_()
        before = {k: v.detach().clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
        with pytest.raises(ContractError) as err:
            call(**args)
        assert err.value.argument == name and "requires_grad" in str(err.value)
        assert all(torch.equal(args[k].detach(), v) for k, v in before.items())
        with torch.no_grad():
            call(**args)
        with FakeTensorMode() as mode, pytest.raises(ContractError, match=f": {name}: requires_grad"):
            call(**{k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()})
