"""Strategies for AllReduce: contiguous tensors of 0 to 4 dims (some empty) over a one-rank process group.

A conformance case runs in one process, so the only group it can reduce over has one rank, where the sum is
the tensor itself: the cases check the contract (the tensor comes back as the result, in its dtype and in
place, with nothing written around it) and the dispatch, not the arithmetic across ranks. That is tested
with two processes in ``tests/test_all_reduce.py`` and by tensor parallelism in the model layer.

The group is made once per process, without touching the default group (which a program may initialize
itself later): a ``ProcessGroup`` over an in-memory store with a one-rank gloo backend (for cpu and cuda
tensors; at world size 1 the reference and the torch provider return without handing the tensor to it).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES", "one_rank_group"]


@functools.cache
def one_rank_group() -> Any:
    """A ``torch.distributed.ProcessGroup`` of this process alone (backend gloo), made once, left unregistered
    (``torch.distributed``'s default group stays as it is)."""
    import torch.distributed as dist

    store = dist.HashStore()
    group = dist.ProcessGroup(store, 0, 1)
    gloo = dist.ProcessGroupGloo(store, 0, 1)
    for device in ("cpu", "cuda"):  # gloo reduces cuda tensors too (through host memory)
        group._register_backend(torch.device(device), dist.ProcessGroup.BackendType.GLOO, gloo)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    return group


def all_reduce_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    ctx.pick("backend", ("gloo",))
    ctx.record("world_size", 1)
    shape = ctx.draw(st.lists(st.integers(0 if ctx.draw(st.booleans()) else 1, 64 if ctx.large else 9),
                              min_size=0, max_size=4))
    tensor = randn(*shape, dtype=ctx.dtype, device=ctx.device, generator=gen)
    return Case((tensor,), {"group": one_rank_group()}, mutated=(0,), note=f"{shape}, world size 1")


STRATEGIES = {"all_reduce": all_reduce_case}
