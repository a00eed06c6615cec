"""AllReduce: every rank's tensor becomes the sum over the ranks of a ``torch.distributed`` process group.

The peer is ``torch.distributed.all_reduce(tensor, op=ReduceOp.SUM, group=group)``: in place, each rank calls
it with a tensor of the same shape and dtype, and afterwards each holds the elementwise sum of all of them.
Unlike the peer, `all_reduce` returns the tensor (the peer returns None, or a work handle when asynchronous),
and it refuses, instead of silently skipping, a group this process is not a member of: skipping would leave
a partial sum in the tensor, which the caller would then read as the full one.

Implementation calling convention: ``fn(tensor, group) -> None``, in place; `group` is the
``torch.distributed.ProcessGroup`` the call resolved (the default group when the caller passed None, never
None itself). Problem fields: ``backend`` (``group.name()``: ``gloo``, ``nccl``, ...) and ``world_size``
(``group.size()``), read from the group on every call (two C++ calls; nothing is cached, so a group that is
destroyed and made again is seen as it is).

The conformance strategy (`infiniops_py.testing.strategies.all_reduce`) can only run world size 1, where the
sum is the tensor itself: the suite runs each case in one process. The sums across ranks are tested with two
processes (gloo) in ``tests/test_all_reduce.py`` and through tensor parallelism in the model layer.
"""

from __future__ import annotations

from typing import Any

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    check_dtype,
    check_no_grad,
    check_tensor,
    device_type,
)
from infiniops_py.operators._declare import Operator, Overload, Param

__all__ = ["SPECS", "all_reduce", "default_group", "group_name", "group_of"]

_OP = "all_reduce"


def _distributed() -> Any:
    """``torch.distributed``, or a `ContractError` when this torch build has none."""
    import torch.distributed as dist

    if not dist.is_available():
        raise ContractError(_OP, "group", "torch.distributed is not available in this torch build (it was built "
                                          "without distributed support)")
    return dist


def default_group() -> Any:
    """The default process group (``torch.distributed.group.WORLD``).

    Raises:
        ContractError: torch.distributed is not available, or its default group is not initialized.
    """
    dist = _distributed()
    if not dist.is_initialized():
        raise ContractError(_OP, "group", "None names the default process group, which is not initialized (call "
                                          "torch.distributed.init_process_group first, or pass group=)")
    return dist.group.WORLD


def _resolve(group: object) -> Any:
    """`group` as a ``ProcessGroup`` this process belongs to (None: the default group).

    Raises:
        ContractError: torch.distributed is missing, the default group is not initialized, `group` is not a
            ``ProcessGroup``, or this process is not a member of it.
    """
    if group is None:
        return default_group()
    dist = _distributed()
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ContractError(_OP, "group", "this process is not a member of the group (torch.distributed.new_group "
                                          "returned GroupMember.NON_GROUP_MEMBER here); only members may call it")
    if not isinstance(group, dist.ProcessGroup):
        raise ContractError(_OP, "group", f"expected a torch.distributed.ProcessGroup or None (the default group), "
                                          f"got {type(group).__name__}")
    return group


def group_name(group: object) -> str:
    """The registered name of `group` (None: the default group), which
    ``torch.distributed.distributed_c10d._resolve_process_group`` maps back to it (the custom operator's
    argument: a graph holds no process group object).

    Raises:
        ContractError: as `all_reduce` for `group`.
    """
    return str(_resolve(group).group_name)


def group_of(name: str) -> Any:
    """The process group registered as `name` (`group_name`'s inverse: the custom operator's kernel).

    Raises:
        ContractError: torch.distributed is missing, or no group of this process is registered as `name` (the
            empty name: a ``ProcessGroup`` constructed directly, which only ``init_process_group`` and
            ``new_group`` register, so a compiled or exported graph cannot name it).
    """
    dist = _distributed()
    if not name:
        raise ContractError(_OP, "group", "this ProcessGroup is not registered with torch.distributed (it was "
                                          "constructed directly, not by init_process_group or new_group), so a "
                                          "compiled or exported graph cannot name it; make it with "
                                          "torch.distributed.new_group")
    try:
        return dist.distributed_c10d._resolve_process_group(name)
    except (KeyError, ValueError, RuntimeError) as err:
        raise ContractError(_OP, "group", f"no process group of this process is named {name!r} ({err})") from None


def reference(tensor: torch.Tensor, group: Any) -> None:
    """Literal reference: gather every rank's tensor (``torch.distributed.all_gather``), then
    ``tensor <- sum over ranks r of gathered[r]``, accumulated in float64 in rank order and rounded once to the
    tensor's dtype; world size 1 is the identity (nothing is communicated)."""
    if group.size() == 1:
        return
    import torch.distributed as dist

    parts = [torch.empty_like(tensor) for _ in range(group.size())]
    dist.all_gather(parts, tensor, group=group)
    total = torch.zeros(tensor.shape, dtype=torch.float64, device=tensor.device)
    for part in parts:
        total += part.double()
    tensor.copy_(total)


SPEC = Operator(
    name=_OP,
    fields={"backend": "gloo", "world_size": 1},
    reference=reference,
    doc="tensor <- sum of tensor over the ranks of a torch.distributed process group, in place",
    overloads=(Overload(outputs=0, returns=("tensor",)),),
    mutates=("tensor",),
    params={"group": Param("str", name="group_name", to_schema=lambda group, _: group_name(group),
                           to_public=lambda name: group_of(name))},
)


@SPEC.define
def all_reduce(tensor: torch.Tensor, *, group: object = None) -> torch.Tensor:
    """Sum `tensor` across the ranks of `group`, in place: afterwards every rank holds the same sum.

    Every rank of the group must call it, in the same order as its other collectives, with a tensor of the
    same shape, dtype and device type. A world size of 1 leaves the tensor as it is. An empty tensor is valid
    (every rank's is empty then): nothing is communicated.

    Args:
        tensor: any shape, float16/bfloat16/float32/float64, contiguous (the backends reduce flat buffers).
        group: a ``torch.distributed.ProcessGroup`` this process is a member of, or None for the default group.

    Returns:
        `tensor`, holding the sum.

    Raises:
        ContractError: a non-tensor, an integer, bool or complex dtype, a non-contiguous tensor, a tensor that
            requires grad while grad mode is on (there is no backward); torch.distributed missing, an
            uninitialized default group, a `group` that is not a ProcessGroup or not one of this process.
    """
    if not isinstance(tensor, torch.Tensor):
        check_tensor(_OP, "tensor", tensor)
    if tensor.dtype not in FLOAT_DTYPES:
        check_dtype(_OP, "tensor", tensor, FLOAT_DTYPES, "all_reduce sums floating-point activations")
    if not tensor.is_contiguous():
        raise ContractError(_OP, "tensor", f"must be contiguous (the backends reduce a flat buffer), got shape "
                                           f"{list(tensor.shape)} with strides {list(tensor.stride())}")
    if torch.is_grad_enabled() and tensor.requires_grad:
        check_no_grad(_OP, {"tensor": tensor})
    pg = _resolve(group)
    if tensor.numel() == 0:
        return tensor
    key = SPEC.key("cpu" if tensor.is_cpu else device_type(tensor), tensor.dtype, backend=pg.name(),
                   world_size=pg.size())
    dispatch(SPEC, key, tensor, pg)
    return tensor


SPECS = (SPEC,)
