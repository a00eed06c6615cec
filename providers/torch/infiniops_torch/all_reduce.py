"""AllReduce through ``torch.distributed.all_reduce`` (sum): gloo for cpu (and cuda) tensors, nccl for cuda.

`BackendAvailable` gates a problem whose backend this torch build lacks (no torch.distributed at all, or no
NCCL), so that a tensor-parallel model is refused before any weight loads rather than when its process group
cannot be made. A world size of 1 returns at once: there is nothing to add.
"""

from __future__ import annotations

from typing import Any

import torch

from infiniops_py import Capability, Check, Constraint, Implementation, OneOf, Problem, Rejection
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "BackendAvailable", "all_reduce"]

_BACKENDS = ("gloo", "nccl")


def _available(backend: str) -> bool:
    """Whether this torch build has torch.distributed and the process-group backend `backend`."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    check = getattr(dist, f"is_{backend}_available", None)
    return bool(check()) if check is not None else False


class BackendAvailable(Constraint):
    """The problem's ``backend`` must be built into this torch (``torch.distributed.is_<backend>_available()``)."""

    environmental = True
    __slots__ = ("field",)

    def __init__(self) -> None:
        self.field = "backend"

    def reject(self, problem: Problem) -> Rejection | None:
        backend = problem.get("backend")
        if _available(str(backend)):
            return None
        return Rejection("backend", "backend", backend, "is not available in this torch build "
                         f"(torch.distributed.is_{backend}_available() is False)",
                         "install a torch build with it (the CUDA wheels have nccl), or use backend=gloo")

    def describe(self) -> str:
        return "the backend must be built into torch"


def all_reduce(tensor: torch.Tensor, group: Any) -> None:
    if group.size() == 1:
        return
    import torch.distributed as dist

    dist.all_reduce(tensor, group=group)


IMPLEMENTATIONS = [
    Implementation(
        "all_reduce", "torch", "torch.distributed.all_reduce",
        Capability(DEVICES, FLOAT_DTYPES, OneOf("backend", _BACKENDS),
                   Check("backend", lambda p: p.get("backend") != "nccl" or p.device_type == "cuda",
                         "nccl reduces cuda tensors only", "use backend=gloo for cpu tensors"),
                   BackendAvailable()),
        PRIORITY, all_reduce,
    ),
]
