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
``torch.library.custom_op`` decorator. Measured on a 2-core x86 CPU (torch 2.13, a 4x4 add): a call through
a ``Library`` operator costs 4.0 us against 11.0 us through ``custom_op`` (``torch.add`` itself 1.2 us).
Eager calls of the public functions do not go through either: they pay only the `lowered` test
(about 0.1 us on that CPU); the operator's dispatch cost is paid inside compiled graphs, where it is the cost of
running an opaque node.

The operators are registered once, when ``infiniops_py.operators`` is imported (`register`): a graph can
only be traced against operators that exist already. Registration defines schemas and kernels; it runs no
kernel and reads no device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

import torch
import torch.compiler as _compiler
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from infiniops_py.operators._base import check_no_grad

__all__ = ["NAMESPACE", "SCHEMAS", "lowered", "register"]

NAMESPACE: Final = "infiniops"


def lowered(t: object) -> bool:
    """Whether a public call whose first tensor argument is `t` goes through its custom operator: while
    ``torch.compile``/``torch.export`` trace, or for a FakeTensor input (it has no memory to check). A meta
    call runs the contract's checks instead, then the built-in ``meta`` provider (nothing left to compute).

    Dynamo folds ``torch.compiler.is_dynamo_compiling()`` to True while it traces (its body, run eagerly, is
    ``return False``: about 35 ns, against 95 ns for ``torch.compiler.is_compiling()``, which calls
    ``torch.jit.is_scripting()`` first); non-strict ``torch.export`` sets ``torch.compiler._is_compiling_flag``
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


# Schemas, by operator and overload. The argument names are the public functions' own.
_VARLEN_ARGS: Final = ("Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, "
                       "SymInt max_seqlen_k, float? softmax_scale, bool causal, int[] window_size, float softcap, "
                       "Tensor? block_table, Tensor? seqused_k, Tensor? alibi_slopes, Tensor? k_descale, "
                       "Tensor? v_descale")
_KVCACHE_ARGS: Final = ("Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, Tensor? rotary_cos, "
                        "Tensor? rotary_sin, Tensor? cache_seqlens, Tensor? cache_batch_idx, Tensor? cache_leftpad, "
                        "Tensor? block_table, float? softmax_scale, bool causal, int[] window_size, float softcap, "
                        "bool rotary_interleaved, Tensor? alibi_slopes, Tensor? k_descale, Tensor? v_descale")
SCHEMAS: Final[dict[str, str]] = {
    "gemm": "gemm(Tensor a, Tensor b, Tensor? c, Tensor? bias, float alpha, float beta, bool trans_a, "
            "bool trans_b) -> Tensor",
    "gemm.out": "gemm.out(Tensor a, Tensor b, Tensor? c, Tensor? bias, float alpha, float beta, bool trans_a, "
                "bool trans_b, Tensor(a!) out) -> ()",
    "add": "add(Tensor input, Tensor other, float alpha) -> Tensor",
    "add.out": "add.out(Tensor input, Tensor other, float alpha, Tensor(a!) out) -> ()",
    "rms_norm": "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor",
    "rms_norm.out": "rms_norm.out(Tensor x, Tensor weight, float eps, Tensor(a!) out) -> ()",
    "fused_add_rms_norm": "fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()",
    "fused_qk_norm": "fused_qk_norm(Tensor(a!) qkv, Tensor q_weight, Tensor k_weight, int num_q_heads, "
                     "int num_kv_heads, int head_dim, float eps) -> ()",
    "reshape_and_cache_flash": "reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, "
                               "Tensor(b!) value_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor? k_scale, "
                               "Tensor? v_scale) -> ()",
    "flash_attn_varlen": f"flash_attn_varlen({_VARLEN_ARGS}) -> Tensor",
    "flash_attn_varlen.with_lse": f"flash_attn_varlen.with_lse({_VARLEN_ARGS}) -> (Tensor, Tensor)",
    "flash_attn_with_kvcache": f"flash_attn_with_kvcache({_KVCACHE_ARGS}) -> Tensor",
    "flash_attn_with_kvcache.with_lse": f"flash_attn_with_kvcache.with_lse({_KVCACHE_ARGS}) -> (Tensor, Tensor)",
    "causal_conv1d": "causal_conv1d(Tensor x, Tensor weight, Tensor? bias, str? activation, Tensor? seq_idx, "
                     "Tensor? initial_states) -> Tensor",
    "causal_conv1d.with_final_states": "causal_conv1d.with_final_states(Tensor x, Tensor weight, Tensor? bias, "
                                       "str? activation, Tensor? seq_idx, Tensor? initial_states) "
                                       "-> (Tensor, Tensor)",
    "causal_conv1d.final_states_out": "causal_conv1d.final_states_out(Tensor x, Tensor weight, Tensor? bias, "
                                      "str? activation, Tensor? seq_idx, Tensor? initial_states, "
                                      "Tensor(a!) final_states_out) -> Tensor",
    "causal_conv1d.varlen": "causal_conv1d.varlen(Tensor x, Tensor weight, Tensor? bias, str? activation, "
                            "Tensor(a!) conv_states, Tensor query_start_loc, Tensor? cache_indices, "
                            "Tensor? has_initial_state) -> Tensor",
    "causal_conv1d_update": "causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, "
                            "str? activation, Tensor? conv_state_indices, Tensor? cache_seqlens) -> Tensor",
    **{f"selective_scan{overload}": f"selective_scan{overload}(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
                                    "Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, float[] dt_limit, "
                                    "Tensor? initial_states, Tensor? seq_idx, int chunk_size, Tensor? cu_seqlens) "
                                    f"-> {result}"
       for overload, result in (("", "Tensor"), (".with_final_states", "(Tensor, Tensor)"),
                                (".with_varlen_states", "(Tensor, Tensor)"))},
    "selective_state_update": "selective_state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, "
                              "Tensor C, Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, "
                              "Tensor? state_batch_indices) -> Tensor",
    "all_reduce": "all_reduce(Tensor(a!) tensor, str group_name) -> ()",
    "silu_and_mul": "silu_and_mul(Tensor x) -> Tensor",
    "gemm_swiglu": "gemm_swiglu(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
    "gemm_swiglu.out": "gemm_swiglu.out(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) out) -> ()",
    "silu_and_mul.out": "silu_and_mul.out(Tensor x, Tensor(a!) out) -> ()",
    "rms_norm_gated": "rms_norm_gated(Tensor x, Tensor weight, Tensor? bias, Tensor? z, float eps, int? group_size, "
                      "bool norm_before_gate) -> Tensor",
    "rms_norm_gated.out": "rms_norm_gated.out(Tensor x, Tensor weight, Tensor? bias, Tensor? z, float eps, "
                          "int? group_size, bool norm_before_gate, Tensor(a!) out) -> ()",
    "rotary_embedding": "rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
                        "Tensor cos_sin_cache, bool is_neox) -> ()",
    "fused_qk_norm_rope": "fused_qk_norm_rope(Tensor(a!) qkv, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, "
                          "Tensor positions, int num_q_heads, int num_kv_heads, int head_dim, float eps, "
                          "bool is_neox) -> ()",
    "top_k_top_p_sampling_from_logits": "top_k_top_p_sampling_from_logits(Tensor logits, Tensor top_k, Tensor top_p, "
                                        "Tensor? indices, Tensor temperature, Tensor min_p, Tensor seed, "
                                        "Tensor offset, Tensor? repetition_penalty, Tensor? frequency_penalty, "
                                        "Tensor? presence_penalty, Tensor? output_token_counts, "
                                        "Tensor? prompt_token_mask) -> Tensor",
}


# --- fake kernels: shapes, dtypes and strides, no values ---------------------------------------------------


def _none(*_: Any) -> None:
    return None


def _fake_gemm(a: torch.Tensor, b: torch.Tensor, c: Any, bias: Any, alpha: float, beta: float, trans_a: bool,
               trans_b: bool) -> torch.Tensor:
    m = a.shape[-1] if trans_a else a.shape[-2]
    n = b.shape[-2] if trans_b else b.shape[-1]
    return a.new_empty((*a.shape[:-2], m, n))


def _conv_out(x: torch.Tensor) -> torch.Tensor:
    b, d, length = x.shape
    if x.stride(2) != 1 and length > 1:  # a channel-last view: the output keeps its layout
        return x.new_empty((b, length, d)).transpose(1, 2)
    return x.new_empty((b, d, length))


def _fake_conv(x: torch.Tensor, weight: torch.Tensor, *_: Any) -> torch.Tensor:
    return _conv_out(x)


def _fake_conv_final(x: torch.Tensor, weight: torch.Tensor, *_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return _conv_out(x), x.new_empty((x.shape[0], x.shape[1], weight.shape[1] - 1))


def _fake_conv_varlen(x: torch.Tensor, *_: Any) -> torch.Tensor:
    return _conv_out(x.unsqueeze(0))[0]  # x [D, T]: the output keeps its layout


def _fake_conv_update(x: torch.Tensor, *_: Any) -> torch.Tensor:
    if x.dim() == 2:
        return x.new_empty(x.shape)
    return _conv_out(x)


def _lse(q: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The attention log-sum-exp: float32 (float64 for float64 q), flash-attention's layout `shape`."""
    return q.new_empty(shape, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)


