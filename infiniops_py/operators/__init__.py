"""Operator contracts: one module per operator family.

Each module holds the public function(s) (argument checks raising `ContractError`, then dispatch), the
`OpSpec` naming the problem fields, and the literal PyTorch reference. `OPERATORS` maps each public
entry point's name to its spec. `FAMILIES` names the family modules in order (``gemm``, ``add``, ...): the
strategies and the bundled providers hold one module per family, named the same, and list theirs from it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Final

from infiniops_py.errors import ContractError
from infiniops_py.operators import _torch_kernels, _torch_library
from infiniops_py.operators import add as _add
from infiniops_py.operators import all_reduce as _all_reduce
from infiniops_py.operators import causal_conv1d as _causal_conv1d
from infiniops_py.operators import flash_attn as _flash_attn
from infiniops_py.operators import fused_qk_norm as _fused_qk_norm
from infiniops_py.operators import fused_qk_norm_rope as _fused_qk_norm_rope
from infiniops_py.operators import gemm as _gemm
from infiniops_py.operators import gemm_swiglu as _gemm_swiglu
from infiniops_py.operators import paged_cache as _paged_cache
from infiniops_py.operators import rms_norm as _rms_norm
from infiniops_py.operators import rms_norm_gated as _rms_norm_gated
from infiniops_py.operators import rotary_embedding as _rotary_embedding
from infiniops_py.operators import sampling as _sampling
from infiniops_py.operators import selective_scan as _selective_scan
from infiniops_py.operators import silu_and_mul as _silu_and_mul
from infiniops_py.problem import OpSpec, Problem

__all__ = ["FAMILIES", "OPERATORS", "ContractError", "OpSpec", "Problem"]

_MODULES: Final[tuple[ModuleType, ...]] = (
    _gemm, _add, _rms_norm, _fused_qk_norm, _paged_cache, _flash_attn, _causal_conv1d, _selective_scan,
    _silu_and_mul, _rotary_embedding, _fused_qk_norm_rope, _gemm_swiglu, _all_reduce,
    _rms_norm_gated, _sampling,
)

FAMILIES: Final[tuple[str, ...]] = tuple(m.__name__.rpartition(".")[2] for m in _MODULES)

OPERATORS: Final[dict[str, OpSpec]] = {spec.name: spec for m in _MODULES for spec in m.SPECS}

_torch_library.register(_torch_kernels.kernels())  # torch.ops.infiniops.<name>: must exist before any graph is traced
