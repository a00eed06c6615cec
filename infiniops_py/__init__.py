"""InfiniOps-Py: LLM operators with pluggable providers and a capability resolver that explains itself.

Public API: the operators (`gemm`, `add`, `rms_norm`, ...), `use` (scoped provider overrides),
`explain`, `resolve`, `resolve_closure`, `providers`, and what a provider plugin needs (`Provider`,
`Implementation`, `Capability` and its constraints, `hookimpl`).
"""

from __future__ import annotations

from infiniops_py._version import __version__ as __version__
from infiniops_py.capability import (
    Between,
    Capability,
    Check,
    ComputeCapability,
    Constraint,
    CudaAvailable,
    MultipleOf,
    OneOf,
    Requires,
)
from infiniops_py.errors import CandidateReport, ContractError, GateError, Rejection
from infiniops_py.hookspecs import hookimpl
from infiniops_py.operators import OPERATORS
from infiniops_py.operators._base import checked_indices, unchecked_indices
from infiniops_py.operators.add import add
from infiniops_py.operators.all_reduce import all_reduce
from infiniops_py.operators.causal_conv1d import causal_conv1d, causal_conv1d_update
from infiniops_py.operators.flash_attn import flash_attn_varlen, flash_attn_with_kvcache
from infiniops_py.operators.fused_qk_norm import fused_qk_norm
from infiniops_py.operators.fused_qk_norm_rope import fused_qk_norm_rope
from infiniops_py.operators.gemm import gemm
from infiniops_py.operators.gemm_add_rms_norm import gemm_add_rms_norm
from infiniops_py.operators.gemm_swiglu import gemm_swiglu
from infiniops_py.operators.paged_cache import reshape_and_cache_flash
from infiniops_py.operators.rms_norm import fused_add_rms_norm, rms_norm
from infiniops_py.operators.rms_norm_gated import rms_norm_gated
from infiniops_py.operators.rms_norm_gemm import rms_norm_gemm
from infiniops_py.operators.rotary_embedding import rotary_embedding
from infiniops_py.operators.sampling import top_k_top_p_sampling_from_logits
from infiniops_py.operators.selective_scan import selective_scan, selective_state_update
from infiniops_py.operators.silu_and_mul import silu_and_mul
from infiniops_py.problem import OpSpec, Problem
from infiniops_py.registry import Implementation, Provider
from infiniops_py.resolver import use
from infiniops_py.runtime import (
    explain,
    fallbacks,
    make_problem,
    providers,
    register_provider,
    reload,
    resolve,
    resolve_closure,
    unregister_provider,
)

__all__ = [
    "OPERATORS",
    "Between",
    "CandidateReport",
    "Capability",
    "Check",
    "ComputeCapability",
    "Constraint",
    "ContractError",
    "CudaAvailable",
    "GateError",
    "Implementation",
    "MultipleOf",
    "OneOf",
    "OpSpec",
    "Problem",
    "Provider",
    "Rejection",
    "Requires",
    "add",
    "all_reduce",
    "causal_conv1d",
    "causal_conv1d_update",
    "checked_indices",
    "explain",
    "fallbacks",
    "flash_attn_varlen",
    "flash_attn_with_kvcache",
    "fused_add_rms_norm",
    "fused_qk_norm",
    "fused_qk_norm_rope",
    "gemm",
    "gemm_add_rms_norm",
    "gemm_swiglu",
    "hookimpl",
    "make_problem",
    "providers",
    "register_provider",
    "reload",
    "reshape_and_cache_flash",
    "resolve",
    "resolve_closure",
    "rms_norm",
    "rms_norm_gated",
    "rms_norm_gemm",
    "rotary_embedding",
    "selective_scan",
    "selective_state_update",
    "silu_and_mul",
    "top_k_top_p_sampling_from_logits",
    "unchecked_indices",
    "unregister_provider",
    "use",
]

