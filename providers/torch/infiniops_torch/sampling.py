"""Sampling as batched PyTorch ops in float32: the contract's pipeline (`sample_rows`) with one sort per row for
the min-p / top-k / top-p thresholds and a Gumbel-max draw over Philox uniforms, no loop over rows."""

from __future__ import annotations

import torch

from infiniops_py import Capability, Implementation, OneOf
from infiniops_py.operators.sampling import Penalties, sample_rows
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "top_k_top_p_sampling_from_logits"]


def top_k_top_p_sampling_from_logits(logits: torch.Tensor, rows: torch.Tensor, top_k: torch.Tensor,
                                     top_p: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor,
                                     seed: torch.Tensor, offset: torch.Tensor, penalties: Penalties | None,
                                     out: torch.Tensor) -> torch.Tensor:
    """`out` ``[N]`` int32: the contract's sampling pipeline computed in float32 (see the operator module)."""
    return sample_rows(logits, rows, top_k, top_p, temperature, min_p, seed, offset, penalties, out, torch.float32)


IMPLEMENTATIONS = [
    Implementation("top_k_top_p_sampling_from_logits", "torch", "torch.top_k_top_p_sampling_from_logits",
                   Capability(DEVICES, FLOAT_DTYPES, OneOf("penalized", (False, True))), PRIORITY,
                   top_k_top_p_sampling_from_logits),
]
