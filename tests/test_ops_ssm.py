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
    # causal_conv1d_update
    (_conv_update_call, "conv_state", {"conv_state": torch.randn(4, 8, 2)}),
    (_conv_update_call, "conv_state", {"conv_state": torch.randn(4, 8, 3, dtype=torch.float16)}),
    (_conv_update_call, "conv_state_indices", {"conv_state_indices": torch.tensor([0, 1], device=META)}),
    (_conv_update_call, "conv_state", {"conv_state": torch.randn(1, 8, 3).expand(4, 8, 3)}),
    (_conv_update_call, "x", {"x": torch.randn(2, 16, 3)[:, ::2, ::2]}),
    (_conv_update_call, "conv_state_indices", {"conv_state_indices": torch.tensor([4, 0], dtype=torch.int32)}),
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
    # selective_state_update
    (_update_call, "C", {"C": torch.randn(2, 2, 9)}),
    (_update_call, "state", {"state": torch.randn(4, 4, 4, 8, dtype=torch.bfloat16)}),
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


@pytest.mark.parametrize("call", [_conv_call, _conv_update_call, _scan_call, _update_call])
def test_valid_calls_of_the_error_table_pass(call: Callable[..., None]) -> None:
    call()


# --- repeated indices, meta inputs, inputs that require grad -----------------------------------------

_ENTRY_POINTS: dict[str, tuple[Callable[[], dict[str, Any]], Callable[..., Any]]] = {
    "causal_conv1d": (_conv_args, _conv_call),
    "causal_conv1d_update": (_conv_update_args, _conv_update_call),
    "selective_scan": (_scan_args, _scan_call),
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
