"""Which provider the conformance suite tests and what it declares: the (operator, dtype) pairs on a device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import torch

from infiniops_py import runtime
from infiniops_py.operators import OPERATORS
from infiniops_py.registry import Implementation, Provider

__all__ = ["DTYPES", "NO_CUDA", "declared_dtypes", "declared_pairs", "loaded_provider", "serves_nothing"]

DTYPES: Final = ("float16", "bfloat16", "float32")
NO_CUDA: Final = "no CUDA device on this machine (torch.cuda.is_available() is False)"


def loaded_provider(name: str) -> tuple[Provider | None, str]:
    """The loaded provider `name` and ``""``, or None and why not (unknown, naming the known ones; failed to load)."""
    found = runtime.get_resolver().providers.get(name)
    if found is None:
        known = ", ".join(sorted(runtime.get_resolver().providers))
        return None, f"unknown provider {name!r} (known: {known}); is its package installed and allowed?"
    if found.error:
        return None, f"provider {name!r} failed to load: {found.error}"
    return found, ""


def declared_dtypes(impl: Implementation, device: str) -> list[str]:
    """The dtypes of `DTYPES` that `impl` declares on `device` (none when it does not serve `device`)."""
    devices = impl.capability.values("device_type")
    if devices is not None and device not in devices:
        return []
    dtypes = impl.capability.values("dtype")
    return [d for d in DTYPES if dtypes is None or d in dtypes]


def declared_pairs(provider: str, device: str = "cpu", *, option: str = "--device"
                   ) -> tuple[list[tuple[str, str]], str]:
    """The (operator, dtype) pairs `provider` declares on `device`, or an error when it is not usable.

    The error also says when `device` is cuda and the machine has none, or when the provider serves
    nothing on `device` (then it names the devices it serves as `option` flags to try).
    """
    found, error = loaded_provider(provider)
    if found is None:
        return [], error
    if device == "cuda" and not torch.cuda.is_available():
        return [], NO_CUDA
    pairs = {(i.op, d) for i in found.implementations if i.op in OPERATORS for d in declared_dtypes(i, device)}
    return sorted(pairs), "" if pairs else serves_nothing(found, device, option=option)


def serves_nothing(found: Provider, device: str, ops: Sequence[str] | None = None,
                   dtypes: Sequence[str] | None = None, *, option: str = "--device") -> str:
    """Why `found` has nothing to test on `device` among `ops` and `dtypes` (None: all), as one line.

    Names the devices its capabilities do serve as a `option` flag to try (``try --device cuda``).
    """
    head = f"provider {found.name!r} serves nothing to test on {device}"
    impls = [i for i in found.implementations if i.op in OPERATORS and (ops is None or i.op in ops)]
    if not impls:
        asked = f" among those asked ({', '.join(ops)})" if ops is not None else ""
        return f"{head}: it implements no operator{asked}"
    devices = [impl.capability.values("device_type") for impl in impls]
    if all(d is not None and device not in d for d in devices):
        served = sorted(set().union(*devices))
        tries = " or ".join(f"{option} {d}" for d in served)
        return f"{head}: device_type={device} not in {{{', '.join(served)}}}: try {tries}"
    declared = sorted({d for i in impls for d in declared_dtypes(i, device)}, key=DTYPES.index)
    if not declared:
        return f"{head}: it declares none of the dtypes {', '.join(DTYPES)}"
    return f"{head}: it declares {', '.join(declared)}, none of the dtypes asked ({', '.join(dtypes or ())})"
