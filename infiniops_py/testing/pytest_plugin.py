"""The pytest plugin: ``pytest --infiniops-provider NAME`` runs the conformance suite on a provider.

Registered under the ``pytest11`` entry points, so a third-party provider's CI needs no test file::

    pip install infiniops-py my-provider
    pytest --infiniops-provider mine [--infiniops-device cuda] [--infiniops-max-examples 200]

It adds one test item per (operator, dtype) the provider declares on the device, with the node id
``infiniops[PROVIDER]::conformance[OP-DTYPE]``, plus one ``infiniops[PROVIDER]::gates[OP]`` item per
operator checking that problems outside the provider's capability raise `GateError` (or one failing
``infiniops[PROVIDER]::provider`` item saying why when the provider is unknown, failed to load or serves
nothing on the device, or the device is cuda and the machine has none: a run that tests nothing never
passes). The items are collected from a virtual collector during ``pytest_collection_modifyitems``, so
``-k`` selects among them. Without the option the plugin does nothing, and loading it imports nothing but pytest.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["ConformanceItem", "GatesItem", "ProviderItem", "ProviderSuite"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("infiniops", "InfiniOps-Py provider conformance")
    group.addoption("--infiniops-provider", metavar="NAME", default=None,
                    help="run the conformance suite on this provider (an infiniops.providers entry point)")
    group.addoption("--infiniops-device", metavar="DEVICE", default="cpu",
                    help="device type to test on (default: cpu)")
    group.addoption("--infiniops-max-examples", metavar="N", type=int, default=100,
                    help="hypothesis examples per (implementation, dtype) (default: 100)")


class _Failed(Exception):
    """A conformance item failed; the message is the rendered report."""


class _InfiniopsItem(pytest.Item):
    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, _Failed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


class ProviderItem(_InfiniopsItem):
    """Fails when there is nothing to test: the provider is unknown, failed to load or serves nothing."""

    def __init__(self, *, message: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.message = message

    def runtest(self) -> None:
        raise _Failed(self.message)


class ConformanceItem(_InfiniopsItem):
    """Runs the conformance suite for one (provider, operator, dtype) on one device."""

    def __init__(self, *, provider: str, op: str, dtype: str, device: str, max_examples: int,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.provider, self.op, self.dtype = provider, op, dtype
        self.device, self.max_examples = device, max_examples

    def runtest(self) -> None:
        from infiniops_py.testing.conformance import run_conformance

        report = run_conformance(self.provider, device=self.device, ops=[self.op], dtypes=[self.dtype],
                                 max_examples=self.max_examples, gates=False)
        if not report.ok:
            raise _Failed(report.render())


class GatesItem(_InfiniopsItem):
    """Checks that problems outside one operator's capability are gated by the resolver."""

    def __init__(self, *, provider: str, op: str, device: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.provider, self.op, self.device = provider, op, device

    def runtest(self) -> None:
        from infiniops_py.testing.conformance import check_gates

        report = check_gates(self.provider, device=self.device, ops=[self.op])
        if report.failures:
            raise _Failed("\n".join(str(f) for f in report.failures))


class ProviderSuite(pytest.Collector):
    """The items for one provider: ``conformance[OP-DTYPE]`` and ``gates[OP]``, or ``provider`` on error."""

    def __init__(self, *, provider: str, device: str, max_examples: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.provider, self.device, self.max_examples = provider, device, max_examples

    def collect(self) -> list[pytest.Item]:
        from infiniops_py.testing.conformance import declared_pairs

        pairs, error = declared_pairs(self.provider, self.device, option="--infiniops-device")
        if error:
            return [ProviderItem.from_parent(self, name="provider", message=error)]
        found: list[pytest.Item] = [
            ConformanceItem.from_parent(self, name=f"conformance[{op}-{dtype}]", provider=self.provider, op=op,
                                        dtype=dtype, device=self.device, max_examples=self.max_examples)
            for op, dtype in pairs
        ]
        found += [GatesItem.from_parent(self, name=f"gates[{op}]", provider=self.provider, op=op, device=self.device)
                  for op in sorted({op for op, _ in pairs})]
        return found


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    name = config.getoption("--infiniops-provider")
    if not name:
        return
    suite = ProviderSuite.from_parent(session, name=f"infiniops[{name}]", nodeid=f"infiniops[{name}]", provider=name,
                                      device=config.getoption("--infiniops-device"),
                                      max_examples=config.getoption("--infiniops-max-examples"))
    items.extend(session.genitems(suite))  # reports the collection, so pytest counts the items
