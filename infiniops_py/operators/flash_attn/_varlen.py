"""`flash_attn_varlen`: attention over packed variable-length sequences, its checks and its `OpSpec`."""

from __future__ import annotations

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    ContractError,
    check_bool,
    check_device,
    check_dtype,
    check_no_grad,
    check_shape,
    check_tensor,
    is_checked,
    strided,
    wants_grad,
)
from infiniops_py.operators._declare import Operator, Overload, Param
from infiniops_py.operators.flash_attn._call import FIELDS, lse_dtype, set_kwargs
from infiniops_py.operators.flash_attn._checks import (
    FP8,
    INT32,
    check_alibi,
    check_block_table,
    check_descale,
    check_kv,
    check_per_sequence,
    check_q,
    non_negative_int,
    normalize,
)
from infiniops_py.operators.flash_attn._reference import reference_varlen
from infiniops_py.operators.flash_attn._samples import sample_varlen
from infiniops_py.operators.flash_attn._values import check_seqlens, check_seqused, check_used_blocks

__all__ = ["VARLEN_SPEC", "flash_attn_varlen"]

_VARLEN = "flash_attn_varlen"
_INT32 = torch.int32


VARLEN_SPEC = Operator(
    sample_inputs=sample_varlen,
    tune_sizes={"q_tokens": 1024, "k_len": 1024, "num_kv_heads": 8},
    name=_VARLEN,
    fields={**FIELDS, "seqused_k": False},
    buckets=("q_tokens", "k_len"),  # total_q and max_seqlen_k
    reference=reference_varlen,
    doc="attention over packed variable-length sequences: causal (bottom-right), GQA, window, softcap, ALiBi, "
        "paged or fp8 K/V, seqused_k, log-sum-exp",
    overloads=(Overload(when={"return_softmax_lse": False}, fake=lambda q, **_: q.new_empty(q.shape)),
               Overload("with_lse", when={"return_softmax_lse": True}, outputs=2,
                        fake=lambda q, **_: (q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]),
                                                                               dtype=lse_dtype(q))))),
    params={"max_seqlen_q": Param("SymInt"), "max_seqlen_k": Param("SymInt")},
)


