"""The one tolerance table of the conformance suite.

Every output is compared against the operator's reference run on float64 CPU copies of the inputs.
Each entry is no looser than the peer suite named beside it (FlagGems, vLLM, flash-attention, causal-conv1d, mamba):

- ``Allclose(rtol, atol)``: ``|out - ref| <= atol + rtol * |ref|`` elementwise, NaN never passes.
  ``atol_per_k`` adds ``atol_per_k * K`` (Gemm's reduction length), as FlagGems does.
- ``LowPrecisionRule(factor, atol)``: FlashAttention's rule: the max abs error of the output must be at
  most ``factor`` times the max abs error of the same reference run in the input's own dtype, plus `atol`.
- ``EXACT``: bit-for-bit (caches, conv states, untouched V).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from infiniops_py.operators import OPERATORS

__all__ = ["EXACT", "TOLERANCES", "Allclose", "LowPrecisionRule", "tolerance"]


@dataclass(frozen=True)
class Allclose:
    rtol: float
    atol: float
    atol_per_k: float = 0.0


@dataclass(frozen=True)
class LowPrecisionRule:
    factor: float
    atol: float


EXACT: Final = Allclose(0.0, 0.0)

_FP16, _BF16, _FP32 = "float16", "bfloat16", "float32"

# (operator, dtype) -> tolerance. Sources: the peer test file named above each entry.
TOLERANCES: Final[dict[tuple[str, str], Allclose | LowPrecisionRule]] = {
    # FlagGems test_addmm: rtol by dtype, atol 1e-4 x K.
    ("gemm", _FP16): Allclose(1e-3, 0.0, atol_per_k=1e-4),
    ("gemm", _BF16): Allclose(1.6e-2, 0.0, atol_per_k=1e-4),
    ("gemm", _FP32): Allclose(1.3e-6, 0.0, atol_per_k=1e-4),
    # FlagGems test_add: rtol = dtype resolution, atol 1e-4.
    ("add", _FP16): Allclose(1e-3, 1e-4),
    ("add", _BF16): Allclose(1e-2, 1e-4),
    ("add", _FP32): Allclose(1e-6, 1e-4),
    # vLLM test_layernorm: 1e-2 / 1e-2 for every dtype; fp32 tightened (fp32 arithmetic throughout).
    ("rms_norm", _FP16): Allclose(1e-2, 1e-2),
    ("rms_norm", _BF16): Allclose(1e-2, 1e-2),
    ("rms_norm", _FP32): Allclose(1e-5, 1e-5),
    ("fused_add_rms_norm", _FP16): Allclose(1e-2, 1e-2),
    ("fused_add_rms_norm", _BF16): Allclose(1e-2, 1e-2),
    ("fused_add_rms_norm", _FP32): Allclose(1e-5, 1e-5),
    # mamba_ssm tests/ops/triton/test_layernorm_gated.py: fp32 1e-5 / 1e-5, fp16/bf16 1e-2 / 8e-3 (rtol / atol,
    # against its fp32-upcast rms_norm_ref); fp16 tightened (one rounding of an fp32 result: 2**-11).
    ("rms_norm_gated", _FP16): Allclose(2e-3, 2e-3),
    ("rms_norm_gated", _BF16): Allclose(1e-2, 8e-3),
    ("rms_norm_gated", _FP32): Allclose(1e-5, 1e-5),
    # vLLM test_fused_qk_norm_rope: fp16 2e-3, bf16 1e-2; fp32 tightened.
    ("fused_qk_norm", _FP16): Allclose(2e-3, 2e-3),
    ("fused_qk_norm", _BF16): Allclose(1e-2, 1e-2),
    ("fused_qk_norm", _FP32): Allclose(1e-5, 1e-5),
    # vLLM test_cache: exact.
    ("reshape_and_cache_flash", _FP16): EXACT,
    ("reshape_and_cache_flash", _BF16): EXACT,
    ("reshape_and_cache_flash", _FP32): EXACT,
    # flash-attention test_flash_attn: 2x the low-dtype reference's error (+1e-5); kvcache: 3x.
    ("flash_attn_varlen", _FP16): LowPrecisionRule(2.0, 1e-5),
    ("flash_attn_varlen", _BF16): LowPrecisionRule(2.0, 1e-5),
    ("flash_attn_varlen", _FP32): LowPrecisionRule(2.0, 1e-5),
    ("flash_attn_with_kvcache", _FP16): LowPrecisionRule(3.0, 1e-5),
    ("flash_attn_with_kvcache", _BF16): LowPrecisionRule(3.0, 1e-5),
    ("flash_attn_with_kvcache", _FP32): LowPrecisionRule(3.0, 1e-5),
    # causal-conv1d test_causal_conv1d.
    ("causal_conv1d", _FP32): Allclose(3e-4, 1e-3),
    ("causal_conv1d", _FP16): Allclose(3e-3, 5e-3),
    ("causal_conv1d", _BF16): Allclose(1e-2, 5e-2),
    ("causal_conv1d_update", _FP32): Allclose(3e-4, 1e-3),
    ("causal_conv1d_update", _FP16): Allclose(3e-3, 5e-3),
    ("causal_conv1d_update", _BF16): Allclose(1e-2, 5e-2),
    # mamba test_selective_scan (tighter than vLLM's SSD test: fp32 8e-3 / 5e-3, bf16 5e-2).
    ("selective_scan", _FP32): Allclose(6e-4, 2e-3),
    ("selective_scan", _FP16): Allclose(3e-3, 5e-3),
    ("selective_scan", _BF16): Allclose(3e-2, 5e-2),
    # mamba test_selective_state_update.
    ("selective_state_update", _FP32): Allclose(3e-4, 1e-3),
    ("selective_state_update", _FP16): Allclose(5e-3, 1e-2),
    ("selective_state_update", _BF16): Allclose(1e-2, 5e-2),
    # torch.distributed.all_reduce at world size 1 (the suite's one process): the tensor itself, bit for bit.
    ("all_reduce", _FP16): EXACT,
    ("all_reduce", _BF16): EXACT,
    ("all_reduce", _FP32): EXACT,
    # vLLM's default tolerances (tests/kernels/allclose_default.py, rtol / atol: fp16 1e-3 / 1e-3, bf16
    # 1.6e-2 / 1e-3, fp32 1.3e-6 / 1e-5), here against the float64 reference: test_pos_encoding holds the RoPE
    # kernel to them against forward_native; test_activation holds silu_and_mul to forward_native bit for bit
    # (both in the low dtype, with the same roundings) and its other activations to these defaults.
    ("silu_and_mul", _FP16): Allclose(1e-3, 1e-3),
    ("silu_and_mul", _BF16): Allclose(1.6e-2, 1e-3),
    ("silu_and_mul", _FP32): Allclose(1.3e-6, 1e-5),
    # gemm then silu_and_mul (no peer suite of its own): each projection within Gemm's rule, then SiLU and the
    # product within SiluAndMul's, the relative tolerances added.
    ("gemm_swiglu", _FP16): Allclose(2e-3, 1e-3, atol_per_k=1e-4),
    ("gemm_swiglu", _BF16): Allclose(3.2e-2, 1e-3, atol_per_k=1e-4),
    ("gemm_swiglu", _FP32): Allclose(2.6e-6, 1e-5, atol_per_k=1e-4),
    # gemm then fused_add_rms_norm (no peer suite of its own): the projection within Gemm's rule, then the add and
    # the norm within FusedAddRmsNorm's (vLLM test_layernorm), the relative tolerances added.
    ("gemm_add_rms_norm", _FP16): Allclose(1.1e-2, 1e-2, atol_per_k=1e-4),
    ("gemm_add_rms_norm", _BF16): Allclose(2.6e-2, 1e-2, atol_per_k=1e-4),
    ("gemm_add_rms_norm", _FP32): Allclose(1.13e-5, 1e-5, atol_per_k=1e-4),
    # rms_norm then gemm (then silu_and_mul with swiglu; no peer suite of its own): the norm within RmsNorm's rule
    # (vLLM test_layernorm), then the projection within Gemm's (GemmSwiglu's with swiglu), the relative tolerances
    # added; the norm's rounding of x enters the product as an absolute error, which SwiGLU multiplies by the
    # other half (|silu(gate)| or |up| up to about 3 for N(0, 2) projections): three times RmsNorm's atol in bf16.
    ("rms_norm_gemm", _FP16): Allclose(1.2e-2, 1e-2, atol_per_k=1e-4),
    ("rms_norm_gemm", _BF16): Allclose(4.2e-2, 3e-2, atol_per_k=1e-4),
    ("rms_norm_gemm", _FP32): Allclose(1.26e-5, 1e-5, atol_per_k=1e-4),
    ("rotary_embedding", _FP16): Allclose(1e-3, 1e-3),
    ("rotary_embedding", _BF16): Allclose(1.6e-2, 1e-3),
    ("rotary_embedding", _FP32): Allclose(1.3e-6, 1e-5),
    # vLLM test_fused_qk_norm_rope: fp16 2e-3, bf16 1e-2 (rtol = atol); fp32 tightened.
    ("fused_qk_norm_rope", _FP16): Allclose(2e-3, 2e-3),
    ("fused_qk_norm_rope", _BF16): Allclose(1e-2, 1e-2),
    ("fused_qk_norm_rope", _FP32): Allclose(1e-5, 1e-5),
    # Sampling is random: its case compares verdicts, not tokens (strategies/sampling.py): each row's chi-square
    # p-value of its draws against the float64 filtered softmax, and the argmax rows, exactly. FlashInfer's
    # test_sampling checks the empirical frequencies against the filtered probabilities (cosine > 0.99 over
    # 5M draws); vLLM's test_sampler checks the argmax rows exactly.
    ("top_k_top_p_sampling_from_logits", _FP16): EXACT,
    ("top_k_top_p_sampling_from_logits", _BF16): EXACT,
    ("top_k_top_p_sampling_from_logits", _FP32): EXACT,
}


def tolerance(op: str, dtype: str) -> Allclose | LowPrecisionRule:
    """The tolerance for `op` outputs in `dtype`: its own entry, or that of the operator its declaration names
    (``Operator.tolerance_as``: an operator declared outside the core borrows a neighbour's).

    Raises:
        KeyError: the table has no entry (every operator and float dtype a provider may declare has one).
    """
    spec = OPERATORS.get(op)
    borrowed = getattr(spec, "tolerance_as", None)
    key = (op, dtype) if (op, dtype) in TOLERANCES or borrowed is None else (borrowed, dtype)
    try:
        return TOLERANCES[key]
    except KeyError:
        raise KeyError(f"no tolerance for {op} in {dtype}; add one to infiniops_py/testing/tolerances.py") from None
