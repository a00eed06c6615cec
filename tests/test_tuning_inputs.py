"""`infiniops_py.tuning.inputs`: a synthetic call exists for every operator with a size bucket and every problem
field, and the problem the call makes is the one asked for (fields and bucket)."""

from __future__ import annotations

from typing import Any

import pytest

import infiniops_py as io
from infiniops_py.problem import size_class
from infiniops_py.tuning import inputs, recording

# fields that only make sense with another one, as the operators' contracts say
COMPANIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("flash_attn_varlen", "paged"): {"block_size": 16},
    ("flash_attn_with_kvcache", "paged"): {"block_size": 16},
    ("flash_attn_with_kvcache", "rotary"): {"append": True},  # RoPE rotates the new k before the append
    ("selective_scan", "return_varlen_states"): {"varlen": True},
}


def _variants() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for op in inputs.SIZES:
        spec = io.OPERATORS[op]
        out.append((op, {}))
        for name, default in spec.fields.items():
            if isinstance(default, bool):
                out.append((op, {name: not default, **COMPANIONS.get((op, name), {})}))
    return out


def test_every_operator_with_a_size_bucket_has_synthetic_inputs() -> None:
    bucketed = {name for name, spec in io.OPERATORS.items() if spec.buckets}
    assert bucketed == set(inputs.SIZES)


@pytest.mark.parametrize(("op", "fields"), _variants(), ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={w}" for k, w in v.items()) or "defaults")
def test_a_synthetic_call_makes_the_problem_asked_for(op: str, fields: dict[str, Any]) -> None:
    spec = io.OPERATORS[op]
    call = inputs.build(op, device="cpu", dtype="float32", sizes={}, fields=fields)
    with recording() as calls:
        call.run()
    [problem] = [c.problem for c in calls if c.problem.op == op]
    assert dict(problem.fields) == {**spec.fields, **fields}
    bucket = dict(problem.bucket)
    assert set(bucket) == set(spec.buckets)
    for name in spec.buckets:  # the bucket of the default sizes (the attention's q_tokens at decode: the batch)
        assert bucket[name] == size_class(inputs.SIZES[op][name])


def test_an_operator_without_a_size_bucket_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="all_reduce has no size bucket"):
        inputs.build("all_reduce", device="cpu", dtype="float32", sizes={}, fields={})
