"""The run-time kernels of the ``torch.ops.infiniops`` custom operators: each public function, called eagerly.

When a compiled graph or an exported program runs one of the operators, its kernel is the public function
itself (the contract's checks, then the resolver's choice of provider at that moment). Kept apart from
`_torch_library`, which the operator modules import, so that no import cycle joins them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infiniops_py.operators import add as a
from infiniops_py.operators import all_reduce as ar
from infiniops_py.operators import causal_conv1d as cc
from infiniops_py.operators import flash_attn as fa
from infiniops_py.operators import fused_qk_norm as qk
from infiniops_py.operators import fused_qk_norm_rope as qkr
from infiniops_py.operators import gemm as g
from infiniops_py.operators import gemm_swiglu as gs
from infiniops_py.operators import paged_cache as pc
from infiniops_py.operators import rms_norm as rn
from infiniops_py.operators import rms_norm_gated as rng
from infiniops_py.operators import rotary_embedding as re_
from infiniops_py.operators import sampling as sa
from infiniops_py.operators import selective_scan as ss
from infiniops_py.operators import silu_and_mul as sm

__all__ = ["kernels"]


def kernels() -> dict[str, Callable[..., Any]]:
    """The run-time kernel of each operator: the public function, called eagerly (checks, then resolver)."""

    def gemm(a_, b, c, bias, alpha, beta, trans_a, trans_b):
        return g.gemm(a_, b, c=c, bias=bias, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b)

    def gemm_out(a_, b, c, bias, alpha, beta, trans_a, trans_b, out):
        g.gemm(a_, b, c=c, bias=bias, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, out=out)

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window, softcap, block_table, seqused_k, alibi,
               k_descale, v_descale, lse=False):
        return fa.flash_attn_varlen(q, k, v, cu_q, cu_k, int(max_q), int(max_k), softmax_scale=scale,
                                    causal=causal, window_size=tuple(window), softcap=softcap, alibi_slopes=alibi,
                                    return_softmax_lse=lse, block_table=block_table, seqused_k=seqused_k,
                                    k_descale=k_descale, v_descale=v_descale)

    def kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens, batch_idx, leftpad, block_table, scale, causal,
                window, softcap, interleaved, alibi, k_descale, v_descale, lse=False):
        return fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=cache_seqlens, cache_batch_idx=batch_idx,
                                          cache_leftpad=leftpad, block_table=block_table, softmax_scale=scale,
                                          causal=causal, window_size=tuple(window), softcap=softcap,
                                          rotary_interleaved=interleaved, alibi_slopes=alibi,
                                          return_softmax_lse=lse, k_descale=k_descale, v_descale=v_descale)

    def conv(x, weight, bias, activation, seq_idx, initial_states, final=False):
        return cc.causal_conv1d(x, weight, bias, activation=activation, seq_idx=seq_idx,
                                initial_states=initial_states, return_final_states=final)

    def conv_final_out(x, weight, bias, activation, seq_idx, initial_states, final_states_out):
        return cc.causal_conv1d(x, weight, bias, seq_idx, initial_states, True, final_states_out, activation)[0]

    def conv_varlen(x, weight, bias, activation, conv_states, query_start_loc, cache_indices, has_initial_state):
        return cc.causal_conv1d(x, weight, bias, activation=activation, conv_states=conv_states,
                                query_start_loc=query_start_loc, cache_indices=cache_indices,
                                has_initial_state=has_initial_state)

    def scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, seq_idx, chunk_size, cu_seqlens,
             final=False, varlen=False):
        return ss.selective_scan(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                 dt_limit=tuple(dt_limit), initial_states=initial_states, seq_idx=seq_idx,
                                 cu_seqlens=cu_seqlens, return_final_states=final, return_varlen_states=varlen)

    return {
        "gemm": gemm,
        "gemm.out": gemm_out,
        "add": lambda input, other, alpha: a.add(input, other, alpha=alpha),
        "add.out": lambda input, other, alpha, out: (a.add(input, other, alpha=alpha, out=out), None)[1],
        "rms_norm": lambda x, weight, eps: rn.rms_norm(x, weight, eps),
        "rms_norm.out": lambda x, weight, eps, out: (rn.rms_norm(x, weight, eps, out=out), None)[1],
        "fused_add_rms_norm": lambda x, residual, weight, eps: (rn.fused_add_rms_norm(x, residual, weight, eps),
                                                                None)[1],
        "fused_qk_norm": lambda qkv, qw, kw, hq, hkv, d, eps: (
            qk.fused_qk_norm(qkv, qw, kw, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, eps=eps), None)[1],
        "reshape_and_cache_flash": lambda *args: (pc.reshape_and_cache_flash(*args), None)[1],
        "flash_attn_varlen": varlen,
        "flash_attn_varlen.with_lse": lambda *args: tuple(varlen(*args, lse=True)),
        "flash_attn_with_kvcache": kvcache,
        "flash_attn_with_kvcache.with_lse": lambda *args: tuple(kvcache(*args, lse=True)),
        "causal_conv1d": conv,
        "causal_conv1d.with_final_states": lambda *args: tuple(conv(*args, final=True)),
        "causal_conv1d.final_states_out": conv_final_out,
        "causal_conv1d.varlen": conv_varlen,
        "causal_conv1d_update": lambda x, conv_state, weight, bias, activation, indices, cache_seqlens: (
            cc.causal_conv1d_update(x, conv_state, weight, bias, activation=activation, cache_seqlens=cache_seqlens,
                                    conv_state_indices=indices)),
        "selective_scan": scan,
        "selective_scan.with_final_states": lambda *args: tuple(scan(*args, final=True)),
        "selective_scan.with_varlen_states": lambda *args: tuple(scan(*args, varlen=True)),
        "selective_state_update": lambda state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, idx: (
            ss.selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                      state_batch_indices=idx)),
        "all_reduce": lambda tensor, group_name: (ar.all_reduce(tensor, group=ar.group_of(group_name)), None)[1],
        "silu_and_mul": lambda x: sm.silu_and_mul(x),
        "silu_and_mul.out": lambda x, out: (sm.silu_and_mul(x, out=out), None)[1],
        "gemm_swiglu": lambda x, weight, bias: gs.gemm_swiglu(x, weight, bias),
        "gemm_swiglu.out": lambda x, weight, bias, out: (gs.gemm_swiglu(x, weight, bias, out=out), None)[1],
        "rms_norm_gated": lambda x, weight, bias, z, eps, group, before: rng.rms_norm_gated(
            x, weight, bias, z, eps, group, before),
        "rms_norm_gated.out": lambda x, weight, bias, z, eps, group, before, out: (rng.rms_norm_gated(
            x, weight, bias, z, eps, group, before, out=out), None)[1],
        "rotary_embedding": lambda positions, query, key, head_size, cache, is_neox: (
            re_.rotary_embedding(positions, query, key, head_size, cache, is_neox), None)[1],
        "fused_qk_norm_rope": lambda qkv, qw, kw, cache, positions, hq, hkv, d, eps, is_neox: (
            qkr.fused_qk_norm_rope(qkv, qw, kw, cache, positions, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                                   eps=eps, is_neox=is_neox), None)[1],
        "top_k_top_p_sampling_from_logits": lambda logits, top_k, top_p, indices, temperature, min_p, seed, offset,
        repetition, frequency, presence, counts, prompt: sa.top_k_top_p_sampling_from_logits(
            logits, top_k, top_p, indices, temperature=temperature, min_p=min_p, seed=seed, offset=offset,
            repetition_penalty=repetition, frequency_penalty=frequency, presence_penalty=presence,
            output_token_counts=counts, prompt_token_mask=prompt),
    }
