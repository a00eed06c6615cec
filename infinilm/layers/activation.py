"""SiLU-and-multiply of the packed gate/up projection through `infiniops_py.silu_and_mul` (vLLM's ``SiluAndMul``).

Numerics are HF's ``act_fn(gate) * up``: SiLU computed in fp32 and rounded to the activation dtype, then the
product, rounded again.
"""

from __future__ import annotations

import torch

import infiniops_py

__all__ = ["silu_and_mul"]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` for x ``[T, 2I]`` (gate rows first, as `Linear` packs them); returns a new
    ``[T, I]`` tensor in x's dtype.

    Raises:
        ContractError: x is not a float tensor with an even last dim (`infiniops_py.silu_and_mul`).
    """
    return infiniops_py.silu_and_mul(x)
