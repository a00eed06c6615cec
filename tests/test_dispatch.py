"""The call path: the registry of operator specs (`infiniops_py.problem.SPECS`) and `infiniops_py.dispatch`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import torch

import infiniops_py as io
from infiniops_py import dispatch, problem
from infiniops_py.dispatch import Dispatched, observing
from infiniops_py.operators import FAMILIES, OPERATORS
from infiniops_py.problem import SPECS, OpSpec


def test_importing_one_operator_module_registers_every_family() -> None:
    """A fresh interpreter that imports a single family module has the specs of every family registered:
    importing it imports ``infiniops_py`` first, which imports them all, before any call can run."""
    code = ("import json, importlib\n"
            "import infiniops_py.operators.gemm\n"
            "from infiniops_py.problem import SPECS\n"
            "from infiniops_py.operators import FAMILIES\n"
            "families = {f: [s.name for s in importlib.import_module('infiniops_py.operators.' + f).SPECS]"
            " for f in FAMILIES}\n"
            "print(json.dumps({'registered': list(SPECS), 'families': families}))\n")
    found = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert len(found["families"]) == len(FAMILIES) > 10
    expected = sorted(name for names in found["families"].values() for name in names)
    assert found["registered"] == expected  # by name: the order does not depend on which module came first
    assert dict(SPECS) == OPERATORS and all(SPECS[name] is spec for name, spec in OPERATORS.items())


def test_a_second_spec_of_a_taken_name_is_refused() -> None:
    before = dict(SPECS)
    with pytest.raises(ValueError, match=r"OpSpec name 'add' is already taken by the spec of "
                                         r"infiniops_py\.operators\.add\.add: each operator name is defined once"):
        OpSpec(name="add", fields={}, function=len, reference=len)
    assert dict(SPECS) == before and SPECS["add"].function is io.add
    with pytest.raises(TypeError):
        SPECS["mine"] = SPECS["add"]  # type: ignore[index]  # a read-only view: specs register themselves


def test_operators_call_the_dispatch_function_through_no_slot() -> None:
    """Every module defining an operator spec calls `infiniops_py.dispatch.dispatch` itself (a plain import),
    and nothing can reroute it: no setter, no installed dispatcher, no ``OpSpec.call``."""
    defining = sorted({spec.function.__module__ for spec in OPERATORS.values()})
    assert len(defining) >= len(FAMILIES)  # a family package defines its specs in its submodules
    for name in defining:
        assert sys.modules[name].dispatch is dispatch.dispatch, name
    for module in (dispatch, problem):
        setters = [name for name, value in vars(module).items()
                   if callable(value) and name.lstrip("_").startswith(("install", "set_", "swap"))]
        assert not setters, (module.__name__, setters)
    assert not hasattr(problem, "installed_dispatcher") and not hasattr(OpSpec, "call")


def test_observing_sees_the_calls_of_its_own_context_only() -> None:
    a, b = torch.ones(4), torch.full((4,), 2.0)
    outer: list[Dispatched] = []
    inner: list[Dispatched] = []
    elsewhere: list[torch.Tensor] = []
    with observing(outer.append):
        io.add(a, b)
        with observing(inner.append):
            io.rms_norm(torch.ones(2, 4), torch.ones(4))
        thread = threading.Thread(target=lambda: elsewhere.append(io.add(a, a)))
        thread.start()
        thread.join()
    io.add(b, b)
    assert torch.equal(elsewhere[0], torch.full((4,), 2.0))  # the other thread's call ran, unobserved
    assert [c.spec.name for c in outer] == ["add", "rms_norm"] and [c.spec.name for c in inner] == ["rms_norm"]
    add = outer[0]
    assert add.spec is OPERATORS["add"] and add.key == ("cpu", torch.float32, False, False, 4)
    assert add.args[:3] == (a, b, 1.0) and add.kwargs == {}
    assert add.impl is dispatch.get_resolver().resolve_key(add.spec, add.key, ())
    assert add.returned is add.args[3] and torch.equal(add.returned, torch.full((4,), 3.0))
    assert inner[0] is outer[1]

