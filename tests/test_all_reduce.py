"""AllReduce: the contract, the sums across two gloo ranks (torch provider and reference), world size 1, the gates.

The two-rank checks run once, in two processes (one spawned, one this test's own child) over a gloo group,
and each test below asserts on its part of what they reported.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import infiniops_py as io
from infiniops_py import ContractError, GateError
from infiniops_py.testing.strategies.all_reduce import one_rank_group

WORLD = 2


def _inputs(rank: int) -> dict[str, torch.Tensor]:
    """Each rank's own tensors (distinct per rank, so that a sum differs from every input)."""
    gen = torch.Generator().manual_seed(100 + rank)
    return {dtype: torch.randn(3, 5, generator=gen).to(getattr(torch, dtype))
            for dtype in ("float32", "bfloat16", "float16")}


def _rank(rank: int, port: int, out: Any) -> None:
    """One rank of the two-rank run: every call each test below checks, its results put on `out`."""
    import io as stdio
    import sys

    store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    try:
        results: dict[str, Any] = {}
        for dtype, x in _inputs(rank).items():  # tensors travel back as (dtype, values): nothing shared
            t = x.clone()
            results[f"torch {dtype}"] = (io.all_reduce(t) is t, str(t.dtype), t.double().tolist())
            t = x.clone()
            with io.use("reference"):
                results[f"reference {dtype}"] = (io.all_reduce(t) is t, str(t.dtype), t.double().tolist())
        pair = dist.new_group([0, 1])
        results["explicit group"] = io.all_reduce(_inputs(rank)["float32"].clone(), group=pair).tolist()
        alone = dist.new_group([0])  # rank 1 is no member: new_group hands it GroupMember.NON_GROUP_MEMBER
        if rank == 1:
            try:
                io.all_reduce(torch.ones(2), group=alone)
                results["non member"] = "no error"
            except ContractError as err:
                results["non member"] = str(err)
        captured, sys.stderr = sys.stderr, stdio.StringIO()
        try:
            os.environ["INFINIOPS_TRACE_CALLS"] = "1"
            io.reload()  # a fresh resolver reads it
            io.all_reduce(torch.ones(2))
        finally:
            del os.environ["INFINIOPS_TRACE_CALLS"]
            traced, sys.stderr = sys.stderr.getvalue(), captured
            io.reload()
        results["trace"] = [json.loads(line) for line in traced.splitlines() if line.startswith("{")]
        out.put((rank, results))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks() -> Iterator[dict[int, dict[str, Any]]]:
    """What each of the two ranks reported (rank -> results); the run takes a few seconds. The rendezvous listens
    (in this process) before either rank starts: a port found free and closed could be taken, or a rank's own
    retried connect could land on it, before the rank meant to listen there did."""
    store = dist.TCPStore("127.0.0.1", 0, WORLD, is_master=True, wait_for_workers=False)
    port = store.port
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    other = ctx.Process(target=_rank, args=(1, port, out), daemon=True)
    other.start()
    me = ctx.Process(target=_rank, args=(0, port, out), daemon=True)
    me.start()
    got = dict(out.get() for _ in range(WORLD))
    other.join(60)
    me.join(60)
    assert other.exitcode == 0 and me.exitcode == 0
    del store
    yield got


def _expected(dtype: str) -> torch.Tensor:
    return (_inputs(0)[dtype].double() + _inputs(1)[dtype].double()).to(getattr(torch, dtype))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_two_ranks_each_hold_the_sum_in_place(two_ranks: dict[int, dict[str, Any]], dtype: str) -> None:
    for rank in range(WORLD):
        same, got_dtype, values = two_ranks[rank][f"torch {dtype}"]
        assert same  # the very tensor handed in comes back, holding the sum
        assert got_dtype == f"torch.{dtype}"
        torch.testing.assert_close(torch.tensor(values).to(getattr(torch, dtype)), _expected(dtype), rtol=0,
                                   atol=0)  # two addends: the sum is rounded once


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_reference_sums_across_ranks_like_the_torch_provider(two_ranks: dict[int, dict[str, Any]],
                                                             dtype: str) -> None:
    for rank in range(WORLD):
        same, got_dtype, values = two_ranks[rank][f"reference {dtype}"]
        assert same and got_dtype == f"torch.{dtype}"
        torch.testing.assert_close(torch.tensor(values).to(getattr(torch, dtype)), _expected(dtype), rtol=0, atol=0)


