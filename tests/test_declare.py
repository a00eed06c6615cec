"""Operator declarations (`infiniops_py.operators._declare`): the key by name and the errors of a declaration
that does not fit its function. Declarations register their operator for the whole process, so the ones made
here run in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import infiniops_py as io
from infiniops_py.operators._torch_library import SCHEMAS
from infiniops_py.problem import _key_function


def test_the_key_is_built_by_name_with_the_size_classes_taken() -> None:
    key = _key_function("op", ("head_dim", "paged"), ("tokens", "k_len"))
    assert key("cpu", "f", head_dim=64, paged=True, tokens=100, k_len=0) == ("cpu", "f", 64, True, 128, 0)
    with pytest.raises(TypeError, match="head_dim"):
        key("cpu", "f", paged=True, tokens=1, k_len=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="block_size"):
        key("cpu", "f", head_dim=1, paged=True, tokens=1, k_len=1, block_size=4)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        key("cpu", "f", 64, True, 1, 1)  # type: ignore[misc]  # by name only
    assert _key_function("op", (), ())("cuda", "f") == ("cuda", "f")
    with pytest.raises(ValueError, match="'class'"):
        _key_function("op", ("class",), ())


def test_every_operator_key_matches_its_fields_and_buckets() -> None:
    for spec in io.OPERATORS.values():
        values = {name: i for i, name in enumerate(spec.fields)}
        key = spec.key("cpu", "float32", **values, **{b: 3 for b in spec.buckets})
        assert spec.problem_from_key(key).fields == values, spec.name
        assert spec.problem_from_key(key).bucket == {b: 4 for b in spec.buckets}, spec.name


def test_schemas_come_from_the_signatures() -> None:
    assert SCHEMAS["rms_norm.out"] == "rms_norm.out(Tensor x, Tensor weight, float eps, Tensor(a!) out) -> ()"
    assert SCHEMAS["all_reduce"] == "all_reduce(Tensor(a!) tensor, str group_name) -> ()"
    assert "SymInt max_seqlen_q" in SCHEMAS["flash_attn_varlen"]
    assert "return_softmax_lse" not in SCHEMAS["flash_attn_varlen.with_lse"]


_BAD = r'''
import json, torch
from infiniops_py.operators import Operator, Overload

def body(x: torch.Tensor, n: object = None) -> torch.Tensor:
    return x

errors = {}
for label, kwargs in {
    "unknown argument": {"mutates": ("y",)},
    "no fake": {"overloads": (Overload(),)},
    "no schema type": {"overloads": (Overload(fake=lambda x, n: x),)},
    "second form without a fake": {"overloads": (Overload(when={"n": None}, fake=lambda x: x),
                                                 Overload("two", when={"n": True}))},
}.items():
    try:
        Operator(name="bad_" + label.replace(" ", "_"), fields={}, reference=body, **kwargs).define(body)
    except ValueError as err:
        errors[label] = str(err)
from infiniops_py.operators._torch_library import SCHEMAS
errors["defined"] = sorted(name for name in SCHEMAS if name.startswith("bad_"))
print(json.dumps(errors))
'''


def test_a_declaration_that_does_not_fit_its_function_is_refused_naming_what() -> None:
    run = subprocess.run([sys.executable, "-c", _BAD], capture_output=True, text=True, timeout=300, check=True)
    errors = json.loads(run.stdout.splitlines()[-1])
    assert "['y'] are not arguments of body" in errors["unknown argument"]
    assert "a form with outputs needs a fake kernel" in errors["no fake"]
    assert "argument 'n' annotated 'object' has no schema type" in errors["no schema type"]
    second = errors["second form without a fake"]
    assert "bad_second_form_without_a_fake.two: a form with outputs needs a fake" in second
    assert errors["defined"] == []  # a refused declaration defines no custom operator, not even its first form