@VARLEN_SPEC.define
def flash_attn_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    return_softmax_lse: bool = False,
    block_table: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over packed variable-length sequences (flash-attention ``flash_attn_varlen_func``).

    Args:
        q: ``[total_q, Hq, D]``, float16/bfloat16/float32/float64, last stride 1.
        k, v: ``[total_k, Hkv, D]``, or paged caches ``[num_blocks, block_size, Hkv, D]`` when `block_table`
            is given; q's dtype, or both float8_e4m3fn (an fp8 KV cache, read through `k_descale` and
            `v_descale`); q's device, last stride 1, ``Hq % Hkv == 0``.
        cu_seqlens_q, cu_seqlens_k: int32 ``[B + 1]``: sequence b is rows ``cu[b]:cu[b+1]``; they start at 0,
            never decrease and end at ``total_q`` (``total_k`` unless paged). Checked in checked mode.
        max_seqlen_q, max_seqlen_k: at least the longest query / key sequence (ints >= 0).
        softmax_scale: multiplies ``q @ k^T``, any finite number (flash-attention does not restrict its
            sign); None (the default) means ``D**-0.5``.
        causal: bottom-right aligned causal mask (a bool).
        window_size: ``(left, right)``, a pair of ints >= -1; -1 is unbounded. Keys of query i lie in
            ``[i + Sk - Sq - left, i + Sk - Sq + right]`` after flash-attention's normalization
            (``flash_api.cpp``): a side >= `max_seqlen_k` becomes -1, then, when exactly one side is
            bounded, the other becomes `max_seqlen_k`. So ``window_size=(0, 6)`` over Sq=6 queries and
            Sk=4 keys lets query 0 see keys 0 to 2 (right = 4), not all four.
        softcap: a finite number >= 0; ``s = softcap * tanh(s / softcap)`` when > 0.
        alibi_slopes: float32 ``[Hq]`` or ``[B, Hq]``: adds ``-slope * |i + Sk - Sq - j|`` to the score
            of query i and key j, after the scale and the softcap (flash-attention's ALiBi).
        return_softmax_lse: also return the log-sum-exp of each query row's scores (a bool).
        block_table: int32 ``[B, max_blocks]`` of block ids into the paged k/v; sequence b reads its first
            ``ceil(Sk_b / block_size)`` entries, which must be in ``[0, num_blocks)`` (checked mode). A
            block id may appear in several rows (blocks of a shared prefix): they are only read.
        seqused_k: int32 ``[B]`` (vLLM's ``vllm_flash_attn``): sequence b attends to its first
            ``seqused_k[b]`` keys instead of its `cu_seqlens_k` length, which bounds it when not paged
            (paged: the block table's capacity); checked mode also requires it <= `max_seqlen_k`.
        k_descale, v_descale: float32 ``[B, Hkv]`` (flash-attention 3's descales), with float8_e4m3fn k/v
            only: keys and values are read as ``k * k_descale[b, h]``; None means 1.

    Returns:
        ``[total_q, Hq, D]`` in q's dtype; rows that see no key are 0. With `return_softmax_lse`, the pair
        ``(out, lse)``: lse float32 (float64 for float64 q) ``[Hq, total_q]`` (flash-attention's layout),
        ``log(sum_j exp(s_ij))`` over the keys row i sees, +inf for a row that sees none.

    Raises:
        ContractError: a non-tensor, a shape, dtype, device, stride, index or scalar argument that breaks
            the contract, or a tensor that requires grad while grad mode is on.
    """
    op = _VARLEN
    # The checks run on every call: the common case is tested in one pass, the per-argument helpers (which
    # name the bad argument) run when it fails.
    if not (strided(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, alibi_slopes, k_descale, v_descale)
            and q is not None and k is not None and v is not None and cu_seqlens_q is not None
            and cu_seqlens_k is not None):
        for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            check_tensor(op, name, t)
        for name, t in (("block_table", block_table), ("seqused_k", seqused_k), ("alibi_slopes", alibi_slopes),
                        ("k_descale", k_descale), ("v_descale", v_descale)):
            check_tensor(op, name, t, optional=True)
    if wants_grad(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, alibi_slopes, k_descale, v_descale):
        check_no_grad(op, {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
                           "block_table": block_table, "seqused_k": seqused_k, "alibi_slopes": alibi_slopes,
                           "k_descale": k_descale, "v_descale": v_descale})
    if return_softmax_lse is not True and return_softmax_lse is not False:
        check_bool(op, "return_softmax_lse", return_softmax_lse)
    paged = block_table is not None
    hq, d = check_q(op, q, 3)
    hkv = check_kv(op, q, k, v, ("k", "v"), 4 if paged else 3, hq, d)
    fp8 = k.dtype == FP8
    device, cu_shape = q.device, cu_seqlens_q.shape
    if not (cu_seqlens_q.dtype is _INT32 and cu_seqlens_k.dtype is _INT32 and len(cu_shape) == 1 and cu_shape[0] >= 1
            and cu_seqlens_k.shape == cu_shape and cu_seqlens_q.device == device and cu_seqlens_k.device == device):
        for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            check_dtype(op, name, cu, INT32)
            check_device(op, name, cu, device)
            check_shape(op, name, cu, [None], " ([B + 1])")
            if cu.shape[0] < 1:
                raise ContractError(op, name, "expected B + 1 >= 1 entries, got none")
        check_shape(op, "cu_seqlens_k", cu_seqlens_k, [cu_shape[0]], " ([B + 1], same as cu_seqlens_q)")
    n = cu_shape[0]
    if seqused_k is not None:
        check_per_sequence(op, "seqused_k", seqused_k, n - 1, q.device)
    slopes = check_alibi(op, alibi_slopes, n - 1, hq, q.device)
    k_descale = check_descale(op, "k_descale", k_descale, n - 1, hkv, k, "k")
    v_descale = check_descale(op, "v_descale", v_descale, n - 1, hkv, v, "v")
    max_seqlen_q = non_negative_int(op, "max_seqlen_q", max_seqlen_q)
    max_seqlen_k = non_negative_int(op, "max_seqlen_k", max_seqlen_k)
    block_size = 0
    if block_table is not None:
        block_size = k.shape[1]
        check_block_table(op, block_table, n - 1, q.device)
    if is_checked(q.device):
        check_seqlens(op, "cu_seqlens_q", cu_seqlens_q, q.shape[0], "total_q (q.shape[0])", max_seqlen_q)
        total_k = (None, "") if paged else (k.shape[0], "total_k (k.shape[0])")
        lengths = check_seqlens(op, "cu_seqlens_k", cu_seqlens_k, *total_k,
                                max_seqlen_k if seqused_k is None else None)
        if seqused_k is not None:
            lengths = check_seqused(op, seqused_k, None if paged else lengths, max_seqlen_k)
        if block_table is not None:
            check_used_blocks(op, block_table, lengths, k.shape[0], block_size)
    scale, window, softcap = normalize(op, d, softmax_scale, causal, window_size, softcap, max_seqlen_k)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    extras = set_kwargs(seqused_k=seqused_k, alibi_slopes=slopes, k_descale=k_descale, v_descale=v_descale)
    if return_softmax_lse:
        extras["softmax_lse"] = torch.empty((hq, q.shape[0]), dtype=lse_dtype(q), device=q.device)
    key = VARLEN_SPEC.key(q.device.type, q.dtype, head_dim=d, gqa_ratio=hq // hkv, causal=bool(causal),
                          local=window != (-1, -1), softcap=softcap > 0, paged=paged, block_size=block_size,
                          alibi=slopes is not None, return_softmax_lse=return_softmax_lse, fp8_kv=fp8,
                          seqused_k=seqused_k is not None, q_tokens=q.shape[0], k_len=max_seqlen_k)
    dispatch(VARLEN_SPEC, key, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
             bool(causal), window, softcap, block_table, out, **extras)
    return (out, extras["softmax_lse"]) if return_softmax_lse else out  # what the implementation wrote