def _state_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _fake_scan_final(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, *_: Any
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    bt, _, h, p = x.shape
    return x.new_empty(x.shape), x.new_empty((bt, h, p, B.shape[-1]), dtype=_state_dtype(x))


def _fake_scan_varlen(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, *args: Any
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, h, p = x.shape
    sequences = args[-1].shape[0] - 1  # cu_seqlens [S + 1]
    return x.new_empty(x.shape), x.new_empty((sequences, h, p, B.shape[-1]), dtype=_state_dtype(x))



_FAKES: Final[dict[str, Callable[..., Any]]] = {
    "gemm": _fake_gemm,
    "gemm.out": _none,
    "add": lambda input, other, alpha: input.new_empty(torch.broadcast_shapes(input.shape, other.shape)),
    "add.out": _none,
    "rms_norm": lambda x, weight, eps: x.new_empty(x.shape),
    "rms_norm.out": _none,
    "fused_add_rms_norm": _none,
    "fused_qk_norm": _none,
    "reshape_and_cache_flash": _none,
    "flash_attn_varlen": lambda q, *_: q.new_empty(q.shape),
    "flash_attn_varlen.with_lse": lambda q, *_: (q.new_empty(q.shape), _lse(q, (q.shape[1], q.shape[0]))),
    "flash_attn_with_kvcache": lambda q, *_: q.new_empty(q.shape),
    "flash_attn_with_kvcache.with_lse": lambda q, *_: (q.new_empty(q.shape),
                                                       _lse(q, (q.shape[0], q.shape[2], q.shape[1]))),
    "causal_conv1d": _fake_conv,
    "causal_conv1d.with_final_states": _fake_conv_final,
    "causal_conv1d.final_states_out": _fake_conv,
    "causal_conv1d.varlen": _fake_conv_varlen,
    "causal_conv1d_update": _fake_conv_update,
    "selective_scan": lambda x, *_: x.new_empty(x.shape),
    "selective_scan.with_final_states": _fake_scan_final,
    "selective_scan.with_varlen_states": _fake_scan_varlen,
    "selective_state_update": lambda state, x, *_: x.new_empty(x.shape),
    "all_reduce": _none,
    "silu_and_mul": lambda x: x.new_empty((*x.shape[:-1], x.shape[-1] // 2)),
    "silu_and_mul.out": _none,
    "gemm_swiglu": lambda x, weight, bias: x.new_empty((x.shape[0], weight.shape[0] // 2)),
    "gemm_swiglu.out": _none,
    "rms_norm_gated": lambda x, *_: x.new_empty(x.shape),
    "rms_norm_gated.out": _none,
    "rotary_embedding": _none,
    "fused_qk_norm_rope": _none,
    "top_k_top_p_sampling_from_logits": lambda logits, top_k, *_: logits.new_empty(top_k.shape, dtype=torch.int32),
}

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


def register(kernels: Mapping[str, Callable[..., Any]]) -> None:
    """Define every operator of `SCHEMAS` under ``torch.ops.infiniops``, with its kernel, fake kernel (after
    the contract's value-free checks on meta copies) and an Autograd kernel that refuses inputs requiring
    grad (`_no_backward`).

    `kernels` maps each name of `SCHEMAS` to its run-time kernel (`_torch_kernels.kernels`: the public
    functions). Idempotent: a second call does nothing.
    """
    if _LIBRARY:
        return
    lib = torch.library.Library(NAMESPACE, "DEF")
    for name, schema in SCHEMAS.items():
        lib.define(schema)
        lib.impl(name, kernels[name], "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", _checked(_FAKES[name], kernels[name]), lib=lib)
        lib.impl(name, _no_backward(name), "Autograd")
    _LIBRARY.append(lib)

