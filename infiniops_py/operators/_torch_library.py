"""Every entry point as a PyTorch custom operator: ``torch.ops.infiniops.<name>``.

Under ``torch.compile``, ``torch.export`` (strict and non-strict), and for FakeTensor inputs, each
public function lowers to its operator here (`lowered`), so a traced graph holds one opaque node per call:
dynamo never traces the argument checks or the resolver. At run time the node's kernel is the eager public
function itself: the contract checks run and the resolver picks the provider then, so ``use(...)`` scopes
and ``INFINIOPS_*`` settings in force when the graph runs apply, and no provider is baked into a graph.
The fake kernels give output shapes, dtypes and strides without reading values.

Mutation annotations follow each contract: the caches of ``reshape_and_cache_flash`` and
``flash_attn_with_kvcache``, the states of the ``*_update`` operators, ``x``/``residual`` of
``fused_add_rms_norm``, ``qkv`` of ``fused_qk_norm`` and every ``out=`` are ``Tensor(a!)``. An operator that
only mutates returns nothing (the public function returns the mutated argument), since a custom operator's
output must not alias an input. Entry points whose return type depends on a flag have one overload per
form (``causal_conv1d.with_final_states``, ``selective_scan.with_final_states``, ``*.out``,
``causal_conv1d.final_states_out``, ``selective_scan.with_varlen_states`` (whose last state is the final one),
``flash_attn_*.with_lse`` for ``return_softmax_lse=True``).

Mechanism: the low-level ``torch.library.Library`` ``define``/``impl`` pair, not the
``torch.library.custom_op`` decorator, whose calls cost more on the host (benchmarks/RESULTS.md). Eager calls
of the public functions go through neither: they pay only the lowering test. The schemas come from the
operators' declarations (`infiniops_py.operators._declare`), which `define` each overload when their module
is imported: a graph can only be traced against operators that exist already. Definition runs no kernel and
reads no device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final

import torch
import torch.compiler as _compiler
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from infiniops_py.operators._base import check_no_grad

__all__ = ["NAMESPACE", "SCHEMAS", "define", "lowered"]

NAMESPACE: Final = "infiniops"


def lowered(t: object) -> bool:
    """Whether a public call whose first tensor argument is `t` goes through its custom operator: while
    ``torch.compile``/``torch.export`` trace, or for a FakeTensor input (it has no memory to check). A meta
    call runs the contract's checks instead, then the built-in ``meta`` provider (nothing left to compute).

    Dynamo folds ``torch.compiler.is_dynamo_compiling()`` to True while it traces (its body, run eagerly, is
    ``return False``, cheaper than ``torch.compiler.is_compiling()``, which calls ``torch.jit.is_scripting()``
    first); non-strict ``torch.export`` sets ``torch.compiler._is_compiling_flag``
    and traces with FakeTensors (either test catches it). While a fake kernel runs the contract on meta copies
    (`_check_on_meta`), nothing lowers."""
    if _is_dynamo_compiling() or _compiler._is_compiling_flag:
        return not getattr(_ON_META, "active", False)
    return type(t) is not _Tensor and isinstance(t, FakeTensor)  # a plain tensor skips FakeTensor's isinstance


_is_dynamo_compiling: Final = torch.compiler.is_dynamo_compiling
_Tensor: Final = torch.Tensor


_ON_META = threading.local()  # set while a fake kernel runs the public function on meta copies


def _meta_copy(t: torch.Tensor) -> torch.Tensor | None:
    """A meta tensor of `t`'s shape, strides and dtype, or None when a size or stride is symbolic."""
    if not all(type(n) is int for n in (*t.shape, *t.stride())):
        return None
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")


def _check_on_meta(kernel: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Run the public function behind `kernel` on meta copies of `args`: every check of the contract that
    needs no values and no addresses (shapes, dtypes, strides, scalars), so a traced or fake call raises
    the same `ContractError` as an eager one. Skipped when a size is symbolic (dynamic shapes: the checks
    then run when the graph runs)."""
    with unset_fake_temporarily():
        copies = []
        for a in args:
            if isinstance(a, torch.SymInt | torch.SymFloat | torch.SymBool):
                return
            if isinstance(a, torch.Tensor):
                a = _meta_copy(a)
                if a is None:
                    return
            copies.append(a)
        _ON_META.active = True
        try:
            kernel(*copies)
        finally:
            _ON_META.active = False


def _checked(fake: Callable[..., Any], kernel: Callable[..., Any]) -> Callable[..., Any]:
    """`fake`, after the contract's value-free checks (`_check_on_meta`)."""

    def run(*args: Any) -> Any:
        _check_on_meta(kernel, args)
        return fake(*args)

    return run


SCHEMAS: Final[dict[str, str]] = {}
"""Every operator defined so far, ``name`` or ``name.overload`` -> its schema (`define`)."""

_LIBRARY: list[torch.library.Library] = []  # kept alive: dropping a Library deregisters its operators


def _no_backward(name: str) -> Callable[..., Any]:
    """The Autograd kernel of operator `name`: no operator has a backward, so a tensor argument that
    requires grad (grad mode on) is the eager contract's `ContractError` (meta, FakeTensor and traced calls
    included, where it would otherwise give silently wrong gradients); else the operator below autograd."""
    base, _, overload = name.partition(".")
    op = getattr(getattr(getattr(torch.ops, NAMESPACE), base), overload or "default")
    names = [a.name for a in op._schema.arguments]

    def kernel(*args: Any) -> Any:
        check_no_grad(base, {n: a for n, a in zip(names, args) if isinstance(a, torch.Tensor)})
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)

    return kernel


def define(qualified: str, schema: str, kernel: Callable[..., Any], fake: Callable[..., Any]) -> None:
    """Define ``torch.ops.infiniops.<qualified>`` (``name`` or ``name.overload``) from its `schema`'s argument
    list and return type (``"(Tensor x, float eps) -> Tensor"``): its run-time `kernel`, its `fake` kernel
    (after the contract's value-free checks on meta copies, `_checked`) and an Autograd kernel that refuses
    inputs requiring grad (`_no_backward`). Each operator module's declarations call it once per overload
    (`infiniops_py.operators._declare`), on import.

    Raises:
        ValueError: `qualified` is defined already.
    """
    if qualified in SCHEMAS:
        raise ValueError(f"torch.ops.{NAMESPACE}.{qualified} is defined already")
    if not _LIBRARY:
        _LIBRARY.append(torch.library.Library(NAMESPACE, "DEF"))
    lib = _LIBRARY[0]
    lib.define(qualified + schema)
    lib.impl(qualified, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{qualified}", _checked(fake, kernel), lib=lib)
    lib.impl(qualified, _no_backward(qualified), "Autograd")
    SCHEMAS[qualified] = qualified + schema
