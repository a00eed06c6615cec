"""The operators' fast argument checks refuse what their per-argument checks refuse (issue #25).

The public functions test the common case in a few attribute reads and call the per-argument helpers only
when that test fails. A fast test that forgets a condition accepts a bad argument; these tests catch it by
mutating each tensor argument of every public function's valid call (the table of
``tests/test_contract_hardening.py``) one metadata property at a time:

- every call either runs or raises a `ContractError` (a skipped check must not surface as torch's own error
  inside a provider);
- a dtype of the other kind (an int tensor for a float argument, a float one for an index argument), and a
  tensor that requires grad (grad mode on), are refused naming that argument.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from infiniops_py import ContractError

_HARDENING = Path(__file__).resolve().parent / "test_contract_hardening.py"


def _calls() -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """test_contract_hardening's valid call of every public function (fresh tensors each time)."""
    spec = importlib.util.spec_from_file_location("_hardening_calls", _HARDENING)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._calls()


_CALLS = _calls()
_CASES = [(op, name) for op, (_, kwargs) in _CALLS.items() for name in kwargs]


def _mutations(t: torch.Tensor) -> dict[str, torch.Tensor]:
    """`t` with one metadata property changed: dtype, size, rank, strides, device (meta), requires_grad."""
    out = {f"dtype {dt}": t.to(dt) for dt in (torch.float16, torch.float64, torch.int32, torch.int64) if dt != t.dtype}
    if t.dim() >= 1:
        out["dim 0 + 1"] = torch.cat([t, t[:1]], 0)
        out["last dim + 1"] = torch.cat([t, t[..., :1]], -1)
        out["rank + 1"] = t.unsqueeze(0)
        out["flattened"] = t.flatten() if t.dim() > 1 else t.unsqueeze(0)
        out["expanded dim 0"] = t[:1].expand(t.shape) if t.shape[0] > 1 else t.expand(2, *t.shape[1:])
        if t.shape[-1] > 1:
            out["last dim - 1"] = t[..., :-1]
            out["last stride 2"] = torch.stack([t, t], -1).flatten(-2)[..., ::2]
        if t.dim() >= 2:
            out["column-major"] = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    out["meta"] = t.to("meta")
    if t.dtype.is_floating_point:
        out["requires grad"] = t.detach().clone().requires_grad_(True)
    return out


def _outcome(op: str, name: str, bad: torch.Tensor) -> str | None:
    """None when the call runs, else the argument its ContractError names (any other exception fails)."""
    fn, kwargs = _calls()[op]
    try:
        fn(**{**kwargs, name: bad})
    except ContractError as err:
        assert err.argument is not None, str(err)
        return err.argument
    return None


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("op", "name"), _CASES, ids=[f"{o}-{n}" for o, n in _CASES])
def test_a_mutated_argument_runs_or_is_a_contract_error(op: str, name: str) -> None:
    original = _CALLS[op][1][name]
    for what, bad in _mutations(original).items():
        try:
            _outcome(op, name, bad)
        except Exception as err:  # the point: nothing but a ContractError may escape
            pytest.fail(f"{op}({name}: {what}) raised {type(err).__name__}: {err}")


@pytest.mark.parametrize(("op", "name"), _CASES, ids=[f"{o}-{n}" for o, n in _CASES])
def test_a_dtype_of_the_other_kind_and_requires_grad_are_refused_naming_the_argument(op: str, name: str) -> None:
    original = _CALLS[op][1][name]
    others = (torch.int32, torch.int64) if original.dtype.is_floating_point else (torch.float32, torch.float16)
    bad = {f"dtype {dt}": original.to(dt) for dt in others}
    if original.dtype.is_floating_point:
        bad["requires grad"] = original.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        for what, t in bad.items():
            assert _outcome(op, name, t) == name, f"{op}({name}: {what})"