def test_an_explicit_group_sums_over_its_ranks(two_ranks: dict[int, dict[str, Any]]) -> None:
    for rank in range(WORLD):
        torch.testing.assert_close(torch.tensor(two_ranks[rank]["explicit group"]), _expected("float32"), rtol=0,
                                   atol=0)


def test_a_rank_outside_the_group_is_refused(two_ranks: dict[int, dict[str, Any]]) -> None:
    message = two_ranks[1]["non member"]
    assert message.startswith("all_reduce: group: this process is not a member of the group"), message


def test_calls_are_traced_with_the_provider(two_ranks: dict[int, dict[str, Any]]) -> None:
    for rank in range(WORLD):
        (record,) = two_ranks[rank]["trace"]
        assert record == {"operator_name": "all_reduce", "device_type": "cpu", "dtype": "float32",
                          "provider": "torch", "implementation": "torch.distributed.all_reduce"}


def test_world_size_one_is_the_tensor_itself_bit_for_bit() -> None:
    group = one_rank_group()
    for provider in ("torch", "reference"):
        x = torch.randn(4, 3, dtype=torch.bfloat16)
        before = x.clone()
        with io.use(provider):
            assert io.all_reduce(x, group=group) is x
        assert torch.equal(x, before)
    empty = torch.empty(0, 5)
    assert io.all_reduce(empty, group=group) is empty


def test_contract_errors_name_the_argument_before_anything_is_communicated() -> None:
    group = one_rank_group()
    cases = [
        ((torch.ones(2, dtype=torch.int64),), {"group": group}, "tensor: expected dtype"),
        ((torch.ones(4, 4).t(),), {"group": group}, "tensor: must be contiguous"),
        (([1.0, 2.0],), {"group": group}, "tensor: expected a torch.Tensor"),
        ((torch.ones(2),), {"group": "gloo"}, "group: expected a torch.distributed.ProcessGroup or None"),
        ((torch.ones(2, requires_grad=True),), {"group": group}, "tensor"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ContractError, match=message):
            io.all_reduce(*args, **kwargs)
    assert not dist.is_initialized()
    with pytest.raises(ContractError, match="group: None names the default process group, which is not initialized"):
        io.all_reduce(torch.ones(2))


def test_the_gates_reject_a_backend_this_torch_lacks_and_nccl_on_cpu_tensors() -> None:
    served = io.explain("all_reduce", device_type="cpu", dtype="bfloat16", backend="gloo", world_size=8)
    assert served.chosen is not None and served.chosen.provider == "torch"
    nccl = io.explain("all_reduce", device_type="cpu", dtype="float32", backend="nccl", world_size=2)
    torch_report = next(c for c in nccl.candidates if c.provider == "torch")
    reasons = " ".join(str(r) for r in torch_report.rejections)
    assert "nccl reduces cuda tensors only" in reasons
    if not dist.is_nccl_available():  # this CPU build: the backend itself is missing
        assert "backend=nccl is not available in this torch build" in reasons
    with io.use(deny="reference", op="all_reduce"), pytest.raises(GateError, match="all_reduce"):
        io.resolve("all_reduce", device_type="cpu", dtype="float32", backend="nccl", world_size=2)


def test_the_custom_operator_mutates_its_tensor() -> None:
    schema = torch.ops.infiniops.all_reduce.default._schema
    assert [a.name for a in schema.arguments] == ["tensor", "group_name"]
    assert schema.arguments[0].alias_info.is_write and not schema.returns


@pytest.fixture
def default_group() -> Iterator[None]:
    """torch.distributed's default group, of this process alone (gloo over an in-memory store), destroyed after."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("default_group")
def test_fullgraph_compile_holds_the_collective_by_its_group_name_and_matches_eager() -> None:
    """``torch.compile(fullgraph=True)`` of a function calling all_reduce on the default group and on a
    ``new_group``: no graph break, one ``infiniops.all_reduce`` node per call, the same result as eager; a group
    that is not registered (it has no name to put in a graph) is refused naming the argument."""
    sub = dist.new_group([0])

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        io.all_reduce(y)
        z = y + 1
        io.all_reduce(z, group=sub)
        return z

    x = torch.randn(4, 3)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(f)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    nodes = [n for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert sum(n.target is torch.ops.infiniops.all_reduce for n in nodes) == 2
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), f(x), rtol=0, atol=0)

    unregistered = one_rank_group()
    torch._dynamo.reset()
    with pytest.raises(Exception, match="group: this ProcessGroup is not registered"):
        torch.compile(lambda t: io.all_reduce(t * 1, group=unregistered), fullgraph=True)(x)
