"""`infinilm.serve.metrics.observe_many`: the samples of ``observe`` per value, bucket bounds included (counts
exactly; the sum to rounding, a batch being added at once)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from infinilm.serve.metrics import observe_many

BOUNDS = (0.001, 0.005, 0.01, 0.5, 2.5)
values = st.lists(st.one_of(st.sampled_from((*BOUNDS, 0.0, 100.0)), st.floats(0, 10, allow_nan=False)), max_size=80)


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("h_seconds", "h", buckets=BOUNDS, registry=registry)


@given(batches=st.lists(values, max_size=4))
def test_observe_many_is_observe_per_value(batches: list[list[float]]) -> None:
    one, each = _histogram()
    many, batched = _histogram()
    for batch in batches:
        for v in batch:
            each.observe(v)
        observe_many(batched, batch)
    got, want = _samples(many), _samples(one)
    assert got.pop("h_seconds_sum") == pytest.approx(want.pop("h_seconds_sum"), rel=1e-12, abs=1e-12)
    assert got == want


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    return {s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items())): s.value
            for family in registry.collect() for s in family.samples if not s.name.endswith("_created")}
